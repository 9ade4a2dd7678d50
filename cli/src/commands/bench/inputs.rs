//! The inputs a bench feeds: seeded random values for every input of a plan, and the settings
//! that shrink a model to its minimal shape.

use mgn_compiler::elab::Setting;
use mgn_ir::tensor::{Data, Tensor};
use mgn_runtime::Plan;
use rand::{RngExt, SeedableRng};

/// Model arguments set to 1 for the minimal shape: the batch, and the sequence (one token).
pub(super) const BATCH_ARGS: [&str; 2] = ["B", "batch"];
pub(super) const SEQUENCE_ARGS: [&str; 2] = ["T", "frames"];
/// Integers that index nothing (masks, flags, timesteps only cast to floats) take 0 or 1.
const UNBOUNDED_INT_RANGE: i32 = 2;

/// Seeded random values for every input of `plan`, and the names of integer inputs that
/// nothing bounds (they get 0 or 1).
///
/// Refused (an error naming the model's largest tensors) before a value is drawn when the
/// inputs, with what a session of the plan holds and, on the CPU (`on_cpu`), the values of a
/// run, need more host memory than there is: `--set batch=2147483648` must not fill gigabytes
/// of random numbers, nor abort in the allocator. (A GPU session has already checked that its
/// arena fits the device when this is called.)
pub(super) fn random_inputs(
    plan: &Plan,
    seed: u64,
    on_cpu: bool,
) -> Result<(Vec<(String, Tensor)>, Vec<String>), String> {
    let inputs = plan.inputs.iter().map(|(_, v)| {
        let n = mgn_ir::shape::checked_numel(&plan.steps[*v as usize].shape);
        n.map_or(u64::MAX, |n| (n as u64).saturating_mul(4))
    });
    let mut need = mgn_runtime::memory::resident(plan);
    need.values = inputs.fold(0, u64::saturating_add);
    if on_cpu {
        need.values = need.values.saturating_add(mgn_runtime::memory::peak_values(plan));
    }
    mgn_runtime::memory::check(plan, need, "a benchmark").map_err(|e| e.to_string())?;
    Ok(draw(plan, seed))
}

fn draw(plan: &Plan, seed: u64) -> (Vec<(String, Tensor)>, Vec<String>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut unbounded = Vec::new();
    let tensors = plan
        .inputs
        .iter()
        .map(|(name, v)| {
            let s = &plan.steps[*v as usize];
            let n: usize = s.shape.iter().product();
            let data = if s.dtype.is_float() {
                // Box–Muller: N(0, 1) from two uniforms.
                Data::F32(
                    (0..n)
                        .map(|_| {
                            let (u, w): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
                            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()) as f32
                        })
                        .collect(),
                )
            } else {
                let hi = plan.int_input_range(*v).unwrap_or_else(|| {
                    unbounded.push(name.clone());
                    UNBOUNDED_INT_RANGE
                });
                Data::I32((0..n).map(|_| rng.random_range(0..hi.max(1))).collect())
            };
            (name.clone(), Tensor { dtype: s.dtype, shape: s.shape.clone(), data })
        })
        .collect();
    (tensors, unbounded)
}

/// The inputs by reference, as a session takes them.
pub(super) fn given(inputs: &[(String, Tensor)]) -> Vec<(&str, &Tensor)> {
    inputs.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

/// The settings that shrink the model to one sample and one token, for the arguments it has
/// (later settings win, so these override the user's). Empty when it has none of them.
pub(crate) fn minimal_settings(plan: &Plan) -> Vec<Setting> {
    BATCH_ARGS
        .iter()
        .chain(&SEQUENCE_ARGS)
        .filter(|n| plan.config.iter().any(|(k, _)| k == *n))
        .map(|n| Setting::new(*n, "1"))
        .collect()
}

/// Settings as one writes them: `B=1, T=1`.
pub(super) fn describe(settings: &[Setting]) -> String {
    settings.iter().map(|s| format!("{}={}", s.name, s.value)).collect::<Vec<_>>().join(", ")
}
