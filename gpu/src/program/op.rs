//! The GPU's op vocabulary: every op of the compiled plan (`GpuOp::Plan`), and the ops only the
//! GPU's rewrites make (`rewrite/`). The private ops never leave this crate — they are never
//! written to a file (serde sees them only in memory, where a dynamic plan's programs made at
//! several sizes are fitted into one: `dynamic.rs`), the compiler never sees them and the CPU
//! backend has no kernel for them; their CPU references live with the tests (`reference.rs`).

use mgn_ir::infer::Ty;
use mgn_ir::op::{fmt_f64, BinaryOp, CompareOp, GradPart, Op, UnaryOp};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GpuOp {
    /// An op of the compiled plan, run as compiled.
    Plan(Op),
    /// `[q, k, mask?]` → `[..B, Hq, Tq, 2]`: per query row of the attention with these
    /// operands, the maximum `m` of its scaled, masked, visible scores and `1/l`,
    /// `l = Σ_j e^(s_j − m)`, so that `P_ij = e^(s_ij − m_i) · (1/l_i)`. A row that sees no key
    /// (all hidden or `-inf`) holds `(−FLT_MAX, 0)`, which gives `P = 0` as the forward does.
    /// Kept as a pair rather than one logsumexp because `m + ln l` in f32 drops `ln l` when
    /// `|m|` is large (a row masked entirely with −1e9 would get every `P = 1`). Made by
    /// `rewrite::attention_stats`.
    AttentionStats { causal: bool, scale: f64, has_mask: bool },
    /// `[q, k, v, mask?, dy, stats, out?]` → the gradient of q, k or v, as `Op::AttentionGrad`,
    /// given the `AttentionStats` of the same q, k and mask, and for q and k the forward output
    /// (`rowdot = dy·out`), so the kernel skips its statistics pass. Made by
    /// `rewrite::attention_stats`.
    AttentionGradWithStats { causal: bool, scale: f64, has_mask: bool, part: GradPart },
    /// `Op::Attention` of f16 q, k and v, run whole with both products on the device's
    /// cooperative matrices (`kernels/attention/coop.rs`; the tiled forwards where the device has
    /// none). Made by `rewrite::attention_matmul` under `AttentionPath::Tiles` (tests only), for an
    /// attention nothing differentiates.
    AttentionOnTiles { causal: bool, scale: f64, has_mask: bool },
    /// `[x, dy]` → `[⌈R / chunk⌉, D]`: a layer norm's (`center`) or RMS norm's weight derivative
    /// over the last axis (`D`) of `x`'s `R` rows, summed per chunk of `chunk` consecutive rows
    /// (`Σ dy·x̂`, the last chunk possibly shorter); the chunks' sum is the derivative. Made by
    /// `rewrite::norm_partials`.
    NormWeightGradPartial { eps: f64, center: bool, chunk: usize },
    /// The convolution `conv` (`Op::Conv` without bias, `Op::ConvGradInput` of a stride 1
    /// or dilated convolution, `Op::ConvGradWeight`; its inputs) over each of `splits` ranges
    /// of its GEMM's reduction — input channels × taps, output channels × taps, samples ×
    /// output positions — cut as `kernels::conv::split_depth` says: `[splits, ..out]`, which a
    /// `SplitSum` adds up. Made by `rewrite::split_k` for convolutions with few output tiles
    /// and a long reduction.
    ConvSplit { conv: Op, splits: usize },
    /// `[logits, targets]` → `[rows]`: each row's `logsumexp(logits) − logits[target]`, the
    /// terms `SoftmaxCrossEntropy` averages. Made by `rewrite::loss_rows`.
    CrossEntropyRows,
    /// A chain of element-wise float ops computed in one step: `program` evaluates, element by
    /// element of the output, nodes that read the step's inputs (each broadcast to the output
    /// shape) or earlier nodes; the last node is the result. Made by `rewrite::fuse`.
    Fused { program: Vec<Elem> },
    /// `[a, b, extra…]`: a matrix product followed, element by element of its result, by
    /// `program` (an epilogue: bias, residual, activation…), in which `Input(0)` is the product
    /// and `Input(k)` the step's input `k + 1`. Made by `rewrite::fuse`; `ta` and `tb` read
    /// an operand transposed in place, as `MatMulT` does (set by `rewrite::transposes`).
    MatMulEpilogue { program: Vec<Elem>, ta: bool, tb: bool },
    /// `[a, b0, b1, extra…]`: two products of the same few rows `a` (at most `SKINNY`) by
    /// weights stored transposed (`[n, k]` each), combined by `program` as each result is stored:
    /// `Input(0)` is `a · b0ᵀ`, `Input(1)` `a · b1ᵀ`, `Input(k)` for k ≥ 2 the step's input
    /// `k + 1`. A gated feed-forward's gate and up projections, `silu(a · gᵀ) · (a · uᵀ)`, in
    /// one dispatch reading `a` once. Made by `rewrite::product_pairs`.
    ProductPair { program: Vec<Elem> },
    /// `[x, w, bias?, extra…]`: the convolution `conv` (an `Op::Conv`, over the first
    /// `conv_operands` inputs) followed, element by element of its result, by `program` as a
    /// `MatMulEpilogue`'s: `Input(0)` is the convolution (its bias added), `Input(k)` the
    /// step's input `k + conv_operands − 1`. Made by `rewrite::fuse`.
    ConvEpilogue { conv: Op, program: Vec<Elem> },
    /// `[x, weight?, bias?, extra…]` (a batch norm: `[x, running_mean, running_var, weight?,
    /// bias?, extra…]`): the norm `norm` (an `Op::LayerNorm`, `Op::RmsNorm`, `Op::GroupNorm`,
    /// or a training plan's `Op::BatchNorm`, over the first `norm_operands` inputs) followed,
    /// element by element of its result, by `program` as a `ConvEpilogue`'s: `Input(0)` is the
    /// norm, `Input(k)` the step's input `k + norm_operands − 1`. Made by `rewrite::fuse` (a
    /// group norm's SiLU, a batch norm's ReLU); a batch norm's running statistics are updated
    /// after it as after the plain step.
    NormEpilogue { norm: Op, program: Vec<Elem> },
    /// `[x]` → `[C, K, 2]`: a training batch norm's statistics over `x: [N, C, ...]` in parts.
    /// Each channel's `L` values (sample by sample, position by position) are cut into `K =
    /// ⌈L / chunk⌉` chunks of `chunk`, the last possibly shorter; per chunk, its mean and
    /// `Σ(x − mean)²` over its own values (two passes over the chunk). Readers combine the
    /// chunks by Chan's formula, so the channel's variance loses nothing to a large mean.
    /// Made by `rewrite::batch_moments`.
    BatchMoments { chunk: usize },
    /// `[x, running_mean, running_var, weight?, bias?, moments, extra…]`: the training plan's
    /// batch norm `norm`, with its statistics combined from `moments` (a `BatchMoments` of x),
    /// each result through `program` as a `NormEpilogue`'s. `Input(0)` is the norm, and
    /// `Input(k)` the step's input `k + norm_operands`. Its running statistics are updated
    /// after it, from the moments, unless it is `recomputed`: the same norm computed again for
    /// the backward pass (`rewrite::recompute`). Made by `rewrite::batch_moments`.
    BatchNormWithMoments { norm: Op, chunk: usize, program: Vec<Elem>, recomputed: bool },
    /// `[x, dy, moments]` → `[C, K, 2]`: per chunk of a `BatchMoments` of x, `Σdy` and
    /// `Σdy·(x − mean)` with the channel's mean. Made by `rewrite::batch_moments`.
    BatchGradSums { chunk: usize },
    /// `[x, running_mean, running_var, weight?, bias?, dy, moments, sums]`: `grad` (a
    /// training plan's `Op::BatchNormGrad`, over all but the last two inputs) from the moments
    /// of x and the `BatchGradSums` of x and dy. The weight and bias derivatives are the sums
    /// per channel; the input's is element-wise. Made by `rewrite::batch_moments`.
    BatchNormGradWithSums { grad: Op, chunk: usize },
    /// `[a, b]` → `alpha · op(a) · op(b)`, batched as `Op::MatMul`, where `op(a)` is the
    /// transpose of a's last two axes when `ta` (its words hold `[.., k, m]`), and likewise
    /// `op(b)` when `tb` (`[.., n, k]`): the products of materialised attention read q, k and
    /// the probabilities in place instead of transposing them. With `splits > 1`, k is cut
    /// into that many ranges and each range's product stored apart: the output is
    /// `[splits, ..B, m, n]`, which a `SplitSum` adds up. Made by `rewrite::attention_matmul`,
    /// `rewrite::transposes` and `rewrite::split_k`.
    MatMulT { ta: bool, tb: bool, alpha: f64, splits: usize },
    /// `[partials, extra…]` → the sum of the `splits` partial products of a `MatMulT` over
    /// their first axis, then `program` on each element as a `MatMulEpilogue`'s (`Input(0)` the
    /// sum, `Input(k)` the step's input `k`). Made by `rewrite::split_k`.
    SplitSum { splits: usize, program: Vec<Elem> },
    /// `[scores, mask?]` → the probabilities of an attention whose scaled scores are given, as
    /// `Op::Attention` computes them: `softmax` over the last axis of `scores + mask` (the mask
    /// broadcast to the scores), keys hidden by `causal` (key `j` past query `i + Tk − Tq`)
    /// taking no probability, and a row that sees no key all zeros. Made by
    /// `rewrite::attention_matmul`.
    AttentionProbs { causal: bool, has_mask: bool },
    /// `[x, src, start]` → `Op::SliceScatter`'s value, made in x's own words: the memory plan
    /// gives the step x's region, and its kernel writes only src's elements there. Made by
    /// `rewrite::state_in_place` for a state parameter (a KV cache) whose new value is the
    /// scatter and which nothing else reads, so a decoding step writes one token's keys
    /// instead of copying the whole cache twice (into a new value, then back into the state).
    /// With `rope` (an `Op::Rope`), `[x, src, start, rope's start?]`: src is rotated as it is
    /// written — the keys' rotary embedding and their cache write one step
    /// (`rewrite::rope_scatter`).
    ScatterInPlace { axis: usize, rope: Option<Op> },
    /// `[q, k, v, mask?, rope's start?]`: `attention` (an `Op::Attention`) of the queries
    /// rotated by `rope` (an `Op::Rope`), each query element rotated as the decode kernel loads
    /// it (`kernels/attention/decode.rs`) rather than by a step of its own before it. Made by
    /// `rewrite::rope_scatter` for a few query rows a head, where that kernel runs. `rounded`:
    /// each rotated query rounded to this half type, as a mixed policy's cast of the rotation
    /// stored it (the cast folded with the rotation).
    RotatedAttention { attention: Op, rope: Op, rounded: Option<mgn_ir::DType> },
    /// The result of `op`, computed at `shape`, seen as `view` (the same elements in the same
    /// order) and stored permuted by `perm`: `Op::Permute { perm }` of it, without the copy.
    /// `op` is a kernel that stores each result once, at its index, through `kernels::store`
    /// (a product, a convolution, a fused chain, a split product's sum), which maps the index
    /// to the permuted one. Made by `rewrite::permuted_stores` for attention's head splits and
    /// merges.
    PermutedStore { op: Box<GpuOp>, shape: Vec<usize>, view: Vec<usize>, perm: Vec<usize> },
    /// `[x, b, extra…, weight?, bias?]`: the product `op` (an `Op::MatMul`, or a `MatMulT` or
    /// `MatMulEpilogue` that reads A as stored) of `norm(x)` by a matrix `b`, where `norm` is an
    /// `Op::LayerNorm` or `Op::RmsNorm` over x's last axis (its weight and bias the step's last
    /// inputs), without the normed value in between: the product's kernel computes the
    /// statistics of its tile's rows, then normalises A's panels as it stages them. The norm's
    /// dispatch and barrier go from before every product that reads it. `rounded`: the normed
    /// value is rounded to this half type before the product reads it (a mixed policy's cast of
    /// the norm, folded with it; only the few-columns kernel). Made by
    /// `rewrite::normed_products`.
    NormedProduct { norm: Op, op: Box<GpuOp>, rounded: Option<mgn_ir::DType> },
}

