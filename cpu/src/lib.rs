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
//! - Sums that reduce many elements (reductions, `SumTo`, normalization statistics, weight
//!   gradients of the norms) accumulate in f64 whatever the storage.
//! - Data never panics a kernel: an out-of-range index, a wrong storage or an inconsistent input
//!   is a [`KernelError`] naming the op and the problem. Zero-sized axes (which mgn's `dim`s
//!   exclude) are refused up front rather than handled by every kernel.
//!
//! Matrix products go through `matrixmultiply` (threaded); convolution is im2col + GEMM;
//! attention, pooling and the row-wise kernels split their independent outputs over the cores.

pub(crate) mod attention;
pub(crate) mod conv;
mod float;
pub(crate) mod layout;
mod matmul;
mod movement;
mod norm;
mod pointwise;
mod reduce;
#[cfg(test)]
mod tests;

use float::Float;
use mgn_ir::op::{Elem, Op};
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
            if t.data.len() != layout::numel(&t.shape) {
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
        if let Some(want) = result_like(op, inputs) {
            check_shape(want, shape)?;
        }
        let data = dispatch(op, inputs, dtype, shape, ctx)?;
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
        Constant { value } => {
            arity(x, 0)?;
            Ok(pointwise::constant(*value, dtype, shape))
        }
        Arange => {
            arity(x, 0)?;
            pointwise::arange(shape)
        }
        Unary(u) => {
            arity(x, 1)?;
            pointwise::unary(*u, x[0])
        }
        Pow { exponent } => {
            arity(x, 1)?;
            pointwise::pow(x[0], *exponent)
        }
        Binary(b) => {
            arity(x, 2)?;
            pointwise::binary(*b, x[0], x[1], shape)
        }
        Cast => {
            arity(x, 1)?;
            pointwise::cast(x[0], dtype)
        }
        MatMul => {
            arity(x, 2)?;
            matmul::matmul(x[0], x[1], shape)
        }
        Permute { perm } => {
            arity(x, 1)?;
            movement::permute(x[0], perm, shape)
        }
        Reshape => {
            arity(x, 1)?;
            movement::reshape(x[0], shape)
        }
        Concat { axis } => movement::concat(x, *axis, shape),
        Slice { axis, start, end } => {
            arity(x, 1)?;
            movement::slice(x[0], *axis, *start, *end, shape)
        }
        Gather { axis } => {
            arity(x, 2)?;
            movement::gather(x[0], x[1], *axis, shape)
        }
        Reduce { op, axes, keepdim } => {
            arity(x, 1)?;
            reduce::reduce(*op, x[0], axes, *keepdim, shape)
        }
        ArgMax { axis } => {
            arity(x, 1)?;
            reduce::argmax(x[0], *axis, shape)
        }
        Softmax { axis, log } => {
            arity(x, 1)?;
            reduce::softmax(x[0], *axis, *log)
        }
        LayerNorm { eps, has_weight, has_bias } => {
            arity(x, 1 + *has_weight as usize + *has_bias as usize)?;
            norm::layer_norm(x, *eps, *has_weight, *has_bias)
        }
        RmsNorm { eps, has_weight } => {
            arity(x, 1 + *has_weight as usize)?;
            norm::rms_norm(x, *eps, *has_weight)
        }
        GroupNorm { groups, eps, has_weight, has_bias } => {
            arity(x, 1 + *has_weight as usize + *has_bias as usize)?;
            norm::group_norm(x, *groups, *eps, *has_weight, *has_bias)
        }
        BatchNorm { eps, has_weight, has_bias, .. } => {
            arity(x, 3 + *has_weight as usize + *has_bias as usize)?;
            norm::batch_norm(x, *eps, *has_weight, *has_bias, ctx.training)
        }
        Dropout { p } => {
            arity(x, 1)?;
            pointwise::dropout(x[0], *p, ctx.training, ctx.seed, ctx.node)
        }
        Conv { stride, padding, dilation, groups, has_bias } => {
            arity(x, 2 + *has_bias as usize)?;
            conv::conv(x, &conv::Geometry::new(stride, padding, dilation, *groups)?, shape)
        }
        Pool { op, kernel, stride, padding } => {
            arity(x, 1)?;
            conv::pool(*op, x[0], kernel, stride, padding, shape)
        }
        Upsample { scale } => {
            arity(x, 1)?;
            conv::upsample(x[0], *scale, shape)
        }
        Attention { causal, scale, has_mask } => {
            arity(x, 3 + *has_mask as usize)?;
            attention::attention(x, *causal, *scale, *has_mask, shape)
        }
        Rope { theta, offset, inverse } => {
            arity(x, 1)?;
            attention::rope(x[0], *theta, *offset, *inverse)
        }
        SoftmaxCrossEntropy => {
            arity(x, 2)?;
            reduce::cross_entropy(x[0], x[1], shape)
        }
        CrossEntropyRows => {
            arity(x, 2)?;
            reduce::cross_entropy_rows(x[0], x[1], shape)
        }

        // ---- derivative ops ----
        SumTo => {
            arity(x, 1)?;
            pointwise::sum_to(x[0], shape)
        }
        BroadcastTo => {
            arity(x, 1)?;
            pointwise::broadcast_to(x[0], shape)
        }
        UnaryGrad(u) => {
            arity(x, 2)?;
            pointwise::unary_grad(*u, x[0], x[1])
        }
        ReduceGrad { op, axes, keepdim } => {
            arity(x, 3)?;
            reduce::reduce_grad(*op, x[0], x[1], x[2], axes, *keepdim)
        }
        SoftmaxGrad { axis, log } => {
            arity(x, 2)?;
            reduce::softmax_grad(x[0], x[1], *axis, *log)
        }
        SliceGrad { axis, start, end } => {
            arity(x, 1)?;
            movement::slice_grad(x[0], *axis, *start, *end, shape)
        }
        GatherGrad { axis } => {
            arity(x, 2)?;
            movement::gather_grad(x[0], x[1], *axis, shape)
        }
        LayerNormGrad { eps, has_weight, has_bias, part } => {
            arity(x, 2 + *has_weight as usize + *has_bias as usize)?;
            norm::layer_norm_grad(x, *eps, *has_weight, *has_bias, *part)
        }
        RmsNormGrad { eps, has_weight, part } => {
            arity(x, 2 + *has_weight as usize)?;
            norm::rms_norm_grad(x, *eps, *has_weight, *part)
        }
        GroupNormGrad { groups, eps, has_weight, has_bias, part } => {
            arity(x, 2 + *has_weight as usize + *has_bias as usize)?;
            norm::group_norm_grad(x, *groups, *eps, *has_weight, *has_bias, *part)
        }
        BatchNormGrad { eps, has_weight, has_bias, part, training } => {
            arity(x, 4 + *has_weight as usize + *has_bias as usize)?;
            norm::batch_norm_grad(x, *eps, *has_weight, *has_bias, *part, *training)
        }
        DropoutGrad { p, forward } => {
            arity(x, 1)?;
            pointwise::dropout(x[0], *p, ctx.training, ctx.seed, *forward)
        }
        ConvGradInput { stride, padding, dilation, groups } => {
            arity(x, 2)?;
            conv::conv_grad_input(
                x[0],
                x[1],
                &conv::Geometry::new(stride, padding, dilation, *groups)?,
                shape,
            )
        }
        ConvGradWeight { stride, padding, dilation, groups } => {
            arity(x, 2)?;
            conv::conv_grad_weight(
                x[0],
                x[1],
                &conv::Geometry::new(stride, padding, dilation, *groups)?,
                shape,
            )
        }
        PoolGrad { op, kernel, stride, padding } => {
            arity(x, 2)?;
            conv::pool_grad(*op, x[0], x[1], kernel, stride, padding)
        }
        UpsampleGrad { scale } => {
            arity(x, 1)?;
            conv::upsample_grad(x[0], *scale, shape)
        }
        AttentionGrad { causal, scale, has_mask, part } => {
            arity(x, 4 + *has_mask as usize)?;
            attention::attention_grad(x, *causal, *scale, *has_mask, *part)
        }
        NormWeightGradPartial { eps, center, chunk } => {
            arity(x, 2)?;
            norm::norm_weight_grad_partial(x, *eps, *center, *chunk)
        }
        AttentionStats { causal, scale, has_mask } => {
            arity(x, 2 + *has_mask as usize)?;
            attention::attention_stats(x, *causal, *scale, *has_mask, shape)
        }
        SoftmaxCrossEntropyGrad => {
            arity(x, 3)?;
            reduce::cross_entropy_grad(x[0], x[1], x[2])
        }
        Fused { program } => run_program(program, x, dtype, shape, ctx),
        MatMulEpilogue { program } => {
            if x.len() < 2 {
                return err(format!(
                    "expects a, b and the epilogue's inputs, got {} inputs",
                    x.len()
                ));
            }
            let product = eval(&MatMul, &x[..2], dtype, shape, ctx)?;
            let mut inputs: Vec<&Tensor> = vec![&product];
            inputs.extend(&x[2..]);
            run_program(program, &inputs, dtype, shape, ctx)
        }
    }
}

