//! Windows at a position known only at run time, the pieces of decoding with a KV cache:
//! `narrow(x, axis, start, length)` reads `length` elements from `start`, and
//! `slice_scatter(x, src, axis, start)` writes `src` there. `start` is an integer (known now)
//! or an integer tensor of one element (an input: the position in the cache). A run-time
//! start is clamped so the window stays inside the axis, as XLA's dynamic slices do; a start
//! known now must already fit.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, NodeId, Op};
use mgn_ir::DType;
use mgn_syntax::Diagnostic;

/// `start` as an `i32[]` node. An integer must lie in `0 ..= limit` (pass `i64::MAX` for no
/// upper limit); a tensor must be an integer tensor of one element.
pub(super) fn run_time_start(ev: &mut Evaluator, a: &Args, name: &str, limit: i64) -> R<NodeId> {
    let span = a.span_of(name);
    match a.get(name) {
        Some((Value::Int(i), _)) => {
            if !(0..=limit).contains(i) {
                let range =
                    if limit == i64::MAX { "≥ 0".into() } else { format!("0 ..= {limit}") };
                return Err(Diagnostic::error(
                    "E0207",
                    format!("`{name}` = {i} is out of range for `{}`", a.name()),
                    span,
                    format!("must be {range}"),
                ));
            }
            checked(ev, Op::Constant { value: *i as f64 }, vec![], DType::I32, vec![], span)
        }
        Some((Value::Tensor(t), _)) => {
            let (d, s) = ev.ty(*t);
            let s = s.to_vec();
            if !d.is_int() || s.iter().product::<usize>() != 1 {
                return Err(Diagnostic::error(
                    "E0202",
                    format!(
                        "`{name}` of `{}` must be an integer or an integer tensor of one \
                         element, found {}",
                        a.name(),
                        fmt_type(d, &s)
                    ),
                    span,
                    format!("this is {}", fmt_type(d, &s)),
                )
                .with_help("a position known at run time is an input such as `pos: i32[]`"));
            }
            let mut t = *t;
            if d != DType::I32 {
                t = checked(ev, Op::Cast, vec![t], DType::I32, s.clone(), span)?;
            }
            if !s.is_empty() {
                t = checked(ev, Op::Reshape, vec![t], DType::I32, vec![], span)?;
            }
            Ok(t)
        }
        _ => Err(a.wrong(ev, name, "an integer or an integer tensor")),
    }
}

/// `narrow(x, axis, start, length)`: `torch.narrow`, `start` possibly known only at run time.
pub(super) fn narrow(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", 0, s.len())?;
    let len = match a.get("length") {
        Some((Value::Int(n), _)) if (1..=s[axis] as i64).contains(n) => *n as usize,
        Some((Value::Int(n), span)) => {
            return Err(Diagnostic::error(
                "E0207",
                format!("`narrow` of {} elements from axis {axis} of size {}", n, s[axis]),
                *span,
                format!("must be 1 ..= {}", s[axis]),
            ))
        }
        _ => return Err(a.wrong(ev, "length", "an integer")),
    };
    let start = run_time_start(ev, a, "start", (s[axis] - len) as i64)?;
    let mut out = s.clone();
    out[axis] = len;
    node(ev, Op::Narrow { axis, len }, vec![t, start], d, out, a.span)
}

/// `slice_scatter(x, src, axis, start)`: `x` with `src` written from `start` along `axis`.
pub(super) fn slice_scatter(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (src, src_span) = a.tensor(ev, "src")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", 0, s.len())?;
    let (sd, ss) = ev.ty(src);
    let ss = ss.to_vec();
    let fits = sd == d
        && ss.len() == s.len()
        && ss[axis] <= s[axis]
        && ss.iter().zip(&s).enumerate().all(|(k, (a, b))| k == axis || a == b);
    if !fits {
        return Err(Diagnostic::error(
            "E0203",
            format!(
                "`slice_scatter` cannot write {} into {} along axis {axis}",
                fmt_type(sd, &ss),
                fmt_type(d, &s)
            ),
            src_span,
            format!("this is {}", fmt_type(sd, &ss)),
        )
        .with_note(
            "`src` needs the dtype and rank of `x`, its sizes off the axis, and no more \
             elements along it",
        ));
    }
    let start = run_time_start(ev, a, "start", (s[axis] - ss[axis]) as i64)?;
    node(ev, Op::SliceScatter { axis }, vec![t, src, start], d, s, a.span)
}
