//! Layer- and RMS-norm weight derivatives spread over rows: `Σ_rows dy·x̂` per column becomes
//! a `NormWeightGradPartial` step (the sum per chunk of rows) and a `Reduce` sum over the
//! chunks. A layer norm's bias derivative, `Σ_rows dy`, becomes a plain `Reduce` (a workgroup
//! per column) for the same reason.
//!
//! Done in one step, a workgroup owns a block of 32 columns and walks every row, recomputing the
//! row's statistics for each block: at Whisper's 1,500 rows × 384 columns that is 12 workgroups
//! on a GPU with 132 SMs, each computing 1,500 rows' statistics in sequence (3.6 ms of its
//! 32.9 ms backward on the H200). Split, each chunk's workgroup computes its rows' statistics
//! once for all columns, and there are as many workgroups as chunks (about two per SM of an
//! H200); the sum over chunks is a short column reduction.

use crate::program::{GpuOp, Program};
use mgn_ir::op::{GradPart, Op, ReduceOp};
use mgn_ir::DType;

/// Rows per chunk at least this many (a chunk's statistics cost a few barriers per row); plans
/// with no more rows than this keep the one-step derivative.
const MIN_CHUNK: usize = 8;
/// About as many chunks as it takes to give every SM of a large GPU (an H200: 132) two.
const CHUNKS: usize = 264;

/// Rows per chunk for a derivative over `rows` rows, or None to leave it as one step.
fn chunk_for(rows: usize) -> Option<usize> {
    (rows > MIN_CHUNK).then(|| rows.div_ceil(CHUNKS).max(MIN_CHUNK))
}

