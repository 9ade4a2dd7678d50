//! The host's optimizer: PyTorch's update rules over `OptimizerState` (whose form, with the
//! settings and the schedule, is `mgn_ir::optim`), global-norm clipping, and the names the state
//! takes in a checkpoint. GPU kernels (`mgn_gpu::update`) must match these.

use mgn_ir::optim::{lr_at, OptimizerKind, OptimizerSpec, OptimizerState};
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;

mod state;
pub use state::{check_kind, state_from_tensors, state_to_tensors};

/// The global L2 norm of `grads` and the factor `torch.nn.utils.clip_grad_norm_` scales them
/// by: `min(1, clip / (norm + 1e-6))`, or 1 without clipping.
pub fn clip_scale(grads: &[Tensor], clip_norm: Option<f64>) -> (f64, f64) {
    let sq: f64 = grads
        .iter()
        .map(|g| match &g.data {
            Data::F32(v) => v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>(),
            Data::F64(v) => v.iter().map(|&x| x * x).sum(),
            Data::I32(_) | Data::Packed(_) => 0.0,
        })
        .sum();
    let norm = sq.sqrt();
    let scale = match clip_norm {
        Some(c) => (c / (norm + 1e-6)).min(1.0),
        None => 1.0,
    };
    (norm, scale)
}

/// Name of the state tensor holding the update count.
pub const STEP_TENSOR: &str = "optim.step";

/// Names of the state tensors holding a dynamic loss scale (`f32[]`), its clean steps since it
/// last changed and the steps it skipped (`i64[]` each).
pub const LOSS_SCALE_TENSOR: &str = "optim.loss_scale";
pub const CLEAN_STEPS_TENSOR: &str = "optim.loss_scale_clean_steps";
pub const SKIPPED_TENSOR: &str = "optim.loss_scale_skipped";

/// Checkpoint name of a parameter's first-moment / momentum buffer.
pub fn m_name(param: &str) -> String {
    format!("optim.{param}.m")
}

/// Checkpoint name of a parameter's second-moment buffer.
pub fn v_name(param: &str) -> String {
    format!("optim.{param}.v")
}

/// Rounds an updated value to what the parameter's dtype can hold (f16/bf16 live in f32 storage).
fn rounder(dtype: DType) -> fn(f64) -> f64 {
    match dtype {
        DType::F16 => |x| half::f16::from_f64(x).to_f64(),
        DType::BF16 => |x| half::bf16::from_f64(x).to_f64(),
        _ => |x| x as f32 as f64,
    }
}

/// `w[i] = round(f(i, w[i], g[i]))` over every element, in place, for each storage pairing.
fn update_each(pi: usize, p: &mut Tensor, g: &Tensor, f: impl FnMut(usize, f64, f64) -> f64) {
    fn go<W: Copy + Into<f64>, G: Copy + Into<f64>>(
        w: &mut [W],
        g: &[G],
        back: impl Fn(f64) -> W,
        mut f: impl FnMut(usize, f64, f64) -> f64,
    ) {
        for (i, (w, &g)) in w.iter_mut().zip(g).enumerate() {
            *w = back(f(i, (*w).into(), g.into()));
        }
    }
    assert_eq!(
        p.data.len(),
        g.data.len(),
        "optimizer: parameter {pi} has {} elements but its gradient {}",
        p.data.len(),
        g.data.len()
    );
    let round = rounder(p.dtype);
    match (&mut p.data, &g.data) {
        (Data::F32(w), Data::F32(g)) => go(w, g, |x| round(x) as f32, f),
        (Data::F32(w), Data::F64(g)) => go(w, g, |x| round(x) as f32, f),
        (Data::F64(w), Data::F32(g)) => go(w, g, |x| x, f),
        (Data::F64(w), Data::F64(g)) => go(w, g, |x| x, f),
        _ => panic!("optimizer: parameter {pi} or its gradient is not floating point"),
    }
}