/// A fused program (`Op::Fused`) node by node with the ops' own kernels: every node has the
/// step's shape (fusion only joins same-shaped steps), so the reference is the unfused
/// computation.
fn run_program(
    program: &[Elem],
    x: &[&Tensor],
    dtype: DType,
    shape: &[usize],
    ctx: &Ctx,
) -> KResult<Data> {
    let mut nodes: Vec<Tensor> = Vec::with_capacity(program.len());
    for e in program {
        let t = match (e, e.op()) {
            (Elem::Input(k), _) => x
                .get(*k as usize)
                .map(|t| (*t).clone())
                .ok_or_else(|| KernelError(format!("fused input {k} of {}", x.len())))?,
            (_, Some((op, args))) => {
                let args: Vec<&Tensor> = args
                    .iter()
                    .map(|&a| {
                        nodes.get(a as usize).ok_or_else(|| {
                            KernelError(format!("fused node {a} is not computed yet"))
                        })
                    })
                    .collect::<KResult<_>>()?;
                eval(&op, &args, dtype, shape, ctx)?
            }
            (_, None) => return err("a fused node without an op".to_string()),
        };
        nodes.push(t);
    }
    nodes.pop().map(|t| t.data).ok_or_else(|| KernelError("an empty fused program".into()))
}

