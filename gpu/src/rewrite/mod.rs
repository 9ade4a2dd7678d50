//! The rewrites a GPU session makes before it plans memory and generates kernels, in order: an
//! inference plan's dropouts read through (`identity_dropouts`), gathers at counted indices
//! made slices (`counted_gathers`), state
//! parameters written in place (`state_in_place`), with the keys' rotation where only that
//! write reads it (`rope_scatter`), long attentions through their score matrix
//! (`attention_matmul`), the others' statistics computed once (`attention_stats`), norm weight
//! derivatives and cross-entropy losses split over rows (`norm_partials`, `loss_rows`), an
//! inference plan's batch norms as element-wise steps (`running_norms`), element-wise fusion
//! (`fuse`), a training plan's batch norms over chunks of their channels (`batch_moments`),
//! the ones without a residual computed again for the backward pass (`recompute`), transposes
//! folded into the products that read them (`transposes`),
//! weight derivatives over a batch made one product (`batch_grads`), then products and convolutions
//! that would leave the GPU idle split along k (`split_k`), a gate product of a few rows
//! computed with the product whose epilogue reads it (`product_pairs`), row norms computed
//! by the f32 products that read them (`normed_products`: a few rows' always, tiled ones
//! where asked), permutes stored by the steps whose
//! results they permute (`permuted_stores`), and last half-typed results only
//! where kernels can write them, and an inference plan's weights held as the halves its
//! products read (`halves`). Each edits the [`Program`] by step id;
//! positions are assigned once, at the end. The CPU backend runs plans as compiled.

mod attention_matmul;
mod attention_stats;
mod batch_grads;
mod batch_moments;
mod counted_gathers;
mod fuse;
mod halves;
mod identity_dropouts;
mod loss_rows;
mod norm_partials;
mod normed_products;
mod permuted_stores;
mod product_pairs;
mod recompute;
mod rope_scatter;
mod running_norms;
mod split_k;
mod state_in_place;
mod transposes;

pub use attention_matmul::AttentionPath;

use crate::program::{Choices, GpuOp, GpuPlan, Program};
use mgn_ir::plan::Plan;

/// The choices a rewrite leaves open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// `Auto` in every session (decided: `AttentionPath`); the others for tests.
    pub attention: AttentionPath,
    /// The plan is dynamic (`crate::dynamic`): passes whose steps' shapes would not follow
    /// the sizes as polynomials (norm weight derivatives in chunks of rows) are left out.
    pub dynamic: bool,
    /// Batch norms computed again for the backward pass rather than kept (`recompute`): less
    /// memory for one more pass over each. On in every session (decided: ResNet-50's training
    /// arena 483 → 427 MiB, below PyTorch's peak; `MGN_RECOMPUTE`, its switch, is gone); off
    /// only in tests, to compare.
    pub recompute: bool,
    /// Which tiled f32 products compute the layer and RMS norms they read
    /// (`normed_products`): none unless `MGN_NORMED_PRODUCTS` says (`whole`, or `1` for split
    /// ones too). Products of a few rows (decoding) take theirs whatever it says.
    pub normed_products: NormedProducts,
    /// What the device's kernels are sized for, where the program is made for one: an
    /// attention it can run whole on cooperative matrices stays whole (`attention_matmul`).
    pub target: Option<crate::kernels::Target>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            attention: AttentionPath::default(),
            dynamic: false,
            recompute: true,
            normed_products: NormedProducts::None,
            target: None,
        }
    }
}

impl Options {
    /// These options for a program made for a device with `limits`.
    pub fn for_device(&self, limits: &crate::limits::DeviceLimits) -> Options {
        Options { target: Some(crate::kernels::Target::of(limits)), ..*self }
    }

    /// The defaults, with what the environment overrides (`MGN_NORMED_PRODUCTS`).
    pub fn from_env() -> Result<Options, String> {
        let env = |name: &str| std::env::var(name).ok();
        let normed_products = NormedProducts::from_env(env("MGN_NORMED_PRODUCTS").as_deref())?;
        Ok(Options { normed_products, ..Options::default() })
    }
}

/// Which tiled products compute the norms they read (`normed_products`;
/// `MGN_NORMED_PRODUCTS`); a few rows' always do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormedProducts {
    /// `0`, or unset: every norm a tiled product reads keeps its own dispatch.
    None,
    /// `whole`: products that walk all of k, which take the rows' statistics from the panels
    /// they stage.
    Whole,
    /// `1`: split products too, each workgroup finding its rows' statistics first.
    All,
}

impl NormedProducts {
    /// `MGN_NORMED_PRODUCTS`'s value (`None`: unset).
    pub(crate) fn from_env(value: Option<&str>) -> Result<NormedProducts, String> {
        if value == Some("whole") {
            return Ok(NormedProducts::Whole);
        }
        let all =
            on_off("MGN_NORMED_PRODUCTS", value, false).map_err(|e| format!("{e} or `whole`"))?;
        Ok(if all { NormedProducts::All } else { NormedProducts::None })
    }
}

/// The value of the on/off switch `name`, given as `value` (`None`: unset): `1` or `0`, and
/// `default` when unset or empty; anything else is an error naming the switch.
fn on_off(name: &str, value: Option<&str>, default: bool) -> Result<bool, String> {
    match value {
        None | Some("") => Ok(default),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(format!("{name}={other:?}: expected `0` or `1`")),
    }
}

