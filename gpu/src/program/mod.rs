//! The GPU program: a compiled plan as the GPU runs it, in two forms.
//!
//! [`Program`] is what the rewrites (`rewrite/`) edit. Every step has a stable [`StepId`] — the
//! compiled plan's step number for the steps it had, a fresh number past them for a step a pass
//! inserts — and steps name their inputs by id, so a pass inserts, replaces or removes steps
//! without renumbering any other; the plan's inputs and results, and `DropoutGrad::forward` (a
//! compiled step number), stay valid as they are. No pass removes a result.
//!
//! [`GpuPlan`] is the program once the passes are done, its steps at dense positions `0..n` in
//! execution order: the memory plan, the schedule and the kernels index arrays by position. It
//! keeps each step's id (dropout masks are keyed by it, so both backends draw the same ones)
//! and its origin, the compiled step it computes or was inserted for, which messages name.

mod dense;
pub mod op;
mod typing;

pub use dense::GpuPlan;
pub(crate) use op::{batch_grad_operands, conv_operands, norm_operands};
pub use op::{Elem, GpuOp};
pub(crate) use typing::moments_shape;

use mgn_ir::op::Op;
use mgn_ir::plan::{Plan, SourceLoc};
use mgn_ir::DType;
use serde::{Deserialize, Serialize};

/// A step's stable name (see the module header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StepId(pub u32);

/// One step; `R` is how it names its inputs: a [`StepId`] in a [`Program`], a position in a
/// [`GpuPlan`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step<R> {
    pub op: GpuOp,
    pub inputs: Vec<R>,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub loc: SourceLoc,
}

/// The choices the rewrites make by size — how many k ranges a product is split into, which
/// path an attention takes — by the step each was made for. A dynamic plan's program makes
/// them at the bound and replays them at the other sizes it is made at (`crate::dynamic`),
/// so its steps are the same at every size.
#[derive(Clone, Debug, Default)]
pub struct Choices {
    made: std::cell::RefCell<std::collections::HashMap<(&'static str, StepId), usize>>,
    replay: bool,
}

impl Choices {
    /// These choices, to be made again as they were.
    pub fn replaying(self) -> Choices {
        Choices { replay: true, ..self }
    }
}

/// A compiled plan under the GPU's rewrites (see the module header).
pub struct Program<'p> {
    /// The compiled plan: its parameters, optimizer, inputs and results, which the program
    /// keeps as they are.
    plan: &'p Plan,
    /// Every step ever made, by id; `None` once removed.
    slots: Vec<Option<Step<StepId>>>,
    /// By id: the compiled step it computes (itself) or was inserted for.
    origins: Vec<StepId>,
    /// The live steps in execution order.
    order: Vec<StepId>,
    choices: Choices,
}

