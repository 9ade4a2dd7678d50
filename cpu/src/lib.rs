//! The CPU backend's kernels: one function per op of [`Op`], forward and derivative.
//!
//! These are the numerical reference for every other backend, so they aim at clarity first and
//! PyTorch's semantics exactly. Every float kernel is written once, generic over `f32`/`f64`,
//! and runs on `F32` or `F64` storage (F64 exists for gradient checks); integers are `I32`.
//!
//! Conventions shared by all kernels:
//! - The output's dtype and shape are the step's; a kernel that can compute its shape checks it
//!   against the step's and fails on a mismatch rather than guess.
//! - Float inputs of one op may mix `F32` and `F64` storage (a constant is always `F32`); the op
//!   then computes in, and returns, `F64`.
//! - A result of a half type (`f16`, `bf16`) is rounded to it once, after the kernel, which
//!   computes in f32 from its (already half) operands: what the GPU does when it stores one.
//! - Sums that reduce many elements (reductions, `SumTo`, normalization statistics, weight
//!   gradients of the norms) accumulate in f64 whatever the storage.
//! - Data never panics a kernel: an out-of-range index, a wrong storage or an inconsistent input
//!   is a [`KernelError`] naming the op and the problem. Zero-sized axes (which mgn's `dim`s
//!   exclude) are refused up front rather than handled by every kernel.
//!
//! Matrix products go through `matrixmultiply` (threaded), except products of a weight by a few
//! rows (decoding), which stream the weight once over the cores (`matvec`); a plan's weights
//! are read where they lie, packed or transposed, never copied per run (`fused`). Convolution
//! is im2col + GEMM; attention, pooling and the row-wise kernels split their independent
//! outputs over the cores, on one pool of threads started once.

pub(crate) mod attention;
pub(crate) mod conv;
mod float;
pub mod fused;
pub(crate) mod layout;
mod matmul;
mod matvec;
mod movement;
mod norm;
mod packed;
mod pointwise;
mod reduce;
mod scan;
mod select;
mod spatial;
#[cfg(test)]
mod tests;

use float::Float;
use mgn_ir::infer::Ty;
use mgn_ir::op::Op;
use mgn_ir::{DType, Data, Tensor};
use std::borrow::Cow;

pub use float::threads;
pub use pointwise::dropout_keep;

/// What a kernel may need to know about the step it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctx {
    /// A training plan: batch norm uses batch statistics and dropout drops.
    pub training: bool,
    /// The run's dropout seed.
    pub seed: u64,
    /// The index of the step being run. A dropout mask is `hash(seed, node, element index)`
    /// (see [`dropout_keep`]); `DropoutGrad` uses its `forward` step's index instead.
    pub node: u32,
}

/// Why a kernel could not run: the message names the op and the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelError(pub String);

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KernelError {}

impl From<mgn_ir::shape::ShapeError> for KernelError {
    fn from(e: mgn_ir::shape::ShapeError) -> KernelError {
        KernelError(e.0)
    }
}

pub(crate) type KResult<T> = Result<T, KernelError>;

pub(crate) fn err<T>(msg: impl Into<String>) -> KResult<T> {
    Err(KernelError(msg.into()))
}

