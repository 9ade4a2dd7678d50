//! Constant folding: a node whose inputs are all known at import time is computed here, so
//! shape arithmetic (`Shape` → `Gather` → `Concat` → `Reshape`), masks built from constants
//! and the like never reach the generated source. Integer elements carry their `.mgn`
//! expression along (a size that follows a dynamic axis stays one).
//!
//! Floats computed from a large initializer are not folded: the initializer stays a parameter
//! and the op stays in the source, so training still reaches the parameter.

use super::graph::{Attr, Node};
use super::ops::{norm_axis, shape as shape_ops, Lower, R};
use super::value::{Const, Dt, Elems, Sym, Val};

#[derive(Clone, Debug)]
enum S {
    F(f32),
    I(Sym),
    B(bool),
}

fn items(c: &Const) -> Vec<S> {
    match &c.elems {
        Elems::F(v) => v.iter().map(|&x| S::F(x)).collect(),
        Elems::I(v) => v.iter().cloned().map(S::I).collect(),
        Elems::B(v) => v.iter().map(|&x| S::B(x)).collect(),
    }
}

fn build(dt: Dt, shape: Vec<usize>, v: Vec<S>) -> R<Const> {
    let elems = if dt.is_float() {
        Elems::F(
            v.into_iter()
                .map(|s| match s {
                    S::F(x) => Ok(x),
                    S::I(i) => Ok(i.v as f32),
                    S::B(b) => Ok(f32::from(u8::from(b))),
                })
                .collect::<R<_>>()?,
        )
    } else if dt == Dt::Bool {
        Elems::B(
            v.into_iter()
                .map(|s| match s {
                    S::B(b) => b,
                    S::I(i) => i.v != 0,
                    S::F(x) => x != 0.0,
                })
                .collect(),
        )
    } else {
        Elems::I(
            v.into_iter()
                .map(|s| match s {
                    S::I(i) => i,
                    S::F(x) => Sym::lit(x.trunc() as i64),
                    S::B(b) => Sym::lit(i64::from(b)),
                })
                .collect(),
        )
    };
    Ok(Const { dt, shape, elems })
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = i % shape[a].max(1);
        i /= shape[a].max(1);
    }
    idx
}

/// Reads `c` broadcast to `out` at the multi-index `idx`.
fn at<'a>(c: &'a [S], shape: &[usize], out: &[usize], idx: &[usize]) -> &'a S {
    let off = out.len() - shape.len();
    let st = strides(shape);
    let i: usize =
        (0..shape.len()).map(|a| if shape[a] == 1 { 0 } else { idx[a + off] } * st[a]).sum();
    &c[i]
}

fn bshape(a: &[usize], b: &[usize]) -> R<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|k| {
            let x = (k + a.len()).checked_sub(n).map_or(1, |i| a[i]);
            let y = (k + b.len()).checked_sub(n).map_or(1, |i| b[i]);
            if x == y || y == 1 {
                Ok(x)
            } else if x == 1 {
                Ok(y)
            } else {
                Err(format!("constant shapes {a:?} and {b:?} do not broadcast"))
            }
        })
        .collect()
}

#[rustfmt::skip]
const FOLDABLE: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "Not", "And", "Or", "Where", "Neg", "Abs", "Sqrt", "Cast", "Concat",
    "Gather", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Slice", "Transpose", "Expand",
    "Range", "ConstantOfShape", "Max", "Min", "Identity", "Reciprocal", "Pow", "ReduceProd",
    "Trilu", "CastLike", "Mod", "GatherElements", "ScatterND",
];

