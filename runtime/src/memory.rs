//! What a plan needs in memory, computed from the plan alone: the parameters, and the step
//! values under the session's order (each value is computed at its step and freed after its
//! last reader; results live to the end). `peak_live_bytes` is the most that is alive at once,
//! the lower bound a memory planner that reuses buffers between steps can reach;
//! `logical_bytes` is what one buffer per value, never reused, would take.
//!
//! Bytes are counted at each step's declared dtype (`f32` 4, `bf16` 2, `bool` 1, …), as a GPU
//! buffer holds it, whatever wider storage the CPU backend uses.

use crate::op::Op;
use crate::plan::Plan;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PlanMemory {
    /// Every parameter and buffer of the plan's table (trained, frozen and running statistics).
    pub param_bytes: u64,
    /// The model inputs the plan reads.
    pub input_bytes: u64,
    /// The inputs plus every computed step's value: the total without any reuse. Parameters are
    /// not included (they are `param_bytes`).
    pub logical_bytes: u64,
    /// The most input and step-value bytes alive at once; during a step, its inputs and its
    /// result are all alive.
    pub peak_live_bytes: u64,
}

/// Bytes of one step's value at its declared dtype.
pub fn step_bytes(plan: &Plan, step: usize) -> u64 {
    let s = &plan.steps[step];
    s.shape.iter().map(|&d| d as u64).product::<u64>() * s.dtype.size_bytes() as u64
}

pub fn plan_memory(plan: &Plan) -> PlanMemory {
    let param_bytes = plan.params.iter().map(|p| p.numel() as u64 * p.dtype.size_bytes() as u64).sum();
    let last_use = plan.last_uses();
    let mut m = PlanMemory { param_bytes, ..Default::default() };
    let mut live = vec![false; plan.steps.len()];
    let mut now = 0u64;
    for (i, s) in plan.steps.iter().enumerate() {
        match s.op {
            Op::Param { .. } => {}
            Op::Input { .. } => {
                m.input_bytes += step_bytes(plan, i);
                m.logical_bytes += step_bytes(plan, i);
                live[i] = true;
                now += step_bytes(plan, i);
            }
            _ => {
                m.logical_bytes += step_bytes(plan, i);
                live[i] = true;
                now += step_bytes(plan, i);
            }
        }
        m.peak_live_bytes = m.peak_live_bytes.max(now);
        for &x in &s.inputs {
            let x = x as usize;
            if last_use[x] == i && live[x] {
                live[x] = false;
                now -= step_bytes(plan, x);
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{BinaryOp, InitSpec, UnaryOp};
    use crate::optim::OptimizerSpec;
    use crate::plan::{Mode, ParamSpec, SourceLoc, Step};
    use crate::DType;

    #[test]
    fn peak_counts_what_is_alive_together() {
        let step = |op, inputs: Vec<u32>, shape: Vec<usize>| Step { op, inputs, dtype: DType::F32, shape, loc: SourceLoc::default() };
        let plan = Plan {
            model: "M".into(),
            mode: Mode::Infer,
            config: vec![],
            params: vec![ParamSpec { name: "w".into(), dtype: DType::F32, shape: vec![100], init: InitSpec::Constant(1.0), trainable: true, frozen: false }],
            steps: vec![
                step(Op::Input { name: "x".into() }, vec![], vec![100]),   // 400 B, last read by step 2
                step(Op::Param { index: 0 }, vec![], vec![100]),           // counted as a parameter
                step(Op::Binary(BinaryOp::Add), vec![0, 1], vec![100]),    // 400 B: x + w
                step(Op::Unary(UnaryOp::Relu), vec![2], vec![100]),        // 400 B; step 2 freed after
                step(Op::Unary(UnaryOp::Neg), vec![3], vec![10, 10]),      // 400 B, the output
            ],
            inputs: vec![("x".into(), 0)],
            outputs: vec![("y".into(), 4)],
            loss: None,
            grads: vec![],
            optimizer: OptimizerSpec::default(),
        };
        let m = plan_memory(&plan);
        assert_eq!(m.param_bytes, 400);
        assert_eq!(m.input_bytes, 400);
        assert_eq!(m.logical_bytes, 1600);
        // Step 2 holds x and x + w (800); then x is freed; step 3 holds x + w and relu (800).
        assert_eq!(m.peak_live_bytes, 800);
    }
}
