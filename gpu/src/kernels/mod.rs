//! WGSL generation, one kernel per step of a GPU plan, specialized to its shapes.
//!
//! Operand offsets come from the parameter block (`step_operands`), so steps that differ only
//! in where their values live share one pipeline. Element-wise ops and fused programs compute
//! one output element per invocation (`i`) here; every other family has its module: `matmul`
//! (tiles, GEMV, split-k, epilogues), `conv`, `attention`, `rows` (softmax, cross-entropy, long
//! reductions), `norm` (and dropout), `select` (gather/scatter, slices, RoPE, the KV-cache
//! ops with a run-time start), `spatial` (padding and resampling). `operand` says where a value
//! lives and writes the loads and stores of its elements.

mod attention;
pub(crate) use attention::decodes;
mod check;
pub(crate) mod conv;
mod ext;
mod fused;
mod matmul;

pub(crate) use attention::runs_on_tensor_cores;
pub use check::{check_plan, validate, PlanKernels};
pub use ext::{size_word, Ext, SIZE_WORD};
pub(crate) use matmul::{split_depth, SKINNY};
mod norm;
mod operand;
mod permuted;
mod pointwise;
mod rows;
mod scan;
mod select;
mod softmax;
mod spatial;

use crate::program::{GpuOp, GpuPlan, StepId};
use mgn_ir::dynamic::Poly;
use mgn_ir::op::{Op, ReduceOp, UnaryOp};
use mgn_ir::DType;
pub(crate) use operand::{
    base, f16_view_decl, fetch_word, load, store, word_half, word_value, zero, Fetched,
};
pub use operand::{Operand, Sliced};
use permuted::Permuted;
use pointwise::{binary, helpers, unary, unary_grad};

/// An error naming the op unless it has at least `k` inputs.
pub(super) fn need_inputs(op: &Op, inputs: &[Operand], k: usize) -> Result<(), String> {
    if inputs.len() < k {
        Err(format!("`{}` needs {k} inputs, found {}", op.describe(), inputs.len()))
    } else {
        Ok(())
    }
}

/// About as many workgroups as it takes to fill a large GPU (two per SM of a 132-SM H200):
/// below this, the generators (and `rewrite::split_k`) trade work per workgroup for more
/// workgroups.
pub(crate) const FILL: usize = 264;

/// The first parameter-block word that carries operand offsets (words 0 and 1 hold dropout's
/// mask key).
pub const FIRST_SLOT: usize = 2;

/// The operands of step `i` (inputs, then output) with their offsets in parameter words, and
/// the words to put in the parameter block. A step with more operands than words (below the
/// sizes' words) bakes them in. `views` is `memory::ReadViews::of(plan)`; `follows`
/// gives, for a dynamic plan, the polynomials of a step's axes (`DynamicProgram::dims`).
pub fn step_operands(
    plan: &GpuPlan,
    offsets: &[usize],
    views: &crate::memory::ReadViews,
    i: usize,
    follows: &dyn Fn(usize) -> Vec<Option<Poly>>,
) -> (Vec<Operand>, Operand, Vec<(usize, u32)>) {
    let s = &plan.steps[i];
    let parametric = FIRST_SLOT + s.inputs.len() < SIZE_WORD;
    let mut words = Vec::new();
    let mut operand = |k: usize, v: usize| {
        let slot = parametric.then_some(FIRST_SLOT + k);
        if let Some(w) = slot {
            words.push((w, offsets[v] as u32));
        }
        Operand {
            offset: offsets[v],
            shape: plan.steps[v].shape.clone(),
            dtype: plan.steps[v].dtype,
            slot,
            transposed: views.transposed[v],
            rounded: views.rounded[v],
            follows: follows(v),
            permuted: None,
            summed: views.summed[v],
            sliced: views.sliced[v].then(|| sliced(plan, v, &follows)),
            f16_view: false,
            packed: views.packed[v],
        }
    };
    let inputs: Vec<Operand> =
        s.inputs.iter().enumerate().map(|(k, &x)| operand(k, x as usize)).collect();
    let out = operand(s.inputs.len(), i);
    (inputs, out, words)
}

