//! What the GPU kernel tests share: one-op plans run on the GPU and on the CPU reference
//! (`reference.rs`). Ops are anything that becomes a `GpuOp`: the compiled plan's `Op`s and the
//! GPU's own.

use crate::program::{self, GpuOp, GpuPlan, StepId};
use crate::session::GpuSession;
use mgn_ir::op::Op;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::{Mode, ParamSpec, Plan, SourceLoc, Step};
use mgn_ir::tensor::{RunOutput, Tensor};
use mgn_ir::DType;

pub use crate::reference::run as run_reference;

pub fn step(op: Op, inputs: Vec<u32>, dtype: DType, shape: &[usize]) -> Step {
    Step {
        op,
        inputs,
        dtype,
        shape: shape.to_vec(),
        loc: SourceLoc { file: "t.mgn".into(), line: 1, column: 1 },
    }
}

/// A trainable f32 weight of `shape`, zero until the test gives it values (`Plan::params`).
/// Every derivative of an attention over q `[b, hq, tq, d]`, k `[b, hkv, tk, d]` and v
/// `[b, hkv, tk, dv]`, each with its result's shape: q's, k's, v's and, with a mask, the
/// mask's (the scores' shape).
pub fn attention_grad_parts(
    b: usize,
    (hq, hkv): (usize, usize),
    (tq, tk): (usize, usize),
    (d, dv): (usize, usize),
    has_mask: bool,
) -> Vec<(mgn_ir::op::GradPart, Vec<usize>)> {
    use mgn_ir::op::GradPart;
    let mut parts = vec![
        (GradPart::Q, vec![b, hq, tq, d]),
        (GradPart::K, vec![b, hkv, tk, d]),
        (GradPart::V, vec![b, hkv, tk, dv]),
    ];
    if has_mask {
        parts.push((GradPart::Mask, vec![b, hq, tq, tk]));
    }
    parts
}

pub fn weight(name: &str, shape: &[usize]) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        dtype: DType::F32,
        shape: shape.to_vec(),
        init: mgn_ir::plan::InitSpec::Constant(0.0),
        trainable: true,
        frozen: false,
        persistent: true,
    }
}

/// `y = cast(x, h) @ cast(w, h)` (f32 result), `w` a parameter read only through its cast: the
/// mixed policy's product, in a plan of `mode`.
pub fn half_product(h: DType, mode: Mode) -> Plan {
    let f = DType::F32;
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[2, 4]),
        step(Op::Param { index: 0 }, vec![], f, &[4, 3]),
        step(Op::Cast, vec![0], h, &[2, 4]),
        step(Op::Cast, vec![1], h, &[4, 3]),
        step(Op::MatMul, vec![2, 3], f, &[2, 3]),
    ];
    let p = Plan::of_steps(mode, steps, vec![("x".into(), 0)], vec![("y".into(), 4)]);
    Plan { params: vec![weight("w", &[4, 3])], ..p }
}

/// Deterministic values in [-1, 1).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0
                - 1.0
        })
        .collect()
}

/// An f32 tensor of `shape` holding `values(numel, seed)`.
pub fn tensor(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed))
}

/// The input steps `x, rm, rv, w, b` of a batch norm over `x` (positions 0 to 4; the running
/// statistics and affine parameters of `x[1]` channels), for rewrite tests.
pub fn batch_norm_input_steps(x: &[usize]) -> Vec<Step> {
    let c = [x[1]];
    let names = [("x", x), ("rm", &c[..]), ("rv", &c), ("w", &c), ("b", &c)];
    names.map(|(n, s)| step(Op::Input { name: n.into() }, vec![], DType::F32, s)).into()
}

/// Values for `batch_norm_input_steps`: `x`, then rm, rv (1.5 each), w and b.
pub fn batch_norm_operands(x: Tensor) -> Vec<Tensor> {
    let c = [x.shape[1]];
    vec![x, tensor(&c, 2), Tensor::f32(c.to_vec(), vec![1.5; c[0]]), tensor(&c, 3), tensor(&c, 4)]
}