/// The program the GPU runs for `plan`, with the options the environment sets (the defaults
/// where it sets an unknown value: a session reports that before it gets here). Its steps keep
/// the compiled plan's numbers as ids, so dropout masks and messages match the CPU's.
pub fn for_gpu(plan: &Plan) -> GpuPlan {
    for_gpu_with(plan, &Options::from_env().unwrap_or_default())
}

/// `for_gpu` with the given options.
pub fn for_gpu_with(plan: &Plan, options: &Options) -> GpuPlan {
    for_gpu_choosing(plan, options, Choices::default()).0
}

/// `for_gpu_with` for a device that holds `limits` and has `memory` bytes (when known): where
/// attentions through their score matrices would make an arena larger than the device holds
/// (Whisper's 1,500 positions, 148 MiB, on a device whose bindings hold 128 MiB), they run
/// whole instead, through the attention kernels that never store the scores — slower where
/// both fit, but a plan that runs. Only when `options` leave the path to `Auto` (or `Tiles`).
pub fn for_device(
    plan: &Plan,
    options: &Options,
    limits: &crate::limits::DeviceLimits,
    memory: Option<u64>,
) -> GpuPlan {
    let options = &options.for_device(limits);
    let made = for_gpu_with(plan, options);
    let whole = |o: &Options| Some(for_gpu_with(plan, o));
    whole_where_scores_do_not_fit(made, whole, |p| p, options, limits, memory)
}

/// `made`, made under `options`; or, where it holds attention score matrices (the path left
/// to `Auto`) in an arena past the device and the attention run whole fits, what
/// `make_whole` makes with attention whole (None where that fails). `program` finds the GPU
/// plan in what is made: `for_device` for a static plan, `dynamic::program_for_device` for a
/// dynamic one.
pub fn whole_where_scores_do_not_fit<T>(
    made: T,
    make_whole: impl FnOnce(&Options) -> Option<T>,
    program: impl Fn(&T) -> &GpuPlan,
    options: &Options,
    limits: &crate::limits::DeviceLimits,
    memory: Option<u64>,
) -> T {
    let p = program(&made);
    let scores = p.steps.iter().any(|s| matches!(s.op, GpuOp::AttentionProbs { .. }));
    let auto = matches!(options.attention, AttentionPath::Auto | AttentionPath::Tiles);
    if !auto || !scores {
        return made;
    }
    // Every value in words of its own: a bound that the arena's reuse only lowers, and cheap.
    let bound: usize = p.steps.iter().map(|s| crate::memory::value_words(s.dtype, &s.shape)).sum();
    if crate::memory::check_fits(p, bound, limits, memory).is_ok()
        || fits_the_device(p, limits, memory)
    {
        return made;
    }
    match make_whole(&Options { attention: AttentionPath::Tiled, ..*options }) {
        Some(whole) if fits_the_device(program(&whole), limits, memory) => whole,
        _ => made,
    }
}

/// Whether `program`'s planned arena fits the device.
pub fn fits_the_device(
    program: &GpuPlan,
    limits: &crate::limits::DeviceLimits,
    memory: Option<u64>,
) -> bool {
    let words = crate::memory::plan_arena(program).total_words;
    crate::memory::check_fits(program, words, limits, memory).is_ok()
}

/// `for_gpu_with`, its passes choosing by size as `choices` say; the choices they made.
pub fn for_gpu_choosing(plan: &Plan, options: &Options, choices: Choices) -> (GpuPlan, Choices) {
    let mut program = Program::with_choices(plan, choices);
    identity_dropouts::read_through_dropouts(&mut program);
    counted_gathers::slice_counted_gathers(&mut program, options.dynamic);
    state_in_place::write_state_in_place(&mut program);
    rope_scatter::fold_rotations(&mut program);
    attention_matmul::materialise_attention(&mut program, options.attention, options.target);
    attention_stats::add_attention_stats(&mut program);
    if !options.dynamic {
        norm_partials::split_norm_weight_grads(&mut program);
    }
    loss_rows::split_cross_entropy(&mut program);
    running_norms::expand_running_norms(&mut program);
    fuse::fuse_elementwise(&mut program);
    if !options.dynamic {
        batch_moments::use_batch_moments(&mut program);
        if options.recompute {
            recompute::recompute_batch_norms(&mut program);
        }
    }
    transposes::fold_transposes(&mut program);
    batch_grads::fold_batch_grads(&mut program);
    split_k::split_products(&mut program);
    split_k::split_convolutions(&mut program);
    // Static plans only: the pair's kernel is one for a few rows, which a dynamic size may pass.
    if !options.dynamic {
        product_pairs::pair_products(&mut program);
    }
    if !options.dynamic {
        normed_products::fold_norms(&mut program, options.normed_products);
    }
    if !options.dynamic {
        // Static plans only: the kernel that rotates queries is the decode one, for few rows.
        rope_scatter::fold_query_rotations(&mut program);
        permuted_stores::fold_permutes(&mut program);
    }
    halves::legalize_halves(&mut program);
    halves::hold_params_as_halves(&mut program);
    (program.to_gpu_plan(), program.choices().clone())
}