/// Ops only folding knows: they must have constant inputs.
pub fn handles(op: &str) -> bool {
    FOLDABLE.contains(&op)
}
/// Folds `n` when every input is a constant; `None` leaves it to lowering.
pub fn fold(cx: &Lower, n: &Node) -> R<Option<Vec<Val>>> {
    if !FOLDABLE.contains(&n.op.as_str()) {
        return Ok(None);
    }
    let mut ins = Vec::new();
    for name in &n.inputs {
        if name.is_empty() {
            ins.push(None);
            continue;
        }
        match cx.vals.get(name) {
            Some(Val::Const(c)) => {
                // A large float initializer named by a module stays a parameter (see the
                // module comment); an exporter's own constant (`val_7`) folds.
                if c.dt.is_float()
                    && c.numel() > 64
                    && cx.g.inits.contains_key(name)
                    && super::layers::clean_path(name).is_some()
                {
                    return Ok(None);
                }
                ins.push(Some(c.clone()));
            }
            _ => return Ok(None),
        }
    }
    Ok(compute(cx, n, &ins)?.map(|c| vec![Val::Const(c)]))
}

/// The value of `n` over the constants `ins`; `None` when it cannot be known here.
fn compute(cx: &Lower, n: &Node, ins: &[Option<Const>]) -> R<Option<Const>> {
    let get =
        |i: usize| ins.get(i).cloned().flatten().ok_or_else(|| format!("input {i} is missing"));
    let out = match n.op.as_str() {
        "Identity" => get(0)?,
        "Cast" | "CastLike" => {
            let x = get(0)?;
            let dt = if n.op == "CastLike" {
                get(1)?.dt
            } else {
                Dt::from_onnx(n.int("to", 0) as i32).ok_or("it casts to a type mgn has none of")?
            };
            build(dt, x.shape.clone(), items(&x))?
        }
        "Neg" | "Abs" | "Sqrt" | "Not" | "Reciprocal" => unary(&n.op, &get(0)?)?,
        "Where" => {
            let (c, a, b) = (get(0)?, get(1)?, get(2)?);
            let shape = bshape(&bshape(&c.shape, &a.shape)?, &b.shape)?;
            let (ci, ai, bi) = (items(&c), items(&a), items(&b));
            let v: Vec<S> = (0..shape.iter().product())
                .map(|i| {
                    let idx = unravel(i, &shape);
                    let pick = matches!(at(&ci, &c.shape, &shape, &idx), S::B(true));
                    if pick {
                        at(&ai, &a.shape, &shape, &idx).clone()
                    } else {
                        at(&bi, &b.shape, &shape, &idx).clone()
                    }
                })
                .collect();
            build(a.dt, shape, v)?
        }
        "Concat" => concat(n, &ins.iter().flatten().cloned().collect::<Vec<_>>())?,
        "Gather" => gather(n, &get(0)?, &get(1)?)?,
        "GatherElements" => gather_elements(n, &get(0)?, &get(1)?)?,
        "ScatterND" => scatter_nd(n, &get(0)?, &get(1)?, &get(2)?)?,
        "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten" | "Expand" => {
            match reshape_like(cx, n, &get(0)?, ins.get(1).cloned().flatten())? {
                Some(c) => c,
                None => return Ok(None),
            }
        }
        "Slice" => match slice(cx, n, &get(0)?, ins)? {
            Some(c) => c,
            None => return Ok(None),
        },
        "Transpose" => transpose(n, &get(0)?)?,
        "Range" => match range(&get(0)?, &get(1)?, &get(2)?)? {
            Some(c) => c,
            None => return Ok(None),
        },
        "ConstantOfShape" => {
            let Some(s) = get(0)?.static_ints() else { return Ok(None) };
            let value = match n.attrs.get("value") {
                Some(Attr::Tensor(c)) => c.clone(),
                _ => Const { dt: Dt::F32, shape: vec![1], elems: Elems::F(vec![0.0]) },
            };
            let shape: Vec<usize> = s.iter().map(|&d| d.max(0) as usize).collect();
            let count: usize = shape.iter().product();
            if count > 1 << 20 {
                return Ok(None);
            }
            build(value.dt, shape, vec![items(&value)[0].clone(); count])?
        }
        "ReduceProd" => {
            let x = get(0)?;
            if x.shape.len() != 1 || n.int("keepdims", 1) != 0 {
                return Ok(None);
            }
            let Some(v) = x.ints() else { return Ok(None) };
            let p = v.iter().try_fold(Sym::lit(1), |a, b| a.op(b, '*')).ok_or("overflow")?;
            build(x.dt, vec![], vec![S::I(p)])?
        }
        "Trilu" => match trilu(n, &get(0)?, ins.get(1).cloned().flatten())? {
            Some(c) => c,
            None => return Ok(None),
        },
        _ => {
            let count = ins.iter().flatten().count();
            let mut acc = get(0)?;
            for i in 1..count {
                acc = binary(&n.op, &acc, &get(i)?)?;
            }
            acc
        }
    };
    Ok(Some(out))
}

