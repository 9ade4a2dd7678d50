//! The GPU session's one plan rewrite: attention derivatives get their row statistics from a
//! step computed once instead of recomputing them.
//!
//! Without statistics, dk and dv recompute every query row's softmax maximum and sum against
//! all keys once per key tile (`Tk / BK` times the forward's score work; ≈ 94 at Whisper's
//! 1500 positions) and dq once per query tile. Here every set of `AttentionGrad` steps reading
//! the same q, k and mask with the same attributes gets ONE `AttentionStats` step, inserted just
//! before the first of them, and each of them reads it as an extra input; dq and dk also read
//! the forward `Attention` output (`rowdot = dy·out`). A derivative whose forward step is not
//! in the plan (never so in compiled training plans) is left as it is.
//!
//! Compiled plans never contain `AttentionStats`, and the CPU runs them unchanged; dropout
//! masks are keyed by step index, so the session keeps using the original indices for those
//! (the second result of [`add_attention_stats`]).

use mgn_ir::op::{GradPart, Op};
use mgn_ir::plan::{Plan, Step};
use mgn_ir::DType;

/// One inserted statistics step: the original step it goes before, its op and inputs (original
/// indices: q, k, mask?) and shape.
struct Stats {
    before: usize,
    op: Op,
    inputs: Vec<u32>,
    shape: Vec<usize>,
}

