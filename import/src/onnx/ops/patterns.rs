//! Patterns exporters spell op by op that mgn has one builtin for: attention (`MatMul`, a
//! scale, an added mask, `Softmax` over the last axis, `MatMul`) and GELU (the erf form and
//! the tanh approximation). A pattern is recognised at its last node, only when every node
//! inside it is read by the pattern alone and the math is the builtin's exactly; its inner
//! statements, lowered already, are dropped afterwards by `prune` once nothing reads them.

use super::shape::permute;
use super::{broadcast, Lower, R};
use crate::onnx::graph::Node;
use crate::onnx::layers::access;
use crate::onnx::value::{float_text, Run, Sym, Val};
use std::collections::HashSet;

/// The builtin for the pattern ending at `n`, if it is one.
pub fn fuse(cx: &mut Lower, n: &Node) -> R<Option<Run>> {
    match n.op.as_str() {
        "MatMul" => attention(cx, n),
        "Mul" => Ok(gelu(cx, n)),
        _ => Ok(None),
    }
}

/// A factor of a product of `Mul` nodes: a one-element constant or a value.
#[derive(Clone, Debug, PartialEq)]
enum Factor {
    Const(f64),
    Val(String),
}

/// What a match has found so far: the values inside the pattern, dropped if it stands.
#[derive(Default)]
struct Inner(Vec<String>);

impl Inner {
    /// The node producing `v` when only the pattern reads `v`.
    fn node<'g>(&mut self, cx: &Lower<'g>, v: &str, op: &str) -> Option<&'g Node> {
        let n = cx.producer(v)?;
        (n.op == op && cx.read_once(v)).then(|| {
            self.0.push(v.to_string());
            n
        })
    }
}

/// The one element of a float constant that does not widen what it multiplies (`rank` at most).
fn scalar(cx: &Lower, v: &str, rank: usize) -> Option<f64> {
    let c = cx.konst(v)?;
    let f = c.floats()?;
    (c.numel() == 1 && c.shape.len() <= rank).then_some(f64::from(f[0]))
}

fn rank(cx: &Lower, v: &str) -> usize {
    match cx.vals.get(v) {
        Some(Val::Run(r)) => r.rank(),
        Some(Val::Const(c)) => c.shape.len(),
        None => 0,
    }
}

/// The factors of the product of `inputs`, through `Mul` nodes only the product reads.
fn factors(cx: &Lower, inputs: &[String], rank: usize, inner: &mut Inner, out: &mut Vec<Factor>) {
    for v in inputs {
        if let Some(c) = scalar(cx, v, rank) {
            out.push(Factor::Const(c));
        } else if let Some(m) = inner.node(cx, v, "Mul") {
            factors(cx, &m.inputs, rank, inner, out);
        } else {
            out.push(Factor::Val(v.clone()));
        }
    }
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs()
}

/// `x · 0.5 · (1 + f(…))` in any order: `x` and the `Add` of one, if that is the product.
fn half_x_one_plus(cx: &Lower, n: &Node, inner: &mut Inner) -> Option<(String, String)> {
    let r = rank(cx, n.inputs.first()?).max(rank(cx, n.inputs.get(1)?));
    let mut f = Vec::new();
    factors(cx, &n.inputs, r, inner, &mut f);
    let half = f.iter().position(|x| matches!(x, Factor::Const(c) if *c == 0.5))?;
    f.remove(half);
    let [Factor::Val(a), Factor::Val(b)] = f.as_slice() else { return None };
    for (x, plus) in [(a, b), (b, a)] {
        let mut tried = Inner::default();
        if let Some(add) = tried.node(cx, plus, "Add") {
            if let Some(t) = plus_one(cx, add, rank(cx, x)) {
                inner.0.extend(tried.0);
                return Some((x.clone(), t));
            }
        }
    }
    None
}

/// The other operand of `1 + t`.
fn plus_one(cx: &Lower, add: &Node, rank: usize) -> Option<String> {
    let (a, b) = (add.input(0)?, add.input(1)?);
    if scalar(cx, b, rank) == Some(1.0) {
        Some(a.to_string())
    } else if scalar(cx, a, rank) == Some(1.0) {
        Some(b.to_string())
    } else {
        None
    }
}