/// Where the sliced view `v` (`memory::sliced_views`, an `Op::Slice`) finds its elements.
fn sliced(plan: &GpuPlan, v: usize, follows: &dyn Fn(usize) -> Vec<Option<Poly>>) -> Sliced {
    let Some(Op::Slice { axis, start, .. }) = plan.steps[v].op.plan_op() else {
        unreachable!("sliced views are slices")
    };
    let x = plan.steps[v].inputs[0] as usize;
    let full =
        Ext::following(plan.steps[x].shape[*axis], follows(x).get(*axis).and_then(Option::as_ref));
    Sliced { axis: *axis, start: *start, full }
}

/// What kernels are sized for on a device: the workgroup width steps are written for, and the
/// shared memory one workgroup may take (the products' and convolutions' tiles grow into it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub width: u32,
    pub shared_bytes: u32,
    /// Cooperative-matrix products of f16 operands, where the device has them and kernels may
    /// use them (`DeviceLimits::coop_tile`).
    pub coop: Option<Coop>,
}

/// What a cooperative-matrix kernel is written for: the device's square f16 tile and the fixed
/// number of invocations in each of its subgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coop {
    pub tile: u32,
    pub subgroup: u32,
    /// Every convolution of f16 operands that fits takes the tiles as well as every product
    /// (`MGN_COOP=1`); otherwise only the products (`matmul::coop::grid_for`), and the
    /// convolutions a session measured faster on them (`limits::CoopUse::Measured`).
    pub everywhere: bool,
}

impl Target {
    pub fn of(limits: &crate::limits::DeviceLimits) -> Target {
        let width = limits.workgroup_width(256);
        let everywhere = crate::limits::coop_use() == crate::limits::CoopUse::Everywhere;
        let subgroup = limits.subgroup_size;
        let coop = limits.coop_tile().map(|tile| Coop { tile, subgroup, everywhere });
        Target { width, shared_bytes: limits.max_shared_memory, coop }
    }

    /// Workgroups of `width` within the guaranteed floor of shared memory.
    #[cfg(test)]
    pub fn floor(width: u32) -> Target {
        let shared_bytes = crate::limits::DeviceLimits::MIN_SPEC.max_shared_memory;
        Target { width, shared_bytes, coop: None }
    }
}

/// Generated code for one step: the WGSL body and how many invocations it needs.
pub struct KernelSource {
    pub body: String,
    pub invocations: u64,
    /// For dropout: the id of the dropout step whose per-run mask key the parameter block must
    /// carry (a derivative's forward step).
    pub dropout_node: Option<u32>,
    /// The workgroup size the body declares, when it is not the width the generator was asked
    /// for (a tiled product picks its own, at most that): the grid is `invocations / width`.
    pub width: Option<u32>,
}

/// The per-run mask key of a dropout step (see `norm::dropout_key`).
pub fn dropout_key(seed: u64, node: u32) -> u64 {
    norm::dropout_key(seed, node)
}

