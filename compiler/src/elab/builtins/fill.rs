//! Tensors made from values and shapes: `full`, `zeros_like`, `ones_like`, `broadcast_to` /
//! `expand`, `one_hot`. A filled tensor is a scalar constant broadcast to its shape (the
//! `BroadcastTo` op autodiff already makes), so it costs no memory until a kernel reads it.

use super::args::*;
use crate::elab::eval::packed::not_packed;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, CompareOp, NodeId, Op};
use mgn_ir::shape;
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// `value` as a scalar of `dtype`, broadcast to `dims`.
fn filled(ev: &mut Evaluator, value: f64, dtype: DType, dims: Vec<usize>, span: Span) -> R<NodeId> {
    let c = checked(ev, Op::Constant { value }, vec![], dtype, vec![], span)?;
    if dims.is_empty() {
        return Ok(c);
    }
    checked(ev, Op::BroadcastTo, vec![c], dtype, dims, span)
}

/// The `dtype` argument, or `default`.
fn dtype_or(ev: &Evaluator, a: &Args, default: DType) -> R<DType> {
    match a.get("dtype") {
        None => Ok(default),
        Some((Value::DType(d), at)) if d.is_packed() => Err(not_packed(*d, *at, "a filled tensor")),
        Some((Value::DType(d), _)) => Ok(*d),
        Some(_) => Err(a.wrong(ev, "dtype", "a dtype such as f32")),
    }
}

/// A number or bool argument as an element of `dtype`: a float only for float dtypes, a bool
/// only for `bool`, an integer within the 32 bits integer tensors hold.
fn element(ev: &Evaluator, a: &Args, name: &str, dtype: DType) -> R<f64> {
    let (v, s) = a.get(name).expect("required");
    let fits = match v {
        Value::Bool(_) => dtype == DType::Bool,
        Value::Int(i) => dtype.is_float() || (dtype.is_int() && i32::try_from(*i).is_ok()),
        Value::Float(_) => dtype.is_float(),
        _ => return Err(a.wrong(ev, name, "a number")),
    };
    if !fits {
        return Err(Diagnostic::error(
            "E0202",
            format!("`{}` cannot fill a tensor of {dtype} with {}", a.name(), ev.describe(v)),
            *s,
            format!("not a value of {dtype}"),
        )
        .with_help(match dtype {
            DType::Bool => "a bool tensor holds `true` or `false`",
            d if d.is_int() => "an integer tensor holds whole numbers that fit in 32 bits",
            _ => "give `dtype = f32` for a float value",
        }));
    }
    Ok(match v {
        Value::Bool(b) => *b as u8 as f64,
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        _ => unreachable!("checked above"),
    })
}

/// A shape argument: a list or tuple of dims ≥ 1 (`-1` too where `keep` allows it).
fn dims_of(ev: &Evaluator, a: &Args, name: &str, keep: bool) -> R<Vec<i64>> {
    let dims = a.ints(ev, name)?.expect("required");
    if let Some(bad) = dims.iter().find(|&&d| d < 1 && !(keep && d == -1)) {
        return Err(Diagnostic::error(
            "E0301",
            format!("`{}` to a dimension of {bad}", a.name()),
            a.span_of(name),
            if keep { "dimensions are positive, or -1 to keep one" } else { "not positive" },
        ));
    }
    Ok(dims)
}

/// `full(shape, value, dtype = f32)`.
pub(super) fn full(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let dtype = dtype_or(ev, a, DType::F32)?;
    let value = element(ev, a, "value", dtype)?;
    let dims = dims_of(ev, a, "shape", false)?.into_iter().map(|d| d as usize).collect();
    filled(ev, value, dtype, dims, a.span).map(Value::Tensor)
}

/// `zeros_like(x, dtype?)` / `ones_like(x, dtype?)`: `x`'s shape, its dtype unless given.
pub(super) fn like(ev: &mut Evaluator, a: &Args, value: f64) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let dtype = dtype_or(ev, a, d)?;
    filled(ev, value, dtype, s, a.span).map(Value::Tensor)
}

/// `broadcast_to(x, shape)` (NumPy's) and `expand(x, shape)` (PyTorch's, where `-1` keeps the
/// size of the aligned axis of `x`).
pub(super) fn broadcast_to(ev: &mut Evaluator, a: &Args, keep: bool) -> R<Value> {
    let (t, ts) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let dims = dims_of(ev, a, "shape", keep)?;
    let pad = dims.len().checked_sub(s.len());
    let out: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &n)| match (n, pad) {
            (-1, Some(p)) if i >= p => s[i - p],
            _ => n.max(1) as usize,
        })
        .collect();
    let leading_keep = pad.is_some_and(|p| dims[..p].contains(&-1));
    let fits = shape::broadcast(&s, &out).ok().as_deref() == Some(&out[..]);
    if !fits || leading_keep {
        let why = if leading_keep {
            "`-1` keeps an axis of `x`; a new leading axis needs a size".to_string()
        } else if pad.is_none() {
            format!("the target has fewer axes than {}", fmt_type(d, &s))
        } else {
            "each axis of `x` must equal the target's or be 1 (axes align from the end)".into()
        };
        let d = Diagnostic::error(
            "E0203",
            format!("`{}` cannot broadcast {} to {dims:?}", a.name(), fmt_type(d, &s)),
            a.span_of("shape"),
            "target shape",
        )
        .with_label(ts, format!("this is {}", fmt_type(d, &s)))
        .with_note(why);
        return Err(d);
    }
    if out == s {
        return Ok(Value::Tensor(t));
    }
    node(ev, Op::BroadcastTo, vec![t], d, out, a.span)
}

/// `one_hot(labels, classes, dtype = f32)`: `labels == arange(classes)` along a new last axis;
/// a label outside `0 … classes-1` gives a row of zeros.
pub(super) fn one_hot(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = int_tensor(ev, a, "labels")?;
    let classes = a.int_or(ev, "classes", 0)?;
    if classes < 1 {
        return Err(Diagnostic::error(
            "E0301",
            format!("`one_hot` needs a positive number of classes, found {classes}"),
            a.span_of("classes"),
            "not positive",
        ));
    }
    let dtype = dtype_or(ev, a, DType::F32)?;
    let (d, s) = ev.ty(t);
    let mut column = s.to_vec();
    column.push(1);
    let mut out = s.to_vec();
    out.push(classes as usize);
    let span = a.span;
    let labels = checked(ev, Op::Reshape, vec![t], d, column, span)?;
    let range = checked(ev, Op::Arange, vec![], DType::I32, vec![classes as usize], span)?;
    let range = if d == DType::I32 {
        range
    } else {
        checked(ev, Op::Cast, vec![range], d, vec![classes as usize], span)?
    };
    let hot = checked(
        ev,
        Op::Compare(CompareOp::Eq),
        vec![labels, range],
        DType::Bool,
        out.clone(),
        span,
    )?;
    if dtype == DType::Bool {
        return Ok(Value::Tensor(hot));
    }
    node(ev, Op::Cast, vec![hot], dtype, out, span)
}