/// `x · 0.5 · (1 + erf(x / √2))` is `gelu(x)`; `x · 0.5 · (1 + tanh(√(2/π) · (x + 0.044715 ·
/// x³)))` is `gelu_tanh(x)`.
fn gelu(cx: &mut Lower, n: &Node) -> Option<Run> {
    let mut inner = Inner::default();
    let (x, t) = half_x_one_plus(cx, n, &mut inner)?;
    let r = rank(cx, &x);
    let f = if let Some(erf) = inner.node(cx, &t, "Erf") {
        let arg = erf.input(0)?;
        let (d, c) = if let Some(div) = inner.node(cx, arg, "Div") {
            (div.input(0)?.to_string(), 1.0 / scalar(cx, div.input(1)?, r)?)
        } else {
            let mut f = Vec::new();
            factors(cx, std::slice::from_ref(&arg.to_string()), r, &mut inner, &mut f);
            let ([Factor::Val(d), Factor::Const(c)] | [Factor::Const(c), Factor::Val(d)]) =
                f.as_slice()
            else {
                return None;
            };
            (d.clone(), *c)
        };
        (d == x && near(c, std::f64::consts::FRAC_1_SQRT_2)).then_some("gelu")?
    } else {
        let tanh = inner.node(cx, &t, "Tanh")?;
        let mut f = Vec::new();
        factors(cx, &tanh.inputs, r, &mut inner, &mut f);
        let ([Factor::Val(s), Factor::Const(c)] | [Factor::Const(c), Factor::Val(s)]) =
            f.as_slice()
        else {
            return None;
        };
        let sqrt_2_pi = (2.0 / std::f64::consts::PI).sqrt();
        (near(*c, sqrt_2_pi) && cubic(cx, s, &x, r, &mut inner)).then_some("gelu_tanh")?
    };
    let Some(Val::Run(xr)) = cx.vals.get(&x).cloned() else { return None };
    drop_inner(cx, inner);
    Some(cx.bind("gelu", format!("{f}({})", xr.expr), xr.dt, xr.shape))
}

/// Whether `s` is `x + 0.044715 · x³` (the cube a `Pow` by 3 or `x · x · x`).
fn cubic(cx: &Lower, s: &str, x: &str, r: usize, inner: &mut Inner) -> bool {
    let Some(add) = inner.node(cx, s, "Add") else { return false };
    let (Some(a), Some(b)) = (add.input(0), add.input(1)) else { return false };
    let w = if a == x {
        b
    } else if b == x {
        a
    } else {
        return false;
    };
    let mut f = Vec::new();
    factors(cx, &[w.to_string()], r, inner, &mut f);
    let c = f.iter().position(|v| matches!(v, Factor::Const(c) if near(*c, 0.044715)));
    let Some(c) = c else { return false };
    f.remove(c);
    let xv = Factor::Val(x.to_string());
    match f.as_slice() {
        [Factor::Val(p)] => inner.node(cx, p, "Pow").is_some_and(|pow| {
            pow.input(0) == Some(x) && pow.input(1).and_then(|e| scalar(cx, e, r)) == Some(3.0)
        }),
        three => three.len() == 3 && three.iter().all(|v| *v == xv),
    }
}

/// The scores `q · kᵀ · scale`: `q`, `kᵀ` and the scale, scaled after the product (a `Mul` or
/// `Div` by a constant) or before it (each operand by a constant, as `F.scaled_dot_product_
/// attention` exports).
fn scores(cx: &Lower, v: &str, inner: &mut Inner) -> Option<(String, String, f64)> {
    let r = rank(cx, v);
    let mut scale = 1.0;
    let mut m = v.to_string();
    if let Some(div) = inner.node(cx, v, "Div") {
        scale = 1.0 / scalar(cx, div.input(1)?, r)?;
        m = div.input(0)?.to_string();
    } else if let Some(mul) = inner.node(cx, v, "Mul") {
        let (a, b) = (mul.input(0)?, mul.input(1)?);
        (m, scale) = match (scalar(cx, a, r), scalar(cx, b, r)) {
            (_, Some(c)) => (a.to_string(), c),
            (Some(c), _) => (b.to_string(), c),
            _ => return None,
        };
    }
    let mm = inner.node(cx, &m, "MatMul")?;
    let mut side = |v: &str| -> Option<String> {
        let mut tried = Inner::default();
        if let Some(mul) = tried.node(cx, v, "Mul") {
            let (a, b) = (mul.input(0)?, mul.input(1)?);
            let (x, c) = match (scalar(cx, a, r), scalar(cx, b, r)) {
                (_, Some(c)) => (a, c),
                (Some(c), _) => (b, c),
                _ => return Some(v.to_string()),
            };
            scale *= c;
            inner.0.extend(tried.0);
            return Some(x.to_string());
        }
        Some(v.to_string())
    };
    let q = side(mm.input(0)?)?;
    let kt = side(mm.input(1)?)?;
    Some((q, kt, scale))
}

