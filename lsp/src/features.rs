//! The language features, each answered from analyses of the open documents.

use crate::analysis::Analysis;
use crate::paths::Paths;
use crate::resolve::{self, field_layer, layer_item, Occurrence, Signature, SymKind, Target};
use crate::text::LineMap;
use lsp_types as lsp;
use mgn_compiler::elab::builtins::{self, Builtin};
use mgn_compiler::elab::eval::FactKind;
use mgn_compiler::front::{Binding, ModId, Program};
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
    format!("builtin {}({})", b.name, b.params.join(", "))
}

fn one_line(s: &str) -> String {
    let mut out = String::new();
    for part in s.split_whitespace() {
        if !out.is_empty() && !out.ends_with('(') && !part.starts_with(')') {
            out.push(' ');
        }
        out.push_str(part);
    }
    out.replace(",)", ")")
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

// ---- hover ----------------------------------------------------------------------------------

pub fn hover(ctx: &Ctx, offset: usize) -> Option<lsp::Hover> {
    let a = ctx.this;
    let file = a.root_file();
    let src = a.program().sources.get(file);
    let facts = facts_for(ctx, &src.origin, &src.text);
    let occ = a.index.at(file, offset).copied();
    let mut parts: Vec<String> = Vec::new();
    let mut range = None;
    if let Some(o) = occ {
        range = Some(o.span);
        parts.extend(describe_target(ctx, &facts, &o));
        if let Some(call) = o.call {
            let texts = facts_at(&facts, call, &[FactKind::Expr]);
            if !texts.is_empty() {
                parts.push(format!("this call gives `{}`", texts.join("` or `")));
            }
        }
    }
    if parts.is_empty() {
        // The innermost fact at the cursor: the type of the expression under it.
        let best = facts
            .iter()
            .filter(|f| f.start <= offset && offset <= f.end)
            .min_by_key(|f| (f.end - f.start, f.kind != FactKind::Expr))?;
        let span = Span { file, start: best.start as u32, end: best.end as u32 };
        let texts = facts_at(&facts, span, &[best.kind]);
        parts.push(code_block(&join_facts(&texts)));
        range = Some(span);
    }
    Some(lsp::Hover {
        contents: lsp::HoverContents::Markup(lsp::MarkupContent {
            kind: lsp::MarkupKind::Markdown,
            value: parts.join("\n\n"),
        }),
        range: range.map(|s| range_of(a, s)),
    })
}

fn describe_target(ctx: &Ctx, facts: &[FileFact], o: &Occurrence) -> Vec<String> {
    let a = ctx.this;
    match o.target {
        Target::Builtin(b) => vec![code_block(&builtin_signature(b)), b.doc.to_string()],
        Target::Module(m) => vec![code_block(&format!("module {}", a.program().module(m).name))],
        Target::Def { span, kind } => {
            // Facts live at the definition; a definition in another file has its own facts.
            let def_facts;
            let facts = if span.file == a.root_file() {
                facts
            } else {
                let f = a.program().sources.get(span.file);
                def_facts = facts_for(ctx, &f.origin, &f.text);
                &def_facts[..]
            };
            let name = snippet(a, span).to_string();
            match kind {
                SymKind::Layer | SymKind::Model | SymKind::Fn | SymKind::Const => {
                    let Some((m, item)) = item_at(a.program(), span) else { return Vec::new() };
                    let text = text_of(a, span.file);
                    let mut out = vec![code_block(&item_signature(text, item))];
                    let module = &a.program().module(m).name;
                    if is_std(a, span.file) || span.file != a.root_file() {
                        out.push(format!("*from `{module}`*"));
                    }
                    if let Some(doc) = doc_comment(text, item.span().start as usize) {
                        out.push(doc);
                    }
                    out
                }
                SymKind::Local => {
                    let texts = facts_at(facts, span, &[FactKind::Let]);
                    if texts.is_empty() {
                        vec![code_block(&format!("let {name}"))]
                    } else {
                        vec![code_block(
                            &texts
                                .iter()
                                .map(|t| format!("let {name}: {t}"))
                                .collect::<Vec<_>>()
                                .join("\n"),
                        )]
                    }
                }
                SymKind::Field => {
                    let texts = facts_at(facts, span, &[FactKind::Param, FactKind::Layer]);
                    let mut out = vec![code_block(&declaration(a, span, kind).unwrap_or(name))];
                    if !texts.is_empty() {
                        out.push(
                            join_facts(&texts)
                                .lines()
                                .map(|l| format!("- {l}"))
                                .collect::<Vec<_>>()
                                .join("\n"),
                        );
                    }
                    out
                }
                SymKind::Input => {
                    let decl = declaration(a, span, kind).unwrap_or(name);
                    let mut out = vec![code_block(&decl)];
                    if let Some((_, Item::Layer(l))) = item_at(a.program(), span) {
                        if let Some(i) = l.inputs.iter().find(|i| i.name.span == span) {
                            let texts = facts_at(facts, i.span, &[FactKind::Expr]);
                            if !texts.is_empty() {
                                out.push(format!("`{}`", texts.join("`, `")));
                            }
                        }
                    }
                    out
                }
                SymKind::Output => vec![code_block(&format!("output {name}"))],
                _ => {
                    let mut out = vec![code_block(
                        &declaration(a, span, kind)
                            .unwrap_or_else(|| format!("{name} ({})", kind.describe())),
                    )];
                    // What a parameter was bound to in the calls elaboration made.
                    let texts = facts_at(facts, span, &[FactKind::Arg]);
                    if !texts.is_empty() {
                        out.push(
                            join_facts(&texts)
                                .lines()
                                .map(|l| format!("- bound to {l}"))
                                .collect::<Vec<_>>()
                                .join("\n"),
                        );
                    }
                    out
                }
            }
        }
    }
}

// ---- definition and references --------------------------------------------------------------

pub fn definition(ctx: &Ctx, offset: usize) -> Option<lsp::Location> {
    let a = ctx.this;
    let o = a.index.at(a.root_file(), offset)?;
    match o.target {
        Target::Def { span, .. } => location_of(ctx.paths, a, span),
        Target::Module(m) => {
            let file = a.program().module(m).file;
            location_of(ctx.paths, a, Span { file, start: 0, end: 0 })
        }
        Target::Builtin(_) => None,
    }
}

/// A definition's identity across analyses: the file it is in and its span.
fn identity(a: &Analysis, t: Target) -> Option<(Origin, u32, u32)> {
    match t {
        Target::Def { span, .. } => {
            Some((a.program().sources.get(span.file).origin.clone(), span.start, span.end))
        }
        Target::Module(m) => {
            Some((a.program().sources.get(a.program().module(m).file).origin.clone(), 0, 0))
        }
        Target::Builtin(_) => None,
    }
}

pub fn references(ctx: &Ctx, offset: usize, include_declaration: bool) -> Vec<lsp::Location> {
    let a = ctx.this;
    let Some(o) = a.index.at(a.root_file(), offset) else { return Vec::new() };
    let builtin = match o.target {
        Target::Builtin(b) => Some(b.name),
        _ => None,
    };
    let id = identity(a, o.target);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for b in std::iter::once(ctx.this).chain(ctx.all.iter()) {
        for occ in &b.index.occurrences {
            let same = match (occ.target, builtin) {
                (Target::Builtin(x), Some(name)) => x.name == name,
                (_, Some(_)) => false,
                (t, None) => id.is_some() && identity(b, t) == id,
            };
            if !same || (occ.def && !include_declaration) {
                continue;
            }
            if let Some(loc) = location_of(ctx.paths, b, occ.span) {
                if seen.insert((loc.uri.clone(), loc.range.start, loc.range.end)) {
                    out.push(loc);
                }
            }
        }
    }
    out.sort_by(|x, y| {
        (x.uri.as_str(), x.range.start.line, x.range.start.character).cmp(&(
            y.uri.as_str(),
            y.range.start.line,
            y.range.start.character,
        ))
    });
    out
}

// ---- completion ------------------------------------------------------------------------------

const KEYWORDS: &[&str] = &[
    "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
    "false", "self", "as", "input", "output", "loss", "param", "buffer", "init", "f32", "f16",
    "bf16", "i32", "i64", "u32", "bool", "dim", "int", "float", "dtype",
];

/// The item being edited, from the current text or, when it does not parse right now, from
/// the latest analysis in which it did.
pub struct Enclosing<'a> {
    pub analysis: &'a Analysis,
    pub module: ModId,
    pub item: Option<&'a Item>,
    /// True when `item` comes from the current text (so scopes can use the cursor position).
    pub current: bool,
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `self.model.layer[0]` before a `.` or `(` at `end`: the names of the chain, indexes dropped.
fn chain_before(text: &str, end: usize) -> Vec<String> {
    let b = text.as_bytes();
    let mut i = end;
    let mut parts = Vec::new();
    loop {
        while i > 0 && b[i - 1] == b' ' {
            i -= 1;
        }
        // Skip `[...]` index groups.
        while i > 0 && b[i - 1] == b']' {
            let mut depth = 0;
            while i > 0 {
                i -= 1;
                match b[i] {
                    b']' => depth += 1,
                    b'[' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
        let e = i;
        while i > 0 && ident_char(b[i - 1]) {
            i -= 1;
        }
        if i == e {
            break;
        }
        parts.push(text[i..e].to_string());
        if i > 0 && b[i - 1] == b'.' {
            i -= 1;
        } else {
            break;
        }
    }
    parts.reverse();
    parts
}

/// The callee chain of the call whose argument list the cursor is in, how many positional
/// arguments come before the cursor, and the named arguments already written there.
fn enclosing_call(text: &str, at: usize) -> Option<(Vec<String>, usize, Vec<String>)> {
    let b = text.as_bytes();
    let mut depth = 0i32;
    let mut i = at;
    let limit = at.saturating_sub(4000);
    while i > limit {
        i -= 1;
        match b[i] {
            b')' | b']' | b'}' => depth += 1,
            b'[' | b'{' if depth == 0 => return None,
            b'(' if depth == 0 => {
                let callee = chain_before(text, i);
                if callee.is_empty() {
                    return None;
                }
                // Split the arguments at top-level commas; the last piece is being typed.
                let mut pieces = Vec::new();
                let (mut d, mut from) = (0i32, i + 1);
                for (j, &c) in b.iter().enumerate().take(at).skip(i + 1) {
                    match c {
                        b'(' | b'[' | b'{' => d += 1,
                        b')' | b']' | b'}' => d -= 1,
                        b',' if d == 0 => {
                            pieces.push(&text[from..j]);
                            from = j + 1;
                        }
                        _ => {}
                    }
                }
                let mut positional = 0;
                let mut named = Vec::new();
                for p in pieces {
                    let name = p.split_once('=').map(|(n, r)| (n.trim(), r)).filter(|(n, r)| {
                        !n.is_empty() && n.bytes().all(ident_char) && !r.starts_with('=')
                    });
                    match name {
                        Some((n, _)) => named.push(n.to_string()),
                        None => positional += 1,
                    }
                }
                return Some((callee, positional, named));
            }
            b'(' | b'[' | b'{' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn item_kind(item: &Item) -> (lsp::CompletionItemKind, &'static str) {
    match item {
        Item::Layer(l) if l.kind == LayerKind::Model => (lsp::CompletionItemKind::MODULE, "model"),
        Item::Layer(_) => (lsp::CompletionItemKind::CLASS, "layer"),
        Item::Fn(_) => (lsp::CompletionItemKind::FUNCTION, "fn"),
        Item::Const(_) => (lsp::CompletionItemKind::CONSTANT, "const"),
        Item::Use(_) => (lsp::CompletionItemKind::MODULE, "use"),
    }
}

fn item_completion(
    prog: &Program,
    label: &str,
    module: ModId,
    index: usize,
) -> lsp::CompletionItem {
    let item = prog.item(module, index);
    let text = &prog.sources.get(prog.module(module).file).text;
    let (kind, _) = item_kind(item);
    lsp::CompletionItem {
        label: label.to_string(),
        kind: Some(kind),
        detail: Some(one_line(&item_signature(text, item))),
        documentation: doc_comment(text, item.span().start as usize)
            .map(lsp::Documentation::String),
        ..Default::default()
    }
}

fn builtin_completion(b: &Builtin) -> lsp::CompletionItem {
    lsp::CompletionItem {
        label: b.name.to_string(),
        kind: Some(lsp::CompletionItemKind::FUNCTION),
        detail: Some(builtin_signature(b)),
        documentation: Some(lsp::Documentation::String(b.doc.to_string())),
        ..Default::default()
    }
}

fn field_completions(prog: &Program, l: &LayerItem) -> Vec<lsp::CompletionItem> {
    let text = |f: &FieldDef| {
        for m in &prog.modules {
            if m.ast.items.iter().any(|i| matches!(i, Item::Layer(x) if std::ptr::eq(x, l))) {
                return prog
                    .sources
                    .get(m.file)
                    .text
                    .get(f.span.start as usize..f.span.end as usize)
                    .map(one_line);
            }
        }
        None
    };
    l.fields
        .iter()
        .map(|f| lsp::CompletionItem {
            label: f.name.name.clone(),
            kind: Some(lsp::CompletionItemKind::FIELD),
            detail: text(f),
            ..Default::default()
        })
        .collect()
}

fn module_items(prog: &Program, m: ModId) -> Vec<lsp::CompletionItem> {
    prog.module(m)
        .ast
        .items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| Some(item_completion(prog, &item.name()?.name, m, i)))
        .collect()
}

pub fn completion(enc: &Enclosing, text: &str, offset: usize) -> Vec<lsp::CompletionItem> {
    let a = enc.analysis;
    let prog = a.program();
    let b = text.as_bytes();
    let mut start = offset.min(b.len());
    while start > 0 && ident_char(b[start - 1]) {
        start -= 1;
    }
    let layer = match enc.item {
        Some(Item::Layer(l)) => Some(l),
        _ => None,
    };
    // A bare name that is a layer-valued field of the enclosing layer.
    let local_layer = |name: &str| -> Option<resolve::LayerRef> {
        let l = layer?;
        if l.params.iter().any(|p| p.name.name == name) {
            return None;
        }
        field_layer(prog, enc.module, l.fields.iter().find(|f| f.name.name == name)?)
    };

    // `receiver.|`: fields of a layer, items of a module.
    if start > 0 && b[start - 1] == b'.' {
        let chain = chain_before(text, start - 1);
        let Some((first, rest)) = chain.split_first() else { return Vec::new() };
        if first == "self" {
            let Some(l) = layer else { return Vec::new() };
            if rest.is_empty() {
                return field_completions(prog, l);
            }
            let field = l.fields.iter().find(|f| f.name.name == rest[0]);
            let target = field
                .and_then(|f| field_layer(prog, enc.module, f))
                .and_then(|r| resolve::follow(prog, r, &rest[1..]));
            return target
                .and_then(|r| layer_item(prog, r))
                .map(|l| field_completions(prog, l))
                .unwrap_or_default();
        }
        if let Some(r) = local_layer(first) {
            return resolve::follow(prog, r, rest)
                .and_then(|r| layer_item(prog, r))
                .map(|l| field_completions(prog, l))
                .unwrap_or_default();
        }
        return match prog.module(enc.module).scope.get(first.as_str()) {
            Some(Binding::Module { module, .. }) if rest.is_empty() => module_items(prog, *module),
            _ => Vec::new(),
        };
    }

    let mut out = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    // Named arguments of the call the cursor is in, first.
    let before = text[..start].trim_end();
    if before.ends_with('(') || before.ends_with(',') {
        if let Some((callee, positional, given)) = enclosing_call(text, start) {
            let sig = resolve::signature_at(prog, enc.module, layer, &callee, local_layer);
            let params: Vec<(String, String)> = match sig {
                Some(Signature::Params(ps, _)) => ps
                    .iter()
                    .map(|p| {
                        (
                            p.name.name.clone(),
                            one_line(
                                prog.sources
                                    .get(p.span.file)
                                    .text
                                    .get(p.span.start as usize..p.span.end as usize)
                                    .unwrap_or(""),
                            ),
                        )
                    })
                    .collect(),
                Some(Signature::Builtin(bi)) => bi
                    .params
                    .iter()
                    .map(|p| {
                        (
                            p.trim_end_matches('?').to_string(),
                            format!("{p} (argument of `{}`)", bi.name),
                        )
                    })
                    .collect(),
                None => Vec::new(),
            };
            for (i, (name, detail)) in params.into_iter().enumerate() {
                if i < positional || given.contains(&name) {
                    continue;
                }
                out.push(lsp::CompletionItem {
                    label: name.clone(),
                    kind: Some(lsp::CompletionItemKind::PROPERTY),
                    detail: Some(detail),
                    insert_text: Some(format!("{name} = ")),
                    sort_text: Some(format!("0{i:03}")),
                    label_details: Some(lsp::CompletionItemLabelDetails {
                        detail: Some(" =".into()),
                        description: Some("named argument".into()),
                    }),
                    ..Default::default()
                });
            }
        }
    }

    // Names in scope: locals, parameters, the layer's config and fields (innermost first).
    let item_span = enc.item.map(|i| i.span());
    let mut visible: Vec<&resolve::Visible> = a
        .index
        .visible
        .iter()
        .filter(|v| {
            let Some(is) = item_span else { return false };
            if v.scope == Span::default()
                || v.scope.file != is.file
                || v.scope.start < is.start
                || v.scope.end > is.end
            {
                return false;
            }
            !enc.current
                || (v.scope.contains(offset)
                    && (v.kind != SymKind::Local || (v.def.end as usize) <= offset))
        })
        .collect();
    visible.sort_by_key(|v| v.scope.len());
    for v in visible {
        if !seen.insert(v.name.clone()) {
            continue;
        }
        let kind = match v.kind {
            SymKind::Field => lsp::CompletionItemKind::FIELD,
            SymKind::Dim => lsp::CompletionItemKind::TYPE_PARAMETER,
            _ => lsp::CompletionItemKind::VARIABLE,
        };
        let detail = declaration(a, v.def, v.kind)
            .map(|d| one_line(&d))
            .unwrap_or_else(|| v.kind.describe().to_string());
        out.push(lsp::CompletionItem {
            label: v.name.clone(),
            kind: Some(kind),
            detail: Some(detail),
            sort_text: Some(format!("1{}", v.name)),
            ..Default::default()
        });
    }
    // The module's items and imports.
    let mut scope: Vec<(&String, &Binding)> = prog.module(enc.module).scope.iter().collect();
    scope.sort_by(|x, y| x.0.cmp(y.0));
    for (name, binding) in scope {
        if !seen.insert(name.clone()) {
            continue;
        }
        let mut item = match binding {
            Binding::Item { module, index, .. } => item_completion(prog, name, *module, *index),
            Binding::Module { module, .. } => lsp::CompletionItem {
                label: name.clone(),
                kind: Some(lsp::CompletionItemKind::MODULE),
                detail: Some(format!("module {}", prog.module(*module).name)),
                ..Default::default()
            },
        };
        item.sort_text = Some(format!("2{name}"));
        out.push(item);
    }
    for bi in builtins::all() {
        if seen.insert(bi.name.to_string()) {
            let mut item = builtin_completion(bi);
            item.sort_text = Some(format!("3{}", bi.name));
            out.push(item);
        }
    }
    for k in KEYWORDS {
        if seen.insert(k.to_string()) {
            out.push(lsp::CompletionItem {
                label: k.to_string(),
                kind: Some(lsp::CompletionItemKind::KEYWORD),
                sort_text: Some(format!("4{k}")),
                ..Default::default()
            });
        }
    }
    out
}

// ---- document symbols ------------------------------------------------------------------------

#[allow(deprecated)]
fn symbol(
    a: &Analysis,
    name: &Ident,
    span: Span,
    kind: lsp::SymbolKind,
    detail: Option<String>,
    children: Vec<lsp::DocumentSymbol>,
) -> lsp::DocumentSymbol {
    let span =
        if span.start <= name.span.start && name.span.end <= span.end { span } else { name.span };
    lsp::DocumentSymbol {
        name: name.name.clone(),
        detail,
        kind,
        tags: None,
        deprecated: None,
        range: range_of(a, span),
        selection_range: range_of(a, name.span),
        children: (!children.is_empty()).then_some(children),
    }
}

pub fn document_symbols(a: &Analysis) -> Vec<lsp::DocumentSymbol> {
    let root = a.program().module(a.program().root);
    let params = |ps: &[Param], kind: lsp::SymbolKind| -> Vec<lsp::DocumentSymbol> {
        ps.iter()
            .map(|p| {
                symbol(
                    a,
                    &p.name,
                    p.span,
                    kind,
                    Some(one_line(snippet(a, p.ty.span()))),
                    Vec::new(),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for item in &root.ast.items {
        match item {
            Item::Use(_) => {}
            Item::Const(c) => out.push(symbol(
                a,
                &c.name,
                c.span,
                lsp::SymbolKind::CONSTANT,
                Some(one_line(snippet(a, c.value.span))),
                Vec::new(),
            )),
            Item::Fn(f) => {
                let detail = one_line(&item_signature(text_of(a, f.span.file), item));
                out.push(symbol(
                    a,
                    &f.name,
                    f.span,
                    lsp::SymbolKind::FUNCTION,
                    Some(detail),
                    params(&f.params, lsp::SymbolKind::VARIABLE),
                ));
            }
            Item::Layer(l) => {
                let mut children = params(&l.params, lsp::SymbolKind::TYPE_PARAMETER);
                for i in &l.inputs {
                    children.push(symbol(
                        a,
                        &i.name,
                        i.span,
                        lsp::SymbolKind::VARIABLE,
                        Some(format!("input {}", one_line(snippet(a, i.ty.span)))),
                        Vec::new(),
                    ));
                }
                for f in &l.fields {
                    let detail = one_line(snippet(a, f.span));
                    let detail =
                        detail.split_once('=').map(|(_, r)| r.trim().to_string()).unwrap_or(detail);
                    children.push(symbol(
                        a,
                        &f.name,
                        f.span,
                        lsp::SymbolKind::FIELD,
                        Some(detail),
                        Vec::new(),
                    ));
                }
                for fwd in &l.forward {
                    let name = Ident {
                        name: "forward".into(),
                        span: Span {
                            file: fwd.span.file,
                            start: fwd.span.start,
                            end: fwd.span.start + 7,
                        },
                    };
                    children.push(symbol(
                        a,
                        &name,
                        fwd.span,
                        lsp::SymbolKind::METHOD,
                        None,
                        params(&fwd.params, lsp::SymbolKind::VARIABLE),
                    ));
                }
                let (kind, detail) = if l.kind == LayerKind::Model {
                    (lsp::SymbolKind::MODULE, "model")
                } else {
                    (lsp::SymbolKind::CLASS, "layer")
                };
                out.push(symbol(a, &l.name, l.span, kind, Some(detail.into()), children));
            }
        }
    }
    out
}

// ---- inlay hints -------------------------------------------------------------------------------

pub fn inlay_hints(ctx: &Ctx, range: lsp::Range) -> Vec<lsp::InlayHint> {
    let a = ctx.this;
    let file = a.root_file();
    let src = a.program().sources.get(file);
    let map = LineMap::new(&src.text);
    let (lo, hi) = (map.offset(range.start), map.offset(range.end));
    let facts = facts_for(ctx, &src.origin, &src.text);
    let mut spans: Vec<(usize, usize)> = facts
        .iter()
        .filter(|f| f.kind == FactKind::Let && f.end >= lo && f.start <= hi)
        .map(|f| (f.start, f.end))
        .collect();
    spans.sort();
    spans.dedup();
    spans
        .into_iter()
        .map(|(s, e)| {
            let texts =
                facts_at(&facts, Span { file, start: s as u32, end: e as u32 }, &[FactKind::Let]);
            let mut label = texts.iter().take(3).copied().collect::<Vec<_>>().join(" | ");
            if texts.len() > 3 {
                label.push_str(" | …");
            }
            lsp::InlayHint {
                position: map.position(e),
                label: lsp::InlayHintLabel::String(format!(": {label}")),
                kind: Some(lsp::InlayHintKind::TYPE),
                text_edits: None,
                tooltip: (texts.len() > 1).then(|| {
                    lsp::InlayHintTooltip::String(format!(
                        "{} instantiations:\n{}",
                        texts.len(),
                        texts.join("\n")
                    ))
                }),
                padding_left: Some(false),
                padding_right: Some(false),
                data: None,
            }
        })
        .collect()
}

// ---- semantic tokens -------------------------------------------------------------------------

pub const TOKEN_TYPES: &[lsp::SemanticTokenType] = &[
    lsp::SemanticTokenType::NAMESPACE,
    lsp::SemanticTokenType::TYPE,
    lsp::SemanticTokenType::CLASS,
    lsp::SemanticTokenType::FUNCTION,
    lsp::SemanticTokenType::PARAMETER,
    lsp::SemanticTokenType::VARIABLE,
    lsp::SemanticTokenType::PROPERTY,
    lsp::SemanticTokenType::KEYWORD,
    lsp::SemanticTokenType::NUMBER,
    lsp::SemanticTokenType::COMMENT,
    lsp::SemanticTokenType::STRING,
    lsp::SemanticTokenType::TYPE_PARAMETER,
];
pub const TOKEN_MODIFIERS: &[lsp::SemanticTokenModifier] = &[
    lsp::SemanticTokenModifier::DECLARATION,
    lsp::SemanticTokenModifier::READONLY,
    lsp::SemanticTokenModifier::DEFAULT_LIBRARY,
];

const T_NAMESPACE: u32 = 0;
const T_TYPE: u32 = 1;
const T_CLASS: u32 = 2;
const T_FUNCTION: u32 = 3;
const T_PARAMETER: u32 = 4;
const T_VARIABLE: u32 = 5;
const T_PROPERTY: u32 = 6;
const T_KEYWORD: u32 = 7;
const T_NUMBER: u32 = 8;
const T_COMMENT: u32 = 9;
const T_STRING: u32 = 10;
const T_TYPE_PARAMETER: u32 = 11;
const M_DECLARATION: u32 = 1;
const M_READONLY: u32 = 2;
const M_DEFAULT_LIBRARY: u32 = 4;

const RESERVED: &[&str] = &[
    "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
    "false", "self", "as",
];
const CONTEXTUAL: &[&str] = &["input", "output", "loss", "param", "buffer", "init"];
const TYPES: &[&str] =
    &["f32", "f16", "bf16", "i32", "i64", "u32", "bool", "dim", "int", "float", "dtype", "init"];

pub fn semantic_tokens(a: &Analysis) -> Vec<lsp::SemanticToken> {
    let file = a.root_file();
    let text = text_of(a, file);
    let map = LineMap::new(text);
    let mut by_start: HashMap<u32, &Occurrence> = HashMap::new();
    for o in &a.index.occurrences {
        if o.span.file == file {
            by_start.entry(o.span.start).or_insert(o);
        }
    }
    let mut toks: Vec<(usize, usize, u32, u32)> = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if b[i..].starts_with(b"//") {
            let e = text[i..].find('\n').map(|n| i + n).unwrap_or(b.len());
            toks.push((i, e, T_COMMENT, 0));
            i = e;
        } else if b[i..].starts_with(b"/*") {
            let e = text[i + 2..].find("*/").map(|n| i + n + 4).unwrap_or(b.len());
            toks.push((i, e, T_COMMENT, 0));
            i = e;
        } else if c == b'"' {
            let e =
                text[i + 1..].find(['"', '\n']).map(|n| i + n + 2).unwrap_or(b.len()).min(b.len());
            toks.push((i, e, T_STRING, 0));
            i = e;
        } else if c.is_ascii_digit() {
            let mut e = i;
            while e < b.len()
                && (b[e].is_ascii_alphanumeric()
                    || b[e] == b'_'
                    || (b[e] == b'.'
                        && b.get(e + 1).is_some_and(u8::is_ascii_digit)
                        && b[i..e].iter().all(u8::is_ascii_digit))
                    || ((b[e] == b'-' || b[e] == b'+') && matches!(b[e - 1], b'e' | b'E')))
            {
                e += 1;
            }
            toks.push((i, e, T_NUMBER, 0));
            i = e;
        } else if ident_char(c) {
            let mut e = i;
            while e < b.len() && ident_char(b[e]) {
                e += 1;
            }
            let word = &text[i..e];
            let after_dot = i > 0 && b[i - 1] == b'.';
            let tok = match by_start.get(&(i as u32)) {
                Some(o) => {
                    let decl = if o.def { M_DECLARATION } else { 0 };
                    Some(match o.target {
                        Target::Builtin(_) => (T_FUNCTION, M_DEFAULT_LIBRARY),
                        Target::Module(_) => (T_NAMESPACE, 0),
                        Target::Def { kind, .. } => match kind {
                            SymKind::Local | SymKind::Index | SymKind::Output => (T_VARIABLE, decl),
                            SymKind::Input => (T_VARIABLE, decl | M_READONLY),
                            SymKind::Param => (T_PARAMETER, decl),
                            SymKind::Config => (T_PARAMETER, decl | M_READONLY),
                            SymKind::Field => (T_PROPERTY, decl),
                            SymKind::Dim => (T_TYPE_PARAMETER, decl),
                            SymKind::Layer | SymKind::Model => (T_CLASS, decl),
                            SymKind::Fn => (T_FUNCTION, decl),
                            SymKind::Const => (T_VARIABLE, decl | M_READONLY),
                        },
                    })
                }
                None if after_dot => None,
                None if RESERVED.contains(&word) => Some((T_KEYWORD, 0)),
                None if TYPES.contains(&word) => Some((T_TYPE, 0)),
                None if CONTEXTUAL.contains(&word) => Some((T_KEYWORD, 0)),
                None if word == "std" => Some((T_NAMESPACE, 0)),
                None => None,
            };
            if let Some((t, m)) = tok {
                toks.push((i, e, t, m));
            }
            i = e;
        } else {
            i += 1;
        }
    }
    // Relative encoding, one token per line (block comments are split at newlines).
    let mut out = Vec::new();
    let (mut last_line, mut last_col) = (0u32, 0u32);
    for (s, e, t, m) in toks {
        let mut s = s;
        while s < e {
            let line_end = text[s..e].find('\n').map(|n| s + n).unwrap_or(e);
            if line_end > s {
                let p = map.position(s);
                let len = text[s..line_end].encode_utf16().count() as u32;
                let delta_line = p.line - last_line;
                let delta_start =
                    if delta_line == 0 { p.character - last_col } else { p.character };
                out.push(lsp::SemanticToken {
                    delta_line,
                    delta_start,
                    length: len,
                    token_type: t,
                    token_modifiers_bitset: m,
                });
                last_line = p.line;
                last_col = p.character;
            }
            s = line_end + 1;
        }
    }
    out
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
mod tests {
    use super::*;
    use crate::analysis::{Doc, Snapshot};
    use lsp_types::Uri;
    use std::str::FromStr;

    fn analyse(text: &str) -> Arc<Analysis> {
        let uri = Uri::from_str("untitled:test.mgn").unwrap();
        let mut docs = HashMap::new();
        docs.insert(
            uri.clone(),
            Doc {
                text: text.to_string(),
                version: 1,
                origin: Origin::Memory(uri.as_str().to_string()),
            },
        );
        Arc::new(Analysis::run(Snapshot::new(&docs, &uri).unwrap()))
    }

    /// Every feature at a few offsets of a text: none may panic.
    fn exercise(paths: &Paths, text: &str) {
        let a = analyse(text);
        let ctx = Ctx { paths, this: &a, all: &[], facts_from: &[] };
        let _ = diagnostics(paths, &a);
        let _ = document_symbols(&a);
        let _ = semantic_tokens(&a);
        let whole = lsp::Range {
            start: lsp::Position { line: 0, character: 0 },
            end: lsp::Position { line: 9999, character: 0 },
        };
        let _ = inlay_hints(&ctx, whole);
        let n = text.len();
        for off in [0, n / 3, n / 2, n.saturating_sub(1), n, n + 5] {
            let _ = hover(&ctx, off);
            let _ = definition(&ctx, off);
            let _ = references(&ctx, off, true);
            let item = a
                .program()
                .module(a.program().root)
                .ast
                .items
                .iter()
                .find(|i| i.span().contains(off));
            let enc = Enclosing { analysis: &a, module: a.program().root, item, current: true };
            let _ = completion(&enc, text, off.min(n));
        }
    }

    #[test]
    fn half_typed_files_never_panic() {
        let paths = Paths::without_stdlib();
        let model = include_str!("../../models/tiny_gpt.mgn");
        let mut cut = 0;
        while cut < model.len() {
            if model.is_char_boundary(cut) {
                // The file typed up to here, and the file with a few characters missing here.
                exercise(&paths, &model[..cut]);
                let resume = (cut + 4..model.len())
                    .find(|i| model.is_char_boundary(*i))
                    .unwrap_or(model.len());
                exercise(&paths, &format!("{}{}", &model[..cut], &model[resume..]));
            }
            cut += 29;
        }
    }

    #[test]
    fn doc_comments_and_signatures() {
        let text = "// not this one\n\n// Doubles.\n// Twice.\nfn twice(x: f32[N]) -> f32[N] { x * 2 }\nlayer L(a: dim, b: dim = 2) { forward(x: f32[a]) -> f32[a] { x } }\n";
        let fn_start = text.find("fn twice").unwrap();
        assert_eq!(doc_comment(text, fn_start).as_deref(), Some("Doubles.\nTwice."));
        assert_eq!(doc_comment(text, text.find("layer").unwrap()), None);
        let a = analyse(text);
        let items = &a.program().module(a.program().root).ast.items;
        assert_eq!(item_signature(text, &items[0]), "fn twice(x: f32[N]) -> f32[N]");
        assert_eq!(item_signature(text, &items[1]), "layer L(a: dim, b: dim = 2)");
    }

    #[test]
    fn semantic_tokens_classify_names() {
        let text = "use std.nn.{Linear}\n// c\nlayer A(d: dim) {\n    fc = Linear(d, 2)\n    forward(x: f32[B, d]) -> f32[B, 2] { relu(fc(x)) }\n}\n";
        let a = analyse(text);
        let toks = semantic_tokens(&a);
        // Decode to (line, col, len, type).
        let (mut line, mut col) = (0, 0);
        let mut decoded = Vec::new();
        for t in toks {
            if t.delta_line > 0 {
                line += t.delta_line;
                col = t.delta_start;
            } else {
                col += t.delta_start;
            }
            decoded.push((line, col, t.length, t.token_type, t.token_modifiers_bitset));
        }
        let find =
            |l: u32, c: u32| decoded.iter().find(|t| t.0 == l && t.1 == c).map(|t| (t.3, t.4));
        assert_eq!(find(0, 0), Some((T_KEYWORD, 0)), "use");
        assert_eq!(find(0, 12), Some((T_CLASS, 0)), "Linear");
        assert_eq!(find(1, 0), Some((T_COMMENT, 0)));
        assert_eq!(find(2, 6), Some((T_CLASS, M_DECLARATION)), "A");
        assert_eq!(find(2, 8), Some((T_PARAMETER, M_DECLARATION | M_READONLY)), "d");
        assert_eq!(find(2, 11), Some((T_TYPE, 0)), "dim");
        assert_eq!(find(3, 4), Some((T_PROPERTY, M_DECLARATION)), "fc");
        assert_eq!(find(3, 19), Some((T_NUMBER, 0)), "2");
        assert_eq!(find(4, 15), Some((T_TYPE, 0)), "f32");
        assert_eq!(find(4, 19), Some((T_TYPE_PARAMETER, M_DECLARATION)), "B");
        assert_eq!(find(4, 41), Some((T_FUNCTION, M_DEFAULT_LIBRARY)), "relu");
        assert_eq!(find(4, 46), Some((T_PROPERTY, 0)), "fc");
    }

    fn complete_at(text: &str, needle: &str, delta: usize) -> Vec<String> {
        let a = analyse(text);
        let off = text.find(needle).unwrap() + delta;
        let item =
            a.program().module(a.program().root).ast.items.iter().find(|i| i.span().contains(off));
        let enc = Enclosing { analysis: &a, module: a.program().root, item, current: true };
        completion(&enc, text, off).into_iter().map(|c| c.label).collect()
    }

    #[test]
    fn member_completion() {
        let text = "use std.nn\nlayer B(d: dim) {\n    inner = nn.Linear(d, d)\n    forward(x: f32[d]) -> f32[d] { x }\n}\nmodel M {\n    input x: f32[4]\n    blocks = repeat(2) B(4)\n    forward {\n        output y = blocks[0].inner(x) + self.blocks(x)\n    }\n}\n";
        let items = complete_at(text, "nn.Linear", 3);
        assert!(
            items.contains(&"Linear".to_string()) && items.contains(&"Conv2d".to_string()),
            "{items:?}"
        );
        assert_eq!(
            complete_at(text, "inner(x)", 0),
            ["inner"],
            "fields of a repeated layer's element"
        );
        assert_eq!(complete_at(text, "blocks(x)", 0), ["blocks"], "fields after self.");
        let items = complete_at(text, "d, d)", 0);
        assert!(
            items.contains(&"d".to_string()) && items.contains(&"relu".to_string()),
            "{items:?}"
        );
    }

    #[test]
    fn the_name_starting_at_the_cursor_wins() {
        let text = "fn f(x: int, yy: int) -> int { x+yy }";
        let a = analyse(text);
        let paths = Paths::without_stdlib();
        let ctx = Ctx { paths: &paths, this: &a, all: &[], facts_from: &[] };
        let at = |off: usize| definition(&ctx, off).map(|l| l.range.start.character);
        let use_y = text.find("x+yy").unwrap() + 2;
        assert_eq!(at(use_y), Some(13), "`|yy` after `x`: yy");
        assert_eq!(at(use_y - 1), Some(5), "`x|+`: x");
        assert_eq!(at(use_y + 2), Some(13), "`yy|`: yy");
    }
}

#[cfg(test)]
mod arg_hover_tests {
    use super::*;
    use crate::analysis::{Doc, Snapshot};
    use crate::paths::Paths;
    use lsp_types::Uri;
    use std::str::FromStr;

    fn analyse(text: &str) -> Arc<Analysis> {
        let uri = Uri::from_str("untitled:test.mgn").unwrap();
        let mut docs = HashMap::new();
        docs.insert(
            uri.clone(),
            Doc {
                text: text.to_string(),
                version: 1,
                origin: Origin::Memory(uri.as_str().to_string()),
            },
        );
        Arc::new(Analysis::run(Snapshot::new(&docs, &uri).unwrap()))
    }

    #[test]
    fn hover_on_a_forward_parameter_shows_what_it_was_bound_to() {
        let text = "layer L(d: dim) {\n    forward(x: f32[B, d]) -> f32[B, d] { relu(x) }\n}\nmodel M {\n    input t: f32[3, 5]\n    l = L(5)\n    forward {\n        output y = l(t)\n    }\n}\n";
        let paths = Paths::without_stdlib();
        let a = analyse(text);
        let ctx = Ctx { paths: &paths, this: &a, all: &[], facts_from: &[] };
        let off = text.find("relu(x)").unwrap() + 5;
        let h = hover(&ctx, off).expect("a hover");
        let lsp::HoverContents::Markup(m) = h.contents else { panic!("markup hover") };
        assert!(m.value.contains("bound to f32[3, 5]"), "{}", m.value);
    }
}