impl From<Op> for GpuOp {
    fn from(op: Op) -> GpuOp {
        GpuOp::Plan(op)
    }
}

/// One node of a fused program; the numbers are the indices of earlier nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Elem {
    /// The step's input with this index.
    Input(u32),
    Unary(UnaryOp, u32),
    /// `(x, dy)` → dy · d op(x)/dx, like `Op::UnaryGrad`.
    UnaryGrad(UnaryOp, u32, u32),
    Binary(BinaryOp, u32, u32),
    Pow(f64, u32),
    /// `a op b` of two float nodes: a `bool`, read only by a `Where` as its condition.
    Compare(CompareOp, u32, u32),
    /// `(cond, a, b)` → `a` where `cond` holds, else `b`; `cond` a `Compare` node or a `bool`
    /// input.
    Where(u32, u32, u32),
    /// An f32 constant (`Op::Constant`) written into the program instead of read.
    Const(f64),
    /// The element's own index as an f32: `cast(arange(n), f32)`, only in a chain of its shape
    /// `[n]` (fusion never inlines it into a reader of another shape).
    Index,
}

impl Elem {
    /// The op this node applies, and the nodes it reads.
    pub fn op(&self) -> Option<(Op, Vec<u32>)> {
        match self {
            Elem::Input(_) => None,
            Elem::Unary(u, a) => Some((Op::Unary(*u), vec![*a])),
            Elem::UnaryGrad(u, a, b) => Some((Op::UnaryGrad(*u), vec![*a, *b])),
            Elem::Binary(o, a, b) => Some((Op::Binary(*o), vec![*a, *b])),
            Elem::Pow(e, a) => Some((Op::Pow { exponent: *e }, vec![*a])),
            Elem::Compare(c, a, b) => Some((Op::Compare(*c), vec![*a, *b])),
            Elem::Where(c, a, b) => Some((Op::Where, vec![*c, *a, *b])),
            Elem::Const(value) => Some((Op::Constant { value: *value }, vec![])),
            Elem::Index => None,
        }
    }
}

