//! Ops that move elements without computing on them, on run-time tensors (their constant
//! forms fold in `fold.rs`), and the ops that read shapes, which always give constants.

use super::{broadcast, dims, norm_axis, product, Lower, R};
use crate::onnx::graph::{Attr, Node};
use crate::onnx::value::{Const, Dt, Elems, Run, Sym, Val};

const OPS: &[&str] = &[
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "GatherElements",
    "Expand",
    "Shape",
    "Size",
    "Constant",
    "ConstantOfShape",
    "Range",
    "Trilu",
];

pub fn handles(op: &str) -> bool {
    OPS.contains(&op)
}

pub fn lower(cx: &mut Lower, n: &Node) -> R<Vec<Val>> {
    let one = |r: Run| Ok(vec![Val::Run(r)]);
    match n.op.as_str() {
        "Shape" => Ok(vec![Val::Const(shape_of(cx, n)?)]),
        "Size" => {
            let s = cx.shape_of(n, 0)?;
            Ok(vec![Val::Const(Const {
                dt: Dt::I64,
                shape: vec![],
                elems: Elems::I(vec![product(&s)]),
            })])
        }
        "Constant" => Ok(vec![Val::Const(constant(n)?)]),
        "Reshape" => {
            let x = cx.run(n, 0)?;
            let target = cx.ints_in(n, 1, "shape")?.ok_or("no shape")?;
            let s = reshape_dims(&x.shape, &target, n.int("allowzero", 0) != 0)?;
            one(reshape(cx, x, s))
        }
        "Flatten" => {
            let x = cx.run(n, 0)?;
            let a = flatten_axis(n.int("axis", 1), x.rank())?;
            let s = vec![product(&x.shape[..a]), product(&x.shape[a..])];
            one(reshape(cx, x, s))
        }
        "Transpose" => {
            let x = cx.run(n, 0)?;
            let perm: Vec<usize> = match n.ints("perm") {
                Some(p) => p.iter().map(|&a| norm_axis(a, x.rank())).collect::<R<_>>()?,
                None => (0..x.rank()).rev().collect(),
            };
            one(permute(cx, x, &perm))
        }
        "Squeeze" | "Unsqueeze" => one(squeeze(cx, n)?),
        "Concat" => one(concat(cx, n)?),
        "Split" => split(cx, n),
        "Slice" => one(slice(cx, n)?),
        "Gather" => one(gather(cx, n)?),
        "GatherElements" => {
            let x = cx.run(n, 0)?;
            let idx = cx.run(n, 1)?;
            let axis = norm_axis(n.int("axis", 0), x.rank())?;
            // Negative indices count from the end, as for Gather.
            let (i, size) = (&idx.expr, x.shape[axis].text());
            let e = format!("where({i} < 0, {i} + {size}, {i})");
            let idx = cx.bind("index", e, idx.dt, idx.shape);
            let e = format!("take_along_axis({}, {}, axis = {axis})", x.expr, idx.expr);
            one(cx.bind("taken", e, x.dt, idx.shape))
        }
        "Expand" => {
            let x = cx.run(n, 0)?;
            let target = cx.ints_in(n, 1, "shape")?.ok_or("no shape")?;
            let s = broadcast(&x.shape, &target)?;
            if s == x.shape {
                return one(x);
            }
            let e = format!("broadcast_to({}, {})", x.expr, dims(&s));
            one(cx.bind("expand", e, x.dt, s))
        }
        "ConstantOfShape" => {
            let target = cx.ints_in(n, 0, "shape")?.ok_or("no shape")?;
            let value = match n.attrs.get("value") {
                Some(Attr::Tensor(c)) => c.clone(),
                _ => Const { dt: Dt::F32, shape: vec![1], elems: Elems::F(vec![0.0]) },
            };
            let ty = value.dt.mgn().ok_or("its value's type has no mgn tensor type")?;
            let v = value.scalar_text().ok_or("its value is not one finite number")?;
            let e = format!("full({}, {v}, dtype = {ty})", dims(&target));
            one(cx.bind("filled", e, value.dt, target))
        }
        "Range" => one(range(cx, n)?),
        "Trilu" => one(trilu(cx, n)?),
        _ => Err("mgn has no translation for this op".into()),
    }
}

