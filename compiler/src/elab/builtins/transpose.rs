//! Transposed convolutions: `conv_transpose1d` and `conv_transpose2d`.
//!
//! A transposed convolution is the input derivative of the convolution whose weight it shares,
//! so it is the IR's `ConvGradInput` over `[x, weight]` with the convolution's stride, padding,
//! dilation and groups, exactly: the convolution of the result's shape gives back `x`'s, and
//! PyTorch's weight layout `[Cin, Cout / groups, k…]` is that convolution's `[Cout', Cin' /
//! groups, k…]`. No kernel of its own: both backends run the derivative's, and autodiff
//! differentiates it with the convolution and its weight derivative.

use super::args::*;
use super::conv::per_axis;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, BinaryOp, Op};
use mgn_syntax::Diagnostic;

pub(super) fn conv_transpose(ev: &mut Evaluator, a: &Args, spatial: usize) -> R<Value> {
    let (x, d, sx, xs) = super::conv::spatial_input(ev, a, &[spatial])?;
    let (w, sw, ws) = super::conv::conv_weight(ev, a, d, spatial, ["Cin", "Cout / groups"])?;
    let groups = a.int_or(ev, "groups", 1)?;
    let cin = sx[1];
    if groups < 1 || cin % groups as usize != 0 {
        let msg = format!("`groups = {groups}` must divide the input channels ({cin})");
        return Err(Diagnostic::error("E0203", msg, a.span_of("groups"), "does not divide"));
    }
    let groups = groups as usize;
    if sw[0] != cin {
        return Err(Diagnostic::error(
            "E0203",
            format!("`{}` input has {cin} channels but the weight expects {}", a.name(), sw[0]),
            xs,
            format!("this is {}", fmt_type(d, &sx)),
        )
        .with_label(ws, format!("weight {} is [Cin, Cout / groups, …]", ev.type_str(w))));
    }
    let cout = sw[1] * groups;
    let stride = per_axis(ev, a, "stride", 1, spatial, 1)?;
    let padding = per_axis(ev, a, "padding", 0, spatial, 0)?;
    let extra = per_axis(ev, a, "output_padding", 0, spatial, 0)?;
    let dilation = per_axis(ev, a, "dilation", 1, spatial, 1)?;
    let mut out = vec![sx[0], cout];
    out.extend(out_sizes(a, (&sx, &sw, d), &stride, &padding, &extra, &dilation)?);
    let bias = vector_of(
        ev,
        a,
        "bias",
        cout,
        d,
        &format!("a transposed convolution has one bias per output channel ({cout})"),
    )?;
    let op = Op::ConvGradInput { stride, padding, dilation, groups };
    let y = checked(ev, op, vec![x, w], d, out.clone(), a.span)?;
    let Some(b) = bias else { return Ok(Value::Tensor(y)) };
    let mut column = vec![cout];
    column.extend(std::iter::repeat_n(1, spatial));
    let b = checked(ev, Op::Reshape, vec![b], d, column, a.span)?;
    node(ev, Op::Binary(BinaryOp::Add), vec![y, b], d, out, a.span)
}

/// PyTorch's output size per spatial axis: `(in − 1)·stride − 2·padding + dilation·(k − 1) +
/// output_padding + 1`, after checking `output_padding < stride` and a size of at least 1.
fn out_sizes(
    a: &Args,
    (sx, sw, d): (&[usize], &[usize], mgn_ir::DType),
    stride: &[usize],
    padding: &[usize],
    extra: &[usize],
    dilation: &[usize],
) -> R<Vec<usize>> {
    let xs = a.span_of("x");
    let mut out = Vec::new();
    for i in 0..stride.len() {
        if extra[i] >= stride[i] {
            return Err(Diagnostic::error(
                "E0203",
                format!(
                    "`output_padding` {} must be smaller than the stride {} on spatial axis {}",
                    extra[i],
                    stride[i],
                    i + 2
                ),
                a.span_of("output_padding"),
                "not below the stride",
            )
            .with_note(
                "output_padding picks one of the `stride` output sizes that a convolution with \
                 this stride maps back to the input's size",
            ));
        }
        let span = sw[2 + i].saturating_sub(1).saturating_mul(dilation[i]);
        let full = (sx[2 + i] - 1)
            .saturating_mul(stride[i])
            .saturating_add(span)
            .saturating_add(extra[i])
            .saturating_add(1);
        let cropped = padding[i].checked_mul(2).and_then(|p| full.checked_sub(p));
        match cropped.filter(|&o| o >= 1) {
            Some(o) if o > 1 << 40 => {
                return Err(Diagnostic::error(
                    "E0301",
                    format!("`{}` makes spatial axis {} larger than 2^40", a.name(), i + 2),
                    a.span,
                    "too large",
                ))
            }
            Some(o) => out.push(o),
            None => {
                let msg = format!(
                    "`{}` with padding {} leaves spatial axis {} of size {} empty",
                    a.name(),
                    padding[i],
                    i + 2,
                    sx[2 + i]
                );
                return Err(Diagnostic::error(
                    "E0203",
                    msg,
                    a.span_of("padding"),
                    "too much padding",
                )
                .with_label(xs, format!("this is {}", fmt_type(d, sx))));
            }
        }
    }
    Ok(out)
}
