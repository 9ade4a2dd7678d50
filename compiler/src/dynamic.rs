//! Dynamic plans (`mgnc build --dynamic B=32,T=512`): the model is elaborated and lowered at
//! the probe points of its dynamic sizes (`mgn_ir::dynamic::Probes`: the corners of the
//! sizes' top values and two spread points), each as a static build with those values, and the
//! plans are fitted into one (`Dynamic::fit`): the plan at the bound plus a polynomial for
//! every number that changes with the sizes. Every op is checked with concrete shapes at every
//! point, as a static build checks it; what no polynomial of the sizes can carry (a model that
//! computes something else at another size, a length halved by a stride, a constant computed
//! from a size, a parameter's shape) is an E0503 at the user's line that makes it.

use crate::elab::{self, Flag, Setting};
use crate::front::{ModId, Program};
use crate::graph::{fmt_type, Graph};
use crate::lower::{lower_with_spans, PlanOptions};
use mgn_ir::dynamic::{Dynamic, FitError, Misfit, Probes, SizeVar};
use mgn_ir::Plan;
use mgn_syntax::{Diagnostic, Span};

/// Stack for each probe's elaboration, as the driver's own thread has.
const STACK_BYTES: usize = 256 << 20;

/// The settings that build the model at `point` of `sizes`, after the user's `settings`.
pub fn settings_at(settings: &[Setting], sizes: &[SizeVar], point: &[usize]) -> Vec<Setting> {
    let mut all = settings.to_vec();
    all.extend(sizes.iter().zip(point).map(|(v, n)| Setting {
        name: v.name.clone(),
        value: n.to_string(),
        flag: Flag::Dynamic,
    }));
    all
}

/// A `--dynamic` size that `--set` also gives, which would make the probes meaningless.
pub fn conflict(settings: &[Setting], sizes: &[SizeVar], model: Span) -> Option<Diagnostic> {
    let v = sizes.iter().find(|v| settings.iter().any(|s| s.name == v.name))?;
    Some(
        Diagnostic::error(
            "E0503",
            format!("`{}` is given by both `--set` and `--dynamic`", v.name),
            model,
            "in this model",
        )
        .with_help(format!("drop `--set {}=…`: the dynamic plan takes {v}", v.name)),
    )
}

