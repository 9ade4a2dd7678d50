//! Runs of a dynamic plan (`Plan::dynamic`, `mgnc build --dynamic`): a run's sizes are read
//! off its inputs, and the plan at those sizes (`Plan::at`, validated) is made once and kept
//! for the next runs, the few most recent ones. The session's own plan stays the plan at the
//! bound: its memory check covers every size.

use super::*;
use std::sync::Arc;

/// How many plans at other sizes a session keeps (as many as a GPU session keeps of its own).
const KEEP: usize = 64;

/// The plan at one set of sizes, the last reader of each of its values, and how each of its
/// steps runs on the CPU.
pub(super) struct SizedPlan {
    pub plan: Plan,
    pub last_use: Vec<usize>,
    pub fused: Vec<mgn_cpu::fused::Fused>,
}

/// The plans a session made at other sizes, most recently used last.
#[derive(Default)]
pub(super) struct SizedPlans(Vec<(Vec<usize>, Arc<SizedPlan>)>);

impl Session {
    /// The dynamic sizes a run with these inputs has: `None` for a static plan, an error
    /// naming the input and the allowed range when a shape is outside it.
    pub fn sizes_of(&self, inputs: &[(&str, &Tensor)]) -> Result<Option<Vec<usize>>, RuntimeError> {
        let Some(d) = &self.plan.dynamic else { return Ok(None) };
        let shapes: Vec<(&str, &[usize])> =
            inputs.iter().map(|(n, t)| (*n, t.shape.as_slice())).collect();
        d.sizes_of(&self.plan, &shapes).map(Some).map_err(RuntimeError::Failed)
    }

    /// The plan a run with these inputs executes: `None` for the session's own (a static
    /// plan, or a dynamic one at its bound), else the plan at the inputs' sizes.
    pub(super) fn sized_plan(
        &mut self,
        inputs: &[(&str, &Tensor)],
    ) -> Result<Option<Arc<SizedPlan>>, RuntimeError> {
        let Some(sizes) = self.sizes_of(inputs)? else { return Ok(None) };
        if self.plan.dynamic.as_ref().is_some_and(|d| d.bound() == sizes) {
            return Ok(None);
        }
        let kept = &mut self.sized.0;
        if let Some(k) = kept.iter().position(|(s, _)| *s == sizes) {
            let entry = kept.remove(k);
            kept.push(entry);
        } else {
            let plan = self.plan.at(&sizes).map_err(|e| {
                RuntimeError::Failed(format!("`{}` cannot run {e}", self.plan.model))
            })?;
            let last_use = mgn_ir::analysis::DefUse::of(&plan).last_uses();
            let fused = mgn_cpu::fused::fusions(&plan);
            if kept.len() == KEEP {
                kept.remove(0);
            }
            kept.push((sizes, Arc::new(SizedPlan { plan, last_use, fused })));
        }
        Ok(kept.last().map(|(_, p)| p.clone()))
    }
}
