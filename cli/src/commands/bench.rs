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

use super::plan::{resolve_backend, Backend, Engine};
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::graph::dump::thousands;
use mgn_compiler::lower::PlanOptions;
use mgn_gpu::memory::{plan_arena, plan_memory, PlanMemory};
use mgn_ir::optim::{OptimizerKind, OptimizerSpec};
use mgn_ir::plan::Mode;
use mgn_ir::tensor::{Data, Tensor};
use mgn_runtime::session::{RunOutput, Session};
use mgn_runtime::Plan;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

/// Fewer timed samples than this make the interquartile range too rough to compare.
const MIN_SAMPLES: usize = 20;
/// Model arguments set to 1 for the minimal shape: the batch, and the sequence (one token).
const BATCH_ARGS: [&str; 2] = ["B", "batch"];
const SEQUENCE_ARGS: [&str; 2] = ["T", "frames"];
/// Integers that index nothing (masks, flags, timesteps only cast to floats) take 0 or 1.
const UNBOUNDED_INT_RANGE: i32 = 2;

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
    /// On the GPU, also time one run per op family with GPU timestamps (one pass per dispatch).
    #[arg(long)]
    pub profile: bool,
}

/// Median and interquartile range of one measurement, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub median_ms: f64,
    pub p25_ms: f64,
    pub p75_ms: f64,
    pub samples: usize,
}

impl Timing {
    /// From durations in milliseconds (any order, at least one).
    pub fn from_samples(mut ms: Vec<f64>) -> Timing {
        ms.sort_by(f64::total_cmp);
        Timing {
            median_ms: quantile(&ms, 0.5),
            p25_ms: quantile(&ms, 0.25),
            p75_ms: quantile(&ms, 0.75),
            samples: ms.len(),
        }
    }

    fn json(&self) -> Value {
        json!({ "median_ms": self.median_ms, "p25_ms": self.p25_ms, "p75_ms": self.p75_ms, "samples": self.samples })
    }
}

/// The `q` quantile of sorted values, interpolating linearly between neighbours (NumPy's default).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

struct Bench<'a> {
    a: &'a BenchArgs,
    format: MessageFormat,
    progress: bool,
    /// Where the sessions run; under `auto` it becomes `Engine::Cpu` when the first session
    /// cannot use the GPU.
    engine: Cell<Engine>,
    /// A session of this bench has run on the GPU (so falling back now would mix backends).
    used_gpu: Cell<bool>,
}

impl Bench<'_> {
    /// `--warmup` untimed calls, then `--samples` calls timed one by one. What a call returns
    /// is dropped after its clock stops.
    fn measure<T>(
        &self,
        what: &str,
        mut call: impl FnMut() -> Result<T, String>,
    ) -> Result<Timing, u8> {
        let total = self.a.warmup + self.a.samples;
        let mut ms = Vec::with_capacity(self.a.samples);
        for i in 0..total {
            if self.progress {
                let (phase, n, of) = if i < self.a.warmup {
                    ("warm-up", i + 1, self.a.warmup)
                } else {
                    ("sample", i + 1 - self.a.warmup, self.a.samples)
                };
                eprint!("\r\x1b[2K{what}: {phase} {n}/{of}");
            }
            let start = Instant::now();
            let r = call();
            let elapsed = start.elapsed().as_secs_f64() * 1e3;
            let r = r.map_err(|e| self.fail(&format!("{what}: {e}")))?;
            drop(r);
            if i >= self.a.warmup {
                ms.push(elapsed);
            }
        }
        if self.progress {
            eprint!("\r\x1b[2K");
        }
        Ok(Timing::from_samples(ms))
    }

    fn fail(&self, msg: &str) -> u8 {
        report::error(msg, self.format);
        super::EXIT_ERRORS
    }

    /// Compiles the model, printing diagnostics when it does not build.
    fn compile(
        &self,
        settings: &[Setting],
        opts: &PlanOptions,
    ) -> Result<(mgn_compiler::Outcome, Plan), u8> {
        let (outcome, plan) = mgn_compiler::driver::plan_path(
            &self.a.file,
            self.a.model.clone(),
            settings.to_vec(),
            opts,
        )
        .map_err(|e| self.fail(&e))?;
        if !report::diagnostics(&outcome, self.format) {
            return Err(super::EXIT_ERRORS);
        }
        Ok((outcome, plan.expect("a clean build lowers to a plan")))
    }

    /// The compile time from the .mgn text to a plan: check, elaborate, (autodiff,) lower. The
    /// outcome and plan are dropped after the clock stops.
    fn measure_compile(
        &self,
        what: &str,
        settings: &[Setting],
        opts: &PlanOptions,
    ) -> Result<Timing, u8> {
        self.measure(what, || {
            match mgn_compiler::driver::plan_path(
                &self.a.file,
                self.a.model.clone(),
                settings.to_vec(),
                opts,
            )? {
                (outcome, Some(plan)) => Ok((outcome, plan)),
                (outcome, None) => Err(outcome
                    .diagnostics
                    .first()
                    .map_or("does not build".into(), |d| d.message.clone())),
            }
        })
    }
}

