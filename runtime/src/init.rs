//! Parameter initialization: deterministic, seeded per parameter.
//!
//! Each parameter draws from its own ChaCha8 stream, keyed by the run's seed and the parameter's
//! checkpoint name (not its position), so adding, removing or reordering parameters leaves every
//! other parameter's initial values unchanged. Sampling is written out here (53-bit uniforms,
//! Box–Muller normals) rather than taken from a distribution crate, so the values depend only on
//! the ChaCha8 stream, which is fixed by its specification.

use mgn_ir::hash::fnv1a64;
use mgn_ir::plan::InitSpec;
use mgn_ir::plan::ParamSpec;
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;
use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// SplitMix64's finalizer: a bijective mix of all 64 bits.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The random stream of parameter `name` under `seed`. The 256-bit key is
/// `seed ‖ h ‖ mix(seed ⊕ h) ‖ mix(h + len)` (little-endian words), with `h` the
/// FNV-1a hash of the name.
pub fn param_rng(seed: u64, name: &str) -> ChaCha8Rng {
    let h = fnv1a64(name.as_bytes());
    let words = [seed, h, mix64(seed ^ h), mix64(h.wrapping_add(name.len() as u64))];
    let mut key = [0u8; 32];
    for (chunk, w) in key.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// A uniform draw from [0, 1) with 53 random bits.
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// `n` values drawn from `init` (in f64), consuming the stream in a fixed order. A computed
/// init draws nothing: see [`compute`].
pub fn sample(init: &InitSpec, n: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
    match *init {
        InitSpec::Computed(_) => panic!("a computed init is not sampled; `compute` runs it"),
        InitSpec::Constant(v) => vec![v; n],
        InitSpec::Uniform { low, high } => (0..n).map(|_| low + (high - low) * unit(rng)).collect(),
        InitSpec::Normal { mean, std } => {
            // Box–Muller: each pair of uniforms gives two independent standard normals.
            let mut out = Vec::with_capacity(n + 1);
            while out.len() < n {
                let u1 = 1.0 - unit(rng); // (0, 1]: ln is finite
                let u2 = unit(rng);
                let r = (-2.0 * u1.ln()).sqrt();
                let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
                out.push(mean + std * r * c);
                out.push(mean + std * r * s);
            }
            out.truncate(n);
            out
        }
    }
}

/// The initial value of a parameter: floats in `F32` storage (rounded to `f16`/`bf16` precision
/// when declared so, so they equal what a checkpoint will hold), integers and `bool` in `I32`
/// storage (rounded to the nearest integer; `bool` is `value != 0`).
///
/// The stream depends on `seed` and `spec.name` only; `index`, the parameter's position in the
/// plan, is deliberately not part of it (see the module docs) and is used only in the panic
/// message for an impossible shape.
///
/// # Panics
/// When a computed init cannot run: apps that load plans they did not build use
/// [`try_initialize`] (as `Session::try_new` does).
pub fn initialize(spec: &ParamSpec, seed: u64, index: usize) -> Tensor {
    try_initialize(spec, seed, index).unwrap_or_else(|e| panic!("{e}"))
}

/// [`initialize`], with a computed init that cannot run (say, a table that gathers past the end
/// of another: typed, but refused by the reference backend) as an error naming the parameter.
pub fn try_initialize(spec: &ParamSpec, seed: u64, index: usize) -> Result<Tensor, String> {
    if let InitSpec::Computed(steps) = &spec.init {
        return compute(steps)
            .map_err(|e| format!("the init of `{}` cannot be computed: {e}", spec.name));
    }
    Ok(sampled(spec, seed, index))
}

/// A sampled (not computed) init's values.
fn sampled(spec: &ParamSpec, seed: u64, index: usize) -> Tensor {
    let n = spec.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or_else(|| {
        panic!("parameter {index} `{}` has an impossible shape {:?}", spec.name, spec.shape)
    });
    let mut rng = param_rng(seed, &spec.name);
    let values = sample(&spec.init, n, &mut rng);
    let data = match spec.dtype {
        DType::F32 => Data::F32(values.iter().map(|&v| v as f32).collect()),
        DType::F16 => Data::F32(values.iter().map(|&v| half::f16::from_f64(v).to_f32()).collect()),
        DType::BF16 => {
            Data::F32(values.iter().map(|&v| half::bf16::from_f64(v).to_f32()).collect())
        }
        DType::Bool => Data::I32(values.iter().map(|&v| (v != 0.0) as i32).collect()),
        DType::U32 => Data::I32(values.iter().map(|&v| v.round().max(0.0) as i32).collect()),
        DType::I32 | DType::I64 => Data::I32(values.iter().map(|&v| v.round() as i32).collect()),
        // A packed weight draws its f32 values and stores them quantized (`bench` of a
        // `--quantize`d plan without a checkpoint).
        packed => {
            let f: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            Data::Packed(mgn_ir::packed::quantize(packed, &f))
        }
    };
    Tensor { dtype: spec.dtype, shape: spec.shape.clone(), data }
}

/// Runs a computed init's steps on the host reference backend; the last step is the value.
/// The plan validator has typed every step (constants only, the last one of the tensor's
/// type), so an error here is a backend bug, which the caller reports with the tensor's name.
pub fn compute(steps: &[mgn_ir::plan::Step]) -> Result<Tensor, String> {
    let mut values: Vec<Tensor> = Vec::with_capacity(steps.len());
    for (i, s) in steps.iter().enumerate() {
        let inputs: Vec<&Tensor> = s.inputs.iter().map(|&x| &values[x as usize]).collect();
        let ctx = mgn_cpu::Ctx { training: false, seed: 0, node: i as u32 };
        let t = mgn_cpu::eval(&s.op, &inputs, s.dtype, &s.shape, &ctx)
            .map_err(|e| format!("step {i} (from {}): {e}", s.loc))?;
        values.push(t);
    }
    values.pop().ok_or_else(|| "it has no steps".to_string())
}

/// Initial values of all of a plan's parameters.
pub fn initialize_all(params: &[ParamSpec], seed: u64) -> Vec<Tensor> {
    params.iter().enumerate().map(|(i, p)| initialize(p, seed, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, shape: &[usize], init: InitSpec) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            dtype: DType::F32,
            shape: shape.to_vec(),
            init,
            trainable: true,
            frozen: false,
            persistent: true,
        }
    }

    fn mean_std(v: &[f32]) -> (f64, f64) {
        let n = v.len() as f64;
        let m = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n;
        (m, var.sqrt())
    }

    #[test]
    fn deterministic_and_keyed_by_name_not_position() {
        let a = spec("fc1.weight", &[16, 8], InitSpec::Normal { mean: 0.0, std: 1.0 });
        let b = spec("fc2.weight", &[16, 8], InitSpec::Normal { mean: 0.0, std: 1.0 });
        let t1 = initialize(&a, 7, 0);
        assert_eq!(t1, initialize(&a, 7, 0));
        assert_eq!(t1, initialize(&a, 7, 5), "position must not matter");
        assert_ne!(t1, initialize(&b, 7, 0), "other names get other streams");
        assert_ne!(t1, initialize(&a, 8, 0), "other seeds get other streams");
        // Adding a parameter in front leaves the others unchanged.
        let before = initialize_all(&[a.clone(), b.clone()], 3);
        let extra = spec("emb.weight", &[4], InitSpec::Uniform { low: -1.0, high: 1.0 });
        let after = initialize_all(&[extra, a, b], 3);
        assert_eq!(before[0], after[1]);
        assert_eq!(before[1], after[2]);
    }

    #[test]
    fn pinned_values_do_not_drift() {
        // If this fails, every model's initial weights changed: update it only on purpose.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c); // the published FNV-1a test vector
        let n =
            initialize(&spec("fc1.weight", &[4], InitSpec::Normal { mean: 0.0, std: 1.0 }), 0, 0);
        let u =
            initialize(&spec("fc1.bias", &[3], InitSpec::Uniform { low: -1.0, high: 1.0 }), 0, 0);
        assert_eq!(n.as_f32().unwrap(), &[-0.40618715f32, -1.4373572, -0.5962301, 1.2396317]);
        assert_eq!(u.as_f32().unwrap(), &[0.7572437f32, 0.9324722, 0.88642365]);
    }

    #[test]
    fn large_normal_has_the_right_moments() {
        let t =
            initialize(&spec("big", &[400, 500], InitSpec::Normal { mean: 0.5, std: 0.02 }), 1, 0);
        let v = t.as_f32().unwrap();
        let (m, s) = mean_std(v);
        // 200,000 samples: the mean's standard error is 0.02/447 ≈ 4.5e-5.
        assert!((m - 0.5).abs() < 3e-4, "mean {m}");
        assert!((s - 0.02).abs() < 2e-4, "std {s}");
        // Roughly 68.3% within one std.
        let within =
            v.iter().filter(|&&x| ((x as f64) - 0.5).abs() < 0.02).count() as f64 / v.len() as f64;
        assert!((within - 0.6827).abs() < 0.005, "{within}");
    }

    #[test]
    fn odd_length_normal_and_empty_shapes() {
        let t = initialize(&spec("odd", &[7], InitSpec::Normal { mean: 0.0, std: 1.0 }), 1, 0);
        assert_eq!(t.numel(), 7);
        assert!(t.as_f32().unwrap().iter().all(|x| x.is_finite()));
        let e = initialize(&spec("empty", &[0, 3], InitSpec::Normal { mean: 0.0, std: 1.0 }), 1, 0);
        assert_eq!(e.numel(), 0);
        let s = initialize(&spec("scalar", &[], InitSpec::Constant(2.5)), 1, 0);
        assert_eq!(s.as_f32().unwrap(), &[2.5]);
    }

    #[test]
    fn uniform_stays_in_bounds_and_fills_them() {
        let bound = 1.0 / 64f64.sqrt();
        let t = initialize(
            &spec("fc1.weight", &[128, 64], InitSpec::Uniform { low: -bound, high: bound }),
            42,
            0,
        );
        let v = t.as_f32().unwrap();
        assert!(v.iter().all(|&x| (x as f64) >= -bound - 1e-7 && (x as f64) <= bound + 1e-7));
        let (lo, hi) = v.iter().fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        assert!(lo < -0.99 * bound as f32 && hi > 0.99 * bound as f32, "{lo} {hi}");
        let (m, s) = mean_std(v);
        assert!(m.abs() < 0.01 * bound * 3.0, "mean {m}");
        // The std of U(-b, b) is b/sqrt(3).
        assert!((s - bound / 3f64.sqrt()).abs() < 0.01 * bound, "std {s}");
    }

    #[test]
    fn constants_and_other_dtypes() {
        let mut p = spec("ln.weight", &[5], InitSpec::Constant(1.0));
        assert_eq!(initialize(&p, 0, 0), Tensor::f32(vec![5], vec![1.0; 5]));
        p.dtype = DType::I64;
        p.init = InitSpec::Constant(0.0);
        let t = initialize(&p, 0, 0);
        assert_eq!((t.dtype, t.as_i32().unwrap()), (DType::I64, &[0; 5][..]));
        p.dtype = DType::BF16;
        p.init = InitSpec::Normal { mean: 0.0, std: 1.0 };
        let t = initialize(&p, 0, 0);
        assert_eq!(t.dtype, DType::BF16);
        for &x in t.as_f32().unwrap() {
            assert_eq!(
                half::bf16::from_f32(x).to_f32(),
                x,
                "bf16 values are exactly representable"
            );
        }
        p.dtype = DType::Bool;
        p.init = InitSpec::Constant(1.0);
        assert_eq!(initialize(&p, 0, 0).as_i32().unwrap(), &[1; 5]);
    }
}
