//! `self.field = e` in a forward: the value a `state` (or `buffer`) field holds from the next
//! run on — a KV cache's new contents, running statistics. Every read of the field in this run
//! sees its old value; the plan lists the write (`Plan::state_writes`) and the session applies
//! it once the run is over.

use super::*;

impl<'p> Evaluator<'p> {
    /// Records `self.<field> = value` as a write of the field's tensor.
    pub(super) fn assign(&mut self, field: &Ident, value: &Expr, span: Span) -> R<()> {
        let self_ref = Expr { kind: ExprKind::SelfRef, span: Span { end: span.start + 4, ..span } };
        let target = self.field(&self_ref, field)?;
        let index = match &target {
            Value::Tensor(id) => self.param_of(*id),
            _ => None,
        };
        let writable =
            index.map(|i| &self.graph.params[i]).filter(|p| p.state || p.kind() == "buffer");
        let Some(info) = writable else {
            let what = match index {
                Some(i) => format!("a `{}` field", self.graph.params[i].kind()),
                None => self.describe(&target),
            };
            return Err(Diagnostic::error(
                "E0201",
                format!("`{}` is {what}, which a forward cannot write", field.name),
                field.span,
                "not a `state` or `buffer` field",
            )
            .with_help(format!(
                "declare the tensor it holds as `{} = state f32[..]` to carry it from one run \
                 to the next",
                field.name
            )));
        };
        let (index, name, want) =
            (index.expect("writable"), info.name.clone(), (info.dtype, info.shape.clone()));
        let decl = info.span;
        let v = self.eval(value)?;
        let Value::Tensor(id) = v else {
            return Err(Diagnostic::error(
                "E0201",
                format!("`{}` holds a tensor, not {}", field.name, self.describe(&v)),
                value.span,
                "not a tensor",
            ));
        };
        let n = self.graph.node(id);
        if (n.dtype, &n.shape) != (want.0, &want.1) {
            return Err(Diagnostic::error(
                "E0205",
                format!(
                    "`{}` is {}, but this value is {}",
                    field.name,
                    fmt_type(want.0, &want.1),
                    fmt_type(n.dtype, &n.shape)
                ),
                value.span,
                fmt_type(n.dtype, &n.shape),
            )
            .with_label(decl, "declared here"));
        }
        if self.graph.state_writes.iter().any(|(p, _)| *p == index) {
            return Err(Diagnostic::error(
                "E0106",
                format!("`{name}` is written twice in one run"),
                span,
                "second write",
            )
            .with_help(
                "a layer that writes its state can be called once per run; give each call its \
                 own layer (a `repeat` or a list field)",
            ));
        }
        self.graph.state_writes.push((index, id));
        Ok(())
    }
}
