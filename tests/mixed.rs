//! Mixed precision end to end: dynamic loss scaling on a model whose gradients overflow f16 at
//! the initial scale — skipped updates, the scale halving and growing back, the same on the
//! GPU as on the CPU, kept across a checkpoint — and the f32 run it approximates.

use mgn_compiler::lower::PlanOptions;
use mgn_compiler::{driver::plan_path, elab::Setting};
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::precision::{LossScaling, Precision};
use mgn_ir::tensor::Tensor;
use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::session::{Restore, Session};
use mgn_runtime::Plan;
use mgn_tests::{on_gpu, rendered, root};
use std::path::PathBuf;

/// A regression whose loss is scaled by 1000: its incoming gradients, times the initial loss
/// scale 65,536, are far past f16's 65,504, so the first steps overflow until the scale has
/// halved enough.
const LOUD: &str = "
model Loud(b: dim = 8) {
    input x: f32[b, 16]
    input y: f32[b, 4]
    w = param f32[16, 4] init normal(std = 0.5)
    forward {
        let e = x @ w - y
        output e
        loss mean(e * e) * 1000.0
    }
}
";

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mgn-mixed-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn plan(text: &str, precision: Precision) -> Plan {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // One file per call: tests run in parallel, and one writing the file another is reading
    // would hand the reader a truncated model.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    root();
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let file = dir().join(format!("loud-{precision}-{n}.mgn"));
    std::fs::write(&file, text).expect("writes");
    let spec = OptimizerSpec { lr: 0.02, ..OptimizerSpec::default() };
    let opts = PlanOptions { precision, ..PlanOptions::train(&[], spec) };
    let (outcome, plan) = plan_path(&file, None, Vec::<Setting>::new(), &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    plan.expect("a plan")
}

fn batch() -> Vec<(&'static str, Tensor)> {
    let x = (0..128).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let y = (0..32).map(|i| ((i * 13 % 7) as f32 / 3.0) - 1.0).collect();
    vec![("x", Tensor::f32(vec![8, 16], x)), ("y", Tensor::f32(vec![8, 4], y))]
}

/// (loss, whether the update was applied, the scale after) for `steps` steps.
fn train(s: &mut Session, steps: usize) -> Vec<(f64, bool, f64)> {
    let data = batch();
    let given: Vec<(&str, &Tensor)> = data.iter().map(|(n, t)| (*n, t)).collect();
    (0..steps)
        .map(|_| {
            let before = s.step;
            let loss = s.train_step(&given).expect("trains");
            (loss, s.step > before, s.loss_scale().expect("scaled").0)
        })
        .collect()
}

#[test]
fn overflowing_steps_are_skipped_and_the_scale_halves_until_they_fit() {
    let p = plan(LOUD, Precision::MixedF16);
    let spec = p.loss_scaling.clone().expect("f16 training scales its loss");
    assert_eq!(spec.init, LossScaling::INIT);
    let mut s = Session::new(p, 1);
    let w0 = s.params[0].clone();
    let log = train(&mut s, 24);
    let skipped = log.iter().take_while(|(_, applied, _)| !applied).count();
    assert!(skipped >= 4, "the first steps overflow f16: {log:?}");
    // Every skip halved the scale and left the weights as they were.
    assert_eq!(log[skipped - 1].2, LossScaling::INIT / 2f64.powi(skipped as i32));
    assert!(log[skipped..].iter().all(|(_, applied, _)| *applied), "{log:?}");
    assert_eq!((s.step, s.skipped_steps()), (24 - skipped as u64, skipped as u64));
    assert_ne!(s.params[0].to_f64_vec(), w0.to_f64_vec());
    // The loss falls once updates are applied.
    assert!(log[23].0 < log[skipped].0 * 0.9, "{log:?}");
    // The f32 run of the same weights: the first applied step sees the same loss and gradient
    // direction, so the curves agree once the mixed run starts moving.
    let mut exact = Session::new(plan(LOUD, Precision::F32), 1);
    let f32_log: Vec<f64> = {
        let data = batch();
        let given: Vec<(&str, &Tensor)> = data.iter().map(|(n, t)| (*n, t)).collect();
        (0..24 - skipped).map(|_| exact.train_step(&given).unwrap()).collect()
    };
    for (k, want) in f32_log.iter().enumerate() {
        let got = log[skipped + k].0;
        assert!((got - want).abs() <= 1e-2 * want.abs(), "step {k}: f16 {got}, f32 {want}");
    }
}

#[test]
fn the_scale_grows_after_clean_steps_and_survives_a_checkpoint() {
    let mut p = plan(LOUD, Precision::MixedF16);
    p.loss_scaling.as_mut().unwrap().growth_interval = 3;
    let mut s = Session::new(p.clone(), 1);
    let log = train(&mut s, 30);
    // After the overflows, three clean steps double the scale — which overflows again: the
    // scale settles into halving and doubling around the largest that fits.
    let first = log.iter().position(|(_, applied, _)| *applied).expect("some step applies");
    let fits = log[first].2;
    assert!(log[first..].iter().any(|(_, _, scale)| *scale > fits), "it grows: {log:?}");
    assert!(log.iter().all(|(_, _, scale)| *scale <= LossScaling::INIT));
    // Saved and resumed: the scale, its clean steps and the step count come back.
    let file = dir().join("loud.safetensors");
    s.save_checkpoint(&file).expect("saves");
    let (mut resumed, _) =
        Session::from_checkpoint(p.clone(), 1, &file, MatchMode::Strict, Restore::Everything)
            .expect("loads");
    assert_eq!(resumed.optimizer.loss_scale, s.optimizer.loss_scale);
    assert_eq!(resumed.step, s.step);
    let (a, b) = (train(&mut s, 6), train(&mut resumed, 6));
    assert_eq!(a, b, "a resumed run continues exactly");
}

#[test]
fn loss_scaled_training_on_the_gpu_skips_and_scales_like_the_cpu() {
    // Clipped by the true gradients' norm: the scale is divided out first on both backends.
    let mut p = plan(LOUD, Precision::MixedF16);
    p.optimizer.clip_norm = Some(5.0);
    let mut cpu = Session::new(p.clone(), 1);
    let mut gpu = Session::new(p, 1);
    if !on_gpu(&mut gpu) {
        return;
    }
    let (want, got) = (train(&mut cpu, 20), train(&mut gpu, 20));
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!((w.1, w.2), (g.1, g.2), "step {k}: applied and scale");
        assert!((w.0 - g.0).abs() <= 1e-3 * w.0.abs(), "step {k}: cpu {}, gpu {}", w.0, g.0);
    }
    gpu.sync_from_device().expect("reads back");
    assert_eq!((gpu.step, gpu.skipped_steps()), (cpu.step, cpu.skipped_steps()));
    let (g, c) = (gpu.params[0].to_f64_vec(), cpu.params[0].to_f64_vec());
    for (a, b) in g.iter().zip(&c) {
        assert!((a - b).abs() <= 1e-3 * (1.0 + b.abs()), "weights: gpu {a}, cpu {b}");
    }
    assert_eq!(gpu.loss_scale(), cpu.loss_scale());
}

