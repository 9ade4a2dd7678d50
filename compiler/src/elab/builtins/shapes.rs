//! Builtins that move or select elements: transpose, permute, reshape, concat, split, slice,
//! gather.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, NodeId, Op};
use mgn_ir::shape;
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

// ---- shapes -----------------------------------------------------------------------------

pub fn swap_axes(ev: &mut Evaluator, t: NodeId, i: usize, j: usize, span: Span) -> R<NodeId> {
    let (d, s) = ev.ty(t);
    let mut perm: Vec<usize> = (0..s.len()).collect();
    perm.swap(i, j);
    let out: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
    checked(ev, Op::Permute { perm }, vec![t], d, out, span)
}

pub(super) fn transpose(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let rank = ev.ty(t).1.len();
    if rank < 2 {
        return Err(Diagnostic::error(
            "E0206",
            format!("`transpose` needs at least 2 axes, found {}", ev.type_str(t)),
            a.span_of("x"),
            "cannot transpose",
        ));
    }
    let i = a.axis(ev, "a", -2, rank)?;
    let j = a.axis(ev, "b", -1, rank)?;
    swap_axes(ev, t, i, j, a.span).map(Value::Tensor)
}

pub(super) fn permute(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axes = a.ints(ev, "axes")?.expect("required");
    if axes.len() != s.len() {
        return Err(Diagnostic::error(
            "E0206",
            format!(
                "`permute` of {} needs {} axes, found {}",
                fmt_type(d, &s),
                s.len(),
                axes.len()
            ),
            a.span_of("axes"),
            format!("{} axes given", axes.len()),
        ));
    }
    let mut perm = Vec::new();
    for &x in &axes {
        let p = shape::axis(x, s.len()).ok_or_else(|| a.axis_error("axes", x, s.len()))?;
        if perm.contains(&p) {
            return Err(Diagnostic::error(
                "E0206",
                format!("`permute` names axis {p} twice"),
                a.span_of("axes"),
                "not a permutation",
            )
            .with_help("list every axis exactly once"));
        }
        perm.push(p);
    }
    let out = perm.iter().map(|&p| s[p]).collect();
    node(ev, Op::Permute { perm }, vec![t], d, out, a.span)
}

pub(super) fn reshape(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let dims = a.ints(ev, "shape")?.expect("required");
    let total = shape::checked_numel(&s).expect("checked when created");
    let mut out = Vec::new();
    let mut infer = None;
    for (i, &x) in dims.iter().enumerate() {
        match x {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            -1 => {
                return Err(Diagnostic::error(
                    "E0203",
                    "`reshape` can infer only one dimension",
                    a.span_of("shape"),
                    "two `-1`s",
                ))
            }
            x if x >= 1 => out.push(x as usize),
            x => {
                return Err(Diagnostic::error(
                    "E0301",
                    format!("`reshape` to a dimension of {x}"),
                    a.span_of("shape"),
                    "dimensions must be positive",
                ))
            }
        }
    }
    let Some(known) = shape::checked_numel(&out) else {
        return Err(Diagnostic::error(
            "E0301",
            format!("`reshape` to {:?} overflows", dims),
            a.span_of("shape"),
            "too many elements",
        ));
    };
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(Diagnostic::error(
                "E0203",
                format!("cannot reshape {} ({total} elements) to {:?}", fmt_type(d, &s), dims),
                a.span_of("shape"),
                format!("{total} is not divisible by {known}"),
            ));
        }
        out[i] = total / known;
    } else if known != total {
        let d = Diagnostic::error(
            "E0203",
            format!(
                "cannot reshape {} ({total} elements) to {} ({known} elements)",
                fmt_type(d, &s),
                fmt_type(d, &out)
            ),
            a.span_of("shape"),
            format!("{known} elements"),
        )
        .with_label(a.span_of("x"), format!("{total} elements"));
        return Err(d);
    }
    node(ev, Op::Reshape, vec![t], d, out, a.span)
}

pub(super) fn unsqueeze(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let mut s = s.to_vec();
    let ax = a.axis(ev, "axis", 0, s.len() + 1)?;
    s.insert(ax, 1);
    node(ev, Op::Reshape, vec![t], d, s, a.span)
}

pub(super) fn squeeze(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let mut s = s.to_vec();
    let ax = a.axis(ev, "axis", 0, s.len())?;
    if s[ax] != 1 {
        return Err(Diagnostic::error(
            "E0203",
            format!("`squeeze` of axis {ax} of {}: its size is {}, not 1", fmt_type(d, &s), s[ax]),
            a.span_of("axis"),
            "not a size-1 axis",
        ));
    }
    s.remove(ax);
    node(ev, Op::Reshape, vec![t], d, s, a.span)
}

pub(super) fn flatten(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let start = a.axis(ev, "start", 1, s.len())?;
    let end = a.axis(ev, "end", -1, s.len())?;
    if start > end {
        return Err(Diagnostic::error(
            "E0207",
            format!("`flatten` start axis {start} is after end axis {end}"),
            a.span,
            "empty range",
        ));
    }
    let mut out = s[..start].to_vec();
    out.push(s[start..=end].iter().product());
    out.extend_from_slice(&s[end + 1..]);
    node(ev, Op::Reshape, vec![t], d, out, a.span)
}

