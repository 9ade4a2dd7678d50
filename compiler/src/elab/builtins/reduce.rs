//! Reductions, softmax, the normalizations and dropout.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, NodeId, Op, ReduceOp};
use mgn_ir::shape;
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

// ---- reductions and normalization ---------------------------------------------------------

pub(super) fn reduce(ev: &mut Evaluator, a: &Args, op: ReduceOp) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    if d == DType::Bool {
        return Err(Diagnostic::error(
            "E0202",
            format!("`{}` needs a number tensor, found {}", a.name(), fmt_type(d, &s)),
            a.span_of("x"),
            "a mask",
        )
        .with_help("convert the mask first: `sum(cast(m, f32))` counts where it holds"));
    }
    if op == ReduceOp::Mean && !d.is_float() {
        return Err(Diagnostic::error(
            "E0202",
            format!("`mean` needs a float tensor, found {}", fmt_type(d, &s)),
            a.span_of("x"),
            "not float",
        )
        .with_help("convert it with `cast(x, f32)`"));
    }
    let mut axes = Vec::new();
    match a.ints(ev, "axis").map_err(|d| two_tensors_help(d, a, op))? {
        None => axes.extend(0..s.len()),
        Some(list) if list.is_empty() => {
            return Err(Diagnostic::error(
                "E0207",
                format!("`{}` over an empty list of axes", a.name()),
                a.span_of("axis"),
                "no axes",
            )
            .with_help("leave `axis` out to reduce over every axis"));
        }
        Some(list) => {
            for x in list {
                let ax = shape::axis(x, s.len()).ok_or_else(|| a.axis_error("axis", x, s.len()))?;
                if axes.contains(&ax) {
                    return Err(Diagnostic::error(
                        "E0207",
                        format!("axis {ax} is listed twice"),
                        a.span_of("axis"),
                        "duplicate axis",
                    ));
                }
                axes.push(ax);
            }
        }
    }
    axes.sort_unstable();
    let keepdim = a.bool_or(ev, "keepdim", false)?;
    let out: Vec<usize> = s
        .iter()
        .enumerate()
        .filter_map(|(i, &x)| if axes.contains(&i) { keepdim.then_some(1) } else { Some(x) })
        .collect();
    node(ev, Op::Reduce { op, axes, keepdim }, vec![t], d, out, a.span)
}

pub(super) fn argmax(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let s = ev.ty(t).1.to_vec();
    let axis = a.axis(ev, "axis", -1, s.len())?;
    let mut out = s.clone();
    out.remove(axis);
    node(ev, Op::ArgMax { axis }, vec![t], DType::I32, out, a.span)
}

pub(super) fn softmax(ev: &mut Evaluator, a: &Args, log: bool) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", -1, s.len())?;
    node(ev, Op::Softmax { axis, log }, vec![t], d, s, a.span)
}

pub(super) fn eps(ev: &Evaluator, a: &Args, default: f64) -> R<f64> {
    let e = a.number_or(ev, "eps", default)?;
    if e <= 0.0 || !e.is_finite() {
        return Err(Diagnostic::error(
            "E0301",
            format!("`eps` must be positive, found {e}"),
            a.span_of("eps"),
            "not positive",
        ));
    }
    Ok(e)
}

pub(super) fn last_dim(ev: &Evaluator, a: &Args, t: NodeId) -> R<usize> {
    ev.ty(t).1.last().copied().ok_or_else(|| {
        Diagnostic::error(
            "E0206",
            format!("`{}` needs at least one axis, found a scalar", a.name()),
            a.span_of("x"),
            "a scalar",
        )
    })
}

pub(super) fn layer_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let n = last_dim(ev, a, t)?;
    let why = format!("layer_norm normalizes over the last axis, of size {n}");
    let w = vector_of(ev, a, "weight", n, d, &why)?;
    let b = vector_of(ev, a, "bias", n, d, &why)?;
    let eps = eps(ev, a, 1e-5)?;
    let inputs = std::iter::once(t).chain(w).chain(b).collect();
    node(
        ev,
        Op::LayerNorm { eps, has_weight: w.is_some(), has_bias: b.is_some() },
        inputs,
        d,
        s,
        a.span,
    )
}

pub(super) fn rms_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let n = last_dim(ev, a, t)?;
    let w = vector_of(
        ev,
        a,
        "weight",
        n,
        d,
        &format!("rms_norm normalizes over the last axis, of size {n}"),
    )?;
    let eps = eps(ev, a, 1e-6)?;
    let inputs = std::iter::once(t).chain(w).collect();
    node(ev, Op::RmsNorm { eps, has_weight: w.is_some() }, inputs, d, s, a.span)
}

