//! Diagnostics for people (miette's graphical report) and for tools (JSON lines).
//!
//! The report shows excerpts of the source. Lines longer than `LONG_LINE` bytes are shown only
//! around the labels, with `…` for the rest (`Excerpt`), so a label at any column renders;
//! locations (the report's `file:line:column`, JSON spans) are computed on the file itself.
//! Rendering runs under a panic guard: a renderer bug gives a plain rendering, not a crash.

use crate::graph::dump::thousands;
use crate::source::{SourceFile, SourceMap};
use mgn_syntax::{Diagnostic, FileId, Label, LineIndex, Severity, Span, Step, StepKind};
use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents,
    SourceCode, SourceSpan, SpanContents,
};
use serde::Serialize;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Lines longer than this many bytes are shown only around the labels on them.
const LONG_LINE: usize = 240;
/// Bytes kept on each side of a label's start and end on a long line.
const KEEP: usize = 40;
/// At most this many parts of one long line are shown; labels beyond them point at an elision.
const MAX_PARTS: usize = 16;
/// What stands for the bytes left out of a long line.
const ELISION: &str = "…";
/// Lines of source shown above and below each label.
const CONTEXT_LINES: usize = 1;
/// Words (identifiers, numbers) longer than this many bytes are shortened in the report's text.
const LONG_WORD: usize = 240;

/// One file's share of a diagnostic, in miette's terms. Labels in other files than the
/// primary one become related reports, each showing its own file.
#[derive(Debug)]
struct Report<'s> {
    message: String,
    code: Option<String>,
    severity: miette::Severity,
    help: Option<String>,
    source: Option<Excerpt<'s>>,
    labels: Vec<LabeledSpan>,
    related: Vec<Report<'s>>,
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Report<'_> {}

impl miette::Diagnostic for Report<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.code.as_ref().map(|c| Box::new(c) as Box<dyn fmt::Display>)
    }
    fn severity(&self) -> Option<miette::Severity> {
        Some(self.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help.as_ref().map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.source.as_ref().map(|s| s as &dyn SourceCode)
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

/// A file as the report shows it: long lines cut to the parts around the labels, and lone
/// carriage returns shown as spaces (miette would count them as line breaks; the compiler does
/// not). `runs` are the parts kept, `(view offset, file offset, length)` in order; between two
/// runs the view has `ELISION`. Line breaks are all kept, so line numbers agree.
struct Excerpt<'s> {
    name: &'s str,
    lines: &'s LineIndex,
    view: String,
    runs: Vec<(usize, usize, usize)>,
}

impl fmt::Debug for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Excerpt({}, {} runs)", self.name, self.runs.len())
    }
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

impl<'s> Excerpt<'s> {
    /// The excerpt of `file` in which every offset of `points` (labels' ends) is visible.
    fn new(file: &'s SourceFile, points: &[usize]) -> Excerpt<'s> {
        let text = file.text.as_str();
        let mut points: Vec<usize> = points.iter().map(|&p| floor_boundary(text, p)).collect();
        points.sort_unstable();
        points.dedup();
        let mut ex = Excerpt {
            name: &file.name,
            lines: &file.lines,
            view: String::with_capacity(text.len()),
            runs: Vec::new(),
        };
        // A byte-order mark is left out of the view (the line index does not count it either).
        let mut start = if text.starts_with('\u{feff}') { '\u{feff}'.len_utf8() } else { 0 };
        loop {
            let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
            if end - start <= LONG_LINE {
                ex.keep(text, start, end);
            } else {
                ex.elide(text, start, end, &points);
            }
            if end == text.len() {
                return ex;
            }
            ex.keep(text, end, end + 1);
            start = end + 1;
        }
    }

    /// Shows `text[from..to]` as it is (lone carriage returns as spaces).
    fn keep(&mut self, text: &str, from: usize, to: usize) {
        if from >= to {
            return;
        }
        let at = self.view.len();
        let part = &text[from..to];
        if part.contains('\r') {
            let bytes = text.as_bytes();
            for (i, c) in part.char_indices() {
                let lone = c == '\r' && bytes.get(from + i + 1) != Some(&b'\n');
                self.view.push(if lone { ' ' } else { c });
            }
        } else {
            self.view.push_str(part);
        }
        match self.runs.last_mut() {
            Some((v, o, len)) if *v + *len == at && *o + *len == from => *len += to - from,
            _ => self.runs.push((at, from, to - from)),
        }
    }

    /// Shows the long line `text[start..end]` around the points on it, or its beginning.
    fn elide(&mut self, text: &str, start: usize, end: usize, points: &[usize]) {
        let on_line = &points[points.partition_point(|&p| p < start)..];
        let on_line = &on_line[..on_line.partition_point(|&p| p <= end)];
        let mut parts: Vec<(usize, usize)> = Vec::new();
        for &p in on_line {
            let a = floor_boundary(text, p.saturating_sub(KEEP).max(start));
            let b = ceil_boundary(text, (p + KEEP).min(end));
            match parts.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => parts.push((a, b)),
            }
        }
        if parts.is_empty() {
            parts.push((start, ceil_boundary(text, start + 2 * KEEP)));
        }
        parts.truncate(MAX_PARTS);
        let mut at = start;
        for (a, b) in parts {
            if a > at {
                self.view.push_str(ELISION);
            }
            self.keep(text, a, b);
            at = b;
        }
        if at < end {
            self.view.push_str(ELISION);
        }
    }