/// Applies update number `step` (1-based; bias correction and the schedule use it) to the
/// trained parameters: `grads[k]` is the gradient of `params[trained[k]]`. Gradients are
/// first clipped to `spec.clip_norm` by their global norm over all of `grads`.
///
/// Panics if the slices disagree (a gradient's length differs from its parameter's, an index
/// is out of range, or a parameter or gradient is not floating point): plans guarantee these.
pub fn apply(
    state: &mut OptimizerState,
    spec: &OptimizerSpec,
    step: u64,
    params: &mut [Tensor],
    grads: &[Tensor],
    trained: &[usize],
) {
    assert_eq!(
        grads.len(),
        trained.len(),
        "optimizer: {} gradients for {} trained parameters",
        grads.len(),
        trained.len()
    );
    assert!(step >= 1, "optimizer: steps are numbered from 1");
    state.ensure(params.len());
    let lr = lr_at(spec, step);
    let (_, scale) = clip_scale(grads, spec.clip_norm);
    for (&pi, g) in trained.iter().zip(grads) {
        let p = &mut params[pi];
        let n = p.data.len();
        match spec.kind {
            OptimizerKind::Sgd { momentum: 0.0 } => {
                update_each(pi, p, g, |_, w, g| w - lr * g * scale)
            }
            OptimizerKind::Sgd { momentum } => {
                // torch.optim.SGD (dampening 0, no Nesterov): the buffer starts as g, then
                // buf = momentum·buf + g; p −= lr·buf.
                let first = state.m[pi].is_none();
                let buf = state.m[pi].get_or_insert_with(|| vec![0.0; n]);
                update_each(pi, p, g, |i, w, g| {
                    let g = g * scale;
                    buf[i] = if first { g as f32 } else { (momentum * buf[i] as f64 + g) as f32 };
                    w - lr * buf[i] as f64
                })
            }
            OptimizerKind::Adam { beta1, beta2, eps } => {
                let (m, v) = (
                    state.m[pi].get_or_insert_with(|| vec![0.0; n]),
                    state.v[pi].get_or_insert_with(|| vec![0.0; n]),
                );
                update_each(pi, p, g, adam(m, v, lr, beta1, beta2, eps, step, scale, 0.0))
            }
            OptimizerKind::AdamW { beta1, beta2, eps, weight_decay } => {
                let (m, v) = (
                    state.m[pi].get_or_insert_with(|| vec![0.0; n]),
                    state.v[pi].get_or_insert_with(|| vec![0.0; n]),
                );
                update_each(pi, p, g, adam(m, v, lr, beta1, beta2, eps, step, scale, weight_decay))
            }
        }
    }
    state.step = step;
}

