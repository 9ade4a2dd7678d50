//! Batch norms computed again for the backward pass instead of kept from the forward one.
//!
//! A training plan keeps every activation its backward pass reads, from where the forward pass
//! makes it to where the backward pass last reads it: at the start of the backward pass they
//! are all alive at once, and that is the arena's peak. A batch norm over chunks
//! (`BatchNormWithMoments`) with no input past its own operands — `relu(bn(x))` inside
//! ResNet's bottlenecks — can be made again from what the backward pass keeps anyway: x (its
//! derivative reads it), the moments (likewise) and the parameters. Each such norm that the
//! backward pass reads is computed again just before its first backward reader, which reads
//! the copy; the original dies with its last forward reader. One pass over x and the result
//! per norm buys back the result's words for the length of the network: ResNet-50's training
//! arena at batch 4 loses 59 of its 381 MiB at the peak.
//!
//! A norm with more inputs (a residual sum) is left alone: the residual would have to be kept
//! or made again in turn. The copy updates no running statistics.

use crate::program::{GpuOp, Program, StepId};
use mgn_ir::analysis::DefUse;
use mgn_ir::plan::Mode;

/// Recomputes, for the backward pass, every batch norm over chunks that it reads and that
/// has no input past its operands (see the module header).
pub(super) fn recompute_batch_norms(program: &mut Program) {
    let plan = program.compiled();
    let Some(loss) = plan.loss.filter(|_| plan.mode == Mode::Train) else { return };
    let view = program.to_gpu_plan();
    let Some(backward) = view.position(StepId(loss)) else { return };
    let def_use = DefUse::of(&view);
    let late = |p: usize| -> Vec<usize> {
        def_use.readers[p].iter().map(|&r| r as usize).filter(|&r| r > backward).collect()
    };
    for (p, s) in view.steps.iter().enumerate() {
        let GpuOp::BatchNormWithMoments { norm, recomputed: false, .. } = &s.op else { continue };
        let Ok(operands) = crate::program::norm_operands(norm) else { continue };
        let forward = def_use.readers[p].iter().any(|&r| (r as usize) < backward);
        if s.inputs.len() != operands + 1 || def_use.result[p] || !forward {
            continue;
        }
        // The norm's backward readers, and its casts' and reshapes' (the mixed precision
        // policy's half operands of the products, read in place: `memory::rounded_views`).
        let looks: Vec<usize> = def_use.readers[p]
            .iter()
            .map(|&r| r as usize)
            .filter(|&r| r < backward && is_look(&view.steps[r].op) && !def_use.result[r])
            .collect();
        let direct = late(p);
        let mut firsts = direct.clone();
        firsts.extend(looks.iter().filter_map(|&v| late(v).into_iter().min()));
        let Some(first) = firsts.into_iter().min() else { continue };
        let id = view.ids[p];
        let mut copy = program.step(id).clone();
        if let GpuOp::BatchNormWithMoments { recomputed, .. } = &mut copy.op {
            *recomputed = true;
        }
        let again = program.insert_before(view.ids[first], copy);
        redirect(program, &view.ids, &direct, id, again);
        for v in looks {
            let readers = late(v);
            let Some(&at) = readers.iter().min() else { continue };
            let mut look = program.step(view.ids[v]).clone();
            look.inputs = vec![again];
            let look_again = program.insert_before(view.ids[at], look);
            redirect(program, &view.ids, &readers, view.ids[v], look_again);
        }
    }
}

/// A step that only looks at its input another way: a cast (the half operand of a product)
/// or a reshape.
fn is_look(op: &GpuOp) -> bool {
    matches!(op.plan_op(), Some(mgn_ir::op::Op::Cast | mgn_ir::op::Op::Reshape))
}

