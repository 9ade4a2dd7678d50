//! Kernels of fused element-wise programs (`rewrite::fuse`): a chain of element-wise ops in
//! one kernel, the sum of a split product's partials, and the epilogues that products,
//! convolutions and norms apply to each result as they store it.

use super::{
    binary, broadcast_at, conv, elementwise, f32_lit, helpers, load, matmul, store, unary,
    unary_grad,
};
use super::{KernelSource, Operand, Target};
use crate::program::{Elem, GpuOp};
use mgn_ir::op::Op;

/// Element `i` of `inputs[k]` broadcast to `out`'s shape, as a fused program's leaf reads it;
/// an error naming `what` when there is no such input.
fn element_of(inputs: &[Operand], k: usize, out: &Operand, what: &str) -> Result<String, String> {
    inputs
        .get(k)
        .map(|o| load(o, &broadcast_at("i", &out.dims(), &o.dims())))
        .ok_or_else(|| format!("{what} {k} of {}", inputs.len()))
}

/// A fused element-wise chain (`rewrite::fuse`): one `let` per node, inputs broadcast to the
/// output's shape, the last node stored.
pub(super) fn fused(
    program: &[Elem],
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let leaf = |k: u32| element_of(inputs, k as usize, out, "fused input");
    let (lines, last, helpers) = program_lines(program, leaf)?;
    let body = format!("{lines}{}", store(out, "i", &last));
    Ok(elementwise(out.numel(), width, &body, &helpers))
}

/// The sum of a split product's `splits` partial products, each element through `program`
/// (`Input(0)` is the sum; `Input(k)` the step's input `k`, broadcast to the output).
pub(super) fn split_sum(
    splits: usize,
    program: &[Elem],
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let n = out.numel();
    let partials = &inputs[0];
    if partials.shape.iter().product::<usize>() != n.n * splits {
        return Err(format!(
            "{splits} partial products of {:?} in {:?}",
            out.shape, partials.shape
        ));
    }
    let terms: Vec<String> =
        (0..splits).map(|s| load(partials, &format!("{} + i", n.times(s)))).collect();
    let leaf = |k: u32| match k {
        0 => Ok("p".into()),
        k => element_of(inputs, k as usize, out, "split sum input"),
    };
    let (lines, last, helpers) = program_lines(program, leaf)?;
    let body = format!("let p = {};\n    {lines}{}", terms.join(" + "), store(out, "i", &last));
    Ok(elementwise(n, width, &body, &helpers))
}

/// A matrix product whose kernel applies `program` to each result as it stores it
/// (`mgn_epilogue`): `Input(0)` is the product, `Input(k)` the step's input `k + 1`.
pub(super) fn epilogue(
    program: &[Elem],
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    layout: matmul::Layout,
) -> Result<KernelSource, String> {
    // Input(k) is the step's input k + 1: past a and b, the product is Input(0).
    let epilogue = returning_epilogue(program, &inputs[1..], out)?;
    matmul::generate_with(&inputs[..2], out, target, Some(&epilogue), layout, None)
}

/// Two products of the same few rows combined by `program` (`GpuOp::ProductPair`): `Input(0)`
/// and `Input(1)` the products, `Input(k)` the step's input `k + 1`; of `norm(a)` where given.
pub(super) fn product_pair(
    program: &[Elem],
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    norm: Option<matmul::RowNorm>,
) -> Result<KernelSource, String> {
    if inputs.len() < 3 {
        return Err("a pair of products without its operands".into());
    }
    let extra = &inputs[1..];
    let leaf = |k: u32| match k {
        0 => Ok("p".into()),
        1 => Ok("q".into()),
        k => element_of(extra, k as usize, out, "epilogue input"),
    };
    let (lines, last, helpers) = program_lines(program, leaf)?;
    let head = "fn mgn_epilogue(i: u32, p: f32, q: f32) -> f32";
    let epilogue = format!("{helpers}{head} {{\n    {lines}return {last};\n}}\n");
    matmul::generate_pair(&inputs[..3], out, target, &epilogue, norm)
}

/// A product of normed rows (`GpuOp::NormedProduct`): `op`'s kernel over `norm(x)` (rounded
/// to `rounded` where a mixed policy's cast was folded with it), which the tiled kernel
/// computes as it stages A and the few-columns one as it reads it (`matmul::RowNorm`); the
/// norm's weight and bias are the last inputs.
pub(super) fn normed_product(
    norm: &Op,
    op: &GpuOp,
    rounded: Option<mgn_ir::DType>,
    inputs: &[Operand],
    out: &Operand,
    target: Target,
) -> Result<KernelSource, String> {
    let operands = crate::program::norm_operands(norm)?;
    let (inner, params) = inputs.split_at(inputs.len() + 1 - operands);
    let row_norm = matmul::RowNorm { rounded, ..matmul::RowNorm::of(norm, params)? };
    let plain = matmul::Layout::PLAIN;
    let (epilogue, layout) = match op {
        GpuOp::Plan(Op::MatMul) => (None, plain),
        GpuOp::MatMulT { ta: false, tb, alpha, splits } => {
            (None, matmul::Layout { tb: *tb, alpha: *alpha, splits: *splits, ..plain })
        }
        GpuOp::MatMulEpilogue { program, ta: false, tb } => {
            let e = returning_epilogue(program, &inner[1..], out)?;
            (Some(e), matmul::Layout { tb: *tb, ..plain })
        }
        GpuOp::ProductPair { program } => {
            return product_pair(program, inner, out, target, Some(row_norm));
        }
        op => return Err(format!("`{}` does not read normed rows", op.describe())),
    };
    matmul::generate_normed(&inner[..2], out, target, epilogue.as_deref(), layout, row_norm)
}