/// Runs one op on host tensors. `dtype` and `shape` are the step's declared result type.
/// `Input` and `Param` are not computations: the executor supplies their values.
pub fn eval(
    op: &Op,
    inputs: &[&Tensor],
    dtype: DType,
    shape: &[usize],
    ctx: &Ctx,
) -> Result<Tensor, KernelError> {
    let run = || -> KResult<Data> {
        for (i, t) in inputs.iter().enumerate() {
            // A packed tensor stores bytes, its blocks' worth of its elements.
            let items = match &t.data {
                Data::Packed(_) => t.dtype.bytes_for(layout::numel(&t.shape)),
                _ => Some(layout::numel(&t.shape)),
            };
            if Some(t.data.len()) != items {
                return err(format!(
                    "input {i} has shape {:?} but holds {} elements",
                    t.shape,
                    t.data.len()
                ));
            }
            if t.shape.contains(&0) {
                return err(format!(
                    "input {i} has a zero-sized axis, {:?} (mgn dims are at least 1)",
                    t.shape
                ));
            }
        }
        if shape.contains(&0) {
            return err(format!(
                "the step's shape {shape:?} has a zero-sized axis (mgn dims are at least 1)"
            ));
        }
        // The op's typing rule, the one the plan validator and the compiler apply.
        let types: Vec<Ty> = inputs.iter().map(|t| (t.dtype, &t.shape[..])).collect();
        mgn_ir::infer::check(op, &types, (dtype, shape))?;
        let mut data = dispatch(op, inputs, dtype, shape, ctx)?;
        // A value of a half type holds a value of that type, whichever op made it: kernels
        // compute in f32 (or f64) and the result is rounded once, as a GPU stores it.
        if dtype.is_half() && !matches!(op, Op::Cast) {
            pointwise::round_to_half(&mut data, dtype);
        }
        if data.len() != layout::numel(shape) {
            return err(format!("produced {} elements for the step's shape {shape:?}", data.len()));
        }
        Ok(data)
    };
    let data = run().map_err(|e| KernelError(format!("{}: {}", op.describe(), e.0)))?;
    Ok(Tensor { dtype, shape: shape.to_vec(), data })
}