impl<'p> Program<'p> {
    /// `plan` as compiled: every step runs its own op and keeps its number as its id.
    pub fn new(plan: &'p Plan) -> Program<'p> {
        let slots = plan
            .steps
            .iter()
            .map(|s| {
                Some(Step {
                    op: GpuOp::Plan(s.op.clone()),
                    inputs: s.inputs.iter().map(|&x| StepId(x)).collect(),
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    loc: s.loc.clone(),
                })
            })
            .collect();
        let ids: Vec<StepId> = (0..plan.steps.len() as u32).map(StepId).collect();
        let mut program =
            Program { plan, slots, origins: ids.clone(), order: ids, choices: Choices::default() };
        program.hold_written_state();
        program
    }

    /// Gives every parameter a state write replaces a `Param` step, inserted first, when no
    /// step reads it: the device holds a parameter only in a `Param` step's words, and without
    /// them the written value would have nowhere to go and `params()` would not return it.
    fn hold_written_state(&mut self) {
        let plan = self.plan;
        for &(p, v) in &plan.state_writes {
            let read = plan.steps.iter().any(|s| s.op == Op::Param { index: p });
            let (Some(spec), Some(&first), false) = (plan.params.get(p), self.order.first(), read)
            else {
                continue;
            };
            let step = Step {
                op: GpuOp::Plan(Op::Param { index: p }),
                inputs: vec![],
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                loc: plan.steps.get(v as usize).map(|s| s.loc.clone()).unwrap_or_default(),
            };
            let id = self.insert_before(first, step);
            // Named by the write it serves, in messages and reports.
            if (v as usize) < plan.steps.len() {
                self.origins[id.0 as usize] = StepId(v);
            }
        }
    }

    /// `plan` as compiled, making its rewrites' choices as `choices` say.
    pub fn with_choices(plan: &'p Plan, choices: Choices) -> Program<'p> {
        Program { choices, ..Program::new(plan) }
    }

    /// The compiled plan this program rewrites.
    pub fn compiled(&self) -> &'p Plan {
        self.plan
    }

    /// The choice `what` for step `id`: `decide()`, unless the choices are replayed and one
    /// was made for this step (then that one). Every pass that chooses by size asks here.
    pub fn choose(&self, what: &'static str, id: StepId, decide: impl FnOnce() -> usize) -> usize {
        let mut made = self.choices.made.borrow_mut();
        if self.choices.replay {
            if let Some(&c) = made.get(&(what, id)) {
                return c;
            }
        }
        let c = decide();
        made.insert((what, id), c);
        c
    }

    /// The choices made so far.
    pub fn choices(&self) -> &Choices {
        &self.choices
    }

    /// The live steps' ids in execution order.
    pub fn order(&self) -> &[StepId] {
        &self.order
    }

    /// The step `id`, unless it was removed or never existed (a malformed reference in a plan
    /// not yet validated).
    pub fn get(&self, id: StepId) -> Option<&Step<StepId>> {
        self.slots.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// The live step `id`.
    ///
    /// # Panics
    /// When `id` was removed: a pass reads only steps of `order()` and their inputs.
    pub fn step(&self, id: StepId) -> &Step<StepId> {
        self.get(id).unwrap_or_else(|| panic!("step {} is not in the program", id.0))
    }

    pub fn step_mut(&mut self, id: StepId) -> &mut Step<StepId> {
        let slot = self.slots.get_mut(id.0 as usize).and_then(Option::as_mut);
        slot.unwrap_or_else(|| panic!("step {} is not in the program", id.0))
    }

    /// Inserts `step` just before the live step `at`, made for `at`'s origin; its new id.
    pub fn insert_before(&mut self, at: StepId, step: Step<StepId>) -> StepId {
        let id = StepId(self.slots.len() as u32);
        let pos = self.order.iter().position(|&o| o == at).expect("`at` is a live step");
        self.slots.push(Some(step));
        self.origins.push(self.origins[at.0 as usize]);
        self.order.insert(pos, id);
        id
    }

    /// Splits step `at` in two: a new f32 step of `op` over `inputs`, of `shape`, inserted just
    /// before it, and `at` itself turned into `then` reading the new step alone — how the row
    /// passes spread one step's work over more workgroups. The new step's id.
    pub fn split(
        &mut self,
        at: StepId,
        op: GpuOp,
        inputs: Vec<StepId>,
        shape: Vec<usize>,
        then: GpuOp,
    ) -> StepId {
        let loc = self.step(at).loc.clone();
        let first = self.insert_before(at, Step { op, inputs, dtype: DType::F32, shape, loc });
        let s = self.step_mut(at);
        s.op = then;
        s.inputs = vec![first];
        first
    }

    /// Removes steps that nothing reads any more (fusion computes them inside their reader).
    pub fn remove(&mut self, ids: &[StepId]) {
        for id in ids {
            self.slots[id.0 as usize] = None;
        }
        let slots = &self.slots;
        self.order.retain(|id| slots[id.0 as usize].is_some());
    }

    /// The program at dense positions (see [`GpuPlan`]). References to a step that is not in
    /// the program (in a plan not yet validated) become `u32::MAX`, which validation refuses.
    pub fn to_gpu_plan(&self) -> GpuPlan {
        let mut at = vec![u32::MAX; self.slots.len()];
        for (pos, id) in self.order.iter().enumerate() {
            at[id.0 as usize] = pos as u32;
        }
        let pos = |id: u32| at.get(id as usize).copied().unwrap_or(u32::MAX);
        let steps = self
            .order
            .iter()
            .map(|&id| {
                let s = self.step(id);
                Step {
                    op: s.op.clone(),
                    inputs: s.inputs.iter().map(|x| pos(x.0)).collect(),
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    loc: s.loc.clone(),
                }
            })
            .collect();
        let p = self.plan;
        GpuPlan {
            model: p.model.clone(),
            mode: p.mode,
            params: p.params.clone(),
            optimizer: p.optimizer.clone(),
            steps,
            ids: self.order.clone(),
            origins: self.order.iter().map(|id| self.origins[id.0 as usize]).collect(),
            inputs: p.inputs.iter().map(|(n, v)| (n.clone(), pos(*v))).collect(),
            outputs: p.outputs.iter().map(|(n, v)| (n.clone(), pos(*v))).collect(),
            loss: p.loss.map(pos),
            grads: p.grads.iter().map(|&(k, v)| (k, pos(v))).collect(),
            state_writes: p.state_writes.iter().map(|&(k, v)| (k, pos(v))).collect(),
            loss_scaling: p.loss_scaling.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::step;
    use mgn_ir::op::{Op, UnaryOp};
    use mgn_ir::plan::Mode;

    /// x → a = neg(x) → b = exp(a) → y = tanh(b) (the output).
    fn plan() -> Plan {
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[4, 3]),
            step(Op::Unary(UnaryOp::Neg), vec![0], f, &[4, 3]),
            step(Op::Unary(UnaryOp::Exp), vec![1], f, &[4, 3]),
            step(Op::Unary(UnaryOp::Tanh), vec![2], f, &[4, 3]),
        ];
        Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 3)])
    }

    #[test]
    fn edits_keep_every_other_id_and_positions_come_at_the_end() {
        let p = plan();
        let mut prog = Program::new(&p);
        let sqrt = GpuOp::Plan(Op::Unary(UnaryOp::Sqrt));
        let first = prog.split(
            StepId(2),
            GpuOp::Plan(Op::Unary(UnaryOp::Abs)),
            vec![StepId(1)],
            vec![4, 3],
            sqrt.clone(),
        );
        assert_eq!(first, StepId(4), "fresh ids follow the compiled plan's");
        prog.remove(&[StepId(1)]);
        // The split step still reads its input by id, though step 1 is gone from the order.
        assert_eq!(prog.order(), &[StepId(0), StepId(4), StepId(2), StepId(3)]);
        assert_eq!(prog.step(StepId(2)).op, sqrt);
        assert_eq!(prog.step(StepId(2)).inputs, [StepId(4)]);
        assert!(prog.get(StepId(1)).is_none());
        prog.step_mut(StepId(4)).inputs = vec![StepId(0)];

        let g = prog.to_gpu_plan();
        g.validate().expect("valid");
        assert_eq!(g.ids, [StepId(0), StepId(4), StepId(2), StepId(3)]);
        assert_eq!(g.origins, [StepId(0), StepId(2), StepId(2), StepId(3)]);
        assert_eq!(g.steps[2].inputs, [1]);
        assert_eq!(g.steps[3].inputs, [2]);
        assert_eq!(g.outputs, [("y".to_string(), 3)]);
        assert_eq!(g.position(StepId(4)), Some(1));
        assert_eq!(g.step_name(2), "step 2");
        assert_eq!(g.step_name(1), "`abs` made for step 2");
    }
}