pub(super) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// A WGSL expression for the linear index into `input` (broadcast NumPy-style against `out`)
/// of the output element whose linear index is the expression `i`, over sizes as a shared
/// kernel reads them (`Operand::dims`): an axis of size 1 is skipped only when it is 1 at
/// every size.
pub(super) fn broadcast_at(i: &str, out: &[Ext], input: &[Ext]) -> String {
    // The common cases need no division per axis: past its leading 1s, an input whose sizes
    // are the output's last ones (a residual of the output's shape, a bias along its last
    // axis) has the output's strides there, so its index is `i` modulo its element count
    // (`i` itself when it spans the whole output). A product's epilogue computes this for
    // each result, among its multiply-adds.
    let skip = input.iter().take_while(|d| d.n == 1 && d.is_fixed()).count();
    let suffix = &input[skip..];
    if suffix.len() <= out.len() && suffix[..] == out[out.len() - suffix.len()..] {
        if suffix.len() == out.len() {
            return format!("({i})");
        }
        if suffix.is_empty() {
            return "0u".into();
        }
        let count = suffix.iter().fold(Ext::lit(1), |c, d| c.mul(d));
        return format!("(({i}) % {count})");
    }
    let os = Ext::strides(out);
    let is = Ext::strides(input);
    let r = out.len();
    let mut terms = Vec::new();
    for (k, d) in input.iter().enumerate() {
        let a = k + r - input.len();
        if d.n == 1 && d.is_fixed() {
            continue;
        }
        terms.push(format!("((({i}) / {}) % {}) * {}", os[a], out[a], is[k]));
    }
    if terms.is_empty() {
        "0u".into()
    } else {
        terms.join(" + ")
    }
}

/// An f32 WGSL expression holding exactly the bits of `v` rounded to f32, as the CPU stores it:
/// infinities, and numbers past f32's range (which the CPU rounds to infinity), cannot be
/// decimal literals (a shader with one does not compile).
pub(crate) fn f32_lit(v: f64) -> String {
    format!("bitcast<f32>({}u)", (v as f32).to_bits())
}

/// `x` to the constant power `e`, as the CPU reference computes it (`powf`). WGSL's `pow` is
/// undefined for a negative base (drivers return NaN) and for 0⁰, where `powf` has values: a
/// whole exponent takes the power of |x| and the sign of x when the exponent is odd; 0 and 1
/// are the constant 1 and x itself. A fractional power of a negative base is NaN on both.
pub(crate) fn pow_expr(x: &str, e: f64) -> String {
    let whole = e.fract() == 0.0 && e.abs() < (1u64 << 53) as f64;
    match e {
        0.0 => format!("({x} * 0.0 + 1.0)"),
        1.0 => format!("({x})"),
        _ if whole => {
            let p = format!("pow(abs({x}), {})", f32_lit(e));
            if (e as i64) % 2 == 0 {
                p
            } else {
                format!("select({p}, -{p}, {x} < 0.0)")
            }
        }
        _ => format!("pow({x}, {})", f32_lit(e)),
    }
}

/// Wraps a per-element body: `i` is the element, `n` the element count.
pub(super) fn elementwise(
    n: impl Into<Ext>,
    width: u32,
    body: &str,
    helpers: &str,
) -> KernelSource {
    let n = n.into();
    KernelSource {
        body: format!(
            "{helpers}@compute @workgroup_size({width})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, \
    @builtin(num_workgroups) groups: vec3<u32>) {{
    let i = gid.x + (gid.y + gid.z * groups.y) * groups.x * {width}u;
    if (i >= {n}) {{ return; }}
    {body}
}}
"
        ),
        invocations: n.n as u64,
        dropout_node: None,
        width: None,
    }
}

/// A per-element body (`i` the output element) over all of `out`: one invocation per element,
/// or per word of a half result, whose two elements it stores together.
pub(super) fn per_element(out: &Operand, width: u32, body: &str, helpers: &str) -> KernelSource {
    if !out.dtype.is_half() {
        return elementwise(out.numel(), width, body, helpers);
    }
    let n = out.numel();
    KernelSource {
        invocations: n.n.div_ceil(2) as u64,
        body: crate::halves::elementwise(out, n, width, body, helpers),
        dropout_node: None,
        width: None,
    }
}