pub(super) fn concat(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let items = match a.get("tensors") {
        Some((Value::List(l) | Value::Tuple(l), _)) => l.clone(),
        _ => return Err(a.wrong(ev, "tensors", "a list of tensors")),
    };
    let span = a.span_of("tensors");
    let mut ids = Vec::new();
    for v in items.iter() {
        match v {
            Value::Tensor(t) => ids.push(*t),
            other => {
                return Err(Diagnostic::error(
                    "E0201",
                    format!("`concat` needs tensors, found {}", ev.describe(other)),
                    span,
                    "in this list",
                ))
            }
        }
    }
    let Some(&first) = ids.first() else {
        return Err(Diagnostic::error(
            "E0201",
            "`concat` needs at least one tensor",
            span,
            "empty list",
        ));
    };
    let (d0, s0) = ev.ty(first);
    let s0 = s0.to_vec();
    let axis = a.axis(ev, "axis", 0, s0.len())?;
    let mut out = s0.clone();
    out[axis] = 0;
    for (i, &t) in ids.iter().enumerate() {
        let (d, s) = ev.ty(t);
        let ok = d == d0
            && s.len() == s0.len()
            && s.iter().zip(&s0).enumerate().all(|(k, (x, y))| k == axis || x == y);
        if !ok {
            return Err(Diagnostic::error(
                "E0203",
                format!(
                    "`concat` along axis {axis} needs equal dtypes and equal sizes on every other \
                     axis, but tensor 0 is {} and tensor {i} is {}",
                    fmt_type(d0, &s0),
                    fmt_type(d, s)
                ),
                span,
                "in this list",
            ));
        }
        out[axis] += s[axis];
    }
    node(ev, Op::Concat { axis }, ids, d0, out, a.span)
}

pub(super) fn split(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", -1, s.len())?;
    let len = s[axis];
    let sizes: Vec<usize> = match a.get("parts") {
        Some((Value::Int(n), ps)) => {
            let n = *n;
            if n < 1 || len % n as usize != 0 {
                return Err(Diagnostic::error(
                    "E0203",
                    format!("cannot split axis {axis} of size {len} into {n} equal parts"),
                    *ps,
                    format!("{len} is not divisible by {n}"),
                )
                .with_help("pass a list of sizes to split unevenly: `split(x, [a, b], axis)`"));
            }
            vec![len / n as usize; n as usize]
        }
        Some((Value::List(_) | Value::Tuple(_), ps)) => {
            let ps = *ps;
            let sizes = a.ints(ev, "parts")?.expect("present");
            if sizes.iter().any(|&x| x < 1) || sizes.iter().sum::<i64>() != len as i64 {
                return Err(Diagnostic::error(
                    "E0203",
                    format!(
                        "split sizes {:?} do not add up to the size of axis {axis} ({len})",
                        sizes
                    ),
                    ps,
                    "sizes must be positive and sum to the axis",
                ));
            }
            sizes.into_iter().map(|x| x as usize).collect()
        }
        _ => return Err(a.wrong(ev, "parts", "a count or a list of sizes")),
    };
    let mut parts = Vec::new();
    let mut start = 0;
    for n in sizes {
        let mut out = s.clone();
        out[axis] = n;
        parts.push(node(ev, Op::Slice { axis, start, end: start + n }, vec![t], d, out, a.span)?);
        start += n;
    }
    Ok(tuple_of(parts))
}

pub(super) fn slice(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", 0, s.len())?;
    let len = s[axis] as i64;
    let norm = |x: i64| if x < 0 { x + len } else { x };
    let start = norm(a.int_or(ev, "start", 0)?);
    let end = norm(a.int_or(ev, "end", len)?);
    if !(0 <= start && start < end && end <= len) {
        return Err(Diagnostic::error(
            "E0207",
            format!("slice {start}..{end} is out of range for axis {axis} of size {len}"),
            a.span,
            "empty or out of range",
        )
        .with_note(format!("the slice must satisfy 0 <= start < end <= {len}")));
    }
    let mut out = s.clone();
    out[axis] = (end - start) as usize;
    node(ev, Op::Slice { axis, start: start as usize, end: end as usize }, vec![t], d, out, a.span)
}

pub(super) fn gather_impl(
    ev: &mut Evaluator,
    a: &Args,
    x: &str,
    index: &str,
    axis: usize,
) -> R<Value> {
    let (t, _) = a.tensor(ev, x)?;
    let (i, _) = int_tensor(ev, a, index)?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let mut out = s[..axis].to_vec();
    out.extend_from_slice(ev.ty(i).1);
    out.extend_from_slice(&s[axis + 1..]);
    node(ev, Op::Gather { axis }, vec![t, i], d, out, a.span)
}

pub(super) fn gather(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let rank = ev.ty(t).1.len();
    let axis = a.axis(ev, "axis", 0, rank)?;
    gather_impl(ev, a, "x", "index", axis)
}

pub(super) fn embedding(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (w, ws) = a.tensor(ev, "weight")?;
    if ev.ty(w).1.len() != 2 {
        return Err(Diagnostic::error(
            "E0206",
            format!("`embedding` needs a 2-D weight [num, dim], found {}", ev.type_str(w)),
            ws,
            "not 2-D",
        ));
    }
    gather_impl(ev, a, "weight", "ids", 0)
}

pub(super) fn arange(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let n = a.int_or(ev, "n", 0)?;
    if n < 1 {
        return Err(Diagnostic::error(
            "E0301",
            format!("`arange` needs a positive length, found {n}"),
            a.span_of("n"),
            "not positive",
        ));
    }
    node(ev, Op::Arange, vec![], DType::I32, vec![n as usize], a.span)
}