fn shape_of(cx: &Lower, n: &Node) -> R<Const> {
    let s = cx.shape_of(n, 0)?;
    let r = s.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clampi(n.int("start", 0));
    let end = clampi(n.int("end", r));
    let v: Vec<Sym> = s.get(start..end.max(start)).unwrap_or(&[]).to_vec();
    Ok(Const { dt: Dt::I64, shape: vec![v.len()], elems: Elems::I(v) })
}

pub fn constant(n: &Node) -> R<Const> {
    let (k, a) = n.attrs.iter().next().ok_or("it has no value")?;
    Ok(match (k.as_str(), a) {
        ("value", Attr::Tensor(c)) => c.clone(),
        ("value_float", Attr::Float(f)) => {
            Const { dt: Dt::F32, shape: vec![], elems: Elems::F(vec![*f]) }
        }
        ("value_floats", Attr::Floats(f)) => {
            Const { dt: Dt::F32, shape: vec![f.len()], elems: Elems::F(f.clone()) }
        }
        ("value_int", Attr::Int(i)) => {
            Const { dt: Dt::I64, shape: vec![], elems: Elems::ints([*i].into_iter()) }
        }
        ("value_ints", Attr::Ints(i)) => {
            Const { dt: Dt::I64, shape: vec![i.len()], elems: Elems::ints(i.iter().copied()) }
        }
        _ => return Err(format!("its `{k}` value is not a kind mgn reads")),
    })
}

/// The sizes `Reshape` produces: `0` copies the input's size (unless `allowzero`), `-1` is
/// whatever is left.
pub fn reshape_dims(input: &[Sym], target: &[Sym], allowzero: bool) -> R<Vec<Sym>> {
    let mut out: Vec<Sym> = Vec::new();
    let mut infer = None;
    for (i, t) in target.iter().enumerate() {
        match t.v {
            0 if !allowzero => {
                out.push(input.get(i).cloned().ok_or("a 0 in the shape has no input axis to copy")?)
            }
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(Sym::lit(1));
            }
            v if v >= 1 => out.push(t.clone()),
            v => return Err(format!("the shape holds {v}, which mgn cannot reshape to")),
        }
    }
    let total = product(input);
    if let Some(i) = infer {
        let rest = product(&out);
        if rest.v == 0 || total.v % rest.v != 0 {
            return Err(format!("{} does not reshape to {}", dims(input), dims(target)));
        }
        let e = match (&total.e, &rest.e) {
            (None, None) => None,
            _ if !total.is_static() && rest.is_static() && rest.v == 1 => total.e.clone(),
            _ => Some(format!("({} / {})", total.text(), rest.text())),
        };
        out[i] = Sym { v: total.v / rest.v, e };
    }
    if product(&out).v != total.v {
        return Err(format!("{} does not reshape to {}", dims(input), dims(&out)));
    }
    Ok(out)
}

pub fn reshape(cx: &mut Lower, x: Run, s: Vec<Sym>) -> Run {
    if s == x.shape {
        return x;
    }
    let e = format!("reshape({}, {})", x.expr, dims(&s));
    cx.bind("reshaped", e, x.dt, s)
}

pub fn permute(cx: &mut Lower, x: Run, perm: &[usize]) -> Run {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return x;
    }
    let s: Vec<Sym> = perm.iter().map(|&p| x.shape[p].clone()).collect();
    let r = x.rank();
    let e = if r >= 2 && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p) {
        format!("{}^T", x.expr)
    } else {
        let p: Vec<String> = perm.iter().map(ToString::to_string).collect();
        format!("permute({}, [{}])", x.expr, p.join(", "))
    };
    cx.bind("permuted", e, x.dt, s)
}

fn axes_of(cx: &Lower, n: &Node) -> R<Option<Vec<i64>>> {
    if cx.g.opset >= 13 {
        Ok(cx.ints_in(n, 1, "axes")?.map(|v| v.iter().map(|s| s.v).collect()))
    } else {
        Ok(n.ints("axes"))
    }
}

