//! What one bench run found: the timings, the memory of each plan, GPU setup and profiles, and
//! the notes; plus the figures and names the JSON and the table both print.

use super::measure::Timing;
use crate::commands::plan::Engine;
use mgn_compiler::elab::Setting;
use mgn_gpu::memory::{plan_arena, plan_memory, PlanMemory};
use mgn_gpu::program::GpuPlan;
use mgn_ir::optim::{OptimizerKind, OptimizerSpec};
use mgn_runtime::Plan;

/// What one bench run found; printed as a table or as JSON.
pub(super) struct Report {
    pub(super) model: String,
    pub(super) config: Vec<(String, String)>,
    /// Elements of the model's tensors by kind (trainable parameters, buffers, ...).
    pub(super) counts: crate::commands::counts::Counts,
    /// `cpu`, `vulkan` or `metal`: where the sessions ran.
    pub(super) backend: &'static str,
    pub(super) device: String,
    pub(super) optimizer: String,
    pub(super) compile: Timing,
    pub(super) compile_train: Option<Timing>,
    /// One wall-clock compile of the minimal-shape plan (ms).
    pub(super) compile_minimal_ms: Option<f64>,
    /// On the GPU: moving each session onto the device.
    pub(super) setup: Option<Setup>,
    pub(super) forward: Timing,
    /// The settings of the minimal shape and its timing.
    pub(super) minimal: Option<Minimal>,
    pub(super) forward_backward: Option<Timing>,
    pub(super) train_step: Option<Timing>,
    pub(super) memory: Memory,
    /// The training plan's memory and the optimizer state's bytes.
    pub(super) memory_train: Option<(Memory, u64)>,
    /// `--profile`: per plan (forward, forward + backward), GPU time per op family and the
    /// slowest dispatches.
    pub(super) profile: Vec<(&'static str, Profiled)>,
    pub(super) notes: Vec<String>,
}

/// The forward at the minimal shape: the settings that shrink the model, the timing, and the
/// plan's memory.
pub(super) type Minimal = (Vec<Setting>, Timing, Memory);

/// One profiled plan, in milliseconds: (op family, dispatches, total), (dispatch, time), and
/// every dispatch in the order it ran (for `--trace`).
pub(super) struct Profiled {
    pub(super) by_op: Vec<(String, usize, f64)>,
    pub(super) slowest: Vec<(String, f64)>,
    pub(super) dispatches: Vec<mgn_runtime::gpu::Timed>,
}

impl Profiled {
    /// Per op family of `by_op` (in its order), the sum of `of` over its dispatches.
    fn per_family<T>(&self, of: impl Fn(&mgn_runtime::gpu::Timed) -> T) -> Vec<T>
    where
        T: Default + Copy + std::ops::AddAssign,
    {
        let mut by: std::collections::HashMap<&str, T> = Default::default();
        for d in &self.dispatches {
            *by.entry(family(&d.op)).or_default() += of(d);
        }
        self.by_op
            .iter()
            .map(|(op, _, _)| by.get(op.as_str()).copied().unwrap_or_default())
            .collect()
    }

    /// Per op family of `by_op`, the summed work of its dispatches.
    pub(super) fn work_by_op(&self) -> Vec<mgn_gpu::work::Work> {
        self.per_family(|d| d.work)
    }

    /// Per op family of `by_op`, the least time (ms) its dispatches take on a device of
    /// `peaks` (FLOP/s, bytes/s): the sum of each dispatch's floor, not the floor of the sum.
    pub(super) fn floor_ms_by_op(&self, (flops, bytes): (f64, f64)) -> Vec<f64> {
        self.per_family(|d| d.work.floor_s(flops, bytes) * 1e3)
    }
}

pub(super) use mgn_runtime::gpu::family;

/// Wall time (ms) of moving each session onto the GPU (`Session::use_gpu`: kernels, the arena,
/// uploading the parameters), one call each.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Setup {
    pub(super) inference: f64,
    pub(super) minimal: Option<f64>,
    pub(super) training: Option<f64>,
}

/// What a plan needs in memory: `plan_memory`'s counts, and the arena `plan_arena` lays out —
/// the one buffer the GPU backend allocates for the plan.
#[derive(Clone, Copy, Debug)]
pub(super) struct Memory {
    pub(super) plan: PlanMemory,
    /// The whole arena: parameters, inputs and every value's region after lifetime reuse.
    pub(super) arena_bytes: u64,
    /// The arena without the parameters (inputs and values): the planner's physical figure, to
    /// read against `logical_bytes` (no reuse) and `peak_live_bytes` (what any reuse must keep).
    pub(super) arena_values_bytes: u64,
    /// On the GPU: what its session allocated, after the GPU's own rewrites (fused steps hold
    /// no values, products read rounded views, weights held as halves) — the memory the run
    /// took, where the figures above describe the plan as compiled.
    pub(super) gpu: Option<mgn_gpu::ArenaSizes>,
}

impl Memory {
    pub(super) fn of(plan: &Plan) -> Memory {
        // The plan as compiled, before the GPU backend's own rewrites: the figures describe
        // what the compiler produced.
        let plan = GpuPlan::of(plan);
        let a = plan_arena(&plan);
        Memory {
            plan: plan_memory(&plan),
            arena_bytes: a.total_words as u64 * 4,
            arena_values_bytes: (a.total_words - a.param_words) as u64 * 4,
            gpu: None,
        }
    }
}

/// Bytes of the optimizer state a training plan keeps (per trained parameter, Adam's two
/// moments, SGD's momentum buffer): counted from the plan, so it holds wherever the session
/// keeps the state (host or device).
pub(super) fn optimizer_state_bytes(plan: &Plan) -> u64 {
    mgn_runtime::memory::resident(plan).optimizer
}

/// The optimizer the training step is timed with, as the table names it.
pub(super) fn optimizer_name(spec: &OptimizerSpec) -> String {
    match spec.kind {
        OptimizerKind::Sgd { .. } => format!("SGD, lr {}", spec.lr),
        OptimizerKind::Adam { .. } => format!("Adam, lr {}", spec.lr),
        OptimizerKind::AdamW { .. } => format!("AdamW, lr {}", spec.lr),
    }
}

/// The backend's name in the report and the JSON (`auto` as it was settled: the report comes
/// after the first session, so the notice, if any, is already out).
pub(super) fn backend_name(engine: Engine) -> &'static str {
    match engine.settle(crate::commands::report::MessageFormat::Json) {
        Engine::Cpu => "cpu",
        Engine::Auto => unreachable!("a settled engine is the GPU or the CPU"),
        Engine::Gpu { .. } if cfg!(any(target_os = "macos", target_os = "ios")) => "metal",
        Engine::Gpu { .. } => "vulkan",
    }
}

/// How the times were taken, in words (the table's header line and the JSON's `timing`).
pub(super) fn timing_basis(backend: &str) -> &'static str {
    match backend {
        "cpu" => "wall clock around each call",
        _ => {
            "wall clock around each call: uploading the inputs, one submission and the wait for \
             it (synchronized, like torch.cuda.synchronize() around a PyTorch call); forward and \
             forward + loss + backward leave their results on the device \
             (Session::run_resident); no GPU timestamps"
        }
    }
}
