//! Items, members, blocks, statements and types.

use super::*;

impl Fmt<'_> {
    // ---- items -----------------------------------------------------------------------

    pub(super) fn file(&self, f: &File) -> String {
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
    pub(super) fn leaf(
        &self,
        span: Span,
        indent: usize,
        print: impl FnOnce() -> Vec<String>,
    ) -> Vec<String> {
        let (s, e) = range(span);
        if self.has_comment_in(s, e) {
            self.verbatim(s, e, indent)
        } else {
            print()
        }
    }

    pub(super) fn item(&self, item: &Item, indent: usize) -> Vec<String> {
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

    pub(super) fn use_item(&self, u: &UseItem) -> String {
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
    pub(super) fn header(
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

    pub(super) fn param(&self, p: &Param, indent: usize) -> String {
        let default =
            p.default.as_ref().map(|d| format!(" = {}", self.expr(d, indent))).unwrap_or_default();
        let mark = if p.optional { "?" } else { "" };
        format!("{}{mark}: {}{default}", p.name.name, self.ty(&p.ty, indent))
    }

    pub(super) fn layer(&self, l: &LayerItem, indent: usize) -> Vec<String> {
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

    pub(super) fn field(&self, f: &FieldDef, indent: usize) -> Vec<String> {
        let head = match &f.init {
            FieldInit::Tensor { kind, ty, .. } => {
                format!("{} = {} {}", f.name.name, kind.keyword(), self.tensor(ty, indent))
            }
            FieldInit::Repeat { count, index, name, body } => {
                let index = index.as_ref().map(|i| format!(", {}", i.name)).unwrap_or_default();
                let name = name.as_ref().map(|n| format!(", name = {}", self.expr(n, indent)));
                self.prefixed(
                    format!(
                        "{} = repeat({}{index}{}) ",
                        f.name.name,
                        self.expr(count, indent),
                        name.unwrap_or_default()
                    ),
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

    pub(super) fn forward(&self, f: &ForwardDef, indent: usize) -> Vec<String> {
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
    pub(super) fn block(&self, b: &Block, indent: usize) -> (Vec<usize>, Vec<String>) {
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

    pub(super) fn stmt(&self, s: &Stmt, indent: usize) -> String {
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
            Stmt::Assign { field, value, .. } => {
                self.prefixed(format!("self.{} = ", field.name), value, indent)
            }
        }
    }

    /// `prefix` and then `e`, fitted to the width, on a line indented by `indent`.
    pub(super) fn prefixed(&self, prefix: String, e: &Expr, indent: usize) -> String {
        let col = indent + width(&prefix);
        prefix + &self.fit(e, indent, col, 0)
    }

    // ---- types and expressions ---------------------------------------------------------

    pub(super) fn ty(&self, t: &TypeExpr, indent: usize) -> String {
        match t {
            TypeExpr::Scalar(s, _) => s.name().to_string(),
            TypeExpr::Tensor(t) => self.tensor(t, indent),
            TypeExpr::Tuple(ts, _) => format!(
                "({})",
                ts.iter().map(|t| self.ty(t, indent)).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    pub(super) fn tensor(&self, t: &TensorType, indent: usize) -> String {
        let dims: Vec<String> = t
            .dims
            .iter()
            .map(|d| match d {
                DimItem::Expr(e) => self.expr(e, indent),
                DimItem::Variadic(i) => format!("..{}", i.name),
            })
            .collect();
        let dtype = match &t.dtype {
            ElemType::Named(d) => dtype_name(*d).to_string(),
            ElemType::Value(e) => self.expr(e, indent),
        };
        format!("{dtype}[{}]", dims.join(", "))
    }
}