fn run_of(cx: &mut Lower, v: &str) -> Option<Run> {
    match cx.vals.get(v)?.clone() {
        Val::Run(r) => Some(r),
        Val::Const(c) => cx.materialize(v, &c).ok(),
    }
}

fn same(a: &[Sym], b: &[Sym]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.v == y.v)
}

/// `softmax(q · kᵀ · scale + mask) · v` is `attention(q, k, v, scale, mask)`.
fn attention(cx: &mut Lower, n: &Node) -> R<Option<Run>> {
    let mut inner = Inner::default();
    let (Some(p), Some(v)) = (n.input(0), n.input(1)) else { return Ok(None) };
    let Some(sm) = inner.node(cx, p, "Softmax") else { return Ok(None) };
    let r = rank(cx, p);
    // Before opset 13 the axis flattens what follows it: for the last axis that is the same.
    let axis = sm.int("axis", if cx.g.opset >= 13 { -1 } else { 1 });
    if r < 3 || super::norm_axis(axis, r).ok() != Some(r - 1) {
        return Ok(None);
    }
    let Some(s) = sm.input(0) else { return Ok(None) };
    let mut found = None;
    let mut tried = Inner::default();
    if let Some(add) = tried.node(cx, s, "Add") {
        for (a, b) in [(0, 1), (1, 0)] {
            let mut t = Inner(tried.0.clone());
            let (Some(a), Some(b)) = (add.input(a), add.input(b)) else { continue };
            if let Some(sc) = scores(cx, a, &mut t) {
                found = Some((sc, Some(b.to_string()), t));
                break;
            }
        }
    }
    if found.is_none() {
        let mut t = Inner::default();
        found = scores(cx, s, &mut t).map(|sc| (sc, None, t));
    }
    let Some(((q, kt, scale), mask, t)) = found else { return Ok(None) };
    inner.0.extend(t.0);
    let (Some(qr), Some(ktr), Some(vr)) = (run_of(cx, &q), run_of(cx, &kt), run_of(cx, v)) else {
        return Ok(None);
    };
    let lead = r - 2;
    let fits =
        [&ktr, &vr].iter().all(|x| x.rank() == r && same(&x.shape[..lead], &qr.shape[..lead]))
            && qr.rank() == r
            && qr.shape[r - 1].v == ktr.shape[r - 2].v
            && ktr.shape[r - 1].v == vr.shape[r - 2].v
            && qr.dt.is_float()
            && qr.dt == ktr.dt
            && qr.dt == vr.dt;
    let Some(scale) = float_text(scale as f32).filter(|_| fits) else { return Ok(None) };
    let mut scores_shape = qr.shape[..r - 1].to_vec();
    scores_shape.push(ktr.shape[r - 1].clone());
    let mask = match mask {
        None => None,
        Some(m) => {
            let Some(mr) = run_of(cx, &m) else { return Ok(None) };
            let b = broadcast(&mr.shape, &scores_shape).ok();
            if mr.dt != qr.dt || !b.is_some_and(|b| same(&b, &scores_shape)) {
                return Ok(None);
            }
            Some(widen(cx, mr, r))
        }
    };
    let k = key(cx, &kt, ktr, &mut inner);
    let mut args = format!("{}, {}, {}, scale = {scale}", qr.expr, k.expr, vr.expr);
    if let Some(m) = mask {
        args.push_str(&format!(", mask = {}", m.expr));
    }
    let mut shape = scores_shape[..r - 1].to_vec();
    shape.push(vr.shape[r - 1].clone());
    drop_inner(cx, inner);
    Ok(Some(cx.bind("attn", format!("attention({args})"), qr.dt, shape)))
}

