//! The canonical layout of `.mgn` source (`mgnc fmt`, and formatting in the language server).
//!
//! Everything is printed from the AST in one layout: 4-space indentation, one item, member or
//! statement per line, one blank line between items (runs of `use` or `const` lines keep the
//! grouping they were written with), `use` items first, spaces around binary operators and
//! after commas. What does not fit in `MAX_WIDTH` columns is broken: a parameter list into one
//! parameter per line; an argument list, list or tuple onto one line of its own, or else one
//! element per line; an operator chain before each operator; an `if` over several lines; a
//! field's `init` and `if` clauses onto continuation lines. Parentheses the user wrote around
//! an operator are kept (the AST drops them: a node's span still covers them); others are
//! added only where precedence needs them.
//!
//! The AST has no comments, so they are collected from the text and attached to the item,
//! member, statement or parameter that follows them (own-line comments) or that ends on their
//! line (trailing comments, aligned across neighbouring lines). Where a comment sits inside
//! something the printer cannot place it in (an expression, a `use` list, a header), that
//! statement, member or header is copied from the source as written, only re-indented.
//!
//! The printer never decides on its own what is safe: the result is parsed again and its AST
//! compared with the input's (spans ignored), and so are the comments of both. If either
//! differs, the file is refused with an internal-error diagnostic rather than rewritten.

mod exprs;
mod items;
mod source;

use crate::ast::*;
use crate::diag::Diagnostic;
use crate::parser::parse;
use crate::span::{FileId, Span};
use crate::visit::mutable::VisitMut;

/// A header whose parameters do not fit in this many columns gets one parameter per line; a
/// field longer than this has its `init` and `if` clauses moved to continuation lines.
pub const MAX_WIDTH: usize = 100;
const INDENT: usize = 4;
/// Spaces before a trailing comment (at least; comments of neighbouring lines are aligned).
const COMMENT_GAP: usize = 2;

/// Formats one file. A file with syntax errors is not formatted: its diagnostics come back.
pub fn format(text: &str) -> Result<String, Vec<Diagnostic>> {
    // A byte-order mark stays where it is, in front of the formatted text.
    if let Some(rest) = text.strip_prefix(crate::parser::BOM) {
        let shift = crate::parser::BOM.len_utf8() as u32;
        return match format(rest) {
            Ok(out) => Ok(format!("{}{out}", crate::parser::BOM)),
            Err(mut diags) => {
                for l in diags.iter_mut().flat_map(|d| d.labels.iter_mut()) {
                    l.span.start += shift;
                    l.span.end += shift;
                }
                Err(diags)
            }
        };
    }
    let (file, diags) = parse(FileId(0), text);
    if !diags.is_empty() {
        return Err(diags);
    }
    let f = Fmt { text, cs: comments(text), flat: Default::default() };
    let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.file(&file))) {
        Ok(out) => out,
        Err(_) => return Err(vec![internal("the formatter failed on this file", Span::default())]),
    };
    verify(text, &file, &out).map_err(|d| vec![d])?;
    Ok(out)
}

/// A comment in the source: `start..end` are byte offsets, `end` exclusive. A line comment ends
/// before the newline and before any trailing whitespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comment {
    pub start: usize,
    pub end: usize,
    pub block: bool,
}

/// Every comment in `text`, in order, skipping `//` and `/*` inside strings.
pub fn comments(text: &str) -> Vec<Comment> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                    i += 1;
                }
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let start = i;
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                let end = start + text[start..i].trim_end().len();
                out.push(Comment { start, end, block: false });
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let start = i;
                i = text[i + 2..].find("*/").map(|k| i + 2 + k + 2).unwrap_or(b.len());
                out.push(Comment { start, end: i, block: true });
            }
            _ => i += 1,
        }
    }
    out
}

fn internal(message: &str, span: Span) -> Diagnostic {
    Diagnostic::error(
        "E0999",
        format!("internal formatter error: {message}"),
        span,
        "the file is left unchanged",
    )
    .with_help("this is a bug in mgnc fmt; please report it with the file that triggered it")
}

// ---- checking the result ---------------------------------------------------------------

