//! `mgnc train` (epochs of optimizer steps over a data set, with a progress bar, loss per epoch,
//! accuracy where the model classifies, checkpoints — final, periodic, on Ctrl-C or SIGTERM —
//! exact resume, and a stop at the first non-finite loss) and `mgnc eval` (accuracy of a model
//! or plan with given weights on a data set).
//!
//! The parts: `order` (each epoch's data order and the place in it a checkpoint records),
//! `steps` (the training loop), `checkpoints` (checked, periodic and pruned saves), `eval`.

mod checkpoints;
mod eval;
mod order;
mod steps;

pub use eval::{eval, EvalArgs};

use super::data::{classification, correct, plan_batch, Dataset};
use super::plan::{attach, obtain, resolve_backend, Backend, Engine, PrecisionArg, RewriteEngine};
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::optim::{OptimizerKind, OptimizerSpec, Schedule};
use mgn_ir::tensor::Tensor;
use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::session::{Restore, Session};
use mgn_runtime::Plan;
use order::{Order, Recorded};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use steps::{Stop, Trainer};

/// Periodic checkpoints kept when `--keep` is not given.
const DEFAULT_KEEP: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum OptimizerName {
    Sgd,
    Adam,
    Adamw,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum ScheduleName {
    Constant,
    /// Linear warm-up (`--warmup` steps) then cosine decay to 0 over the whole run.
    Cosine,
}

#[derive(clap::Args)]
pub struct TrainArgs {
    /// The model to train (.mgn).
    pub file: PathBuf,
    /// Training data: safetensors with one tensor per model input, samples along the first axis.
    #[arg(long)]
    pub data: PathBuf,
    /// Held-out data: accuracy after every epoch when the model classifies.
    #[arg(long)]
    pub eval_data: Option<PathBuf>,
    #[arg(long, default_value_t = 10)]
    pub epochs: u32,
    /// Batch size (sets the model argument `batch` or `B`).
    #[arg(long)]
    pub batch: Option<usize>,
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: OptimizerName,
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// AdamW decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Clip gradients to this global norm.
    #[arg(long)]
    pub clip_norm: Option<f64>,
    #[arg(long, value_enum, default_value = "constant")]
    pub schedule: ScheduleName,
    /// Warm-up steps of the cosine schedule.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Write a checkpoint here when training ends (and on Ctrl-C or SIGTERM).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Also write a checkpoint every N optimizer steps, beside `--save`, as
    /// `NAME.step-N.safetensors`.
    #[arg(long, value_name = "N", requires = "save",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub save_every: Option<u64>,
    /// Keep the K newest periodic checkpoints (default 3), deleting older ones once a new one
    /// is written.
    #[arg(long, value_name = "K", requires = "save_every",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: Option<u64>,
    /// Also write each tied weight under its other names (the model's aliases), as PyTorch's
    /// `model.state_dict()` lists it; without it each tensor is written once, as Hugging
    /// Face's `save_pretrained` writes. Either checkpoint loads strictly.
    #[arg(long)]
    pub save_aliases: bool,
    /// Continue from a checkpoint (parameters, optimizer state, step and place in the data).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Write every training step's loss to FILE as CSV (`batch,loss,applied,loss_scale`;
    /// appended to when resuming), for a loss curve.
    #[arg(long, value_name = "FILE")]
    pub loss_log: Option<PathBuf>,
    /// Seed of the initializers, the data order and dropout (default 0; with `--resume`, the
    /// checkpoint's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override a model argument, e.g. `--set T=1` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
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
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: Backend,
    /// Stop at the first NaN/Inf and name the op and model line (always on in debug builds).
    #[arg(long)]
    pub check_numerics: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    #[arg(long = "message-format", value_enum, default_value = "human")]
    pub format: MessageFormat,
}

impl TrainArgs {
    /// How many periodic checkpoints to keep.
    fn keep(&self) -> usize {
        self.keep.map_or(DEFAULT_KEEP, |k| k as usize)
    }
}

fn fail(msg: &str, format: MessageFormat) -> u8 {
    report::error(msg, format);
    super::EXIT_ERRORS
}

/// `--batch B` sets the model argument that sizes the batch (`batch` or `B`).
fn with_batch(
    file: &Path,
    settings: &[Setting],
    batch: Option<usize>,
    model: Option<&str>,
    format: MessageFormat,
) -> Result<Vec<Setting>, u8> {
    let mut settings = settings.to_vec();
    let Some(b) = batch else { return Ok(settings) };
    let outcome = mgn_compiler::check_path(
        file,
        mgn_compiler::Models::One { name: model.map(String::from), settings: settings.clone() },
    )
    .map_err(|e| fail(&e, format))?;
    let arg = outcome
        .graphs
        .first()
        .and_then(|g| g.config.iter().map(|(k, _)| k.clone()).find(|k| k == "batch" || k == "B"));
    match arg {
        Some(name) => {
            settings.push(Setting::new(name, b.to_string()));
            Ok(settings)
        }
        None => Err(fail(
            "`--batch` sets a model argument named `batch` or `B`, and this model has neither; \
             use `--set NAME=VALUE`",
            format,
        )),
    }
}

pub fn train(a: TrainArgs) -> u8 {
    match train_inner(a) {
        Ok(()) => 0,
        Err(code) => code,
    }
}

fn train_inner(a: TrainArgs) -> Result<(), u8> {
    if let Some(save) = &a.save {
        checkpoints::remove_stale_temporaries(save);
    }
    let engine = resolve_backend(a.backend, a.format)?;
    let f = a.format;
    let settings = with_batch(&a.file, &a.settings, a.batch, a.model.as_deref(), f)?;
    // The schedule's length is known once the data set is: fill it in below.
    let mut spec = OptimizerSpec {
        kind: optimizer_kind(&a),
        lr: a.lr,
        schedule: Schedule::Constant,
        clip_norm: a.clip_norm,
    };
    let train_plan = obtain(
        &a.file,
        a.model.clone(),
        settings.clone(),
        &PlanOptions {
            rewrites: a.rewrites.into(),
            precision: a.precision.into(),
            quantize: a.quantize,
            ..PlanOptions::train(&a.freeze, spec.clone())
        },
        f,
    )?;
    let packed = packed_params(&a, &train_plan, f);
    let infer = PlanOptions {
        rewrites: a.rewrites.into(),
        precision: a.precision.into(),
        quantize: a.quantize,
        quantize_only: Some(&packed),
        ..PlanOptions::infer()
    };
    let eval_plan = obtain(&a.file, a.model.clone(), settings, &infer, f)?;
    let (data, eval_data) = load_data(&a, &train_plan)?;
    let batch = plan_batch(&train_plan).map_err(|e| fail(&e, f))?;
    if data.len < batch {
        return Err(fail(
            &format!(
                "{} has {} samples, fewer than one batch of {batch}; use `--batch`",
                a.data.display(),
                data.len
            ),
            f,
        ));
    }
    let recorded = match &a.resume {
        Some(r) => mgn_runtime::checkpoint::load(r)
            .map_err(|e| e.to_string())
            .and_then(|c| Recorded::of(&c))
            .map_err(|e| fail(&e, f))?,
        None => None,
    };
    let seed = a.seed.or(recorded.map(|r| r.order.seed)).unwrap_or(0);
    let order = Order { seed, batch, samples: data.len };
    let total = order.steps_per_epoch() * a.epochs as u64;
    if a.schedule == ScheduleName::Cosine {
        spec.schedule = Schedule::WarmupCosine { warmup: a.warmup, total, min_lr: 0.0 };
    }
    let mut plan = train_plan;
    plan.optimizer = spec;
    let task = classification(&plan, &eval_plan);

    let session = open_session(&a, plan, engine, &order, recorded)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // Ctrl-C, SIGTERM and SIGHUP (ctrlc's `termination` feature). A second handler cannot
        // be installed (tests call this twice in one process); then they keep their default.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    announce(&a, &session, &data, batch);
    let start = Instant::now();
    let stopped = |s: Stop| {
        if !s.message.is_empty() {
            report::error(&s.message, f);
        }
        s.code
    };
    let mut trainer = Trainer::new(&a, session, &data, order, &interrupted).map_err(stopped)?;
    let mut after_epoch = |session: &mut Session| -> Result<String, Stop> {
        let (Some(ed), Some((labels, output))) = (&eval_data, &task) else {
            return Ok(String::new());
        };
        let (right, all) = held_out_accuracy(session, &eval_plan, ed, labels, output)
            .map_err(|message| Stop { code: super::EXIT_ERRORS, message })?;
        let pct = 100.0 * right as f64 / all as f64;
        Ok(format!("  eval accuracy {pct:.2}% ({right}/{all})"))
    };
    trainer.run(&mut after_epoch).map_err(stopped)?;
    let secs = start.elapsed().as_secs_f64();
    let scaling = match trainer.session.loss_scale() {
        Some((scale, skipped)) => format!(
            " ({skipped} skipped for gradients that were not finite; the loss scale is now {scale})"
        ),
        None => String::new(),
    };
    eprintln!("trained {} steps in {secs:.1} s{scaling}", trainer.session.step);
    trainer.save_final().map_err(stopped)
}

/// The training data and, with `--eval-data`, the held-out data; both read with the training
/// plan's inputs, so the labels come along for accuracy.
fn load_data(a: &TrainArgs, train_plan: &Plan) -> Result<(Dataset, Option<Dataset>), u8> {
    let f = a.format;
    let data = Dataset::load(&a.data, train_plan).map_err(|e| fail(&e, f))?;
    let eval_data = match &a.eval_data {
        Some(p) => Some(Dataset::load(p, train_plan).map_err(|e| fail(&e, f))?),
        None => None,
    };
    Ok((data, eval_data))
}

/// (correct, total) on the held-out data of the inference plan with the trained parameters.
fn held_out_accuracy(
    session: &mut Session,
    eval_plan: &Plan,
    data: &Dataset,
    labels: &str,
    output: &str,
) -> Result<(usize, usize), String> {
    let mut eval = Session::new(eval_plan.clone(), session.seed);
    session.sync_from_device().map_err(|e| e.to_string())?;
    // By name: a training plan has tensors an inference plan lacks (a loss scale).
    for (k, spec) in eval_plan.params.iter().enumerate() {
        if let Some(i) = session.param_index(&spec.name) {
            eval.params[k] = session.params[i].clone();
        }
    }
    accuracy(&mut eval, data, labels, output)
}

/// The training plan's packed parameters, after saying what `--quantize` packed: the evaluation
/// plan reads the training session's weights, so it packs the same ones.
fn packed_params(a: &TrainArgs, train_plan: &Plan, f: MessageFormat) -> Vec<String> {
    let opts = PlanOptions { quantize: a.quantize, ..PlanOptions::infer() };
    super::plan::quantize_note(train_plan, &opts, f);
    (train_plan.params.iter()).filter(|p| p.dtype.is_packed()).map(|p| p.name.clone()).collect()
}

fn optimizer_kind(a: &TrainArgs) -> OptimizerKind {
    match a.optimizer {
        OptimizerName::Sgd => OptimizerKind::Sgd { momentum: a.momentum },
        OptimizerName::Adam => OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        OptimizerName::Adamw => OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: a.weight_decay,
        },
    }
}