/// Seeded random values for every input of `plan`, and the names of integer inputs that
/// nothing bounds (they get 0 or 1).
pub fn random_inputs(plan: &Plan, seed: u64) -> (Vec<(String, Tensor)>, Vec<String>) {
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

fn given(inputs: &[(String, Tensor)]) -> Vec<(&str, &Tensor)> {
    inputs.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

fn session(plan: Plan, seed: u64) -> Session {
    let mut s = Session::new(plan, seed);
    s.check_numerics = false;
    s
}

/// The settings that shrink the model to one sample and one token, for the arguments it has
/// (later settings win, so these override the user's). Empty when it has none of them.
fn minimal_settings(plan: &Plan) -> Vec<Setting> {
    BATCH_ARGS
        .iter()
        .chain(&SEQUENCE_ARGS)
        .filter(|n| plan.config.iter().any(|(k, _)| k == *n))
        .map(|n| Setting { name: n.to_string(), value: "1".into() })
        .collect()
}

/// Bytes of the optimizer state a training plan keeps: per trained parameter, Adam's two moments,
/// SGD's momentum buffer (none without momentum). Counted from the plan and the optimizer, not
/// read from a session, so it holds wherever the session keeps the state (host or device).
fn optimizer_state_bytes(plan: &Plan) -> u64 {
    let buffers = match plan.optimizer.kind {
        OptimizerKind::Sgd { momentum } if momentum == 0.0 => 0,
        OptimizerKind::Sgd { .. } => 1,
        OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => 2,
    };
    plan.grads.iter().map(|(p, _)| plan.params[*p].numel() as u64 * 4 * buffers).sum()
}

fn optimizer_name(spec: &OptimizerSpec) -> String {
    match spec.kind {
        OptimizerKind::Sgd { .. } => format!("SGD, lr {}", spec.lr),
        OptimizerKind::Adam { .. } => format!("Adam, lr {}", spec.lr),
        OptimizerKind::AdamW { .. } => format!("AdamW, lr {}", spec.lr),
    }
}

/// A config value as JSON: numbers and booleans as such, anything else as text.
fn config_value(v: &str) -> Value {
    if let Ok(i) = v.parse::<i64>() {
        return json!(i);
    }
    if let Ok(f) = v.parse::<f64>() {
        if f.is_finite() {
            return json!(f);
        }
    }
    match v {
        "true" => json!(true),
        "false" => json!(false),
        _ => json!(v),
    }
}

/// What a plan needs in memory: `plan_memory`'s counts, and the arena `plan_arena` lays out —
/// the one buffer the GPU backend allocates for the plan.
#[derive(Clone, Copy, Debug)]
struct Memory {
    plan: PlanMemory,
    /// The whole arena: parameters, inputs and every value's region after lifetime reuse.
    arena_bytes: u64,
    /// The arena without the parameters (inputs and values): the planner's physical figure, to
    /// read against `logical_bytes` (no reuse) and `peak_live_bytes` (what any reuse must keep).
    arena_values_bytes: u64,
}

impl Memory {
    fn of(plan: &Plan) -> Memory {
        let a = plan_arena(plan);
        Memory {
            plan: plan_memory(plan),
            arena_bytes: a.total_words as u64 * 4,
            arena_values_bytes: (a.total_words - a.param_words) as u64 * 4,
        }
    }
}

fn memory_json(m: &Memory, optimizer: Option<u64>) -> Value {
    let mut v = json!({
        "param_bytes": m.plan.param_bytes,
        "input_bytes": m.plan.input_bytes,
        "logical_bytes": m.plan.logical_bytes,
        "peak_live_bytes": m.plan.peak_live_bytes,
        "arena_bytes": m.arena_bytes,
        "arena_values_bytes": m.arena_values_bytes,
    });
    if let Some(o) = optimizer {
        v["optimizer_state_bytes"] = json!(o);
    }
    v
}

/// The backend's name in the report and the JSON.
fn backend_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Cpu => "cpu",
        Engine::Gpu { .. } if cfg!(any(target_os = "macos", target_os = "ios")) => "metal",
        Engine::Gpu { .. } => "vulkan",
    }
}

