//! What the GPU kernel tests share: one-op plans run on the GPU and on the CPU reference.

use super::session::GpuSession;
use crate::op::Op;
use crate::optim::OptimizerSpec;
use crate::plan::{Mode, ParamSpec, Plan, SourceLoc, Step};
use crate::tensor::Tensor;
use crate::DType;

pub fn step(op: Op, inputs: Vec<u32>, dtype: DType, shape: &[usize]) -> Step {
    Step { op, inputs, dtype, shape: shape.to_vec(), loc: SourceLoc { file: "t.mgn".into(), line: 1, column: 1 } }
}

/// Deterministic values in [-1, 1).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0 - 1.0).collect()
}

/// Runs `op` over `inputs` in a one-step training plan on the GPU; None when there is no GPU
/// (a failure instead under `MGN_REQUIRE_GPU=1`, and always when the kernel itself fails).
pub fn run_on_gpu(op: &Op, inputs: &[Tensor], out_dtype: DType, out_shape: &[usize]) -> Option<Tensor> {
    let mut steps = Vec::new();
    let mut names = Vec::new();
    for (k, t) in inputs.iter().enumerate() {
        let name = format!("x{k}");
        steps.push(step(Op::Input { name: name.clone() }, vec![], t.dtype, &t.shape));
        names.push((name, k as u32));
    }
    steps.push(step(op.clone(), (0..inputs.len() as u32).collect(), out_dtype, out_shape));
    let out = steps.len() as u32 - 1;
    let plan = Plan {
        model: "T".into(),
        mode: Mode::Train,
        config: vec![],
        params: Vec::<ParamSpec>::new(),
        steps,
        inputs: names.clone(),
        outputs: vec![("y".into(), out)],
        loss: None,
        grads: vec![],
        optimizer: OptimizerSpec::default(),
    };
    let mut gpu = open(plan, &[])?;
    let given: Vec<(&str, &Tensor)> = names.iter().map(|(n, k)| (n.as_str(), &inputs[*k as usize])).collect();
    Some(gpu.run(&given, 0).unwrap_or_else(|e| panic!("{}: {e}", op.describe())).outputs.remove(0).1)
}

/// A GPU session for `plan`; None when there is no GPU (a failure instead under
/// `MGN_REQUIRE_GPU=1`). A plan the device has but cannot compile always fails.
pub fn open(plan: Plan, params: &[Tensor]) -> Option<GpuSession> {
    match GpuSession::new(plan, params) {
        Ok(g) => Some(g),
        Err(e) if std::env::var("MGN_REQUIRE_GPU").map_or(true, |v| v != "1") && !e.0.contains("kernel") => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

pub fn run_on_cpu(op: &Op, inputs: &[&Tensor], dtype: DType, shape: &[usize]) -> Tensor {
    crate::cpu::eval(op, inputs, dtype, shape, &crate::cpu::Ctx { training: true, seed: 0, node: 0 }).expect("cpu runs")
}

/// Every element within `tol` relative (plus `tol` absolute); equal infinities match.
pub fn assert_close(op: &Op, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape, want.shape, "{}", op.describe());
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(a == b || (a - b).abs() <= tol * (1.0 + b.abs()), "{} {:?}: element {i}: gpu {a}, cpu {b}", op.describe(), want.shape);
    }
}

/// Runs `op` on both backends and compares.
pub fn check_on_both(op: &Op, inputs: &[Tensor], out_dtype: DType, out_shape: &[usize], tol: f64) {
    let Some(got) = run_on_gpu(op, inputs, out_dtype, out_shape) else { return };
    let refs: Vec<&Tensor> = inputs.iter().collect();
    assert_close(op, &got, &run_on_cpu(op, &refs, out_dtype, out_shape), tol);
}
