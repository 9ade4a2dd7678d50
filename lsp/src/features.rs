//! The language features, each answered from analyses of the open documents: names from the
//! compiler's resolution (`Analysis::names`), types and shapes from elaboration's facts.
//!
//! This file holds what several features share (positions, diagnostics, facts, signatures,
//! declarations); `hover`, `navigation` (definition, references), `completion`, `symbols`
//! (the outline), `hints` (inlay hints), `tokens` (semantic tokens) and `rename` answer one
//! request each, as does `actions` (quick fixes); `enclosing` chooses the scope completion
//! answers from while a line is half-typed, and `imports` completes what modules offer.

mod actions;
mod completion;
mod enclosing;
mod hints;
mod hover;
mod imports;
mod navigation;
mod rename;
mod symbols;
mod tokens;

pub use actions::code_actions;
pub use enclosing::complete;
pub use hints::inlay_hints;
pub use hover::hover;
pub use navigation::{definition, references};
pub use rename::{prepare_rename, rename};
pub use symbols::document_symbols;
pub use tokens::{semantic_tokens, TOKEN_MODIFIERS, TOKEN_TYPES};

use crate::analysis::Analysis;
use crate::paths::Paths;
use crate::resolve::{self, Signature};
use crate::text::LineMap;
use lsp_types as lsp;
use mgn_compiler::elab::builtins::{self, Builtin};
use mgn_compiler::elab::eval::FactKind;
use mgn_compiler::front::resolve::{
    field_layer, follow, global as resolve_global, layer_item, LayerRef,
};
use mgn_compiler::front::{ModId, Occurrence, Program, SymKind, Target, Visible};
use mgn_compiler::source::Origin;
use mgn_syntax::ast::*;
use mgn_syntax::{FileId, Span};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Everything a feature may look at: the analysis of the document asked about, every other
/// current analysis (for facts and references across files) and the URI mapping.
pub struct Ctx<'a> {
    pub paths: &'a Paths,
    pub this: &'a Arc<Analysis>,
    /// The other analyses of the current buffers.
    pub all: &'a [Arc<Analysis>],
    /// Every other analysis, also out-of-date ones: facts about a file are taken from any
    /// analysis that read the same text of it.
    pub facts_from: &'a [Arc<Analysis>],
}

pub fn range_of(a: &Analysis, span: Span) -> lsp::Range {
    let f = a.program().sources.get(span.file);
    LineMap::new(&f.text).range(span.start as usize, span.end as usize)
}

pub fn location_of(paths: &Paths, a: &Analysis, span: Span) -> Option<lsp::Location> {
    Some(lsp::Location { uri: a.uri_of(paths, span.file)?, range: range_of(a, span) })
}

fn text_of(a: &Analysis, file: FileId) -> &str {
    &a.program().sources.get(file).text
}

fn snippet(a: &Analysis, span: Span) -> &str {
    text_of(a, span.file).get(span.start as usize..span.end as usize).unwrap_or("")
}

/// A byte of a name.
fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn is_std(a: &Analysis, file: FileId) -> bool {
    matches!(a.program().sources.get(file).origin, Origin::Std(_))
}

// ---- diagnostics ------------------------------------------------------------------------

