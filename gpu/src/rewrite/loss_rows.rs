//! Cross-entropy losses spread over rows: `SoftmaxCrossEntropy` (the mean over rows of
//! `logsumexp − logit[target]`) becomes `CrossEntropyRows` (one term per row, a workgroup each)
//! and a `Reduce` mean.
//!
//! As one step the loss is one workgroup walking every row in turn — it has to, to sum them
//! without atomics: SmolLM2's 128 rows of 49,152 logits took 4.0 ms of its 62.5 ms forward +
//! backward on the H200, on one SM. Its derivative already runs a workgroup per row.

use crate::program::{GpuOp, Program};
use mgn_ir::op::{Op, ReduceOp};
use mgn_ir::DType;

/// Splits every f32 cross-entropy loss over more than one row.
pub(super) fn split_cross_entropy(program: &mut Program) {
    for id in program.order().to_vec() {
        let s = program.step(id);
        if s.op != GpuOp::Plan(Op::SoftmaxCrossEntropy)
            || s.inputs.len() != 2
            || s.dtype != DType::F32
            || !s.shape.is_empty()
        {
            continue;
        }
        let Some(targets) = program.get(s.inputs[1]) else { continue };
        let rows: usize = targets.shape.iter().product();
        if rows > 1 {
            let mean = Op::Reduce { op: ReduceOp::Mean, axes: vec![0], keepdim: false };
            let inputs = s.inputs.clone();
            program.split(id, GpuOp::CrossEntropyRows, inputs, vec![rows], mean.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::StepId;
    use crate::test_util::{check_on_both, step, values};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::tensor::Tensor;

    /// A loss over 2 × 3 rows of 7 classes read by an output, and one over a single row.
    fn plan() -> Plan {
        let (f, i) = (DType::F32, DType::I32);
        let steps = vec![
            step(Op::Input { name: "logits".into() }, vec![], f, &[2, 3, 7]), // 0
            step(Op::Input { name: "t".into() }, vec![], i, &[2, 3]),         // 1
            step(Op::SoftmaxCrossEntropy, vec![0, 1], f, &[]),                // 2
            step(Op::Input { name: "one".into() }, vec![], f, &[1, 7]),       // 3
            step(Op::Input { name: "t1".into() }, vec![], i, &[1]),           // 4
            step(Op::SoftmaxCrossEntropy, vec![3, 4], f, &[]),                // 5
        ];
        Plan {
            loss: Some(2),
            ..Plan::of_steps(
                Mode::Train,
                steps,
                vec![("logits".into(), 0), ("t".into(), 1), ("one".into(), 3), ("t1".into(), 4)],
                vec![("loss".into(), 2), ("single".into(), 5)],
            )
        }
    }

    #[test]
    fn losses_over_rows_become_row_terms_and_a_mean() {
        let p = plan();
        let mut program = Program::new(&p);
        split_cross_entropy(&mut program);
        let q = program.to_gpu_plan();
        q.validate().expect("a valid plan");
        assert_eq!(q.steps.len(), p.steps.len() + 1, "the one-row loss stays");
        assert_eq!(q.steps[2].op, GpuOp::CrossEntropyRows);
        assert_eq!(
            (q.steps[2].inputs.as_slice(), q.steps[2].shape.as_slice()),
            (&[0, 1][..], &[6][..])
        );
        let mean = Op::Reduce { op: ReduceOp::Mean, axes: vec![0], keepdim: false };
        assert_eq!(q.steps[3].op, GpuOp::Plan(mean));
        assert_eq!(q.steps[3].inputs, [2]);
        assert_eq!(q.loss, Some(3));
        let ids: Vec<u32> = q.ids.iter().map(|id| id.0).collect();
        assert_eq!(ids, [0, 1, 6, 2, 3, 4, 5]);
        assert_eq!(q.origins[2], StepId(2), "the row terms are made for the loss");

        let logits =
            Tensor::f32(vec![2, 3, 7], values(42, 9).into_iter().map(|v| 8.0 * v).collect());
        let given = [
            ("logits", logits),
            ("t", Tensor::i32(vec![2, 3], vec![0, 6, 3, 3, 1, 5])),
            ("one", Tensor::f32(vec![1, 7], values(7, 3))),
            ("t1", Tensor::i32(vec![1], vec![2])),
        ];
        let given: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (*n, t)).collect();
        let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
        let got = crate::test_util::run_reference(&q, &[], &given);
        for ((n, a), (_, b)) in want.outputs.iter().zip(&got.outputs) {
            let (a, b) = (a.to_f64_vec()[0], b.to_f64_vec()[0]);
            assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "{n}: {a} vs {b}");
        }
    }

    #[test]
    fn row_terms_on_the_gpu_match_the_cpu() {
        // Rows longer than a workgroup, large logits (the max shift matters) and a 3-D batch.
        let logits =
            Tensor::f32(vec![2, 3, 700], values(4200, 5).into_iter().map(|v| 40.0 * v).collect());
        let targets = Tensor::i32(vec![2, 3], vec![0, 699, 350, 7, 1, 698]);
        check_on_both(&GpuOp::CrossEntropyRows, &[logits, targets], DType::F32, &[6], 1e-5);
    }
}
