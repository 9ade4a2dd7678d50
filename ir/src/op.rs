//! The op vocabulary shared by the compiler (which builds graphs of these) and the runtime
//! (which executes them). An op is here when its derivative is local and it lowers to one kernel
//! archetype; the derivative ops at the end are what autodiff emits.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnaryOp {
    Neg,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Sigmoid,
    Tanh,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Sin,
    Cos,
    Square,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolOp {
    Max,
    Avg,
}

/// The op vocabulary. An op is here when its derivative is local and it lowers to one kernel
/// archetype; anything expressible from these (split, embedding, mse) is built from them.
/// Optional operands (norm weights, conv bias, attention mask) follow the required ones in
/// `Node::inputs`, in the order of their `has_*` flags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    Input {
        name: String,
    },
    Param {
        index: usize,
    },
    /// A scalar constant (shape `[]`), broadcast by its consumers.
    Constant {
        value: f64,
    },
    /// `0 … n-1` along the only axis.
    Arange,
    Unary(UnaryOp),
    Pow {
        exponent: f64,
    },
    /// Elementwise with NumPy broadcasting.
    Binary(BinaryOp),
    Cast,
    /// Batched matrix product with broadcasting over leading axes (PyTorch `matmul` rules).
    MatMul,
    Permute {
        perm: Vec<usize>,
    },
    Reshape,
    Concat {
        axis: usize,
    },
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// `index_select`: the axis is replaced by the index tensor's shape.
    Gather {
        axis: usize,
    },
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdim: bool,
    },
    ArgMax {
        axis: usize,
    },
    Softmax {
        axis: usize,
        log: bool,
    },
    LayerNorm {
        eps: f64,
        has_weight: bool,
        has_bias: bool,
    },
    RmsNorm {
        eps: f64,
        has_weight: bool,
    },
    GroupNorm {
        groups: usize,
        eps: f64,
        has_weight: bool,
        has_bias: bool,
    },
    /// Inputs: x, running_mean, running_var, then weight and bias if present. Batch statistics
    /// in training plans (updating the running ones), running statistics in inference plans.
    BatchNorm {
        eps: f64,
        momentum: f64,
        has_weight: bool,
        has_bias: bool,
    },
    /// Identity in inference plans.
    Dropout {
        p: f64,
    },
    Conv {
        stride: Vec<usize>,
        padding: Vec<usize>,
        dilation: Vec<usize>,
        groups: usize,
        has_bias: bool,
    },
    Pool {
        op: PoolOp,
        kernel: Vec<usize>,
        stride: Vec<usize>,
        padding: Vec<usize>,
    },
    /// Nearest-neighbour upsampling of the spatial axes (all after the first two).
    Upsample {
        scale: usize,
    },
    Attention {
        causal: bool,
        scale: f64,
        has_mask: bool,
    },
    /// `inverse` rotates by the negative angle: the derivative of the forward rotation.
    Rope {
        theta: f64,
        offset: usize,
        inverse: bool,
    },
    /// Mean cross-entropy of logits `[.., C]` against integer targets `[..]`.
    SoftmaxCrossEntropy,

    // ---- derivative ops (made by autodiff; each is the local rule of one forward op) ----
    /// Sums `[dy]` over the axes that broadcasting added or stretched, down to this node's shape.
    SumTo,
    /// Broadcasts `[x]` to this node's shape (NumPy rules).
    BroadcastTo,
    /// `[x, dy]` → dx of a pointwise op.
    UnaryGrad(UnaryOp),
    /// `[x, y, dy]` → dx of `Reduce`: spread for sum/mean, routed to the first extreme for max/min.
    ReduceGrad {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// `[y, dy]` → dx, where `y` is the forward output.
    SoftmaxGrad {
        axis: usize,
        log: bool,
    },
    /// `[dy]` → dx: `dy` placed at `start..end` of `axis`, zeros elsewhere.
    SliceGrad {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// `[index, dy]` → dx: `dy` scatter-added along `axis` at `index`.
    GatherGrad {
        axis: usize,
    },
    /// The forward op's inputs then `dy` → the gradient of input `part` (0 = x, 1 = weight, 2 = bias).
    LayerNormGrad {
        eps: f64,
        has_weight: bool,
        has_bias: bool,
        part: GradPart,
    },
    RmsNormGrad {
        eps: f64,
        has_weight: bool,
        part: GradPart,
    },
    GroupNormGrad {
        groups: usize,
        eps: f64,
        has_weight: bool,
        has_bias: bool,
        part: GradPart,
    },
    /// Inputs as the forward op, then `dy`. Batch statistics in training plans.
    BatchNormGrad {
        eps: f64,
        has_weight: bool,
        has_bias: bool,
        part: GradPart,
        training: bool,
    },
    /// `[dy]` → dx with the forward op's mask (same seed, same node).
    DropoutGrad {
        p: f64,
        forward: u32,
    },
    /// `[dy, weight]` → dx.
    ConvGradInput {
        stride: Vec<usize>,
        padding: Vec<usize>,
        dilation: Vec<usize>,
        groups: usize,
    },
    /// `[x, dy]` → dweight.
    ConvGradWeight {
        stride: Vec<usize>,
        padding: Vec<usize>,
        dilation: Vec<usize>,
        groups: usize,
    },
    /// `[x, dy]` → dx: max pooling routes to the (first) arg-max, average pooling spreads.
    PoolGrad {
        op: PoolOp,
        kernel: Vec<usize>,
        stride: Vec<usize>,
        padding: Vec<usize>,
    },
    /// `[dy]` → dx: sums each `scale`-sized block.
    UpsampleGrad {
        scale: usize,
    },
    /// `[q, k, v, mask?, dy]` → the gradient of q (part 0), k (1) or v (2). The GPU session may
    /// append `[stats, out]` (an `AttentionStats` of the same q, k, mask and the forward output;
    /// `out` only for q and k, which need `rowdot = dy·out`) so the kernels skip their
    /// statistics pass; compiled plans never do.
    AttentionGrad {
        causal: bool,
        scale: f64,
        has_mask: bool,
        part: GradPart,
    },
    /// `[q, k, mask?]` → `[..B, Hq, Tq, 2]`: per query row of the attention with these operands,
    /// the maximum `m` of its scaled, masked, visible scores and `1/l`, `l = Σ_j e^(s_j − m)`, so
    /// that `P_ij = e^(s_ij − m_i) · (1/l_i)`. A row that sees no key (all hidden or `-inf`)
    /// holds `(−FLT_MAX, 0)`, which gives `P = 0` as the forward does. Kept as a pair rather than
    /// one logsumexp because `m + ln l` in f32 drops `ln l` when `|m|` is large (a row masked
    /// entirely with −1e9 would get every `P = 1`). Inserted by the GPU session only (never made
    /// by autodiff, never differentiated).
    AttentionStats {
        causal: bool,
        scale: f64,
        has_mask: bool,
    },
    /// `[x, dy]` → `[⌈R / chunk⌉, D]`: a layer norm's (`center`) or RMS norm's weight derivative
    /// over the last axis (`D`) of `x`'s `R` rows, summed per chunk of `chunk` consecutive rows
    /// (`Σ dy·x̂`, the last chunk possibly shorter); the chunks' sum is the derivative. The GPU
    /// session splits a norm's weight derivative into this and a sum over chunks
    /// (`gpu/norm_partials.rs`), so that its rows spread over many workgroups and each row's
    /// statistics are computed once. Never made by autodiff, never differentiated.
    NormWeightGradPartial {
        eps: f64,
        center: bool,
        chunk: usize,
    },
    /// `[logits, targets]` → `[rows]`: each row's `logsumexp(logits) − logits[target]`, the
    /// terms `SoftmaxCrossEntropy` averages. The GPU session computes a cross-entropy loss as this
    /// and a mean (`gpu/loss_rows.rs`), so the rows run on many workgroups instead of one. Never
    /// made by autodiff, never differentiated.
    CrossEntropyRows,
    /// `[logits, targets, dloss]` → dlogits = (softmax − one_hot) · dloss / N.
    SoftmaxCrossEntropyGrad,
    /// A chain of element-wise float ops computed in one step: `program` evaluates, element by
    /// element of the output, nodes that read the step's inputs (each broadcast to the output
    /// shape) or earlier nodes; the last node is the result. Made by the GPU session's fusion
    /// (`gpu::fuse`), never by the compiler.
    Fused {
        program: Vec<Elem>,
    },
    /// `[a, b, extra…]`: a matrix product followed, element by element of its result, by
    /// `program` (an epilogue: bias, residual, activation…), in which `Input(0)` is the product
    /// and `Input(k)` the step's input `k + 1`. Made by the GPU session's fusion, like `Fused`.
    MatMulEpilogue {
        program: Vec<Elem>,
    },
}

/// One node of a `Fused` program; the numbers are the indices of earlier nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Elem {
    /// The step's input with this index.
    Input(u32),
    Unary(UnaryOp, u32),
    /// `(x, dy)` → dy · d op(x)/dx, like `Op::UnaryGrad`.
    UnaryGrad(UnaryOp, u32, u32),
    Binary(BinaryOp, u32, u32),
    Pow(f64, u32),
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
        }
    }
}

