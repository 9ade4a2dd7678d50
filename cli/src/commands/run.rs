//! `mgnc run FILE|PLAN --weights W --inputs I --out O [--grads] [--mode eval|train]`:
//! one forward (and backward) pass, with every result written to a safetensors file:
//! `output.<name>`, `loss` when the model has one, `grad.<param>` with `--grads`.
//! This is the interface models are compared with PyTorch through; keep it stable.

use super::plan::{check_backend, obtain, Backend};
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_runtime::checkpoint::{self, MatchMode};
use mgn_runtime::plan::Mode;
use mgn_runtime::session::Session;
use mgn_runtime::tensor::Tensor;
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum RunMode {
    /// Inference semantics: running batch-norm statistics, no dropout.
    Eval,
    /// Training semantics: batch statistics, dropout active (nothing is updated).
    Train,
}

pub struct RunArgs {
    pub file: PathBuf,
    pub weights: Option<PathBuf>,
    pub partial: bool,
    pub inputs: PathBuf,
    pub out: PathBuf,
    pub grads: bool,
    pub mode: RunMode,
    pub backend: Backend,
    pub settings: Vec<Setting>,
    pub model: Option<String>,
    pub freeze: Vec<String>,
    pub seed: u64,
    pub check_numerics: bool,
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
    check_backend(a.backend, a.format)?;
    let inputs = checkpoint::load(&a.inputs).map_err(|e| fail(&e.to_string(), a.format))?;
    let mode = if a.mode == RunMode::Train { Mode::Train } else { Mode::Infer };
    let mut opts = PlanOptions { mode, loss: true, grads: a.grads, frozen: &a.freeze, optimizer: Default::default() };
    let mut plan = obtain(&a.file, a.model.clone(), a.settings.clone(), &opts, a.format)?;
    // Without --grads the loss is optional: drop it when the inputs it needs are not given.
    let missing = |p: &mgn_runtime::Plan| p.inputs.iter().any(|(n, _)| inputs.get(n).is_none());
    if !a.grads && plan.loss.is_some() && missing(&plan) && !a.file.extension().is_some_and(|e| e == "mgnplan") {
        opts.loss = false;
        plan = obtain(&a.file, a.model.clone(), a.settings.clone(), &opts, a.format)?;
    }
    if a.grads && plan.grads.is_empty() {
        return Err(fail("`--grads` needs a plan with gradients: run the .mgn file, or build the plan with `--mode train`", a.format));
    }
    let mut session = Session::new(plan, a.seed);
    session.check_numerics = a.check_numerics;
    if let Some(w) = &a.weights {
        let mode = if a.partial { MatchMode::Partial } else { MatchMode::Strict };
        let rep = session.load_checkpoint(w, mode).map_err(|e| fail(&e.to_string(), a.format))?;
        if !rep.is_clean() {
            eprintln!("warning: {}: {rep}", w.display());
        }
    }
    let given: Vec<(&str, &Tensor)> = inputs.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out = session.run(&given).map_err(|e| fail(&format!("{}: {e}", a.file.display()), a.format))?;
    let mut tensors: Vec<(String, &Tensor)> = out.outputs.iter().map(|(n, t)| (format!("output.{n}"), t)).collect();
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