/// A convolution whose kernel applies `program` to each result as it stores it, as `epilogue`
/// does for a product: `Input(0)` is the convolution, `Input(k)` the step's input past its
/// convolution's operands.
pub(super) fn conv_epilogue(
    conv: &Op,
    program: &[Elem],
    inputs: &[Operand],
    out: &Operand,
    target: Target,
) -> Result<KernelSource, String> {
    let operands = crate::program::conv_operands(conv)?;
    let extra = inputs.get(operands - 1..).ok_or("a convolution epilogue without its operands")?;
    let (lines, last, helpers) = epilogue_lines(program, extra, out)?;
    let post = format!(
        "{helpers}fn mgn_epilogue(i: u32, p: f32) {{\n    {lines}{}\n}}\n",
        store(out, "i", &last)
    );
    conv::forward(conv, &inputs[..operands], out, target, Some(&post))
}

/// A norm (layer, RMS, group, or a training plan's batch norm) whose kernel applies `program`
/// to each result as it stores it, as `conv_epilogue` does for a convolution: `Input(0)` is the
/// norm, `Input(k)` the step's input past its norm's operands.
pub(super) fn norm_epilogue(
    norm: &Op,
    program: &[Elem],
    inputs: &[Operand],
    out: &Operand,
    width: u32,
    training: bool,
) -> Result<KernelSource, String> {
    let operands = crate::program::norm_operands(norm)?;
    let extra = inputs.get(operands - 1..).ok_or("a norm epilogue without its operands")?;
    let post = returning_epilogue(program, extra, out)?;
    super::norm::forward_with_epilogue(norm, &inputs[..operands], out, width, &post, training)
}

/// A training batch norm over chunks of its channels (`GpuOp::BatchNormWithMoments`), each
/// result through `program` as `norm_epilogue`'s: its norm's operands end with the moments.
pub(super) fn batch_norm_with_moments(
    norm: &Op,
    chunk: usize,
    program: &[Elem],
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let Op::BatchNorm { eps, has_weight, has_bias, .. } = norm else {
        return Err(format!("`{}` is no batch norm", norm.describe()));
    };
    let operands = crate::program::norm_operands(norm)? + 1;
    let extra = inputs.get(operands - 1..).ok_or("a batch norm without its moments")?;
    let post = returning_epilogue(program, extra, out)?;
    let affine = (*eps, *has_weight, *has_bias);
    let w = width as usize;
    super::norm::batch_norm_with_moments(&inputs[..operands], affine, chunk, out, w, &post)
}

/// An epilogue's program as WGSL `let`s (`program_lines`): `Input(0)` is the head's result
/// `p`, `Input(k)` element `i` of `extra[k]` broadcast to `out` (`extra[0]`, the head's last
/// operand, is never read).
fn epilogue_lines(
    program: &[Elem],
    extra: &[Operand],
    out: &Operand,
) -> Result<(String, String, String), String> {
    let leaf = |k: u32| match k {
        0 => Ok("p".into()),
        k => element_of(extra, k as usize, out, "epilogue input"),
    };
    program_lines(program, leaf)
}

/// `fn mgn_epilogue(i: u32, p: f32) -> f32`, the program's value at element `i` of a head
/// whose result there is `p` (`epilogue_lines`): a product's or a norm's kernel stores it.
fn returning_epilogue(
    program: &[Elem],
    extra: &[Operand],
    out: &Operand,
) -> Result<String, String> {
    let (lines, last, helpers) = epilogue_lines(program, extra, out)?;
    Ok(format!(
        "{helpers}fn mgn_epilogue(i: u32, p: f32) -> f32 {{\n    {lines}return {last};\n}}\n"
    ))
}

/// WGSL `let`s computing a fused program (`leaf(k)` is the expression of input `k`), the name
/// of its result, and the helper functions it calls.
fn program_lines(
    program: &[Elem],
    leaf: impl Fn(u32) -> Result<String, String>,
) -> Result<(String, String, String), String> {
    let v = |a: &u32| format!("v{a}");
    let mut body = String::new();
    for (j, e) in program.iter().enumerate() {
        let expr = match e {
            Elem::Input(k) => leaf(*k)?,
            Elem::Unary(u, a) => unary(*u, &v(a)),
            Elem::UnaryGrad(u, a, b) => unary_grad(*u, &v(a), &v(b)),
            Elem::Binary(op, a, b) => binary(*op, &v(a), &v(b), true),
            Elem::Pow(e, a) => super::pow_expr(&v(a), *e),
            Elem::Compare(c, a, b) => format!("({} {} {})", v(a), c.symbol(), v(b)),
            // A condition read from memory is a word; one computed here is a WGSL `bool`.
            Elem::Where(c, a, b) => match program.get(*c as usize) {
                Some(Elem::Compare(..)) => format!("select({}, {}, {})", v(b), v(a), v(c)),
                _ => format!("select({}, {}, {} != 0)", v(b), v(a), v(c)),
            },
            Elem::Const(value) => f32_lit(*value),
            // Every kernel that runs a program names the element it computes `i`.
            Elem::Index => "f32(i)".into(),
        };
        body += &format!("let v{j} = {expr};\n    ");
    }
    let last = program.len().checked_sub(1).ok_or("an empty fused program")?;
    let used = program.iter().filter_map(|e| match e {
        Elem::Unary(u, _) | Elem::UnaryGrad(u, _, _) => Some(*u),
        _ => None,
    });
    Ok((body, format!("v{last}"), helpers(used)))
}