/// Runs `op` over `inputs` in a one-step training plan on the GPU; None when there is no GPU
/// (a failure instead under `MGN_REQUIRE_GPU=1`, and always when the kernel itself fails).
pub fn run_on_gpu<O: Clone + Into<GpuOp>>(
    op: &O,
    inputs: &[Tensor],
    out_dtype: DType,
    out_shape: &[usize],
) -> Option<Tensor> {
    let op: GpuOp = op.clone().into();
    let loc = SourceLoc { file: "t.mgn".into(), line: 1, column: 1 };
    let gpu_step = |op: GpuOp, inputs: Vec<u32>, dtype: DType, shape: &[usize]| program::Step {
        op,
        inputs,
        dtype,
        shape: shape.to_vec(),
        loc: loc.clone(),
    };
    let mut steps = Vec::new();
    let mut names = Vec::new();
    for (k, t) in inputs.iter().enumerate() {
        let name = format!("x{k}");
        steps.push(gpu_step(Op::Input { name: name.clone() }.into(), vec![], t.dtype, &t.shape));
        names.push((name, k as u32));
    }
    let n = inputs.len() as u32;
    steps.push(gpu_step(op.clone(), (0..n).collect(), out_dtype, out_shape));
    let ids: Vec<StepId> = (0..=n).map(StepId).collect();
    let plan = GpuPlan {
        model: "T".into(),
        mode: Mode::Train,
        params: vec![],
        optimizer: OptimizerSpec::default(),
        steps,
        ids: ids.clone(),
        origins: ids,
        inputs: names.clone(),
        outputs: vec![("y".into(), n)],
        loss: None,
        grads: vec![],
        state_writes: vec![],
        loss_scaling: None,
    };
    let mut gpu = crate::testing::or_skip(GpuSession::open(plan, &[]))?;
    let given: Vec<(&str, &Tensor)> =
        names.iter().map(|(n, k)| (n.as_str(), &inputs[*k as usize])).collect();
    let run = gpu.run(&given, 0).unwrap_or_else(|e| panic!("{}: {e}", op.describe()));
    Some(run.outputs.into_iter().next().expect("one output").1)
}

/// A GPU session for `plan`; None when there is no device (a failure instead under
/// `MGN_REQUIRE_GPU=1`). Any other error fails the test.
pub fn open(plan: Plan, params: &[Tensor]) -> Option<GpuSession> {
    crate::testing::or_skip(GpuSession::new(plan, params))
}

/// `plan` as compiled, run step by step on the CPU reference (see `reference::run`).
pub fn run_on_cpu_plan(plan: &Plan, params: &[Tensor], inputs: &[(&str, &Tensor)]) -> RunOutput {
    run_reference(&GpuPlan::of(plan), params, inputs)
}

/// `op` over `inputs` on the CPU reference, as a training step with dropout seed 0.
pub fn run_on_cpu<O: Clone + Into<GpuOp>>(
    op: &O,
    inputs: &[&Tensor],
    dtype: DType,
    shape: &[usize],
) -> Tensor {
    let ctx = mgn_cpu::Ctx { training: true, seed: 0, node: 0 };
    crate::reference::eval(&op.clone().into(), inputs, dtype, shape, &ctx)
}

/// The GPU program `rewritten` computes `plan`'s results: on the CPU reference within 1e-6 of
/// `plan` run on the CPU, and on the GPU (where there is one) within 1e-5.
pub fn assert_rewrite_keeps_results(plan: &Plan, rewritten: GpuPlan, given: &[(&str, &Tensor)]) {
    assert_rewrite_keeps_results_within(plan, rewritten, given, (1e-6, 1e-5));
}

/// `assert_rewrite_keeps_results` within (CPU, GPU) tolerances: a rewrite that reorders
/// additions (products split along k) moves results by more than rounding.
pub fn assert_rewrite_keeps_results_within(
    plan: &Plan,
    rewritten: GpuPlan,
    given: &[(&str, &Tensor)],
    (on_cpu, on_gpu): (f64, f64),
) {
    let want = run_on_cpu_plan(plan, &[], given).outputs;
    let got = run_reference(&rewritten, &[], given).outputs;
    for ((_, g), (_, w)) in got.iter().zip(&want) {
        assert_close(&Op::MatMul, g, w, on_cpu);
    }
    let Some(mut session) = crate::testing::or_skip(GpuSession::open(rewritten, &[])) else {
        return;
    };
    let got = session.run(given, 0).expect("runs").outputs;
    for ((_, g), (_, w)) in got.iter().zip(&want) {
        assert_close(&Op::MatMul, g, w, on_gpu);
    }
}

