//! Attention, rotary position embeddings and the fused cross-entropy loss.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, NodeId, Op};
use mgn_ir::shape;
use mgn_ir::shape::attention::{dims as attention_dims, Dims};
use mgn_syntax::{Diagnostic, Span};

// ---- attention ------------------------------------------------------------------------------

pub(super) fn attention(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let qkv = [float_tensor(ev, a, "q")?, float_tensor(ev, a, "k")?, float_tensor(ev, a, "v")?];
    let dims = operands(ev, a, qkv)?;
    let [(q, _), (k, _), (v, _)] = qkv;
    let d = ev.ty(q).0;
    let causal = a.bool_or(ev, "causal", false)?;
    let scale = a.number_or(ev, "scale", 1.0 / (dims.d as f64).sqrt())?;
    let mut inputs = vec![q, k, v];
    let mask = a.opt_tensor(ev, "mask")?;
    if let Some((m, ms)) = mask {
        let (md, msh) = ev.ty(m);
        let fits = md == d && shape::broadcast(msh, &dims.scores).is_ok_and(|b| b == dims.scores);
        if !fits {
            let msg = format!(
                "`attention` mask {} does not broadcast to the scores {}",
                ev.type_str(m),
                fmt_type(d, &dims.scores)
            );
            return Err(Diagnostic::error("E0203", msg, ms, "mask shape").with_help(
                "an additive mask of shape [B, 1, 1, Tk] (0 to keep, a large negative number to \
                 drop) fits every head and query",
            ));
        }
        inputs.push(m);
    }
    let op = Op::Attention { causal, scale, has_mask: mask.is_some() };
    node(ev, op, inputs, d, dims.out(), a.span)
}

/// q `[..B, Hq, Tq, D]`, k `[..B, Hkv, Tk, D]` and v `[..B, Hkv, Tk, Dv]` of one dtype, with
/// `Hkv` dividing `Hq`: each way they can disagree in the user's words, then their sizes.
fn operands(ev: &Evaluator, a: &Args, qkv: [(NodeId, Span); 3]) -> R<Dims> {
    let [(q, qs), (k, ks), (v, vs)] = qkv;
    let d = ev.ty(q).0;
    for (t, s, name) in [(q, qs, "q"), (k, ks, "k"), (v, vs, "v")] {
        if ev.ty(t).1.len() < 3 {
            let msg = format!(
                "`attention` needs `{name}` as [..B, heads, T, D], found {}",
                ev.type_str(t)
            );
            return Err(Diagnostic::error("E0206", msg, s, "too few axes").with_help(
                "split the model dimension into heads first, e.g. with `split_heads` from \
                 std.attention",
            ));
        }
        if ev.ty(t).0 != d {
            let msg = format!(
                "`attention` needs q, k and v of one dtype, found {} and {}",
                d,
                ev.ty(t).0
            );
            return Err(Diagnostic::error("E0202", msg, s, "different dtype"));
        }
    }
    let (sq, sk, sv) = (ev.ty(q).1, ev.ty(k).1, ev.ty(v).1);
    let mismatch =
        |msg: String, span: Span, label: String| Diagnostic::error("E0203", msg, span, label);
    let all = || format!("{}, {} and {}", fmt_type(d, sq), fmt_type(d, sk), fmt_type(d, sv));
    let r = sq.len();
    if sk.len() != r || sv.len() != r {
        let msg = format!("`attention` needs q, k and v of one rank, found {}", all());
        return Err(mismatch(msg, a.span, "ranks differ".into()));
    }
    let batch = &sq[..r - 3];
    if &sk[..r - 3] != batch || &sv[..r - 3] != batch {
        let msg = format!(
            "`attention` batch axes differ: q is {}, k is {}, v is {}",
            fmt_type(d, sq),
            fmt_type(d, sk),
            fmt_type(d, sv)
        );
        return Err(mismatch(msg, ks, "batch axes differ".into()));
    }
    let (hq, dq) = (sq[r - 3], sq[r - 1]);
    let (hk, tk, dk) = (sk[r - 3], sk[r - 2], sk[r - 1]);
    let (hv, tv) = (sv[r - 3], sv[r - 2]);
    if dq != dk {
        let msg = format!("`attention` head size of q ({dq}) and k ({dk}) differ");
        return Err(mismatch(msg, ks, format!("k is {}", fmt_type(d, sk)))
            .with_label(qs, format!("q is {}", fmt_type(d, sq))));
    }
    if hk != hv || tk != tv {
        let msg = format!(
            "`attention` needs k and v with the same heads and length, found {} and {}",
            fmt_type(d, sk),
            fmt_type(d, sv)
        );
        return Err(mismatch(msg, vs, format!("v is {}", fmt_type(d, sv)))
            .with_label(ks, format!("k is {}", fmt_type(d, sk))));
    }
    if hq % hk != 0 {
        let msg =
            format!("`attention`: {hk} key/value heads cannot be shared among {hq} query heads");
        return Err(mismatch(msg, ks, format!("k has {hk} heads"))
            .with_label(qs, format!("q has {hq} heads"))
            .with_help(
                "with grouped KV heads the number of key/value heads must divide the number of \
                 query heads",
            ));
    }
    // Everything the shared rule checks is said above, in the user's words; a disagreement
    // left over is a compiler bug.
    attention_dims(sq, sk, sv).map_err(|e| {
        let msg = format!("internal error: `attention` against the IR's rule: {e}");
        Diagnostic::error("E0999", msg, a.span, "while elaborating this call")
    })
}

