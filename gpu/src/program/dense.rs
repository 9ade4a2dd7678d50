//! [`GpuPlan`]: the GPU program at dense positions, what the memory plan, the schedule, the
//! kernels and the session index.

use super::{GpuOp, Program, Step, StepId};
use mgn_ir::analysis::Dataflow;
use mgn_ir::infer::Ty;
use mgn_ir::op::Op;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::{Mode, ParamSpec, Plan};

/// A GPU program with its steps at positions `0..n` in execution order; `inputs` of a step
/// and the plan's inputs and results name positions. Built by [`Program::to_gpu_plan`] once
/// the rewrites are done (`rewrite::for_gpu`), or from a plan as compiled ([`GpuPlan::of`]).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuPlan {
    pub model: String,
    pub mode: Mode,
    pub params: Vec<ParamSpec>,
    pub optimizer: OptimizerSpec,
    pub steps: Vec<Step<u32>>,
    /// Per position: the step's id. A dropout step's id is its mask key (`DropoutGrad::forward`
    /// names the same id).
    pub ids: Vec<StepId>,
    /// Per position: the compiled step it computes, or was inserted for.
    pub origins: Vec<StepId>,
    pub inputs: Vec<(String, u32)>,
    pub outputs: Vec<(String, u32)>,
    pub loss: Option<u32>,
    /// Training plans: (parameter index, position of its gradient).
    pub grads: Vec<(usize, u32)>,
    /// (parameter index, position of the value that replaces it once the run is over): the
    /// plan's `state_writes`. These values are results, so they live to the end of the run.
    pub state_writes: Vec<(usize, u32)>,
    /// The plan's dynamic loss scaling (training updates skip steps whose gradients are not
    /// finite).
    pub loss_scaling: Option<mgn_ir::precision::LossScaling>,
}

impl GpuPlan {
    /// `plan` as compiled, without the GPU's rewrites (for memory reports of compiled plans).
    pub fn of(plan: &Plan) -> GpuPlan {
        Program::new(plan).to_gpu_plan()
    }

    /// The position of the step with id `id`.
    pub fn position(&self, id: StepId) -> Option<usize> {
        self.ids.iter().position(|&i| i == id)
    }

    /// How messages name the step at `pos`: by its compiled step number, and an inserted step
    /// by its op and the compiled step it was made for.
    pub fn step_name(&self, pos: usize) -> String {
        let (id, origin) = (self.ids[pos], self.origins[pos]);
        if id == origin {
            format!("step {}", id.0)
        } else {
            format!("`{}` made for step {}", self.steps[pos].op.describe(), origin.0)
        }
    }

    /// The element type and shape of the value at position `pos`.
    fn ty(&self, pos: usize) -> Ty<'_> {
        (self.steps[pos].dtype, &self.steps[pos].shape)
    }

    /// Structural checks of what the rewrites made: inputs computed before their readers,
    /// every plan op typed by its rule and the GPU's own ops' input counts, dropout derivatives
    /// naming an earlier dropout, results in range.
    pub fn validate(&self) -> Result<(), String> {
        if self.ids.len() != self.steps.len() || self.origins.len() != self.steps.len() {
            return Err("the step ids do not match the steps".into());
        }
        for (i, s) in self.steps.iter().enumerate() {
            let name = || self.step_name(i);
            if let Some(&bad) = s.inputs.iter().find(|&&x| x as usize >= i) {
                return Err(format!("{} reads position {bad}, not computed before it", name()));
            }
            let types: Vec<Ty> = s.inputs.iter().map(|&x| self.ty(x as usize)).collect();
            s.op.check(&types, self.ty(i)).map_err(|e| format!("{}: {e}", name()))?;
            if let GpuOp::Plan(Op::DropoutGrad { forward, .. }) = s.op {
                let ok = self.position(StepId(forward)).is_some_and(|f| {
                    f < i && matches!(self.steps[f].op, GpuOp::Plan(Op::Dropout { .. }))
                });
                if !ok {
                    return Err(format!(
                        "{} derives step {forward}, not an earlier dropout",
                        name()
                    ));
                }
            }
            if let GpuOp::Plan(Op::Param { index }) = s.op {
                if index >= self.params.len() {
                    return Err(format!("{} names parameter {index}", name()));
                }
            }
        }
        let n = self.steps.len() as u32;
        if let Some(v) = self.inputs.iter().map(|(_, v)| *v).chain(self.results()).find(|&v| v >= n)
        {
            return Err(format!("position {v} is named but there are {n} steps"));
        }
        self.validate_state_writes()
    }

    /// Each state write replaces a parameter by a value of its exact type (the session copies
    /// words, so a mismatch would write past the parameter or leave part of it stale).
    fn validate_state_writes(&self) -> Result<(), String> {
        for &(p, v) in &self.state_writes {
            let spec = self.params.get(p).ok_or_else(|| {
                format!("a state write names parameter {p}, but there are {}", self.params.len())
            })?;
            let s = &self.steps[v as usize];
            if s.dtype != spec.dtype || s.shape != spec.shape {
                return Err(format!(
                    "`{}` is {}{:?}, but {} written into it is {}{:?}",
                    spec.name,
                    spec.dtype,
                    spec.shape,
                    self.step_name(v as usize),
                    s.dtype,
                    s.shape
                ));
            }
        }
        Ok(())
    }
}

impl Dataflow for GpuPlan {
    fn len(&self) -> usize {
        self.steps.len()
    }

    fn inputs(&self, step: usize) -> impl Iterator<Item = u32> + '_ {
        self.steps[step].inputs.iter().copied()
    }

    /// Outputs, loss, gradients and the values written into state: the copy into the
    /// parameter comes after the last step, so nothing may reuse their words before it.
    fn results(&self) -> Vec<u32> {
        let outputs = self.outputs.iter().map(|(_, v)| *v);
        let grads = self.grads.iter().map(|(_, v)| *v);
        let state = self.state_writes.iter().map(|(_, v)| *v);
        outputs.chain(self.loss).chain(grads).chain(state).collect()
    }
}