impl GpuOp {
    /// A contraction's kernel: a product, a convolution or an attention (`Op::is_contraction`)
    /// in any of the GPU's forms (split, with an epilogue, with statistics).
    pub fn is_contraction(&self) -> bool {
        match self {
            GpuOp::Plan(op) => op.is_contraction(),
            GpuOp::PermutedStore { op, .. } | GpuOp::NormedProduct { op, .. } => {
                op.is_contraction()
            }
            GpuOp::AttentionStats { .. }
            | GpuOp::AttentionGradWithStats { .. }
            | GpuOp::AttentionOnTiles { .. }
            | GpuOp::RotatedAttention { .. }
            | GpuOp::ConvSplit { .. }
            | GpuOp::MatMulEpilogue { .. }
            | GpuOp::ProductPair { .. }
            | GpuOp::ConvEpilogue { .. }
            | GpuOp::MatMulT { .. } => true,
            GpuOp::NormWeightGradPartial { .. }
            | GpuOp::BatchMoments { .. }
            | GpuOp::BatchNormWithMoments { .. }
            | GpuOp::BatchGradSums { .. }
            | GpuOp::BatchNormGradWithSums { .. }
            | GpuOp::NormEpilogue { .. }
            | GpuOp::CrossEntropyRows
            | GpuOp::Fused { .. }
            | GpuOp::SplitSum { .. }
            | GpuOp::ScatterInPlace { .. }
            | GpuOp::AttentionProbs { .. } => false,
        }
    }