/// How the times were taken, in words (the table's header line and the JSON's `timing`).
fn timing_basis(backend: &str) -> &'static str {
    match backend {
        "cpu" => "wall clock around each call",
        _ => "wall clock around each call: uploading the inputs, one submission and the wait for it (synchronized, like torch.cuda.synchronize() around a PyTorch call); forward and forward + loss + backward leave their results on the device (Session::run_resident); no GPU timestamps",
    }
}

/// Wall time (ms) of moving each session onto the GPU (`Session::use_gpu`: kernels, the arena,
/// uploading the parameters), one call each.
#[derive(Clone, Copy, Debug, Default)]
struct Setup {
    inference: f64,
    minimal: Option<f64>,
    training: Option<f64>,
}

/// One timed run of every step: on the GPU the results stay on the device (what is timed is the
/// submission and its wait); on the CPU they are collected, and dropped after the clock stops.
fn timed_run(s: &mut Session, inputs: &[(&str, &Tensor)]) -> Result<Option<RunOutput>, String> {
    match s.on_gpu() {
        true => s.run_resident(inputs).map(|()| None).map_err(|e| e.to_string()),
        false => s.run(inputs).map(Some).map_err(|e| e.to_string()),
    }
}

impl Bench<'_> {
    /// A session for `plan`, moved onto the GPU when the bench runs there; with it, the
    /// device's name and the wall time (ms) `use_gpu` took. Under `--backend auto` a first
    /// session the GPU cannot run sends the whole bench to the CPU (with a note); a later one
    /// is an error, so that one report never mixes backends.
    fn open(
        &self,
        plan: Plan,
        notes: &mut Vec<String>,
    ) -> Result<(Session, Option<(String, f64)>), u8> {
        let mut s = session(plan, self.a.seed);
        let Engine::Gpu { forced } = self.engine.get() else { return Ok((s, None)) };
        let start = Instant::now();
        match s.use_gpu() {
            Ok(name) => {
                self.used_gpu.set(true);
                Ok((s, Some((name, start.elapsed().as_secs_f64() * 1e3))))
            }
            Err(e) if forced || self.used_gpu.get() => Err(self.fail(&format!(
                "the GPU cannot run the {} plan of `{}`: {e}",
                mode_name(&s.plan),
                s.plan.model
            ))),
            Err(e) => {
                let w = format!(
                    "measured on the CPU backend: the GPU cannot run `{}` ({e})",
                    s.plan.model
                );
                if self.format == MessageFormat::Human {
                    eprintln!("note: {w}");
                }
                notes.push(w);
                self.engine.set(Engine::Cpu);
                Ok((s, None))
            }
        }
    }
}

