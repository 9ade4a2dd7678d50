//! `name = tied(p)`: a field that is the parameter (or buffer) `p` itself under a second
//! checkpoint name — tied weights, as GPT-2's `lm_head.weight` is `transformer.wte.weight`.
//! The field's value is `p`'s node, so every use reads the one tensor and its gradients add
//! up in the one parameter; the plan lists the field's path as an alias of `p`
//! (`Plan::aliases`), under which checkpoints may hold it as upstream ones do.

use super::*;
use mgn_ir::plan::ParamAlias;

impl<'p> Evaluator<'p> {
    /// Whether a field initializer is a call of the builtin `tied` (not a binding that hides
    /// it): such a field names a parameter a second time.
    pub(super) fn is_tied_call(&self, e: &Expr) -> bool {
        let ExprKind::Call { callee, .. } = &e.kind else { return false };
        matches!(
            self.prog.resolution.target(callee.span),
            Some(Target::Builtin(b)) if b.name == builtins::TIED
        )
    }

    /// `name = tied(p)` at the field path `path`: `p`'s node, recorded as the alias `path`.
    pub(super) fn tied_field(&mut self, f: &FieldDef, e: &Expr, path: &str) -> R<Value> {
        let ExprKind::Call { callee, args } = &e.kind else {
            unreachable!("is_tied_call checked the call")
        };
        let builtin = self.eval(callee)?;
        let vals = self.eval_args(args)?;
        // The builtin reads the path: outside a field initializer it has none and refuses.
        self.tie_path = Some((path.to_string(), f.name.span));
        let v = self.call(builtin, callee.span, vals, e.span, None);
        self.tie_path = None;
        v
    }

    /// The builtin `tied(param)`: checks that `param` is a saved tensor of the model and
    /// records the field being initialized as its second name.
    pub fn tie(&mut self, (v, at): (Value, Span), span: Span) -> R<Value> {
        let Some((path, field)) = self.tie_path.take() else {
            return Err(Diagnostic::error(
                "E0108",
                "`tied(…)` is used here, outside a field",
                span,
                "not a field's initializer",
            )
            .with_help(
                "`tied` gives a parameter a second checkpoint name, the name of a field: write \
                 the field as `name = tied(p)`; elsewhere, use the parameter itself",
            ));
        };
        let index = match &v {
            Value::Tensor(id) => self.param_of(*id),
            _ => None,
        };
        let Some(index) = index else {
            let what = match &v {
                Value::Tensor(id) if matches!(self.graph.node(*id).op, Op::Input { .. }) => {
                    format!("the input {}", self.type_str(*id))
                }
                Value::Tensor(id) => format!("a tensor {} computed here", self.type_str(*id)),
                other => self.describe(other),
            };
            let d = Diagnostic::error(
                "E0201",
                format!("`tied` needs a parameter or buffer of the model, found {what}"),
                at,
                "not a parameter",
            )
            .with_help(
                "tie the field to a `param` or `buffer` field, e.g. `tied(embed.weight)`: only \
                 a saved tensor has a checkpoint name to share",
            );
            return Err(self.origin_label(d, &v, at, "it was"));
        };
        let p = &self.graph.params[index];
        if !p.persistent {
            return Err(Diagnostic::error(
                "E0201",
                format!(
                    "`tied` needs a parameter or buffer of the model, found the {} field `{}`",
                    p.kind(),
                    p.name
                ),
                at,
                format!("a `{}` field", p.kind()),
            )
            .with_label(p.span, "declared here")
            .with_note(format!(
                "a `{}` field is never saved or loaded, so it has no checkpoint name to share",
                p.kind()
            )));
        }
        let (name, shape, dtype) = (p.name.clone(), p.shape.clone(), p.dtype);
        self.facts.push(Fact {
            span: field,
            kind: FactKind::Param,
            text: format!("`{path}`: {} tied to `{name}`", fmt_type(dtype, &shape)),
        });
        self.graph.aliases.push(ParamAlias { name: path, param: index });
        Ok(v)
    }
}

#[cfg(test)]
mod tests;
