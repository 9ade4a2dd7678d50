//! Permutes folded into the steps that make what they permute: a step whose kernel stores each
//! result once at its index (a product, a convolution, a fused chain, a split product's sum, an
//! element-wise step, a slice, a rotary embedding, a whole attention) stores it where the
//! permute would put it instead (`GpuOp::PermutedStore`), and the permute — a copy, a dispatch
//! and a barrier — goes.
//!
//! Multi-head attention permutes q, k and v into heads after their projections and the heads'
//! outputs back before the output projection: four permutes a layer, 6–10% of the transformer
//! forwards' GPU time on the H200, each moving a few hundred KB at a fraction of the copy rate.
//! The permute may read its producer through reshapes (`[B·T, H·D]` seen as `[B, T, H, D]`),
//! which keep the elements' order; a permute of a permuted store composes with it. In training
//! the backward pass has its own: the rotary embedding's derivative of each head's q and k
//! merged back (SmolLM2's training plan 60 permutes, SmolVLA's 48 with its sliced caches).
//! An attention run whole (decoding, short sequences) stores its heads
//! merged, as the score-matrix path's second product already did.
//! Only f32 steps nothing else reads, and only static plans: a dynamic plan's kernels are
//! shared across sizes, and the stored index is written for this one.

use crate::program::{GpuOp, Program, StepId};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;
use mgn_ir::DType;
use std::collections::HashMap;

/// Whether the kernel of `op` stores each result once, through `kernels::store`, at the
/// result's index in its own shape.
fn stores_by_index(op: &GpuOp) -> bool {
    match op {
        // Each of these kernels writes `store(out, i, …)` once per element `i` of its own
        // shape (`kernels::pointwise`, `select::slice`, `select::rope`, and every f32 forward
        // of `kernels::attention`: decoding, blocked and scalar).
        GpuOp::Plan(op) => matches!(
            op,
            Op::MatMul
                | Op::Conv { .. }
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::UnaryGrad(_)
                | Op::Pow { .. }
                | Op::Slice { .. }
                | Op::Rope { .. }
                | Op::Attention { .. }
        ),
        GpuOp::MatMulT { splits, .. } => *splits == 1,
        GpuOp::NormedProduct { op, .. } => stores_by_index(op),
        GpuOp::MatMulEpilogue { .. }
        | GpuOp::ProductPair { .. }
        | GpuOp::RotatedAttention { .. }
        | GpuOp::ConvEpilogue { .. }
        | GpuOp::Fused { .. }
        | GpuOp::SplitSum { .. } => true,
        _ => false,
    }
}

/// Folds every permute it can into the step that makes its input (see the module header).
pub(super) fn fold_permutes(program: &mut Program) {
    let mut readers = readers(program);
    let only_reader =
        |rs: &HashMap<StepId, Vec<StepId>>, x, r| rs.get(&x).is_some_and(|v| v == &[r]);
    let mut gone = Vec::new();
    for id in program.order().to_vec() {
        let p = program.step(id);
        let GpuOp::Plan(Op::Permute { perm }) = &p.op else { continue };
        if p.dtype != DType::F32 {
            continue;
        }
        let (perm, view) = (perm.clone(), program.step(p.inputs[0]).shape.clone());
        // Back through reshapes, each read by the next step alone.
        let (mut x, mut next, mut reshapes) = (p.inputs[0], id, Vec::new());
        while only_reader(&readers, x, next) && program.step(x).op == GpuOp::Plan(Op::Reshape) {
            reshapes.push(x);
            next = x;
            x = program.step(x).inputs[0];
        }
        let s = program.step(x);
        if !only_reader(&readers, x, next) || s.dtype != DType::F32 {
            continue;
        }
        let op = match &s.op {
            // A permute of a permuted store: the two permutations as one.
            GpuOp::PermutedStore { op, shape, view, perm: first } if reshapes.is_empty() => {
                let perm = perm.iter().map(|&a| first[a]).collect();
                GpuOp::PermutedStore {
                    op: op.clone(),
                    shape: shape.clone(),
                    view: view.clone(),
                    perm,
                }
            }
            op if stores_by_index(op) => GpuOp::PermutedStore {
                op: Box::new(op.clone()),
                shape: s.shape.clone(),
                view,
                perm,
            },
            _ => continue,
        };
        let (inputs, loc) = (s.inputs.clone(), s.loc.clone());
        // The producer's inputs are read by the permute's step now.
        for i in &inputs {
            for r in readers.get_mut(i).into_iter().flatten().filter(|r| **r == x) {
                *r = id;
            }
        }
        // The producer's line, where the time goes in a profile.
        let p = program.step_mut(id);
        p.op = op;
        p.inputs = inputs;
        p.loc = loc;
        gone.push(x);
        gone.extend(reshapes);
    }
    program.remove(&gone);
}

