//! Diagnostics as plain data. Rendering (miette, JSON) lives in the compiler; the language
//! server consumes these structs directly.

use crate::span::Span;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Label {
    pub span: Span,
    pub message: String,
    /// The primary label marks where the problem is; secondary ones give context
    /// (where the other shape was declared, where a name was defined).
    pub primary: bool,
}

/// What elaboration was evaluating when an error arose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// A model: its arguments, fields, inputs and forward.
    Model,
    /// A layer being instantiated: its config and fields.
    Layer,
    /// A layer instance's `forward`.
    Forward,
    Fn,
    Const,
    /// Steps left out of a long trace (`count` of them).
    Omitted,
}

/// One step of the path elaboration took to an error (as rustc's macro backtraces and C++'s
/// "required from here"): the definition it was in, and the place in that definition that led
/// on — the call of the next step, or the error itself for the last step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    pub kind: StepKind,
    /// The model, layer, fn or const by name.
    pub name: String,
    pub at: Span,
    /// How many times in a row the step repeats (recursion), or how many steps an `Omitted`
    /// one stands for.
    pub count: usize,
    /// For a `Forward`: where the layer instance was created.
    pub origin: Option<Span>,
}

impl Step {
    /// "model `M`", "`Block`", "`Block.forward`", "`split_heads`", "const `D`".
    pub fn describe(&self) -> String {
        match self.kind {
            StepKind::Model => format!("model `{}`", self.name),
            StepKind::Layer | StepKind::Fn => format!("`{}`", self.name),
            StepKind::Forward => format!("`{}.forward`", self.name),
            StepKind::Const => format!("const `{}`", self.name),
            StepKind::Omitted => format!("{} more steps", self.count),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable machine-readable code such as `E0201`, documented in docs/DIAGNOSTICS.md.
    pub code: &'static str,
    pub message: String,
    pub labels: Vec<Label>,
    /// A boxed `str` rather than a `String`: the `Diagnostic` stays small enough to return.
    pub help: Option<Box<str>>,
    pub notes: Vec<String>,
    /// What most diagnostics lack, in one box, absent when there is none of it: a `Diagnostic`
    /// is the error type of most of the compiler and must stay small enough to return. The
    /// JSON output has the trace's steps (`trace`), not the fix.
    #[serde(rename = "trace", serialize_with = "trace_json")]
    extra: Option<Box<Extra>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Extra {
    /// For errors raised while elaborating inside layers, `fn`s and constants: the steps from
    /// the model down to the error, outermost first (see `trace`).
    steps: Vec<Step>,
    /// A machine-applicable fix for what the help text suggests (the editor offers it as a
    /// quick fix).
    fix: Option<Fix>,
}

/// The steps as an array, `null` when there are none.
fn trace_json<S: serde::Serializer>(extra: &Option<Box<Extra>>, s: S) -> Result<S::Ok, S::Error> {
    let steps = extra.as_deref().map(|e| &e.steps).filter(|steps| !steps.is_empty());
    steps.serialize(s)
}

/// Edits that carry out a diagnostic's suggestion, under a title such as "replace with `w`".
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fix {
    pub title: String,
    pub edits: Vec<Edit>,
}

/// Replace the text at `span` (empty: insert at `span.start`) with `text`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Edit {
    pub span: Span,
    pub text: String,
}

impl Diagnostic {
    pub fn error(
        code: &'static str,
        message: impl Into<String>,
        span: Span,
        label: impl Into<String>,
    ) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            labels: vec![Label { span, message: label.into(), primary: true }],
            help: None,
            notes: Vec::new(),
            extra: None,
        }
    }

    /// Attaches a fix of one edit: `text` in place of `span`.
    pub fn with_replacement(self, title: impl Into<String>, span: Span, text: &str) -> Diagnostic {
        let edits = vec![Edit { span, text: text.to_string() }];
        self.with_fix(Fix { title: title.into(), edits })
    }

    pub fn with_fix(mut self, fix: Fix) -> Diagnostic {
        self.extra.get_or_insert_with(Default::default).fix = Some(fix);
        self
    }

    /// The edits that carry out the help's suggestion, if the diagnostic has them.
    pub fn fix(&self) -> Option<&Fix> {
        self.extra.as_deref().and_then(|e| e.fix.as_ref())
    }

    /// Adds a secondary label.
    pub fn with_label(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label { span, message: message.into(), primary: false });
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into().into_boxed_str());
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// The steps from the model down to the error, outermost first; empty for an error that is
    /// not inside a layer, `fn` or constant.
    pub fn trace(&self) -> &[Step] {
        self.extra.as_deref().map_or(&[], |e| e.steps.as_slice())
    }

    pub fn set_trace(&mut self, steps: Vec<Step>) {
        let fix = self.extra.take().and_then(|e| e.fix);
        self.extra = (!steps.is_empty() || fix.is_some()).then(|| Box::new(Extra { steps, fix }));
    }

    pub fn take_trace(&mut self) -> Vec<Step> {
        let steps = self.extra.as_mut().map(|e| std::mem::take(&mut e.steps)).unwrap_or_default();
        if self.extra.as_ref().is_some_and(|e| e.fix.is_none()) {
            self.extra = None;
        }
        steps
    }

    pub fn push_step(&mut self, step: Step) {
        self.extra.get_or_insert_with(Default::default).steps.push(step);
    }

    pub fn primary_span(&self) -> Span {
        self.labels.iter().find(|l| l.primary).map(|l| l.span).unwrap_or_default()
    }
}
