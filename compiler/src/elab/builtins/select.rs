//! Comparisons, masks and selection: the `== != < <= > >=`, `&&`, `||` and `!` operators on
//! tensors, and the `where`, `maximum`, `minimum` and `clamp` builtins.
//!
//! Comparisons give `bool` tensors; `&&` and `||` are the minimum and maximum of two masks and
//! `!m` is `m == false`, so masks need no ops of their own. `clamp` is two selections, so its
//! gradient is PyTorch's: `x` gets `dy` where `min ≤ x ≤ max`, a bound where it was chosen.

use super::args::*;
use super::pointwise::{broadcast_sides, elementwise, operands};
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, BinaryOp, NodeId, Op};
use mgn_ir::op::CompareOp;
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// `a op b` on tensors (a number on one side becomes a scalar): a `bool` tensor.
pub fn compare(
    ev: &mut Evaluator,
    op: CompareOp,
    l: (&Value, Span),
    r: (&Value, Span),
    span: Span,
) -> R<NodeId> {
    let (a, b) = operands(ev, op.symbol(), l, r)?;
    let out = broadcast_sides(ev, op.symbol(), (a, l), (b, r))?;
    checked(ev, Op::Compare(op), vec![a, b], DType::Bool, out, span)
}

/// `a && b` (`and`) or `a || b` on bool tensors: the minimum or maximum of the two masks.
pub fn logic(
    ev: &mut Evaluator,
    and: bool,
    l: (&Value, Span),
    r: (&Value, Span),
    span: Span,
) -> R<NodeId> {
    let sym = if and { "&&" } else { "||" };
    for (v, s) in [l, r] {
        if let Value::Tensor(t) = v {
            needs_bool(ev, *t, s, &format!("`{sym}` needs bool tensors"))?;
        }
    }
    let (a, b) = operands(ev, sym, l, r)?;
    let out = broadcast_sides(ev, sym, (a, l), (b, r))?;
    let op = if and { BinaryOp::Minimum } else { BinaryOp::Maximum };
    checked(ev, Op::Binary(op), vec![a, b], DType::Bool, out, span)
}

/// `!m` on a bool tensor: `m == false`.
pub fn not(ev: &mut Evaluator, t: NodeId, operand: Span, span: Span) -> R<NodeId> {
    needs_bool(ev, t, operand, "`!` needs a bool tensor")?;
    let f = checked(ev, Op::Constant { value: 0.0 }, vec![], DType::Bool, vec![], span)?;
    let s = ev.ty(t).1.to_vec();
    checked(ev, Op::Compare(CompareOp::Eq), vec![t, f], DType::Bool, s, span)
}

fn needs_bool(ev: &Evaluator, t: NodeId, s: Span, what: &str) -> R<()> {
    if ev.ty(t).0 == DType::Bool {
        return Ok(());
    }
    Err(Diagnostic::error(
        "E0202",
        format!("{what}, found {}", ev.type_str(t)),
        s,
        format!("this is {}", ev.type_str(t)),
    )
    .with_help("make a mask with a comparison, e.g. `x > 0.0`"))
}

/// `where(cond, a, b)`: `a` where the bool tensor `cond` holds, else `b`. Either branch may be
/// a number (both numbers give an `f32` tensor when one is a float, else `i32`).
pub(super) fn where_(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (c, cs) = a.tensor(ev, "cond")?;
    if ev.ty(c).0 != DType::Bool {
        return Err(Diagnostic::error(
            "E0202",
            format!("`where` needs a bool tensor for `cond`, found {}", ev.type_str(c)),
            cs,
            format!("this is {}", ev.type_str(c)),
        )
        .with_help("make the condition with a comparison, e.g. `x > 0.0`"));
    }
    let (x, y) = (a.raw("a"), a.raw("b"));
    let (t, f) = branches(ev, a, (&x.0, x.1), (&y.0, y.1))?;
    let ab = broadcast_sides(ev, "where", (t, (&x.0, x.1)), (f, (&y.0, y.1)))?;
    let (dc, sc) = ev.ty(c);
    let (d, sc) = (ev.ty(t).0, sc.to_vec());
    let Ok(out) = mgn_ir::shape::broadcast(&sc, &ab) else {
        return Err(Diagnostic::error(
            "E0203",
            format!(
                "cannot broadcast the condition {} with the branches' {} in `where`",
                fmt_type(dc, &sc),
                fmt_type(d, &ab)
            ),
            cs,
            format!("this is {}", fmt_type(dc, &sc)),
        )
        .with_note(
            "the condition and both branches broadcast together; sizes must be equal or 1",
        ));
    };
    node(ev, Op::Where, vec![c, t, f], d, out, a.span)
}

