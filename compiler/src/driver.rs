//! The compiler's entry points, shared by the CLI, the tests and the language server.
//!
//! Every entry point runs the pipeline on a thread with a large stack and turns a panic into an
//! "internal compiler error" diagnostic: whatever the input, the caller gets diagnostics back.

use crate::elab::{self, Setting};
use crate::front::{self, Program};
use crate::graph::Graph;
use crate::source::{normalize, read_source, Origin};
use mgn_ir::plan::Mode;
use mgn_syntax::{Diagnostic, Span};
use std::path::Path;

/// Stack for the parser and evaluator threads; the language limits keep recursion well within it.
const STACK_BYTES: usize = 256 << 20;

/// The result of checking or building one root file.
pub struct Outcome {
    pub program: Program,
    pub diagnostics: Vec<Diagnostic>,
    /// One graph per model that elaborated cleanly.
    pub graphs: Vec<Graph>,
    /// Types and descriptions of spans learned while elaborating (for the language server).
    pub facts: Vec<crate::elab::eval::Fact>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.diagnostics.is_empty()
    }
}

/// What to elaborate after the name checks pass.
#[derive(Clone, Debug, Default)]
pub enum Models {
    /// Every model in the root file, with default arguments (`mgnc check`).
    #[default]
    All,
    /// One model: the only one in the file, or the named one; with `--set` overrides.
    One { name: Option<String>, settings: Vec<Setting> },
}

/// Checks a file from disk. An error means it cannot be read (`read_source`: missing, not a
/// regular file, over the size limit, not UTF-8), and says why. `Models::One` is elaborated
/// for an inference plan (`training` is false); `check_path_as` chooses.
pub fn check_path(path: &Path, models: Models) -> Result<Outcome, String> {
    check_path_as(path, models, Mode::Infer)
}

/// As `check_path`, elaborating `Models::One` for a plan of `mode`. (`Models::All` is
/// elaborated for inference, and for training too where a model reads `training`.)
pub fn check_path_as(path: &Path, models: Models, mode: Mode) -> Result<Outcome, String> {
    let text = read_source(path)
        .map_err(|reason| format!("cannot read `{}`: {reason}", path.display()))?;
    let name = path.display().to_string();
    let origin = Origin::Path(normalize(path));
    Ok(check_text_as(name, origin, text, models, front::load::Overrides::new(), mode))
}

pub fn check_text(name: String, origin: Origin, text: String, models: Models) -> Outcome {
    check_text_with_overrides(name, origin, text, models, front::load::Overrides::new())
}

/// As `check_text`, with imported files read from `overrides` (editor buffers) where present.
pub fn check_text_with_overrides(
    name: String,
    origin: Origin,
    text: String,
    models: Models,
    overrides: front::load::Overrides,
) -> Outcome {
    check_text_as(name, origin, text, models, overrides, Mode::Infer)
}

fn check_text_as(
    name: String,
    origin: Origin,
    text: String,
    models: Models,
    overrides: front::load::Overrides,
    mode: Mode,
) -> Outcome {
    let fallback_name = name.clone();
    let fallback_text = text.clone();
    let run = move || pipeline(name, origin, text, models, overrides, mode);
    match std::thread::Builder::new()
        .name("mgnc".into())
        .stack_size(STACK_BYTES)
        .spawn(run)
        .map(|h| h.join())
    {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            internal_error(fallback_name, fallback_text, &what)
        }
        Err(e) => internal_error(
            fallback_name,
            fallback_text,
            &format!("cannot start the compiler thread: {e}"),
        ),
    }
}

fn internal_error(name: String, text: String, what: &str) -> Outcome {
    let (program, _) =
        front::load::load(name, Origin::Memory("<internal error>".into()), String::new());
    let _ = text;
    let d = Diagnostic::error(
        "E0999",
        format!("internal compiler error: {what}"),
        Span::default(),
        "while compiling this file",
    )
    .with_help("this is a bug in mgnc; please report it with the file that triggered it");
    Outcome { program, diagnostics: vec![d], graphs: Vec::new(), facts: Vec::new() }
}

fn pipeline(
    name: String,
    origin: Origin,
    text: String,
    models: Models,
    overrides: front::load::Overrides,
    mode: Mode,
) -> Outcome {
    let (program, mut diagnostics) =
        front::load::load_with_overrides(name, origin, text, overrides);
    diagnostics.extend(front::names::check(&program));
    let mut graphs = Vec::new();
    let mut facts = Vec::new();
    if diagnostics.is_empty() {
        let root = program.root;
        let all = elab::models(&program, root);
        match models {
            Models::All => {
                for (index, _) in all {
                    match check_both_modes(&program, index, &mut facts) {
                        Ok(g) => graphs.push(g),
                        Err(d) => diagnostics.push(d),
                    }
                }
            }
            Models::One { name, settings } => match pick_model(&program, &all, name.as_deref()) {
                Ok(index) => {
                    let built = elab::elaborate_with_facts(
                        &program, root, index, &settings, mode, &mut facts,
                    );
                    match built {
                        Ok(g) => graphs.push(g),
                        Err(d) => diagnostics.push(d),
                    }
                }
                Err(d) => diagnostics.push(d),
            },
        }
    }
    Outcome { program, diagnostics, graphs, facts }
}