fn mode_name(plan: &Plan) -> &'static str {
    match plan.mode {
        Mode::Train => "training",
        Mode::Infer => "inference",
    }
}

/// What one bench run found; printed as a table or as JSON.
struct Report {
    model: String,
    config: Vec<(String, String)>,
    /// Elements of every parameter and buffer.
    param_count: u64,
    /// `cpu`, `vulkan` or `metal`: where the sessions ran.
    backend: &'static str,
    device: String,
    optimizer: String,
    compile: Timing,
    compile_train: Option<Timing>,
    /// One wall-clock compile of the minimal-shape plan (ms).
    compile_minimal_ms: Option<f64>,
    /// On the GPU: moving each session onto the device.
    setup: Option<Setup>,
    forward: Timing,
    /// The settings of the minimal shape and its timing.
    minimal: Option<(Vec<Setting>, Timing, Memory)>,
    forward_backward: Option<Timing>,
    train_step: Option<Timing>,
    memory: Memory,
    /// The training plan's memory and the optimizer state's bytes.
    memory_train: Option<(Memory, u64)>,
    /// `--profile`: per plan (forward, forward + backward), GPU time per op family and the
    /// slowest dispatches.
    profile: Vec<(&'static str, Profiled)>,
    notes: Vec<String>,
}

/// One profiled plan, in milliseconds: (op family, dispatches, total) and (dispatch, time).
struct Profiled {
    by_op: Vec<(String, usize, f64)>,
    slowest: Vec<(String, f64)>,
}

/// One profiled run of `s` (GPU only).
fn profile_of(
    s: &mut mgn_runtime::session::Session,
    inputs: &[(String, Tensor)],
) -> Option<Profiled> {
    let ms = |t: std::time::Duration| t.as_secs_f64() * 1e3;
    match s.profile(&given(inputs))? {
        Ok(p) => Some(Profiled {
            by_op: p.by_op.into_iter().map(|(k, n, t)| (k, n, ms(t))).collect(),
            slowest: p.slowest.into_iter().map(|(k, t)| (k, ms(t))).collect(),
        }),
        Err(e) => {
            eprintln!("warning: profiling failed: {e}");
            None
        }
    }
}

pub fn run(a: BenchArgs) -> u8 {
    let format = if a.json { MessageFormat::Json } else { MessageFormat::Human };
    if a.profile {
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
            let text = if a.json { format!("{}\n", to_json(&r, &a)) } else { table(&r, &a) };
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            0
        }
        Err(code) => code,
    }
}

