//! Attention, rotary position embeddings and the fused cross-entropy loss.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, Op};
use mgn_ir::shape;
use mgn_syntax::{Diagnostic, Span};

// ---- attention ------------------------------------------------------------------------------

pub(super) fn attention(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (q, qs) = float_tensor(ev, a, "q")?;
    let (k, ks) = float_tensor(ev, a, "k")?;
    let (v, vs) = float_tensor(ev, a, "v")?;
    let (d, sq) = ev.ty(q);
    let (sq, sk, sv) = (sq.to_vec(), ev.ty(k).1.to_vec(), ev.ty(v).1.to_vec());
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
            return Err(Diagnostic::error(
                "E0202",
                format!(
                    "`attention` needs q, k and v of one dtype, found {} and {}",
                    d,
                    ev.ty(t).0
                ),
                s,
                "different dtype",
            ));
        }
    }
    let r = sq.len();
    let mismatch =
        |msg: String, span: Span, label: String| Diagnostic::error("E0203", msg, span, label);
    if sk.len() != r || sv.len() != r {
        return Err(mismatch(
            format!(
                "`attention` needs q, k and v of one rank, found {}, {} and {}",
                fmt_type(d, &sq),
                fmt_type(d, &sk),
                fmt_type(d, &sv)
            ),
            a.span,
            "ranks differ".into(),
        ));
    }
    let batch = &sq[..r - 3];
    if &sk[..r - 3] != batch || &sv[..r - 3] != batch {
        return Err(mismatch(
            format!(
                "`attention` batch axes differ: q is {}, k is {}, v is {}",
                fmt_type(d, &sq),
                fmt_type(d, &sk),
                fmt_type(d, &sv)
            ),
            ks,
            "batch axes differ".into(),
        ));
    }
    let (hq, tq, dq) = (sq[r - 3], sq[r - 2], sq[r - 1]);
    let (hk, tk, dk) = (sk[r - 3], sk[r - 2], sk[r - 1]);
    let (hv, tv, dv) = (sv[r - 3], sv[r - 2], sv[r - 1]);
    if dq != dk {
        return Err(mismatch(
            format!("`attention` head size of q ({dq}) and k ({dk}) differ"),
            ks,
            format!("k is {}", fmt_type(d, &sk)),
        )
        .with_label(qs, format!("q is {}", fmt_type(d, &sq))));
    }
    if hk != hv || tk != tv {
        return Err(mismatch(
            format!(
                "`attention` needs k and v with the same heads and length, found {} and {}",
                fmt_type(d, &sk),
                fmt_type(d, &sv)
            ),
            vs,
            format!("v is {}", fmt_type(d, &sv)),
        )
        .with_label(ks, format!("k is {}", fmt_type(d, &sk))));
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
    let causal = a.bool_or(ev, "causal", false)?;
    let scale = a.number_or(ev, "scale", 1.0 / (dq as f64).sqrt())?;
    let mut inputs = vec![q, k, v];
    let mask = a.opt_tensor(ev, "mask")?;
    if let Some((m, ms)) = mask {
        let (md, msh) = ev.ty(m);
        let scores: Vec<usize> = batch.iter().copied().chain([hq, tq, tk]).collect();
        let fits = md == d && shape::broadcast(msh, &scores).is_ok_and(|b| b == scores);
        if !fits {
            let msg = format!(
                "`attention` mask {} does not broadcast to the scores {}",
                ev.type_str(m),
                fmt_type(d, &scores)
            );
            return Err(Diagnostic::error("E0203", msg, ms, "mask shape").with_help(
                "an additive mask of shape [B, 1, 1, Tk] (0 to keep, a large negative number to \
                 drop) fits every head and query",
            ));
        }
        inputs.push(m);
    }
    let mut out = batch.to_vec();
    out.extend([hq, tq, dv]);
    node(ev, Op::Attention { causal, scale, has_mask: mask.is_some() }, inputs, d, out, a.span)
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
    let offset = a.int_or(ev, "offset", 0)?;
    if offset < 0 || theta <= 0.0 {
        return Err(Diagnostic::error(
            "E0301",
            "`rope` needs a positive theta and a non-negative offset",
            a.span,
            "out of range",
        ));
    }
    node(ev, Op::Rope { theta, offset: offset as usize, inverse: false }, vec![x], d, s, a.span)
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
    node(ev, Op::SoftmaxCrossEntropy, vec![l, t], d, vec![], a.span)
}
