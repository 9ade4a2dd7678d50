//! Expressions: fitting them in the width, and breaking them when they do not fit.

use super::*;
use crate::visit::{self, Visit};

impl Fmt<'_> {
    /// An expression on one line (but for `if`s whose blocks hold statements), starting on a
    /// line indented by `indent`.
    pub(super) fn expr(&self, e: &Expr, indent: usize) -> String {
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
    pub(super) fn spreads(e: &Expr) -> bool {
        /// Looks through the expression, not into the blocks of its `if`s.
        struct Spreads(bool);
        impl<'e> Visit<'e> for Spreads {
            fn visit_expr(&mut self, e: &'e Expr) {
                if self.0 {
                    return;
                }
                match &e.kind {
                    ExprKind::If { branches, otherwise } => {
                        for (c, b) in branches {
                            self.visit_expr(c);
                            self.0 |= !Fmt::inline_block(b);
                        }
                        self.0 |= otherwise.as_ref().is_some_and(|b| !Fmt::inline_block(b));
                    }
                    _ => visit::walk_expr(self, e),
                }
            }
        }
        let mut v = Spreads(false);
        v.visit_expr(e);
        v.0
    }

    /// Whether a block of an `if` can sit on the `if`'s line: only a final expression.
    pub(super) fn inline_block(b: &Block) -> bool {
        b.stmts.is_empty() && b.tail.as_ref().is_none_or(|t| !Self::spreads(t))
    }

    /// Whether `s`, starting at column `col` and followed by `suffix` more columns, stays
    /// within `MAX_WIDTH`.
    pub(super) fn fits(&self, s: &str, col: usize, suffix: usize) -> bool {
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
    pub(super) fn fit(&self, e: &Expr, indent: usize, col: usize, suffix: usize) -> String {
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
    pub(super) fn fit_operand(
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
    pub(super) fn fit_bare(&self, e: &Expr, indent: usize, col: usize, suffix: usize) -> String {
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
    pub(super) fn broken(
        &self,
        items: &[(Option<&str>, &Expr)],
        indent: usize,
        one_tuple: bool,
    ) -> String {
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
    pub(super) fn chain(&self, e: &Expr, indent: usize, col: usize, suffix: usize) -> String {
        let ExprKind::Binary(first, rest) = &e.kind else { unreachable!("called on chains") };
        let p = prec(e);
        let inner = indent + INDENT;
        let mut s = self.fit_operand(first, prec(first) < p, indent, col, 0);
        let n = rest.len();
        for (k, (op, b)) in rest.iter().enumerate() {
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
    pub(super) fn operand(&self, out: &mut String, e: &Expr, needs_parens: bool, indent: usize) {
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
    pub(super) fn keeps_parens(&self, e: &Expr) -> bool {
        matches!(e.kind, ExprKind::Binary(..) | ExprKind::Unary(..) | ExprKind::If { .. })
            && self.written_in_parens(e)
    }

    pub(super) fn expr_into(&self, out: &mut String, e: &Expr, indent: usize) {
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
    pub(super) fn kind_into(&self, out: &mut String, e: &Expr, indent: usize, spread: bool) {
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
            ExprKind::Binary(first, rest) => {
                let p = prec(e);
                self.operand(out, first, prec(first) < p, indent);
                for (op, b) in rest {
                    out.push(' ');
                    out.push_str(op.symbol());
                    out.push(' ');
                    self.operand(out, b, prec(b) <= p, indent);
                }
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

    pub(super) fn list_into(&self, out: &mut String, xs: &[Expr], indent: usize) {
        for (k, x) in xs.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            self.expr_into(out, x, indent);
        }
    }

    /// `if c { a } else { b }` on one line when every block is only an expression (and
    /// `spread` is off); otherwise each block's contents on lines of their own.
    pub(super) fn if_into(
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