fn bench(b: &Bench) -> Result<Report, u8> {
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
        let w = format!("{} sample{} per measurement, fewer than {MIN_SAMPLES}: the median and interquartile range are rough", a.samples, if a.samples == 1 { "" } else { "s" });
        eprintln!("warning: {w}");
        notes.push(w);
    }
    if cfg!(debug_assertions) {
        notes.push("this mgnc is a debug build: its timings say little; build with `cargo build --release`".into());
    }

    let infer = PlanOptions::infer();
    let spec = OptimizerSpec::default();
    let train = PlanOptions::train(&[], spec.clone());
    let (outcome, plan) = b.compile(&a.settings, &infer)?;
    let has_loss = outcome.graphs.first().is_some_and(|g| g.loss.is_some());
    let train_plan = if has_loss { Some(b.compile(&a.settings, &train)?.1) } else { None };
    let model = plan.model.clone();
    let config = plan.config.clone();

    let compile = b.measure_compile("compile (inference plan)", &a.settings, &infer)?;
    let compile_train = match has_loss {
        true => Some(b.measure_compile("compile (training plan)", &a.settings, &train)?),
        false => None,
    };

    let (inputs, unbounded) = random_inputs(&plan, a.seed);
    let memory = Memory::of(&plan);
    let (mut s, gpu) = b.open(plan.clone(), &mut notes)?;
    let device = match &gpu {
        Some((name, _)) => name.clone(),
        None => format!("CPU ({} threads)", mgn_cpu::threads()),
    };
    let mut setup = gpu.map(|(_, ms)| Setup { inference: ms, ..Setup::default() });
    let forward = b.measure("forward", || timed_run(&mut s, &given(&inputs)))?;
    let mut profile = Vec::new();
    if a.profile {
        profile.extend(profile_of(&mut s, &inputs).map(|p| ("forward", p)));
    }
    drop(s);

    let shrink = minimal_settings(&plan);
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
        notes.push(format!("no separate minimal-shape latency: the model is already at {} (the forward measurement)", describe(&shrink)));
        None
    } else {
        let mut settings = a.settings.clone();
        settings.retain(|s| !shrink.iter().any(|m| m.name == s.name));
        settings.extend(shrink.iter().cloned());
        let start = Instant::now();
        let built = mgn_compiler::driver::plan_path(&a.file, a.model.clone(), settings, &infer)
            .map_err(|e| b.fail(&e))?;
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        match built {
            (_, Some(p)) => {
                compile_minimal_ms = Some(compile_ms);
                let (inputs, _) = random_inputs(&p, a.seed);
                let mem = Memory::of(&p);
                let (mut s, gpu) = b.open(p, &mut notes)?;
                if let (Some(st), Some((_, ms))) = (&mut setup, gpu) {
                    st.minimal = Some(ms);
                }
                let t = b.measure(&format!("forward at {}", describe(&shrink)), || {
                    timed_run(&mut s, &given(&inputs))
                })?;
                Some((shrink, t, mem))
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

    let (mut forward_backward, mut train_step, mut memory_train) = (None, None, None);
    match train_plan {
        Some(tp) => {
            let (inputs, _) = random_inputs(&tp, a.seed);
            let mem = Memory::of(&tp);
            let optimizer_bytes = optimizer_state_bytes(&tp);
            let (mut s, gpu) = b.open(tp, &mut notes)?;
            if let (Some(st), Some((_, ms))) = (&mut setup, gpu) {
                st.training = Some(ms);
            }
            forward_backward = Some(b.measure("forward + loss + backward", || timed_run(&mut s, &given(&inputs)))?);
            if a.profile {
                profile.extend(profile_of(&mut s, &inputs).map(|p| ("forward + loss + backward", p)));
            }
            train_step = Some(b.measure("training step", || s.train_step(&given(&inputs)).map_err(|e| e.to_string()))?);
            if s.on_gpu() {
                notes.push("the training step is Session::train_step as a user calls it, with whatever it moves between host and device".into());
            }
            memory_train = Some((mem, optimizer_bytes));
        }
        None => notes.push(format!("forward only: `{model}` has no loss, so there is no backward pass or training step to measure")),
    }
    if !unbounded.is_empty() {
        notes.push(format!(
            "integer inputs that index nothing take 0 or 1: {}",
            unbounded.join(", ")
        ));
    }
    Ok(Report {
        model,
        config,
        param_count: plan.params.iter().map(|p| p.numel() as u64).sum(),
        backend: backend_name(b.engine.get()),
        device,
        optimizer: optimizer_name(&spec),
        compile,
        compile_train,
        compile_minimal_ms,
        setup,
        forward,
        minimal,
        forward_backward,
        train_step,
        memory,
        memory_train,
        profile,
        notes,
    })
}

fn describe(settings: &[Setting]) -> String {
    settings.iter().map(|s| format!("{}={}", s.name, s.value)).collect::<Vec<_>>().join(", ")
}

fn to_json(r: &Report, a: &BenchArgs) -> Value {
    let config: serde_json::Map<String, Value> =
        r.config.iter().map(|(k, v)| (k.clone(), config_value(v))).collect();
    let timing = |t: &Option<Timing>| t.as_ref().map_or(Value::Null, Timing::json);
    let minimal = match &r.minimal {
        Some((settings, t, _)) => {
            let mut v = t.json();
            v["settings"] = settings
                .iter()
                .map(|s| (s.name.clone(), config_value(&s.value)))
                .collect::<serde_json::Map<_, _>>()
                .into();
            v
        }
        None => Value::Null,
    };
    let setup = r.setup.map_or(
        Value::Null,
        |s| json!({ "inference": s.inference, "minimal": s.minimal, "training": s.training }),
    );
    json!({
        "model": r.model,
        "file": a.file.display().to_string(),
        "config": config,
        "param_count": r.param_count,
        "backend": r.backend,
        "device": r.device,
        "mgnc_version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "clock": "wall",
        "timing": timing_basis(r.backend),
        "warmup": a.warmup,
        "samples": a.samples,
        "seed": a.seed,
        "optimizer": r.optimizer,
        "measurements": {
            "compile": r.compile.json(),
            "compile_train": timing(&r.compile_train),
            "forward": r.forward.json(),
            "forward_minimal": minimal,
            "forward_backward": timing(&r.forward_backward),
            "train_step": timing(&r.train_step),
        },
        "compile_minimal_ms": r.compile_minimal_ms,
        "setup_ms": setup,
        "memory": {
            "inference": memory_json(&r.memory, None),
            "minimal": r.minimal.as_ref().map_or(Value::Null, |(_, _, m)| memory_json(m, None)),
            "training": r.memory_train.as_ref().map_or(Value::Null, |(m, o)| memory_json(m, Some(*o))),
        },
        "profile": r.profile.iter().map(|(plan, p)| (plan.to_string(), p.by_op.iter().map(|(op, n, ms)| json!({"op": op, "dispatches": n, "ms": ms})).collect::<Vec<_>>().into())).collect::<serde_json::Map<String, Value>>(),
        "profile_slowest": r.profile.iter().map(|(plan, p)| (plan.to_string(), p.slowest.iter().map(|(step, ms)| json!({"step": step, "ms": ms})).collect::<Vec<_>>().into())).collect::<serde_json::Map<String, Value>>(),
        "notes": r.notes,
    })
}

/// Bytes in binary units, to three significant digits.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{n} B"),
        _ if x >= 100.0 => format!("{x:.0} {}", UNITS[u]),
        _ if x >= 10.0 => format!("{x:.1} {}", UNITS[u]),
        _ => format!("{x:.2} {}", UNITS[u]),
    }
}