/// Whether the kernel of `op` can write a half-typed result: the per-element ops of
/// `plan_op` (and parameters and inputs, which the host writes). `rewrite::halves` gives every
/// other step with a half result an f32 result and a cast.
pub fn writes_halves(op: &GpuOp) -> bool {
    matches!(
        op.plan_op(),
        Some(
            Op::Input { .. }
                | Op::Param { .. }
                | Op::Constant { .. }
                | Op::Unary(_)
                | Op::Pow { .. }
                | Op::Binary(_)
                | Op::Where
                | Op::Cast
                | Op::Reshape
                | Op::StopGradient
                | Op::BroadcastTo
                | Op::UnaryGrad(_)
                | Op::Permute { .. }
                | Op::Dropout { .. }
                | Op::DropoutGrad { .. }
        )
    )
}

/// Kernel source for one step, or the reason it has no GPU kernel yet. `id` is the step's id
/// (a dropout's mask key); `training` is the plan's mode: batch statistics and active dropout,
/// or running statistics and the identity.
pub fn generate(
    op: &GpuOp,
    id: StepId,
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    training: bool,
) -> Result<KernelSource, String> {
    if out.dtype.is_half() && !writes_halves(op) {
        return Err(format!(
            "`{}` cannot write a {} result on the GPU (rewrite::halves gives it an f32 result \
             and a cast)",
            op.describe(),
            out.dtype
        ));
    }
    if let GpuOp::Plan(op) = op {
        return plan_op(op, id, inputs, out, target, training);
    }
    let width = target.width;
    op.check_input_count(inputs.len())?;
    match op {
        GpuOp::Plan(_) => unreachable!("handled above"),
        GpuOp::AttentionStats { .. }
        | GpuOp::AttentionGradWithStats { .. }
        | GpuOp::AttentionOnTiles { .. }
        | GpuOp::RotatedAttention { .. } => attention::generate(op, inputs, out, target),
        GpuOp::NormWeightGradPartial { eps, center, chunk } => {
            let w = width as usize;
            norm::weight_grad_partial(&inputs[0], &inputs[1], *eps, *center, *chunk, out, w)
        }
        GpuOp::CrossEntropyRows => rows::cross_entropy_rows(inputs, out, width),
        GpuOp::BatchMoments { chunk } => {
            norm::batch_moments(&inputs[0], *chunk, out, width as usize)
        }
        GpuOp::BatchGradSums { chunk } => {
            norm::batch_grad_sums(inputs, *chunk, out, width as usize)
        }
        GpuOp::BatchNormWithMoments { norm, chunk, program, .. } => {
            fused::batch_norm_with_moments(norm, *chunk, program, inputs, out, width)
        }
        GpuOp::BatchNormGradWithSums { grad, chunk } => {
            norm::batch_grad_with_sums(grad, *chunk, inputs, out, width)
        }
        GpuOp::ConvSplit { conv, splits } => conv::split(conv, *splits, inputs, out, target),
        GpuOp::Fused { program } => fused::fused(program, inputs, out, width),
        GpuOp::MatMulEpilogue { program, ta, tb } => {
            let layout = matmul::Layout { ta: *ta, tb: *tb, ..matmul::Layout::PLAIN };
            fused::epilogue(program, inputs, out, target, layout)
        }
        GpuOp::ProductPair { program } => fused::product_pair(program, inputs, out, target, None),
        GpuOp::ConvEpilogue { conv, program } => {
            fused::conv_epilogue(conv, program, inputs, out, target)
        }
        GpuOp::NormEpilogue { norm, program } => {
            fused::norm_epilogue(norm, program, inputs, out, width, training)
        }
        GpuOp::MatMulT { ta, tb, alpha, splits } => {
            let layout = matmul::Layout { ta: *ta, tb: *tb, alpha: *alpha, splits: *splits };
            matmul::generate_layout(inputs, out, target, layout)
        }
        GpuOp::AttentionProbs { causal, .. } => {
            softmax::attention_probs(*causal, inputs, out, width)
        }
        GpuOp::SplitSum { splits, program } => {
            fused::split_sum(*splits, program, inputs, out, width)
        }
        GpuOp::ScatterInPlace { axis, rope } => {
            select::scatter_in_place(*axis, rope.as_ref(), inputs, out, width)
        }
        GpuOp::PermutedStore { op, shape, view, perm } => {
            let p = Permuted { view: view.clone(), perm: perm.clone() };
            generate(op, id, inputs, &out.permuted(shape, p), target, training)
        }
        GpuOp::NormedProduct { norm, op, rounded } => {
            fused::normed_product(norm, op, *rounded, inputs, out, target)
        }
    }
}

