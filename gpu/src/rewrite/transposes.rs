//! Matrix products read transposed operands in place: a permute that swaps the last two axes
//! of a product's operand becomes a flag of the product (`GpuOp::MatMulT`'s `ta`/`tb`, or a
//! flagged `MatMulEpilogue`), and a permute nothing else reads goes away.
//!
//! Autodiff writes every product's derivatives with transposes (`da = dy·bᵀ`, `db = aᵀ·dy`), so
//! a training plan has about two per linear layer — Whisper's has 82 permute dispatches, each a
//! full copy. The tiled matmul kernel reads either operand transposed at the same speed
//! (`kernels/matmul/tiled.rs`), so the copies are pure cost.

use crate::program::{GpuOp, Program, StepId};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;

/// Whether `perm` swaps the last two axes and keeps the others.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2
        && perm[r - 2] == r - 1
        && perm[r - 1] == r - 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

/// The input of `id` when it is a float permute swapping its last two axes.
fn transposed_source(program: &Program, id: StepId) -> Option<StepId> {
    let s = program.step(id);
    match &s.op {
        GpuOp::Plan(Op::Permute { perm }) if s.dtype.is_float() && swaps_last_two(perm) => {
            Some(s.inputs[0])
        }
        _ => None,
    }
}

/// Folds the transposes products read into the products (see the module header).
pub(super) fn fold_transposes(program: &mut Program) {
    let mut folded: Vec<StepId> = Vec::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let (ta, tb) = match &s.op {
            GpuOp::Plan(Op::MatMul) => (false, false),
            GpuOp::MatMulEpilogue { ta, tb, .. } => (*ta, *tb),
            GpuOp::MatMulT { ta, tb, .. } => (*ta, *tb),
            _ => continue,
        };
        // Only 2-D and batched operands: a 1-D operand is promoted, not transposed.
        let mut flags = [ta, tb];
        let mut inputs = s.inputs.clone();
        for k in 0..2 {
            if let Some(src) = transposed_source(program, inputs[k]) {
                folded.push(inputs[k]);
                inputs[k] = src;
                flags[k] = !flags[k];
            }
        }
        if inputs == s.inputs {
            continue;
        }
        let s = program.step_mut(id);
        s.inputs = inputs;
        s.op = match std::mem::replace(&mut s.op, GpuOp::Plan(Op::MatMul)) {
            GpuOp::MatMulEpilogue { program, .. } => {
                GpuOp::MatMulEpilogue { program, ta: flags[0], tb: flags[1] }
            }
            GpuOp::MatMulT { alpha, splits, .. } => {
                GpuOp::MatMulT { ta: flags[0], tb: flags[1], alpha, splits }
            }
            _ => GpuOp::MatMulT { ta: flags[0], tb: flags[1], alpha: 1.0, splits: 1 },
        };
    }
    remove_unread(program, &folded);
}

/// Removes the steps of `candidates` that nothing reads any more and that are not results.
fn remove_unread(program: &mut Program, candidates: &[StepId]) {
    if candidates.is_empty() {
        return;
    }
    let view = program.to_gpu_plan();
    let def_use = DefUse::of(&view);
    let dead: Vec<StepId> = (0..view.steps.len())
        .filter(|&p| def_use.readers[p].is_empty() && !def_use.result[p])
        .map(|p| view.ids[p])
        .filter(|id| candidates.contains(id))
        .collect();
    program.remove(&dead);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_rewrite_keeps_results, step, values};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;

    #[test]
    fn only_swaps_of_the_last_two_axes_fold() {
        assert!(swaps_last_two(&[1, 0]) && swaps_last_two(&[0, 1, 3, 2]));
        assert!(!swaps_last_two(&[0, 1]) && !swaps_last_two(&[1, 0, 2]));
        assert!(!swaps_last_two(&[2, 1, 0]) && !swaps_last_two(&[0]));
    }

    /// A linear layer's derivatives as autodiff writes them: `dx = dy·w`, `dwᵀ = xᵀ·dy` through
    /// permutes, one of them also a result, and a batched product of a transposed operand.
    #[test]
    fn products_read_their_transposes_in_place() {
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[2, 5, 3]), // 0
            step(Op::Input { name: "dy".into() }, vec![], f, &[2, 5, 4]), // 1
            step(Op::Input { name: "w".into() }, vec![], f, &[4, 3]),    // 2
            step(Op::Permute { perm: vec![0, 2, 1] }, vec![0], f, &[2, 3, 5]), // 3: xᵀ
            step(Op::MatMul, vec![3, 1], f, &[2, 3, 4]),                 // 4: xᵀ·dy
            step(Op::Permute { perm: vec![1, 0] }, vec![2], f, &[3, 4]), // 5: wᵀ, also a result
            step(Op::MatMul, vec![1, 2], f, &[2, 5, 3]),                 // 6: dy·w
            step(Op::MatMul, vec![0, 5], f, &[2, 5, 4]),                 // 7: x·wᵀ
            step(Op::Permute { perm: vec![0, 2, 1] }, vec![1], f, &[2, 4, 5]), // 8: dyᵀ
            step(Op::MatMul, vec![8, 0], f, &[2, 4, 3]),                 // 9: dyᵀ·x
        ];
        let inputs = vec![("x".into(), 0), ("dy".into(), 1), ("w".into(), 2)];
        let outputs: Vec<(String, u32)> =
            [4, 5, 6, 7, 9].iter().map(|&i| (format!("y{i}"), i)).collect();
        let plan = Plan::of_steps(Mode::Train, steps, inputs, outputs);
        plan.validate().expect("valid");
        let mut program = Program::new(&plan);
        fold_transposes(&mut program);
        let folded = program.to_gpu_plan();
        folded.validate().expect("still valid");
        let permutes =
            folded.steps.iter().filter(|s| matches!(s.op, GpuOp::Plan(Op::Permute { .. })));
        assert_eq!(permutes.count(), 1, "wᵀ stays (a result); xᵀ and dyᵀ go");
        let flags: Vec<(bool, bool)> = folded
            .steps
            .iter()
            .filter_map(|s| match s.op {
                GpuOp::MatMulT { ta, tb, .. } => Some((ta, tb)),
                _ => None,
            })
            .collect();
        assert_eq!(flags, [(true, false), (false, true), (true, false)]);

        let x = Tensor::f32(vec![2, 5, 3], values(30, 1));
        let dy = Tensor::f32(vec![2, 5, 4], values(40, 2));
        let w = Tensor::f32(vec![4, 3], values(12, 3));
        let given = [("x", &x), ("dy", &dy), ("w", &w)];
        assert_rewrite_keeps_results(&plan, folded, &given);
    }
}