/// Every element within `tol` relative (plus `tol` absolute); equal infinities match.
pub fn assert_close<O: Clone + Into<GpuOp>>(op: &O, got: &Tensor, want: &Tensor, tol: f64) {
    let what = op.clone().into().describe();
    assert_eq!(got.shape, want.shape, "{what}");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            a == b || (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what} {:?}: element {i}: gpu {a}, cpu {b}",
            want.shape
        );
    }
}

/// Runs `op` on both backends and compares.
pub fn check_on_both<O: Clone + Into<GpuOp>>(
    op: &O,
    inputs: &[Tensor],
    out_dtype: DType,
    out_shape: &[usize],
    tol: f64,
) {
    let Some(got) = run_on_gpu(op, inputs, out_dtype, out_shape) else { return };
    let refs: Vec<&Tensor> = inputs.iter().collect();
    assert_close(op, &got, &run_on_cpu(op, &refs, out_dtype, out_shape), tol);
}

/// Seconds per op of `op` on the GPU, for the throughput measurements (ignored tests, run on a
/// real GPU with `--ignored --nocapture`; never an assertion): every operand is a parameter of
/// the given shape, so a run moves nothing between host and device, and one submission holds
/// `repeat` independent copies of the op. The median of 5 runs after one warm-up, with the
/// device's name; None (and a note) when the plan cannot run here. Under `MGN_PROFILE=1` the
/// time is one copy's latency instead: the GPU time of its dispatches, each in a pass of its
/// own (as a step alone at its level of a plan runs), from timestamps.
pub fn time_op(
    op: &Op,
    operands: &[&[usize]],
    out_shape: &[usize],
    repeat: usize,
) -> Option<(f64, String)> {
    time_op_with(op, operands, out_shape, repeat, false, DType::F32)
}

/// `time_op`, with the last operand stored transposed (its last two axes swapped, as a linear
/// layer's weight) and read through a transposing view when `transpose_last`, and the operands
/// of type `dtype` (f16 ones held as halves, as a mixed inference plan holds its weights).
pub fn time_op_with(
    op: &Op,
    operands: &[&[usize]],
    out_shape: &[usize],
    repeat: usize,
    transpose_last: bool,
    dtype: DType,
) -> Option<(f64, String)> {
    time_op_cast(op, operands, out_shape, (repeat, transpose_last), dtype, None)
}

/// How `time_op_cast` casts a contraction's operands to a half type, as the mixed policy does.
#[derive(Clone, Copy, Debug)]
pub enum Cast {
    /// The left operand an activation (an input), read as a rounded view
    /// (`memory::rounded_views`: f32 words, each element rounded as it arrives), the others
    /// weights, which an inference plan holds as halves (`rewrite::halves`).
    Weights(DType),
    /// Every operand an input read as a rounded view, as a training plan's products read both
    /// of theirs (its parameters stay f32).
    All(DType),
}

