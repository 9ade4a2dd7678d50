//! Dropout in an inference plan computes nothing: its readers read its input instead.
//!
//! The memory plan already makes such a dropout a view (no kernel, no words), but a view sits
//! between a step and its reader, and fusion only joins a step to its only reader. BERT's
//! `LayerNorm(dropout(dense(h)) + residual)` then ran the product with its bias, and the
//! residual add as a dispatch of its own, in every layer; read through, the add is the
//! product's epilogue. Training plans keep their dropouts (a derivative names its forward
//! dropout by id, and the mask is drawn per step).

use crate::program::{GpuOp, Program, StepId};
use mgn_ir::analysis::Dataflow;
use mgn_ir::op::Op;
use mgn_ir::plan::Mode;

/// Reads through every dropout of an inference plan that is not itself a result.
pub(super) fn read_through_dropouts(program: &mut Program) {
    let plan = program.compiled();
    if plan.mode != Mode::Infer {
        return;
    }
    let results: Vec<StepId> = plan.results().into_iter().map(StepId).collect();
    let mut through: Vec<(StepId, StepId)> = Vec::new();
    let mut gone = Vec::new();
    for id in program.order().to_vec() {
        // Inputs that were dropouts read what those read (a dropout of a dropout included).
        let s = program.step_mut(id);
        for x in s.inputs.iter_mut() {
            if let Some(&(_, to)) = through.iter().find(|(from, _)| from == x) {
                *x = to;
            }
        }
        let s = program.step(id);
        let (GpuOp::Plan(Op::Dropout { .. }), [x]) = (&s.op, &s.inputs[..]) else { continue };
        let same = program.get(*x).is_some_and(|xs| xs.dtype == s.dtype && xs.shape == s.shape);
        if same && !results.contains(&id) {
            through.push((id, *x));
            gone.push(id);
        }
    }
    program.remove(&gone);
}

#[cfg(test)]
mod tests {
    use crate::program::GpuOp;
    use crate::test_util::step;
    use mgn_ir::op::{BinaryOp, Op};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::{DType, Tensor};

    /// `y = dropout(dropout(x · w + b)) + r`, and `d = dropout(r)` an output of its own.
    fn plan(mode: Mode) -> Plan {
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[2, 4]), // 0
            step(Op::Input { name: "w".into() }, vec![], f, &[4, 3]), // 1
            step(Op::Input { name: "b".into() }, vec![], f, &[3]),    // 2
            step(Op::Input { name: "r".into() }, vec![], f, &[2, 3]), // 3
            step(Op::MatMul, vec![0, 1], f, &[2, 3]),                 // 4
            step(Op::Binary(BinaryOp::Add), vec![4, 2], f, &[2, 3]),  // 5
            step(Op::Dropout { p: 0.1 }, vec![5], f, &[2, 3]),        // 6
            step(Op::Dropout { p: 0.2 }, vec![6], f, &[2, 3]),        // 7
            step(Op::Binary(BinaryOp::Add), vec![7, 3], f, &[2, 3]),  // 8: y
            step(Op::Dropout { p: 0.1 }, vec![3], f, &[2, 3]),        // 9: d
        ];
        let inputs = ["x", "w", "b", "r"].iter().enumerate();
        let inputs = inputs.map(|(i, n)| (n.to_string(), i as u32)).collect();
        Plan::of_steps(mode, steps, inputs, vec![("y".into(), 8), ("d".into(), 9)])
    }

    #[test]
    fn inference_dropouts_are_read_through_and_the_residual_joins_the_product() {
        let p = plan(Mode::Infer);
        let g = crate::rewrite::for_gpu(&p);
        g.validate().expect("valid");
        let dropouts = g.steps.iter().filter(|s| matches!(s.op, GpuOp::Plan(Op::Dropout { .. })));
        assert_eq!(dropouts.count(), 1, "only the output's own stays: {:?}", g.steps);
        // The product, its bias and the residual: one step.
        let y = &g.steps[g.outputs[0].1 as usize];
        let GpuOp::MatMulEpilogue { program, .. } = &y.op else { panic!("{:?}", y.op) };
        assert_eq!(program.len(), 5, "product, b, bias add, r, residual add: {program:?}");
        let rand = |n: usize, s: f32| (0..n).map(|i| ((i as f32 + s) * 0.7).sin()).collect();
        let given = [
            ("x", Tensor::f32(vec![2, 4], rand(8, 1.0))),
            ("w", Tensor::f32(vec![4, 3], rand(12, 2.0))),
            ("b", Tensor::f32(vec![3], rand(3, 3.0))),
            ("r", Tensor::f32(vec![2, 3], rand(6, 4.0))),
        ];
        let given: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (*n, t)).collect();
        let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
        let got = crate::test_util::run_reference(&g, &[], &given);
        for ((n, a), (_, b)) in got.outputs.iter().zip(&want.outputs) {
            crate::test_util::assert_close(&Op::MatMul, a, b, 1e-6);
            assert_eq!(a.shape, b.shape, "{n}");
        }
    }

    #[test]
    fn training_plans_keep_their_dropouts() {
        let g = crate::rewrite::for_gpu(&plan(Mode::Train));
        let dropouts = g.steps.iter().filter(|s| matches!(s.op, GpuOp::Plan(Op::Dropout { .. })));
        assert_eq!(dropouts.count(), 3);
    }
}
