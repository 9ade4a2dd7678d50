//! The GPU backend against the CPU reference, on whatever device `mgnc info` would use
//! (lavapipe in CI, where `MGN_REQUIRE_GPU=1` makes a missing device a failure).

use mgn_compiler::lower::PlanOptions;
use mgn_compiler::{driver::plan_path, elab::Setting};
use mgn_runtime::gpu::session::GpuSession;
use mgn_runtime::optim::OptimizerSpec;
use mgn_runtime::session::Session;
use mgn_runtime::tensor::Tensor;
use mgn_runtime::Plan;
use mgn_tests::{rendered, root};
use std::path::Path;

fn plan(model: &str, settings: &[&str], opts: &PlanOptions) -> Plan {
    root();
    let settings: Vec<Setting> = settings.iter().map(|s| s.parse().expect("valid setting")).collect();
    let (outcome, plan) = plan_path(Path::new(model), None, settings, opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    plan.expect("a plan")
}

fn gpu(plan: Plan, params: &[Tensor]) -> Option<GpuSession> {
    match GpuSession::new(plan, params) {
        Ok(s) => Some(s),
        Err(e) if e.0.contains("no GPU") || e.0.contains("Vulkan") || e.0.contains("driver") => {
            assert!(std::env::var("MGN_REQUIRE_GPU").map_or(true, |v| v != "1"), "MGN_REQUIRE_GPU=1 but: {e}");
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Seeded inputs for a plan: floats in [-1, 1), integers in their valid range.
fn inputs(plan: &Plan, seed: u64) -> Vec<(String, Tensor)> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 11) as f64) / ((1u64 << 53) as f64)
    };
    plan.inputs
        .iter()
        .map(|(name, v)| {
            let s = &plan.steps[*v as usize];
            let n: usize = s.shape.iter().product();
            let t = if s.dtype.is_float() {
                Tensor::f32(s.shape.clone(), (0..n).map(|_| (next() * 2.0 - 1.0) as f32).collect())
            } else {
                let hi = plan.int_input_range(*v).unwrap_or(2) as f64;
                Tensor::i32(s.shape.clone(), (0..n).map(|_| (next() * hi) as i32).collect())
            };
            (name.clone(), t)
        })
        .collect()
}

fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    num / b.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-12)
}

#[test]
fn digits_mlp_forward_and_backward_match_the_cpu() {
    let p = plan("models/digits_mlp.mgn", &["batch=16", "hidden=32"], &PlanOptions::train(&[], OptimizerSpec::default()));
    let mut cpu = Session::new(p.clone(), 3);
    let Some(mut gpu) = gpu(p.clone(), &cpu.params) else { return };
    let data = inputs(&p, 1);
    let given: Vec<(&str, &Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let want = cpu.run(&given).expect("cpu runs");
    let got = gpu.run(&given).expect("gpu runs");
    for ((n, w), (_, g)) in want.outputs.iter().zip(&got.outputs) {
        assert!(rel(g, w) < 1e-5, "output {n}: {:e}", rel(g, w));
    }
    assert!(rel(got.loss.as_ref().unwrap(), want.loss.as_ref().unwrap()) < 1e-5);
    for ((n, w), (_, g)) in want.grads.iter().zip(&got.grads) {
        assert!(rel(g, w) < 1e-4, "grad {n}: {:e}", rel(g, w));
    }
}

#[test]
fn digits_mlp_trains_on_the_gpu_with_the_cpu_loss_curve() {
    let p = plan("models/digits_mlp.mgn", &["batch=32", "hidden=32"], &PlanOptions::train(&[], OptimizerSpec::default()));
    let mut cpu = Session::new(p.clone(), 5);
    let mut gpu = Session::new(p.clone(), 5);
    if let Err(e) = gpu.use_gpu() {
        assert!(std::env::var("MGN_REQUIRE_GPU").map_or(true, |v| v != "1"), "MGN_REQUIRE_GPU=1 but: {e}");
        eprintln!("skipping: {e}");
        return;
    }
    for step in 0..15 {
        let data = inputs(&p, 100 + step);
        let given: Vec<(&str, &Tensor)> = data.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let lc = cpu.train_step(&given).expect("cpu trains");
        let lg = gpu.train_step(&given).expect("gpu trains");
        assert!((lc - lg).abs() <= 1e-4 * lc.abs().max(1.0), "step {step}: cpu loss {lc}, gpu loss {lg}");
    }
}

/// A plan with an op that has no GPU kernel yet is refused, naming the first such op and its
/// model line. digits_cnn's conv and pooling now have kernels; its batch norm (inference
/// statistics) does not yet. When every op of digits_cnn has one, point this at another model.
#[test]
fn ops_without_a_gpu_kernel_are_refused_with_the_model_line() {
    let p = plan("models/digits_cnn.mgn", &["batch=2"], &PlanOptions::infer());
    let params = Session::new(p.clone(), 0).params;
    let e = match GpuSession::new(p.clone(), &params) {
        Ok(_) => panic!("digits_cnn now has a GPU kernel for every op: refusal needs a model with an op that has none"),
        Err(e) if !e.0.contains("has no GPU kernel yet") => {
            // No usable device (or another failure, which MGN_REQUIRE_GPU=1 makes fatal).
            assert!(std::env::var("MGN_REQUIRE_GPU").map_or(true, |v| v != "1"), "MGN_REQUIRE_GPU=1 but: {e}");
            eprintln!("skipping: {e}");
            return;
        }
        Err(e) => e,
    };
    // "... (at FILE:LINE:COL, step N)": the step named is the first without a kernel.
    let at = e.0.rfind(", step ").unwrap_or_else(|| panic!("the refusal names no step: {e}"));
    let index: usize = e.0[at + 7..].trim_end_matches(')').parse().unwrap_or_else(|_| panic!("the refusal names no step: {e}"));
    let s = &p.steps[index];
    assert!(e.0.starts_with(&format!("`{}` has no GPU kernel yet", s.op.describe())), "{e}");
    assert!(s.loc.file.ends_with("models/digits_cnn.mgn") && e.0.contains(&format!("models/digits_cnn.mgn:{}:{}", s.loc.line, s.loc.column)), "{e}");
    let name = s.op.describe();
    assert!(!name.contains("conv") && !name.contains("pool"), "conv and pooling have GPU kernels: {e}");
    assert!(p.steps[..index].iter().any(|s| s.op.describe().starts_with("conv2d")), "a conv runs before the refused op: {e}");
}