/// Elaborates a model of the root file with its defaults for an inference plan and, when it
/// reads `training` (so a training plan elaborates other code), for a training plan too: the
/// inference graph, or the first error, the training one's saying so.
fn check_both_modes(
    program: &Program,
    index: usize,
    facts: &mut Vec<crate::elab::eval::Fact>,
) -> Result<Graph, Diagnostic> {
    let root = program.root;
    let g = elab::elaborate_with_facts(program, root, index, &[], Mode::Infer, facts)?;
    if g.training.is_some() {
        elab::elaborate_with_facts(program, root, index, &[], Mode::Train, facts).map_err(|d| {
            d.with_note("in the training plan: this model reads `training`, which is true there")
        })?;
    }
    Ok(g)
}

fn pick_model(
    program: &Program,
    all: &[(usize, &mgn_syntax::ast::LayerItem)],
    name: Option<&str>,
) -> Result<usize, Diagnostic> {
    let file_start = Span { file: program.module(program.root).file, start: 0, end: 0 };
    let names: Vec<&str> = all.iter().map(|(_, m)| m.name.name.as_str()).collect();
    match name {
        Some(n) => all.iter().find(|(_, m)| m.name.name == n).map(|(i, _)| *i).ok_or_else(|| {
            let d = Diagnostic::error(
                "E0501",
                format!("there is no model `{n}` in this file"),
                file_start,
                "in this file",
            );
            match front::did_you_mean(n, names.iter().copied()) {
                Some(h) => d.with_help(h),
                None if names.is_empty() => d.with_note("the file defines no models"),
                None => d.with_note(format!("its models are: {}", names.join(", "))),
            }
        }),
        None => match all {
            [(i, _)] => Ok(*i),
            [] => Err(Diagnostic::error(
                "E0501",
                "this file defines no model to build",
                file_start,
                "no `model` item",
            )
            .with_help(concat!(
                "`mgnc build` compiles a `model`; ",
                "`mgnc check` also checks files that only define layers"
            ))),
            _ => Err(Diagnostic::error(
                "E0501",
                "this file defines several models",
                all[1].1.name.span,
                "another model",
            )
            .with_label(all[0].1.name.span, "a model")
            .with_help(format!("choose one with `--model NAME` ({})", names.join(", ")))),
        },
    }
}

/// Checks and builds one model, then lowers it to a plan. Diagnostics (including "this model
/// has no loss" for a training plan) come back in the outcome; the plan is `None` then.
pub fn plan_path(
    path: &Path,
    model: Option<String>,
    settings: Vec<Setting>,
    opts: &crate::lower::PlanOptions,
) -> Result<(Outcome, Option<mgn_ir::Plan>), String> {
    plan_path_dynamic(path, model, settings, &[], opts)
}

/// As `plan_path`, for a plan over the dynamic sizes `sizes` (none: a static plan): checked
/// and built at the bound, then at the other probe points (`crate::dynamic`).
pub fn plan_path_dynamic(
    path: &Path,
    model: Option<String>,
    settings: Vec<Setting>,
    sizes: &[mgn_ir::dynamic::SizeVar],
    opts: &crate::lower::PlanOptions,
) -> Result<(Outcome, Option<mgn_ir::Plan>), String> {
    let bound: Vec<usize> = sizes.iter().map(|v| v.max).collect();
    let at_bound = crate::dynamic::settings_at(&settings, sizes, &bound);
    let models = Models::One { name: model, settings: at_bound };
    let mut outcome = check_path_as(path, models, opts.mode)?;
    if !outcome.ok() {
        return Ok((outcome, None));
    }
    let graph = outcome.graphs.pop().expect("a clean build has its graph");
    let root = outcome.program.root;
    let (index, model_span) = match elab::models(&outcome.program, root)
        .into_iter()
        .find(|(_, m)| m.name.name == graph.model)
    {
        Some((i, m)) => (i, m.name.span),
        None => unreachable!("the graph is of a model of the root file"),
    };
    let built = if sizes.is_empty() {
        crate::lower::lower(graph.clone(), &outcome.program.sources, opts)
    } else if let Some(d) = crate::dynamic::conflict(&settings, sizes, model_span) {
        Err(d)
    } else {
        let program = &outcome.program;
        crate::dynamic::build(program, root, index, graph.clone(), &settings, sizes, opts)
    };
    match built {
        Ok(plan) => {
            outcome.graphs.push(graph);
            Ok((outcome, Some(plan)))
        }
        Err(mut d) => {
            if d.primary_span() == Span::default() {
                // Whole-model problems point at the model's name.
                d.labels[0].span = model_span;
            }
            outcome.diagnostics.push(d);
            Ok((outcome, None))
        }
    }
}