/// The per-element Adam update (torch.optim.Adam / AdamW, no amsgrad), as a closure over the
/// moment buffers: with decoupled weight decay `wd`, first `w ← w·(1 − lr·wd)`; then
/// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²` and
/// `w ← w − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)`.
#[allow(clippy::too_many_arguments)]
fn adam<'a>(
    m: &'a mut [f32],
    v: &'a mut [f32],
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    step: u64,
    scale: f64,
    wd: f64,
) -> impl FnMut(usize, f64, f64) -> f64 + 'a {
    let bc1 = 1.0 - beta1.powf(step as f64);
    let bc2_sqrt = (1.0 - beta2.powf(step as f64)).sqrt();
    let step_size = lr / bc1;
    move |i, w, g| {
        let g = g * scale;
        let w = w * (1.0 - lr * wd);
        m[i] = (beta1 * m[i] as f64 + (1.0 - beta1) * g) as f32;
        v[i] = (beta2 * v[i] as f64 + (1.0 - beta2) * g * g) as f32;
        w - step_size * m[i] as f64 / ((v[i] as f64).sqrt() / bc2_sqrt + eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::optim::Schedule;
    use mgn_ir::plan::InitSpec;
    use mgn_ir::plan::ParamSpec;

    fn spec(kind: OptimizerKind, lr: f64) -> OptimizerSpec {
        OptimizerSpec { kind, lr, schedule: Schedule::Constant, clip_norm: None }
    }

    fn close(got: &Tensor, want: &[f64], tol: f64) {
        let g = got.to_f64_vec();
        assert_eq!(g.len(), want.len());
        for (i, (a, b)) in g.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "element {i}: got {a}, want {b} (all: {g:?})"
            );
        }
    }

    /// Runs `grads.len()` updates of one parameter from `p0`, returning it after each.
    fn run(spec: &OptimizerSpec, p0: Vec<f32>, grads: &[Vec<f32>]) -> Vec<Tensor> {
        let mut params = vec![Tensor::f32(vec![p0.len()], p0)];
        let mut state = OptimizerState::new(1);
        grads
            .iter()
            .enumerate()
            .map(|(i, g)| {
                apply(
                    &mut state,
                    spec,
                    i as u64 + 1,
                    &mut params,
                    &[Tensor::f32(vec![g.len()], g.clone())],
                    &[0],
                );
                params[0].clone()
            })
            .collect()
    }

    const GRADS: [[f32; 3]; 3] = [[0.5, -1.0, 0.0], [0.1, 0.2, -3.0], [-0.3, 0.4, 1e-3]];

    fn grads() -> Vec<Vec<f32>> {
        GRADS.iter().map(|g| g.to_vec()).collect()
    }

    #[test]
    fn sgd_with_momentum_matches_torch() {
        // buf₁ = g₁; bufₜ = 0.9·bufₜ₋₁ + gₜ; p −= 0.1·buf.
        // buf: [0.5, -1] → [0.55, -0.7] → [0.195, -0.23]
        let s = spec(OptimizerKind::Sgd { momentum: 0.9 }, 0.1);
        let out = run(&s, vec![1.0, -2.0], &[vec![0.5, -1.0], vec![0.1, 0.2], vec![-0.3, 0.4]]);
        close(&out[0], &[0.95, -1.9], 1e-7);
        close(&out[1], &[0.895, -1.83], 1e-7);
        close(&out[2], &[0.8755, -1.807], 1e-7);
    }

    #[test]
    fn plain_sgd_keeps_no_state() {
        let s = spec(OptimizerKind::Sgd { momentum: 0.0 }, 0.5);
        let mut params = vec![Tensor::f32(vec![2], vec![1.0, 1.0])];
        let mut st = OptimizerState::new(1);
        apply(&mut st, &s, 1, &mut params, &[Tensor::f32(vec![2], vec![2.0, -4.0])], &[0]);
        close(&params[0], &[0.0, 3.0], 0.0);
        assert!(st.m[0].is_none() && st.v[0].is_none());
    }

    #[test]
    fn adam_matches_torch() {
        // Step 1 by hand: m̂ = g, v̂ = g², so p −= 0.1·g/(|g| + 1e-8):
        // 1 − 0.1·0.5/0.50000001.
        // Steps 2 and 3 from the same formulas evaluated in double precision.
        let s = spec(OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 }, 0.1);
        let out = run(&s, vec![1.0, -2.0, 0.25], &grads());
        close(&out[0], &[0.900000002, -1.900000001, 0.25], 1e-7);
        close(&out[1], &[0.8196959063846517, -1.8488973939904945, 0.32441368200599646], 1e-6);
        close(&out[2], &[0.798624611763508, -1.835473434208156, 0.38191436617058494], 1e-6);
    }

    #[test]
    fn adamw_decays_before_the_adam_update() {
        // Step 1 by hand: p·(1 − 0.1·0.5) − 0.1·g/(|g| + 1e-8) = 0.95 − 0.099999998.
        let s = spec(
            OptimizerKind::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.5 },
            0.1,
        );
        let out = run(&s, vec![1.0, -2.0, 0.25], &grads());
        close(&out[0], &[0.850000002, -1.800000001, 0.2375], 1e-7);
        close(&out[1], &[0.7271959062846517, -1.6588973939404943, 0.3000386820059965], 1e-6);
        close(&out[2], &[0.6697648163492753, -1.562528564461131, 0.3425374320702851], 1e-6);
    }

    #[test]
    fn adam_moments_are_kept_in_the_state() {
        let s = spec(OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 }, 0.1);
        let mut params = vec![Tensor::f32(vec![3], vec![1.0, -2.0, 0.25])];
        let mut st = OptimizerState::new(1);
        for (i, g) in grads().into_iter().enumerate() {
            apply(&mut st, &s, i as u64 + 1, &mut params, &[Tensor::f32(vec![3], g)], &[0]);
        }
        close(&Tensor::f32(vec![3], st.m[0].clone().unwrap()), &[0.0195, -0.023, -0.2699], 1e-6);
        close(
            &Tensor::f32(vec![3], st.v[0].clone().unwrap()),
            &[0.00034949025, 0.001197961, 0.008991001],
            1e-6,
        );
        assert_eq!(st.step, 3);
    }

    #[test]
    fn clipping_uses_the_global_norm_like_torch() {
        // Two gradients with global norm 13 (= √(3² + 4² + 12²)), clipped to 1: each scaled by
        // 1/(13 + 1e-6). Plain SGD with lr 1 makes the update the clipped gradient itself.
        let mut s = spec(OptimizerKind::Sgd { momentum: 0.0 }, 1.0);
        s.clip_norm = Some(1.0);
        let mut params = vec![
            Tensor::f32(vec![2], vec![0.0, 0.0]),
            Tensor::f32(vec![1], vec![0.0]),
            Tensor::f32(vec![1], vec![7.0]),
        ];
        let g = [Tensor::f32(vec![2], vec![3.0, 4.0]), Tensor::f32(vec![1], vec![12.0])];
        let (norm, scale) = clip_scale(&g, s.clip_norm);
        assert_eq!(norm, 13.0);
        assert_eq!(scale, 1.0 / (13.0 + 1e-6));
        apply(&mut OptimizerState::new(3), &s, 1, &mut params, &g, &[0, 1]);
        let c = 1.0 / (13.0 + 1e-6);
        close(&params[0], &[-3.0 * c, -4.0 * c], 1e-7);
        close(&params[1], &[-12.0 * c], 1e-7);
        close(&params[2], &[7.0], 0.0); // not trained: untouched
                                        // Below the threshold nothing is scaled.
        assert_eq!(clip_scale(&g, Some(100.0)).1, 1.0);
        assert_eq!(clip_scale(&g, None).1, 1.0);
    }

    #[test]
    fn schedules() {
        let mut s = spec(OptimizerKind::Sgd { momentum: 0.0 }, 1.0);
        assert_eq!(lr_at(&s, 1), 1.0);
        assert_eq!(lr_at(&s, 1_000_000), 1.0);
        s.schedule = Schedule::WarmupCosine { warmup: 10, total: 110, min_lr: 0.1 };
        let at = |t| lr_at(&s, t);
        assert_eq!(at(0), 0.0);
        assert!((at(1) - 0.1).abs() < 1e-15);
        assert!((at(5) - 0.5).abs() < 1e-15);
        assert_eq!(at(10), 1.0);
        assert!(
            (at(35) - (0.1 + 0.9 * 0.5 * (1.0 + std::f64::consts::FRAC_PI_4.cos()))).abs() < 1e-12
        );
        assert!((at(60) - 0.55).abs() < 1e-12); // halfway: the mean of lr and min_lr
        assert!((at(110) - 0.1).abs() < 1e-12);
        assert_eq!(at(500), 0.1);
        for t in 10..110 {
            assert!(at(t + 1) <= at(t), "cosine decays monotonically ({t})");
        }
        // No warm-up: the cosine starts at lr on the first step.
        s.schedule = Schedule::WarmupCosine { warmup: 0, total: 100, min_lr: 0.0 };
        assert!((lr_at(&s, 1) - 0.5 * (1.0 + (std::f64::consts::PI / 100.0).cos())).abs() < 1e-15);
    }

    #[test]
    fn warmup_scales_the_update() {
        let mut s = spec(OptimizerKind::Sgd { momentum: 0.0 }, 1.0);
        s.schedule = Schedule::WarmupCosine { warmup: 4, total: 8, min_lr: 0.0 };
        let out = run(&s, vec![0.0], &[vec![1.0], vec![1.0]]);
        close(&out[0], &[-0.25], 0.0);
        close(&out[1], &[-0.75], 0.0);
    }

    fn pspec(name: &str, shape: &[usize]) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            dtype: DType::F32,
            shape: shape.to_vec(),
            init: InitSpec::Constant(0.0),
            trainable: true,
            frozen: false,
            persistent: true,
        }
    }

    #[test]
    fn state_round_trips_and_resuming_is_exact() {
        let specs =
            vec![pspec("fc.weight", &[2, 2]), pspec("fc.bias", &[2]), pspec("frozen.w", &[1])];
        let s = spec(
            OptimizerKind::AdamW { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 },
            0.01,
        );
        let grads_at = |t: u64| {
            vec![
                Tensor::f32(vec![2, 2], vec![0.1 * t as f32, -0.2, 0.3, 0.05]),
                Tensor::f32(vec![2], vec![1.0, -(t as f32)]),
            ]
        };
        let p0 = vec![
            Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]),
            Tensor::f32(vec![2], vec![0.0, 0.0]),
            Tensor::f32(vec![1], vec![5.0]),
        ];

        // Uninterrupted: four steps.
        let mut a = p0.clone();
        let mut sa = OptimizerState::new(3);
        for t in 1..=4 {
            apply(&mut sa, &s, t, &mut a, &grads_at(t), &[0, 1]);
        }

        // Two steps, a checkpoint round trip of parameters and state, two more.
        let mut b = p0.clone();
        let mut sb = OptimizerState::new(3);
        for t in 1..=2 {
            apply(&mut sb, &s, t, &mut b, &grads_at(t), &[0, 1]);
        }
        let named = state_to_tensors(&sb, &specs).expect("a small step count");
        let far = OptimizerState { step: 1 << 31, ..sb.clone() };
        assert!(
            state_to_tensors(&far, &specs).unwrap_err().contains("past 2^31 - 1"),
            "a step count a checkpoint cannot hold is an error, not a panic"
        );
        let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "optim.step",
                "optim.fc.weight.m",
                "optim.fc.weight.v",
                "optim.fc.bias.m",
                "optim.fc.bias.v"
            ]
        );
        let dir = std::env::temp_dir().join(format!("mgn-optim-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ck.safetensors");
        let mut all: Vec<(String, &Tensor)> =
            specs.iter().zip(&b).map(|(p, t)| (p.name.clone(), t)).collect();
        all.extend(named.iter().map(|(n, t)| (n.clone(), t)));
        crate::checkpoint::save(&path, &all, &crate::checkpoint::standard_metadata("M", 2))
            .unwrap();
        let ck = crate::checkpoint::load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (vals, report) =
            crate::checkpoint::match_params(&ck, &specs, crate::checkpoint::MatchMode::Strict)
                .unwrap();
        assert!(report.is_clean());
        let mut c: Vec<Tensor> = vals.into_iter().map(Option::unwrap).collect();
        let mut sc = ck.optimizer_state(&specs).unwrap();
        assert_eq!(sc, sb);
        for t in 3..=4 {
            apply(&mut sc, &s, t, &mut c, &grads_at(t), &[0, 1]);
        }
        assert_eq!(c, a, "resumed run must equal the uninterrupted one bit for bit");
        assert_eq!(c[2].to_f64_vec(), vec![5.0]);
    }

    #[test]
    fn bad_state_is_an_error() {
        let specs = vec![pspec("w", &[2])];
        let bad = vec![("optim.w.m".to_string(), Tensor::f32(vec![3], vec![0.0; 3]))];
        let e = state_from_tensors(&bad, &specs).unwrap_err();
        assert!(e.contains("optim.w.m") && e.contains("[3]") && e.contains("[2]"), "{e}");
        let bad = vec![("optim.step".to_string(), Tensor::f32(vec![], vec![1.0]))];
        assert!(state_from_tensors(&bad, &specs).is_err());
        let fresh = state_from_tensors(&[], &specs).unwrap();
        assert_eq!(fresh, OptimizerState::new(1));
    }

    #[test]
    fn state_missing_one_moment_is_refused_by_name() {
        let specs = vec![pspec("a", &[2]), pspec("b", &[2]), pspec("c", &[1])];
        let t2 = || Tensor::f32(vec![2], vec![0.5, 0.25]);
        let named = |names: &[&str]| -> Vec<(String, Tensor)> {
            names.iter().map(|n| (n.to_string(), t2())).collect()
        };
        // Adam's state (some `.v` present) where `b` lost its `.v`: not zero-filled, refused.
        let e = state_from_tensors(&named(&["optim.a.m", "optim.a.v", "optim.b.m"]), &specs)
            .unwrap_err();
        assert!(e.contains("`optim.b.v` is missing, though `optim.b.m` is there"), "{e}");
        assert!(!e.contains("more"), "{e}");
        let e = state_from_tensors(&named(&["optim.a.v", "optim.b.m", "optim.b.v"]), &specs)
            .unwrap_err();
        assert!(e.contains("`optim.a.m` is missing, though `optim.a.v` is there"), "{e}");
        let e = state_from_tensors(&named(&["optim.a.v", "optim.b.v"]), &specs).unwrap_err();
        assert!(e.contains("`optim.a.m` is missing") && e.contains("(and 1 more)"), "{e}");
        // Complete states load: both moments, momentum buffers alone, or a parameter with none.
        for ok in [&["optim.a.m", "optim.a.v", "optim.b.m", "optim.b.v"][..], &["optim.a.m"]] {
            assert!(state_from_tensors(&named(ok), &specs).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn state_holding_nan_or_infinity_is_refused_by_name() {
        let specs = vec![pspec("a", &[2]), pspec("b", &[1])];
        let bad = vec![
            ("optim.a.m".to_string(), Tensor::f32(vec![2], vec![0.0, f32::NAN])),
            ("optim.a.v".to_string(), Tensor::f32(vec![2], vec![f32::INFINITY, f32::INFINITY])),
            ("optim.b.m".to_string(), Tensor::f32(vec![1], vec![1.0])),
            ("optim.b.v".to_string(), Tensor::f32(vec![1], vec![1.0])),
        ];
        let e = state_from_tensors(&bad, &specs).unwrap_err();
        assert_eq!(
            e.lines().next().unwrap(),
            "the optimizer state holds values that are not finite: `optim.a.m` has 1 of 2 (1 \
             NaN), `optim.a.v` has 2 of 2 (2 infinite)"
        );
    }

    #[test]
    fn state_of_another_optimizer_is_refused_naming_both() {
        let specs = vec![pspec("a", &[2]), pspec("b", &[1])];
        let adam = OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let adamw =
            OptimizerKind::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };
        let momentum = OptimizerKind::Sgd { momentum: 0.9 };
        let plain = OptimizerKind::Sgd { momentum: 0.0 };
        let state = |m: bool, v: bool, step: u64| OptimizerState {
            m: vec![m.then(|| vec![0.0; 2]), m.then(|| vec![0.0])],
            v: vec![v.then(|| vec![0.0; 2]), v.then(|| vec![0.0])],
            step,
            loss_scale: None,
        };
        let (adam_state, momentum_state) = (state(true, true, 5), state(true, false, 5));
        let (plain_state, fresh) = (state(false, false, 5), state(false, false, 0));
        for (st, kind) in [
            (&adam_state, &adam),
            (&adam_state, &adamw),
            (&momentum_state, &momentum),
            (&plain_state, &plain),
            (&fresh, &adam),
            (&fresh, &momentum),
            (&fresh, &plain),
        ] {
            assert_eq!(check_kind(st, &specs, kind), Ok(()), "{kind:?}");
        }
        let refused = |st: &OptimizerState, kind: &OptimizerKind| {
            check_kind(st, &specs, kind).expect_err("a state of another optimizer")
        };
        let e = refused(&adam_state, &plain);
        assert!(
            e.starts_with(
                "the optimizer state is Adam's or AdamW's (`.m` and `.v` per \
             parameter), but this run trains with plain SGD (no state)"
            ),
            "{e}"
        );
        let e = refused(&adam_state, &momentum);
        assert!(e.contains("Adam's or AdamW's") && e.contains("SGD with momentum 0.9"), "{e}");
        let e = refused(&momentum_state, &adam);
        assert!(
            e.contains("SGD with momentum's (`.m` only)")
                && e.contains("trains with Adam (`.m` and `.v` per parameter)")
                && e.contains("`optim.a.v`"),
            "{e}"
        );
        assert!(refused(&momentum_state, &plain).contains("SGD with momentum's"));
        let e = refused(&plain_state, &adamw);
        assert!(e.contains("plain SGD's (no buffers after 5 steps)") && e.contains("AdamW"));
        assert!(refused(&plain_state, &momentum).contains("plain SGD's"));
    }

    #[test]
    fn half_precision_parameters_stay_representable() {
        let s = spec(OptimizerKind::Sgd { momentum: 0.0 }, 0.1);
        let mut params =
            vec![Tensor { dtype: DType::BF16, shape: vec![1], data: Data::F32(vec![1.0]) }];
        apply(
            &mut OptimizerState::new(1),
            &s,
            1,
            &mut params,
            &[Tensor::f32(vec![1], vec![0.123])],
            &[0],
        );
        let x = params[0].as_f32().unwrap()[0];
        assert_eq!(half::bf16::from_f32(x).to_f32(), x);
        assert!((x - 0.9877).abs() < 0.01);
    }
}