    /// Where a file offset is in the view (an offset left out: where its elision starts).
    fn to_view(&self, offset: usize) -> usize {
        let i = self.runs.partition_point(|r| r.1 <= offset);
        match i.checked_sub(1).map(|i| self.runs[i]) {
            Some((v, o, len)) => v + (offset - o).min(len),
            None => 0,
        }
    }

    /// The file offset of a view offset (in an elision: the first byte it stands for).
    fn to_file(&self, offset: usize) -> usize {
        let i = self.runs.partition_point(|r| r.0 <= offset);
        match i.checked_sub(1).map(|i| self.runs[i]) {
            Some((v, o, len)) => o + (offset - v).min(len),
            None => 0,
        }
    }
}

impl SourceCode for Excerpt<'_> {
    /// miette reads the view; the line and column it prints come from the file.
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let c = self.view.read_span(span, before, after)?;
        let (line, column) = self.lines.line_col(self.to_file(c.span().offset()));
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.to_string(),
            c.data(),
            *c.span(),
            line - 1,
            column - 1,
            c.line_count(),
        )))
    }
}

/// The excerpt of `file` showing `here` (labels in it); `None` if there is no such file.
fn excerpt<'s>(
    sources: &'s SourceMap,
    file: FileId,
    here: &[&Label],
) -> Option<(Excerpt<'s>, Vec<LabeledSpan>)> {
    let f = sources.try_get(file)?;
    let points: Vec<usize> =
        here.iter().flat_map(|l| [l.span.start as usize, l.span.end as usize]).collect();
    let ex = Excerpt::new(f, &points);
    let labels = here
        .iter()
        .map(|l| {
            let start = ex.to_view(l.span.start as usize);
            let end = ex.to_view(l.span.end.max(l.span.start) as usize);
            let span = SourceSpan::new(start.into(), end - start);
            if l.primary {
                LabeledSpan::new_primary_with_span(Some(clip(&l.message)), span)
            } else {
                LabeledSpan::new_with_span(Some(clip(&l.message)), span)
            }
        })
        .collect();
    Some((ex, labels))
}

/// The labels of the primary label's file, split into those miette shows in or after the
/// primary label's excerpt and those it would show in excerpts before it. miette heads a
/// report with the location of its first excerpt, so the second group goes to a report of
/// its own after the main one: the header is always the primary label's place.
///
/// The grouping is miette's (7.6, `render_snippets`): labels in order of their start join the
/// excerpt before them when its first line plus its `line_count` reaches their first line,
/// `line_count` being (as miette computes it) the number of line breaks from the start of the
/// file to the end of the excerpt, not the excerpt's own length.
fn split_at_primary<'d>(
    sources: &SourceMap,
    d: &'d Diagnostic,
    file: FileId,
) -> (Vec<&'d Label>, Vec<&'d Label>) {
    let mut here: Vec<&Label> = d.labels.iter().filter(|l| l.span.file == file).collect();
    here.sort_by_key(|l| l.span.start);
    let Some(f) = sources.try_get(file) else { return (here, Vec::new()) };
    // 0-based lines of a label's excerpt: its own lines and CONTEXT_LINES around them.
    let line = |offset: u32| f.lines.line_col((offset as usize).min(f.text.len())).0 - 1;
    let context = |l: &Label| {
        let first = line(l.span.start).saturating_sub(CONTEXT_LINES);
        (first, line(l.span.end.max(l.span.start + 1) - 1) + CONTEXT_LINES)
    };
    let (mut group_start, mut group_first, mut group_last) = (0, 0, 0);
    for (i, l) in here.iter().enumerate() {
        let (first, last) = context(l);
        if i == 0 || group_first + group_last + 1 < first {
            (group_start, group_first, group_last) = (i, first, last);
        } else {
            group_last = group_last.max(last);
        }
        if l.primary {
            break;
        }
    }
    let later = here.split_off(group_start);
    (later, here)
}