/// The formatted text must parse to the same AST (the `use` items moved first) and keep every
/// comment.
fn verify(text: &str, before: &File, out: &str) -> Result<(), Diagnostic> {
    let (after, diags) = parse(FileId(0), out);
    if !diags.is_empty() {
        return Err(internal(
            &format!("the formatted text does not parse ({})", diags[0].message),
            Span::default(),
        ));
    }
    let mut expected: Vec<&Item> =
        before.items.iter().filter(|i| matches!(i, Item::Use(_))).collect();
    expected.extend(before.items.iter().filter(|i| !matches!(i, Item::Use(_))));
    if expected.len() != after.items.len() {
        return Err(internal(
            "the formatted text has a different number of items",
            Span::default(),
        ));
    }
    for (a, b) in expected.iter().zip(&after.items) {
        if stripped(a) != stripped(b) {
            return Err(internal("the formatted text would mean something else here", a.span()));
        }
    }
    let texts = |t: &str| {
        let mut v: Vec<String> =
            comments(t).iter().map(|c| t[c.start..c.end].to_string()).collect();
        v.sort();
        v
    };
    if texts(text) != texts(out) {
        return Err(internal("a comment would be lost or changed", Span::default()));
    }
    Ok(())
}

/// The item's AST with its spans erased, printed with `Debug`: what must not change.
fn stripped(item: &Item) -> String {
    struct Erase;
    impl VisitMut for Erase {
        fn visit_span(&mut self, span: &mut Span) {
            *span = Span::default();
        }
    }
    let mut item = item.clone();
    Erase.visit_item(&mut item);
    format!("{item:?}")
}

// ---- layout ----------------------------------------------------------------------------

struct Fmt<'a> {
    text: &'a str,
    cs: Vec<Comment>,
    /// One-line renderings by expression address and indentation: fitting asks for the same
    /// ones again at every level.
    flat: std::cell::RefCell<std::collections::HashMap<(usize, usize), String>>,
}

/// Comments placed around one item, member, statement or parameter.
#[derive(Default)]
struct Attached {
    /// Own-line comments before it, each with "a blank line precedes it".
    leading: Vec<(bool, usize)>,
    /// A blank line between the last leading comment (or the previous entry) and the code.
    code_blank: bool,
    /// Comments after it on its last line.
    trailing: Vec<usize>,
}

/// One printed entry of a list (items, members, statements, parameters). An entry without
/// lines carries only comments (a file header, comments before a closing brace).
struct Entry {
    att: Attached,
    lines: Vec<String>,
}

impl Entry {
    fn set_gap(&mut self, blank: bool) {
        match self.att.leading.first_mut() {
            Some(l) => l.0 = blank,
            None => self.att.code_blank = blank,
        }
    }

    fn comments_only(leading: Vec<(bool, usize)>) -> Entry {
        Entry { att: Attached { leading, ..Attached::default() }, lines: Vec::new() }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Header,
    Use,
    Const,
    Other,
    Trailer,
}

fn pad(n: usize) -> String {
    " ".repeat(n)
}

fn width(s: &str) -> usize {
    s.chars().count()
}

fn dtype_name(d: DTypeName) -> &'static str {
    d.name()
}

fn range(s: Span) -> (usize, usize) {
    (s.start as usize, s.end as usize)
}

/// Binding strength: 1 `||` … 5 `* / % @`, 6 prefix, 7 postfix, 8 atoms.
fn prec(e: &Expr) -> u8 {
    match &e.kind {
        ExprKind::Binary(_, rest) => rest[0].0.level(),
        ExprKind::Unary(..) => 6,
        ExprKind::Call { .. }
        | ExprKind::Field(..)
        | ExprKind::Index(..)
        | ExprKind::Transpose(..) => 7,
        _ => 8,
    }
}

/// Text whose first line gets `indent` (the others carry their own), as lines.
fn lines(indent: usize, text: &str) -> Vec<String> {
    text.split('\n')
        .enumerate()
        .map(|(k, l)| if k == 0 { format!("{}{l}", pad(indent)) } else { l.to_string() })
        .collect()
}

fn elements(xs: &[Expr]) -> Vec<(Option<&str>, &Expr)> {
    xs.iter().map(|x| (None, x)).collect()
}

fn alias(a: &Option<Ident>) -> String {
    a.as_ref().map(|a| format!(" as {}", a.name)).unwrap_or_default()
}

fn pattern(p: &Pattern) -> String {
    match p {
        Pattern::Name(i) => i.name.clone(),
        Pattern::Wildcard(_) => "_".to_string(),
        Pattern::Tuple(ps, _) => {
            format!("({})", ps.iter().map(pattern).collect::<Vec<_>>().join(", "))
        }
    }
}

fn stmt_span(s: &Stmt) -> Span {
    match s {
        Stmt::Let { span, .. }
        | Stmt::Output { span, .. }
        | Stmt::Loss { span, .. }
        | Stmt::Assign { span, .. } => *span,
    }
}

#[cfg(test)]
mod tests;
