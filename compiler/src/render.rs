//! Diagnostics for people (miette's graphical report) and for tools (JSON lines).

use crate::source::SourceMap;
use mgn_syntax::{Diagnostic, FileId, Severity};
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceSpan};
use serde::Serialize;
use std::fmt;

/// One file's share of a diagnostic, in miette's terms. Labels in other files than the
/// primary one become related reports, each showing its own file.
#[derive(Debug)]
struct Report {
    message: String,
    code: Option<String>,
    severity: miette::Severity,
    help: Option<String>,
    source: Option<NamedSource<String>>,
    labels: Vec<LabeledSpan>,
    related: Vec<Report>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Report {}

impl miette::Diagnostic for Report {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.code.as_ref().map(|c| Box::new(c) as Box<dyn fmt::Display>)
    }
    fn severity(&self) -> Option<miette::Severity> {
        Some(self.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help.as_ref().map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.source.as_ref().map(|s| s as &dyn miette::SourceCode)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.iter().cloned()))
    }
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            None
        } else {
            Some(Box::new(self.related.iter().map(|r| r as &dyn miette::Diagnostic)))
        }
    }
}

fn source_of(sources: &SourceMap, file: FileId) -> NamedSource<String> {
    let f = sources.get(file);
    NamedSource::new(f.name.clone(), f.text.clone())
}

fn labeled(l: &mgn_syntax::Label, text_len: usize) -> LabeledSpan {
    let start = (l.span.start as usize).min(text_len);
    let len = (l.span.len()).min(text_len - start);
    let span = SourceSpan::new(start.into(), len);
    if l.primary {
        LabeledSpan::new_primary_with_span(Some(l.message.clone()), span)
    } else {
        LabeledSpan::new_with_span(Some(l.message.clone()), span)
    }
}

fn report(sources: &SourceMap, d: &Diagnostic) -> Report {
    let primary = d.primary_span().file;
    let len_of = |f: FileId| sources.get(f).text.len();
    let mut related: Vec<Report> = Vec::new();
    let mut other_files: Vec<FileId> =
        d.labels.iter().map(|l| l.span.file).filter(|f| *f != primary).collect();
    other_files.dedup();
    other_files.sort();
    other_files.dedup();
    for f in other_files {
        related.push(Report {
            message: format!("see {}", sources.get(f).name),
            code: None,
            severity: miette::Severity::Advice,
            help: None,
            source: Some(source_of(sources, f)),
            labels: d
                .labels
                .iter()
                .filter(|l| l.span.file == f)
                .map(|l| labeled(l, len_of(f)))
                .collect(),
            related: Vec::new(),
        });
    }
    // Notes are facts about the error (not fixes): each is a sourceless related report.
    for n in &d.notes {
        related.push(Report {
            message: format!("note: {n}"),
            code: None,
            severity: miette::Severity::Advice,
            help: None,
            source: None,
            labels: Vec::new(),
            related: Vec::new(),
        });
    }
    Report {
        message: d.message.clone(),
        code: Some(d.code.to_string()),
        severity: match d.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        },
        help: d.help.clone(),
        source: Some(source_of(sources, primary)),
        labels: d
            .labels
            .iter()
            .filter(|l| l.span.file == primary)
            .map(|l| labeled(l, len_of(primary)))
            .collect(),
        related,
    }
}

/// The human rendering, without colour (stable for golden tests); `color` adds ANSI styles.
pub fn render(sources: &SourceMap, d: &Diagnostic, color: bool) -> String {
    let theme = if color { GraphicalTheme::unicode() } else { GraphicalTheme::unicode_nocolor() };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(100)
        .with_links(false)
        .with_context_lines(1);
    let mut out = String::new();
    if handler.render_report(&mut out, &report(sources, d)).is_err() {
        out = format!("error[{}]: {}\n", d.code, d.message);
    }
    out
}

#[derive(Serialize)]
pub struct JsonSpan {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub byte_start: u32,
    pub byte_end: u32,
}

#[derive(Serialize)]
pub struct JsonLabel {
    #[serde(flatten)]
    pub span: JsonSpan,
    pub message: String,
    pub primary: bool,
}

#[derive(Serialize)]
pub struct JsonDiagnostic {
    pub severity: Severity,
    pub code: &'static str,
    pub message: String,
    #[serde(flatten)]
    pub span: JsonSpan,
    pub labels: Vec<JsonLabel>,
    pub help: Option<String>,
    pub notes: Vec<String>,
    pub rendered: String,
}

pub fn json_span(sources: &SourceMap, span: mgn_syntax::Span) -> JsonSpan {
    let f = sources.get(span.file);
    let (line, column) = f.lines.line_col(span.start as usize);
    let (end_line, end_column) = f.lines.line_col(span.end as usize);
    JsonSpan {
        file: f.name.clone(),
        line,
        column,
        end_line,
        end_column,
        byte_start: span.start,
        byte_end: span.end,
    }
}

/// One JSON object per diagnostic (print one per line).
pub fn to_json(sources: &SourceMap, d: &Diagnostic) -> String {
    let j = JsonDiagnostic {
        severity: d.severity,
        code: d.code,
        message: d.message.clone(),
        span: json_span(sources, d.primary_span()),
        labels: d
            .labels
            .iter()
            .map(|l| JsonLabel {
                span: json_span(sources, l.span),
                message: l.message.clone(),
                primary: l.primary,
            })
            .collect(),
        help: d.help.clone(),
        notes: d.notes.clone(),
        rendered: render(sources, d, false),
    };
    serde_json::to_string(&j).unwrap_or_else(|e| {
        format!("{{\"severity\":\"error\",\"message\":\"cannot serialize diagnostic: {e}\"}}")
    })
}