    /// A training batch norm, plain or heading an epilogue (not one recomputed for the backward
    /// pass): its running statistics are updated by a dispatch of their own after it
    /// (`schedule::Levels::bn_update`).
    pub fn updates_running_stats(&self) -> Option<&Op> {
        match self {
            GpuOp::Plan(bn @ Op::BatchNorm { .. })
            | GpuOp::NormEpilogue { norm: bn @ Op::BatchNorm { .. }, .. }
            | GpuOp::BatchNormWithMoments { norm: bn, recomputed: false, .. } => Some(bn),
            _ => None,
        }
    }

    /// The compiled plan's op, for a step that runs one.
    pub fn plan_op(&self) -> Option<&Op> {
        match self {
            GpuOp::Plan(op) => Some(op),
            _ => None,
        }
    }

    /// Whether a step of this op over inputs of these types may produce `out`: the IR's
    /// typing rule (`mgn_ir::infer`, the one the plan validator and the CPU backend apply) for
    /// the plan's own ops; the input count, program and shape rule (`typing.rs`) for the GPU's
    /// own. The rewrites are checked by this, so a pass that mistypes a step
    /// fails in the tests, not in a kernel.
    pub fn check(&self, x: &[Ty], out: Ty) -> Result<(), String> {
        match self {
            GpuOp::Plan(op) => {
                mgn_ir::infer::check(op, x, out).map_err(|e| format!("`{}`: {e}", op.describe()))
            }
            _ => {
                self.check_input_count(x.len())?;
                super::typing::check_private(self, x, out)
                    .map_err(|e| format!("`{}`: {e}", self.describe()))
            }
        }
    }

