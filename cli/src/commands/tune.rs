//! `mgnc tune FILE [--set k=v]... [--precision …] [--quantize T] [--cache DIR] [--json]`: opens
//! a GPU session for each plan `mgnc bench` and `mgnc run` would make of the model — the
//! inference plan at its shape, at one sample and one token, and the training plan when it has
//! a loss — so that every kernel the device chooses by measurement
//! (`mgn_gpu::session::choices`) is measured now and its verdict kept, and a later session of
//! those shapes (an app's first run included) opens without measuring.
//!
//! A `.mgnplan` (the plan an app ships) is opened as it is, alone.
//!
//! Each plan is opened twice: the first open measures what no verdict settles yet, the second
//! shows what a session costs once they are kept. With `--cache DIR` the verdicts go to `DIR`
//! (an app ships that folder beside its plan and points `mgn_runtime::set_cache_dir` at it),
//! else to the default (`MGN_CACHE`, else `~/.cache/mgn`). The device's file is written even
//! when nothing needed measuring, so the folder always says which devices were tuned.
//!
//! Pipelines: blade-graphics 0.9 creates every pipeline with no `VkPipelineCache`, so mgn keeps
//! none of its own; the driver's shader cache (NVIDIA's `~/.cache/nvidia/GLCache`, Mesa's
//! `~/.cache/mesa_shader_cache`) keeps the compiled kernels on this machine, and tuning fills it
//! as a side effect.

use super::bench::minimal_settings;
use super::plan::PrecisionArg;
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::optim::OptimizerSpec;
use mgn_runtime::{Plan, Session};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct TuneArgs {
    /// The model to tune for (.mgn: its inference, minimal-shape and training plans), or one
    /// built plan (.mgnplan: that plan alone).
    pub file: PathBuf,
    /// Override a model argument, e.g. `--set T=128` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
    /// Which model to tune when the file defines several.
    #[arg(long)]
    pub model: Option<String>,
    /// The precision policy of the plans (as `mgnc bench --precision`).
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Store the weights the plan does not train in a packed type (as `mgnc bench --quantize`).
    #[arg(long, value_name = "TYPE", value_parser = crate::commands::plan::parse_quantize)]
    pub quantize: Option<mgn_ir::DType>,
    /// Keep the verdicts in DIR (its `choices/` folder) instead of the default cache.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// The inference plans only: no training plan is compiled or opened.
    #[arg(long)]
    pub inference: bool,
    /// Print one JSON object (on stdout) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One plan's two opens.
struct Tuned {
    plan: String,
    /// Kernels measured by the first open (one a distinct shape), and steps a kept verdict
    /// settled then.
    measured: usize,
    cached: usize,
    /// The same for the second open: nothing measured once the first kept its verdicts.
    measured_again: usize,
    /// Distinct pipelines the plan's session compiled (the kernels kept, once a verdict is).
    pipelines: usize,
    /// Of the first open's time: compiling pipelines, and measuring kernels (ms).
    compiling: f64,
    measuring: f64,
    first: f64,
    second: f64,
}

pub fn run(a: TuneArgs) -> u8 {
    let format = if a.json { MessageFormat::Json } else { MessageFormat::Human };
    if let Some(dir) = &a.cache {
        mgn_runtime::set_cache_dir(Some(dir.clone()));
    }
    mgn_gpu::session::write_always(true);
    match tune(&a, format) {
        Ok((device, rows)) => {
            let cache = mgn_gpu::session::verdicts_file(&device);
            let text =
                if a.json { json(&device, cache, &rows) } else { table(&device, cache, &rows) };
            print!("{text}");
            0
        }
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            super::EXIT_ERRORS
        }
    }
}

/// Every plan compiled and opened twice; the device's name and one row a plan. An empty error
/// was reported already (the model's diagnostics).
fn tune(a: &TuneArgs, format: MessageFormat) -> Result<(String, Vec<Tuned>), String> {
    let precision = a.precision.into();
    let quantize = a.quantize;
    let infer = PlanOptions { precision, quantize, ..PlanOptions::infer() };
    let train =
        PlanOptions { precision, quantize, ..PlanOptions::train(&[], OptimizerSpec::default()) };
    let build = |settings: &[Setting], opts: &PlanOptions| -> Result<(bool, Plan), String> {
        let (outcome, plan) =
            mgn_compiler::driver::plan_path(&a.file, a.model.clone(), settings.to_vec(), opts)?;
        if !report::diagnostics(&outcome, format) {
            return Err(String::new());
        }
        let has_loss = outcome.graphs.first().is_some_and(|g| g.loss.is_some());
        Ok((has_loss, plan.expect("a clean build lowers to a plan")))
    };
    let mut plans = Vec::new();
    if a.file.extension().is_some_and(|e| e == "mgnplan") {
        let plan =
            super::plan::obtain(&a.file, a.model.clone(), a.settings.clone(), &infer, format)
                .map_err(|_| String::new())?;
        plans.push((format!("{} ({})", mode(&plan), config(&plan)), plan));
        return open_each(plans);
    }
    let (has_loss, plan) = build(&a.settings, &infer)?;
    plans.push((format!("inference ({})", config(&plan)), plan.clone()));
    // The minimal shape, as `mgnc bench` measures it, where the model has one to shrink.
    let shrink = minimal_settings(&plan);
    let already = shrink.iter().all(|m| plan.config.iter().any(|(k, v)| *k == m.name && v == "1"));
    if !shrink.is_empty() && !already {
        let mut settings = a.settings.clone();
        settings.retain(|s| !shrink.iter().any(|m| m.name == s.name));
        settings.extend(shrink.iter().cloned());
        let (_, p) = build(&settings, &infer)?;
        plans.push((format!("inference ({})", config(&p)), p));
    }
    if has_loss && !a.inference {
        let (_, p) = build(&a.settings, &train)?;
        plans.push((format!("training ({})", config(&p)), p));
    }
    open_each(plans)
}