fn squeeze(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let axes = axes_of(cx, n)?;
    let mut s = x.shape.clone();
    if n.op == "Unsqueeze" {
        let axes = axes.ok_or("it has no axes")?;
        let out_rank = x.rank() + axes.len();
        let mut a: Vec<usize> = axes.iter().map(|&a| norm_axis(a, out_rank)).collect::<R<_>>()?;
        a.sort_unstable();
        for &i in &a {
            s.insert(i, Sym::lit(1));
        }
        if a.len() == 1 {
            let e = format!("unsqueeze({}, {})", x.expr, a[0]);
            return Ok(cx.bind("unsqueezed", e, x.dt, s));
        }
        return Ok(reshape(cx, x, s));
    }
    let a: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| norm_axis(a, x.rank())).collect::<R<_>>()?,
        None => (0..x.rank()).filter(|&i| x.shape[i].v == 1).collect(),
    };
    if let Some(&bad) = a.iter().find(|&&i| x.shape[i].v != 1) {
        return Err(format!("axis {bad} has size {}, not 1", x.shape[bad]));
    }
    let s: Vec<Sym> =
        s.into_iter().enumerate().filter(|(i, _)| !a.contains(i)).map(|(_, d)| d).collect();
    if a.len() == 1 {
        let e = format!("squeeze({}, {})", x.expr, a[0]);
        return Ok(cx.bind("squeezed", e, x.dt, s));
    }
    Ok(reshape(cx, x, s))
}

fn concat(cx: &mut Lower, n: &Node) -> R<Run> {
    let count = n.inputs.len();
    let mut parts = Vec::new();
    for i in 0..count {
        if cx.shape_of(n, i)?.contains(&Sym::lit(0)) {
            continue; // an empty piece adds nothing (mgn has no empty tensors)
        }
        parts.push(cx.run(n, i)?);
    }
    let first = parts.first().cloned().ok_or("every input is empty")?;
    let axis = norm_axis(n.int("axis", 0), first.rank())?;
    if parts.len() == 1 {
        return Ok(first);
    }
    let mut s = first.shape.clone();
    s[axis] = parts[1..]
        .iter()
        .try_fold(first.shape[axis].clone(), |acc, p| acc.op(&p.shape[axis], '+'))
        .ok_or("sizes overflow")?;
    let items: Vec<&str> = parts.iter().map(|p| p.expr.as_str()).collect();
    let e = format!("concat([{}], axis = {axis})", items.join(", "));
    Ok(cx.bind("concat", e, first.dt, s))
}

fn split(cx: &mut Lower, n: &Node) -> R<Vec<Val>> {
    let x = cx.run(n, 0)?;
    let axis = norm_axis(n.int("axis", 0), x.rank())?;
    let total = x.shape[axis].clone();
    let k = n.outputs.len();
    let given = if cx.g.opset >= 13 {
        cx.ints_in(n, 1, "split")?
    } else {
        n.ints("split").map(|v| v.into_iter().map(Sym::lit).collect())
    };
    let sizes: Vec<Sym> = match given {
        Some(v) => v,
        None => {
            if !total.is_static() && k > 1 {
                return Err("it splits a dynamic axis into equal parts".into());
            }
            let part = (total.v + k as i64 - 1) / k as i64;
            (0..k).map(|i| Sym::lit(part.min(total.v - part * i as i64))).collect()
        }
    };
    if sizes.len() != k || sizes.iter().any(|s| s.v < 1) {
        return Err(format!("it splits into {} parts of sizes {}", k, dims(&sizes)));
    }
    if k == 1 {
        return Ok(vec![Val::Run(x)]);
    }
    let names: Vec<String> = (0..k).map(|_| cx.fresh("part")).collect();
    let list: Vec<String> = sizes.iter().map(Sym::text).collect();
    cx.body.push(format!(
        "let ({}) = split({}, [{}], axis = {axis})",
        names.join(", "),
        x.expr,
        list.join(", ")
    ));
    let parts: Vec<Run> = names
        .into_iter()
        .zip(sizes)
        .map(|(name, size)| {
            let mut s = x.shape.clone();
            s[axis] = size;
            Run { expr: name, dt: x.dt, shape: s }
        })
        .collect();
    cx.mark_lets(&parts);
    Ok(parts.into_iter().map(Val::Run).collect())
}