fn unary(op: &str, x: &Const) -> R<Const> {
    let v = items(x).into_iter().map(|s| match (op, s) {
        ("Neg", S::F(f)) => Ok(S::F(-f)),
        ("Neg", S::I(i)) => Ok(S::I(Sym::lit(0).op(&i, '-').ok_or("overflow")?)),
        ("Abs", S::F(f)) => Ok(S::F(f.abs())),
        ("Abs", S::I(i)) if i.is_static() => Ok(S::I(Sym::lit(i.v.abs()))),
        ("Sqrt", S::F(f)) => Ok(S::F(f.sqrt())),
        ("Reciprocal", S::F(f)) => Ok(S::F(1.0 / f)),
        ("Not", S::B(b)) => Ok(S::B(!b)),
        (op, _) => Err(format!("{op} of a constant of this type")),
    });
    build(x.dt, x.shape.clone(), v.collect::<R<_>>()?)
}

fn binary(op: &str, a: &Const, b: &Const) -> R<Const> {
    let shape = bshape(&a.shape, &b.shape)?;
    let (ai, bi) = (items(a), items(b));
    let cmp = matches!(op, "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual");
    let mut out = Vec::with_capacity(shape.iter().product());
    for i in 0..shape.iter().product() {
        let idx = unravel(i, &shape);
        let (x, y) = (at(&ai, &a.shape, &shape, &idx), at(&bi, &b.shape, &shape, &idx));
        out.push(scalar(op, x, y)?);
    }
    build(if cmp { Dt::Bool } else { a.dt }, shape, out)
}

fn scalar(op: &str, x: &S, y: &S) -> R<S> {
    Ok(match (x, y) {
        (S::F(p), S::F(q)) => match op {
            "Add" => S::F(p + q),
            "Sub" => S::F(p - q),
            "Mul" => S::F(p * q),
            "Div" => S::F(p / q),
            "Pow" => S::F(p.powf(*q)),
            "Max" => S::F(p.max(*q)),
            "Min" => S::F(p.min(*q)),
            "Equal" => S::B(p == q),
            "Less" => S::B(p < q),
            "Greater" => S::B(p > q),
            "LessOrEqual" => S::B(p <= q),
            "GreaterOrEqual" => S::B(p >= q),
            _ => return Err(format!("{op} of float constants")),
        },
        (S::I(p), S::I(q)) => match op {
            "Add" => S::I(p.op(q, '+').ok_or("overflow")?),
            "Sub" => S::I(p.op(q, '-').ok_or("overflow")?),
            "Mul" => S::I(p.op(q, '*').ok_or("overflow")?),
            // ONNX divides integers toward zero; sizes are positive, where that is floor.
            "Div" if p.v >= 0 && q.v > 0 => S::I(p.op(q, '/').ok_or("division by zero")?),
            "Div" if q.v != 0 => S::I(Sym::lit(p.v / q.v)),
            "Mod" if q.v != 0 && p.is_static() && q.is_static() => {
                // fmod = 0 (integers): the remainder has the divisor's sign, as Python's.
                S::I(Sym::lit(
                    p.v - q.v * p.v.div_euclid(q.v)
                        - if q.v < 0 && p.v.rem_euclid(q.v) != 0 { q.v.abs() } else { 0 },
                ))
            }
            "Mod" if q.v > 0 && p.v >= 0 => S::I(p.op(q, '%').ok_or("division by zero")?),
            "Max" => S::I(if p.v >= q.v { p.clone() } else { q.clone() }),
            "Min" => S::I(if p.v <= q.v { p.clone() } else { q.clone() }),
            "Equal" => S::B(p.v == q.v),
            "Less" => S::B(p.v < q.v),
            "Greater" => S::B(p.v > q.v),
            "LessOrEqual" => S::B(p.v <= q.v),
            "GreaterOrEqual" => S::B(p.v >= q.v),
            _ => return Err(format!("{op} of integer constants")),
        },
        (S::B(p), S::B(q)) => match op {
            "And" => S::B(*p && *q),
            "Or" => S::B(*p || *q),
            "Equal" => S::B(p == q),
            _ => return Err(format!("{op} of bool constants")),
        },
        _ => return Err(format!("{op} of constants of two types")),
    })
}

