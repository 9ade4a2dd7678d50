//! Weight derivatives over a batch as one product: autodiff writes a linear layer's weight
//! derivative over `[B, T, ·]` activations as `sum_to(xᵀ·dy)` — B products of `[m, n]`, a
//! `[B, m, n]` value, and a sum — then transposes it into the weight's `[n, m]` layout. The
//! batch items' rows lie one after another, so the same derivative is one product over `B·T`
//! rows: `dyᵀ·x` read in place, straight into the weight's layout. MiniLM's training plan makes
//! 36 such derivatives in three dispatches each, and keeps a `[8, 384, 384]` value for each.
//!
//! Two rules, in order:
//! - `sum_to(op(a)·op(b))` over every batch axis of a `MatMulT` with `a` stored transposed
//!   (`[..B, k, m]`), `b` not (`[..B, k, n]`), equal batch axes and no other reader → one
//!   `MatMulT` of the operands viewed as `[B·k, m]` and `[B·k, n]`;
//! - `permute [1, 0]` of a 2-D `MatMulT` product nothing else reads → the product of the
//!   swapped operands, `(op(a)·op(b))ᵀ = op(b)ᵀ·op(a)ᵀ`, so the weight's layout costs nothing.

use crate::program::{GpuOp, Program, Step, StepId};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;

/// Readers of each step by id, and whether it is a result.
fn readers(program: &Program) -> impl Fn(StepId) -> (usize, bool) {
    let view = program.to_gpu_plan();
    let def_use = DefUse::of(&view);
    let mut by_id = std::collections::HashMap::new();
    for (p, id) in view.ids.iter().enumerate() {
        by_id.insert(*id, (def_use.readers[p].len(), def_use.result[p]));
    }
    move |id| by_id.get(&id).copied().unwrap_or((0, true))
}

/// Folds batched weight derivatives and their transposes (see the module header).
pub(super) fn fold_batch_grads(program: &mut Program) {
    let read = readers(program);
    let mut dead = Vec::new();
    for id in program.order().to_vec() {
        if let Some(product) = batch_sum(program, id, &read) {
            dead.push(product);
        }
    }
    program.remove(&dead);
    let read = readers(program);
    let mut dead = Vec::new();
    for id in program.order().to_vec() {
        if let Some(product) = transposed_product(program, id, &read) {
            dead.push(product);
        }
    }
    program.remove(&dead);
}

/// The first rule at `id` (a `SumTo`); the product it replaced, now unread.
fn batch_sum(
    program: &mut Program,
    id: StepId,
    read: &impl Fn(StepId) -> (usize, bool),
) -> Option<StepId> {
    let s = program.step(id);
    if !matches!(s.op, GpuOp::Plan(Op::SumTo)) || s.shape.len() != 2 {
        return None;
    }
    let product = s.inputs[0];
    let p = program.step(product);
    let GpuOp::MatMulT { ta: true, tb: false, alpha, splits: 1 } = p.op else { return None };
    if read(product) != (1, false) {
        return None;
    }
    let (a, b) = (program.step(p.inputs[0]), program.step(p.inputs[1]));
    let r = a.shape.len();
    let batch = &a.shape[..r.saturating_sub(2)];
    if r < 3 || b.shape.len() != r || &b.shape[..r - 2] != batch || p.shape[r - 2..] != s.shape[..]
    {
        return None;
    }
    let rows = batch.iter().product::<usize>() * a.shape[r - 2];
    let (m, n) = (a.shape[r - 1], b.shape[r - 1]);
    let (a_id, b_id, loc) = (p.inputs[0], p.inputs[1], s.loc.clone());
    let view = |program: &mut Program, of: StepId, cols: usize| {
        let step = Step {
            op: GpuOp::Plan(Op::Reshape),
            inputs: vec![of],
            dtype: program.step(of).dtype,
            shape: vec![rows, cols],
            loc: loc.clone(),
        };
        program.insert_before(id, step)
    };
    let (a2, b2) = (view(program, a_id, m), view(program, b_id, n));
    let s = program.step_mut(id);
    s.op = GpuOp::MatMulT { ta: true, tb: false, alpha, splits: 1 };
    s.inputs = vec![a2, b2];
    Some(product)
}

/// The second rule at `id` (a 2-D transpose); the product it replaced, now unread.
fn transposed_product(
    program: &mut Program,
    id: StepId,
    read: &impl Fn(StepId) -> (usize, bool),
) -> Option<StepId> {
    let s = program.step(id);
    let GpuOp::Plan(Op::Permute { perm }) = &s.op else { return None };
    if perm[..] != [1, 0] {
        return None;
    }
    let product = s.inputs[0];
    let p = program.step(product);
    let GpuOp::MatMulT { ta, tb, alpha, splits: 1 } = p.op else { return None };
    if p.shape.len() != 2 || read(product) != (1, false) {
        return None;
    }
    let (a, b) = (p.inputs[0], p.inputs[1]);
    let s = program.step_mut(id);
    s.op = GpuOp::MatMulT { ta: !tb, tb: !ta, alpha, splits: 1 };
    s.inputs = vec![b, a];
    Some(product)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_rewrite_keeps_results, step, values};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;

    /// A linear layer's weight derivative as autodiff writes it at batch 3: `xᵀ·dy` per batch
    /// item, summed, transposed into the weight's layout.
    #[test]
    fn a_batched_weight_derivative_becomes_one_product() {
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[3, 5, 4]),
            step(Op::Input { name: "dy".into() }, vec![], f, &[3, 5, 6]),
            step(Op::Permute { perm: vec![0, 2, 1] }, vec![0], f, &[3, 4, 5]),
            step(Op::MatMul, vec![2, 1], f, &[3, 4, 6]),
            step(Op::SumTo, vec![3], f, &[4, 6]),
            step(Op::Permute { perm: vec![1, 0] }, vec![4], f, &[6, 4]),
        ];
        let inputs = vec![("x".into(), 0), ("dy".into(), 1)];
        let plan = Plan::of_steps(Mode::Train, steps, inputs, vec![("dw".into(), 5)]);
        plan.validate().expect("valid");
        let gpu = crate::rewrite::for_gpu(&plan);
        gpu.validate().expect("valid GPU plan");
        let ops: Vec<String> = gpu.steps.iter().map(|s| s.op.describe()).collect();
        assert!(
            !ops.iter().any(|o| o.starts_with("sum_to") || o.starts_with("permute")),
            "{ops:?}"
        );
        let products: Vec<&GpuOp> = gpu
            .steps
            .iter()
            .map(|s| &s.op)
            .filter(|o| matches!(o, GpuOp::MatMulT { .. }))
            .collect();
        assert_eq!(products.len(), 1, "{ops:?}");

        let x = Tensor::f32(vec![3, 5, 4], values(60, 1));
        let dy = Tensor::f32(vec![3, 5, 6], values(90, 2));
        let given = [("x", &x), ("dy", &dy)];
        assert_rewrite_keeps_results(&plan, gpu, &given);
    }
}