/// Splits every norm weight derivative over more than `MIN_CHUNK` rows, and turns every such
/// layer-norm bias derivative into a column sum.
pub(super) fn split_norm_weight_grads(program: &mut Program) {
    for id in program.order().to_vec() {
        let s = program.step(id);
        let (eps, center) = match s.op {
            GpuOp::Plan(Op::LayerNormGrad {
                eps,
                part: GradPart::Weight,
                has_weight: true,
                ..
            }) => (eps, true),
            GpuOp::Plan(Op::RmsNormGrad { eps, part: GradPart::Weight, has_weight: true }) => {
                (eps, false)
            }
            GpuOp::Plan(Op::LayerNormGrad { part: GradPart::Bias, has_bias: true, .. }) => {
                (0.0, false)
            }
            _ => continue,
        };
        // Malformed steps are left for the kernel generator to report.
        let (Some(&x), Some(&dy)) = (s.inputs.first(), s.inputs.last()) else { continue };
        let (Some(xs), Some(dys)) = (program.get(x), program.get(dy)) else { continue };
        let Some(&d) = xs.shape.last() else { continue };
        if xs.shape != dys.shape
            || s.shape != [d]
            || s.dtype != DType::F32
            || xs.dtype != DType::F32
            || d == 0
        {
            continue;
        }
        let rows = xs.shape.iter().product::<usize>() / d;
        let Some(chunk) = chunk_for(rows) else { continue };
        if matches!(s.op, GpuOp::Plan(Op::LayerNormGrad { part: GradPart::Bias, .. })) {
            // Σ dy over every axis but the last: a reduction with a workgroup per column.
            let axes = (0..dys.shape.len() - 1).collect();
            let step = program.step_mut(id);
            step.op = GpuOp::Plan(Op::Reduce { op: ReduceOp::Sum, axes, keepdim: false });
            step.inputs = vec![dy];
        } else {
            let partial = GpuOp::NormWeightGradPartial { eps, center, chunk };
            let sum = Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false };
            program.split(id, partial, vec![x, dy], vec![rows.div_ceil(chunk), d], sum.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{GpuPlan, StepId};
    use crate::test_util::{step, values};
    use mgn_ir::op::{BinaryOp, UnaryOp};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::tensor::Tensor;

    fn split(p: &Plan) -> GpuPlan {
        let mut program = Program::new(p);
        split_norm_weight_grads(&mut program);
        program.to_gpu_plan()
    }

    /// A layer norm's three derivatives and an RMS norm's weight derivative over 37 rows of 70
    /// (chunks of 8, the last one short), a layer norm over too few rows to split, and a reader
    /// of a split derivative.
    fn plan() -> Plan {
        let f = DType::F32;
        let (x, w) = ([37, 70], [70]);
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &x), // 0
            step(Op::Input { name: "w".into() }, vec![], f, &w), // 1
            step(Op::Input { name: "b".into() }, vec![], f, &w), // 2
            step(Op::Unary(UnaryOp::Tanh), vec![0], f, &x),      // 3: dy
            step(
                Op::LayerNormGrad {
                    eps: 1e-5,
                    has_weight: true,
                    has_bias: true,
                    part: GradPart::Input,
                },
                vec![0, 1, 2, 3],
                f,
                &x,
            ), // 4
            step(
                Op::LayerNormGrad {
                    eps: 1e-5,
                    has_weight: true,
                    has_bias: true,
                    part: GradPart::Weight,
                },
                vec![0, 1, 2, 3],
                f,
                &w,
            ), // 5
            step(
                Op::LayerNormGrad {
                    eps: 1e-5,
                    has_weight: true,
                    has_bias: true,
                    part: GradPart::Bias,
                },
                vec![0, 1, 2, 3],
                f,
                &w,
            ), // 6
            step(
                Op::RmsNormGrad { eps: 1e-6, has_weight: true, part: GradPart::Weight },
                vec![0, 1, 3],
                f,
                &w,
            ), // 7
            step(Op::Binary(BinaryOp::Add), vec![5, 7], f, &w),  // 8
            step(Op::Input { name: "s".into() }, vec![], f, &[4, 70]), // 9
            step(
                Op::LayerNormGrad {
                    eps: 1e-5,
                    has_weight: true,
                    has_bias: false,
                    part: GradPart::Weight,
                },
                vec![9, 1, 9],
                f,
                &w,
            ), // 10
        ];
        Plan::of_steps(
            Mode::Train,
            steps,
            vec![("x".into(), 0), ("w".into(), 1), ("b".into(), 2), ("s".into(), 9)],
            vec![
                ("dx".into(), 4),
                ("dw".into(), 5),
                ("db".into(), 6),
                ("drms".into(), 7),
                ("sum".into(), 8),
                ("small".into(), 10),
            ],
        )
    }

    #[test]
    fn weight_derivatives_over_many_rows_split_into_chunks_and_a_sum() {
        let p = plan();
        let q = split(&p);
        q.validate().expect("a valid plan");
        assert_eq!(q.steps.len(), p.steps.len() + 2);
        let sum = GpuOp::Plan(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false });
        let bias = q.position(StepId(6)).expect("the bias derivative is kept");
        assert_eq!(q.steps[bias].op, sum);
        assert_eq!(q.steps[bias].inputs, [3], "dy");
        let partials: Vec<usize> = (0..q.steps.len())
            .filter(|&i| matches!(q.steps[i].op, GpuOp::NormWeightGradPartial { .. }))
            .collect();
        assert_eq!(
            partials.len(),
            2,
            "the layer norm's and the RMS norm's weight derivatives; not the 4-row one"
        );
        for (&i, made_for) in partials.iter().zip([5, 7]) {
            assert_eq!(q.steps[i].shape, [5, 70], "37 rows in chunks of 8");
            assert_eq!((q.ids[i].0 >= 11, q.origins[i]), (true, StepId(made_for)));
            let reader = &q.steps[i + 1];
            assert_eq!((reader.op.clone(), q.ids[i + 1]), (sum.clone(), StepId(made_for)));
            assert_eq!(reader.inputs, [i as u32]);
        }
        assert_eq!(
            q.steps[partials[0]].op,
            GpuOp::NormWeightGradPartial { eps: 1e-5, center: true, chunk: 8 }
        );
        assert_eq!(
            q.steps[partials[1]].op,
            GpuOp::NormWeightGradPartial { eps: 1e-6, center: false, chunk: 8 }
        );
        // Every step of the compiled plan is still computed, under its own number.
        let kept: Vec<u32> = q.ids.iter().map(|id| id.0).filter(|&id| id < 11).collect();
        assert_eq!(kept, (0..p.steps.len() as u32).collect::<Vec<_>>());
    }

    #[test]
    fn the_split_plan_computes_what_the_plan_does_on_the_cpu() {
        let p = plan();
        let q = split(&p);
        let given = [
            (
                "x",
                Tensor::f32(
                    vec![37, 70],
                    values(37 * 70, 1).into_iter().map(|v| 3.0 * v + 0.5).collect(),
                ),
            ),
            ("w", Tensor::f32(vec![70], values(70, 2))),
            ("b", Tensor::f32(vec![70], values(70, 3))),
            ("s", Tensor::f32(vec![4, 70], values(4 * 70, 4))),
        ];
        let given: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (*n, t)).collect();
        let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
        let got = crate::test_util::run_reference(&q, &[], &given);
        for ((name, a), (_, b)) in want.outputs.iter().zip(&got.outputs) {
            let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{name}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn few_rows_stay_one_step() {
        assert_eq!(chunk_for(8), None);
        assert_eq!(chunk_for(9), Some(8));
        assert_eq!(chunk_for(1500), Some(8));
        assert_eq!(chunk_for(10_000), Some(38));
    }
}