/// One axis of a `Slice`: start and end clamped into the axis as ONNX does.
pub fn slice_bounds(size: i64, start: i64, end: i64) -> (i64, i64) {
    let fix = |v: i64| if v < 0 { (v + size).max(0) } else { v.min(size) };
    (fix(start), fix(end))
}

fn slice(cx: &mut Lower, n: &Node) -> R<Run> {
    let mut x = cx.run(n, 0)?;
    let (starts, ends, axes, steps) = if cx.g.opset >= 10 {
        let ints = |cx: &Lower, i, w| -> R<Option<Vec<Sym>>> { cx.ints_in(n, i, w) };
        (
            ints(cx, 1, "starts")?.ok_or("no starts")?,
            ints(cx, 2, "ends")?.ok_or("no ends")?,
            ints(cx, 3, "axes")?,
            ints(cx, 4, "steps")?,
        )
    } else {
        let s = |k: &str| n.ints(k).map(|v| v.into_iter().map(Sym::lit).collect::<Vec<_>>());
        (s("starts").ok_or("no starts")?, s("ends").ok_or("no ends")?, s("axes"), None)
    };
    for (k, st) in starts.iter().enumerate() {
        let a = match &axes {
            Some(a) => norm_axis(a[k].v, x.rank())?,
            None => k,
        };
        let step = steps.as_ref().map_or(1, |s| s[k].v);
        if step != 1 {
            x = strided(cx, x, a, st.v, ends[k].v, step)?;
            continue;
        }
        let size = x.shape[a].clone();
        let (b, e) = slice_bounds(size.v, st.v, ends[k].v);
        if b >= e {
            return Err(format!("it slices axis {a} empty ({b}..{e}); mgn has no empty tensors"));
        }
        if b == 0 && e == size.v && st.is_static() {
            continue;
        }
        let end_text = if e == size.v {
            size.text()
        } else {
            if ends[k].is_static() {
                e.to_string()
            } else {
                ends[k].text()
            }
        };
        let start_text = if st.is_static() { b.to_string() } else { st.text() };
        let mut s = x.shape.clone();
        s[a] = Sym {
            v: e - b,
            e: if size.is_static() && st.is_static() && ends[k].is_static() {
                None
            } else {
                Some(format!("({end_text} - {start_text})"))
            },
        };
        let expr = format!("slice({}, {a}, {start_text}, {end_text})", x.expr);
        x = cx.bind("sliced", expr, x.dt, s);
    }
    Ok(x)
}

fn gather(cx: &mut Lower, n: &Node) -> R<Run> {
    let xs = cx.shape_of(n, 0)?;
    let axis = norm_axis(n.int("axis", 0), xs.len())?;
    let idx_name = n.input(1).ok_or("no indices")?;
    if let Some(c) = cx.konst(idx_name).cloned() {
        if let (Some(v), true) = (c.static_ints(), c.shape.is_empty()) {
            let x = cx.run(n, 0)?;
            let i = if v[0] < 0 { v[0] + x.shape[axis].v } else { v[0] };
            let mut s = x.shape.clone();
            s.remove(axis);
            let e = format!("squeeze(slice({}, {axis}, {i}, {}), {axis})", x.expr, i + 1);
            return Ok(cx.bind("picked", e, x.dt, s));
        }
    }
    let x = cx.run(n, 0)?;
    let mut idx = cx.run(n, 1)?;
    // ONNX counts negative indices from the end; mgn's gather does not.
    let size = x.shape[axis].text();
    let e = format!("where({i} < 0, {i} + {size}, {i})", i = idx.expr);
    idx = cx.bind("index", e, idx.dt, idx.shape);
    let mut s = x.shape[..axis].to_vec();
    s.extend(idx.shape.iter().cloned());
    s.extend(x.shape[axis + 1..].iter().cloned());
    let e = format!("gather({}, {}, axis = {axis})", x.expr, idx.expr);
    Ok(cx.bind("gathered", e, x.dt, s))
}

