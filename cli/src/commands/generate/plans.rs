//! The two plans `mgnc generate` runs, built from one `.mgn` model: the decode plan (T = 1) and,
//! for a prompt of more than one token, a prefill plan (T = a chunk of the prompt), each in a
//! session holding the weights, on the chosen backend, together in the runtime's `Generator`.
//!
//! The model is the one `--model` names, else the one model of the file with an input `pos`
//! (the convention of models/smollm2_135m_decode.mgn: `input_ids: i32[B, T]`, `pos: i32[]`,
//! an argument `cache`, an output `logits: f32[B, T, vocab]`).

use super::super::plan::{attach, obtain, Engine, PrecisionArg};
use super::super::report;
use super::super::report::MessageFormat;
use super::super::EXIT_ERRORS;
use mgn_compiler::driver::plan_path_dynamic;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::dynamic::SizeVar;
use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::{Generator, Plan, Restore, Session};
use mgn_syntax::ast::{Item, LayerKind};
use std::path::{Path, PathBuf};

const HUMAN: MessageFormat = MessageFormat::Human;

/// What the plans are built from.
pub struct Source<'a> {
    pub file: &'a Path,
    pub model: Option<String>,
    pub settings: Vec<Setting>,
    pub weights: Option<&'a PathBuf>,
    pub precision: PrecisionArg,
    pub quantize: Option<mgn_ir::DType>,
    pub seed: u64,
}

impl Source<'_> {
    /// The options both plans are built with.
    fn options(&self) -> PlanOptions<'static> {
        let precision = self.precision.into();
        PlanOptions { precision, quantize: self.quantize, ..PlanOptions::infer() }
    }
}

/// The generator and where it runs.
pub struct Built {
    pub generator: Generator,
    pub device: String,
    pub on_gpu: bool,
}

/// An error already printed (diagnostics), or a message to print.
pub enum Failure {
    Printed(u8),
    Message(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure::Message(s)
    }
}

/// The models of `file` that take an input `pos`; None when the file does not parse (the
/// build that follows reports why).
fn decode_models(file: &Path) -> Option<Vec<String>> {
    let text = mgn_compiler::source::read_source(file).ok()?;
    let (ast, diags) = mgn_syntax::parser::parse(mgn_syntax::FileId(0), &text);
    if !diags.is_empty() {
        return None;
    }
    let models = ast.items.iter().filter_map(|item| match item {
        Item::Layer(l) if l.kind == LayerKind::Model => Some(l),
        _ => None,
    });
    Some(
        models
            .filter(|m| m.inputs.iter().any(|i| i.name.name == "pos"))
            .map(|m| m.name.name.clone())
            .collect(),
    )
}

/// The model to build: `--model`, else the file's one decode model.
pub fn choose_model(file: &Path, model: Option<String>) -> Result<Option<String>, String> {
    if model.is_some() {
        return Ok(model);
    }
    let Some(found) = decode_models(file) else { return Ok(None) };
    match found.as_slice() {
        [] => Err(format!(
            "no model in `{}` has an input `pos: i32[]`: generating needs a decode model with a \
             KV cache (see models/smollm2_135m_decode.mgn)",
            file.display()
        )),
        [one] => Ok(Some(one.clone())),
        many => Err(format!(
            "`{}` has several models with an input `pos` ({}): choose one with `--model NAME`",
            file.display(),
            many.join(", ")
        )),
    }
}

/// The plan of the model at `t` tokens a run.
fn plan_at(src: &Source, t: usize) -> Result<Plan, Failure> {
    let mut settings = src.settings.clone();
    settings.push(Setting::new("T", &t.to_string()));
    let opts = src.options();
    let plan = obtain(src.file, src.model.clone(), settings, &opts, HUMAN);
    let plan = plan.map_err(Failure::Printed)?;
    if t == 1 {
        crate::commands::plan::quantize_note(&plan, &opts, HUMAN);
    }
    Ok(plan)
}

/// The model dynamic in T from 1 to `t` (`mgnc build --dynamic T=t`): one plan for the prompt,
/// a chunk at a time at its own length, and for the tokens, one at a time.
fn dynamic_plan(src: &Source, t: usize) -> Result<Plan, Failure> {
    let size = SizeVar { name: "T".into(), min: 1, max: t };
    let opts = src.options();
    let settings = src.settings.clone();
    let built = plan_path_dynamic(src.file, src.model.clone(), settings, &[size], &opts)?;
    match built {
        (outcome, Some(plan)) if report::diagnostics(&outcome, HUMAN) => {
            crate::commands::plan::quantize_note(&plan, &opts, HUMAN);
            Ok(plan)
        }
        (outcome, _) => {
            report::diagnostics(&outcome, HUMAN);
            Err(Failure::Printed(EXIT_ERRORS))
        }
    }
}

/// The positions a decode plan's cache holds: its first state tensor is [B, heads, n, d].
pub fn cache_of(plan: &Plan) -> Option<usize> {
    let &(p, _) = plan.state_writes.first()?;
    let shape = &plan.params[p].shape;
    (shape.len() == 4).then(|| shape[2])
}

/// A session of `plan` with the weights, strictly matched.
fn session(plan: Plan, src: &Source) -> Result<Session, String> {
    let Some(w) = src.weights else {
        return Session::try_new(plan, src.seed).map_err(|e| e.to_string());
    };
    let (s, report) =
        Session::from_checkpoint(plan, src.seed, w, MatchMode::Strict, Restore::Weights)
            .map_err(|e| e.to_string())?;
    if report.has_notes() {
        eprintln!("note: {}: {}", w.display(), report.to_string().trim_end());
    }
    Ok(s)
}

/// The decode plan alone: its cache size is known before the prefill plan is built.
pub fn decode_plan(src: &Source) -> Result<Plan, Failure> {
    plan_at(src, 1)
}

/// How the prompt runs.
#[derive(Clone, Copy)]
pub enum Prefill {
    /// Token by token through the decode plan.
    None,
    /// Through a second plan at T = this chunk (a shorter last chunk padded).
    Chunk(usize),
    /// Through the decode plan itself, built dynamic in T from 1 to this bound (each chunk at
    /// its own length): one session, so one copy of the weights.
    OnePlan(usize),
}

/// The sessions on the engine, in a generator.
pub fn build(
    src: &Source,
    decode: Plan,
    prefill: Prefill,
    engine: Engine,
) -> Result<Built, Failure> {
    let decode = match prefill {
        Prefill::OnePlan(t) => dynamic_plan(src, t)?,
        _ => decode,
    };
    let model = decode.model.clone();
    let mut decode = session(decode, src)?;
    let on = attach(&mut decode, engine, HUMAN).map_err(Failure::Printed)?;
    let prefill = match prefill {
        Prefill::Chunk(t) => {
            let mut s = session(plan_at(src, t)?, src)?;
            if on.is_some() {
                s.use_gpu().map_err(|e| format!("the prefill plan (T = {t}): {e}"))?;
            }
            Some(s)
        }
        Prefill::None | Prefill::OnePlan(_) => None,
    };
    let generator = Generator::new(prefill, decode)
        .map_err(|e| format!("`{model}` in `{}`: {e}", src.file.display()))?;
    let on_gpu = on.is_some();
    let device = on.unwrap_or_else(|| "the CPU".to_string());
    Ok(Built { generator, device, on_gpu })
}
