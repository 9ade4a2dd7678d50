//! Pointwise builtins, number conversions, and the `+ - * /` and `@` operators on tensors.

use super::args::*;
use crate::elab::eval::packed::not_packed;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, BinaryOp, NodeId, Op, UnaryOp};
use mgn_ir::shape;
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

// ---- pointwise --------------------------------------------------------------------------

/// A point-wise function: folded at compile time on a number (with `mgn_ir::pointwise`, the
/// same definition the CPU backend runs), a node on a tensor.
pub(super) fn unary(ev: &mut Evaluator, a: &Args, op: UnaryOp) -> R<Value> {
    match a.get("x") {
        Some((Value::Int(i), s)) if matches!(op, UnaryOp::Abs) => {
            i.checked_abs().map(Value::Int).ok_or_else(|| {
                Diagnostic::error("E0301", "integer overflow", *s, "|x| does not fit in 64 bits")
            })
        }
        Some((Value::Int(_) | Value::Float(_), _)) => {
            let x = a.number(ev, "x")?;
            crate::elab::eval::finite(a.span, Value::Float(mgn_ir::pointwise::unary(op, x)))
        }
        _ => {
            let (t, _) = float_tensor(ev, a, "x")?;
            let (d, s) = ev.ty(t);
            let s = s.to_vec();
            node(ev, Op::Unary(op), vec![t], d, s, a.span)
        }
    }
}