fn range(cx: &mut Lower, n: &Node) -> R<Run> {
    let get = |cx: &Lower, i, w| -> R<Sym> {
        let c = cx.konst_in(n, i, w)?;
        c.ints()
            .filter(|v| v.len() == 1)
            .map(|v| v[0].clone())
            .ok_or_else(|| format!("its {w} is not one integer"))
    };
    let (start, limit, delta) = (get(cx, 0, "start")?, get(cx, 1, "limit")?, get(cx, 2, "delta")?);
    if !(start.is_static() && delta.is_static() && delta.v == 1) {
        return Err("a range with a dynamic start or a step other than 1".into());
    }
    let count = limit.op(&start, '-').ok_or("overflow")?;
    if count.v < 1 {
        return Err("an empty range".into());
    }
    let dt = cx.konst(n.input(0).unwrap_or("")).map(|c| c.dt).unwrap_or(Dt::I64);
    let ty = dt.mgn().ok_or("its type has no mgn tensor type")?;
    let mut e = format!("cast(arange({}), {ty})", count.text());
    if start.v != 0 {
        e = format!("{e} + {}", start.v);
    }
    Ok(cx.bind("positions", e, dt, vec![count]))
}

/// The upper (or lower) triangle at run time: a comparison of column and row numbers.
fn trilu(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let r = x.rank();
    if r < 2 {
        return Err("a triangle of a tensor with fewer than 2 axes".into());
    }
    let k = match cx.ints_in(n, 1, "k")? {
        Some(v) if v.len() == 1 && v[0].is_static() => v[0].v,
        Some(_) => return Err("its diagonal offset k is not one number".into()),
        None => 0,
    };
    let (rows, cols) = (x.shape[r - 2].text(), x.shape[r - 1].text());
    let keep = if n.int("upper", 1) != 0 { ">=" } else { "<=" };
    let zero = if x.dt.is_float() {
        "0.0"
    } else if x.dt == Dt::Bool {
        "false"
    } else {
        "0"
    };
    let e = format!(
        "where(unsqueeze(arange({cols}), 0) - unsqueeze(arange({rows}), 1) {keep} {k}, {}, {zero})",
        x.expr
    );
    Ok(cx.bind("triangle", e, x.dt, x.shape))
}

/// A slice with a step other than 1: the positions it keeps, gathered.
fn strided(cx: &mut Lower, x: Run, a: usize, start: i64, end: i64, step: i64) -> R<Run> {
    let d = &x.shape[a];
    if !d.is_static() || step == 0 {
        return Err(format!("it steps by {step} over a dynamic axis"));
    }
    let fix = |v: i64, lo: i64, hi: i64| (if v < 0 { v + d.v } else { v }).clamp(lo, hi);
    let (b, count) = if step > 0 {
        let (b, e) = (fix(start, 0, d.v), fix(end, 0, d.v));
        (b, (e - b + step - 1).div_euclid(step))
    } else {
        let (b, e) = (fix(start, -1, d.v - 1), fix(end, -1, d.v - 1));
        (b, (b - e - step - 1).div_euclid(-step))
    };
    if count < 1 {
        return Err(format!("it slices axis {a} empty; mgn has no empty tensors"));
    }
    let op = if step > 0 { "+" } else { "-" };
    let idx = format!("{b} {op} arange({count}) * {}", step.abs());
    let mut s = x.shape.clone();
    s[a] = Sym::lit(count);
    let e = format!("gather({}, {idx}, axis = {a})", x.expr);
    Ok(cx.bind("strided", e, x.dt, s))
}

/// Flatten's axis: 0 … rank, a negative one counted from the end (`-1` is `rank - 1`).
pub fn flatten_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..=r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is outside a tensor of rank {rank}"))
    }
}
