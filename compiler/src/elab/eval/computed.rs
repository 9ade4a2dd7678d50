//! `init <tensor expression>`: a field whose initial value is a table computed from constants
//! (sinusoid position tables, position ids, masks). The expression is elaborated like any
//! other, into nodes of the model's graph; the nodes it needs become the plan's
//! `InitSpec::Computed` program, which sessions run once on the host when they create the
//! tensor. In the model's own graph those nodes are dead, so lowering drops them.

use super::*;
use crate::graph::to_steps;

impl<'p> Evaluator<'p> {
    /// The program that computes `node` as the initial value of a field declared `ty`.
    pub(super) fn computed_init(
        &mut self,
        node: NodeId,
        (dtype, shape): (DType, &[usize]),
        ty: &TensorType,
        e: &Expr,
    ) -> R<InitSpec> {
        let live = mgn_ir::analysis::needed(&self.graph, [node.0]);
        let reads = self.graph.nodes.iter().zip(&live).find_map(|(n, &l)| {
            let what = match &n.op {
                _ if !l => return None,
                Op::Input { name } => format!("input `{name}`"),
                Op::Param { index } => {
                    format!("`{}`", self.graph.params.get(*index).map_or("", |p| &p.name))
                }
                Op::Dropout { .. } => "random numbers (`dropout`)".to_string(),
                _ => return None,
            };
            Some((what, n.span))
        });
        if let Some((what, at)) = reads {
            let mut d = Diagnostic::error(
                "E0201",
                format!(
                    "an `init` must be computed from constants alone, but this one reads {what}"
                ),
                e.span,
                "not a constant",
            );
            if at != e.span {
                d = d.with_label(at, "read here");
            }
            return Err(d.with_help(
                "a field's initial value cannot depend on inputs or other fields; compute it from \
                 numbers, `arange` and the model's arguments",
            ));
        }
        let n = self.graph.node(node);
        if n.dtype != dtype || n.shape != shape {
            return Err(Diagnostic::error(
                "E0205",
                format!(
                    "this `init` computes {}, but the field is declared {}",
                    fmt_type(n.dtype, &n.shape),
                    fmt_type(dtype, shape)
                ),
                e.span,
                fmt_type(n.dtype, &n.shape),
            )
            .with_label(ty.span, "declared here"));
        }
        let (steps, _) = to_steps(&self.graph, &live, &self.prog.sources);
        Ok(InitSpec::Computed(steps))
    }
}