/// `text` with every word longer than `LONG_WORD` bytes cut to its start and end around
/// `ELISION` (the report would spend time on them and show nothing useful).
fn clip(text: &str) -> String {
    if !text.split_whitespace().any(|w| w.len() > LONG_WORD) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len().min(4 * LONG_WORD));
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| !c.is_whitespace()) {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        if end > LONG_WORD {
            out.push_str(&rest[..floor_boundary(rest, 2 * KEEP)]);
            out.push_str(ELISION);
            out.push_str(&rest[ceil_boundary(rest, end - KEEP / 2)..end]);
        } else {
            out.push_str(&rest[..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn report<'s>(sources: &'s SourceMap, d: &Diagnostic) -> Report<'s> {
    let primary = d.primary_span().file;
    let (main, earlier) = split_at_primary(sources, d, primary);
    let mut other_files: Vec<FileId> =
        d.labels.iter().map(|l| l.span.file).filter(|f| *f != primary).collect();
    other_files.sort();
    other_files.dedup();
    let mut groups: Vec<(FileId, Vec<&Label>)> = Vec::new();
    if !earlier.is_empty() {
        groups.push((primary, earlier));
    }
    for f in other_files {
        groups.push((f, d.labels.iter().filter(|l| l.span.file == f).collect()));
    }
    let mut related: Vec<Report> = Vec::new();
    for (f, labels) in groups {
        let Some((source, labels)) = excerpt(sources, f, &labels) else { continue };
        related.push(Report {
            message: format!("see {}", source.name),
            code: None,
            severity: miette::Severity::Advice,
            help: None,
            source: Some(source),
            labels,
            related: Vec::new(),
        });
    }
    // Notes are facts about the error (not fixes): each is a sourceless related report; the
    // trace is the last of them.
    let trace = (!d.trace().is_empty()).then(|| trace_note(sources, d.trace()));
    for n in d.notes.iter().chain(trace.as_ref()) {
        related.push(Report {
            message: format!("note: {}", clip(n)),
            code: None,
            severity: miette::Severity::Advice,
            help: None,
            source: None,
            labels: Vec::new(),
            related: Vec::new(),
        });
    }
    let (source, labels) = match excerpt(sources, primary, &main) {
        Some((source, labels)) => (Some(source), labels),
        None => (None, Vec::new()),
    };
    Report {
        message: clip(&d.message),
        code: Some(d.code.to_string()),
        severity: match d.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        },
        help: d.help.as_deref().map(clip),
        source,
        labels,
        related,
    }
}

/// The trace as one note: the steps from the model down to the error, outermost first.
pub fn trace_note(sources: &SourceMap, trace: &[Step]) -> String {
    let mut out = String::from("how elaboration reached the error, from the model down:");
    for s in trace {
        if s.kind == StepKind::Omitted {
            out.push_str(&format!("\n… {} more steps …", thousands(s.count)));
            continue;
        }
        out.push_str(&format!("\nin {} at {}", s.describe(), place(sources, s.at)));
        if s.count > 1 {
            out.push_str(&format!(" ({} times in a row)", thousands(s.count)));
        }
    }
    out
}

/// `file:line:column` of the start of a span.
pub fn place(sources: &SourceMap, span: Span) -> String {
    let s = json_span(sources, span);
    format!("{}:{}:{}", s.file, s.line, s.column)
}

/// The human rendering, without colour (stable for golden tests); `color` adds ANSI styles.
/// Never panics: if the report cannot be drawn, the diagnostic is written plainly.
pub fn render(sources: &SourceMap, d: &Diagnostic, color: bool) -> String {
    match catch_unwind(AssertUnwindSafe(|| graphical(sources, d, color))) {
        Ok(Some(out)) => out,
        _ => plain(sources, d),
    }
}

fn graphical(sources: &SourceMap, d: &Diagnostic, color: bool) -> Option<String> {
    let theme = if color { GraphicalTheme::unicode() } else { GraphicalTheme::unicode_nocolor() };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(100)
        .with_links(false)
        .with_context_lines(CONTEXT_LINES);
    let mut out = String::new();
    handler.render_report(&mut out, &report(sources, d)).ok()?;
    Some(out)
}

/// The diagnostic without excerpts: its message, where each label is, the help and notes.
pub fn plain(sources: &SourceMap, d: &Diagnostic) -> String {
    let severity = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let mut out = format!("{severity}[{}]: {}\n", d.code, d.message);
    for l in &d.labels {
        let s = json_span(sources, l.span);
        out.push_str(&format!("  --> {}:{}:{}: {}\n", s.file, s.line, s.column, l.message));
    }
    if let Some(h) = &d.help {
        out.push_str(&format!("  help: {h}\n"));
    }
    for n in &d.notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    if !d.trace().is_empty() {
        let note = trace_note(sources, d.trace()).replace('\n', "\n    ");
        out.push_str(&format!("  note: {note}\n"));
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
    /// Where elaboration was when the error arose, outermost first; empty when it was in the
    /// model's own text.
    pub trace: Vec<JsonStep>,
    pub rendered: String,
}

#[derive(Serialize)]
pub struct JsonStep {
    pub kind: StepKind,
    /// "model `M`", "`Block`", "`Block.forward`", "`split_heads`", "const `D`".
    pub what: String,
    /// The place in it that led on: the call of the next step, or the error.
    #[serde(flatten)]
    pub span: Option<JsonSpan>,
    /// Times in a row (recursion), or the number of steps an `omitted` one stands for.
    pub count: usize,
    /// For a forward: where the layer instance was created.
    pub origin: Option<JsonSpan>,
}

/// Where a span is: its file's name, 1-based lines and byte columns, and byte offsets (clamped
/// to the file). A span in no file of the map (a bug) has an empty name and line 0.
pub fn json_span(sources: &SourceMap, span: Span) -> JsonSpan {
    let Some(f) = sources.try_get(span.file) else {
        return JsonSpan {
            file: String::new(),
            line: 0,
            column: 0,
            end_line: 0,
            end_column: 0,
            byte_start: span.start,
            byte_end: span.end,
        };
    };
    let start = (span.start as usize).min(f.text.len());
    let end = (span.end as usize).clamp(start, f.text.len());
    let (line, column) = f.lines.line_col(start);
    let (end_line, end_column) = f.lines.line_col(end);
    JsonSpan {
        file: f.name.clone(),
        line,
        column,
        end_line,
        end_column,
        byte_start: start as u32,
        byte_end: end as u32,
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
        help: d.help.as_deref().map(String::from),
        notes: d.notes.clone(),
        trace: d
            .trace()
            .iter()
            .map(|s| {
                let omitted = s.kind == StepKind::Omitted;
                JsonStep {
                    kind: s.kind,
                    what: s.describe(),
                    span: (!omitted).then(|| json_span(sources, s.at)),
                    count: s.count,
                    origin: s.origin.map(|o| json_span(sources, o)),
                }
            })
            .collect(),
        rendered: render(sources, d, false),
    };
    serde_json::to_string(&j).unwrap_or_else(|e| {
        format!("{{\"severity\":\"error\",\"message\":\"cannot serialize diagnostic: {e}\"}}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Origin;

    fn one_file(text: String) -> SourceMap {
        let mut sources = SourceMap::new();
        sources.add("long.mgn".into(), Origin::Memory("long".into()), text);
        sources
    }

    #[test]
    fn a_diagnostic_past_column_65535_renders_with_its_location() {
        let text = format!("fn f() {{ 1 }}\n{})\nfn g() {{ 2 }}\n", " ".repeat(70_000));
        let at = text.find(" )").unwrap() + 1;
        let sources = one_file(text);
        let d =
            Diagnostic::error("E0001", "unexpected `)`", Span::new(FileId(0), at, at + 1), "here");
        let out = render(&sources, &d, false);
        assert!(out.contains("[long.mgn:2:70001]"), "{out}");
        assert!(out.contains("unexpected `)`") && out.contains("here"), "{out}");
        assert!(out.lines().all(|l| l.chars().count() < 400), "long lines are elided: {out}");
        let json: serde_json::Value = serde_json::from_str(&to_json(&sources, &d)).unwrap();
        assert_eq!((json["line"].as_u64(), json["column"].as_u64()), (Some(2), Some(70_001)));
    }

    #[test]
    fn labels_anywhere_on_long_lines_in_other_files_or_none_render() {
        let long = "1 + ".repeat(20_000);
        let text = format!("let a = {long}x + y{} z\nfn g() {{\r 2 }}\n", "é".repeat(50_000));
        let (x, g) = (text.find("x + y").unwrap(), text.find("2 }").unwrap());
        let z = text.rfind(" z").unwrap() + 1;
        let mut sources = one_file(text);
        sources.add("b.mgn".into(), Origin::Memory("b".into()), format!("{long}w\n"));
        let d = Diagnostic::error("E0001", "m", Span::new(FileId(0), x, x + 1), "x here")
            .with_label(Span::new(FileId(0), z, z + 1), "z here")
            .with_label(Span::new(FileId(0), g, g + 1), "after a lone carriage return")
            .with_label(Span::new(FileId(0), x + 4, g), "across lines")
            .with_label(Span::new(FileId(1), 80_000, 80_001), "in another file")
            .with_label(Span::new(FileId(7), 3, 1), "in no file");
        let out = render(&sources, &d, false);
        assert!(out.contains("[long.mgn:1:80009]") && out.contains("[b.mgn:1:80001]"), "{out}");
        for label in ["x here", "z here", "after a lone", "across lines", "in another file"] {
            assert!(out.contains(label), "{label}: {out}");
        }
        assert!(out.contains(" 2 │ ") && !out.contains(" 3 │ "), "a lone CR breaks no line: {out}");
        assert!(out.lines().all(|l| l.chars().count() < 300), "{out}");
        let plain = plain(&sources, &d);
        assert!(plain.contains("--> long.mgn:1:180015: z here"), "{plain}");
        assert!(plain.contains("--> long.mgn:2:11: after a lone"), "{plain}");
    }

    #[test]
    fn the_header_is_the_primary_label_even_after_a_far_earlier_label() {
        let text = format!("fn a() {{ 1 }}\n{}fn b() {{ 2 }}\n", "\n".repeat(30));
        let (a, b) = (text.find('a').unwrap(), text.find('b').unwrap());
        let sources = one_file(text);
        let d = Diagnostic::error("E0106", "twice", Span::new(FileId(0), b, b + 1), "again")
            .with_label(Span::new(FileId(0), a, a + 1), "first");
        let out = render(&sources, &d, false);
        let first_header = out.lines().find(|l| l.contains("╭─[")).unwrap();
        assert!(first_header.contains("[long.mgn:32:4]"), "{out}");
        assert!(out.contains("[long.mgn:1:4]") && out.contains("first"), "{out}");
        // Labels close enough to share an excerpt stay in it.
        let near = Diagnostic::error("E0106", "twice", Span::new(FileId(0), b, b + 1), "again")
            .with_label(Span::new(FileId(0), b - 2, b - 1), "near");
        assert_eq!(render(&sources, &near, false).matches("╭─[").count(), 1);
    }

    #[test]
    fn a_byte_order_mark_is_not_shown_or_counted_as_a_column() {
        let text = "\u{feff}fn f() { x }\n".to_string();
        let x = text.find('x').unwrap();
        let sources = one_file(text);
        let d = Diagnostic::error("E0101", "m", Span::new(FileId(0), x, x + 1), "here");
        let out = render(&sources, &d, false);
        assert!(out.contains("[long.mgn:1:10]") && !out.contains('\u{feff}'), "{out}");
        let json: serde_json::Value = serde_json::from_str(&to_json(&sources, &d)).unwrap();
        assert_eq!((json["column"].as_u64(), json["byte_start"].as_u64()), (Some(10), Some(12)));
    }

    #[test]
    fn long_words_in_messages_are_shortened() {
        let name = "x".repeat(1_000_000);
        let sources = one_file("fn f() { 1 }\n".into());
        let d = Diagnostic::error(
            "E0101",
            format!("cannot find `{name}` in this scope"),
            Span::new(FileId(0), 3, 4),
            format!("`{name}`"),
        );
        let out = render(&sources, &d, false);
        assert!(out.len() < 2_000 && out.contains("…") && out.contains("in this scope"), "{out}");
        assert!(to_json(&sources, &d).contains(&name), "the JSON message is whole");
    }
}