pub(super) fn rope(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    if s.len() < 2 || s[s.len() - 1] % 2 != 0 {
        return Err(Diagnostic::error(
            "E0203",
            format!("`rope` needs [.., T, D] with an even D, found {}", fmt_type(d, &s)),
            xs,
            format!("this is {}", fmt_type(d, &s)),
        )
        .with_help("rotary embeddings rotate pairs of features, so the head size must be even"));
    }
    let theta = a.number_or(ev, "theta", 10000.0)?;
    if theta <= 0.0 {
        return Err(Diagnostic::error(
            "E0301",
            "`rope` needs a positive theta",
            a.span_of("theta"),
            "out of range",
        ));
    }
    // An integer offset is part of the op; a tensor one (decoding) is read at run time.
    let (offset, inputs) = match a.get("offset") {
        None => (0, vec![x]),
        Some((Value::Int(i), _)) if *i >= 0 => (*i as usize, vec![x]),
        Some(_) => (0, vec![x, super::window::run_time_start(ev, a, "offset", i64::MAX)?]),
    };
    node(ev, Op::Rope { theta, offset, inverse: false }, inputs, d, s, a.span)
}

pub(super) fn softmax_cross_entropy(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (l, ls) = float_tensor(ev, a, "logits")?;
    let (t, ts) = int_tensor(ev, a, "targets")?;
    let (d, sl) = ev.ty(l);
    let (sl, st) = (sl.to_vec(), ev.ty(t).1.to_vec());
    if sl.is_empty() || st.as_slice() != &sl[..sl.len() - 1] {
        let want =
            if sl.is_empty() { "[..N]".to_string() } else { format!("{:?}", &sl[..sl.len() - 1]) };
        let msg = format!(
            "cross-entropy targets must have the logits' shape without the class axis, {want}, \
             found {}",
            ev.type_str(t)
        );
        return Err(Diagnostic::error("E0203", msg, ts, format!("this is {}", ev.type_str(t)))
            .with_label(ls, format!("logits are {}", fmt_type(d, &sl))));
    }
    let ignore = super::loss::ignore_index(ev, a)?;
    let why = "one weight per class, the logits' last axis";
    let weight = vector_of(ev, a, "weight", sl[sl.len() - 1], d, why)?;
    if weight.is_none() && ignore.is_none() {
        return node(ev, Op::SoftmaxCrossEntropy, vec![l, t], d, vec![], a.span);
    }
    super::loss::weighted(ev, (l, t), weight, ignore, a.span).map(Value::Tensor)
}