fn dispatch(op: &Op, x: &[&Tensor], dtype: DType, shape: &[usize], ctx: &Ctx) -> KResult<Data> {
    use Op::*;
    match op {
        Input { .. } | Param { .. } => {
            err("inputs and parameters are supplied by the executor, not computed by a kernel")
        }
        Constant { value } => Ok(pointwise::constant(*value, dtype, shape)),
        Arange => pointwise::arange(shape),
        Unary(u) => pointwise::unary(*u, x[0]),
        Pow { exponent } => pointwise::pow(x[0], *exponent),
        Binary(b) => pointwise::binary(*b, x[0], x[1], shape),
        Cast => pointwise::cast(x[0], dtype),
        Dequantize => match &x[0].data {
            Data::Packed(bytes) => Ok(Data::F32(mgn_ir::packed::dequantize(x[0].dtype, bytes))),
            _ => err(format!("dequantize reads a packed value, not a {} one", x[0].dtype)),
        },
        StopGradient => Ok(x[0].data.clone()),
        MatMul => matmul::matmul(x[0], x[1], shape),
        Permute { perm } => movement::permute(x[0], perm, shape),
        Reshape => movement::reshape(x[0], shape),
        Concat { axis } => movement::concat(x, *axis, shape),
        Slice { axis, start, end } => movement::slice(x[0], *axis, *start, *end, shape),
        Narrow { axis, len } => movement::narrow(x[0], x[1], *axis, *len, shape),
        SliceScatter { axis } => movement::slice_scatter(x[0], x[1], x[2], *axis),
        Gather { axis } => movement::gather(x[0], x[1], *axis, shape),
        Reduce { op, axes, keepdim } => reduce::reduce(*op, x[0], axes, *keepdim, shape),
        ArgMax { axis } => reduce::argmax(x[0], *axis, shape),
        Softmax { axis, log } => reduce::softmax(x[0], *axis, *log),
        LayerNorm { eps, has_weight, has_bias } => {
            norm::layer_norm(x, *eps, *has_weight, *has_bias)
        }
        RmsNorm { eps, has_weight } => norm::rms_norm(x, *eps, *has_weight),
        GroupNorm { groups, eps, has_weight, has_bias } => {
            norm::group_norm(x, *groups, *eps, *has_weight, *has_bias)
        }
        BatchNorm { eps, has_weight, has_bias, .. } => {
            norm::batch_norm(x, *eps, *has_weight, *has_bias, ctx.training)
        }
        Dropout { p } => pointwise::dropout(x[0], *p, ctx.training, ctx.seed, ctx.node),
        Conv { stride, padding, dilation, groups, .. } => {
            conv::conv(x, &conv::Geometry::new(stride, padding, dilation, *groups)?, shape)
        }
        Pool { op, kernel, stride, padding } => {
            conv::pool(*op, x[0], kernel, stride, padding, shape)
        }
        Upsample { scale } => conv::upsample(x[0], *scale, shape),
        Attention { causal, scale, has_mask } => {
            attention::attention(x, *causal, *scale, *has_mask, shape)
        }
        Rope { theta, offset, inverse } => {
            // A run-time start (decoding) moves every position; negative ones count as 0.
            let start = match x.get(1) {
                Some(s) => movement::clamped_start(s, usize::MAX, 0)?,
                None => 0,
            };
            attention::rope(x[0], *theta, offset + start, *inverse)
        }
        SoftmaxCrossEntropy => reduce::cross_entropy(x[0], x[1], shape),
        Pad { widths, mode, value } => spatial::pad(x[0], widths, *mode, *value, shape),
        Interpolate { mode, size, scale, align_corners } => {
            spatial::interpolate(x[0], *mode, size, scale.as_deref(), *align_corners, shape)
        }
        Compare(c) => select::compare(*c, x[0], x[1], shape),
        Where => select::where_(x[0], x[1], x[2], shape),
        Cumsum { axis, reverse } => scan::cumsum(x[0], *axis, *reverse),
        TopK { k, axis } => scan::topk(x[0], *k, *axis, shape),
        TakeAlong { axis } => scan::take_along(x[0], x[1], *axis),

        // Listed, so that a new op must be placed in one half or the other.
        SumTo
        | BroadcastTo
        | UnaryGrad(_)
        | ReduceGrad { .. }
        | SoftmaxGrad { .. }
        | SliceGrad { .. }
        | GatherGrad { .. }
        | LayerNormGrad { .. }
        | RmsNormGrad { .. }
        | GroupNormGrad { .. }
        | BatchNormGrad { .. }
        | DropoutGrad { .. }
        | ConvGradInput { .. }
        | ConvGradWeight { .. }
        | PoolGrad { .. }
        | UpsampleGrad { .. }
        | AttentionGrad { .. }
        | SoftmaxCrossEntropyGrad
        | PadGrad { .. }
        | InterpolateGrad { .. }
        | TakeAlongGrad { .. } => dispatch_grad(op, x, shape, ctx),
    }
}

