//! Convolution, pooling and upsampling, forward and derivatives.
//!
//! The three convolution ops are implicit GEMMs (`implicit_gemm`): per group, a workgroup
//! computes one tile of the product, staging slices of both operands into shared memory straight
//! from the tensors (im2col on the fly, zero in the padding) and accumulating a register block
//! per invocation; long reductions are split among the workgroup's invocations and summed
//! through shared memory, and — when the output has too few tiles to fill the GPU — also across
//! workgroups (`GpuOp::ConvSplit`, made by `rewrite::split_k`: each range stored apart, then a
//! `SplitSum` pass), so no kernel needs atomics:
//!
//! - `Conv`: weights × im2col(x) (+ bias), M = output channels, N = samples × output positions.
//! - `ConvGradInput`: weightsᵀ × the dy each tap came from (a transposed convolution), M = input
//!   channels, N = samples × input positions. Strided (dilation 1): one GEMM per stride phase of
//!   the input positions, over the taps that reach that phase (`conv_grad_input_phased`).
//! - `ConvGradWeight`: dy × im2col(x)ᵀ, M = output channels, N = input channels × taps, K =
//!   samples × output positions.
//!
//! (Should no tile fit the workgroup width, they fall back to one invocation per output element
//! looping over its contributions.) The other kernels compute one output element per invocation:
//!
//! - `Pool`: the window (max ignores padding, avg counts it as zeros).
//! - `PoolGrad`: the windows containing the element; max pooling recomputes each window's first
//!   arg-max (the CPU's rule, NaN counting as the maximum) to see whether it is this element.
//! - `Upsample` / `UpsampleGrad`: the nearest source element / the block summed.
//!
//! As on the CPU (`cpu/conv.rs`), a 1-D op runs as 2-D with a height of 1 (kernel 1, stride 1,
//! padding 0, dilation 1 on that axis).
//!
//! Submodules: the implicit GEMM and its tile choice (`gemm`), the three convolutions as GEMMs
//! (`tiled`) and as one invocation per element (`direct`), pooling and upsampling (`pool`).

mod direct;
mod gemm;
mod pool;
mod tiled;

use super::{elementwise, KernelSource, Operand, Target};
use direct::{conv, conv_grad_input, conv_grad_weight};
use mgn_ir::op::Op;
use mgn_ir::shape::conv::{Conv as ConvDims, Geometry, Pool as PoolDims};
use pool::{pool, pool_grad, upsample, upsample_grad, UpDims};
pub(crate) use tiled::split_depth;
use tiled::{conv_grad_input_phased, conv_grad_input_tiled, conv_grad_weight_tiled, conv_tiled};

/// Kernels for conv1d/conv2d and their input and weight derivatives, max and average pooling
/// and its derivative, nearest upsampling and its derivative.
pub fn generate(
    op: &Op,
    inputs: &[Operand],
    out: &Operand,
    target: Target,
) -> Result<KernelSource, String> {
    let width = target.width;
    let what = op.describe();
    let need = |k: usize| super::need_inputs(op, inputs, k);
    let src = match op {
        Op::Conv { .. } => return forward(op, inputs, out, target, None),
        Op::ConvGradInput { stride, padding, dilation, groups } => {
            need(2)?;
            let c = conv_dims(&out.shape, &inputs[1].shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &inputs[0].shape, &c.out_shape())?;
            if let Some(k) = conv_grad_input_phased(&c, &inputs[0], &inputs[1], out, target) {
                return Ok(k);
            }
            if let Some(k) = conv_grad_input_tiled(&c, &inputs[0], &inputs[1], out, target, 1) {
                return Ok(k);
            }
            conv_grad_input(&c, &inputs[0], &inputs[1], out)
        }
        Op::ConvGradWeight { stride, padding, dilation, groups } => {
            need(2)?;
            let c = conv_dims(&inputs[0].shape, &out.shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &inputs[1].shape, &c.out_shape())?;
            if let Some(k) = conv_grad_weight_tiled(&c, &inputs[0], &inputs[1], out, target, 1) {
                return Ok(k);
            }
            conv_grad_weight(&c, &inputs[0], &inputs[1], out)
        }
        Op::Pool { op, kernel, stride, padding } => {
            need(1)?;
            let p = PoolDims::new(&inputs[0].shape, kernel, stride, padding)
                .map_err(|e| e.to_string())?;
            expect_shape(&what, &out.shape, &p.out_shape())?;
            pool(*op, &p, &inputs[0], out)
        }
        Op::PoolGrad { op, kernel, stride, padding } => {
            need(2)?;
            let p = PoolDims::new(&inputs[0].shape, kernel, stride, padding)
                .map_err(|e| e.to_string())?;
            expect_shape(&what, &inputs[1].shape, &p.out_shape())?;
            expect_shape(&what, &out.shape, &inputs[0].shape)?;
            pool_grad(*op, &p, &inputs[0], &inputs[1], out)
        }
        Op::Upsample { scale } => {
            need(1)?;
            let u = UpDims::new(&inputs[0].shape, *scale)?;
            expect_shape(&what, &out.shape, &u.scaled)?;
            upsample(&u, &inputs[0], out)
        }
        Op::UpsampleGrad { scale } => {
            need(1)?;
            let u = UpDims::new(&out.shape, *scale)?;
            expect_shape(&what, &inputs[0].shape, &u.scaled)?;
            upsample_grad(&u, &inputs[0], out)
        }
        _ => return Err(format!("`{what}` has no GPU kernel yet")),
    };
    let n: usize = out.shape.iter().product();
    Ok(elementwise(n, width, &src, ""))
}

