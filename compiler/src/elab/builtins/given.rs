//! `given(x)`: whether an optional parameter was given. An optional parameter left out can be
//! passed on to another optional parameter but not used as a value, so code that must act
//! differently without it (add a mask only when there is one) asks first.

use super::args::Args;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use mgn_syntax::Diagnostic;

/// True unless the one argument is an optional parameter left out or an absent conditional
/// field (the call machinery makes those "not given").
pub(super) fn given(_: &mut Evaluator, a: &Args) -> R<Value> {
    if a.written != 1 {
        return Err(Diagnostic::error(
            "E0401",
            format!("`given` takes one argument, found {}", a.written),
            a.span,
            "in this call",
        )
        .with_help("ask about one optional parameter: `given(mask)`"));
    }
    Ok(Value::Bool(a.get("x").is_some()))
}

#[cfg(test)]
mod tests;