/// The derivative ops (`dispatch`'s other half).
fn dispatch_grad(op: &Op, x: &[&Tensor], shape: &[usize], ctx: &Ctx) -> KResult<Data> {
    use Op::*;
    match op {
        SumTo => pointwise::sum_to(x[0], shape),
        BroadcastTo => pointwise::broadcast_to(x[0], shape),
        UnaryGrad(u) => pointwise::unary_grad(*u, x[0], x[1]),
        ReduceGrad { op, axes, keepdim } => {
            reduce::reduce_grad(*op, x[0], x[1], x[2], axes, *keepdim)
        }
        SoftmaxGrad { axis, log } => reduce::softmax_grad(x[0], x[1], *axis, *log),
        SliceGrad { axis, start, end } => movement::slice_grad(x[0], *axis, *start, *end, shape),
        GatherGrad { axis } => movement::gather_grad(x[0], x[1], *axis, shape),
        LayerNormGrad { eps, has_weight, has_bias, part } => {
            norm::layer_norm_grad(x, *eps, *has_weight, *has_bias, *part)
        }
        RmsNormGrad { eps, has_weight, part } => norm::rms_norm_grad(x, *eps, *has_weight, *part),
        GroupNormGrad { groups, eps, has_weight, has_bias, part } => {
            norm::group_norm_grad(x, *groups, *eps, *has_weight, *has_bias, *part)
        }
        BatchNormGrad { eps, has_weight, has_bias, part, training } => {
            norm::batch_norm_grad(x, *eps, *has_weight, *has_bias, *part, *training)
        }
        DropoutGrad { p, forward } => {
            pointwise::dropout(x[0], *p, ctx.training, ctx.seed, *forward)
        }
        ConvGradInput { stride, padding, dilation, groups } => conv::conv_grad_input(
            x[0],
            x[1],
            &conv::Geometry::new(stride, padding, dilation, *groups)?,
            shape,
        ),
        ConvGradWeight { stride, padding, dilation, groups } => conv::conv_grad_weight(
            x[0],
            x[1],
            &conv::Geometry::new(stride, padding, dilation, *groups)?,
            shape,
        ),
        PoolGrad { op, kernel, stride, padding } => {
            conv::pool_grad(*op, x[0], x[1], kernel, stride, padding)
        }
        UpsampleGrad { scale } => conv::upsample_grad(x[0], *scale, shape),
        AttentionGrad { causal, scale, has_mask, part } => {
            attention::attention_grad(x, *causal, *scale, *has_mask, *part)
        }
        SoftmaxCrossEntropyGrad => reduce::cross_entropy_grad(x[0], x[1], x[2]),
        PadGrad { widths, mode } => spatial::pad_grad(x[0], widths, *mode, shape),
        InterpolateGrad { mode, size, scale, align_corners } => {
            spatial::interpolate_grad(x[0], *mode, size, scale.as_deref(), *align_corners, shape)
        }
        TakeAlongGrad { axis } => scan::take_along_grad(x[0], x[1], *axis, shape),
        _ => err("not a derivative op"),
    }
}

/// `SliceScatter { axis }` of `[x, src, start]` written into `x` itself rather than into a copy
/// of it: for a step that is the last reader of `x` and whose value replaces it, a KV cache
/// taking one token's keys, where [`eval`] would copy the whole cache to change a row. The
/// checks are `eval`'s, the values those `eval` returns; on an error `x` is unchanged.
pub fn slice_scatter_in_place(
    x: &mut Tensor,
    src: &Tensor,
    start: &Tensor,
    axis: usize,
) -> Result<(), KernelError> {
    let op = Op::SliceScatter { axis };
    let run = |x: &mut Tensor| -> KResult<()> {
        for (i, t) in [&*x, src, start].iter().enumerate() {
            if t.data.len() != layout::numel(&t.shape) || t.shape.contains(&0) {
                return err(format!("input {i} holds {} elements for {:?}", t.data.len(), t.shape));
            }
        }
        let types: Vec<Ty> = [&*x, src, start].iter().map(|t| (t.dtype, &t.shape[..])).collect();
        mgn_ir::infer::check(&op, &types, (x.dtype, &x.shape))?;
        // A half x holds half values already: only the written rows need rounding (`eval`
        // rounds the whole result).
        let mut rounded = None;
        if x.dtype.is_half() {
            let mut data = src.data.clone();
            pointwise::round_to_half(&mut data, x.dtype);
            rounded = Some(Tensor { dtype: src.dtype, shape: src.shape.clone(), data });
        }
        let src = rounded.as_ref().unwrap_or(src);
        movement::slice_scatter_into(&mut x.data, &x.shape, src, start, axis)
    };
    run(x).map_err(|e| KernelError(format!("{}: {}", op.describe(), e.0)))
}

/// Updated running statistics of a training batch-norm step, as PyTorch does it:
/// `new = (1 − momentum)·old + momentum·batch_stat`, the variance being the batch's *unbiased*
/// variance (over N and the spatial axes; with a single value per channel, the biased one, 0).
/// `x: [N, C, ...]`, running statistics `[C]`; the results keep the running statistics' storage.
///
/// # Panics
/// When the running statistics are not `[C]` for `x`'s channel count: the plan checker rules
/// that out, so it is a bug in the caller, not bad data.
pub fn batch_norm_update(
    x: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    momentum: f64,
) -> (Tensor, Tensor) {
    norm::batch_norm_update(x, running_mean, running_var, momentum)
}