/// Each plan opened twice on the GPU: the device's name and one row a plan.
fn open_each(plans: Vec<(String, Plan)>) -> Result<(String, Vec<Tuned>), String> {
    let mut device = String::new();
    let mut rows = Vec::new();
    for (name, plan) in plans {
        let open = |plan: Plan| -> Result<Opened, String> {
            let mut s = Session::try_new(plan, 0).map_err(|e| format!("{name}: {e}"))?;
            let start = Instant::now();
            let device = s.use_gpu().map_err(|e| format!("{name}: no GPU session: {e}"))?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let pipelines = s.gpu_shape().map_or(0, |(kernels, _)| kernels);
            let phases = s.gpu_setup_phases();
            let phase = |name: &str| {
                let t = phases.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
                t.unwrap_or_default().as_secs_f64() * 1e3
            };
            let (compiling, measuring) = (phase("pipelines"), phase("kernels measured"));
            Ok(Opened { device, choices: s.gpu_choices(), pipelines, ms, compiling, measuring })
        };
        let first = open(plan.clone())?;
        let second = open(plan)?;
        let (measured, cached) = first.choices;
        let measured_again = second.choices.0;
        eprintln!("tuned {name}: {measured} measured, {cached} already kept");
        rows.push(Tuned {
            plan: name,
            measured,
            cached,
            measured_again,
            pipelines: second.pipelines,
            compiling: first.compiling,
            measuring: first.measuring,
            first: first.ms,
            second: second.ms,
        });
        device = second.device;
    }
    Ok((device, rows))
}

fn mode(plan: &Plan) -> &'static str {
    match plan.mode {
        mgn_ir::plan::Mode::Train => "training",
        mgn_ir::plan::Mode::Infer => "inference",
    }
}

/// One open of a plan: the device, `Session::gpu_choices`, the pipelines compiled, and its
/// setup time with two of its phases (ms).
struct Opened {
    device: String,
    choices: (usize, usize),
    pipelines: usize,
    ms: f64,
    compiling: f64,
    measuring: f64,
}

/// A plan's settings as one writes them: `B=4, T=128`.
fn config(plan: &Plan) -> String {
    let each: Vec<String> = plan.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if each.is_empty() {
        "defaults".into()
    } else {
        each.join(", ")
    }
}

fn table(device: &str, cache: Option<PathBuf>, rows: &[Tuned]) -> String {
    let w = rows.iter().map(|r| r.plan.len()).max().unwrap_or(4).max(4);
    let mut out = format!(
        "{:w$}  {:>8}  {:>13}  {:>9}  {:>15}  {:>16}\n",
        "plan", "measured", "already kept", "pipelines", "first open, ms", "second open, ms"
    );
    for r in rows {
        out.push_str(&format!(
            "{:w$}  {:>8}  {:>13}  {:>9}  {:>15.1}  {:>16.1}\n",
            r.plan, r.measured, r.cached, r.pipelines, r.first, r.second
        ));
    }
    let again: usize = rows.iter().map(|r| r.measured_again).sum();
    out.push_str(&format!("device: {device}; measured again on the second open: {again}\n"));
    match cache {
        Some(p) => out.push_str(&format!("verdicts: {}\n", p.display())),
        None => out.push_str("verdicts: not kept (no cache folder: give --cache DIR)\n"),
    }
    out.push_str(
        "pipelines: kept by the driver's shader cache on this machine (blade-graphics 0.9 \
         takes no pipeline cache)\n",
    );
    out
}

fn json(device: &str, cache: Option<PathBuf>, rows: &[Tuned]) -> String {
    let plans: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "plan": r.plan,
                "measured": r.measured,
                "already_kept": r.cached,
                "measured_again": r.measured_again,
                "pipelines": r.pipelines,
                "first_open_compiling_ms": r.compiling,
                "first_open_measuring_ms": r.measuring,
                "first_open_ms": r.first,
                "second_open_ms": r.second,
            })
        })
        .collect();
    let cache = cache.map(|p| p.display().to_string());
    let v = serde_json::json!({ "device": device, "verdicts": cache, "plans": plans });
    format!("{v}\n")
}