/// The forward convolution `op` (an `Op::Conv`): its result, bias added, stored — or, with
/// `post` (the WGSL of `fn mgn_epilogue(i: u32, p: f32)`, a `GpuOp::ConvEpilogue`'s program),
/// handed to `mgn_epilogue` with its output index.
pub fn forward(
    op: &Op,
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    post: Option<&str>,
) -> Result<KernelSource, String> {
    let Op::Conv { stride, padding, dilation, groups, has_bias } = op else {
        return Err(format!("`{}` is not a convolution", op.describe()));
    };
    let what = op.describe();
    super::need_inputs(op, inputs, 2 + *has_bias as usize)?;
    let c = conv_dims(&inputs[0].shape, &inputs[1].shape, stride, padding, dilation, *groups)?;
    expect_shape(&what, &out.shape, &c.out_shape())?;
    let bias = if *has_bias {
        if inputs[2].shape != [c.cout] {
            return Err(format!(
                "`{what}`: bias must have shape [{}], found {:?}",
                c.cout, inputs[2].shape
            ));
        }
        Some(&inputs[2])
    } else {
        None
    };
    let (x, w) = (&inputs[0], &inputs[1]);
    let k = conv_tiled(&c, x, w, bias, out, target, 1, post.is_some()).unwrap_or_else(|| {
        let n: usize = out.shape.iter().product();
        elementwise(n, target.width, &conv(&c, x, w, bias, out, post.is_some()), "")
    });
    Ok(KernelSource { body: format!("{}{}", post.unwrap_or(""), k.body), ..k })
}

/// The kernel of `GpuOp::ConvSplit`: `conv` over each of `splits` ranges of its reduction,
/// `[splits, ..out]`.
pub fn split(
    conv: &Op,
    splits: usize,
    inputs: &[Operand],
    out: &Operand,
    target: Target,
) -> Result<KernelSource, String> {
    let width = target.width;
    let what = conv.describe();
    super::need_inputs(conv, inputs, 2)?;
    let each = out.shape.get(1..).ok_or_else(|| format!("`{what}` split: a scalar output"))?;
    expect_shape(&what, &out.shape[..1], &[splits])?;
    let (x, y) = (&inputs[0], &inputs[1]);
    let k = match conv {
        Op::Conv { stride, padding, dilation, groups, has_bias: false } => {
            let c = conv_dims(&x.shape, &y.shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, each, &c.out_shape())?;
            conv_tiled(&c, x, y, None, out, target, splits, false)
        }
        Op::ConvGradInput { stride, padding, dilation, groups } => {
            let c = conv_dims(each, &y.shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &x.shape, &c.out_shape())?;
            conv_grad_input_tiled(&c, x, y, out, target, splits)
        }
        Op::ConvGradWeight { stride, padding, dilation, groups } => {
            let c = conv_dims(&x.shape, each, stride, padding, dilation, *groups)?;
            expect_shape(&what, &y.shape, &c.out_shape())?;
            conv_grad_weight_tiled(&c, x, y, out, target, splits)
        }
        _ => return Err(format!("`{what}` cannot run split")),
    };
    k.ok_or_else(|| format!("`{what}` split {splits} ways: no tile fits {width} invocations"))
}

fn expect_shape(what: &str, found: &[usize], want: &[usize]) -> Result<(), String> {
    if found == want {
        Ok(())
    } else {
        Err(format!("`{what}`: expected shape {want:?}, found {found:?}"))
    }
}

/// The convolution's sizes, checked by the shape rule every stage shares.
fn conv_dims(
    x_shape: &[usize],
    w_shape: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<ConvDims, String> {
    let geo = Geometry::new(stride, padding, dilation, groups).map_err(|e| e.to_string())?;
    ConvDims::new(x_shape, w_shape, &geo).map_err(|e| e.to_string())
}