/// `time_op_with`, the operands cast as `cast` says before the op reads them.
pub fn time_op_cast(
    op: &Op,
    operands: &[&[usize]],
    out_shape: &[usize],
    (repeat, transpose_last): (usize, bool),
    dtype: DType,
    cast: Option<Cast>,
) -> Option<(f64, String)> {
    use mgn_ir::plan::InitSpec;
    let param = |k: usize, shape: &[usize]| ParamSpec {
        name: format!("p{k}"),
        dtype,
        shape: shape.to_vec(),
        init: InitSpec::Constant(0.0),
        trainable: false,
        frozen: false,
        persistent: true,
    };
    let stored = |k: usize| {
        let mut s = operands[k].to_vec();
        let r = s.len();
        if transpose_last && k + 1 == operands.len() && r >= 2 {
            s.swap(r - 2, r - 1);
        }
        s
    };
    // The operands before `first` are inputs, the others parameters.
    let (first, half) = match cast {
        None => (0, None),
        Some(Cast::Weights(h)) => (1, Some(h)),
        Some(Cast::All(h)) => (operands.len(), Some(h)),
    };
    let name = |k: usize| format!("x{k}");
    let mut steps: Vec<Step> = (0..operands.len())
        .map(|k| match k.checked_sub(first) {
            Some(index) => step(Op::Param { index }, vec![], dtype, &stored(k)),
            None => step(Op::Input { name: name(k) }, vec![], dtype, &stored(k)),
        })
        .collect();
    let mut args: Vec<u32> = (0..operands.len() as u32).collect();
    let read_as = half.unwrap_or(dtype);
    if let Some(half) = half {
        for (k, arg) in args.iter_mut().enumerate() {
            let at = steps.len() as u32;
            steps.push(step(Op::Cast, vec![*arg], half, &stored(k)));
            *arg = at;
        }
    }
    if transpose_last {
        let last = operands.len() - 1;
        let r = operands[last].len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let from = args[last];
        args[last] = steps.len() as u32;
        steps.push(step(Op::Permute { perm }, vec![from], read_as, operands[last]));
    }
    let first_out = steps.len() as u32;
    for _ in 0..repeat.max(1) {
        steps.push(step(op.clone(), args.clone(), DType::F32, out_shape));
    }
    let outputs = (first_out..steps.len() as u32).map(|v| (format!("y{v}"), v)).collect();
    let inputs = (0..first).map(|k| (name(k), k as u32)).collect();
    let plan = Plan {
        params: (first..operands.len()).map(|k| param(k, &stored(k))).collect(),
        ..Plan::of_steps(Mode::Infer, steps, inputs, outputs)
    };
    let mut tensors: Vec<Tensor> = (0..operands.len())
        .map(|k| {
            let s = stored(k);
            let v = values(s.iter().product(), k as u32 + 1);
            let v = if dtype == DType::F16 { v.iter().map(|&x| round_f16(x)).collect() } else { v };
            Tensor { dtype, ..Tensor::f32(s.clone(), v) }
        })
        .collect();
    let input: Vec<Tensor> = tensors.drain(..first).collect();
    let names: Vec<String> = (0..first).map(name).collect();
    let given: Vec<(&str, &Tensor)> = names.iter().map(|n| n.as_str()).zip(&input).collect();
    // A tile the sweep tries may not fit this device: a note, not a failure (never a test).
    let mut gpu = match GpuSession::new(plan, &tensors) {
        Ok(g) => g,
        Err(e @ crate::GpuError::NoDevice(_)) => return crate::testing::or_skip(Err(e)),
        Err(e) => {
            eprintln!("cannot time `{}`: {e}", op.describe());
            return None;
        }
    };
    let time = median_time(&mut gpu, &given, repeat, op)?;
    Some((time, gpu.device_name().to_string()))
}

/// The median over five runs (after one to warm up) of one of `repeat` copies of `op`: the
/// GPU time of its dispatches (`MGN_PROFILE=1`), else each run's wall time.
fn median_time(
    gpu: &mut GpuSession,
    given: &[(&str, &Tensor)],
    repeat: usize,
    op: &Op,
) -> Option<f64> {
    let latency = std::env::var("MGN_PROFILE").is_ok_and(|v| v == "1");
    let mut runs = Vec::new();
    for run in 0..6 {
        if latency {
            match gpu.profile(given, 0) {
                Ok(p) if run > 0 => runs.push(
                    p.dispatches.iter().map(|d| d.time.as_secs_f64()).sum::<f64>()
                        / repeat.max(1) as f64,
                ),
                Ok(_) => {}
                Err(e) => {
                    eprintln!("cannot time `{}`: {e}", op.describe());
                    return None;
                }
            }
            continue;
        }
        let t = std::time::Instant::now();
        if let Err(e) = gpu.run_resident(given, 0) {
            eprintln!("cannot time `{}`: {e}", op.describe());
            return None;
        }
        if run > 0 {
            runs.push(t.elapsed().as_secs_f64() / repeat.max(1) as f64);
        }
    }
    runs.sort_by(f64::total_cmp);
    Some(runs[2])
}

/// `x` rounded to the nearest f16.
fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}