/// The dynamic plan of model `index` of `root`, whose graph at the bound is `bound`.
pub fn build(
    program: &Program,
    root: ModId,
    index: usize,
    bound: Graph,
    settings: &[Setting],
    sizes: &[SizeVar],
    opts: &PlanOptions,
) -> Result<Plan, Diagnostic> {
    let probes = Probes::new(sizes);
    // Where each parameter is made, in a user file: a parameter that changes is reported there.
    let made: Vec<(String, Span)> =
        bound.params.iter().map(|p| (p.name.clone(), bound.node(p.node).user_span)).collect();
    let (first, spans) = lower_with_spans(bound, &program.sources, opts)?;
    let rest = &probes.points[1..];
    let others: Vec<Result<Plan, Diagnostic>> = std::thread::scope(|scope| {
        let handles: Vec<_> = rest
            .iter()
            .map(|point| {
                let settings = settings_at(settings, sizes, point);
                std::thread::Builder::new()
                    .name("mgnc-probe".into())
                    .stack_size(STACK_BYTES)
                    .spawn_scoped(scope, move || {
                        let g = elab::elaborate_in(program, root, index, &settings, opts.mode)?;
                        lower_with_spans(g, &program.sources, opts).map(|(p, _)| p)
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(internal("a probe build panicked"))),
                Err(e) => Err(internal(&format!("cannot start a probe build: {e}"))),
            })
            .collect()
    });
    let mut plans = vec![first];
    for (point, plan) in rest.iter().zip(others) {
        let at = describe(sizes, point);
        plans.push(plan.map_err(|d| {
            d.with_note(format!("while building the plan at {at}, one of the sizes it must run at"))
        })?);
    }
    let model = model_span(program, root, index);
    if let Some(d) = changed_parameter(&plans, &made, sizes, &probes) {
        return Err(d);
    }
    let d = Dynamic::fit(sizes, &probes, &plans).map_err(|e| match e {
        FitError::Step { step, misfit } => {
            let span = spans.get(step).copied().unwrap_or(model);
            misfit_diagnostic(&misfit, span, sizes, &probes, &plans[0].steps[step])
        }
        FitError::Plan { part } => Diagnostic::error(
            "E0503",
            format!("{part} changes with the dynamic sizes"),
            model,
            "in this model",
        )
        .with_note(
            "a dynamic plan changes the shapes of values between runs, never its steps, \
             parameters, inputs or results",
        )
        .with_help(format!(
            "make the sizes this depends on static with `--set` ({})",
            names(sizes)
        )),
    })?;
    let mut plan = plans.swap_remove(0);
    plan.dynamic = Some(d);
    plan.validate().map_err(|e| {
        let message = format!("this dynamic plan cannot run: {e}");
        Diagnostic::error("E0503", message, model, "in this model").with_help(
            "every dynamic size must be an axis of some input by itself, so that a run's inputs \
             give it",
        )
    })?;
    Ok(plan)
}

/// The first parameter whose shape or presence differs between the plans at the probe points
/// (a parameter's shape cannot be dynamic: it is loaded and saved as it is), as an E0503 at
/// the user's line that makes it — a field, or the layer call that makes it.
fn changed_parameter(
    plans: &[Plan],
    made: &[(String, Span)],
    sizes: &[SizeVar],
    probes: &Probes,
) -> Option<Diagnostic> {
    let bound = &plans[0];
    let (k, at) = plans.iter().enumerate().skip(1).find_map(|(at, p)| {
        let n = p.params.len().min(bound.params.len());
        let k = (0..n).find(|&k| p.params[k] != bound.params[k]);
        let k = k.or((p.params.len() != bound.params.len()).then_some(n))?;
        Some((k, at))
    })?;
    let (name, span) = made.get(k)?;
    let (here, there) = (describe(sizes, &probes.points[0]), describe(sizes, &probes.points[at]));
    let other = plans[at].params.get(k).filter(|q| q.name == *name);
    let (message, label) = match other {
        Some(q) => {
            let p = &bound.params[k];
            let reshaped = p.shape != q.shape;
            let what = if reshaped { "the shape of parameter" } else { "parameter" };
            // Only the shapes where they differ; the initializers where they may.
            let spec = |p: &mgn_ir::plan::ParamSpec| {
                let ty = fmt_type(p.dtype, &p.shape);
                if reshaped {
                    ty
                } else {
                    format!("{ty} init {}", p.init)
                }
            };
            (
                format!("{what} `{name}` changes with the dynamic sizes"),
                format!("{} at {here}, {} at {there}", spec(p), spec(q)),
            )
        }
        None => (
            format!("parameter `{name}` exists at some dynamic sizes only"),
            format!("made here at {here}, not at {there}"),
        ),
    };
    Some(
        Diagnostic::error("E0503", message, *span, label)
            .with_note(
                "a dynamic plan changes the shapes of values between runs, never its \
                 parameters: they are loaded and saved as they are",
            )
            .with_help(format!(
                "make the sizes this depends on static with `--set` ({})",
                names(sizes)
            )),
    )
}

fn misfit_diagnostic(
    misfit: &Misfit,
    span: Span,
    sizes: &[SizeVar],
    probes: &Probes,
    step: &mgn_ir::Step,
) -> Diagnostic {
    let what = part_name(misfit.at(), step);
    let (message, note) = match misfit {
        Misfit::NotPolynomial { values, .. } => {
            let at: Vec<String> = (probes.points.iter().zip(values))
                .map(|(p, v)| format!("{v} at {}", describe(sizes, p)))
                .collect();
            (
                format!("{what} follows the dynamic sizes in a way a dynamic plan cannot carry"),
                format!(
                    "it is {}: no sum of products of {} (a division or a rounding of a size?)",
                    at.join(", "),
                    names(sizes)
                ),
            )
        }
        Misfit::NotInteger { .. } => (
            format!("{what} is a number computed from a dynamic size"),
            "a dynamic plan keeps its constants fixed between runs".to_string(),
        ),
        Misfit::Structure { .. } => {
            let at: Vec<String> = probes.points.iter().map(|p| describe(sizes, p)).collect();
            (
                "the model computes something else here at other sizes".to_string(),
                format!(
                    "a dynamic plan runs the same steps at every size, but the plans built at {} \
                     differ here ({what})",
                    at.join("; ")
                ),
            )
        }
    };
    Diagnostic::error("E0503", message, span, format!("`{}` here", step.op.describe()))
        .with_note(note)
        .with_help(format!(
            "build a plan per size with `--set` instead, or make this independent of {}",
            names(sizes)
        ))
}

/// What a JSON pointer into a step names, for people: `axis 1 of its shape [..]`, `its `end``.
fn part_name(at: &str, step: &mgn_ir::Step) -> String {
    if let Some(axis) = at.strip_prefix("/shape/") {
        return format!("axis {axis} of its shape {:?}", step.shape);
    }
    let mut parts = at.split('/').skip(1);
    match (parts.next(), parts.next(), parts.next()) {
        (Some("op"), Some(_), Some(field)) => format!("its `{field}`"),
        (Some("op"), _, None) => "its operation".to_string(),
        _ => "its operands or place".to_string(),
    }
}

fn describe(sizes: &[SizeVar], point: &[usize]) -> String {
    let each: Vec<String> =
        sizes.iter().zip(point).map(|(v, n)| format!("{} = {n}", v.name)).collect();
    each.join(", ")
}

fn names(sizes: &[SizeVar]) -> String {
    sizes.iter().map(|v| format!("`{}`", v.name)).collect::<Vec<_>>().join(", ")
}

fn model_span(program: &Program, root: ModId, index: usize) -> Span {
    match program.item(root, index) {
        mgn_syntax::ast::Item::Layer(m) => m.name.span,
        _ => Span::default(),
    }
}

fn internal(what: &str) -> Diagnostic {
    Diagnostic::error(
        "E0999",
        format!("internal compiler error: {what}"),
        Span::default(),
        "while building this model",
    )
    .with_help("this is a bug in mgnc; please report it with the file that triggered it")
}
