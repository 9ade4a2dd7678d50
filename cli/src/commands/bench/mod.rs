//! `mgnc bench FILE [--set k=v]... [--backend …] [--warmup 5] [--samples 20] [--json]`: how
//! long a model takes to compile, run forward (at its shape and at a one-sample, one-token
//! shape), run forward + loss + backward, and take a training step; and how much memory its
//! plans need (`mgn_gpu::memory`).
//!
//! Every measurement is `--warmup` untimed calls, then `--samples` calls each timed with the wall
//! clock (`Instant`) around the one call; the report gives the median and the interquartile range
//! (p25–p75, linear interpolation). Inputs are seeded random: floats N(0, 1), integers uniform
//! below the bound `Plan::int_input_range` derives (the table an index reads, the class count a
//! label picks from), {0, 1} where nothing bounds them (masks, flags). NaN checks are off, so the
//! kernels are what is timed.
//!
//! On the GPU (`--backend vulkan`, or `auto` with a hardware GPU) the forward and the
//! forward + loss + backward are timed with `Session::run_resident`: the clock runs around
//! uploading the inputs, one submission and the wait for it, and the results stay on the device —
//! what PyTorch's timings with `torch.cuda.synchronize()` around each call measure. The training
//! step is `Session::train_step` as a user calls it, with whatever it moves between host and
//! device. Setting a session up on the GPU (kernels, arena, parameter upload) is timed once per
//! session and reported apart from the compile time.
//!
//! The parts: `inputs` makes the random inputs and the minimal-shape settings, `measure` times
//! calls and opens the sessions, `results` holds what one run found, and `json` and `table`
//! write it out.

mod inputs;
mod json;
mod measure;
mod results;
mod table;
mod trace;

pub(crate) use self::inputs::minimal_settings;
use self::inputs::{describe, given, random_inputs, BATCH_ARGS, SEQUENCE_ARGS};
use self::measure::{profile_of, timed_run, Bench, Timing};
use self::results::{
    backend_name, optimizer_name, optimizer_state_bytes, Memory, Minimal, Profiled, Report, Setup,
};
use super::plan::{resolve_backend, Backend, PrecisionArg, RewriteEngine};
use super::report::MessageFormat;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::optim::OptimizerSpec;
use mgn_runtime::Plan;
use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

/// Fewer timed samples than this make the interquartile range too rough to compare.
const MIN_SAMPLES: usize = 20;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The model to measure (.mgn).
    pub file: PathBuf,
    /// Override a model argument, e.g. `--set T=128` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
    /// Which model to measure when the file defines several.
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: Backend,
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
    /// Untimed calls before each measurement.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Timed calls per measurement; fewer than 20 is allowed with a warning.
    #[arg(long, default_value_t = MIN_SAMPLES)]
    pub samples: usize,
    /// Seed of the random inputs and the initial parameters.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object (on stdout) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Measure the inference plans only (the forward at the model's shape and at the minimal
    /// shape): no training plan is compiled, set up or run.
    #[arg(long)]
    pub inference: bool,
    /// On the GPU, also time one run per op family with GPU timestamps (one pass per dispatch).
    #[arg(long)]
    pub profile: bool,
    /// With the profile, write every dispatch's GPU time, op, shape and model line as a Chrome
    /// trace (Perfetto, chrome://tracing) to FILE, by default `MODEL.trace.json` beside the
    /// model — where `mgnc lsp` looks for it to show GPU time per line on hover.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub trace: Option<Option<PathBuf>>,
    /// With the profile, the device's f32 rate in TFLOP/s (an H200: about 67): each op family's
    /// time is set against its floor, `max(FLOPs / rate, bytes / copy rate)`.
    #[arg(long, value_name = "TFLOPS", requires = "peak_tbps")]
    pub peak_tflops: Option<f64>,
    /// With `--peak-tflops`, the device's copy rate in TB/s (an H200: about 4.3 measured).
    #[arg(long, value_name = "TBPS", requires = "peak_tflops")]
    pub peak_tbps: Option<f64>,
}

impl BenchArgs {
    /// Whether GPU timestamps are taken: `--profile`, or `--trace`, which needs them.
    fn profiles(&self) -> bool {
        self.profile || self.trace.is_some()
    }

    /// The device's rates for the roofline, in FLOP/s and bytes/s, when both are given.
    fn peaks(&self) -> Option<(f64, f64)> {
        Some((self.peak_tflops? * 1e12, self.peak_tbps? * 1e12))
    }
}