fn concat(n: &Node, parts: &[Const]) -> R<Const> {
    let first = parts.first().ok_or("no inputs")?;
    let axis = norm_axis(n.int("axis", 0), first.shape.len().max(1))?;
    let mut shape = first.shape.clone();
    if shape.is_empty() {
        return Err("concatenating scalars".into());
    }
    shape[axis] = parts.iter().map(|p| p.shape.get(axis).copied().unwrap_or(0)).sum();
    let outer: usize = shape[..axis].iter().product();
    let mut v = Vec::new();
    let pieces: Vec<Vec<S>> = parts.iter().map(items).collect();
    for o in 0..outer {
        for (p, it) in parts.iter().zip(&pieces) {
            let inner: usize = p.shape[axis..].iter().product();
            v.extend_from_slice(&it[o * inner..(o + 1) * inner]);
        }
    }
    build(first.dt, shape, v)
}

fn gather(n: &Node, x: &Const, idx: &Const) -> R<Const> {
    let axis = norm_axis(n.int("axis", 0), x.shape.len())?;
    let ids = idx.static_ints().ok_or("gather with indices that follow a dynamic size")?;
    let xi = items(x);
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let size = x.shape[axis] as i64;
    let mut v = Vec::new();
    for o in 0..outer {
        for &i in &ids {
            let i = if i < 0 { i + size } else { i };
            if !(0..size).contains(&i) {
                return Err(format!("index {i} is outside an axis of {size}"));
            }
            let base = (o * x.shape[axis] + i as usize) * inner;
            v.extend_from_slice(&xi[base..base + inner]);
        }
    }
    let mut shape = x.shape[..axis].to_vec();
    shape.extend(&idx.shape);
    shape.extend(&x.shape[axis + 1..]);
    build(x.dt, shape, v)
}

fn gather_elements(n: &Node, x: &Const, idx: &Const) -> R<Const> {
    let axis = norm_axis(n.int("axis", 0), x.shape.len())?;
    let ids = idx.static_ints().ok_or("gather with indices that follow a dynamic size")?;
    let (xi, st) = (items(x), strides(&x.shape));
    let size = x.shape[axis] as i64;
    let mut v = Vec::with_capacity(ids.len());
    for (i, &k) in ids.iter().enumerate() {
        let mut at = unravel(i, &idx.shape);
        let k = if k < 0 { k + size } else { k };
        if !(0..size).contains(&k) {
            return Err(format!("index {k} is outside an axis of {size}"));
        }
        at[axis] = k as usize;
        v.push(xi[at.iter().zip(&st).map(|(a, s)| a * s).sum::<usize>()].clone());
    }
    build(x.dt, idx.shape.clone(), v)
}

/// Writes `updates` into `x` at the index tuples of `idx` (the last axis of `idx` indexes the
/// leading axes of `x`; the rest are copied whole).
fn scatter_nd(n: &Node, x: &Const, idx: &Const, updates: &Const) -> R<Const> {
    if n.string("reduction").is_some_and(|r| r != "none") {
        return Err("a scatter that reduces".into());
    }
    let ids = idx.static_ints().ok_or("scatter indices that follow a dynamic size")?;
    let k = *idx.shape.last().ok_or("scalar indices")?;
    if k == 0 || k > x.shape.len() {
        return Err(format!("index tuples of {k} into a rank-{} tensor", x.shape.len()));
    }
    let st = strides(&x.shape);
    let slab: usize = x.shape[k..].iter().product();
    let (mut v, up) = (items(x), items(updates));
    for (j, tuple) in ids.chunks(k).enumerate() {
        let mut at = 0;
        for (a, &i) in tuple.iter().enumerate() {
            let d = x.shape[a] as i64;
            let i = if i < 0 { i + d } else { i };
            if !(0..d).contains(&i) {
                return Err(format!("index {i} is outside an axis of {d}"));
            }
            at += i as usize * st[a];
        }
        let src = up.get(j * slab..(j + 1) * slab).ok_or("fewer updates than indices")?;
        v[at..at + slab].clone_from_slice(src);
    }
    build(x.dt, x.shape.clone(), v)
}