fn ms(x: f64) -> String {
    match x {
        x if x >= 100.0 => format!("{x:.1}"),
        x if x >= 1.0 => format!("{x:.3}"),
        x => format!("{x:.4}"),
    }
}

fn table(r: &Report, a: &BenchArgs) -> String {
    let mut out = String::new();
    let config = r.config.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
    out += &format!(
        "{} ({}, {} parameters) on {}, backend {}\n",
        r.model,
        a.file.display(),
        thousands(r.param_count as usize),
        r.device,
        r.backend
    );
    out += &format!("config: {config}\n");
    out += &format!("wall-clock ms per call: median and interquartile range (p25–p75) of {} calls after {} warm-up calls\n", a.samples, a.warmup);
    if r.backend != "cpu" {
        out += &format!(
            "GPU timing: {}\n",
            timing_basis(r.backend).trim_start_matches("wall clock around each call: ")
        );
    }
    out += "\n";

    let mut rows: Vec<(String, Option<Timing>)> = vec![
        ("compile (check, elaborate, lower)".into(), Some(r.compile)),
        ("compile, training plan (+ autodiff)".into(), r.compile_train),
        ("forward".into(), Some(r.forward)),
    ];
    match &r.minimal {
        Some((s, t, _)) => rows.push((format!("forward at {}", describe(s)), Some(*t))),
        None => rows.push(("forward, minimal shape".into(), None)),
    }
    rows.push(("forward + loss + backward".into(), r.forward_backward));
    rows.push((format!("training step ({})", r.optimizer), r.train_step));
    let w = rows.iter().map(|(n, _)| n.chars().count()).max().unwrap_or(0).max(12);
    out += &format!("{:<w$}  {:>10}  {:>10}  {:>10}\n", "measurement", "median", "p25", "p75");
    for (name, t) in &rows {
        match t {
            Some(t) => {
                out += &format!(
                    "{name:<w$}  {:>10}  {:>10}  {:>10}\n",
                    ms(t.median_ms),
                    ms(t.p25_ms),
                    ms(t.p75_ms)
                )
            }
            None => out += &format!("{name:<w$}  {:>10}  {:>10}  {:>10}\n", "—", "", ""),
        }
    }
    if let Some(s) = &r.setup {
        let mut parts = vec![format!("inference {} ms", ms(s.inference))];
        parts.extend(s.minimal.map(|m| format!("minimal {} ms", ms(m))));
        parts.extend(s.training.map(|m| format!("training {} ms", ms(m))));
        out += &format!(
            "\nGPU session setup (kernels, arena, parameter upload; one call each): {}\n",
            parts.join(", ")
        );
    }

    let mut cols: Vec<(String, Memory, Option<u64>)> = vec![("inference".into(), r.memory, None)];
    if let Some((_, _, m)) = &r.minimal {
        cols.push(("minimal".into(), *m, None));
    }
    if let Some((m, o)) = &r.memory_train {
        cols.push(("training".into(), *m, Some(*o)));
    }
    let lines: [(&str, &dyn Fn(&Memory, Option<u64>) -> Option<u64>); 7] = [
        ("parameters", &|m, _| Some(m.plan.param_bytes)),
        ("inputs", &|m, _| Some(m.plan.input_bytes)),
        ("logical (every step's value, no reuse)", &|m, _| Some(m.plan.logical_bytes)),
        ("planned arena, inputs and values (reused)", &|m, _| Some(m.arena_values_bytes)),
        ("peak live (free after last use), the lower bound", &|m, _| Some(m.plan.peak_live_bytes)),
        ("planned arena, total (the GPU buffer)", &|m, _| Some(m.arena_bytes)),
        ("optimizer state", &|_, o| o),
    ];
    let w = lines.iter().map(|(n, _)| n.chars().count()).max().unwrap_or(0).max(w);
    out += &format!("\n{:<w$}", "memory");
    for (c, _, _) in &cols {
        out += &format!("  {c:>10}");
    }
    out += "\n";
    for (name, get) in lines {
        if name == "optimizer state" && r.memory_train.is_none() {
            continue;
        }
        out += &format!("{name:<w$}");
        for (_, m, o) in &cols {
            out += &format!("  {:>10}", get(m, *o).map_or("—".into(), bytes));
        }
        out += "\n";
    }
    for (plan, p) in &r.profile {
        let total: f64 = p.by_op.iter().map(|(_, _, ms)| ms).sum();
        out += &format!("\nGPU time by op, {plan} (one run, timestamps around each dispatch in its own pass; total {total:.2} ms):\n");
        for (op, n, ms) in p.by_op.iter().take(12) {
            out += &format!(
                "  {op:<28} {n:>6} dispatches  {ms:>9.3} ms  {:>5.1}%\n",
                100.0 * ms / total.max(1e-12)
            );
        }
        out += &format!("slowest dispatches, {plan}:\n");
        for (step, ms) in p.slowest.iter().take(8) {
            out += &format!("  {ms:>9.3} ms  {step}\n");
        }
    }
    if !r.notes.is_empty() {
        out += "\nnotes:\n";
        for n in &r.notes {
            out += &format!("  - {n}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let t = Timing::from_samples(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((t.p25_ms, t.median_ms, t.p75_ms, t.samples), (1.75, 2.5, 3.25, 4));
        let one = Timing::from_samples(vec![7.0]);
        assert_eq!((one.p25_ms, one.median_ms, one.p75_ms), (7.0, 7.0, 7.0));
    }

    #[test]
    fn bytes_are_readable() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(20 << 20), "20.0 MiB");
    }
}
