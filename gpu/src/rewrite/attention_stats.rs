//! Attention derivatives get their row statistics from a step computed once instead of
//! recomputing them.
//!
//! Without statistics, dk and dv recompute every query row's softmax maximum and sum against
//! all keys once per key tile (`Tk / BK` times the forward's score work; ≈ 94 at Whisper's
//! 1500 positions) and dq once per query tile. Here every set of `AttentionGrad` steps reading
//! the same q, k and mask with the same attributes gets ONE `AttentionStats` step, inserted just
//! before the first of them, and each of them becomes `AttentionGradWithStats` reading it as an
//! extra input; dq and dk also read the forward `Attention` output (`rowdot = dy·out`). A
//! derivative whose forward step is not in the plan (never so in compiled training plans) is
//! left as it is.

use crate::program::{GpuOp, Program, Step, StepId};
use mgn_ir::op::{GradPart, Op};
use mgn_ir::DType;

/// Gives every attention derivative with a forward step the statistics of its (q, k, mask,
/// causal, scale, has_mask), one `AttentionStats` step per distinct set.
pub(super) fn add_attention_stats(program: &mut Program) {
    // The forward attention steps met so far (in order), and the statistics steps made.
    let mut forwards: Vec<(Op, Vec<StepId>, StepId)> = Vec::new();
    let mut made: Vec<(GpuOp, Vec<StepId>, StepId)> = Vec::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let GpuOp::Plan(op) = &s.op else { continue };
        let Op::AttentionGrad { causal, scale, has_mask, part } = *op else {
            if matches!(op, Op::Attention { .. }) {
                forwards.push((op.clone(), s.inputs.clone(), id));
            }
            continue;
        };
        let fwd_arity = 3 + has_mask as usize;
        // Malformed (the kernel generator will say so): as is.
        if s.inputs.len() != fwd_arity + 1 {
            continue;
        }
        let forward_op = Op::Attention { causal, scale, has_mask };
        let Some(&(_, _, forward)) = forwards
            .iter()
            .find(|(op, inputs, _)| *op == forward_op && **inputs == s.inputs[..fwd_arity])
        else {
            continue;
        };
        let op = GpuOp::AttentionStats { causal, scale, has_mask };
        let mut inputs = vec![s.inputs[0], s.inputs[1]];
        if has_mask {
            inputs.push(s.inputs[3]);
        }
        let stats = match made.iter().find(|(o, i, _)| *o == op && *i == inputs) {
            Some(&(_, _, stats)) => stats,
            None => {
                let mut shape = program.step(inputs[0]).shape.clone();
                let Some(last) = shape.last_mut() else { continue };
                *last = 2;
                let step = Step {
                    op: op.clone(),
                    inputs: inputs.clone(),
                    dtype: DType::F32,
                    shape,
                    loc: s.loc.clone(),
                };
                let stats = program.insert_before(id, step);
                made.push((op, inputs, stats));
                stats
            }
        };
        let s = program.step_mut(id);
        s.op = GpuOp::AttentionGradWithStats { causal, scale, has_mask, part };
        s.inputs.push(stats);
        // dv needs no rowdot, so not the forward output either.
        if part != GradPart::V {
            s.inputs.push(forward);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::step;
    use mgn_ir::op::{BinaryOp, UnaryOp};
    use mgn_ir::plan::{Mode, Plan};

    fn grad(causal: bool, part: GradPart) -> Op {
        Op::AttentionGrad { causal, scale: 0.5, has_mask: true, part }
    }

    /// A hand-built training plan: dropout before a masked attention whose three derivatives
    /// share q, k and the mask, one more derivative of v without a forward step (causal), and
    /// a dropout derivative after them.
    fn plan() -> Plan {
        let f = DType::F32;
        let (q, k, v, y) = ([1, 2, 4, 8], [1, 1, 6, 8], [1, 1, 6, 3], [1, 2, 4, 3]);
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &q), // 0
            step(Op::Dropout { p: 0.25 }, vec![0], f, &q),       // 1
            step(Op::Input { name: "k".into() }, vec![], f, &k), // 2
            step(Op::Input { name: "v".into() }, vec![], f, &v), // 3
            step(Op::Input { name: "m".into() }, vec![], f, &[4, 6]), // 4
            step(
                Op::Attention { causal: false, scale: 0.5, has_mask: true },
                vec![1, 2, 3, 4],
                f,
                &y,
            ), // 5
            step(Op::Unary(UnaryOp::Neg), vec![5], f, &y),       // 6: dy
            step(grad(false, GradPart::V), vec![1, 2, 3, 4, 6], f, &v), // 7
            step(grad(false, GradPart::K), vec![1, 2, 3, 4, 6], f, &k), // 8
            step(Op::Binary(BinaryOp::Add), vec![2, 8], f, &k),  // 9
            step(grad(true, GradPart::V), vec![1, 2, 3, 4, 6], f, &v), // 10: no causal forward
            step(grad(false, GradPart::Q), vec![1, 2, 3, 4, 6], f, &q), // 11
            step(Op::DropoutGrad { p: 0.25, forward: 1 }, vec![11], f, &q), // 12
        ];
        Plan {
            loss: Some(6),
            ..Plan::of_steps(
                Mode::Train,
                steps,
                vec![("x".into(), 0), ("k".into(), 2), ("v".into(), 3), ("m".into(), 4)],
                vec![("y".into(), 5), ("dk".into(), 9)],
            )
        }
    }

    #[test]
    fn one_stats_step_per_shared_q_k_mask_and_no_other_step_moves() {
        let p = plan();
        let mut program = Program::new(&p);
        add_attention_stats(&mut program);
        let g = program.to_gpu_plan();
        g.validate().expect("the rewritten program is valid");
        // One statistics step (the first fresh id, 13), before the first derivative of the set.
        let ids: Vec<u32> = program.order().iter().map(|id| id.0).collect();
        assert_eq!(ids, [0, 1, 2, 3, 4, 5, 6, 13, 7, 8, 9, 10, 11, 12]);
        let stats = program.step(StepId(13));
        assert_eq!(stats.op, GpuOp::AttentionStats { causal: false, scale: 0.5, has_mask: true });
        assert_eq!(stats.inputs, [StepId(1), StepId(2), StepId(4)]);
        assert_eq!((stats.shape.as_slice(), stats.dtype), (&[1, 2, 4, 2][..], DType::F32));
        assert_eq!(stats.loc, p.steps[7].loc);
        assert_eq!(g.step_name(7), "`attention_stats scale=0.5` made for step 7");
        // dv reads the statistics; dk and dq the statistics and the forward output (step 5).
        let inputs =
            |i: u32| program.step(StepId(i)).inputs.iter().map(|x| x.0).collect::<Vec<_>>();
        let with_stats = |part| GpuOp::AttentionGradWithStats {
            causal: false,
            scale: 0.5,
            has_mask: true,
            part,
        };
        assert_eq!(program.step(StepId(7)).op, with_stats(GradPart::V));
        assert_eq!(inputs(7), [1, 2, 3, 4, 6, 13]);
        assert_eq!(program.step(StepId(8)).op, with_stats(GradPart::K));
        assert_eq!(inputs(8), [1, 2, 3, 4, 6, 13, 5]);
        assert_eq!(inputs(9), [2, 8]);
        assert_eq!(program.step(StepId(10)).op, GpuOp::Plan(grad(true, GradPart::V)));
        assert_eq!(inputs(10), [1, 2, 3, 4, 6], "no causal forward: as compiled");
        assert_eq!(inputs(11), [1, 2, 3, 4, 6, 13, 5]);
        // Results and the dropout derivative name the same steps; only positions moved.
        assert_eq!(
            program.step(StepId(12)).op,
            GpuOp::Plan(Op::DropoutGrad { p: 0.25, forward: 1 })
        );
        assert_eq!(g.outputs, [("y".to_string(), 5), ("dk".to_string(), 10)]);
        assert_eq!((g.loss, g.inputs.clone()), (Some(6), p.inputs.clone()));
    }

    #[test]
    fn plans_without_attention_derivatives_are_unchanged() {
        let mut p = plan();
        p.steps.truncate(7);
        p.outputs.truncate(1);
        let mut program = Program::new(&p);
        add_attention_stats(&mut program);
        assert_eq!(program.to_gpu_plan(), crate::program::GpuPlan::of(&p));
        // And a derivative that already reads statistics is left alone.
        let p = plan();
        let mut once = Program::new(&p);
        add_attention_stats(&mut once);
        let before = once.to_gpu_plan();
        add_attention_stats(&mut once);
        assert_eq!(once.to_gpu_plan(), before);
    }
}