/// The kernel of an op of the compiled plan.
fn plan_op(
    op: &Op,
    id: StepId,
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    training: bool,
) -> Result<KernelSource, String> {
    let width = target.width;
    if let Some(body) = pointwise(op, inputs, out, training) {
        let used = match op {
            Op::Unary(u) | Op::UnaryGrad(u) => Some(*u),
            _ => None,
        };
        return Ok(per_element(out, width, &body, &helpers(used)));
    }
    match op {
        Op::MatMul => matmul::generate(inputs, out, target),
        Op::Dequantize => dequantize(inputs, out, width),
        Op::SumTo => sum_to(inputs, out, width),
        Op::Reduce { op, axes, .. } => reduce(*op, axes, &inputs[0], out, width),
        Op::Softmax { axis, log } => softmax::softmax(*axis, *log, &inputs[0], out, width),
        Op::SoftmaxGrad { axis, log } => softmax::softmax_grad(*axis, *log, inputs, out, width),
        Op::SoftmaxCrossEntropy => rows::cross_entropy(inputs, out, width),
        Op::SoftmaxCrossEntropyGrad => rows::cross_entropy_grad(inputs, out, width),
        Op::Conv { .. }
        | Op::ConvGradInput { .. }
        | Op::ConvGradWeight { .. }
        | Op::Pool { .. }
        | Op::PoolGrad { .. }
        | Op::Upsample { .. }
        | Op::UpsampleGrad { .. } => conv::generate(op, inputs, out, target),
        Op::BatchNorm { eps, has_weight, has_bias, .. } => {
            norm::batch_norm(inputs, out, *eps, *has_weight, *has_bias, training, width)
        }
        Op::Dropout { p } => {
            let mut k = norm::dropout(&inputs[0], out, *p, width)?;
            k.dropout_node = Some(id.0);
            Ok(k)
        }
        Op::DropoutGrad { p, forward } => {
            let mut k = norm::dropout(&inputs[0], out, *p, width)?;
            k.dropout_node = Some(*forward);
            Ok(k)
        }
        Op::LayerNorm { .. }
        | Op::LayerNormGrad { .. }
        | Op::RmsNorm { .. }
        | Op::RmsNormGrad { .. }
        | Op::GroupNorm { .. }
        | Op::GroupNormGrad { .. }
        | Op::BatchNormGrad { .. } => norm::generate(op, inputs, out, width),
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            attention::generate(&GpuOp::Plan(op.clone()), inputs, out, target)
        }
        Op::Cumsum { axis, reverse } => scan::cumsum(*axis, *reverse, &inputs[0], out, width),
        Op::TopK { k, axis } => scan::topk(*k, *axis, &inputs[0], out, width),
        Op::TakeAlong { axis } => scan::take_along(*axis, &inputs[0], &inputs[1], out, width),
        Op::TakeAlongGrad { axis } => {
            scan::take_along_grad(*axis, &inputs[0], &inputs[1], out, width)
        }
        Op::Concat { .. }
        | Op::Slice { .. }
        | Op::Narrow { .. }
        | Op::SliceScatter { .. }
        | Op::SliceGrad { .. }
        | Op::Gather { .. }
        | Op::GatherGrad { .. }
        | Op::ReduceGrad { .. }
        | Op::ArgMax { .. }
        | Op::Rope { .. } => select::generate(op, inputs, out, width),
        Op::Pad { .. }
        | Op::PadGrad { .. }
        | Op::Interpolate { .. }
        | Op::InterpolateGrad { .. } => spatial_op(op, inputs, out, width),
        other => Err(format!("`{}` has no GPU kernel yet", other.describe())),
    }
}

