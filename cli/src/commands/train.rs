//! `mgnc train` (epochs of optimizer steps over a data set, with a progress bar, loss per epoch,
//! accuracy where the model classifies, checkpoints, resume, Ctrl-C saves) and `mgnc eval`
//! (accuracy of a model or plan with given weights on a data set).

use super::data::{classification, correct, plan_batch, Dataset};
use super::plan::{attach, obtain, resolve_backend, Backend, Engine};
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::optim::{OptimizerKind, OptimizerSpec, Schedule};
use mgn_ir::tensor::Tensor;
use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::session::Session;
use mgn_runtime::Plan;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
    /// Write a checkpoint here when training ends (and on Ctrl-C).
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Continue from a checkpoint (parameters, optimizer state and step).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Override a model argument, e.g. `--set T=1` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
    /// Which model to build when the file defines several.
    #[arg(long)]
    pub model: Option<String>,
    /// Freeze parameters whose name is this or starts with it and a dot (repeatable).
    #[arg(long, value_name = "NAME")]
    pub freeze: Vec<String>,
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
            settings.push(Setting { name, value: b.to_string() });
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
        &PlanOptions::train(&a.freeze, spec.clone()),
        f,
    )?;
    let eval_plan = obtain(&a.file, a.model.clone(), settings, &PlanOptions::infer(), f)?;
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
    let steps_per_epoch = data.len / batch;
    let total = steps_per_epoch as u64 * a.epochs as u64;
    if a.schedule == ScheduleName::Cosine {
        spec.schedule = Schedule::WarmupCosine { warmup: a.warmup, total, min_lr: 0.0 };
    }
    let mut plan = train_plan;
    plan.optimizer = spec;
    let task = classification(&plan, &eval_plan);

    let mut session = open_session(&a, plan, engine)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second handler cannot be installed (tests call this twice in one process); then
        // Ctrl-C keeps its default.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    announce(&a, &session, &data, batch);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
    let start = Instant::now();
    let first_epoch = (session.step / steps_per_epoch as u64) as u32;
    for epoch in first_epoch..a.epochs {
        let mut order: Vec<usize> = (0..data.len).collect();
        order.shuffle(&mut rng);
        let sum = train_epoch(&a, &mut session, &data, &order, batch, epoch, &interrupted)?;
        let mut line = format!(
            "epoch {:>3}/{}  loss {:.4}",
            epoch + 1,
            a.epochs,
            sum / steps_per_epoch as f64
        );
        if let (Some(ed), Some((labels, output))) = (&eval_data, &task) {
            let acc = held_out_accuracy(&a, &mut session, &eval_plan, ed, labels, output)?;
            line += &format!(
                "  eval accuracy {:.2}% ({}/{})",
                100.0 * acc.0 as f64 / acc.1 as f64,
                acc.0,
                acc.1
            );
        }
        eprintln!("{line}");
    }
    eprintln!("trained {} steps in {:.1} s", session.step, start.elapsed().as_secs_f64());
    if let Some(path) = &a.save {
        session.save_checkpoint(path).map_err(|e| fail(&e.to_string(), f))?;
        eprintln!("saved checkpoint to {}", path.display());
    }
    Ok(())
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
    a: &TrainArgs,
    session: &mut Session,
    eval_plan: &Plan,
    data: &Dataset,
    labels: &str,
    output: &str,
) -> Result<(usize, usize), u8> {
    let f = a.format;
    let mut eval = Session::new(eval_plan.clone(), a.seed);
    session.sync_from_device().map_err(|e| fail(&e.to_string(), f))?;
    eval.params = session.params.clone();
    accuracy(&mut eval, data, labels, output).map_err(|e| fail(&e, f))
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

/// The training session: resumed from `--resume` when given, then moved to `engine`.
fn open_session(a: &TrainArgs, plan: Plan, engine: Engine) -> Result<Session, u8> {
    let f = a.format;
    let mut session = Session::new(plan, a.seed);
    session.check_numerics = a.check_numerics || cfg!(debug_assertions);
    if let Some(r) = &a.resume {
        session.load_checkpoint(r, MatchMode::Strict).map_err(|e| fail(&e.to_string(), f))?;
        eprintln!("resumed from {} at step {}", r.display(), session.step);
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

/// One epoch of optimizer steps over `data` in `order`, behind a progress bar; the sum of the
/// steps' losses. On Ctrl-C it saves a checkpoint and fails with exit code 130.
fn train_epoch(
    a: &TrainArgs,
    session: &mut Session,
    data: &Dataset,
    order: &[usize],
    batch: usize,
    epoch: u32,
    interrupted: &AtomicBool,
) -> Result<f64, u8> {
    let f = a.format;
    let steps_per_epoch = data.len / batch;
    let bar = progress(steps_per_epoch as u64, a.quiet, epoch + 1, a.epochs);
    let mut sum = 0.0;
    for s in 0..steps_per_epoch {
        let cols = data.batch(&order[s * batch..(s + 1) * batch]);
        let given: Vec<(&str, &Tensor)> = cols.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let loss = session
            .train_step(&given)
            .map_err(|e| fail(&format!("{}: {e}", a.file.display()), f))?;
        sum += loss;
        bar.set_message(format!("loss {loss:.4}"));
        bar.inc(1);
        if interrupted.load(Ordering::SeqCst) {
            bar.abandon();
            let path = a.save.clone().unwrap_or_else(|| {
                PathBuf::from(format!("{}.interrupted.safetensors", session.plan.model))
            });
            session.save_checkpoint(&path).map_err(|e| fail(&e.to_string(), f))?;
            eprintln!(
                "interrupted at step {}: checkpoint saved to {}",
                session.step,
                path.display()
            );
            return Err(130);
        }
    }
    bar.finish_and_clear();
    Ok(sum)
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

#[derive(clap::Args)]
pub struct EvalArgs {
    /// A .mgn model or an inference .mgnplan.
    pub file: PathBuf,
    #[arg(long)]
    pub weights: PathBuf,
    /// Labelled data: the model's inputs plus an integer labels tensor.
    #[arg(long)]
    pub data: PathBuf,
    /// Batch size (sets the model argument `batch` or `B`).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Override a model argument, e.g. `--set T=1` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
    /// Which model to build when the file defines several.
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: Backend,
    #[arg(long = "message-format", value_enum, default_value = "human")]
    pub format: MessageFormat,
}

/// `mgnc eval FILE|PLAN --weights W --data D`: accuracy of an inference plan on a data set.
pub fn eval(a: EvalArgs) -> u8 {
    let f = a.format;
    let r = (|| -> Result<(), u8> {
        let engine = resolve_backend(a.backend, f)?;
        let is_plan = a.file.extension().is_some_and(|e| e == "mgnplan");
        let settings = if is_plan {
            a.settings.clone()
        } else {
            with_batch(&a.file, &a.settings, a.batch, a.model.as_deref(), f)?
        };
        let plan: Plan = obtain(&a.file, a.model.clone(), settings, &PlanOptions::infer(), f)?;
        let mut session = Session::new(plan, 0);
        session
            .load_checkpoint(&a.weights, MatchMode::Strict)
            .map_err(|e| fail(&e.to_string(), f))?;
        attach(&mut session, engine, f)?;
        // The labels are not an input of an inference plan; read them from the data file.
        let ckpt = mgn_runtime::checkpoint::load(&a.data).map_err(|e| fail(&e.to_string(), f))?;
        let data = Dataset::load(&a.data, &session.plan).map_err(|e| fail(&e, f))?;
        let (labels_name, labels) = ckpt
            .tensors
            .iter()
            .find(|(n, t)| !t.dtype.is_float() && session.plan.inputs.iter().all(|(i, _)| i != n))
            .ok_or_else(|| {
                fail(
                    &format!(
                        "{}: no integer labels tensor besides the model's inputs",
                        a.data.display()
                    ),
                    f,
                )
            })?;
        let output = session
            .plan
            .outputs
            .iter()
            .find(|(_, s)| {
                let st = &session.plan.steps[*s as usize];
                st.shape.len() == labels.shape.len() + 1
                    && st.shape[1..st.shape.len() - 1] == labels.shape[1..]
            })
            .map(|(n, _)| n.clone())
            .ok_or_else(|| {
                fail(
                    &format!(
                        "no output of `{}` has a class axis for `{labels_name}`",
                        session.plan.model
                    ),
                    f,
                )
            })?;
        let mut with_labels = data;
        with_labels.columns.push((labels_name.clone(), labels.clone()));
        let (right, total) =
            accuracy(&mut session, &with_labels, labels_name, &output).map_err(|e| fail(&e, f))?;
        println!(
            "accuracy {:.2}% ({right}/{total}) of `{output}` against `{labels_name}` in {}",
            100.0 * right as f64 / total as f64,
            a.data.display()
        );
        Ok(())
    })();
    match r {
        Ok(()) => 0,
        Err(c) => c,
    }
}