/// `plan` with an `AttentionStats` step per set of attention derivatives sharing (q, k, mask,
/// causal, scale, has_mask), and every step reference renumbered (step inputs, the plan's
/// inputs, outputs, loss and gradients, `DropoutGrad::forward`). The second result maps each
/// step of the new plan to its index in `plan` (`u32::MAX` for the inserted steps). A plan
/// without attention derivatives comes back unchanged with the identity map.
pub fn add_attention_stats(plan: &Plan) -> (Plan, Vec<u32>) {
    let n = plan.steps.len();
    let mut groups: Vec<Stats> = Vec::new();
    // Per original step: (its group, the forward output to read too) when it gains inputs.
    let mut extra: Vec<Option<(usize, Option<u32>)>> = vec![None; n];
    for (i, s) in plan.steps.iter().enumerate() {
        let Op::AttentionGrad { causal, scale, has_mask, part } = s.op else { continue };
        let fwd_arity = 3 + has_mask as usize;
        // Already given statistics, or malformed (the kernel generator will say so): as is.
        if s.inputs.len() != fwd_arity + 1 {
            continue;
        }
        let forward_op = Op::Attention { causal, scale, has_mask };
        let Some(forward) = plan.steps[..i]
            .iter()
            .position(|f| f.op == forward_op && f.inputs == s.inputs[..fwd_arity])
        else {
            continue;
        };
        let op = Op::AttentionStats { causal, scale, has_mask };
        let mut inputs = vec![s.inputs[0], s.inputs[1]];
        if has_mask {
            inputs.push(s.inputs[3]);
        }
        let g = match groups.iter().position(|g| g.op == op && g.inputs == inputs) {
            Some(g) => g,
            None => {
                let mut shape = plan.steps[s.inputs[0] as usize].shape.clone();
                let Some(last) = shape.last_mut() else { continue };
                *last = 2;
                groups.push(Stats { before: i, op, inputs, shape });
                groups.len() - 1
            }
        };
        // dv needs no rowdot, so not the forward output either.
        extra[i] = Some((g, (part != GradPart::V).then_some(forward as u32)));
    }
    if groups.is_empty() {
        return (plan.clone(), (0..n as u32).collect());
    }

    let mut steps = Vec::with_capacity(n + groups.len());
    let mut original = Vec::with_capacity(n + groups.len());
    let mut new_of = vec![u32::MAX; n];
    let mut stats_at = vec![u32::MAX; groups.len()];
    for (i, s) in plan.steps.iter().enumerate() {
        for (g, st) in groups.iter().enumerate().filter(|(_, st)| st.before == i) {
            stats_at[g] = steps.len() as u32;
            let inputs = st.inputs.iter().map(|&x| new_of[x as usize]).collect();
            steps.push(Step {
                op: st.op.clone(),
                inputs,
                dtype: DType::F32,
                shape: st.shape.clone(),
                loc: s.loc.clone(),
            });
            original.push(u32::MAX);
        }
        new_of[i] = steps.len() as u32;
        let mut step = s.clone();
        // Inputs come before their reader (Plan::validate), so they are renumbered already;
        // a malformed reference is left for validation to report.
        let renumber =
            |x: u32| new_of.get(x as usize).copied().filter(|&v| v != u32::MAX).unwrap_or(x);
        step.inputs = s.inputs.iter().map(|&x| renumber(x)).collect();
        if let Some((g, forward)) = extra[i] {
            step.inputs.push(stats_at[g]);
            step.inputs.extend(forward.map(renumber));
        }
        if let Op::DropoutGrad { forward, .. } = &mut step.op {
            *forward = renumber(*forward);
        }
        steps.push(step);
        original.push(i as u32);
    }
    (plan.with_steps(steps, |v| new_of.get(v as usize).copied().unwrap_or(v)), original)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::step;
    use mgn_ir::op::{BinaryOp, UnaryOp};
    use mgn_ir::plan::Mode;

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
    fn one_stats_step_per_shared_q_k_mask_and_everything_renumbered() {
        let p = plan();
        let (t, original) = add_attention_stats(&p);
        t.validate().expect("the rewritten plan is valid");
        // One statistics step, before the first derivative of the set (old 7, new 7).
        let u = u32::MAX;
        assert_eq!(original, vec![0, 1, 2, 3, 4, 5, 6, u, 7, 8, 9, 10, 11, 12]);
        assert_eq!(t.steps[7].op, Op::AttentionStats { causal: false, scale: 0.5, has_mask: true });
        assert_eq!(t.steps[7].inputs, vec![1, 2, 4]);
        assert_eq!(t.steps[7].shape, vec![1, 2, 4, 2]);
        assert_eq!(t.steps[7].dtype, DType::F32);
        assert_eq!(t.steps[7].loc, p.steps[7].loc);
        // dv reads the statistics; dk and dq the statistics and the forward output (step 5).
        assert_eq!(t.steps[8].inputs, vec![1, 2, 3, 4, 6, 7]);
        assert_eq!(t.steps[9].inputs, vec![1, 2, 3, 4, 6, 7, 5]);
        assert_eq!(t.steps[10].inputs, vec![2, 9]);
        assert_eq!(t.steps[11].inputs, vec![1, 2, 3, 4, 6], "no causal forward: as compiled");
        assert_eq!(t.steps[12].inputs, vec![1, 2, 3, 4, 6, 7, 5]);
        assert_eq!(t.steps[13].op, Op::DropoutGrad { p: 0.25, forward: 1 });
        assert_eq!(t.steps[13].inputs, vec![12]);
        assert_eq!(t.outputs, vec![("y".to_string(), 5), ("dk".to_string(), 10)]);
        assert_eq!(t.loss, Some(6));
        assert_eq!(t.inputs, p.inputs);
        // Every original step is where the map says, unchanged apart from its references.
        for (new, &old) in original.iter().enumerate().filter(|(_, &o)| o != u) {
            assert_eq!(t.steps[new].shape, p.steps[old as usize].shape);
            assert!(t.steps[new].inputs.len() >= p.steps[old as usize].inputs.len());
            assert_eq!(
                std::mem::discriminant(&t.steps[new].op),
                std::mem::discriminant(&p.steps[old as usize].op)
            );
        }
    }

    #[test]
    fn dropout_grad_forward_and_results_follow_the_shift() {
        // A dropout after the inserted step: its derivative's `forward` moves with it.
        let mut p = plan();
        let f = DType::F32;
        p.steps.push(step(Op::Dropout { p: 0.5 }, vec![11], f, &[1, 2, 4, 8])); // 13
        p.steps.push(step(Op::DropoutGrad { p: 0.5, forward: 13 }, vec![13], f, &[1, 2, 4, 8])); // 14
        p.steps.push(step(Op::Param { index: 0 }, vec![], f, &[1, 1, 6, 8])); // 15
        p.params.push(mgn_ir::plan::ParamSpec {
            name: "w".into(),
            dtype: f,
            shape: vec![1, 1, 6, 8],
            init: mgn_ir::plan::InitSpec::Constant(0.0),
            trainable: true,
            frozen: false,
        });
        p.grads = vec![(0, 8)];
        p.outputs.push(("z".into(), 14));
        let (t, original) = add_attention_stats(&p);
        t.validate().expect("valid");
        assert_eq!(t.steps[15].op, Op::DropoutGrad { p: 0.5, forward: 14 });
        assert_eq!(original[14], 13, "the mask key stays the original index");
        assert_eq!(t.outputs[2], ("z".to_string(), 15));
        assert_eq!(t.grads, vec![(0, 9)]);
        assert_eq!(t.steps[16].op, Op::Param { index: 0 });
    }

    #[test]
    fn plans_without_attention_derivatives_are_unchanged() {
        let mut p = plan();
        p.steps.truncate(7);
        p.outputs.truncate(1);
        let (t, original) = add_attention_stats(&p);
        assert_eq!(t, p);
        assert_eq!(original, (0..7).collect::<Vec<u32>>());
        // And a derivative that already reads statistics is left alone.
        let (once, _) = add_attention_stats(&plan());
        let (twice, _) = add_attention_stats(&once);
        assert_eq!(twice, once);
    }
}