/// A dequantize some reader cannot read in place (`memory::dequantized_views`): the packed
/// parameter's values decoded into f32 words, one element per invocation.
fn dequantize(inputs: &[Operand], out: &Operand, width: u32) -> Result<KernelSource, String> {
    let x = inputs.first().ok_or("`dequantize` needs its packed parameter")?;
    if !x.dtype.is_packed() || out.dtype != DType::F32 {
        return Err(format!("`dequantize` of a {} value to {}", x.dtype, out.dtype));
    }
    let packed = Operand { dtype: DType::F32, packed: Some(x.dtype), ..x.clone() };
    Ok(per_element(out, width, &store(out, "i", &load(&packed, "i")), ""))
}

/// Padding and resampling (`spatial`).
fn spatial_op(
    op: &Op,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    need_inputs(op, inputs, 1)?;
    match op {
        Op::Pad { widths, mode, value } => {
            spatial::pad(&inputs[0], out, widths, *mode, *value, width)
        }
        Op::PadGrad { widths, mode } => spatial::pad_grad(&inputs[0], out, widths, *mode, width),
        Op::Interpolate { mode, size, scale, align_corners }
        | Op::InterpolateGrad { mode, size, scale, align_corners } => {
            let r = spatial::Resample {
                mode: *mode,
                size,
                scale: scale.as_deref(),
                align_corners: *align_corners,
            };
            if matches!(op, Op::Interpolate { .. }) {
                spatial::interpolate(&r, &inputs[0], out, width)
            } else {
                spatial::interpolate_grad(&r, &inputs[0], out, width)
            }
        }
        _ => unreachable!("plan_op sends padding and resampling here"),
    }
}

/// The per-element body of an element-wise op (one output element `i` per invocation), or
/// None for the ops with kernels of their own.
fn pointwise(op: &Op, inputs: &[Operand], out: &Operand, training: bool) -> Option<String> {
    let f = |k: usize, idx: &str| load(&inputs[k], idx);
    let same = |k: usize| broadcast_at("i", &out.dims(), &inputs[k].dims());
    Some(match op {
        Op::Constant { value } if out.dtype.is_float() => store(out, "i", &f32_lit(*value)),
        Op::Constant { value } => store(out, "i", &format!("{value:?}")),
        Op::Arange => store(out, "i", "i"),
        Op::Unary(u) if out.dtype.is_float() => store(out, "i", &unary(*u, &f(0, "i"))),
        Op::Unary(UnaryOp::Neg) => store(out, "i", &format!("-{}", f(0, "i"))),
        Op::Pow { exponent } => store(out, "i", &pow_expr(&f(0, "i"), *exponent)),
        Op::Binary(b) => {
            let (x, y) = (f(0, &same(0)), f(1, &same(1)));
            store(out, "i", &binary(*b, &x, &y, out.dtype.is_float()))
        }
        Op::Compare(c) => {
            let (x, y) = (f(0, &same(0)), f(1, &same(1)));
            store(out, "i", &format!("({x} {} {y})", c.symbol()))
        }
        Op::Where => {
            let (c, x, y) = (f(0, &same(0)), f(1, &same(1)), f(2, &same(2)));
            store(out, "i", &format!("select({y}, {x}, {c} != 0)"))
        }
        Op::Cast if out.dtype == DType::Bool => {
            let zero = if inputs[0].dtype.is_float() { "0.0" } else { "0" };
            store(out, "i", &format!("select(0, 1, {} != {zero})", f(0, "i")))
        }
        Op::Cast if out.dtype.is_float() => store(out, "i", &format!("f32({})", f(0, "i"))),
        Op::Cast => store(out, "i", &format!("i32({})", f(0, "i"))),
        Op::Reshape | Op::StopGradient => store(out, "i", &f(0, "i")),
        Op::BroadcastTo => store(out, "i", &f(0, &same(0))),
        Op::UnaryGrad(u) => store(out, "i", &unary_grad(*u, &f(0, "i"), &f(1, "i"))),
        Op::Permute { perm } => {
            // Output coordinate a is input coordinate perm[a].
            let dims = out.dims();
            let os = Ext::strides(&dims);
            let is = Ext::strides(&inputs[0].dims());
            let terms: Vec<String> = perm
                .iter()
                .enumerate()
                .map(|(a, &p)| format!("((i / {}) % {}) * {}", os[a], dims[a], is[p]))
                .collect();
            store(out, "i", &f(0, &terms.join(" + ")))
        }
        // Dropout is the identity in inference plans and when it drops nothing.
        Op::Dropout { p } | Op::DropoutGrad { p, .. } if !training || *p == 0.0 => {
            store(out, "i", &f(0, "i"))
        }
        _ => return None,
    })
}