/// The shape of the result when it is one input's shape (the kernels of the other ops check
/// the shape they compute).
fn result_like<'a>(op: &Op, x: &[&'a Tensor]) -> Option<&'a [usize]> {
    use mgn_ir::op::GradPart;
    use Op::*;
    let input = match op {
        Unary(_)
        | Pow { .. }
        | Cast
        | Softmax { .. }
        | LayerNorm { .. }
        | RmsNorm { .. }
        | GroupNorm { .. }
        | BatchNorm { .. }
        | Dropout { .. }
        | Rope { .. } => 0,
        UnaryGrad(_)
        | ReduceGrad { .. }
        | SoftmaxGrad { .. }
        | DropoutGrad { .. }
        | PoolGrad { .. }
        | SoftmaxCrossEntropyGrad => 0,
        LayerNormGrad { part: GradPart::Input, .. } | RmsNormGrad { part: GradPart::Input, .. } => {
            0
        }
        GroupNormGrad { part: GradPart::Input, .. }
        | BatchNormGrad { part: GradPart::Input, .. } => 0,
        AttentionGrad { part: GradPart::Q, .. } => 0,
        AttentionGrad { part: GradPart::K, .. } => 1,
        AttentionGrad { part: GradPart::V, .. } => 2,
        _ => return None,
    };
    x.get(input).map(|t| t.shape.as_slice())
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

fn arity(inputs: &[&Tensor], n: usize) -> KResult<()> {
    if inputs.len() != n {
        return err(format!(
            "expects {n} input{}, got {}",
            if n == 1 { "" } else { "s" },
            inputs.len()
        ));
    }
    Ok(())
}

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
        }
    };
}
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