    /// Whether `n` inputs suit one of the GPU's own ops.
    pub(crate) fn check_input_count(&self, n: usize) -> Result<(), String> {
        let exactly = |k: usize| (k, k);
        let (lo, hi) = match self {
            GpuOp::Plan(op) => {
                return Err(format!("`{}` is a plan op: `check` types it", op.describe()))
            }
            GpuOp::AttentionStats { has_mask, .. } => exactly(2 + *has_mask as usize),
            GpuOp::AttentionOnTiles { has_mask, .. } => exactly(3 + *has_mask as usize),
            GpuOp::AttentionGradWithStats { has_mask, part, .. } => {
                // q, k, v, mask?, dy, the statistics, and for q and k the forward output.
                exactly(5 + *has_mask as usize + (*part != GradPart::V) as usize)
            }
            GpuOp::NormWeightGradPartial { .. } | GpuOp::CrossEntropyRows => exactly(2),
            GpuOp::BatchMoments { .. } => exactly(1),
            GpuOp::BatchGradSums { .. } => exactly(3),
            GpuOp::BatchNormGradWithSums { grad, .. } => exactly(batch_grad_operands(grad)? + 2),
            GpuOp::BatchNormWithMoments { norm, program, .. } => {
                // The moments are the norm's last operand.
                let operands = norm_operands(norm)? + 1;
                check_program(program, (n + 1).saturating_sub(operands))?;
                (operands, usize::MAX)
            }
            GpuOp::ConvSplit { .. } => exactly(2),
            GpuOp::MatMulT { .. } => exactly(2),
            GpuOp::SplitSum { program, .. } => {
                check_program(program, n)?;
                (1, usize::MAX)
            }
            GpuOp::AttentionProbs { has_mask, .. } => exactly(1 + *has_mask as usize),
            GpuOp::ScatterInPlace { rope: None, .. } => exactly(3),
            // The rope's start is its own input, after the scatter's.
            GpuOp::ScatterInPlace { rope: Some(Op::Rope { .. }), .. } => (3, 4),
            GpuOp::ScatterInPlace { rope: Some(op), .. } => {
                return Err(format!("`{}` is no rotary embedding", op.describe()));
            }
            // The rope's start, if any, follows the attention's operands.
            GpuOp::RotatedAttention {
                attention: Op::Attention { has_mask, .. },
                rope: Op::Rope { .. },
                ..
            } => (3 + *has_mask as usize, 4 + *has_mask as usize),
            GpuOp::RotatedAttention { attention, rope, .. } => {
                return Err(format!(
                    "`{}` of a `{}`: not an attention of rotated queries",
                    attention.describe(),
                    rope.describe()
                ));
            }
            GpuOp::PermutedStore { op, .. } => {
                // A plan op's inputs are counted by its typing rule.
                return match op.as_ref() {
                    GpuOp::Plan(_) => Ok(()),
                    op => op.check_input_count(n),
                };
            }
            GpuOp::NormedProduct { norm, op, .. } => {
                // The norm's weight and bias follow the product's own inputs.
                let params = norm_operands(norm)? - 1;
                let inner = n.checked_sub(params).ok_or("fewer inputs than the norm's")?;
                return match op.as_ref() {
                    GpuOp::Plan(Op::MatMul) if inner == 2 => Ok(()),
                    GpuOp::Plan(op) => Err(format!("`{}` is not a product", op.describe())),
                    op => op.check_input_count(inner),
                };
            }
            GpuOp::Fused { program } => {
                check_program(program, n)?;
                // A program of indices and constants (`Elem::Index`, `Elem::Const`) reads none.
                (0, usize::MAX)
            }
            GpuOp::MatMulEpilogue { program, .. } => {
                // Input(0) is the product; Input(k) the step's input k + 1.
                check_program(program, n.saturating_sub(1))?;
                (2, usize::MAX)
            }
            GpuOp::ProductPair { program } => {
                // Input(0) and Input(1) are the products; Input(k) the step's input k + 1.
                check_program(program, n.saturating_sub(1))?;
                (3, usize::MAX)
            }
            GpuOp::ConvEpilogue { conv, program } => {
                let operands = conv_operands(conv)?;
                check_program(program, (n + 1).saturating_sub(operands))?;
                (operands, usize::MAX)
            }
            GpuOp::NormEpilogue { norm, program } => {
                let operands = norm_operands(norm)?;
                check_program(program, (n + 1).saturating_sub(operands))?;
                (operands, usize::MAX)
            }
        };
        if n < lo || n > hi {
            let want = if lo == hi { format!("{lo}") } else { format!("at least {lo}") };
            let s = if lo == 1 && hi == 1 { "" } else { "s" };
            return Err(format!("`{}` takes {want} input{s}, not {n}", self.describe()));
        }
        Ok(())
    }

