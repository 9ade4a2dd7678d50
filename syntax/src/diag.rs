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
    /// For errors raised while elaborating inside layers, `fn`s and constants: the steps from
    /// the model down to the error, outermost first (see `trace`). Boxed, and absent when
    /// there are none: a `Diagnostic` is the error type of most of the compiler, and most have
    /// no trace.
    trace: Option<Box<Steps>>,
    /// A machine-applicable fix for what the help text suggests (the editor offers it as a
    /// quick fix). Boxed for the same reason as `trace`; not part of the JSON output.
    #[serde(skip)]
    pub fix: Option<Box<Fix>>,
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

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
struct Steps(Vec<Step>);

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
            trace: None,
            fix: None,
        }
    }

    /// Attaches a fix of one edit: `text` in place of `span`.
    pub fn with_replacement(self, title: impl Into<String>, span: Span, text: &str) -> Diagnostic {
        let edits = vec![Edit { span, text: text.to_string() }];
        self.with_fix(Fix { title: title.into(), edits })
    }

    pub fn with_fix(mut self, fix: Fix) -> Diagnostic {
        self.fix = Some(Box::new(fix));
        self
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
        self.trace.as_deref().map_or(&[], |t| t.0.as_slice())
    }

    pub fn set_trace(&mut self, steps: Vec<Step>) {
        self.trace = (!steps.is_empty()).then(|| Box::new(Steps(steps)));
    }

    pub fn take_trace(&mut self) -> Vec<Step> {
        self.trace.take().map_or_else(Vec::new, |t| t.0)
    }

    pub fn push_step(&mut self, step: Step) {
        self.trace.get_or_insert_with(Default::default).0.push(step);
    }

    pub fn primary_span(&self) -> Span {
        self.labels.iter().find(|l| l.primary).map(|l| l.span).unwrap_or_default()
    }
}
