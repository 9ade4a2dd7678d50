//! The last pass: half-typed values (`f16`, `bf16`) where the kernels can take them.
//!
//! Every kernel reads half operands (`kernels::load` unpacks them), but a half result is two
//! elements to a word, and only the per-element kernels write a word's two elements together
//! (`kernels::writes_halves`). Any other step with a half result — a softmax, a norm or a
//! product of a model written in f16 — computes an f32 result and a cast rounds it, which is
//! what the CPU reference computes: an op in f32 from its half operands, its result rounded
//! once. Top-k, which compares its operand's raw words, reads an f32 copy of a half operand.
//!
//! It runs after every other pass, so the steps they made (fused chains, split products and
//! their sums) are legal too. The mixed precision policy makes none of this work: its half
//! values are casts, read by products.

use crate::kernels::writes_halves;
use crate::program::{GpuOp, Program, Step, StepId};
use mgn_ir::op::Op;
use mgn_ir::DType;

/// Gives every step with a half result its kernel cannot write an f32 result and a cast.
pub(super) fn legalize_halves(program: &mut Program) {
    for id in program.order().to_vec() {
        if matches!(program.step(id).op.plan_op(), Some(Op::TopK { .. })) {
            widen_operands(program, id);
        }
        let s = program.step(id);
        if !s.dtype.is_half() || writes_halves(&s.op) {
            continue;
        }
        // `id` keeps its dtype and becomes the cast, so its readers and the results naming it
        // stay as they are; the computation moves to a new f32 step before it.
        let (op, inputs, shape) = (s.op.clone(), s.inputs.clone(), s.shape.clone());
        program.split(id, op, inputs, shape, GpuOp::Plan(Op::Cast));
    }
}

/// Reads of half operands of step `id` go through an f32 copy made just before it.
fn widen_operands(program: &mut Program, id: StepId) {
    for k in 0..program.step(id).inputs.len() {
        let x = program.step(id).inputs[k];
        let xs = program.step(x);
        if !xs.dtype.is_half() {
            continue;
        }
        let cast = Step {
            op: GpuOp::Plan(Op::Cast),
            inputs: vec![x],
            dtype: DType::F32,
            shape: xs.shape.clone(),
            loc: program.step(id).loc.clone(),
        };
        let copy = program.insert_before(id, cast);
        program.step_mut(id).inputs[k] = copy;
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::step;
    use mgn_ir::op::{Op, UnaryOp};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::{DType, Tensor};

    /// `s = softmax(cast(x, f16))`, `y = exp(s)`: a softmax and an exp of f16 values.
    fn plan(h: DType) -> Plan {
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[3, 5]),
            step(Op::Cast, vec![0], h, &[3, 5]),
            step(Op::Softmax { axis: 1, log: false }, vec![1], h, &[3, 5]),
            step(Op::Unary(UnaryOp::Exp), vec![2], h, &[3, 5]),
            step(Op::TopK { k: 2, axis: 1 }, vec![3], DType::I32, &[3, 2]),
        ];
        let outputs = vec![("s".into(), 2), ("y".into(), 3), ("top".into(), 4)];
        Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], outputs)
    }

    #[test]
    fn half_results_of_other_kernels_become_f32_steps_and_casts() {
        for h in [DType::F16, DType::BF16] {
            let p = plan(h);
            let g = crate::rewrite::for_gpu(&p);
            g.validate().expect("valid");
            // The softmax computes in f32 and its step is now the cast; exp writes its own.
            let softmax = g.position(crate::program::StepId(2)).unwrap();
            assert_eq!(g.steps[softmax].op, crate::program::GpuOp::Plan(Op::Cast));
            assert_eq!(g.steps[g.steps[softmax].inputs[0] as usize].dtype, DType::F32);
            let exp = g.position(crate::program::StepId(3)).unwrap();
            assert_eq!(g.steps[exp].dtype, h);
            for s in &g.steps {
                assert!(!s.dtype.is_half() || crate::kernels::writes_halves(&s.op), "{s:?}");
            }
        }
    }

    #[test]
    fn half_values_match_the_cpu_to_one_rounding() {
        for (h, ulp) in [(DType::F16, 2f64.powi(-10)), (DType::BF16, 2f64.powi(-7))] {
            let p = plan(h);
            let values: Vec<f32> = (0..15).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let x = Tensor::f32(vec![3, 5], values);
            let Some(mut gpu) = crate::test_util::open(p.clone(), &[]) else { return };
            let got = gpu.run(&[("x", &x)], 0).expect("runs").outputs;
            let want = crate::test_util::run_on_cpu_plan(&p, &[], &[("x", &x)]).outputs;
            for ((name, g), (_, w)) in got.iter().zip(&want) {
                if name == "top" {
                    assert_eq!(g.to_f64_vec(), w.to_f64_vec(), "top-k of the same halves");
                    continue;
                }
                assert_eq!(g.dtype, h, "{name}");
                // Every value is a half one; an f32 exp or softmax one ulp apart may round to
                // the neighbouring half.
                let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
                for (a, b) in g.iter().zip(&w) {
                    assert!((a - b).abs() <= ulp * b.abs(), "{name} {h}: gpu {a}, cpu {b}");
                }
            }
        }
    }
}