/// The branches of `where` as nodes of one dtype.
fn branches(
    ev: &mut Evaluator,
    a: &Args,
    l: (&Value, Span),
    r: (&Value, Span),
) -> R<(NodeId, NodeId)> {
    if matches!(l.0, Value::Tensor(_)) || matches!(r.0, Value::Tensor(_)) {
        return operands(ev, "where", l, r);
    }
    let dtype = match (l.0, r.0) {
        (Value::Bool(_), Value::Bool(_)) => DType::Bool,
        (Value::Int(_), Value::Int(_)) => DType::I32,
        (Value::Int(_) | Value::Float(_), Value::Int(_) | Value::Float(_)) => DType::F32,
        _ => {
            let bad = if matches!(l.0, Value::Int(_) | Value::Float(_) | Value::Bool(_)) {
                "b"
            } else {
                "a"
            };
            return Err(a.wrong(ev, bad, "a tensor or a number"));
        }
    };
    let value = |v: &Value| match v {
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        Value::Bool(b) => *b as u8 as f64,
        _ => unreachable!("numbers and bools only"),
    };
    let t = checked(ev, Op::Constant { value: value(l.0) }, vec![], dtype, vec![], l.1)?;
    let f = checked(ev, Op::Constant { value: value(r.0) }, vec![], dtype, vec![], r.1)?;
    Ok((t, f))
}

/// `maximum(a, b)` / `minimum(a, b)`: element-wise on tensors (broadcasting), at compile time on
/// two numbers.
pub(super) fn extremum(ev: &mut Evaluator, a: &Args, op: BinaryOp) -> R<Value> {
    let (x, y) = (a.raw("a"), a.raw("b"));
    let max = op == BinaryOp::Maximum;
    match (&x.0, &y.0) {
        (Value::Int(p), Value::Int(q)) => Ok(Value::Int(if max { *p.max(q) } else { *p.min(q) })),
        (Value::Int(_) | Value::Float(_), Value::Int(_) | Value::Float(_)) => {
            let (p, q) = (a.number(ev, "a")?, a.number(ev, "b")?);
            let v = if p.is_nan() || q.is_nan() {
                f64::NAN
            } else if max {
                p.max(q)
            } else {
                p.min(q)
            };
            crate::elab::eval::finite(a.span, Value::Float(v))
        }
        (Value::Tensor(_), _) | (_, Value::Tensor(_)) => {
            elementwise(ev, op, (&x.0, x.1), (&y.0, y.1), a.span).map(Value::Tensor)
        }
        _ => {
            let bad = if matches!(x.0, Value::Int(_) | Value::Float(_)) { "b" } else { "a" };
            Err(a.wrong(ev, bad, "a tensor or a number"))
        }
    }
}

/// `clamp(x, min?, max?)`: `x` limited to `[min, max]` (PyTorch's `clamp`: with `min > max`
/// every element is `max`). Bounds are numbers or tensors that broadcast with `x`.
pub(super) fn clamp(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (lo, hi) = (a.get("min").cloned(), a.get("max").cloned());
    if lo.is_none() && hi.is_none() {
        return Err(Diagnostic::error(
            "E0401",
            "`clamp` needs a bound: `min`, `max` or both",
            a.span,
            "no bound given",
        )
        .with_note(a.signature()));
    }
    let x = a.raw("x");
    if let Value::Int(_) | Value::Float(_) = x.0 {
        let numbers = [&lo, &hi]
            .iter()
            .all(|b| b.as_ref().is_none_or(|(v, _)| matches!(v, Value::Int(_) | Value::Float(_))));
        if numbers {
            return clamp_numbers(ev, a);
        }
    }
    // A number against tensor bounds broadcasts like them; a bool, string or anything else
    // has nothing to clamp.
    match x.0 {
        Value::Tensor(t) if ev.ty(t).0 != DType::Bool => {}
        Value::Tensor(_) => return Err(a.wrong(ev, "x", "a number tensor (not bool)")),
        Value::Int(_) | Value::Float(_) => {}
        _ => return Err(a.wrong(ev, "x", "a number tensor or a number")),
    }
    let mut v = x.0.clone();
    for (bound, op) in [(lo, CompareOp::Lt), (hi, CompareOp::Gt)] {
        let Some((b, bs)) = bound else { continue };
        let (t, c) = operands(ev, "clamp", (&v, x.1), (&b, bs))?;
        let out = broadcast_sides(ev, "clamp", (t, (&v, x.1)), (c, (&b, bs)))?;
        let beyond = checked(ev, Op::Compare(op), vec![t, c], DType::Bool, out.clone(), a.span)?;
        let d = ev.ty(t).0;
        v = Value::Tensor(checked(ev, Op::Where, vec![beyond, c, t], d, out, a.span)?);
    }
    Ok(v)
}

fn clamp_numbers(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let int = |n: &str| match a.get(n) {
        Some((Value::Int(i), _)) => Some(Some(*i)),
        None => Some(None),
        _ => None,
    };
    if let (Some(Some(x)), Some(lo), Some(hi)) = (int("x"), int("min"), int("max")) {
        let x = lo.map_or(x, |lo| x.max(lo));
        return Ok(Value::Int(hi.map_or(x, |hi| x.min(hi))));
    }
    let mut v = a.number(ev, "x")?;
    if a.get("min").is_some() {
        v = v.max(a.number(ev, "min")?);
    }
    if a.get("max").is_some() {
        v = v.min(a.number(ev, "max")?);
    }
    crate::elab::eval::finite(a.span, Value::Float(v))
}
