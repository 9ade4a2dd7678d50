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

use crate::ast::*;
use crate::diag::Diagnostic;
use crate::parser::parse;
use crate::span::{FileId, Span};

/// A header whose parameters do not fit in this many columns gets one parameter per line; a
/// field longer than this has its `init` and `if` clauses moved to continuation lines.
pub const MAX_WIDTH: usize = 100;
const INDENT: usize = 4;
/// Spaces before a trailing comment (at least; comments of neighbouring lines are aligned).
const COMMENT_GAP: usize = 2;

/// Formats one file. A file with syntax errors is not formatted: its diagnostics come back.
pub fn format(text: &str) -> Result<String, Vec<Diagnostic>> {
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
        if strip::item(a) != strip::item(b) {
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

/// ASTs with their spans erased, for comparing the input with the output.
mod strip {
    use crate::ast::*;
    use crate::span::Span;

    /// The item's AST without spans, printed with `Debug`.
    pub fn item(it: &Item) -> String {
        let mut it = it.clone();
        match &mut it {
            Item::Use(u) => {
                u.span = Span::default();
                match &mut u.source {
                    UseSource::Path(p) => p.iter_mut().for_each(ident),
                    UseSource::File { span, .. } => *span = Span::default(),
                }
                for n in u.names.iter_mut().flatten() {
                    ident(&mut n.name);
                    n.alias.iter_mut().for_each(ident);
                }
                u.alias.iter_mut().for_each(ident);
            }
            Item::Const(c) => {
                c.span = Span::default();
                ident(&mut c.name);
                c.ty.iter_mut().for_each(ty);
                expr(&mut c.value);
            }
            Item::Fn(f) => {
                f.span = Span::default();
                ident(&mut f.name);
                f.params.iter_mut().for_each(param);
                f.ret.iter_mut().for_each(ty);
                block(&mut f.body);
            }
            Item::Layer(l) => {
                l.span = Span::default();
                ident(&mut l.name);
                l.params.iter_mut().for_each(param);
                for i in &mut l.inputs {
                    i.span = Span::default();
                    ident(&mut i.name);
                    tensor(&mut i.ty);
                }
                for f in &mut l.fields {
                    f.span = Span::default();
                    ident(&mut f.name);
                    match &mut f.init {
                        FieldInit::Tensor { ty, init, .. } => {
                            tensor(ty);
                            init.iter_mut().for_each(expr);
                        }
                        FieldInit::Repeat { count, index, body } => {
                            expr(count);
                            index.iter_mut().for_each(ident);
                            expr(body);
                        }
                        FieldInit::Expr(e) => expr(e),
                    }
                    f.cond.iter_mut().for_each(expr);
                }
                for f in &mut l.forward {
                    f.span = Span::default();
                    f.params.iter_mut().for_each(param);
                    f.ret.iter_mut().for_each(ty);
                    block(&mut f.body);
                }
            }
        }
        format!("{it:?}")
    }

    fn ident(i: &mut Ident) {
        i.span = Span::default();
    }

    fn param(p: &mut Param) {
        p.span = Span::default();
        ident(&mut p.name);
        ty(&mut p.ty);
        p.default.iter_mut().for_each(expr);
    }

    fn ty(t: &mut TypeExpr) {
        match t {
            TypeExpr::Scalar(_, s) => *s = Span::default(),
            TypeExpr::Tensor(t) => tensor(t),
            TypeExpr::Tuple(ts, s) => {
                *s = Span::default();
                ts.iter_mut().for_each(ty);
            }
        }
    }

    fn tensor(t: &mut TensorType) {
        t.span = Span::default();
        for d in &mut t.dims {
            match d {
                DimItem::Expr(e) => expr(e),
                DimItem::Variadic(i) => ident(i),
            }
        }
    }

    fn block(b: &mut Block) {
        b.span = Span::default();
        for s in &mut b.stmts {
            match s {
                Stmt::Let { pat, ty: t, value, span } => {
                    *span = Span::default();
                    pattern(pat);
                    t.iter_mut().for_each(ty);
                    expr(value);
                }
                Stmt::Output { name, value, span } => {
                    *span = Span::default();
                    ident(name);
                    value.iter_mut().for_each(expr);
                }
                Stmt::Loss { value, span } => {
                    *span = Span::default();
                    expr(value);
                }
            }
        }
        if let Some(t) = &mut b.tail {
            expr(t);
        }
    }

    fn pattern(p: &mut Pattern) {
        match p {
            Pattern::Name(i) => ident(i),
            Pattern::Wildcard(s) => *s = Span::default(),
            Pattern::Tuple(ps, s) => {
                *s = Span::default();
                ps.iter_mut().for_each(pattern);
            }
        }
    }

    fn expr(e: &mut Expr) {
        e.span = Span::default();
        match &mut e.kind {
            ExprKind::Unary(_, x) | ExprKind::Transpose(x) => expr(x),
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                expr(a);
                expr(b);
            }
            ExprKind::Call { callee, args } => {
                expr(callee);
                for a in args {
                    a.name.iter_mut().for_each(ident);
                    expr(&mut a.value);
                }
            }
            ExprKind::Field(x, name) => {
                expr(x);
                ident(name);
            }
            ExprKind::Tuple(xs) | ExprKind::List(xs) => xs.iter_mut().for_each(expr),
            ExprKind::If { branches, otherwise } => {
                for (c, b) in branches {
                    expr(c);
                    block(b);
                }
                otherwise.iter_mut().for_each(block);
            }
            _ => {}
        }
    }
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
    match d {
        DTypeName::F32 => "f32",
        DTypeName::F16 => "f16",
        DTypeName::BF16 => "bf16",
        DTypeName::I32 => "i32",
        DTypeName::I64 => "i64",
        DTypeName::U32 => "u32",
        DTypeName::Bool => "bool",
    }
}

fn range(s: Span) -> (usize, usize) {
    (s.start as usize, s.end as usize)
}

/// Binding strength: 1 `||` … 5 `* / % @`, 6 prefix, 7 postfix, 8 atoms.
fn prec(e: &Expr) -> u8 {
    match &e.kind {
        ExprKind::Binary(op, ..) => match op {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 3,
            BinOp::Add | BinOp::Sub => 4,
            BinOp::Mul | BinOp::Div | BinOp::Rem | BinOp::MatMul => 5,
        },
        ExprKind::Unary(..) => 6,
        ExprKind::Call { .. }
        | ExprKind::Field(..)
        | ExprKind::Index(..)
        | ExprKind::Transpose(..) => 7,
        _ => 8,
    }
}

impl Fmt<'_> {
    // ---- looking at the source -----------------------------------------------------

    /// Index of the first comment starting at or after `pos`.
    fn comment_at_or_after(&self, pos: usize) -> usize {
        self.cs.partition_point(|c| c.start < pos)
    }

    fn has_comment_in(&self, start: usize, end: usize) -> bool {
        self.cs.get(self.comment_at_or_after(start)).is_some_and(|c| c.start < end)
    }

    fn comment_text(&self, i: usize) -> &str {
        &self.text[self.cs[i].start..self.cs[i].end]
    }

    fn in_block_comment(&self, pos: usize) -> bool {
        let i = self.cs.partition_point(|c| c.start < pos);
        i > 0 && self.cs[i - 1].block && self.cs[i - 1].end > pos
    }

    /// Whether a blank line separates `a` from `b` (the text between holds only whitespace and
    /// separators).
    fn has_blank(&self, a: usize, b: usize) -> bool {
        let parts: Vec<&str> = self.text[a..b].split('\n').collect();
        parts.len() >= 3 && parts[1..parts.len() - 1].iter().any(|p| p.trim().is_empty())
    }

    fn same_line(&self, a: usize, b: usize, separators: &str) -> bool {
        self.text[a..b]
            .chars()
            .all(|c| c == ' ' || c == '\t' || c == '\r' || separators.contains(c))
    }

    /// The first offset at or after `pos` that is not whitespace or a comment.
    fn skip_trivia(&self, mut pos: usize) -> usize {
        let b = self.text.as_bytes();
        loop {
            while pos < b.len() && b[pos].is_ascii_whitespace() {
                pos += 1;
            }
            match self.cs.get(self.comment_at_or_after(pos)) {
                Some(c) if c.start == pos => pos = c.end,
                _ => return pos,
            }
        }
    }

    /// The `)` that closes the `(` at `open`.
    fn matching_paren(&self, open: usize) -> usize {
        let b = self.text.as_bytes();
        let mut depth = 0usize;
        let mut ci = self.comment_at_or_after(open);
        let mut i = open;
        while i < b.len() {
            if let Some(c) = self.cs.get(ci) {
                if c.start == i {
                    i = c.end;
                    ci += 1;
                    continue;
                }
            }
            match b[i] {
                b'"' => {
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        i += 1;
                    }
                }
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        return i;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        b.len()
    }

    /// Whether the expression was written inside its own parentheses: the parser widens an
    /// expression's span to the parentheses that only group it.
    fn written_in_parens(&self, e: &Expr) -> bool {
        let (s, t) = range(e.span);
        let b = self.text.as_bytes();
        t > s + 1 && b[s] == b'(' && b[t - 1] == b')' && self.matching_paren(s) == t - 1
    }

    /// The text of a literal, without the parentheses it may have been written in.
    fn literal_text(&self, span: Span) -> &str {
        let mut t = &self.text[range(span).0..range(span).1];
        while t.starts_with('(') && t.ends_with(')') {
            t = t[1..t.len() - 1].trim();
        }
        t
    }

    /// The source of `start..end` as written, re-indented so that its first line starts at
    /// `indent`; the inside of block comments is left alone.
    fn verbatim(&self, start: usize, end: usize, indent: usize) -> Vec<String> {
        let line_start = self.text[..start].rfind('\n').map(|i| i + 1).unwrap_or(0);
        let old_indent =
            self.text[line_start..start].len() - self.text[line_start..start].trim_start().len();
        let mut out = Vec::new();
        let mut pos = start;
        for (k, line) in self.text[start..end].split('\n').enumerate() {
            let line_end = pos + line.len();
            let keep_end = self.in_block_comment(line_end);
            let body = if keep_end { line } else { line.trim_end() };
            let text = if k == 0 {
                format!("{}{}", pad(indent), body)
            } else if self.in_block_comment(pos) {
                body.to_string()
            } else if body.trim().is_empty() {
                String::new()
            } else {
                let content = body.trim_start();
                let had = body.len() - content.len();
                format!("{}{}", pad((had + indent).saturating_sub(old_indent)), content)
            };
            out.push(text);
            pos = line_end + 1;
        }
        out
    }

    /// Distributes the comments between `lo` and `hi` among entries with the given spans.
    /// With `opening`, comments on the first line (right after an opening bracket) come back
    /// separately; comments after the last entry come back as a comments-only entry.
    fn attach(
        &self,
        lo: usize,
        hi: usize,
        spans: &[(usize, usize)],
        opening: bool,
    ) -> (Vec<usize>, Vec<Attached>, Vec<(bool, usize)>) {
        let n = self.cs.len();
        let mut ci = self.comment_at_or_after(lo);
        let mut pos = lo;
        let mut open = Vec::new();
        let first = spans.first().map(|s| s.0).unwrap_or(hi);
        if opening {
            while ci < n
                && self.cs[ci].start < first.min(hi)
                && self.same_line(pos, self.cs[ci].start, "")
            {
                open.push(ci);
                pos = self.cs[ci].end;
                ci += 1;
            }
        }
        let mut out = Vec::new();
        for (k, &(s, e)) in spans.iter().enumerate() {
            let mut a = Attached::default();
            while ci < n && self.cs[ci].start < s {
                a.leading.push((self.has_blank(pos, self.cs[ci].start), ci));
                pos = self.cs[ci].end;
                ci += 1;
            }
            a.code_blank = self.has_blank(pos, s);
            // Comments inside the entry are its own business.
            while ci < n && self.cs[ci].start < e {
                ci += 1;
            }
            pos = e;
            let next = spans.get(k + 1).map(|s| s.0).unwrap_or(hi);
            while ci < n && self.cs[ci].start < next && self.same_line(pos, self.cs[ci].start, ";,")
            {
                a.trailing.push(ci);
                pos = self.cs[ci].end;
                ci += 1;
            }
            out.push(a);
        }
        let mut rest = Vec::new();
        while ci < n && self.cs[ci].start < hi {
            rest.push((self.has_blank(pos, self.cs[ci].start), ci));
            pos = self.cs[ci].end;
            ci += 1;
        }
        (open, out, rest)
    }

    // ---- emitting entries ------------------------------------------------------------

    /// Appends entries at `indent`: leading comments, blank lines kept (at most one, never at
    /// the start), trailing comments aligned across neighbouring one-line entries.
    fn emit(&self, out: &mut Vec<String>, indent: usize, entries: &[Entry]) {
        let first_line = out.len();
        let columns = self.comment_columns(entries);
        for (k, en) in entries.iter().enumerate() {
            for &(blank, ci) in &en.att.leading {
                if blank && out.len() > first_line {
                    out.push(String::new());
                }
                out.push(format!("{}{}", pad(indent), self.comment_text(ci)));
            }
            if en.lines.is_empty() {
                continue;
            }
            if en.att.code_blank && out.len() > first_line {
                out.push(String::new());
            }
            let mut lines = en.lines.clone();
            if !en.att.trailing.is_empty() {
                let last = lines.last_mut().expect("an entry with lines");
                let w = width(last);
                let col = columns[k].unwrap_or(w + COMMENT_GAP);
                last.push_str(&pad(col - w));
                last.push_str(&self.trailing_text(&en.att.trailing));
            }
            out.extend(lines);
        }
    }

    fn trailing_text(&self, cs: &[usize]) -> String {
        cs.iter().map(|&i| self.comment_text(i)).collect::<Vec<_>>().join(" ")
    }

    /// Trailing comments of a run of one-line entries (no blank line or own-line comment
    /// between them) start in one column.
    fn comment_columns(&self, entries: &[Entry]) -> Vec<Option<usize>> {
        let single = |e: &Entry| e.lines.len() == 1;
        let mut cols = vec![None; entries.len()];
        let mut i = 0;
        while i < entries.len() {
            let mut j = i + 1;
            while j < entries.len()
                && single(&entries[j - 1])
                && single(&entries[j])
                && entries[j].att.leading.is_empty()
                && !entries[j].att.code_blank
            {
                j += 1;
            }
            let commented =
                || (i..j).filter(|&k| single(&entries[k]) && !entries[k].att.trailing.is_empty());
            if let Some(w) = commented().map(|k| width(&entries[k].lines[0])).max() {
                for k in commented() {
                    cols[k] = Some(w + COMMENT_GAP);
                }
            }
            i = j;
        }
        cols
    }

    /// `lines` with ` {`, the body and `}` added; comments right after `{` stay on its line.
    fn braced(
        &self,
        mut lines: Vec<String>,
        open: &[usize],
        inner: Vec<String>,
        indent: usize,
    ) -> Vec<String> {
        let ends_in_line_comment = {
            let last = lines.last().map(|l| l.as_str()).unwrap_or("");
            comments(last).last().is_some_and(|c| !c.block && c.end == last.trim_end().len())
        };
        if ends_in_line_comment {
            lines.push(format!("{}{{", pad(indent)));
        } else {
            lines.last_mut().expect("a header line").push_str(" {");
        }
        if inner.is_empty() && open.is_empty() {
            lines.last_mut().expect("a header line").push('}');
            return lines;
        }
        if !open.is_empty() {
            let last = lines.last_mut().expect("a header line");
            last.push_str(&pad(COMMENT_GAP));
            last.push_str(&self.trailing_text(open));
        }
        lines.extend(inner);
        lines.push(format!("{}}}", pad(indent)));
        lines
    }

    // ---- items -----------------------------------------------------------------------

    fn file(&self, f: &File) -> String {
        let spans: Vec<(usize, usize)> = f.items.iter().map(|i| range(i.span())).collect();
        let (_, attached, rest) = self.attach(0, self.text.len(), &spans, false);
        let mut entries: Vec<(Class, Entry)> = Vec::new();
        for (item, att) in f.items.iter().zip(attached) {
            let class = match item {
                Item::Use(_) => Class::Use,
                Item::Const(_) => Class::Const,
                _ => Class::Other,
            };
            entries.push((class, Entry { att, lines: self.item(item, 0) }));
        }
        // The comments at the top of the file that a blank line separates from the first item
        // stay at the top even when `use` items move up.
        let mut header = Vec::new();
        if let Some((_, first)) = entries.first_mut() {
            let lead = &first.att.leading;
            let blank_after =
                |k: usize| lead.get(k + 1).map(|l| l.0).unwrap_or(first.att.code_blank);
            if let Some(h) = (0..lead.len()).rev().find(|&k| blank_after(k)) {
                header = first.att.leading.drain(..=h).collect();
                first.set_gap(true);
            }
        }
        let mut ordered: Vec<(Class, Entry)> = Vec::new();
        if !header.is_empty() {
            ordered.push((Class::Header, Entry::comments_only(header)));
        }
        let (uses, others): (Vec<_>, Vec<_>) =
            entries.into_iter().partition(|(c, _)| *c == Class::Use);
        ordered.extend(uses);
        ordered.extend(others);
        if !rest.is_empty() {
            ordered.push((Class::Trailer, Entry::comments_only(rest)));
        }
        for k in 1..ordered.len() {
            let (prev, cur) = (ordered[k - 1].0, ordered[k].0);
            let keep =
                cur == Class::Trailer || (prev == cur && matches!(cur, Class::Use | Class::Const));
            if !keep {
                ordered[k].1.set_gap(true);
            }
        }
        let entries: Vec<Entry> = ordered.into_iter().map(|(_, e)| e).collect();
        let mut out = Vec::new();
        self.emit(&mut out, 0, &entries);
        if out.is_empty() {
            return String::new();
        }
        let mut s = out.join("\n");
        s.push('\n');
        s
    }

    /// A leaf's lines: printed from the AST, or copied from the source when a comment is
    /// inside it.
    fn leaf(&self, span: Span, indent: usize, print: impl FnOnce() -> Vec<String>) -> Vec<String> {
        let (s, e) = range(span);
        if self.has_comment_in(s, e) {
            self.verbatim(s, e, indent)
        } else {
            print()
        }
    }

    fn item(&self, item: &Item, indent: usize) -> Vec<String> {
        match item {
            Item::Use(u) => {
                self.leaf(u.span, indent, || vec![format!("{}{}", pad(indent), self.use_item(u))])
            }
            Item::Const(c) => self.leaf(c.span, indent, || {
                let ty =
                    c.ty.as_ref().map(|t| format!(": {}", self.ty(t, indent))).unwrap_or_default();
                lines(
                    indent,
                    &self.prefixed(format!("const {}{ty} = ", c.name.name), &c.value, indent),
                )
            }),
            Item::Fn(f) => {
                let (start, _) = range(f.span);
                let open = self.skip_trivia(range(f.name.span).1);
                let parens = Some((open, self.matching_paren(open)));
                let body_open = range(f.body.span).0;
                let head = self.header(
                    indent,
                    start,
                    format!("fn {}", f.name.name),
                    parens,
                    &f.params,
                    f.ret.as_ref(),
                    body_open,
                    true,
                );
                let (open, inner) = self.block(&f.body, indent + INDENT);
                self.braced(head, &open, inner, indent)
            }
            Item::Layer(l) => self.layer(l, indent),
        }
    }

    fn use_item(&self, u: &UseItem) -> String {
        let mut s = String::from("use ");
        match &u.source {
            UseSource::Path(p) => {
                s.push_str(&p.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join("."))
            }
            UseSource::File { path, .. } => s.push_str(&format!("\"{path}\"")),
        }
        if let Some(names) = &u.names {
            let names: Vec<String> =
                names.iter().map(|n| format!("{}{}", n.name.name, alias(&n.alias))).collect();
            s.push_str(&format!(".{{{}}}", names.join(", ")));
        }
        s.push_str(&alias(&u.alias));
        s
    }

    /// The lines of a header such as `fn f(a: int) -> int`, without the ` {`.
    #[allow(clippy::too_many_arguments)]
    fn header(
        &self,
        indent: usize,
        start: usize,
        prefix: String,
        parens: Option<(usize, usize)>,
        params: &[Param],
        ret: Option<&TypeExpr>,
        body_open: usize,
        always_parens: bool,
    ) -> Vec<String> {
        let outside_parens = match parens {
            Some((open, close)) => {
                self.has_comment_in(start, open) || self.has_comment_in(close, body_open)
            }
            None => self.has_comment_in(start, body_open),
        };
        if outside_parens {
            let text = self.text[start..body_open].trim_end();
            return self.verbatim(start, start + text.len(), indent);
        }
        let ret = ret.map(|t| format!(" -> {}", self.ty(t, indent))).unwrap_or_default();
        let inside = parens.is_some_and(|(open, close)| self.has_comment_in(open, close));
        if !inside {
            let list = if params.is_empty() && !always_parens && ret.is_empty() {
                String::new()
            } else {
                format!(
                    "({})",
                    params.iter().map(|p| self.param(p, indent)).collect::<Vec<_>>().join(", ")
                )
            };
            let line = format!("{}{prefix}{list}{ret}", pad(indent));
            if params.is_empty() || width(&line) + 2 <= MAX_WIDTH {
                return vec![line];
            }
        }
        // One parameter per line, each followed by a comma.
        let (open, close) = parens.expect("parameters are inside parentheses");
        let spans: Vec<(usize, usize)> = params.iter().map(|p| range(p.span)).collect();
        let (opening, attached, rest) = self.attach(open + 1, close, &spans, true);
        let inner = indent + INDENT;
        let mut entries: Vec<Entry> = params
            .iter()
            .zip(attached)
            .map(|(p, att)| {
                let mut lines = self.leaf(p.span, inner, || {
                    vec![format!("{}{}", pad(inner), self.param(p, inner))]
                });
                lines.last_mut().expect("a parameter line").push(',');
                Entry { att, lines }
            })
            .collect();
        if !rest.is_empty() {
            entries.push(Entry::comments_only(rest));
        }
        let mut first = format!("{}{prefix}(", pad(indent));
        if !opening.is_empty() {
            first.push_str(&pad(COMMENT_GAP));
            first.push_str(&self.trailing_text(&opening));
        }
        let mut lines = vec![first];
        self.emit(&mut lines, inner, &entries);
        lines.push(format!("{}){ret}", pad(indent)));
        lines
    }

    fn param(&self, p: &Param, indent: usize) -> String {
        let default =
            p.default.as_ref().map(|d| format!(" = {}", self.expr(d, indent))).unwrap_or_default();
        format!("{}: {}{default}", p.name.name, self.ty(&p.ty, indent))
    }

    fn layer(&self, l: &LayerItem, indent: usize) -> Vec<String> {
        let (start, end) = range(l.span);
        let after_name = self.skip_trivia(range(l.name.span).1);
        let (parens, body_open) = if self.text.as_bytes()[after_name] == b'(' {
            let close = self.matching_paren(after_name);
            (Some((after_name, close)), self.skip_trivia(close + 1))
        } else {
            (None, after_name)
        };
        let kw = if l.kind == LayerKind::Model { "model" } else { "layer" };
        let head = self.header(
            indent,
            start,
            format!("{kw} {}", l.name.name),
            parens,
            &l.params,
            None,
            body_open,
            false,
        );

        enum Member<'m> {
            Input(&'m InputDecl),
            Field(&'m FieldDef),
            Forward(&'m ForwardDef),
        }
        let mut members: Vec<(Span, Member)> = Vec::new();
        members.extend(l.inputs.iter().map(|i| (i.span, Member::Input(i))));
        members.extend(l.fields.iter().map(|f| (f.span, Member::Field(f))));
        members.extend(l.forward.iter().map(|f| (f.span, Member::Forward(f))));
        members.sort_by_key(|(s, _)| s.start);
        let spans: Vec<(usize, usize)> = members.iter().map(|(s, _)| range(*s)).collect();
        let (open, attached, rest) = self.attach(body_open + 1, end - 1, &spans, true);
        let inner = indent + INDENT;
        let mut entries: Vec<Entry> = members
            .iter()
            .zip(attached)
            .map(|((span, m), att)| {
                let lines = match m {
                    Member::Input(i) => self.leaf(*span, inner, || {
                        vec![format!(
                            "{}input {}: {}",
                            pad(inner),
                            i.name.name,
                            self.tensor(&i.ty, inner)
                        )]
                    }),
                    Member::Field(f) => self.leaf(*span, inner, || self.field(f, inner)),
                    Member::Forward(f) => self.forward(f, inner),
                };
                Entry { att, lines }
            })
            .collect();
        if !rest.is_empty() {
            entries.push(Entry::comments_only(rest));
        }
        let mut body = Vec::new();
        self.emit(&mut body, inner, &entries);
        self.braced(head, &open, body, indent)
    }

    fn field(&self, f: &FieldDef, indent: usize) -> Vec<String> {
        let head = match &f.init {
            FieldInit::Tensor { trainable, ty, .. } => {
                let kw = if *trainable { "param" } else { "buffer" };
                format!("{} = {kw} {}", f.name.name, self.tensor(ty, indent))
            }
            FieldInit::Repeat { count, index, body } => {
                let index = index.as_ref().map(|i| format!(", {}", i.name)).unwrap_or_default();
                self.prefixed(
                    format!("{} = repeat({}{index}) ", f.name.name, self.expr(count, indent)),
                    body,
                    indent,
                )
            }
            FieldInit::Expr(e) => self.prefixed(format!("{} = ", f.name.name), e, indent),
        };
        // The `init` and `if` clauses stay on the line when they fit, and go to continuation
        // lines otherwise.
        let mut clauses = Vec::new();
        if let FieldInit::Tensor { init: Some(init), .. } = &f.init {
            clauses.push(("init ", init));
        }
        if let Some(c) = &f.cond {
            clauses.push(("if ", c));
        }
        let mut out = format!("{}{head}", pad(indent));
        for (kw, e) in clauses {
            let flat = format!("{kw}{}", self.expr(e, indent));
            let last = out.rsplit('\n').next().unwrap_or("");
            if !flat.contains('\n') && width(last) + 1 + width(&flat) <= MAX_WIDTH {
                out.push(' ');
                out.push_str(&flat);
            } else {
                let inner = indent + INDENT;
                out.push('\n');
                out.push_str(&pad(inner));
                out.push_str(&self.prefixed(kw.to_string(), e, inner));
            }
        }
        out.split('\n').map(str::to_string).collect()
    }

    fn forward(&self, f: &ForwardDef, indent: usize) -> Vec<String> {
        let (start, _) = range(f.span);
        let after_kw = self.skip_trivia(start + "forward".len());
        let body_open = range(f.body.span).0;
        let parens = (after_kw < body_open && self.text.as_bytes()[after_kw] == b'(')
            .then(|| (after_kw, self.matching_paren(after_kw)));
        let head = self.header(
            indent,
            start,
            "forward".to_string(),
            parens,
            &f.params,
            f.ret.as_ref(),
            body_open,
            false,
        );
        let (open, inner) = self.block(&f.body, indent + INDENT);
        self.braced(head, &open, inner, indent)
    }

    // ---- blocks and statements -------------------------------------------------------

    /// The statements and final expression of a block, at `indent`, and the comments right
    /// after its `{`.
    fn block(&self, b: &Block, indent: usize) -> (Vec<usize>, Vec<String>) {
        let (start, end) = range(b.span);
        let mut spans: Vec<(usize, usize)> = b.stmts.iter().map(|s| range(stmt_span(s))).collect();
        if let Some(t) = &b.tail {
            spans.push(range(t.span));
        }
        let (open, attached, rest) = self.attach(start + 1, end - 1, &spans, true);
        let mut entries: Vec<Entry> = Vec::new();
        let mut attached = attached.into_iter();
        for s in &b.stmts {
            let lines = self.leaf(stmt_span(s), indent, || lines(indent, &self.stmt(s, indent)));
            entries.push(Entry { att: attached.next().expect("one per statement"), lines });
        }
        if let Some(t) = &b.tail {
            let lines =
                self.leaf(t.span, indent, || lines(indent, &self.fit(t, indent, indent, 0)));
            entries.push(Entry { att: attached.next().expect("one for the tail"), lines });
        }
        // A statement followed by a line that could continue its expression (`(`, `[`, `-`)
        // needs its `;`.
        for k in 1..entries.len() {
            let next = entries[k].lines[0].trim_start();
            if next.starts_with(['(', '[', '-']) {
                entries[k - 1].lines.last_mut().expect("a statement line").push(';');
            }
        }
        if !rest.is_empty() {
            entries.push(Entry::comments_only(rest));
        }
        let mut lines = Vec::new();
        self.emit(&mut lines, indent, &entries);
        (open, lines)
    }

    fn stmt(&self, s: &Stmt, indent: usize) -> String {
        match s {
            Stmt::Let { pat, ty, value, .. } => {
                let ty =
                    ty.as_ref().map(|t| format!(": {}", self.ty(t, indent))).unwrap_or_default();
                self.prefixed(format!("let {}{ty} = ", pattern(pat)), value, indent)
            }
            Stmt::Output { name, value: Some(v), .. } => {
                self.prefixed(format!("output {} = ", name.name), v, indent)
            }
            Stmt::Output { name, value: None, .. } => format!("output {}", name.name),
            Stmt::Loss { value, .. } => self.prefixed("loss ".to_string(), value, indent),
        }
    }

    /// `prefix` and then `e`, fitted to the width, on a line indented by `indent`.
    fn prefixed(&self, prefix: String, e: &Expr, indent: usize) -> String {
        let col = indent + width(&prefix);
        prefix + &self.fit(e, indent, col, 0)
    }

    // ---- types and expressions ---------------------------------------------------------

    fn ty(&self, t: &TypeExpr, indent: usize) -> String {
        match t {
            TypeExpr::Scalar(s, _) => s.name().to_string(),
            TypeExpr::Tensor(t) => self.tensor(t, indent),
            TypeExpr::Tuple(ts, _) => format!(
                "({})",
                ts.iter().map(|t| self.ty(t, indent)).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    fn tensor(&self, t: &TensorType, indent: usize) -> String {
        let dims: Vec<String> = t
            .dims
            .iter()
            .map(|d| match d {
                DimItem::Expr(e) => self.expr(e, indent),
                DimItem::Variadic(i) => format!("..{}", i.name),
            })
            .collect();
        format!("{}[{}]", dtype_name(t.dtype), dims.join(", "))
    }

    /// An expression on one line (but for `if`s whose blocks hold statements), starting on a
    /// line indented by `indent`.
    fn expr(&self, e: &Expr, indent: usize) -> String {
        let key = (e as *const Expr as usize, indent);
        if let Some(s) = self.flat.borrow().get(&key) {
            return s.clone();
        }
        let mut s = String::new();
        self.expr_into(&mut s, e, indent);
        self.flat.borrow_mut().insert(key, s.clone());
        s
    }

    /// Whether `expr` prints over several lines: it holds an `if` with statements in a block.
    fn spreads(e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Unary(_, x) | ExprKind::Transpose(x) | ExprKind::Field(x, _) => {
                Self::spreads(x)
            }
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                Self::spreads(a) || Self::spreads(b)
            }
            ExprKind::Call { callee, args } => {
                Self::spreads(callee) || args.iter().any(|a| Self::spreads(&a.value))
            }
            ExprKind::Tuple(xs) | ExprKind::List(xs) => xs.iter().any(Self::spreads),
            ExprKind::If { branches, otherwise } => {
                branches.iter().any(|(c, b)| Self::spreads(c) || !Self::inline_block(b))
                    || otherwise.as_ref().is_some_and(|b| !Self::inline_block(b))
            }
            _ => false,
        }
    }

    /// Whether a block of an `if` can sit on the `if`'s line: only a final expression.
    fn inline_block(b: &Block) -> bool {
        b.stmts.is_empty() && b.tail.as_ref().is_none_or(|t| !Self::spreads(t))
    }

    /// Whether `s`, starting at column `col` and followed by `suffix` more columns, stays
    /// within `MAX_WIDTH`.
    fn fits(&self, s: &str, col: usize, suffix: usize) -> bool {
        let first = s.split('\n').next().unwrap_or("");
        let last = s.rsplit('\n').next().unwrap_or("");
        if s.contains('\n') {
            col + width(first) <= MAX_WIDTH && width(last) + suffix <= MAX_WIDTH
        } else {
            col + width(s) + suffix <= MAX_WIDTH
        }
    }

    /// `e` starting at column `col` of a line indented by `indent`, with `suffix` columns to
    /// follow it: on one line when that fits; otherwise its argument list, list or tuple gets
    /// one element per line (with a trailing comma), an operator chain is broken before each
    /// operator, or an `if` is spread over lines.
    fn fit(&self, e: &Expr, indent: usize, col: usize, suffix: usize) -> String {
        let flat = self.expr(e, indent);
        // An `if` already over several lines gains nothing from spreading further.
        if self.fits(&flat, col, suffix)
            || (flat.contains('\n') && matches!(e.kind, ExprKind::If { .. }))
        {
            return flat;
        }
        if self.keeps_parens(e) {
            return format!("({})", self.fit_bare(e, indent, col + 1, suffix + 1));
        }
        self.fit_bare(e, indent, col, suffix)
    }

    /// A sub-expression fitted as by `fit`, in parentheses where its context needs them.
    fn fit_operand(
        &self,
        e: &Expr,
        needs_parens: bool,
        indent: usize,
        col: usize,
        suffix: usize,
    ) -> String {
        if needs_parens && !self.keeps_parens(e) {
            format!("({})", self.fit(e, indent, col + 1, suffix + 1))
        } else {
            self.fit(e, indent, col, suffix)
        }
    }

    /// `fit` without the parentheses the user wrote around `e`.
    fn fit_bare(&self, e: &Expr, indent: usize, col: usize, suffix: usize) -> String {
        match &e.kind {
            ExprKind::Call { callee, args } if !args.is_empty() => {
                let mut head = String::new();
                self.operand(&mut head, callee, prec(callee) < 7, indent);
                let items: Vec<(Option<&str>, &Expr)> = args
                    .iter()
                    .map(|a| (a.name.as_ref().map(|n| n.name.as_str()), &a.value))
                    .collect();
                format!("{head}({})", self.broken(&items, indent, false))
            }
            ExprKind::List(xs) if !xs.is_empty() => {
                format!("[{}]", self.broken(&elements(xs), indent, false))
            }
            ExprKind::Tuple(xs) => {
                format!("({})", self.broken(&elements(xs), indent, xs.len() == 1))
            }
            ExprKind::Binary(..) => self.chain(e, indent, col, suffix),
            ExprKind::If { branches, otherwise } => {
                let mut s = String::new();
                self.if_into(&mut s, branches, otherwise.as_ref(), indent, true);
                s
            }
            ExprKind::Field(x, name) if prec(x) >= 7 => format!(
                "{}.{}",
                self.fit(x, indent, col, suffix + 1 + width(&name.name)),
                name.name
            ),
            ExprKind::Index(x, i) if prec(x) >= 7 => {
                let index = format!("[{}]", self.expr(i, indent));
                format!("{}{index}", self.fit(x, indent, col, suffix + width(&index)))
            }
            ExprKind::Transpose(x) if prec(x) >= 7 => {
                format!("{}^T", self.fit(x, indent, col, suffix + 2))
            }
            ExprKind::Unary(op, x) if prec(x) > 6 => {
                format!(
                    "{}{}",
                    if *op == UnOp::Neg { "-" } else { "!" },
                    self.fit(x, indent, col + 1, suffix)
                )
            }
            _ => {
                let mut s = String::new();
                self.kind_into(&mut s, e, indent, false);
                s
            }
        }
    }

    /// The inside of brackets that do not fit on the line: all elements on one line of their
    /// own when that fits, otherwise one per line, each followed by a comma. The closing
    /// bracket goes on a line of its own at `indent`. A one-element tuple keeps its comma.
    fn broken(&self, items: &[(Option<&str>, &Expr)], indent: usize, one_tuple: bool) -> String {
        let inner = indent + INDENT;
        let element = |name: Option<&str>, x: &Expr| {
            format!(
                "{}{}",
                name.map(|n| format!("{n} = ")).unwrap_or_default(),
                self.expr(x, inner)
            )
        };
        let mut one_line = items.iter().map(|(n, x)| element(*n, x)).collect::<Vec<_>>().join(", ");
        if one_tuple {
            one_line.push(',');
        }
        if !one_line.contains('\n') && inner + width(&one_line) <= MAX_WIDTH {
            return format!("\n{}{one_line}\n{}", pad(inner), pad(indent));
        }
        let mut s = String::from("\n");
        for (name, x) in items {
            let prefix = name.map(|n| format!("{n} = ")).unwrap_or_default();
            s.push_str(&pad(inner));
            s.push_str(&prefix);
            s.push_str(&self.fit(x, inner, inner + width(&prefix), 1));
            s.push_str(",\n");
        }
        s.push_str(&pad(indent));
        s
    }

    /// A chain of operators of one precedence (`a + b - c`), broken before each operator: a
    /// line that starts with an operator continues the expression above it.
    fn chain(&self, e: &Expr, indent: usize, col: usize, suffix: usize) -> String {
        let p = prec(e);
        let mut rest: Vec<(BinOp, &Expr)> = Vec::new();
        let mut cur = e;
        while let ExprKind::Binary(op, a, b) = &cur.kind {
            if prec(cur) != p || (!std::ptr::eq(cur, e) && self.keeps_parens(cur)) {
                break;
            }
            rest.push((*op, b));
            cur = a;
        }
        rest.reverse();
        let inner = indent + INDENT;
        let mut s = self.fit_operand(cur, prec(cur) < p, indent, col, 0);
        let n = rest.len();
        for (k, (op, b)) in rest.into_iter().enumerate() {
            let symbol = op.symbol();
            s.push('\n');
            s.push_str(&pad(inner));
            s.push_str(symbol);
            s.push(' ');
            let suffix = if k + 1 == n { suffix } else { 0 };
            s.push_str(&self.fit_operand(
                b,
                prec(b) <= p,
                inner,
                inner + width(symbol) + 1,
                suffix,
            ));
        }
        s
    }

    /// A sub-expression, in parentheses where its context binds tighter than it does.
    fn operand(&self, out: &mut String, e: &Expr, needs_parens: bool, indent: usize) {
        let paren = needs_parens && !self.keeps_parens(e);
        if paren {
            out.push('(');
        }
        self.expr_into(out, e, indent);
        if paren {
            out.push(')');
        }
    }

    /// The parentheses the user wrote around an operator or an `if` are kept.
    fn keeps_parens(&self, e: &Expr) -> bool {
        matches!(e.kind, ExprKind::Binary(..) | ExprKind::Unary(..) | ExprKind::If { .. })
            && self.written_in_parens(e)
    }

    fn expr_into(&self, out: &mut String, e: &Expr, indent: usize) {
        let parens = self.keeps_parens(e);
        if parens {
            out.push('(');
        }
        self.kind_into(out, e, indent, false);
        if parens {
            out.push(')');
        }
    }

    /// The expression without the parentheses the user wrote around it; with `spread`, an `if`
    /// goes over several lines.
    fn kind_into(&self, out: &mut String, e: &Expr, indent: usize, spread: bool) {
        match &e.kind {
            ExprKind::Int(v) => out.push_str(&v.to_string()),
            ExprKind::Float(_) => out.push_str(self.literal_text(e.span)),
            ExprKind::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            ExprKind::Str(s) => {
                out.push('"');
                out.push_str(s);
                out.push('"');
            }
            ExprKind::DType(d) => out.push_str(dtype_name(*d)),
            ExprKind::Name(n) => out.push_str(n),
            ExprKind::SelfRef => out.push_str("self"),
            ExprKind::Unary(op, x) => {
                out.push(if *op == UnOp::Neg { '-' } else { '!' });
                self.operand(out, x, prec(x) <= 6, indent);
            }
            ExprKind::Binary(op, a, b) => {
                let p = prec(e);
                self.operand(out, a, prec(a) < p, indent);
                out.push(' ');
                out.push_str(op.symbol());
                out.push(' ');
                self.operand(out, b, prec(b) <= p, indent);
            }
            ExprKind::Call { callee, args } => {
                self.operand(out, callee, prec(callee) < 7, indent);
                out.push('(');
                for (k, a) in args.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    if let Some(n) = &a.name {
                        out.push_str(&n.name);
                        out.push_str(" = ");
                    }
                    self.expr_into(out, &a.value, indent);
                }
                out.push(')');
            }
            ExprKind::Field(x, name) => {
                self.operand(out, x, prec(x) < 7, indent);
                out.push('.');
                out.push_str(&name.name);
            }
            ExprKind::Index(x, i) => {
                self.operand(out, x, prec(x) < 7, indent);
                out.push('[');
                self.expr_into(out, i, indent);
                out.push(']');
            }
            ExprKind::Transpose(x) => {
                self.operand(out, x, prec(x) < 7, indent);
                out.push_str("^T");
            }
            ExprKind::Tuple(xs) => {
                out.push('(');
                self.list_into(out, xs, indent);
                if xs.len() == 1 {
                    out.push(',');
                }
                out.push(')');
            }
            ExprKind::List(xs) => {
                out.push('[');
                self.list_into(out, xs, indent);
                out.push(']');
            }
            ExprKind::If { branches, otherwise } => {
                self.if_into(out, branches, otherwise.as_ref(), indent, spread)
            }
            ExprKind::Error => out.push_str(&self.text[range(e.span).0..range(e.span).1]),
        }
    }

    fn list_into(&self, out: &mut String, xs: &[Expr], indent: usize) {
        for (k, x) in xs.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            self.expr_into(out, x, indent);
        }
    }

    /// `if c { a } else { b }` on one line when every block is only an expression (and
    /// `spread` is off); otherwise each block's contents on lines of their own.
    fn if_into(
        &self,
        out: &mut String,
        branches: &[(Expr, Block)],
        otherwise: Option<&Block>,
        indent: usize,
        spread: bool,
    ) {
        let blocks = || branches.iter().map(|(_, b)| b).chain(otherwise);
        let inline: Option<Vec<String>> = if spread || !blocks().all(Self::inline_block) {
            None
        } else {
            Some(
                blocks()
                    .map(|b| b.tail.as_ref().map(|t| self.expr(t, indent)).unwrap_or_default())
                    .collect(),
            )
        };
        let render_block = |out: &mut String, b: &Block, k: usize| match &inline {
            Some(tails) if tails[k].is_empty() => out.push_str("{}"),
            Some(tails) => {
                out.push_str("{ ");
                out.push_str(&tails[k]);
                out.push_str(" }");
            }
            None => {
                let (_, lines) = self.block(b, indent + INDENT);
                if lines.is_empty() {
                    out.push_str("{}");
                } else {
                    out.push_str("{\n");
                    out.push_str(&lines.join("\n"));
                    out.push('\n');
                    out.push_str(&pad(indent));
                    out.push('}');
                }
            }
        };
        for (k, (cond, b)) in branches.iter().enumerate() {
            if k > 0 {
                out.push_str(" else ");
            }
            out.push_str("if ");
            self.expr_into(out, cond, indent);
            out.push(' ');
            render_block(out, b, k);
        }
        if let Some(b) = otherwise {
            out.push_str(" else ");
            render_block(out, b, branches.len());
        }
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
        Stmt::Let { span, .. } | Stmt::Output { span, .. } | Stmt::Loss { span, .. } => *span,
    }
}

#[cfg(test)]
mod tests;
