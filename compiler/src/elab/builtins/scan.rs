//! Scans and selections along an axis: `cumsum`, `topk`, `take_along_axis`.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, NodeId, Op};
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// A number tensor argument (scans and rankings need an order and a sum, which masks lack).
fn number_tensor(ev: &Evaluator, a: &Args, name: &str) -> R<(NodeId, Span)> {
    let (t, s) = a.tensor(ev, name)?;
    if ev.ty(t).0 == DType::Bool {
        return Err(Diagnostic::error(
            "E0202",
            format!("`{}` needs a number tensor for `{name}`, found {}", a.name(), ev.type_str(t)),
            s,
            format!("this is {}", ev.type_str(t)),
        )
        .with_help("convert the mask first, e.g. `cast(m, i32)`"));
    }
    Ok((t, s))
}

/// `cumsum(x, axis, reverse = false)`: running sums along `axis` (from its end when reversed).
pub(super) fn cumsum(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = number_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", 0, s.len())?;
    let reverse = a.bool_or(ev, "reverse", false)?;
    node(ev, Op::Cumsum { axis, reverse }, vec![t], d, s, a.span)
}

/// `topk(x, k, axis = -1)`: `(values, indices)` of the `k` largest elements along `axis`,
/// largest first (ties to the lower position, NaN largest); the gradient reaches `x` through
/// the values.
pub(super) fn topk(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = number_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", -1, s.len())?;
    let k = a.int_or(ev, "k", 0)?;
    if k < 1 || k as usize > s[axis] {
        return Err(Diagnostic::error(
            "E0203",
            format!(
                "`topk` of {k} elements along axis {axis} of {}, which has {}",
                fmt_type(d, &s),
                s[axis]
            ),
            a.span_of("k"),
            format!("k must be 1 … {}", s[axis]),
        ));
    }
    let mut out = s.clone();
    out[axis] = k as usize;
    let op = Op::TopK { k: k as usize, axis };
    let indices = checked(ev, op, vec![t], DType::I32, out.clone(), a.span)?;
    let values = checked(ev, Op::TakeAlong { axis }, vec![t, indices], d, out, a.span)?;
    Ok(tuple_of(vec![Value::Tensor(values), Value::Tensor(indices)]))
}

/// `take_along_axis(x, index, axis)`: `x` read along `axis` at the integer `index`, which has
/// `x`'s rank and, but on `axis`, its sizes (`torch.gather`, `numpy.take_along_axis`).
pub(super) fn take_along_axis(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, ts) = a.tensor(ev, "x")?;
    let (i, is) = int_tensor(ev, a, "index")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", 0, s.len())?;
    let si = ev.ty(i).1.to_vec();
    let fits =
        si.len() == s.len() && si.iter().zip(&s).enumerate().all(|(k, (p, q))| k == axis || p == q);
    if !fits {
        return Err(Diagnostic::error(
            "E0203",
            format!(
                "`take_along_axis` cannot read {} at an index {} along axis {axis}",
                fmt_type(d, &s),
                ev.type_str(i)
            ),
            is,
            format!("this is {}", ev.type_str(i)),
        )
        .with_label(ts, format!("this is {}", fmt_type(d, &s)))
        .with_note(format!(
            "the index needs {} axes, of the sizes of `x` on every axis but {axis}",
            s.len()
        )));
    }
    node(ev, Op::TakeAlong { axis }, vec![t, i], d, si, a.span)
}