/// Sums `input` (broadcast up to its shape from `out`) back down to `out`'s shape.
fn sum_to(inputs: &[Operand], out: &Operand, width: u32) -> Result<KernelSource, String> {
    let x = &inputs[0];
    let r = x.shape.len();
    let pad = r - out.shape.len();
    // Axes of x that collapse: leading ones, and those where out has size 1 but x does not.
    let full: Vec<Ext> =
        (0..r).map(|a| if a < pad { Ext::lit(1) } else { out.dim(a - pad) }).collect();
    let reduced: Vec<usize> = (0..r).filter(|&a| full[a].n == 1 && x.shape[a] != 1).collect();
    let sum = rows::Combine {
        step: "acc = acc + v;",
        init: "0.0",
        across: "wg_sum",
        result: "acc".into(),
    };
    rows::reduce(x, out, &full, &reduced, &sum, width)
}

fn reduce(
    op: ReduceOp,
    axes: &[usize],
    x: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let keep: Vec<Ext> = (0..x.shape.len())
        .map(|a| if axes.contains(&a) { Ext::lit(1) } else { x.dim(a) })
        .collect();
    let count = Ext::product(axes.iter().map(|&a| x.dim(a)).collect::<Vec<_>>().iter());
    if !x.dtype.is_float() {
        // Integers (and masks) accumulate in i32, wrapping as the CPU backend's sums do.
        let (step, init) = match op {
            ReduceOp::Sum => ("acc = acc + v;", "0"),
            ReduceOp::Max => ("acc = max(acc, v);", "i32(-2147483647 - 1)"),
            ReduceOp::Min => ("acc = min(acc, v);", "2147483647"),
            ReduceOp::Mean => return Err("an integer mean has no kernel".into()),
        };
        let c = rows::Combine { step, init, across: "", result: "acc".into() };
        return rows::reduce(x, out, &keep, axes, &c, width);
    }
    let c = match op {
        ReduceOp::Sum => rows::Combine {
            step: "acc = acc + v;",
            init: "0.0",
            across: "wg_sum",
            result: "acc".into(),
        },
        ReduceOp::Mean => rows::Combine {
            step: "acc = acc + v;",
            init: "0.0",
            across: "wg_sum",
            result: format!("acc / f32({count})"),
        },
        ReduceOp::Max => rows::Combine {
            step: "acc = max(acc, v);",
            init: "-3.4028235e38",
            across: "wg_max",
            result: "acc".into(),
        },
        ReduceOp::Min => rows::Combine {
            step: "acc = min(acc, v);",
            init: "3.4028235e38",
            across: "wg_min",
            result: "acc".into(),
        },
    };
    rows::reduce(x, out, &keep, axes, &c, width)
}

#[cfg(test)]
mod broadcast_tests;
#[cfg(test)]
mod index_eval;