    /// Short name plus attributes, as in error messages and profiles (the first word is the
    /// op's family).
    pub fn describe(&self) -> String {
        // The ops a program applies, in order; its constants are operands, not steps.
        let chain = |program: &[Elem]| {
            let name = |e: &Elem| match e {
                Elem::Index => Some("index".to_string()),
                Elem::Const(_) => None,
                e => e.op().map(|(op, _)| op.describe()),
            };
            let names: Vec<String> = program.iter().filter_map(name).collect();
            names.join(" → ")
        };
        match self {
            GpuOp::Plan(op) => op.describe(),
            GpuOp::AttentionStats { causal, scale, .. } => format!(
                "attention_stats{} scale={}",
                if *causal { " causal" } else { "" },
                fmt_f64(*scale)
            ),
            GpuOp::AttentionGradWithStats { part, .. } => {
                format!("attention_grad {part:?} with_stats").to_lowercase()
            }
            GpuOp::AttentionOnTiles { causal, scale, .. } => format!(
                "attention_on_tiles{} scale={}",
                if *causal { " causal" } else { "" },
                fmt_f64(*scale)
            ),
            GpuOp::NormWeightGradPartial { center, chunk, .. } => format!(
                "{}_norm_weight_grad_partial chunk={chunk}",
                if *center { "layer" } else { "rms" }
            ),
            GpuOp::CrossEntropyRows => "cross_entropy_rows".into(),
            GpuOp::BatchMoments { chunk } => format!("batch_moments chunk={chunk}"),
            GpuOp::BatchGradSums { chunk } => format!("batch_grad_sums chunk={chunk}"),
            GpuOp::BatchNormWithMoments { norm, program, recomputed, .. } => {
                let plain = matches!(program[..], [Elem::Input(0)]);
                let tail = if plain { String::new() } else { format!(" → {}", chain(program)) };
                let head = norm.describe();
                let (family, attributes) = head.split_once(' ').unwrap_or((&head, ""));
                let family = if plain { family.to_string() } else { format!("{family}_epilogue") };
                let again = if *recomputed { " recomputed" } else { "" };
                format!("{family} {attributes} with moments{again}{tail}")
            }
            GpuOp::BatchNormGradWithSums { grad, .. } => format!("{} with sums", grad.describe()),
            GpuOp::ConvSplit { conv, splits } => {
                format!("{} split={splits}", conv.describe())
            }
            GpuOp::Fused { program } => format!("fused {}", chain(program)),
            GpuOp::MatMulEpilogue { program, .. } => {
                format!("matmul_epilogue {}", chain(program))
            }
            GpuOp::ProductPair { program } => format!("matmul_pair {}", chain(program)),
            GpuOp::ConvEpilogue { conv: head, program }
            | GpuOp::NormEpilogue { norm: head, program } => {
                let head = head.describe();
                let (family, attributes) = head.split_once(' ').unwrap_or((&head, ""));
                format!("{family}_epilogue {attributes} → {}", chain(program))
            }
            GpuOp::MatMulT { ta, tb, alpha, splits } => {
                let t = |on: bool, x: &str| if on { format!(" {x}ᵀ") } else { String::new() };
                let split = if *splits > 1 { format!(" split={splits}") } else { String::new() };
                let scaled = if *alpha == 1.0 {
                    String::new()
                } else {
                    format!(" alpha={}", fmt_f64(*alpha))
                };
                format!("matmul{}{}{scaled}{split}", t(*ta, "a"), t(*tb, "b"))
            }
            GpuOp::SplitSum { splits, program } => {
                format!("split_sum {splits} → {}", chain(program)).trim_end_matches(" → ").into()
            }
            GpuOp::AttentionProbs { causal, .. } => {
                format!("attention_probs{}", if *causal { " causal" } else { "" })
            }
            GpuOp::ScatterInPlace { axis, rope } => {
                let rope =
                    rope.as_ref().map(|r| format!(" ← {}", r.describe())).unwrap_or_default();
                format!("slice_scatter axis={axis} in place{rope}")
            }
            GpuOp::RotatedAttention { attention, rope, rounded } => {
                let half = rounded.map(|h| format!(" → {h:?}").to_lowercase()).unwrap_or_default();
                format!("{} ← {}{half}", attention.describe(), rope.describe())
            }
            GpuOp::PermutedStore { op, perm, .. } => {
                format!("{} → permute {perm:?}", op.describe())
            }
            GpuOp::NormedProduct { norm, op, rounded } => {
                let half = rounded.map(|h| format!(" → {h:?}").to_lowercase()).unwrap_or_default();
                format!("{} ← {}{half}", op.describe(), norm.describe())
            }
        }
    }
}