/// Channels of an `[N, C, ...]` input with at least `min_rank` axes.
pub(super) fn channels(
    ev: &Evaluator,
    a: &Args,
    t: NodeId,
    min_rank: usize,
    max_rank: usize,
    layout: &str,
) -> R<usize> {
    let s = ev.ty(t).1;
    if s.len() < min_rank || s.len() > max_rank {
        return Err(Diagnostic::error(
            "E0206",
            format!("`{}` needs {layout}, found {}", a.name(), ev.type_str(t)),
            a.span_of("x"),
            format!("{} axes", s.len()),
        ));
    }
    Ok(s[1])
}

pub(super) fn group_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let c = channels(ev, a, t, 2, 8, "[N, C, ...]")?;
    let groups = a.int_or(ev, "groups", 1)?;
    if groups < 1 || c % groups as usize != 0 {
        return Err(Diagnostic::error(
            "E0203",
            format!("`group_norm` cannot split {c} channels into {groups} groups"),
            a.span_of("groups"),
            format!("{c} is not divisible by {groups}"),
        ));
    }
    let why = format!("group_norm has one weight per channel ({c})");
    let w = vector_of(ev, a, "weight", c, d, &why)?;
    let b = vector_of(ev, a, "bias", c, d, &why)?;
    let eps = eps(ev, a, 1e-5)?;
    let inputs = std::iter::once(t).chain(w).chain(b).collect();
    node(
        ev,
        Op::GroupNorm {
            groups: groups as usize,
            eps,
            has_weight: w.is_some(),
            has_bias: b.is_some(),
        },
        inputs,
        d,
        s,
        a.span,
    )
}

pub(super) fn batch_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let c = channels(ev, a, t, 2, 5, "[N, C], [N, C, L] or [N, C, H, W]")?;
    let why = format!("batch_norm keeps one statistic per channel ({c})");
    let mut stats = Vec::new();
    for name in ["running_mean", "running_var"] {
        let (r, rs) = a.tensor(ev, name)?;
        vector_of(ev, a, name, c, d, &why)?;
        let is_buffer = ev.graph.param_of(r).is_some_and(|p| p.kind() == "buffer");
        if !is_buffer {
            let msg = format!("`{name}` of `batch_norm` must be a `buffer` field");
            let mut dg = Diagnostic::error("E0203", msg, rs, "not a buffer").with_help(
                "declare it as `buffer f32[C] init zeros` (ones for the variance): running \
                 statistics are state, not trained",
            );
            if let Some(p) = ev.graph.param_of(r) {
                let what =
                    if p.trainable { "a trainable `param`" } else { "a `const` (never saved)" };
                dg = dg.with_label(p.span, format!("declared as {what} here"));
            }
            return Err(dg);
        }
        stats.push(r);
    }
    let w = vector_of(ev, a, "weight", c, d, &why)?;
    let b = vector_of(ev, a, "bias", c, d, &why)?;
    let momentum = a.number_or(ev, "momentum", 0.1)?;
    if !(0.0..=1.0).contains(&momentum) {
        return Err(Diagnostic::error(
            "E0301",
            format!("`momentum` must be between 0 and 1, found {momentum}"),
            a.span_of("momentum"),
            "out of range",
        ));
    }
    let eps = eps(ev, a, 1e-5)?;
    super::counter::tracked(ev, a)?;
    let inputs = std::iter::once(t).chain(stats).chain(w).chain(b).collect();
    node(
        ev,
        Op::BatchNorm { eps, momentum, has_weight: w.is_some(), has_bias: b.is_some() },
        inputs,
        d,
        s,
        a.span,
    )
}

/// `max(a, b)` of two tensors is NumPy's `maximum`, not a reduction: the second tensor lands
/// in `axis`, whose error then says where the element-wise form is.
fn two_tensors_help(d: Diagnostic, a: &Args, op: ReduceOp) -> Diagnostic {
    let pair = match op {
        ReduceOp::Max => "maximum",
        ReduceOp::Min => "minimum",
        _ => return d,
    };
    match a.get("axis") {
        Some((Value::Tensor(_), _)) => {
            let d = d.with_help(format!(
                "`{}` reduces one tensor over axes; the element-wise {pair} of two tensors is \
                 `{pair}(a, b)`",
                a.name(),
            ));
            // The call's span starts with the callee's name: only that changes.
            let start = a.span.start;
            let callee = Span { end: start + a.name().len() as u32, ..a.span };
            crate::front::replace_with(d, callee, pair)
        }
        _ => d,
    }
}

pub(super) fn dropout(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let p = a.number_or(ev, "p", 0.1)?;
    if !(0.0..1.0).contains(&p) {
        return Err(Diagnostic::error(
            "E0301",
            format!("dropout probability must be in [0, 1), found {p}"),
            a.span_of("p"),
            "out of range",
        ));
    }
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    node(ev, Op::Dropout { p }, vec![t], d, s, a.span)
}
