//! Counters (`batch_norm`'s `tracked`) belong to the session: it adds one to each after every
//! training step, so no step of the model may read one, and a forward may not write one.

use super::*;

impl<'p> Evaluator<'p> {
    /// Checks, once the model is elaborated, that nothing reads or writes a counter.
    pub fn check_counters(&self) -> R<()> {
        for (&index, &site) in self.graph.counters.iter().zip(&self.counter_sites) {
            let p = &self.graph.params[index];
            let reader = self.graph.nodes.iter().find(|n| n.inputs.contains(&p.node));
            let written = self.graph.state_writes.iter().find(|(q, _)| *q == index);
            let (verb, what, at) = match (reader, written) {
                (Some(n), _) => ("read", "read", n.user_span),
                (None, Some((_, v))) => ("write", "written", self.graph.node(*v).user_span),
                (None, None) => continue,
            };
            return Err(Diagnostic::error(
                "E0201",
                format!("`{}` counts training steps: no step of the model may {verb} it", p.name),
                at,
                format!("{what} here"),
            )
            .with_label(site, "counted here, by `batch_norm`'s `tracked`")
            .with_note(
                "the session adds one to a counter after every training step; its value is \
                 saved in checkpoints, but no step of the plan sees it",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