/// How many of a `NormEpilogue`'s inputs its norm reads: x (a batch norm's running statistics),
/// and the weight and bias it has.
pub(crate) fn norm_operands(norm: &Op) -> Result<usize, String> {
    match norm {
        Op::LayerNorm { has_weight, has_bias, .. } | Op::GroupNorm { has_weight, has_bias, .. } => {
            Ok(1 + *has_weight as usize + *has_bias as usize)
        }
        Op::RmsNorm { has_weight, .. } => Ok(1 + *has_weight as usize),
        Op::BatchNorm { has_weight, has_bias, .. } => {
            Ok(3 + *has_weight as usize + *has_bias as usize)
        }
        other => Err(format!("`{}` heads no norm epilogue", other.describe())),
    }
}

/// How many inputs a batch norm's derivative `grad` reads: x, the running statistics, the
/// weight and bias it has, and dy.
pub(crate) fn batch_grad_operands(grad: &Op) -> Result<usize, String> {
    match grad {
        Op::BatchNormGrad { has_weight, has_bias, .. } => {
            Ok(4 + *has_weight as usize + *has_bias as usize)
        }
        other => Err(format!("`{}` is no batch norm derivative", other.describe())),
    }
}

/// How many of a `ConvEpilogue`'s inputs its convolution reads: x, w and the bias if it has one.
pub(crate) fn conv_operands(conv: &Op) -> Result<usize, String> {
    match conv {
        Op::Conv { has_bias, .. } => Ok(2 + *has_bias as usize),
        other => Err(format!("`{}` heads no convolution epilogue", other.describe())),
    }
}