#[test]
fn bf16_training_needs_no_scale() {
    let p = plan(LOUD, Precision::MixedBf16);
    assert!(p.loss_scaling.is_none());
    let mut s = Session::new(p, 1);
    let data = batch();
    let given: Vec<(&str, &Tensor)> = data.iter().map(|(n, t)| (*n, t)).collect();
    let first = s.train_step(&given).unwrap();
    for _ in 0..20 {
        s.train_step(&given).unwrap();
    }
    assert_eq!((s.step, s.skipped_steps()), (21, 0));
    assert!(s.train_step(&given).unwrap() < first * 0.9);
    assert!(s.loss_scale().is_none());
}

/// ResNet-50 keeps its convolutions' forward in f32 under the mixed policy
/// (`full_precision(…, derivatives = false)`: any rounding of its forward misses the accuracy
/// gates, docs/benchmarks/), while the derivatives' convolutions and the head take f16.
#[test]
fn resnet50_rounds_only_its_derivative_convolutions() {
    use mgn_ir::op::Op;
    use mgn_ir::DType;
    root();
    let settings = [("B", "1"), ("size", "32"), ("classes", "10")];
    let settings = settings.iter().map(|(n, v)| Setting::new(*n, v.to_string())).collect();
    let opts = PlanOptions {
        precision: Precision::MixedF16,
        ..PlanOptions::train(&[], OptimizerSpec::default())
    };
    let file = root().join("models/resnet50.mgn");
    let (outcome, plan) = plan_path(&file, None, settings, &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let plan = plan.expect("a plan");
    let operand = |s: &mgn_ir::plan::Step| plan.steps[s.inputs[0] as usize].dtype;
    let of = |f: fn(&Op) -> bool| -> Vec<DType> {
        plan.steps.iter().filter(|s| f(&s.op)).map(operand).collect()
    };
    let forward = of(|op| matches!(op, Op::Conv { .. }));
    let backward = of(|op| matches!(op, Op::ConvGradInput { .. } | Op::ConvGradWeight { .. }));
    assert_eq!(forward.len(), 53);
    assert!(forward.iter().all(|&d| d == DType::F32), "{forward:?}");
    assert!(!backward.is_empty() && backward.iter().all(|&d| d == DType::F16), "{backward:?}");
    // The head's product rounds as every unpinned contraction does.
    assert!(of(|op| matches!(op, Op::MatMul)).contains(&DType::F16));
}
