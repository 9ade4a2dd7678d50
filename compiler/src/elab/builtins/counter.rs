//! `batch_norm(…, tracked = self.num_batches_tracked)`: a buffer that counts the training steps
//! run, as PyTorch's BatchNorm counts `num_batches_tracked`. No step reads or writes it: the plan
//! lists it (`Graph::counters`, in every plan, so a checkpoint lacking it loads) and the session
//! adds one to it after every training step, so a checkpoint holds the count PyTorch's would.

use super::args::Args;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, Op};
use mgn_syntax::Diagnostic;

/// Records the optional `tracked` argument of `batch_norm` as a counter, once however often
/// the layer runs: the session counts steps, not calls.
pub(super) fn tracked(ev: &mut Evaluator, a: &Args) -> R<()> {
    let Some((t, at)) = a.opt_tensor(ev, "tracked")? else { return Ok(()) };
    let Op::Param { index } = ev.graph.node(t).op else {
        let d = Diagnostic::error(
            "E0203",
            "`tracked` of `batch_norm` must be a `buffer` field",
            at,
            "not a buffer",
        )
        .with_help("declare it as `num_batches_tracked = buffer i64[] init zeros`");
        return Err(ev.origin_label(d, &Value::Tensor(t), at, "it was"));
    };
    let p = &ev.graph.params[index];
    if p.kind() != "buffer" {
        return Err(Diagnostic::error(
            "E0203",
            "`tracked` of `batch_norm` must be a `buffer` field",
            at,
            "not a buffer",
        )
        .with_label(p.span, format!("declared as a `{}` here", p.kind()))
        .with_help("a step count is saved state, never trained: `buffer i64[] init zeros`"));
    }
    if !p.dtype.is_int() || p.numel() != 1 {
        return Err(Diagnostic::error(
            "E0202",
            format!(
                "`tracked` of `batch_norm` counts steps in an integer scalar, found `{}` {}",
                p.name,
                fmt_type(p.dtype, &p.shape)
            ),
            at,
            "not an integer scalar",
        )
        .with_label(p.span, "declared here")
        .with_help("declare it as PyTorch does: `num_batches_tracked = buffer i64[] init zeros`"));
    }
    if !ev.graph.counters.contains(&index) {
        ev.graph.counters.push(index);
        ev.counter_sites.push(at);
    }
    Ok(())
}