/// The training session: resumed from `--resume` when given (refused when the checkpoint's run
/// had another data order), then moved to `engine`.
fn open_session(
    a: &TrainArgs,
    plan: Plan,
    engine: Engine,
    order: &Order,
    recorded: Option<Recorded>,
) -> Result<Session, u8> {
    let f = a.format;
    // A checkpoint is matched against the plan, and the host's memory checked, before the
    // parameters are allocated.
    let mut session = match &a.resume {
        Some(r) => {
            let (session, rep) = Session::from_checkpoint(
                plan,
                order.seed,
                r,
                MatchMode::Strict,
                Restore::Everything,
            )
            .map_err(|e| fail(&e.to_string(), f))?;
            if rep.has_notes() {
                eprintln!("note: {}: {}", r.display(), rep.to_string().trim_end());
            }
            session
        }
        None => Session::try_new(plan, order.seed).map_err(|e| fail(&e.to_string(), f))?,
    };
    session.check_numerics = a.check_numerics || cfg!(debug_assertions);
    if let Some(r) = &a.resume {
        let step = session.batches_done();
        match recorded {
            Some(rec) => rec.check(order, step, r).map_err(|e| fail(&e, f))?,
            None if step > 0 => eprintln!(
                "note: {} does not record its place in the data (an older mgnc or another tool \
                 wrote it); continuing after step {step} in this run's data order",
                r.display()
            ),
            None => {}
        }
        let (epoch, batch) = order.position(step);
        eprintln!(
            "resumed from {} at step {step} (epoch {}, batch {} of {})",
            r.display(),
            epoch + 1,
            batch + 1,
            order.steps_per_epoch()
        );
    }
    attach(&mut session, engine, f)?;
    Ok(session)
}