/// Every step's readers, by id; a result counts as a reader no step is (`StepId(u32::MAX)`).
pub(super) fn readers(program: &Program) -> HashMap<StepId, Vec<StepId>> {
    let view = program.to_gpu_plan();
    let def_use = DefUse::of(&view);
    let mut readers = HashMap::new();
    for (p, &id) in view.ids.iter().enumerate() {
        let mut r: Vec<StepId> = def_use.readers[p].iter().map(|&q| view.ids[q as usize]).collect();
        if def_use.result[p] {
            r.push(StepId(u32::MAX));
        }
        readers.insert(id, r);
    }
    readers
}

#[cfg(test)]
mod tests {
    use crate::program::GpuOp;
    use crate::rewrite::{for_gpu_with, Options};
    use crate::test_util::{assert_rewrite_keeps_results, step};
    use mgn_ir::op::{BinaryOp, Op, UnaryOp};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;

    /// Head splits of a product with its bias (through a reshape), of a plain product permuted
    /// twice, of an element-wise chain, and a convolution made channels-last; and one product
    /// whose result is also an output, so its permute stays.
    fn plan() -> Plan {
        let f = DType::F32;
        let conv = Op::Conv {
            stride: vec![1, 1],
            padding: vec![1, 1],
            dilation: vec![1, 1],
            groups: 1,
            has_bias: false,
        };
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[2, 5, 12]), // 0
            step(Op::Input { name: "w".into() }, vec![], f, &[12, 12]),   // 1
            step(Op::Input { name: "b".into() }, vec![], f, &[12]),       // 2
            step(Op::Input { name: "img".into() }, vec![], f, &[1, 3, 6, 6]), // 3
            step(Op::Input { name: "k".into() }, vec![], f, &[4, 3, 3, 3]), // 4
            step(Op::MatMul, vec![0, 1], f, &[2, 5, 12]),                 // 5
            step(Op::Binary(BinaryOp::Add), vec![5, 2], f, &[2, 5, 12]),  // 6: x·w + b
            step(Op::Reshape, vec![6], f, &[2, 5, 3, 4]),                 // 7
            step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![7], f, &[2, 3, 5, 4]), // 8
            step(Op::MatMul, vec![0, 1], f, &[2, 5, 12]),                 // 9
            step(Op::Reshape, vec![9], f, &[2, 5, 3, 4]),                 // 10
            step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![10], f, &[2, 3, 5, 4]), // 11
            step(Op::Permute { perm: vec![2, 0, 3, 1] }, vec![11], f, &[5, 2, 4, 3]), // 12
            step(Op::Unary(UnaryOp::Relu), vec![0], f, &[2, 5, 12]),      // 13
            step(Op::Binary(BinaryOp::Mul), vec![13, 0], f, &[2, 5, 12]), // 14
            step(Op::Reshape, vec![14], f, &[2, 5, 6, 2]),                // 15
            step(Op::Permute { perm: vec![1, 0, 3, 2] }, vec![15], f, &[5, 2, 2, 6]), // 16
            step(conv, vec![3, 4], f, &[1, 4, 6, 6]),                     // 17
            step(Op::Permute { perm: vec![0, 2, 3, 1] }, vec![17], f, &[1, 6, 6, 4]), // 18
            step(Op::MatMul, vec![0, 1], f, &[2, 5, 12]),                 // 19: also an output
            step(Op::Reshape, vec![19], f, &[2, 5, 3, 4]),                // 20
            step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![20], f, &[2, 3, 5, 4]), // 21
        ];
        let names = ["x", "w", "b", "img", "k"];
        let inputs = names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect();
        let outputs = [8, 12, 16, 18, 19, 21].iter().map(|&i| (format!("y{i}"), i)).collect();
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
        plan.validate().expect("valid");
        plan
    }

    #[test]
    fn permutes_are_stored_by_the_steps_they_permute() {
        let plan = plan();
        let gpu = for_gpu_with(&plan, &Options::default());
        gpu.validate().expect("still valid");
        let count = |f: &dyn Fn(&GpuOp) -> bool| gpu.steps.iter().filter(|s| f(&s.op)).count();
        let permutes = count(&|op| matches!(op, GpuOp::Plan(Op::Permute { .. })));
        assert_eq!(permutes, 1, "only the permute of a product that is also an output stays");
        assert_eq!(count(&|op| matches!(op, GpuOp::PermutedStore { .. })), 4);
        // The permute of a permuted store composes with it.
        assert!(gpu.steps.iter().any(|s| matches!(&s.op,
            GpuOp::PermutedStore { perm, .. } if perm == &[2, 0, 3, 1].map(|a| [0, 2, 1, 3][a]))));
        // A dynamic plan keeps its permutes.
        let dynamic = for_gpu_with(&plan, &Options { dynamic: true, ..Options::default() });
        assert!(!dynamic.steps.iter().any(|s| matches!(s.op, GpuOp::PermutedStore { .. })));

        let t = crate::test_util::tensor;
        let x = [
            t(&[2, 5, 12], 1),
            t(&[12, 12], 2),
            t(&[12], 3),
            t(&[1, 3, 6, 6], 4),
            t(&[4, 3, 3, 3], 5),
        ];
        let given: Vec<(&str, &Tensor)> = ["x", "w", "b", "img", "k"].into_iter().zip(&x).collect();
        assert_rewrite_keeps_results(&plan, gpu, &given);
    }

    /// The plan ops that store by index: a rotary embedding's derivative merged back into
    /// `[B, T, H, D]` (with a run-time start), a slice seen as heads, GELU channels-last and a
    /// broadcast sum permuted — and a slice read by a second step, whose permute stays.
    fn plan_ops() -> Plan {
        let f = DType::F32;
        let rope = |inverse| Op::Rope { theta: 10000.0, offset: 3, inverse };
        let steps = vec![
            step(Op::Input { name: "q".into() }, vec![], f, &[2, 3, 5, 4]), // 0
            step(Op::Input { name: "pos".into() }, vec![], DType::I32, &[]), // 1
            step(Op::Input { name: "kv".into() }, vec![], f, &[3, 2, 5, 8]), // 2
            step(Op::Input { name: "c".into() }, vec![], f, &[2, 6, 7]),    // 3
            step(Op::Input { name: "b".into() }, vec![], f, &[6, 1]),       // 4
            step(rope(true), vec![0, 1], f, &[2, 3, 5, 4]),                 // 5
            step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![5], f, &[2, 5, 3, 4]), // 6
            step(rope(false), vec![0], f, &[2, 3, 5, 4]),                   // 7
            step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![7], f, &[2, 5, 3, 4]), // 8
            step(Op::Slice { axis: 0, start: 1, end: 2 }, vec![2], f, &[1, 2, 5, 8]), // 9
            step(Op::Reshape, vec![9], f, &[2, 5, 2, 4]),                   // 10
            step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![10], f, &[2, 2, 5, 4]), // 11
            step(Op::Unary(UnaryOp::Gelu), vec![3], f, &[2, 6, 7]),         // 12
            step(Op::Permute { perm: vec![0, 2, 1] }, vec![12], f, &[2, 7, 6]), // 13
            step(Op::Binary(BinaryOp::Add), vec![3, 4], f, &[2, 6, 7]),     // 14
            step(Op::Permute { perm: vec![2, 0, 1] }, vec![14], f, &[7, 2, 6]), // 15
            step(Op::Slice { axis: 0, start: 0, end: 1 }, vec![2], f, &[1, 2, 5, 8]), // 16
            step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![16], f, &[1, 5, 2, 8]), // 17
            step(Op::Unary(UnaryOp::Exp), vec![16], f, &[1, 2, 5, 8]),      // 18: a second reader
        ];
        let names = ["q", "pos", "kv", "c", "b"];
        let inputs = names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect();
        let outputs = [6, 8, 11, 13, 15, 17, 18].iter().map(|&i| (format!("y{i}"), i)).collect();
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
        plan.validate().expect("valid");
        plan
    }

    #[test]
    fn element_wise_steps_slices_and_rotary_embeddings_store_permuted() {
        let plan = plan_ops();
        let gpu = for_gpu_with(&plan, &Options::default());
        gpu.validate().expect("still valid");
        let permuted: Vec<String> = (gpu.steps.iter())
            .filter_map(|s| match &s.op {
                GpuOp::PermutedStore { op, .. } => Some(op.describe()),
                _ => None,
            })
            .collect();
        let permutes = gpu.steps.iter().filter(|s| matches!(s.op, GpuOp::Plan(Op::Permute { .. })));
        assert_eq!(permutes.count(), 1, "the slice with a second reader keeps its permute");
        assert_eq!(permuted.len(), 5, "{permuted:?}");
        for (want, n) in [("rope", 2), ("slice", 1), ("gelu", 1), ("add", 1)] {
            let found = permuted.iter().filter(|d| d.starts_with(want)).count();
            assert_eq!(found, n, "{want}: {permuted:?}");
        }
        let t = crate::test_util::tensor;
        let pos = Tensor::i32(vec![], vec![2]);
        let x = [t(&[2, 3, 5, 4], 1), pos, t(&[3, 2, 5, 8], 2), t(&[2, 6, 7], 3), t(&[6, 1], 4)];
        let names = ["q", "pos", "kv", "c", "b"];
        let given: Vec<(&str, &Tensor)> = names.into_iter().zip(&x).collect();
        assert_rewrite_keeps_results(&plan, gpu, &given);
    }
}