/// Points `readers` (positions) that read `from` at `to`.
fn redirect(program: &mut Program, ids: &[StepId], readers: &[usize], from: StepId, to: StepId) {
    for &r in readers {
        for x in &mut program.step_mut(ids[r]).inputs {
            if *x == from {
                *x = to;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_rewrite_keeps_results_within, step, tensor};
    use mgn_ir::op::{BinaryOp, Op, ReduceOp, UnaryOp};
    use mgn_ir::plan::Plan;
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;

    /// relu(batch_norm(x)) read by the loss (directly and through a reshape) and, past the
    /// loss, by a backward step (directly and through the reshape) and the norm's derivative.
    fn plan() -> Plan {
        let f = DType::F32;
        let (x, flat) = ([2, 3, 20, 20], [2, 1200]);
        let bn = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: true, has_bias: true };
        let grad = Op::BatchNormGrad {
            eps: 1e-5,
            has_weight: true,
            has_bias: true,
            part: mgn_ir::op::GradPart::Input,
            training: true,
        };
        let sum = |axes| Op::Reduce { op: ReduceOp::Sum, axes, keepdim: false };
        let mut steps = crate::test_util::batch_norm_input_steps(&x);
        steps.push(step(Op::Input { name: "dy".into() }, vec![], f, &x)); // 5
        steps.push(step(Op::Input { name: "dz".into() }, vec![], f, &flat)); // 6
        steps.push(step(bn, vec![0, 1, 2, 3, 4], f, &x)); // 7
        steps.push(step(Op::Unary(UnaryOp::Relu), vec![7], f, &x)); // 8: y
        steps.push(step(Op::Reshape, vec![8], f, &flat)); // 9
        steps.push(step(sum(vec![1]), vec![9], f, &[2])); // 10
        steps.push(step(sum(vec![0]), vec![10], f, &[])); // 11: the loss
        steps.push(step(Op::Binary(BinaryOp::Mul), vec![8, 5], f, &x)); // 12: backward
        steps.push(step(Op::Binary(BinaryOp::Mul), vec![9, 6], f, &flat)); // 13: backward
        steps.push(step(grad, vec![0, 1, 2, 3, 4, 12], f, &x)); // 14
        let names = ["x", "rm", "rv", "w", "b", "dy", "dz"];
        let inputs = names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect();
        let outputs = ["loss", "g", "h", "dx"].iter().zip([11, 12, 13, 14]);
        let outputs = outputs.map(|(n, i)| (n.to_string(), i)).collect();
        Plan { loss: Some(11), ..Plan::of_steps(Mode::Train, steps, inputs, outputs) }
    }

    fn rewritten(p: &Plan) -> crate::program::GpuPlan {
        let mut program = Program::new(p);
        crate::rewrite::fuse::fuse_elementwise(&mut program);
        crate::rewrite::batch_moments::use_batch_moments(&mut program);
        recompute_batch_norms(&mut program);
        program.to_gpu_plan()
    }

    #[test]
    fn the_backward_pass_reads_a_batch_norm_computed_again() {
        let p = plan();
        let q = rewritten(&p);
        q.validate().expect("a valid plan");
        let norms: Vec<usize> = (0..q.steps.len())
            .filter(|&i| matches!(q.steps[i].op, GpuOp::BatchNormWithMoments { .. }))
            .collect();
        let [first, again] = norms[..] else { panic!("the norm and its copy: {norms:?}") };
        assert!(matches!(q.steps[again].op, GpuOp::BatchNormWithMoments { recomputed: true, .. }));
        let updates = q.steps.iter().filter(|s| s.op.updates_running_stats().is_some());
        assert_eq!(updates.count(), 1, "the copy updates no running statistics");
        let loss = q.position(StepId(11)).expect("the loss");
        assert!(first < loss && loss < again, "{first} {loss} {again}");
        // Past the loss, the product and the reshape's reader read the copy (the latter
        // through a reshape of its own); before it, the original.
        let reads = |id: u32| q.steps[q.position(StepId(id)).unwrap()].inputs.clone();
        assert_eq!(reads(12)[0] as usize, again);
        let reshape = reads(13)[0] as usize;
        assert_eq!((q.steps[reshape].inputs[0] as usize, reshape > loss), (again, true));
        assert_eq!(q.steps[reads(10)[0] as usize].inputs[0] as usize, first);
        let (x, flat) = ([2, 3, 20, 20], [2, 1200]);
        let mut v = crate::test_util::batch_norm_operands(tensor(&x, 1));
        v.extend([tensor(&x, 5), tensor(&flat, 6)]);
        let names = ["x", "rm", "rv", "w", "b", "dy", "dz"];
        let given: Vec<(&str, &Tensor)> = names.into_iter().zip(&v).collect();
        assert_rewrite_keeps_results_within(&p, q, &given, (1e-5, 1e-4));
    }

    #[test]
    fn mgn_recompute_0_keeps_the_norms() {
        let copies = |recompute| {
            let options = crate::rewrite::Options { recompute, ..Default::default() };
            let q = crate::rewrite::for_gpu_with(&plan(), &options);
            let again = |s: &&crate::program::Step<u32>| {
                matches!(s.op, GpuOp::BatchNormWithMoments { recomputed: true, .. })
            };
            q.steps.iter().filter(again).count()
        };
        assert_eq!((copies(true), copies(false)), (1, 0));
    }
}