/// The line that opens a run: the model, the data, the batching and the optimizer.
fn announce(a: &TrainArgs, session: &Session, data: &Dataset, batch: usize) {
    let steps_per_epoch = data.len / batch;
    let t = plan_batch(&session.plan).unwrap_or(batch);
    eprintln!(
        "training {} on {} ({} samples, batch {t}, {steps_per_epoch} steps per epoch{}) with {}",
        session.plan.model,
        a.data.display(),
        data.len,
        if !data.len.is_multiple_of(batch) {
            format!(", last {} samples of each shuffled epoch unused", data.len % batch)
        } else {
            String::new()
        },
        describe_optimizer(&session.plan.optimizer),
    );
}

fn describe_optimizer(s: &OptimizerSpec) -> String {
    let kind = match &s.kind {
        OptimizerKind::Sgd { momentum } => format!("SGD (momentum {momentum})"),
        OptimizerKind::Adam { .. } => "Adam".to_string(),
        OptimizerKind::AdamW { weight_decay, .. } => format!("AdamW (weight decay {weight_decay})"),
    };
    let schedule = match &s.schedule {
        Schedule::Constant => String::new(),
        Schedule::WarmupCosine { warmup, .. } => {
            format!(", {warmup} warm-up steps then cosine decay")
        }
    };
    format!(
        "{kind}, lr {}{schedule}{}",
        s.lr,
        s.clip_norm.map(|c| format!(", gradients clipped to norm {c}")).unwrap_or_default()
    )
}

fn progress(len: u64, quiet: bool, epoch: u32, epochs: u32) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    let style =
        indicatif::ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{epoch}/{epochs}"));
    bar
}

/// (correct, total) over the whole data set. The last partial batch is padded with copies of
/// its final sample, whose predictions are not counted.
pub fn accuracy(
    session: &mut Session,
    data: &Dataset,
    labels: &str,
    output: &str,
) -> Result<(usize, usize), String> {
    let batch = plan_batch(&session.plan)?;
    let mut right = 0;
    let mut start = 0;
    while start < data.len {
        let valid = batch.min(data.len - start);
        let rows: Vec<usize> = (0..batch).map(|i| start + i.min(valid - 1)).collect();
        let cols = data.batch(&rows);
        let given: Vec<(&str, &Tensor)> = cols.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let out = session.run(&given).map_err(|e| e.to_string())?;
        let scores = &out
            .outputs
            .iter()
            .find(|(n, _)| n == output)
            .ok_or("the classification output is missing")?
            .1;
        let lab = &cols.iter().find(|(n, _)| n == labels).ok_or("the labels are missing")?.1;
        right += correct(scores, lab, valid);
        start += batch;
    }
    Ok((right, data.len))
}
