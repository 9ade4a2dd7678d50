//! `mgnc run FILE|PLAN --weights W --inputs I --out O [--grads] [--mode eval|train]`:
//! one forward (and backward) pass, with every result written to a safetensors file:
//! `output.<name>`, `loss` when the model has one, `grad.<param>` with `--grads`.
//! This is the interface models are compared with PyTorch through; keep it stable.

use super::plan::{attach, obtain, resolve_backend, Backend, PrecisionArg, RewriteEngine};
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::plan::Mode;
use mgn_ir::tensor::Tensor;
use mgn_runtime::checkpoint::{self, MatchMode};
use mgn_runtime::session::{Restore, Session};
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum RunMode {
    /// Inference semantics: running batch-norm statistics, no dropout.
    Eval,
    /// Training semantics: batch statistics, dropout active (nothing is updated).
    Train,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// A .mgn model or a .mgnplan.
    pub file: PathBuf,
    /// Parameters to load (safetensors, names as in the model); without it, the initializers run.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Load the parameters that match and report the rest, instead of refusing.
    #[arg(long)]
    pub partial: bool,
    /// Input tensors, named like the model's inputs (safetensors).
    #[arg(long)]
    pub inputs: PathBuf,
    /// Where to write `output.<name>`, `loss` and `grad.<param>` (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Also compute the gradient of the loss for every trainable parameter.
    #[arg(long)]
    pub grads: bool,
    #[arg(long, value_enum, default_value = "eval")]
    pub mode: RunMode,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: Backend,
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
    /// Seed for initializers (without --weights) and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop at the first NaN/Inf and name the op and model line (always on in debug builds).
    #[arg(long)]
    pub check_numerics: bool,
    #[arg(long = "message-format", value_enum, default_value = "human")]
    pub format: MessageFormat,
}

pub fn run(a: RunArgs) -> u8 {
    match run_inner(a) {
        Ok(()) => 0,
        Err(code) => code,
    }
}

fn fail(msg: &str, format: MessageFormat) -> u8 {
    report::error(msg, format);
    super::EXIT_ERRORS
}

fn run_inner(a: RunArgs) -> Result<(), u8> {
    let engine = resolve_backend(a.backend, a.format)?;
    let inputs = checkpoint::load(&a.inputs).map_err(|e| fail(&e.to_string(), a.format))?;
    let mode = if a.mode == RunMode::Train { Mode::Train } else { Mode::Infer };
    let mut opts = PlanOptions {
        mode,
        loss: true,
        grads: a.grads,
        frozen: &a.freeze,
        optimizer: Default::default(),
        rewrites: a.rewrites.into(),
        precision: a.precision.into(),
        quantize: a.quantize,
        quantize_only: None,
    };
    let mut plan = obtain(&a.file, a.model.clone(), a.settings.clone(), &opts, a.format)?;
    // Without --grads the loss is optional: drop it when the inputs it needs are not given.
    let missing = |p: &mgn_runtime::Plan| p.inputs.iter().any(|(n, _)| inputs.get(n).is_none());
    if !a.grads
        && plan.loss.is_some()
        && missing(&plan)
        && a.file.extension().is_none_or(|e| e != "mgnplan")
    {
        opts.loss = false;
        plan = obtain(&a.file, a.model.clone(), a.settings.clone(), &opts, a.format)?;
    }
    super::plan::quantize_note(&plan, &opts, a.format);
    if a.grads && plan.grads.is_empty() {
        return Err(fail(
            "`--grads` needs a plan with gradients: run the .mgn file, or build the plan with \
             `--mode train`",
            a.format,
        ));
    }
    // The weights are matched against the plan, and the host's memory checked, before any
    // parameter is allocated: a mismatch or a model too large is an error, not an abort. A run
    // takes the parameters alone (it never steps an optimizer).
    let mut session = match &a.weights {
        Some(w) => {
            let mode = if a.partial { MatchMode::Partial } else { MatchMode::Strict };
            let (session, rep) = Session::from_checkpoint(plan, a.seed, w, mode, Restore::Weights)
                .map_err(|e| fail(&e.to_string(), a.format))?;
            if !rep.is_clean() {
                eprintln!("warning: {}: {rep}", w.display());
            } else if rep.has_notes() {
                eprintln!("note: {}: {}", w.display(), rep.to_string().trim_end());
            }
            session
        }
        None => Session::try_new(plan, a.seed).map_err(|e| fail(&e.to_string(), a.format))?,
    };
    session.check_numerics = a.check_numerics || cfg!(debug_assertions);
    attach(&mut session, engine, a.format)?;
    let given: Vec<(&str, &Tensor)> = inputs.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out =
        session.run(&given).map_err(|e| fail(&format!("{}: {e}", a.file.display()), a.format))?;
    let mut tensors: Vec<(String, &Tensor)> =
        out.outputs.iter().map(|(n, t)| (format!("output.{n}"), t)).collect();
    if let Some(l) = &out.loss {
        tensors.push(("loss".to_string(), l));
    }
    tensors.extend(out.grads.iter().map(|(n, t)| (format!("grad.{n}"), t)));
    let metadata = checkpoint::standard_metadata(&session.plan.model, session.step);
    checkpoint::save(&a.out, &tensors, &metadata).map_err(|e| fail(&e.to_string(), a.format))?;
    if let Some(l) = &out.loss {
        eprintln!("loss {:.6}", l.to_f64_vec()[0]);
    }
    eprintln!("wrote {} tensors to {}", tensors.len(), a.out.display());
    Ok(())
}