/// `softplus(x, beta = 1, threshold = 20)`, PyTorch's: `log(1 + exp(beta·x)) / beta`, and `x`
/// itself where `beta·x > threshold` (a switch that keeps PyTorch's values and gradients
/// exactly).
pub(super) fn softplus(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let beta = a.number_or(ev, "beta", 1.0)?;
    let threshold = a.number_or(ev, "threshold", 20.0)?;
    if !(beta > 0.0 && beta.is_finite()) {
        return Err(Diagnostic::error(
            "E0301",
            format!("`softplus` needs a positive, finite `beta`, found {beta}"),
            a.span_of("beta"),
            "not positive",
        ));
    }
    if let Some((Value::Int(_) | Value::Float(_), _)) = a.get("x") {
        let x = a.number(ev, "x")?;
        let y = if x * beta > threshold {
            x
        } else {
            mgn_ir::pointwise::unary(UnaryOp::Softplus, x * beta) / beta
        };
        return crate::elab::eval::finite(a.span, Value::Float(y));
    }
    let (x, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    let span = a.span;
    let scale = |ev: &mut Evaluator, t: NodeId, op: BinaryOp| -> R<NodeId> {
        if beta == 1.0 {
            return Ok(t);
        }
        let b = checked(ev, Op::Constant { value: beta }, vec![], d, vec![], span)?;
        checked(ev, Op::Binary(op), vec![t, b], d, s.clone(), span)
    };
    let bx = scale(ev, x, BinaryOp::Mul)?;
    let y = checked(ev, Op::Unary(UnaryOp::Softplus), vec![bx], d, s.clone(), span)?;
    let y = scale(ev, y, BinaryOp::Div)?;
    let t = checked(ev, Op::Constant { value: threshold }, vec![], d, vec![], span)?;
    let linear = checked(
        ev,
        Op::Compare(mgn_ir::op::CompareOp::Gt),
        vec![bx, t],
        DType::Bool,
        s.clone(),
        span,
    )?;
    node(ev, Op::Where, vec![linear, x, y], d, s, span)
}

pub(super) fn pow(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let p = a.number(ev, "p")?;
    match a.get("x") {
        Some((Value::Int(_) | Value::Float(_), _)) => {
            crate::elab::eval::finite(a.span, Value::Float(a.number(ev, "x")?.powf(p)))
        }
        _ => {
            let (t, _) = float_tensor(ev, a, "x")?;
            let (d, s) = ev.ty(t);
            let s = s.to_vec();
            node(ev, Op::Pow { exponent: p }, vec![t], d, s, a.span)
        }
    }
}

pub(super) fn cast(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let dtype = match a.get("dtype") {
        Some((Value::DType(d), at)) if d.is_packed() => {
            return Err(not_packed(*d, *at, "the result of `cast`"))
        }
        Some((Value::DType(d), _)) => *d,
        _ => return Err(a.wrong(ev, "dtype", "a dtype such as f32")),
    };
    let s = ev.ty(t).1.to_vec();
    node(ev, Op::Cast, vec![t], dtype, s, a.span)
}

pub(super) fn stop_gradient(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    node(ev, Op::StopGradient, vec![t], d, s, a.span)
}

pub(super) fn int_of(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let x = a.number(ev, "x")?;
    if !x.is_finite() || x.abs() > 9.0e18 {
        return Err(Diagnostic::error(
            "E0301",
            format!("{x} does not fit in an integer"),
            a.span_of("x"),
            "out of range",
        ));
    }
    Ok(Value::Int(x.trunc() as i64))
}

pub(super) fn int_div(ev: &mut Evaluator, a: &Args, ceil: bool) -> R<Value> {
    let (Some((Value::Int(x), _)), Some((Value::Int(y), ys))) = (a.get("a"), a.get("b")) else {
        let bad = if matches!(a.get("a"), Some((Value::Int(_), _))) { "b" } else { "a" };
        return Err(a.wrong(ev, bad, "an integer"));
    };
    if *y <= 0 {
        return Err(Diagnostic::error(
            "E0301",
            format!("`{}` needs a positive divisor, found {y}", a.name()),
            *ys,
            "not positive",
        ));
    }
    let q = x.div_euclid(*y);
    Ok(Value::Int(if ceil && x.rem_euclid(*y) != 0 { q + 1 } else { q }))
}

/// `a op b` with broadcasting; a number on one side becomes a scalar of the tensor's dtype.
pub fn elementwise(
    ev: &mut Evaluator,
    op: BinaryOp,
    l: (&Value, Span),
    r: (&Value, Span),
    span: Span,
) -> R<NodeId> {
    let sym = match op {
        BinaryOp::Add => "+",
        BinaryOp::Sub => "-",
        BinaryOp::Mul => "*",
        BinaryOp::Div => "/",
        BinaryOp::Maximum => "maximum",
        BinaryOp::Minimum => "minimum",
    };
    let (a, b) = operands(ev, sym, l, r)?;
    let (dtype, _) = ev.ty(a);
    if dtype == DType::Bool && !matches!(op, BinaryOp::Maximum | BinaryOp::Minimum) {
        let side = if matches!(l.0, Value::Tensor(_)) { l } else { r };
        return Err(Diagnostic::error(
            "E0202",
            format!("`{sym}` is not defined on bool tensors"),
            side.1,
            format!("this is {}", ev.type_str(a)),
        )
        .with_help("convert the mask with `cast(m, f32)`; combine masks with `&&`, `||` and `!`"));
    }
    let out = broadcast_sides(ev, sym, (a, l), (b, r))?;
    checked(ev, Op::Binary(op), vec![a, b], dtype, out, span)
}

/// The two sides of an element-wise operator (`+`, `<`, `maximum`, …) as nodes of one dtype:
/// a number on one side becomes a scalar of the tensor's dtype (an integer with any numeric
/// tensor, a float with a float tensor, `true`/`false` with a bool tensor). Errors are in the
/// operator's words (`sym`).
pub(super) fn operands(
    ev: &mut Evaluator,
    sym: &str,
    l: (&Value, Span),
    r: (&Value, Span),
) -> R<(NodeId, NodeId)> {
    let ld = if let Value::Tensor(t) = l.0 { Some(ev.ty(*t).0) } else { None };
    let rd = if let Value::Tensor(t) = r.0 { Some(ev.ty(*t).0) } else { None };
    let dtype = ld.or(rd).expect("one side is a tensor");
    let tensor_ty = match (l.0, r.0) {
        (Value::Tensor(t), _) | (_, Value::Tensor(t)) => ev.type_str(*t),
        _ => unreachable!("one side is a tensor"),
    };
    let operand = |ev: &mut Evaluator, v: &Value, s: Span| -> R<NodeId> {
        let scalar = |ev: &mut Evaluator, value: f64| {
            checked(ev, Op::Constant { value }, vec![], dtype, vec![], s)
        };
        match v {
            Value::Tensor(t) => Ok(*t),
            Value::Int(i) if dtype != DType::Bool => scalar(ev, *i as f64),
            Value::Float(f) if dtype.is_float() => scalar(ev, *f),
            Value::Bool(b) if dtype == DType::Bool => scalar(ev, *b as u8 as f64),
            Value::Float(_) if dtype.is_int() => Err(Diagnostic::error(
                "E0202",
                format!("cannot combine a float with an integer tensor ({dtype}) in `{sym}`"),
                s,
                "a float",
            )
            .with_help("convert the tensor with `cast(x, f32)` first")),
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => Err(Diagnostic::error(
                "E0202",
                format!("cannot combine {} with {tensor_ty} in `{sym}`", v.kind()),
                s,
                v.kind().to_string(),
            )
            .with_help(if dtype == DType::Bool {
                "a bool tensor combines with `true`, `false` or another bool tensor"
            } else {
                "a number tensor combines with numbers; a bool tensor with `true` or `false`"
            })),
            other => Err(Diagnostic::error(
                "E0201",
                format!("`{sym}` cannot combine a tensor with {}", ev.describe(other)),
                s,
                "not a tensor or number",
            )),
        }
    };
    let a = operand(ev, l.0, l.1)?;
    let b = operand(ev, r.0, r.1)?;
    let (da, sa) = ev.ty(a);
    let (db, sb) = ev.ty(b);
    if da != db {
        let d = Diagnostic::error(
            "E0202",
            format!(
                "`{sym}` needs operands of one dtype, found {} and {}",
                fmt_type(da, sa),
                fmt_type(db, sb)
            ),
            r.1,
            format!("this is {}", fmt_type(db, sb)),
        )
        .with_label(l.1, format!("this is {}", fmt_type(da, sa)))
        .with_help(format!(
            "convert one side, e.g. `cast(x, {})`",
            if da.is_float() { da } else { db }
        ));
        return Err(d);
    }
    Ok((a, b))
}

/// The broadcast shape of two operands of `sym`, or E0203 naming both sides and where they
/// came from.
pub(super) fn broadcast_sides(
    ev: &mut Evaluator,
    sym: &str,
    (a, l): (NodeId, (&Value, Span)),
    (b, r): (NodeId, (&Value, Span)),
) -> R<Vec<usize>> {
    let (da, sa) = ev.ty(a);
    let (db, sb) = ev.ty(b);
    let (sa, sb) = (sa.to_vec(), sb.to_vec());
    let axis = match shape::broadcast(&sa, &sb) {
        Ok(out) => return Ok(out),
        Err(axis) => axis,
    };
    let rank = sa.len().max(sb.len());
    let pick = |s: &[usize]| if axis + s.len() >= rank { s[axis + s.len() - rank] } else { 1 };
    let msg =
        format!("cannot broadcast {} with {} in `{sym}`", fmt_type(da, &sa), fmt_type(db, &sb));
    let d = Diagnostic::error("E0203", msg, r.1, format!("this is {}", fmt_type(db, &sb)))
        .with_label(l.1, format!("this is {}", fmt_type(da, &sa)))
        .with_note(format!(
            "sizes {} and {} differ at axis {} of the result; broadcast sizes must be equal or 1",
            pick(&sa),
            pick(&sb),
            axis
        ));
    let d = ev.origin_label(d, l.0, l.1, "the left side was");
    Err(ev.origin_label(d, r.0, r.1, "the right side was"))
}

pub fn matmul(ev: &mut Evaluator, l: (&Value, Span), r: (&Value, Span), span: Span) -> R<NodeId> {
    let side = |ev: &Evaluator, v: &Value, s: Span| -> R<NodeId> {
        match v {
            Value::Tensor(t) => Ok(*t),
            other => Err(Diagnostic::error(
                "E0201",
                format!("`@` needs tensors on both sides, found {}", ev.describe(other)),
                s,
                "not a tensor",
            )
            .with_help("to scale a tensor by a number use `*`")),
        }
    };
    let a = side(ev, l.0, l.1)?;
    let b = side(ev, r.0, r.1)?;
    let (da, sa) = ev.ty(a);
    let (db, sb) = ev.ty(b);
    let (sa, sb) = (sa.to_vec(), sb.to_vec());
    if da != db || !da.is_float() {
        let (bad, good) = if da.is_float() { (r, l) } else { (l, r) };
        let (bad_t, good_t) = if da.is_float() {
            (fmt_type(db, &sb), fmt_type(da, &sa))
        } else {
            (fmt_type(da, &sa), fmt_type(db, &sb))
        };
        let _ = span;
        return Err(Diagnostic::error(
            "E0202",
            format!(
                "`@` needs two float tensors of one dtype, found {} and {}",
                fmt_type(da, &sa),
                fmt_type(db, &sb)
            ),
            bad.1,
            format!("this is {bad_t}"),
        )
        .with_label(good.1, format!("this is {good_t}"))
        .with_help("convert with `cast(x, f32)`"));
    }
    match shape::matmul(&sa, &sb) {
        Ok(out) => checked(ev, Op::MatMul, vec![a, b], da, out, span),
        Err(e) => {
            let (msg, note) = match e {
                shape::MatmulError::Scalar => {
                    ("`@` needs tensors with at least one axis".to_string(), None)
                }
                shape::MatmulError::Inner { k_left, k_right } => (
                    format!("cannot multiply {} by {}", fmt_type(da, &sa), fmt_type(db, &sb)),
                    Some(format!(
                        "the last axis of the left side ({k_left}) must equal the second-to-last \
                         axis of the right side ({k_right})"
                    )),
                ),
                shape::MatmulError::Batch { axis } => (
                    format!(
                        "the batch axes of {} and {} do not broadcast",
                        fmt_type(da, &sa),
                        fmt_type(db, &sb)
                    ),
                    Some(format!("batch axis {axis} differs; batch sizes must be equal or 1")),
                ),
            };
            let mut d =
                Diagnostic::error("E0204", msg, r.1, format!("this is {}", fmt_type(db, &sb)))
                    .with_label(l.1, format!("this is {}", fmt_type(da, &sa)));
            if let Some(n) = note {
                d = d.with_note(n);
            }
            if matches!(e, shape::MatmulError::Inner { .. })
                && sa.last() == sb.last()
                && sb.len() >= 2
            {
                d = d.with_help("the right side may need transposing: `a @ b^T`");
            }
            let d = ev.origin_label(d, l.0, l.1, "the left side was");
            Err(ev.origin_label(d, r.0, r.1, "the right side was"))
        }
    }
}