/// A fused program reads only the `inputs` it is given and only earlier nodes, and has a result.
fn check_program(program: &[Elem], inputs: usize) -> Result<(), String> {
    if program.is_empty() {
        return Err("an empty fused program".into());
    }
    for (j, e) in program.iter().enumerate() {
        if let Elem::Input(k) = e {
            if *k as usize >= inputs {
                return Err(format!("fused node {j} reads input {k}, but there are {inputs}"));
            }
        } else if let Some((_, args)) = e.op() {
            if let Some(a) = args.iter().find(|&&a| a as usize >= j) {
                return Err(format!(
                    "fused node {j} reads node {a}, which is not computed before it"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_counts_and_fused_programs_are_checked() {
        let stats = GpuOp::AttentionStats { causal: false, scale: 1.0, has_mask: true };
        assert_eq!(stats.check_input_count(3), Ok(()));
        assert!(stats.check_input_count(2).unwrap_err().contains("takes 3 inputs, not 2"));
        let grad = |part| GpuOp::AttentionGradWithStats {
            causal: true,
            scale: 1.0,
            has_mask: false,
            part,
        };
        assert_eq!(grad(GradPart::V).check_input_count(5), Ok(()));
        assert_eq!(grad(GradPart::Q).check_input_count(6), Ok(()));
        assert!(grad(GradPart::K).check_input_count(5).is_err(), "dk needs the forward output");
        let plan = GpuOp::Plan(Op::Binary(BinaryOp::Add));
        let f = mgn_ir::DType::F32;
        let e = plan.check(&[(f, &[2])], (f, &[2])).unwrap_err();
        assert!(e.contains("takes 2 input(s), not 1"), "{e}");
        assert_eq!(plan.check(&[(f, &[2, 1]), (f, &[3])], (f, &[2, 3])), Ok(()));
        assert!(plan.check(&[(f, &[2]), (f, &[3])], (f, &[3])).is_err(), "no broadcast");

        let relu_of_3 = vec![Elem::Input(0), Elem::Unary(UnaryOp::Relu, 3)];
        let fused = GpuOp::Fused { program: relu_of_3 };
        assert!(fused.check_input_count(1).unwrap_err().contains("reads node 3"));
        let fused = GpuOp::Fused { program: vec![Elem::Input(2)] };
        assert!(fused.check_input_count(2).unwrap_err().contains("reads input 2"));
        assert!(GpuOp::Fused { program: vec![] }.check_input_count(1).is_err());
        // An epilogue's input 0 is the product: two step inputs (a, b) leave one leaf.
        let epilogue = GpuOp::MatMulEpilogue {
            program: vec![Elem::Input(0), Elem::Input(1), Elem::Binary(BinaryOp::Add, 0, 1)],
            ta: false,
            tb: false,
        };
        assert!(epilogue.check_input_count(2).unwrap_err().contains("reads input 1"));
        assert_eq!(epilogue.check_input_count(3), Ok(()));
    }

    #[test]
    fn descriptions_name_the_family_first() {
        let program = vec![Elem::Input(0), Elem::Unary(UnaryOp::Relu, 0), Elem::Pow(2.0, 1)];
        assert_eq!(GpuOp::Fused { program }.describe(), "fused relu → pow 2");
        let grad = GpuOp::AttentionGradWithStats {
            causal: false,
            scale: 0.5,
            has_mask: false,
            part: GradPart::K,
        };
        assert_eq!(grad.describe(), "attention_grad k with_stats");
        let partial = GpuOp::NormWeightGradPartial { eps: 1e-5, center: false, chunk: 8 };
        assert_eq!(partial.describe(), "rms_norm_weight_grad_partial chunk=8");
    }
}