fn reshape_like(cx: &Lower, n: &Node, x: &Const, arg: Option<Const>) -> R<Option<Const>> {
    let input = x.shape_syms();
    let lits = |v: Vec<Sym>| -> Option<Vec<usize>> {
        v.iter().map(|s| (s.is_static() && s.v >= 0).then_some(s.v as usize)).collect()
    };
    let rank = x.shape.len();
    let axes = |a: Option<Vec<i64>>| a.or_else(|| arg.as_ref().and_then(|c| c.static_ints()));
    let shape: Vec<usize> = match n.op.as_str() {
        "Reshape" => {
            let t = arg.as_ref().and_then(|c| c.ints()).ok_or("no shape")?;
            if t.iter().any(|s| !s.is_static()) {
                return Ok(None);
            }
            let Some(s) = lits(shape_ops::reshape_dims(&input, t, n.int("allowzero", 0) != 0)?)
            else {
                return Ok(None);
            };
            s
        }
        "Flatten" => {
            let a = shape_ops::flatten_axis(n.int("axis", 1), rank)?;
            vec![x.shape[..a].iter().product(), x.shape[a..].iter().product()]
        }
        "Expand" => {
            let Some(t) = arg.as_ref().and_then(|c| c.static_ints()) else { return Ok(None) };
            let t: Vec<usize> = t.iter().map(|&d| d.max(0) as usize).collect();
            let shape = bshape(&x.shape, &t)?;
            let xi = items(x);
            let v = (0..shape.iter().product())
                .map(|i| at(&xi, &x.shape, &shape, &unravel(i, &shape)).clone())
                .collect();
            return build(x.dt, shape, v).map(Some);
        }
        "Unsqueeze" => {
            let a = axes(if cx.g.opset >= 13 { None } else { n.ints("axes") }).ok_or("no axes")?;
            let mut a: Vec<usize> =
                a.iter().map(|&v| norm_axis(v, rank + a.len())).collect::<R<_>>()?;
            a.sort_unstable();
            let mut s = x.shape.clone();
            for i in a {
                s.insert(i, 1);
            }
            s
        }
        _ => {
            let a = axes(if cx.g.opset >= 13 { None } else { n.ints("axes") });
            let a: Vec<usize> = match a {
                Some(a) => a.iter().map(|&v| norm_axis(v, rank)).collect::<R<_>>()?,
                None => (0..rank).filter(|&i| x.shape[i] == 1).collect(),
            };
            x.shape.iter().enumerate().filter(|(i, _)| !a.contains(i)).map(|(_, &d)| d).collect()
        }
    };
    if shape.iter().product::<usize>() != x.numel() {
        return Err(format!("a constant of shape {:?} does not become {shape:?}", x.shape));
    }
    Ok(Some(Const { dt: x.dt, shape, elems: x.elems.clone() }))
}

