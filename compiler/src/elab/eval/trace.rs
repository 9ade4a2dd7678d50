//! The trace of an elaboration error: the path from the model down to the error through the
//! layers, forwards, `fn`s and constants being evaluated, as rustc's macro backtraces and C++'s
//! "required from here" show it. An error inside the standard library is reported at the
//! user's own call that led into it, with the place in the library as a secondary label, so
//! the terminal, the JSON and the editor all show it in the user's file.
//!
//! While the error unwinds, each frame whose definition contains the error's place (the error
//! itself, or the call of the frame recorded before it) adds a step holding its call site
//! (`record`); a frame the error is not inside — an argument of a call, checked while the
//! callee's frame is entered, is the caller's — adds none. `finish` turns those into the
//! trace: outermost first, each step at the place in it that led on.

use super::FrameStep;
use crate::graph::dump::thousands;
use crate::source::{Origin, SourceMap};
use mgn_syntax::{Diagnostic, Label, Span, Step, StepKind};

/// The code of the call-depth limit (and of the model's size limit).
pub const DEPTH_CODE: &str = "E0601";

/// Steps kept of a long trace: this many from each end (after runs of one recursive step are
/// merged into one).
const KEEP_EACH_END: usize = 8;

/// Adds the frame `step`, called at `call_site`, to the error's trace if the error is inside
/// it. Until `finish`, a step's `at` holds its own call site.
pub fn record(mut d: Diagnostic, step: &FrameStep, call_site: Span) -> Diagnostic {
    let here = d.trace().last().map_or_else(|| d.primary_span(), |s| s.at);
    if inside(step.def, here) {
        d.push_step(Step {
            kind: step.kind,
            name: step.name.clone(),
            at: call_site,
            count: 1,
            origin: step.origin,
        });
    }
    d
}

fn inside(outer: Span, inner: Span) -> bool {
    outer.file == inner.file && outer.start <= inner.start && inner.end <= outer.end
}

/// The trace in its final form (see the module comment), and an error inside the standard
/// library moved to the user's call that led into it. A trace of the model alone (the error
/// is in the model's own text) is dropped.
pub fn finish(sources: &SourceMap, mut d: Diagnostic) -> Diagnostic {
    let mut steps = d.take_trace();
    if steps.len() < 2 {
        return d;
    }
    steps.reverse();
    for i in 0..steps.len() - 1 {
        steps[i].at = steps[i + 1].at;
    }
    let last = steps.len() - 1;
    steps[last].at = d.primary_span();
    let steps = merge_runs(steps);
    let last = steps.len() - 1;
    let is_std =
        |s: Span| sources.try_get(s.file).is_some_and(|f| matches!(f.origin, Origin::Std(_)));
    let recursion = steps.iter().filter(|s| s.count > 1 && !is_std(s.at)).max_by_key(|s| s.count);
    match recursion {
        // Past the call-depth limit, the place that recursed is what to show, wherever the
        // last call happened to be.
        Some(r) if d.code == DEPTH_CODE && r.at != d.primary_span() => {
            let label =
                format!("{} recurses here {} times in a row", r.describe(), thousands(r.count));
            d = with_primary(d, r.at, label);
        }
        _ if is_std(d.primary_span()) => {
            if let Some(k) = (0..last).rev().find(|&k| !is_std(steps[k].at)) {
                d = at_user_call(d, &steps[k], &steps[k + 1], &is_std);
            }
        }
        _ => {}
    }
    d.set_trace(shorten(steps));
    d
}

/// `d` with a new primary label at `span`; the old primary label stays as a secondary one.
fn with_primary(mut d: Diagnostic, span: Span, message: String) -> Diagnostic {
    for l in &mut d.labels {
        l.primary = false;
    }
    d.labels.insert(0, Label { span, message, primary: true });
    d
}

/// Makes the user's call `caller.at` (into `callee`) the primary label; the place in the
/// library stays as a secondary one.
fn at_user_call(
    mut d: Diagnostic,
    caller: &Step,
    callee: &Step,
    is_std: &impl Fn(Span) -> bool,
) -> Diagnostic {
    let was = d.labels.iter().find(|l| l.primary).map(|l| l.message.clone()).unwrap_or_default();
    let what = match callee.kind {
        StepKind::Layer => format!("`{}`", callee.name),
        StepKind::Forward | StepKind::Fn => format!("call of `{}`", callee.name),
        StepKind::Const => format!("use of const `{}`", callee.name),
        StepKind::Model | StepKind::Omitted => callee.describe(),
    };
    let message = if was.is_empty() {
        format!("inside this {what}")
    } else {
        format!("inside this {what}: {was}")
    };
    d = with_primary(d, caller.at, message);
    if let Some(origin) = callee.origin.filter(|o| !is_std(*o) && *o != caller.at) {
        d = d.with_label(origin, format!("this `{}` was created here", callee.name));
    }
    d
}

/// One step for each run of equal steps in a row (a function calling itself), counted.
fn merge_runs(steps: Vec<Step>) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    for s in steps {
        match out.last_mut() {
            Some(p) if p.kind == s.kind && p.name == s.name && p.at == s.at => p.count += s.count,
            _ => out.push(s),
        }
    }
    out
}

/// The first and last `KEEP_EACH_END` steps of a long trace, with one `Omitted` step for the
/// rest.
fn shorten(mut steps: Vec<Step>) -> Vec<Step> {
    if steps.len() <= 2 * KEEP_EACH_END + 1 {
        return steps;
    }
    let tail = steps.split_off(steps.len() - KEEP_EACH_END);
    let left_out = steps.len() - KEEP_EACH_END;
    steps.truncate(KEEP_EACH_END);
    steps.push(Step {
        kind: StepKind::Omitted,
        name: String::new(),
        at: Span::default(),
        count: left_out,
        origin: None,
    });
    steps.extend(tail);
    steps
}