/// The analysis' diagnostics, by the URI of the file each one's primary label is in. The root
/// document is always present (possibly with none). A diagnostic whose primary label is in
/// the stdlib is shown at the nearest label in a user file instead (or at the root's start).
pub fn diagnostics(paths: &Paths, a: &Analysis) -> HashMap<lsp::Uri, Vec<lsp::Diagnostic>> {
    let mut out: HashMap<lsp::Uri, Vec<lsp::Diagnostic>> = HashMap::new();
    out.insert(a.uri.clone(), Vec::new());
    for d in &a.outcome.diagnostics {
        let primary = d.primary_span();
        let nfiles = a.program().sources.files().count();
        let (anchor, moved) = if (primary.file.0 as usize) >= nfiles {
            (Span { file: a.root_file(), start: 0, end: 0 }, true)
        } else if is_std(a, primary.file) {
            match d.labels.iter().find(|l| !is_std(a, l.span.file)) {
                Some(l) => (l.span, true),
                None => (Span { file: a.root_file(), start: 0, end: 0 }, true),
            }
        } else {
            (primary, false)
        };
        let Some(uri) = a.uri_of(paths, anchor.file) else { continue };
        let mut message = d.message.clone();
        if let Some(h) = &d.help {
            message.push_str(&format!("\nhelp: {h}"));
        }
        for n in &d.notes {
            message.push_str(&format!("\nnote: {n}"));
        }
        if !d.trace().is_empty() {
            let note = mgn_compiler::render::trace_note(&a.program().sources, d.trace());
            message.push_str(&format!("\nnote: {note}"));
        }
        let mut related = Vec::new();
        for l in &d.labels {
            if (l.span.file.0 as usize) >= nfiles || (l.primary && !moved && l.message.is_empty()) {
                continue;
            }
            if let Some(location) = location_of(paths, a, l.span) {
                related.push(lsp::DiagnosticRelatedInformation {
                    location,
                    message: if l.message.is_empty() {
                        d.message.clone()
                    } else {
                        l.message.clone()
                    },
                });
            }
        }
        // The trace's steps, outermost first: the editor lists where each one led on.
        for step in d.trace().iter().filter(|s| s.kind != mgn_syntax::StepKind::Omitted) {
            if let Some(location) = location_of(paths, a, step.at) {
                let message = format!("in {}", step.describe());
                related.push(lsp::DiagnosticRelatedInformation { location, message });
            }
        }
        out.entry(uri).or_default().push(lsp::Diagnostic {
            range: range_of(a, anchor),
            severity: Some(match d.severity {
                mgn_syntax::Severity::Error => lsp::DiagnosticSeverity::ERROR,
                mgn_syntax::Severity::Warning => lsp::DiagnosticSeverity::WARNING,
            }),
            code: Some(lsp::NumberOrString::String(d.code.to_string())),
            source: Some("mgnc".into()),
            message,
            related_information: (!related.is_empty()).then_some(related),
            ..Default::default()
        });
    }
    out
}

// ---- facts --------------------------------------------------------------------------------

pub struct FileFact {
    pub start: usize,
    pub end: usize,
    pub kind: FactKind,
    pub text: String,
}

/// Facts about one file from every analysis that read the same text of it (the file's own
/// analysis and those of open files that import it), without duplicates.
pub fn facts_for(ctx: &Ctx, origin: &Origin, text: &str) -> Vec<FileFact> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for a in std::iter::once(ctx.this).chain(ctx.all.iter()).chain(ctx.facts_from.iter()) {
        let Some(file) = a.file_of(origin) else { continue };
        if text_of(a, file) != text {
            continue;
        }
        for f in &a.outcome.facts {
            if f.span.file == file
                && seen.insert((f.span.start, f.span.end, f.kind as u8, f.text.clone()))
            {
                out.push(FileFact {
                    start: f.span.start as usize,
                    end: f.span.end as usize,
                    kind: f.kind,
                    text: f.text.clone(),
                });
            }
        }
    }
    out
}

/// The distinct fact texts at exactly one span (a layer instantiated several times has several).
fn facts_at<'f>(facts: &'f [FileFact], span: Span, kinds: &[FactKind]) -> Vec<&'f str> {
    let mut texts: Vec<&str> = Vec::new();
    for f in facts {
        if f.start == span.start as usize
            && f.end == span.end as usize
            && kinds.contains(&f.kind)
            && !texts.contains(&f.text.as_str())
        {
            texts.push(&f.text);
        }
    }
    texts
}

fn join_facts(texts: &[&str]) -> String {
    const MAX: usize = 4;
    let mut s = texts.iter().take(MAX).copied().collect::<Vec<_>>().join("\n");
    if texts.len() > MAX {
        s.push_str(&format!("\n… and {} more instantiations", texts.len() - MAX));
    }
    s
}

// ---- signatures and doc comments ----------------------------------------------------------

/// The `//` comment lines directly above byte `start` (no blank line between), without `//`.
pub fn doc_comment(text: &str, start: usize) -> Option<String> {
    let before = &text[..start.min(text.len())];
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    if !before[line_start..].trim().is_empty() {
        return None;
    }
    let mut lines = Vec::new();
    let mut rest = &before[..line_start];
    while !rest.is_empty() {
        let body = rest.strip_suffix('\n').unwrap_or(rest);
        let s = body.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let line = body[s..].trim();
        match line.strip_prefix("//") {
            Some(c) => lines.push(c.strip_prefix(' ').unwrap_or(c).to_string()),
            None => break,
        }
        rest = &body[..s];
    }
    if lines.is_empty() {
        return None;
    }
    lines.reverse();
    Some(lines.join("\n"))
}

