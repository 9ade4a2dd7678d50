//! Initializers (`normal`, `uniform`; `zeros`, `ones`, `constant` are in the table).

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::InitSpec;
use mgn_syntax::Diagnostic;

// ---- initializers ---------------------------------------------------------------------------

pub(super) fn normal(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let mean = a.number_or(ev, "mean", 0.0)?;
    let std = a.number_or(ev, "std", 1.0)?;
    if !(std >= 0.0 && std.is_finite() && mean.is_finite()) {
        return Err(Diagnostic::error(
            "E0301",
            format!("`normal` needs a finite mean and std >= 0, found std = {std}"),
            a.span,
            "invalid",
        ));
    }
    Ok(Value::Init(InitSpec::Normal { mean, std }))
}

pub(super) fn uniform(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let low = a.number_or(ev, "low", -1.0)?;
    let high = a.number_or(ev, "high", 1.0)?;
    if !(low <= high && low.is_finite() && high.is_finite()) {
        return Err(Diagnostic::error(
            "E0301",
            format!("`uniform` needs low <= high, found {low} and {high}"),
            a.span,
            "invalid range",
        ));
    }
    Ok(Value::Init(InitSpec::Uniform { low, high }))
}