pub fn run(a: BenchArgs) -> u8 {
    let format = if a.json { MessageFormat::Json } else { MessageFormat::Human };
    if a.profiles() {
        // GPU timestamps must be requested when the device opens.
        std::env::set_var("MGN_PROFILE", "1");
    }
    let engine = match resolve_backend(a.backend, format) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let b = Bench {
        a: &a,
        format,
        progress: !a.json && std::io::stderr().is_terminal(),
        engine: Cell::new(engine),
        used_gpu: Cell::new(false),
    };
    match bench(&b) {
        Ok(r) => {
            if let Some(path) = &a.trace {
                let path = trace::path_for(path.as_deref(), &a.file);
                match trace::write(&path, &r, &a.file) {
                    Ok(()) => eprintln!("trace written to {}", path.display()),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return 1;
                    }
                }
            }
            let text =
                if a.json { format!("{}\n", json::to_json(&r, &a)) } else { table::table(&r, &a) };
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            0
        }
        Err(code) => code,
    }
}

/// Everything one run measures, in order: the compile times, the forward at the model's shape,
/// at the minimal shape, then forward + loss + backward and the training step.
fn bench(b: &Bench) -> Result<Report, u8> {
    let a = b.a;
    let mut notes = check_args(b)?;
    let (rewrites, precision) = (a.rewrites.into(), a.precision.into());
    let quantize = a.quantize;
    let infer = PlanOptions { rewrites, precision, quantize, ..PlanOptions::infer() };
    let spec = OptimizerSpec::default();
    let train =
        PlanOptions { rewrites, precision, quantize, ..PlanOptions::train(&[], spec.clone()) };
    let (outcome, plan) = b.compile(&a.settings, &infer)?;
    super::plan::quantize_note(&plan, &infer, b.format);
    let has_loss = outcome.graphs.first().is_some_and(|g| g.loss.is_some());
    // Whether the training plan is measured: a model with a loss, unless `--inference`.
    let trains = has_loss && !a.inference;
    let train_plan = if trains { Some(b.compile(&a.settings, &train)?.1) } else { None };
    let model = plan.model.clone();
    let config = plan.config.clone();

    let compile = b.measure_compile("compile (inference plan)", &a.settings, &infer)?;
    let compile_train = match trains {
        true => Some(b.measure_compile("compile (training plan)", &a.settings, &train)?),
        false => None,
    };

    let mut memory = Memory::of(&plan);
    let (mut s, gpu) = b.open(plan.clone(), &mut notes)?;
    let (inputs, unbounded) =
        random_inputs(&plan, a.seed, gpu.is_none()).map_err(|e| b.fail(&e))?;
    memory.gpu = s.gpu_arena_sizes();
    let device = match &gpu {
        Some((name, _)) => name.clone(),
        None => format!("CPU ({} threads)", mgn_cpu::threads()),
    };
    let mut setup = gpu.map(|(_, ms)| Setup { inference: ms, ..Setup::default() });
    let forward = b.measure("forward", || timed_run(&mut s, &given(&inputs)))?;
    let mut profile = Vec::new();
    if a.profiles() {
        profile.extend(profile_of(&mut s, &inputs).map(|p| ("forward", p)));
    }
    drop(s);

    let (minimal, compile_minimal_ms) = measure_minimal(b, &plan, &infer, &mut setup, &mut notes)?;
    let training = match train_plan {
        Some(tp) => measure_training(b, tp, &mut setup, &mut profile, &mut notes)?,
        None if a.inference => {
            notes.push("forward only, as `--inference` asked: no training plan".to_string());
            None
        }
        None => {
            notes.push(format!(
                "forward only: `{model}` has no loss, so there is no backward pass or training \
                 step to measure"
            ));
            None
        }
    };
    if !unbounded.is_empty() {
        notes.push(format!(
            "integer inputs that index nothing take 0 or 1: {}",
            unbounded.join(", ")
        ));
    }
    Ok(Report {
        model,
        config,
        counts: crate::commands::counts::Counts::of(&plan),
        backend: backend_name(b.engine.get()),
        device,
        optimizer: optimizer_name(&spec),
        compile,
        compile_train,
        compile_minimal_ms,
        setup,
        forward,
        minimal,
        forward_backward: training.as_ref().map(|t| t.forward_backward),
        train_step: training.as_ref().map(|t| t.train_step),
        memory,
        memory_train: training.as_ref().map(|t| (t.memory, t.optimizer_bytes)),
        profile,
        notes,
    })
}

/// Refuses what cannot be measured; the notes that samples too few or a debug build warrant.
fn check_args(b: &Bench) -> Result<Vec<String>, u8> {
    let a = b.a;
    if a.file.extension().is_some_and(|e| e == "mgnplan") {
        return Err(
            b.fail("`mgnc bench` measures compiling too: give the .mgn file, not a .mgnplan")
        );
    }
    if a.samples == 0 {
        return Err(b.fail("`--samples` must be at least 1"));
    }
    let mut notes = Vec::new();
    if a.samples < MIN_SAMPLES {
        let w = format!(
            "{} sample{} per measurement, fewer than {MIN_SAMPLES}: the median and interquartile \
             range are rough",
            a.samples,
            if a.samples == 1 { "" } else { "s" }
        );
        eprintln!("warning: {w}");
        notes.push(w);
    }
    if cfg!(debug_assertions) {
        notes.push(
            "this mgnc is a debug build: its timings say little; build with \
             `cargo build --release`"
                .into(),
        );
    }
    Ok(notes)
}