/// Which input of a multi-input op a derivative op computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GradPart {
    Input,
    Weight,
    Bias,
    Q,
    K,
    V,
}

impl Op {
    /// Whether `n` inputs suit this op, for the ops whose input count is fixed by the op alone
    /// (others are checked by their kernels, which report a wrong count as an error). Plan
    /// validation uses it so that a hand-edited plan is refused, not a panic in a backend.
    pub fn check_input_count(&self, n: usize) -> Result<(), String> {
        let exactly = |k: usize| (k, k);
        let (lo, hi) = match self {
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } | Op::Arange => (0, 0),
            Op::Unary(_)
            | Op::Pow { .. }
            | Op::Cast
            | Op::Reshape
            | Op::Permute { .. }
            | Op::Dropout { .. }
            | Op::DropoutGrad { .. }
            | Op::Softmax { .. }
            | Op::SumTo
            | Op::BroadcastTo => (1, 1),
            Op::Binary(_)
            | Op::UnaryGrad(_)
            | Op::MatMul
            | Op::SoftmaxGrad { .. }
            | Op::SoftmaxCrossEntropy
            | Op::CrossEntropyRows => (2, 2),
            // The norms: x (and dy for derivatives), the running statistics for batch norm,
            // then the optional weight and bias — the CPU backend's layouts.
            Op::LayerNorm { has_weight, has_bias, .. }
            | Op::GroupNorm { has_weight, has_bias, .. } => {
                exactly(1 + *has_weight as usize + *has_bias as usize)
            }
            Op::RmsNorm { has_weight, .. } => exactly(1 + *has_weight as usize),
            Op::BatchNorm { has_weight, has_bias, .. } => {
                exactly(3 + *has_weight as usize + *has_bias as usize)
            }
            Op::LayerNormGrad { has_weight, has_bias, .. }
            | Op::GroupNormGrad { has_weight, has_bias, .. } => {
                exactly(2 + *has_weight as usize + *has_bias as usize)
            }
            Op::RmsNormGrad { has_weight, .. } => exactly(2 + *has_weight as usize),
            Op::NormWeightGradPartial { .. } => (2, 2),
            Op::BatchNormGrad { has_weight, has_bias, .. } => {
                exactly(4 + *has_weight as usize + *has_bias as usize)
            }
            Op::Fused { program } => {
                check_program(program, n)?;
                (1, usize::MAX)
            }
            Op::MatMulEpilogue { program } => {
                // Input(0) is the product; Input(k) the step's input k + 1.
                check_program(program, n.saturating_sub(1))?;
                (2, usize::MAX)
            }
            _ => (0, usize::MAX),
        };
        if n < lo || n > hi {
            let want = if lo == hi { format!("{lo}") } else { format!("at least {lo}") };
            return Err(format!(
                "`{}` takes {want} input{}, not {n}",
                self.describe(),
                if lo == 1 && hi == 1 { "" } else { "s" }
            ));
        }
        Ok(())
    }

    /// Short name plus attributes, as printed in IR dumps.
    pub fn describe(&self) -> String {
        let list = |v: &[usize]| {
            format!("[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
        };
        match self {
            Op::Input { name } => format!("input {name}"),
            Op::Param { .. } => "param".into(),
            Op::Constant { value } => format!("constant {}", fmt_f64(*value)),
            Op::Arange => "arange".into(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Pow { exponent } => format!("pow {}", fmt_f64(*exponent)),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Cast => "cast".into(),
            Op::MatMul => "matmul".into(),
            Op::Permute { perm } => format!("permute {}", list(perm)),
            Op::Reshape => "reshape".into(),
            Op::Concat { axis } => format!("concat axis={axis}"),
            Op::Slice { axis, start, end } => format!("slice axis={axis} {start}..{end}"),
            Op::Gather { axis } => format!("gather axis={axis}"),
            Op::Reduce { op, axes, keepdim } => {
                format!(
                    "{} axes={}{}",
                    format!("{op:?}").to_lowercase(),
                    list(axes),
                    if *keepdim { " keepdim" } else { "" }
                )
            }
            Op::ArgMax { axis } => format!("argmax axis={axis}"),
            Op::Softmax { axis, log } => {
                format!("{} axis={axis}", if *log { "log_softmax" } else { "softmax" })
            }
            Op::LayerNorm { eps, .. } => format!("layer_norm eps={}", fmt_f64(*eps)),
            Op::RmsNorm { eps, .. } => format!("rms_norm eps={}", fmt_f64(*eps)),
            Op::GroupNorm { groups, eps, .. } => {
                format!("group_norm groups={groups} eps={}", fmt_f64(*eps))
            }
            Op::BatchNorm { eps, momentum, .. } => {
                format!("batch_norm eps={} momentum={}", fmt_f64(*eps), fmt_f64(*momentum))
            }
            Op::Dropout { p } => format!("dropout p={}", fmt_f64(*p)),
            Op::Conv { stride, padding, dilation, groups, .. } => {
                format!(
                    "conv{}d stride={} padding={} dilation={} groups={groups}",
                    stride.len(),
                    list(stride),
                    list(padding),
                    list(dilation)
                )
            }
            Op::Pool { op, kernel, stride, padding } => format!(
                "{}_pool{}d kernel={} stride={} padding={}",
                if *op == PoolOp::Max { "max" } else { "avg" },
                kernel.len(),
                list(kernel),
                list(stride),
                list(padding)
            ),
            Op::Upsample { scale } => format!("upsample scale={scale}"),
            Op::Attention { causal, scale, .. } => format!(
                "attention{} scale={}",
                if *causal { " causal" } else { "" },
                fmt_f64(*scale)
            ),
            Op::Rope { theta, offset, inverse } => format!(
                "rope{} theta={} offset={offset}",
                if *inverse { "_inverse" } else { "" },
                fmt_f64(*theta)
            ),
            Op::SoftmaxCrossEntropy => "softmax_cross_entropy".into(),
            Op::CrossEntropyRows => "cross_entropy_rows".into(),
            Op::SumTo => "sum_to".into(),
            Op::BroadcastTo => "broadcast_to".into(),
            Op::UnaryGrad(u) => format!("{}_grad", format!("{u:?}").to_lowercase()),
            Op::ReduceGrad { op, axes, .. } => {
                format!("{}_grad axes={}", format!("{op:?}").to_lowercase(), list(axes))
            }
            Op::SoftmaxGrad { axis, log } => {
                format!("{}_grad axis={axis}", if *log { "log_softmax" } else { "softmax" })
            }
            Op::SliceGrad { axis, start, end } => format!("slice_grad axis={axis} {start}..{end}"),
            Op::GatherGrad { axis } => format!("gather_grad axis={axis}"),
            Op::LayerNormGrad { part, .. } => format!("layer_norm_grad {part:?}").to_lowercase(),
            Op::RmsNormGrad { part, .. } => format!("rms_norm_grad {part:?}").to_lowercase(),
            Op::GroupNormGrad { part, .. } => format!("group_norm_grad {part:?}").to_lowercase(),
            Op::BatchNormGrad { part, .. } => format!("batch_norm_grad {part:?}").to_lowercase(),
            Op::DropoutGrad { forward, .. } => format!("dropout_grad of %{forward}"),
            Op::ConvGradInput { stride, .. } => format!("conv{}d_grad_input", stride.len()),
            Op::ConvGradWeight { stride, .. } => format!("conv{}d_grad_weight", stride.len()),
            Op::PoolGrad { op, .. } => {
                format!("{}_pool_grad", if *op == PoolOp::Max { "max" } else { "avg" })
            }
            Op::UpsampleGrad { scale } => format!("upsample_grad scale={scale}"),
            Op::AttentionGrad { part, .. } => format!("attention_grad {part:?}").to_lowercase(),
            Op::AttentionStats { causal, scale, .. } => format!(
                "attention_stats{} scale={}",
                if *causal { " causal" } else { "" },
                fmt_f64(*scale)
            ),
            Op::NormWeightGradPartial { center, chunk, .. } => format!(
                "{}_norm_weight_grad_partial chunk={chunk}",
                if *center { "layer" } else { "rms" }
            ),
            Op::SoftmaxCrossEntropyGrad => "softmax_cross_entropy_grad".into(),
            Op::Fused { program } => {
                let names: Vec<String> =
                    program.iter().filter_map(|e| e.op()).map(|(op, _)| op.describe()).collect();
                format!("fused {}", names.join(" → "))
            }
            Op::MatMulEpilogue { program } => {
                let names: Vec<String> =
                    program.iter().filter_map(|e| e.op()).map(|(op, _)| op.describe()).collect();
                format!("matmul_epilogue {}", names.join(" → "))
            }
        }
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

/// Prints a float compactly and exactly enough to read back (`0.02`, `1e-5`, `10000`).
pub fn fmt_f64(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e6) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}