/// An item's header as written: `layer Linear(in_features: dim, …)`, `fn f(x: …) -> …`.
pub fn item_signature(text: &str, item: &Item) -> String {
    let start = item.span().start as usize;
    let end = match item {
        Item::Fn(f) => f.body.span.start as usize,
        Item::Layer(l) => {
            let after = l.params.last().map(|p| p.span.end).unwrap_or(l.name.span.end) as usize;
            text[after..].find('{').map(|i| after + i).unwrap_or(l.name.span.end as usize)
        }
        _ => item.span().end as usize,
    };
    text.get(start..end).unwrap_or("").trim().to_string()
}

pub fn builtin_signature(b: &Builtin) -> String {
    match b.value {
        Some(ty) => format!("builtin {}: {ty}", b.name),
        None => format!("builtin {}({})", b.name, b.params.join(", ")),
    }
}

/// Source text on one line, without its comments: a completion's detail.
fn one_line(s: &str) -> String {
    let mut out = String::new();
    for part in without_comments(s).split_whitespace() {
        if !out.is_empty() && !out.ends_with('(') && !part.starts_with(')') {
            out.push(' ');
        }
        out.push_str(part);
    }
    out.replace(",)", ")")
}

/// The text with `//` and `/* */` comments left out (not those inside strings).
fn without_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("//") {
            rest = &rest[rest.find('\n').unwrap_or(rest.len())..];
        } else if let Some(body) = rest.strip_prefix("/*") {
            rest = body.find("*/").map_or("", |i| &body[i + 2..]);
            out.push(' ');
        } else if c == '"' {
            let end = rest[1..].find(['"', '\n']).map_or(rest.len(), |i| i + 2).min(rest.len());
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn code_block(s: &str) -> String {
    format!("```mgn\n{s}\n```")
}

/// Where a definition lives in the program: the item and, for members, the member.
fn item_at(prog: &Program, span: Span) -> Option<(ModId, &Item)> {
    for (i, m) in prog.modules.iter().enumerate() {
        if m.file != span.file {
            continue;
        }
        for item in &m.ast.items {
            let s = item.span();
            if s.start <= span.start && span.end <= s.end {
                return Some((ModId(i), item));
            }
        }
    }
    None
}

/// Source text describing a definition: a parameter's `name: type = default`, a field's
/// initializer, an input declaration.
fn declaration(a: &Analysis, span: Span, kind: SymKind) -> Option<String> {
    let (_, item) = item_at(a.program(), span)?;
    let params_decl = |ps: &[Param]| {
        ps.iter().find(|p| p.name.span == span).map(|p| snippet(a, p.span).to_string())
    };
    match (item, kind) {
        (Item::Layer(l), SymKind::Config) => params_decl(&l.params),
        (Item::Layer(l), SymKind::Param) => l.forward.iter().find_map(|f| params_decl(&f.params)),
        (Item::Fn(f), SymKind::Param) => params_decl(&f.params),
        (Item::Layer(l), SymKind::Field) => {
            l.fields.iter().find(|f| f.name.span == span).map(|f| snippet(a, f.span).to_string())
        }
        (Item::Layer(l), SymKind::Input) => {
            l.inputs.iter().find(|i| i.name.span == span).map(|i| snippet(a, i.span).to_string())
        }
        (_, SymKind::Dim) => Some(format!("{}: dim (bound by a shape pattern)", snippet(a, span))),
        (_, SymKind::Index) => Some(format!("{}: int (repeat index)", snippet(a, span))),
        _ => None,
    }
}

// ---- formatting --------------------------------------------------------------------------------

/// The whole-document edit that formats `text`, or `None` when it is formatted already.
pub fn formatting(text: &str) -> Result<Option<lsp::TextEdit>, String> {
    let formatted = crate::format::format_document(text)?;
    if formatted == text {
        return Ok(None);
    }
    let map = LineMap::new(text);
    Ok(Some(lsp::TextEdit { range: map.range(0, text.len()), new_text: formatted }))
}

#[cfg(test)]
mod tests;