/// The forward at one sample and one token, when the model has arguments to shrink and is not
/// there already: the settings, the timing and the plan's memory; and the one compile it took.
fn measure_minimal(
    b: &Bench,
    plan: &Plan,
    infer: &PlanOptions,
    setup: &mut Option<Setup>,
    notes: &mut Vec<String>,
) -> Result<(Option<Minimal>, Option<f64>), u8> {
    let a = b.a;
    let shrink = minimal_settings(plan);
    let already = shrink.iter().all(|m| plan.config.iter().any(|(k, v)| *k == m.name && v == "1"));
    let mut compile_minimal_ms = None;
    let minimal = if shrink.is_empty() {
        notes.push(format!(
            "no minimal-shape latency: the model has no argument named {}",
            BATCH_ARGS
                .iter()
                .chain(&SEQUENCE_ARGS)
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        None
    } else if already {
        notes.push(format!(
            "no separate minimal-shape latency: the model is already at {} (the forward \
             measurement)",
            describe(&shrink)
        ));
        None
    } else {
        let mut settings = a.settings.clone();
        settings.retain(|s| !shrink.iter().any(|m| m.name == s.name));
        settings.extend(shrink.iter().cloned());
        let start = Instant::now();
        let built = mgn_compiler::driver::plan_path(&a.file, a.model.clone(), settings, infer)
            .map_err(|e| b.fail(&e))?;
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        match built {
            (_, Some(p)) => {
                compile_minimal_ms = Some(compile_ms);
                let mut mem = Memory::of(&p);
                match b.open_unless_too_large(p.clone(), notes)? {
                    Some((mut s, gpu)) => {
                        let (inputs, _) =
                            random_inputs(&p, a.seed, gpu.is_none()).map_err(|e| b.fail(&e))?;
                        mem.gpu = s.gpu_arena_sizes();
                        if let (Some(st), Some((_, ms))) = (setup, gpu) {
                            st.minimal = Some(ms);
                        }
                        let t = b.measure(&format!("forward at {}", describe(&shrink)), || {
                            timed_run(&mut s, &given(&inputs))
                        })?;
                        Some((shrink, t, mem))
                    }
                    None => None,
                }
            }
            (outcome, None) => {
                let why = outcome
                    .diagnostics
                    .first()
                    .map_or_else(String::new, |d| format!(": {}", d.message));
                notes.push(format!(
                    "no minimal-shape latency: the model does not build at {}{why}",
                    describe(&shrink)
                ));
                None
            }
        }
    };
    Ok((minimal, compile_minimal_ms))
}

/// What the training plan measures.
struct Training {
    forward_backward: Timing,
    train_step: Timing,
    memory: Memory,
    optimizer_bytes: u64,
}

/// Forward + loss + backward and the training step on the training plan `tp`; `None` when the
/// GPU cannot hold it (with a note).
fn measure_training(
    b: &Bench,
    tp: Plan,
    setup: &mut Option<Setup>,
    profile: &mut Vec<(&'static str, Profiled)>,
    notes: &mut Vec<String>,
) -> Result<Option<Training>, u8> {
    let a = b.a;
    let mut memory = Memory::of(&tp);
    let optimizer_bytes = optimizer_state_bytes(&tp);
    let Some((mut s, gpu)) = b.open_unless_too_large(tp.clone(), notes)? else {
        return Ok(None);
    };
    let (inputs, _) = random_inputs(&tp, a.seed, gpu.is_none()).map_err(|e| b.fail(&e))?;
    memory.gpu = s.gpu_arena_sizes();
    if let (Some(st), Some((_, ms))) = (setup, gpu) {
        st.training = Some(ms);
    }
    let forward_backward =
        b.measure("forward + loss + backward", || timed_run(&mut s, &given(&inputs)))?;
    if a.profiles() {
        profile.extend(profile_of(&mut s, &inputs).map(|p| ("forward + loss + backward", p)));
    }
    let train_step =
        b.measure("training step", || s.train_step(&given(&inputs)).map_err(|e| e.to_string()))?;
    if s.on_gpu() {
        notes.push(
            "the training step is Session::train_step as a user calls it, with whatever it \
             moves between host and device"
                .into(),
        );
    }
    Ok(Some(Training { forward_backward, train_step, memory, optimizer_bytes }))
}