fn slice(cx: &Lower, n: &Node, x: &Const, ins: &[Option<Const>]) -> R<Option<Const>> {
    let arg = |i: usize, attr: &str| -> Option<Vec<i64>> {
        if cx.g.opset >= 10 {
            ins.get(i).cloned().flatten().and_then(|c| c.static_ints())
        } else {
            n.ints(attr)
        }
    };
    let (Some(starts), Some(ends)) = (arg(1, "starts"), arg(2, "ends")) else { return Ok(None) };
    let rank = x.shape.len();
    let axes: Vec<usize> = match arg(3, "axes") {
        Some(a) => a.iter().map(|&v| norm_axis(v, rank)).collect::<R<_>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = arg(4, "steps").unwrap_or_else(|| vec![1; starts.len()]);
    // Per axis, the positions kept.
    let mut keep: Vec<Vec<usize>> = x.shape.iter().map(|&d| (0..d).collect()).collect();
    for (k, &a) in axes.iter().enumerate() {
        let d = x.shape[a] as i64;
        let step = steps[k];
        if step == 0 {
            return Err("a slice with step 0".into());
        }
        let fix = |v: i64, lo: i64, hi: i64| (if v < 0 { v + d } else { v }).clamp(lo, hi);
        let mut pos = Vec::new();
        if step > 0 {
            let (mut i, e) = (fix(starts[k], 0, d), fix(ends[k], 0, d));
            while i < e {
                pos.push(i as usize);
                i += step;
            }
        } else {
            let (mut i, e) = (fix(starts[k], -1, d - 1), fix(ends[k], -1, d - 1));
            while i > e {
                pos.push(i as usize);
                i += step;
            }
        }
        keep[a] = pos;
    }
    let shape: Vec<usize> = keep.iter().map(Vec::len).collect();
    let xi = items(x);
    let st = strides(&x.shape);
    let v = (0..shape.iter().product())
        .map(|i| {
            let idx = unravel(i, &shape);
            xi[(0..rank).map(|a| keep[a][idx[a]] * st[a]).sum::<usize>()].clone()
        })
        .collect();
    build(x.dt, shape, v).map(Some)
}

fn transpose(n: &Node, x: &Const) -> R<Const> {
    let rank = x.shape.len();
    let perm: Vec<usize> = match n.ints("perm") {
        Some(p) => p.iter().map(|&a| norm_axis(a, rank)).collect::<R<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let (xi, st) = (items(x), strides(&x.shape));
    let v = (0..shape.iter().product())
        .map(|i| {
            let idx = unravel(i, &shape);
            xi[(0..rank).map(|k| idx[k] * st[perm[k]]).sum::<usize>()].clone()
        })
        .collect();
    build(x.dt, shape, v)
}

fn range(start: &Const, limit: &Const, delta: &Const) -> R<Option<Const>> {
    if start.dt.is_float() {
        let (s, l, d) = (
            start.floats().ok_or("start")?[0],
            limit.floats().ok_or("limit")?[0],
            delta.floats().ok_or("delta")?[0],
        );
        let n = ((l - s) / d).ceil().max(0.0) as usize;
        return build(start.dt, vec![n], (0..n).map(|i| S::F(s + i as f32 * d)).collect())
            .map(Some);
    }
    let (Some(s), Some(l), Some(d)) =
        (start.static_ints(), limit.static_ints(), delta.static_ints())
    else {
        return Ok(None);
    };
    let (s, l, d) = (s[0], l[0], d[0]);
    if d == 0 {
        return Err("a range with step 0".into());
    }
    let n = ((l - s) as f64 / d as f64).ceil().max(0.0) as i64;
    build(start.dt, vec![n as usize], (0..n).map(|i| S::I(Sym::lit(s + i * d))).collect()).map(Some)
}

fn trilu(n: &Node, x: &Const, k: Option<Const>) -> R<Option<Const>> {
    let k = match k {
        Some(c) => match c.static_ints() {
            Some(v) => v[0],
            None => return Ok(None),
        },
        None => 0,
    };
    let r = x.shape.len();
    if r < 2 {
        return Err("a triangle of a tensor with fewer than 2 axes".into());
    }
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let upper = n.int("upper", 1) != 0;
    let zero = match x.dt {
        d if d.is_float() => S::F(0.0),
        Dt::Bool => S::B(false),
        _ => S::I(Sym::lit(0)),
    };
    let v = items(x)
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let (row, col) = (((i / cols) % rows) as i64, (i % cols) as i64);
            let keep = if upper { col - row >= k } else { col - row <= k };
            if keep {
                s
            } else {
                zero.clone()
            }
        })
        .collect();
    build(x.dt, x.shape.clone(), v).map(Some)
}
