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
use mgn_ir::analysis::Dataflow;
use mgn_ir::op::Op;
use mgn_ir::plan::Mode;
use mgn_ir::DType;

/// In an inference plan, every cast of a parameter to a half type holds the parameter in that
/// type instead: it becomes a `Param` step, which the session uploads rounded (the cast's value,
/// computed once instead of on every run), and the f32 `Param` step nothing reads any more is
/// dropped — a weight read only by products takes half the memory and no cast kernel; one also
/// read in f32 (a tied embedding: a lookup and the output head) is held both ways. A training
/// plan's parameters change every step, so they keep their f32 master copy and their casts.
pub(super) fn hold_params_as_halves(program: &mut Program) {
    let plan = program.compiled();
    if plan.mode != Mode::Infer {
        return;
    }
    let results: Vec<StepId> = plan.results().into_iter().map(StepId).collect();
    let written: Vec<usize> = plan.state_writes.iter().map(|&(p, _)| p).collect();
    let order = program.order().to_vec();
    let mut held = Vec::new();
    for &id in &order {
        let s = program.step(id);
        let (true, true, [x]) = (s.op == GpuOp::Plan(Op::Cast), s.dtype.is_half(), &s.inputs[..])
        else {
            continue;
        };
        let xs = program.step(*x);
        let GpuOp::Plan(Op::Param { index }) = xs.op else { continue };
        if xs.dtype != DType::F32 || written.contains(&index) {
            continue;
        }
        held.push(*x);
        let s = program.step_mut(id);
        s.op = GpuOp::Plan(Op::Param { index });
        s.inputs.clear();
    }
    let read: std::collections::HashSet<StepId> =
        program.order().iter().flat_map(|&id| program.step(id).inputs.clone()).collect();
    let unread: Vec<StepId> =
        held.into_iter().filter(|p| !read.contains(p) && !results.contains(p)).collect();
    program.remove(&unread);
}

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
    use crate::program::GpuOp;
    use crate::test_util::{half_product as product, step};
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
    fn an_inference_plan_holds_weights_read_through_half_casts_as_halves() {
        for h in [DType::F16, DType::BF16] {
            let p = product(h, Mode::Infer);
            let g = crate::rewrite::for_gpu(&p);
            g.validate().expect("valid");
            let holders = |g: &crate::program::GpuPlan| -> Vec<DType> {
                let param = GpuOp::Plan(Op::Param { index: 0 });
                g.steps.iter().filter(|s| s.op == param).map(|s| s.dtype).collect()
            };
            assert_eq!(holders(&g), [h], "held as halves alone");
            assert_eq!(g.steps.len(), 4, "its cast is gone: {:?}", g.steps);
            // Also read in f32 (a tied embedding), it is held both ways.
            let mut tied = product(h, Mode::Infer);
            tied.steps.push(step(
                Op::Reduce { op: mgn_ir::op::ReduceOp::Sum, axes: vec![0, 1], keepdim: false },
                vec![1],
                DType::F32,
                &[],
            ));
            tied.outputs.push(("s".into(), 5));
            assert_eq!(holders(&crate::rewrite::for_gpu(&tied)), [DType::F32, h]);
            // A training plan keeps the f32 master copy and casts it every step.
            let t = crate::rewrite::for_gpu(&product(h, Mode::Train));
            assert_eq!((holders(&t), t.steps.len()), (vec![DType::F32], 5));

            let x = Tensor::f32(vec![2, 4], (0..8).map(|i| i as f32 * 0.3 - 1.0).collect());
            let wv = Tensor::f32(vec![4, 3], (0..12).map(|i| 1.0 / (i as f32 + 3.0)).collect());
            let Some(mut gpu) = crate::test_util::open(p.clone(), std::slice::from_ref(&wv)) else {
                return;
            };
            let got = gpu.run(&[("x", &x)], 0).expect("runs").outputs;
            let want =
                crate::test_util::run_on_cpu_plan(&p, std::slice::from_ref(&wv), &[("x", &x)])
                    .outputs;
            crate::test_util::assert_close(&Op::MatMul, &got[0].1, &want[0].1, 1e-6);
            // Read back, the parameter has its own type and the values the products used.
            let back = gpu.params().expect("reads").remove(0).expect("held");
            assert_eq!(back.dtype, DType::F32);
            let rounded = crate::halves::unpack(&crate::halves::pack(&wv.to_f64_vec(), h), 12, h);
            assert_eq!(back.to_f64_vec(), rounded.iter().map(|&v| v as f64).collect::<Vec<_>>());
        }
    }

    #[test]
    fn casts_read_only_by_products_are_rounded_as_they_are_loaded() {
        for h in [DType::F16, DType::BF16] {
            // Training: the weight keeps its f32 copy; both casts are rounded views.
            let p = product(h, Mode::Train);
            let g = crate::rewrite::for_gpu(&p);
            let views = crate::memory::ReadViews::of(&g);
            let casts: Vec<usize> =
                (0..g.steps.len()).filter(|&i| g.steps[i].op == GpuOp::Plan(Op::Cast)).collect();
            assert_eq!(casts.len(), 2);
            let roots = crate::memory::view_roots(&g);
            for &c in &casts {
                assert!(views.rounded[c]);
                assert_eq!(roots[c], g.steps[c].inputs[0] as usize, "no words of its own");
            }
            let x = Tensor::f32(vec![2, 4], (0..8).map(|i| i as f32 * 0.3 - 1.0).collect());
            let w = Tensor::f32(vec![4, 3], (0..12).map(|i| 1.0 / (i as f32 + 3.0)).collect());
            let Some(mut gpu) = crate::test_util::open(p.clone(), std::slice::from_ref(&w)) else {
                return;
            };
            let got = gpu.run(&[("x", &x)], 0).expect("runs").outputs;
            let want = crate::test_util::run_on_cpu_plan(&p, &[w], &[("x", &x)]).outputs;
            crate::test_util::assert_close(&Op::MatMul, &got[0].1, &want[0].1, 1e-6);
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