// ---- input access shared by the kernels --------------------------------------------------------

/// Whether any input is stored as F64 (and so the op computes in f64).
pub(crate) fn any_f64(inputs: &[&Tensor]) -> bool {
    inputs.iter().any(|t| matches!(t.data, Data::F64(_)))
}

/// Runs `$body` with the type `$T` bound to `f64` when any of `$inputs` is stored as F64,
/// otherwise to `f32`. The body returns `KResult<Vec<$T>>`; the macro yields `KResult<Data>`.
macro_rules! by_float {
    ($inputs:expr, $T:ident => $body:expr) => {
        if $crate::any_f64($inputs) {
            #[allow(unused_imports)]
            use num_traits::{Float as _, FloatConst as _, One as _, Zero as _};
            type $T = f64;
            $body.map(<$T as $crate::float::Float>::wrap)
        } else {
            #[allow(unused_imports)]
            use num_traits::{Float as _, FloatConst as _, One as _, Zero as _};
            type $T = f32;
            $body.map(<$T as $crate::float::Float>::wrap)
        }
    };
}
pub(crate) use by_float;

/// Applies an element-type-generic `$body` (over the slice `$v`) to whatever storage `$data` has.
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            mgn_ir::Data::F32($v) => mgn_ir::Data::F32($body),
            mgn_ir::Data::F64($v) => mgn_ir::Data::F64($body),
            mgn_ir::Data::I32($v) => mgn_ir::Data::I32($body),
            mgn_ir::Data::Packed(_) => unreachable!("{}", $crate::PACKED_ONLY_DEQUANTIZED),
        }
    };
}

/// Why no kernel but `Dequantize` meets a packed operand: the validator refuses plans where
/// another step reads one, and every plan a backend runs is validated.
pub(crate) const PACKED_ONLY_DEQUANTIZED: &str =
    "a packed value is read only through dequantize (the plan validator's rule)";
pub(crate) use map_data;

/// The elements of a float input as `T` (borrowed when stored as `T`, converted otherwise).
pub(crate) fn floats<'a, T: Float>(t: &'a Tensor, what: &str) -> KResult<Cow<'a, [T]>> {
    if let Some(v) = T::view(&t.data) {
        return Ok(Cow::Borrowed(v));
    }
    match &t.data {
        Data::F32(v) => Ok(Cow::Owned(v.iter().map(|&x| T::of(x as f64)).collect())),
        Data::F64(v) => Ok(Cow::Owned(v.iter().map(|&x| T::of(x)).collect())),
        Data::I32(_) => err(format!("{what} must be a float tensor, but it is stored as i32")),
        Data::Packed(_) => err(format!("{what} is packed: {PACKED_ONLY_DEQUANTIZED}")),
    }
}

/// The elements of an integer input.
pub(crate) fn ints<'a>(t: &'a Tensor, what: &str) -> KResult<&'a [i32]> {
    match &t.data {
        Data::I32(v) => Ok(v),
        _ => err(format!("{what} must be an integer (i32) tensor, but it is stored as a float")),
    }
}

/// Fails unless the shape a kernel computed is the step's.
pub(crate) fn check_shape(computed: &[usize], step: &[usize]) -> KResult<()> {
    if computed != step {
        return err(format!("the result has shape {computed:?} but the step says {step:?}"));
    }
    Ok(())
}

/// Resolves an axis attribute against a rank.
pub(crate) fn check_axis(axis: usize, rank: usize, what: &str) -> KResult<()> {
    if axis >= rank {
        return err(format!("{what} {axis} is out of range for a tensor with {rank} axes"));
    }
    Ok(())
}
