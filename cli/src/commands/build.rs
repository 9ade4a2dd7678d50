//! `mgnc build FILE [--emit summary|ir] [--mode infer|train -o OUT.mgnplan]`

use super::plan::{PrecisionArg, RewriteEngine};
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::graph::dump::{dump, thousands};
use mgn_compiler::lower::PlanOptions;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::Mode;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Emit {
    /// One line: trainable parameters (buffers, const tables and state apart), operations and
    /// build time.
    Summary,
    /// The graph IR: inputs, parameter table, every node with its shape and source line.
    Ir,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum PlanMode {
    Infer,
    Train,
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// The model to build (.mgn).
    pub file: PathBuf,
    /// What to print.
    #[arg(long, value_enum, default_value = "summary")]
    pub emit: Emit,
    /// Inference plan (outputs only) or training plan (loss, gradients, optimizer update).
    #[arg(long, value_enum, default_value = "infer")]
    pub mode: PlanMode,
    /// Write the plan to this `.mgnplan` file.
    #[arg(short, long, value_name = "OUT.mgnplan")]
    pub out: Option<PathBuf>,
    /// Override a model argument, e.g. `--set T=1` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
    /// Leave `dim` arguments open up to a bound: one plan that runs at any of these sizes,
    /// read off its inputs, e.g. `--dynamic B=32,T=512` or `T=16..512` (repeatable).
    #[arg(long = "dynamic", value_name = "NAME=MAX", value_delimiter = ',')]
    pub dynamic: Vec<mgn_ir::dynamic::SizeVar>,
    /// Which model to build when the file defines several.
    #[arg(long)]
    pub model: Option<String>,
    /// Freeze parameters whose name is this or starts with it and a dot (repeatable).
    #[arg(long, value_name = "NAME")]
    pub freeze: Vec<String>,
    /// The graph rewrites: greedy local rules, egglog's equality saturation, or none.
    #[arg(long, value_enum, default_value = "greedy")]
    pub rewrites: RewriteEngine,
    /// The precision policy: f32, or mixed (f16 or bf16 operands of matrix products,
    /// convolutions and attention, accumulated in f32); `full_precision(x)` keeps a part of a
    /// model in f32.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Store the weights the plan does not train in a packed type (q8_0, q4_0, q4_1, q4_k,
    /// q6_k): matrix products' and lookups' weights with at least 4096 elements whose last
    /// axis is whole blocks (`q4_k` falls back to `q4_1`, `q6_k` to `q8_0`).
    #[arg(long, value_name = "TYPE", value_parser = crate::commands::plan::parse_quantize)]
    pub quantize: Option<mgn_ir::DType>,
    #[arg(long = "message-format", value_enum, default_value = "human")]
    pub format: MessageFormat,
    /// Build again whenever the model or a file it imports changes, until Ctrl-C (`watch.rs`).
    #[arg(long)]
    pub watch: bool,
    /// Also print the plan's memory: logical bytes (one buffer per value), the planned arena
    /// (values sharing memory when their lifetimes do not overlap) and the lower bound.
    #[arg(long)]
    pub stats: bool,
}

pub fn run(a: BuildArgs) -> u8 {
    if a.watch {
        return super::watch::run(&a);
    }
    build(&a).0
}

/// Builds once, printing the diagnostics or the result. Returns the exit code and the files
/// to watch for changes: the model, the files it imports, and imports not found yet.
pub fn build(a: &BuildArgs) -> (u8, Vec<PathBuf>) {
    let mut files = vec![a.file.clone()];
    let code = build_into(a, &mut files);
    (code, files)
}

fn build_into(a: &BuildArgs, files: &mut Vec<PathBuf>) -> u8 {
    let start = Instant::now();
    let opts = match a.mode {
        PlanMode::Infer => PlanOptions::infer(),
        PlanMode::Train => PlanOptions::train(&a.freeze, OptimizerSpec::default()),
    };
    let opts = PlanOptions {
        rewrites: a.rewrites.into(),
        precision: a.precision.into(),
        quantize: a.quantize,
        ..opts
    };
    if !a.dynamic.is_empty() {
        if let Err(e) = mgn_ir::dynamic::check_sizes(&a.dynamic) {
            report::error(&format!("--dynamic: {e}"), a.format);
            return super::EXIT_ERRORS;
        }
    }
    let (outcome, plan) = match mgn_compiler::driver::plan_path_dynamic(
        &a.file,
        a.model.clone(),
        a.settings.clone(),
        &a.dynamic,
        &opts,
    ) {
        Ok(r) => r,
        Err(e) => {
            report::file_error(&a.file, &e, a.format);
            return super::EXIT_ERRORS;
        }
    };
    *files = super::watch::watched_files(&outcome.program);
    if !report::diagnostics(&outcome, a.format) {
        return super::EXIT_ERRORS;
    }
    let plan = plan.expect("a clean build lowers to a plan");
    super::plan::quantize_note(&plan, &opts, a.format);
    if let Some(out) = &a.out {
        if let Err(e) = plan.save(out) {
            report::error(&e.to_string(), a.format);
            return super::EXIT_ERRORS;
        }
    }
    let Some(kernels) = checked_kernels(&plan, a.format) else {
        return super::EXIT_ERRORS;
    };
    let elapsed = start.elapsed().as_secs_f64() * 1e3;
    let g = &outcome.graphs[0];
    let text = match a.emit {
        Emit::Ir => dump(g, &outcome.program.sources),
        Emit::Summary => {
            format!(
                "{}: {}, {} operations, {} {} plan of {} steps{}{}{}; built in {elapsed:.1} ms\n",
                g.model,
                super::counts::Counts::of(&plan).describe(),
                thousands(g.nodes.len()),
                if plan.mode == Mode::Train { "a" } else { "an" },
                if plan.mode == Mode::Train { "training" } else { "inference" },
                thousands(plan.steps.len()),
                if plan.grads.is_empty() {
                    String::new()
                } else {
                    format!(" with {} gradients", plan.grads.len())
                },
                dynamic_note(&plan),
                a.out.as_ref().map(|o| format!(", written to {}", o.display())).unwrap_or_default(),
            )
        }
    };
    let text = if a.stats {
        let gpu = match kernels.missing.first() {
            None => format!(
                "gpu: {} dispatches in {} levels, of {} distinct kernels, all generated and \
                 validated by naga; values planned {} and parameters held in {} as the GPU runs \
                 the plan (after its rewrites)\n",
                kernels.with_kernel,
                kernels.levels,
                kernels.distinct,
                mgn_ir::units::bytes(kernels.arena_values_bytes),
                mgn_ir::units::bytes(kernels.arena_param_bytes)
            ),
            Some((i, why)) => format!(
                "gpu: {} kernels validated; {} steps have none yet, first {why} (at {})\n",
                kernels.with_kernel,
                kernels.missing.len(),
                plan.steps[*i].loc
            ),
        };
        text + &memory_stats(&plan) + &gpu
    } else {
        text
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    0
}

/// Every GPU kernel of `plan` generated and validated by naga, at build time, for the guaranteed
/// device floor, with notes for plans no GPU runs; `None` (after reporting it) when naga rejects
/// a kernel, a compiler bug reported with its line.
fn checked_kernels(
    plan: &mgn_runtime::Plan,
    format: MessageFormat,
) -> Option<mgn_gpu::kernels::PlanKernels> {
    let kernels = mgn_gpu::kernels::check_plan(plan, &mgn_gpu::limits::DeviceLimits::MIN_SPEC);
    if let (Some(why), MessageFormat::Human) = (&kernels.too_large, format) {
        // The plan runs on the CPU; it is only too large for any GPU.
        eprintln!("note: this plan cannot run on a GPU: {why}");
    }
    if let (Some(why), MessageFormat::Human) = (&kernels.no_program, format) {
        eprintln!("note: this dynamic plan runs on the CPU only: {why}");
    }
    if let Some((i, e)) = kernels.invalid.first() {
        let s = &plan.steps[*i];
        report::error(
            &format!(
                "the GPU kernel for `{}` (step {i}, at {}) fails validation: {e}",
                s.op.describe(),
                s.loc
            ),
            format,
        );
        return None;
    }
    Some(kernels)
}

/// `, dynamic: B from 1 to 32, T from 1 to 512` for a dynamic plan.
fn dynamic_note(plan: &mgn_runtime::Plan) -> String {
    match &plan.dynamic {
        Some(d) => {
            let sizes: Vec<String> = d.sizes.iter().map(|v| v.to_string()).collect();
            format!(", dynamic: {}", sizes.join(", "))
        }
        None => String::new(),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The memory lines of `--stats`. Step values are counted at 4 bytes per element, as the GPU
/// arena stores them.
fn memory_stats(plan: &mgn_runtime::Plan) -> String {
    let plan = mgn_gpu::program::GpuPlan::of(plan);
    let m = mgn_gpu::memory::plan_memory(&plan);
    let a = mgn_gpu::memory::plan_arena(&plan);
    let planned = ((a.total_words - a.param_words) * 4) as u64;
    format!(
        "memory: parameters {}; values: logical {} (one buffer each), planned {} (arena, {} \
         pinned for inputs), lower bound {} (peak live)\n",
        mib(m.param_bytes),
        mib(m.logical_bytes),
        mib(planned),
        mib(((a.pinned_words - a.param_words) * 4) as u64),
        mib(m.peak_live_bytes),
    )
}