/// Marks the `let`s of the values inside a recognised pattern for `prune`, and their nodes as
/// the pattern's, for the comment that names them.
fn drop_inner(cx: &mut Lower, inner: Inner) {
    for v in inner.0 {
        if let Some(Val::Run(r)) = cx.vals.get(&v) {
            cx.dropped.insert(r.expr.clone());
        }
        if let Some(&j) = cx.made_by.get(&v) {
            cx.fused.push(j);
        }
    }
}

/// The mask with leading axes of one up to rank `r`: the builtin's mask has the scores' rank.
fn widen(cx: &mut Lower, m: Run, r: usize) -> Run {
    if m.rank() == r {
        return m;
    }
    let mut shape = vec![Sym::lit(1); r - m.rank()];
    shape.extend(m.shape.iter().cloned());
    let dims: Vec<String> = shape.iter().map(Sym::text).collect();
    let e = format!("reshape({}, [{}])", m.expr, dims.join(", "));
    cx.bind("mask", e, m.dt, shape)
}

/// `k` from `kᵀ`: the input of the `Transpose` that made `kᵀ`, permuted without swapping the
/// last two axes, or `kᵀ` transposed back.
fn key(cx: &mut Lower, kt: &str, ktr: Run, inner: &mut Inner) -> Run {
    let r = ktr.rank();
    let mut tried = Inner::default();
    if let Some(t) = tried.node(cx, kt, "Transpose") {
        if let (Some(perm), Some(Val::Run(x))) =
            (t.ints("perm"), t.input(0).and_then(|i| cx.vals.get(i)))
        {
            let x = x.clone();
            let perm: Option<Vec<usize>> =
                perm.iter().map(|&a| super::norm_axis(a, r).ok()).collect();
            if let Some(mut perm) = perm.filter(|p| p.len() == r) {
                perm.swap(r - 2, r - 1);
                inner.0.extend(tried.0);
                return permute(cx, x, &perm);
            }
        }
    }
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    permute(cx, ktr, &perm)
}

/// Drops the `let`s of `dropped` that no later statement reads: the inside of a recognised
/// pattern, lowered before its last node was reached. `tags` stays parallel to `body`.
/// The tensors only those statements read (an exporter's `0.5` initializer) go too.
pub fn prune(cx: &mut Lower) {
    let (body, tags, dropped) = (&mut cx.body, &mut cx.tags, &cx.dropped);
    let mut read: HashSet<String> = HashSet::new();
    let mut keep = vec![true; body.len()];
    for (i, line) in body.iter().enumerate().rev() {
        let name = line.strip_prefix("let ").and_then(|l| l.split(' ').next());
        if name.is_some_and(|n| dropped.contains(n) && !read.contains(n)) {
            keep[i] = false;
            continue;
        }
        read.extend(words(line));
    }
    let removed: Vec<String> =
        body.iter().zip(&keep).filter(|(_, k)| !**k).map(|(l, _)| l.clone()).collect();
    let mut k = keep.iter();
    body.retain(|_| *k.next().expect("parallel"));
    let mut k = keep.iter();
    tags.retain(|_| *k.next().unwrap_or(&true));
    let f = &mut cx.fields;
    let unread: HashSet<String> = f
        .tensors
        .keys()
        .filter(|p| {
            let a = access(p);
            removed.iter().any(|l| reads(l, &a)) && !cx.body.iter().any(|l| reads(l, &a))
        })
        .cloned()
        .collect();
    f.tensors.retain(|p, _| !unread.contains(p));
    f.order.retain(|p| !unread.contains(p));
    f.weights.retain(|(p, _)| !unread.contains(p));
}

/// Whether `line` reads the field `a` (`self.s4`, not `self.s4_1`).
fn reads(line: &str, a: &str) -> bool {
    line.match_indices(a)
        .any(|(i, _)| !line[i + a.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_'))
}

/// The identifiers of a line (with what follows a `.`, harmlessly).
fn words(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(String::from)
}
