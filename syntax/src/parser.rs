//! pest parse tree to AST, and pest errors to diagnostics.
//!
//! The file is parsed one item at a time: after a syntax error the parser skips to the next
//! line that starts an item and goes on, so a file with several mistakes reports each of them
//! and the language server still sees every item that parsed.

use crate::ast::*;
use crate::diag::Diagnostic;
use crate::limits;
use crate::span::{FileId, Span};
use pest::iterators::{Pair, Pairs};
use pest::pratt_parser::{Assoc, Op, PrattParser};
use pest::Parser as _;
use std::num::NonZeroUsize;
use std::sync::OnceLock;

mod errors;
use errors::syntax_error;

/// The byte-order mark, skipped at the start of a file.
pub const BOM: char = '\u{feff}';

#[derive(pest_derive::Parser)]
#[grammar = "mgn.pest"]
struct MgnParser;

/// Parses one source file. Always returns an AST (possibly partial) and the diagnostics found.
pub fn parse(file: FileId, text: &str) -> (File, Vec<Diagnostic>) {
    if let Some(d) = limits::check_source(file, text) {
        return (File::default(), vec![d]);
    }
    // A runaway-backtracking guard; linear in the input, far above what real files need.
    pest::set_call_limit(NonZeroUsize::new(text.len().saturating_mul(400).max(1_000_000)));

    let mut out = File::default();
    let mut diags = Vec::new();
    // A byte-order mark some editors write at the start of UTF-8 files is not part of the text.
    let mut pos = if text.starts_with(BOM) { BOM.len_utf8() } else { 0 };
    loop {
        pos = match skip_trivia(text, pos) {
            Ok(p) => p,
            Err(at) => {
                diags.push(
                    Diagnostic::error(
                        "E0001",
                        "unterminated block comment",
                        Span::new(file, at, at + 2),
                        "this `/*` is never closed",
                    )
                    .with_help("close it with `*/`"),
                );
                break;
            }
        };
        if pos >= text.len() {
            break;
        }
        let mut b = Builder { file, text, offset: pos, diags: &mut diags };
        match MgnParser::parse(Rule::item_at, &text[pos..]) {
            Ok(mut pairs) => {
                let top = pairs.next().expect("item_at always yields one pair");
                let consumed = top.as_span().end();
                if let Some(item) = top.into_inner().next() {
                    out.items.push(b.item(item));
                }
                pos += consumed.max(1);
            }
            Err(e) => {
                diags.push(syntax_error(file, text, pos, detailed_error(&text[pos..], e)));
                if let Some(name) = item_name_at(file, text, pos) {
                    out.unparsed.push(name);
                }
                pos = next_item_start(text, pos + 1);
            }
        }
    }
    (out, diags)
}

/// The error of an item that failed to parse, parsed again with pest's record of what it
/// expected where. Only failing items pay for that record (it allocates for every token tried,
/// and made parsing long files superlinear). pest reads the setting when a parse starts; the
/// lock keeps another thread from turning it off in between, and parses without it are only
/// the faster for seeing it on.
fn detailed_error(item: &str, plain: pest::error::Error<Rule>) -> pest::error::Error<Rule> {
    static DETAIL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = DETAIL.lock().unwrap_or_else(|e| e.into_inner());
    pest::set_error_detail(true);
    let r = MgnParser::parse(Rule::item_at, item);
    pest::set_error_detail(false);
    r.err().unwrap_or(plain)
}

/// The first offset at or after `pos` that is not whitespace or a comment; `Err(start)` for a
/// block comment that never ends.
fn skip_trivia(text: &str, mut pos: usize) -> Result<usize, usize> {
    let b = text.as_bytes();
    loop {
        while pos < b.len() && b[pos].is_ascii_whitespace() {
            pos += 1;
        }
        if b[pos..].starts_with(b"//") {
            while pos < b.len() && b[pos] != b'\n' {
                pos += 1;
            }
        } else if b[pos..].starts_with(b"/*") {
            match text[pos + 2..].find("*/") {
                Some(i) => pos += i + 4,
                None => return Err(pos),
            }
        } else {
            return Ok(pos);
        }
    }
}

/// The name in `fn name`, `layer name`, `model name` or `const name` at `pos`, if any.
fn item_name_at(file: FileId, text: &str, pos: usize) -> Option<Ident> {
    let rest = &text[pos..];
    let kw = ["fn", "layer", "model", "const", "def", "class"]
        .into_iter()
        .find(|k| rest.starts_with(k) && rest[k.len()..].starts_with(char::is_whitespace))?;
    let after = &rest[kw.len()..];
    let skip = after.len() - after.trim_start().len();
    let name: String =
        after.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let start = pos + kw.len() + skip;
    Some(Ident { span: Span::new(file, start, start + name.len()), name })
}

/// The start of the next line that begins with an item keyword, or the end of the text.
fn next_item_start(text: &str, from: usize) -> usize {
    let mut line_start = match text.get(from..).and_then(|t| t.find('\n')) {
        Some(i) => from + i + 1,
        None => return text.len(),
    };
    while line_start < text.len() {
        let line = &text[line_start..];
        let word: String =
            line.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if matches!(word.as_str(), "use" | "const" | "fn" | "layer" | "model") {
            return line_start;
        }
        match line.find('\n') {
            Some(i) => line_start += i + 1,
            None => break,
        }
    }
    text.len()
}

// ---- AST building -----------------------------------------------------------

fn pratt() -> &'static PrattParser<Rule> {
    static P: OnceLock<PrattParser<Rule>> = OnceLock::new();
    P.get_or_init(|| {
        PrattParser::new()
            .op(Op::infix(Rule::or_op, Assoc::Left))
            .op(Op::infix(Rule::and_op, Assoc::Left))
            .op(Op::infix(Rule::eq_op, Assoc::Left)
                | Op::infix(Rule::ne_op, Assoc::Left)
                | Op::infix(Rule::lt_op, Assoc::Left)
                | Op::infix(Rule::le_op, Assoc::Left)
                | Op::infix(Rule::gt_op, Assoc::Left)
                | Op::infix(Rule::ge_op, Assoc::Left))
            .op(Op::infix(Rule::add_op, Assoc::Left) | Op::infix(Rule::sub_op, Assoc::Left))
            .op(Op::infix(Rule::mul_op, Assoc::Left)
                | Op::infix(Rule::div_op, Assoc::Left)
                | Op::infix(Rule::rem_op, Assoc::Left)
                | Op::infix(Rule::matmul_op, Assoc::Left))
            .op(Op::prefix(Rule::neg_op) | Op::prefix(Rule::not_op))
            .op(Op::postfix(Rule::call_args)
                | Op::postfix(Rule::field_access)
                | Op::postfix(Rule::index)
                | Op::postfix(Rule::transpose_op))
    })
}

struct Builder<'d> {
    file: FileId,
    /// The whole file (spans are trimmed against it).
    text: &'d str,
    offset: usize,
    diags: &'d mut Vec<Diagnostic>,
}

/// An expression under construction with the depth of its tree, for `MAX_EXPR_DEPTH`.
struct Built {
    expr: Expr,
    depth: usize,
    /// Written in parentheses: a chain of operators is not continued into it.
    grouped: bool,
}

impl Builder<'_> {
    /// The pair's span without the whitespace and comments pest lets a rule end with.
    fn span(&self, p: &Pair<Rule>) -> Span {
        let s = p.as_span();
        let start = self.offset + s.start();
        Span::new(self.file, start, trim_end(self.text, start, self.offset + s.end()))
    }

    fn ident(&self, p: Pair<Rule>) -> Ident {
        Ident { name: p.as_str().to_string(), span: self.span(&p) }
    }

    fn item(&mut self, p: Pair<Rule>) -> Item {
        let span = self.span(&p);
        match p.as_rule() {
            Rule::use_item => Item::Use(self.use_item(p, span)),
            Rule::const_item => {
                let mut inner = skip_kw(p.into_inner());
                let name = self.ident(inner.next().unwrap());
                let mut ty = None;
                let mut value = None;
                for q in inner {
                    match q.as_rule() {
                        Rule::type_expr => ty = Some(self.type_expr(q)),
                        Rule::expr => value = Some(self.expr(q)),
                        _ => {}
                    }
                }
                Item::Const(ConstItem { name, ty, value: value.unwrap(), span })
            }
            Rule::fn_item => {
                let mut inner = skip_kw(p.into_inner());
                let name = self.ident(inner.next().unwrap());
                let (mut params, mut ret, mut body) = (Vec::new(), None, None);
                for q in inner {
                    match q.as_rule() {
                        Rule::params => params = self.params(q),
                        Rule::ret_type => {
                            ret = Some(self.type_expr(q.into_inner().next().unwrap()))
                        }
                        Rule::block => body = Some(self.block(q)),
                        _ => {}
                    }
                }
                Item::Fn(FnItem { name, params, ret, body: body.unwrap(), span })
            }
            Rule::layer_item | Rule::model_item => {
                let kind = if p.as_rule() == Rule::model_item {
                    LayerKind::Model
                } else {
                    LayerKind::Layer
                };
                let mut inner = skip_kw(p.into_inner());
                let name = self.ident(inner.next().unwrap());
                let mut layer = LayerItem {
                    kind,
                    name,
                    params: Vec::new(),
                    inputs: Vec::new(),
                    fields: Vec::new(),
                    forward: Vec::new(),
                    span,
                };
                for q in inner {
                    let qs = self.span(&q);
                    match q.as_rule() {
                        Rule::params => layer.params = self.params(q),
                        Rule::input_decl => {
                            let mut i = skip_kw(q.into_inner());
                            let name = self.ident(i.next().unwrap());
                            let ty = self.tensor_type(i.next().unwrap());
                            layer.inputs.push(InputDecl { name, ty, span: qs });
                        }
                        Rule::field_def => layer.fields.push(self.field_def(q)),
                        Rule::forward_def => {
                            let (mut params, mut ret, mut body) = (Vec::new(), None, None);
                            for r in skip_kw(q.into_inner()) {
                                match r.as_rule() {
                                    Rule::params => params = self.params(r),
                                    Rule::ret_type => {
                                        ret = Some(self.type_expr(r.into_inner().next().unwrap()))
                                    }
                                    Rule::block => body = Some(self.block(r)),
                                    _ => {}
                                }
                            }
                            layer.forward.push(ForwardDef {
                                params,
                                ret,
                                body: body.unwrap(),
                                span: qs,
                            });
                        }
                        _ => {}
                    }
                }
                Item::Layer(layer)
            }
            r => unreachable!("not an item: {r:?}"),
        }
    }

    fn use_item(&mut self, p: Pair<Rule>, span: Span) -> UseItem {
        let mut u = UseItem { source: UseSource::Path(Vec::new()), names: None, alias: None, span };
        for q in skip_kw(p.into_inner()) {
            match q.as_rule() {
                Rule::use_source => {
                    let s = q.into_inner().next().unwrap();
                    u.source = match s.as_rule() {
                        Rule::string => {
                            let raw = s.as_str();
                            UseSource::File {
                                path: raw[1..raw.len() - 1].to_string(),
                                span: self.span(&s),
                            }
                        }
                        _ => UseSource::Path(s.into_inner().map(|i| self.ident(i)).collect()),
                    }
                }
                Rule::use_list => {
                    let names = q
                        .into_inner()
                        .map(|n| {
                            let mut i = n.into_inner();
                            let name = self.ident(i.next().unwrap());
                            let alias = i.next().map(|a| self.alias(a));
                            UseName { name, alias }
                        })
                        .collect();
                    u.names = Some(names);
                }
                Rule::use_alias => u.alias = Some(self.alias(q)),
                _ => {}
            }
        }
        u
    }

    fn alias(&self, p: Pair<Rule>) -> Ident {
        self.ident(skip_kw(p.into_inner()).next().unwrap())
    }

    fn field_def(&mut self, p: Pair<Rule>) -> FieldDef {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let name = self.ident(inner.next().unwrap());
        let init_pair = inner.next().unwrap();
        let init = match init_pair.as_rule() {
            Rule::param_init | Rule::buffer_init | Rule::const_init | Rule::state_init => {
                let kind = match init_pair.as_rule() {
                    Rule::param_init => TensorKind::Param,
                    Rule::buffer_init => TensorKind::Buffer,
                    Rule::state_init => TensorKind::State,
                    _ => TensorKind::Const,
                };
                let mut i = skip_kw(init_pair.into_inner());
                let ty = self.tensor_type(i.next().unwrap());
                let init = i.next().map(|c| self.expr(skip_kw(c.into_inner()).next().unwrap()));
                FieldInit::Tensor { kind, ty, init }
            }
            Rule::repeat_init => {
                let mut i = skip_kw(init_pair.into_inner());
                let count = self.expr(i.next().unwrap());
                let mut rest: Vec<Pair<Rule>> = i.collect();
                let body = self.expr(rest.pop().unwrap());
                let (mut index, mut name) = (None, None);
                for r in rest {
                    match r.as_rule() {
                        Rule::repeat_name => {
                            name = Some(self.expr(skip_kw(r.into_inner()).next().unwrap()))
                        }
                        _ => index = Some(self.ident(r)),
                    }
                }
                FieldInit::Repeat { count, index, name, body }
            }
            _ => FieldInit::Expr(self.expr(init_pair)),
        };
        let cond = inner.next().map(|c| self.expr(skip_kw(c.into_inner()).next().unwrap()));
        FieldDef { name, init, cond, span }
    }

    fn params(&mut self, p: Pair<Rule>) -> Vec<Param> {
        p.into_inner()
            .map(|q| {
                let span = self.span(&q);
                let mut i = q.into_inner();
                let name = self.ident(i.next().unwrap());
                let mut next = i.next().unwrap();
                let optional = next.as_rule() == Rule::optional;
                if optional {
                    next = i.next().unwrap();
                }
                let ty = self.type_expr(next);
                let default = i.next().map(|d| self.expr(d));
                Param { name, ty, default, optional, span }
            })
            .collect()
    }

    fn type_expr(&mut self, p: Pair<Rule>) -> TypeExpr {
        let p = if p.as_rule() == Rule::type_expr { p.into_inner().next().unwrap() } else { p };
        let span = self.span(&p);
        match p.as_rule() {
            Rule::tensor_type => TypeExpr::Tensor(self.tensor_type(p)),
            Rule::tuple_type => {
                TypeExpr::Tuple(p.into_inner().map(|q| self.type_expr(q)).collect(), span)
            }
            Rule::scalar_type => {
                let s = match p.as_str() {
                    "dim" => ScalarType::Dim,
                    "int" => ScalarType::Int,
                    "float" => ScalarType::Float,
                    "bool" => ScalarType::Bool,
                    "init" => ScalarType::Init,
                    _ => ScalarType::DType,
                };
                TypeExpr::Scalar(s, span)
            }
            r => unreachable!("not a type: {r:?}"),
        }
    }

    fn tensor_type(&mut self, p: Pair<Rule>) -> TensorType {
        let span = self.span(&p);
        let mut i = p.into_inner();
        let first = i.next().unwrap();
        let dtype = match first.as_rule() {
            Rule::ident => {
                let name = self.ident(first);
                let span = name.span;
                ElemType::Value(Box::new(Expr { kind: ExprKind::Name(name.name), span }))
            }
            _ => ElemType::Named(
                DTypeName::parse(first.as_str()).expect("grammar only admits known dtypes"),
            ),
        };
        let dims = i
            .map(|d| match d.as_rule() {
                Rule::variadic_dim => DimItem::Variadic(self.ident(d.into_inner().next().unwrap())),
                _ => DimItem::Expr(self.expr(d)),
            })
            .collect();
        TensorType { dtype, dims, span }
    }

    fn block(&mut self, p: Pair<Rule>) -> Block {
        let span = self.span(&p);
        let mut stmts = Vec::new();
        let mut tail = None;
        for q in p.into_inner() {
            let qs = self.span(&q);
            match q.as_rule() {
                Rule::let_stmt => {
                    let mut i = skip_kw(q.into_inner());
                    let pat = self.pattern(i.next().unwrap());
                    let mut ty = None;
                    let mut value = None;
                    for r in i {
                        match r.as_rule() {
                            Rule::type_expr => ty = Some(self.type_expr(r)),
                            _ => value = Some(self.expr(r)),
                        }
                    }
                    stmts.push(Stmt::Let { pat, ty, value: value.unwrap(), span: qs });
                }
                Rule::output_stmt => {
                    let mut i = skip_kw(q.into_inner());
                    let name = self.ident(i.next().unwrap());
                    let value = i.next().map(|v| self.expr(v));
                    stmts.push(Stmt::Output { name, value, span: qs });
                }
                Rule::loss_stmt => {
                    let value = self.expr(skip_kw(q.into_inner()).next().unwrap());
                    stmts.push(Stmt::Loss { value, span: qs });
                }
                Rule::assign_stmt => {
                    let mut i = q.into_inner().skip(1);
                    let field = self.ident(i.next().unwrap());
                    let value = self.expr(i.next().unwrap());
                    stmts.push(Stmt::Assign { field, value, span: qs });
                }
                Rule::expr => tail = Some(Box::new(self.expr(q))),
                _ => {}
            }
        }
        Block { stmts, tail, span }
    }

    fn pattern(&mut self, p: Pair<Rule>) -> Pattern {
        let span = self.span(&p);
        match p.as_rule() {
            Rule::ident => Pattern::Name(self.ident(p)),
            Rule::wildcard => Pattern::Wildcard(span),
            _ => Pattern::Tuple(p.into_inner().map(|q| self.pattern(q)).collect(), span),
        }
    }

    fn expr(&mut self, p: Pair<Rule>) -> Expr {
        self.built(p).expr
    }

    fn built(&mut self, p: Pair<Rule>) -> Built {
        debug_assert_eq!(p.as_rule(), Rule::expr);
        let file = self.file;
        let offset = self.offset;
        let text = self.text;
        let sp = move |p: &Pair<Rule>| {
            let s = p.as_span();
            Span::new(
                file,
                offset + s.start(),
                trim_end(text, offset + s.start(), offset + s.end()),
            )
        };
        // The closures below all need `self`; pest's Pratt API takes them separately, so
        // they share it through a RefCell.
        let this = std::cell::RefCell::new(self);
        let built = pratt()
            .map_primary(|q| this.borrow_mut().primary(q))
            .map_prefix(|op, rhs| {
                let span = sp(&op).to(rhs.expr.span);
                let op = if op.as_rule() == Rule::neg_op { UnOp::Neg } else { UnOp::Not };
                this.borrow_mut().node(ExprKind::Unary(op, Box::new(rhs.expr)), span, rhs.depth)
            })
            .map_postfix(|lhs, op| {
                let span = lhs.expr.span.to(sp(&op));
                let mut b = this.borrow_mut();
                if op.as_rule() == Rule::field_access && !lhs.grouped {
                    b.number_field(&lhs.expr, span);
                }
                let depth = lhs.depth;
                let lhs = Box::new(lhs.expr);
                let kind = match op.as_rule() {
                    Rule::call_args => {
                        let args = op
                            .into_inner()
                            .map(|a| {
                                let mut i = a.into_inner();
                                let first = i.next().unwrap();
                                if first.as_rule() == Rule::ident {
                                    let name = b.ident(first);
                                    Arg { name: Some(name), value: b.expr(i.next().unwrap()) }
                                } else {
                                    Arg { name: None, value: b.expr(first) }
                                }
                            })
                            .collect();
                        ExprKind::Call { callee: lhs, args }
                    }
                    Rule::field_access => {
                        ExprKind::Field(lhs, b.ident(op.into_inner().next().unwrap()))
                    }
                    Rule::index => {
                        ExprKind::Index(lhs, Box::new(b.expr(op.into_inner().next().unwrap())))
                    }
                    _ => ExprKind::Transpose(lhs),
                };
                b.node(kind, span, depth)
            })
            .map_infix(|lhs, op, rhs| {
                let bop = match op.as_rule() {
                    Rule::or_op => BinOp::Or,
                    Rule::and_op => BinOp::And,
                    Rule::eq_op => BinOp::Eq,
                    Rule::ne_op => BinOp::Ne,
                    Rule::lt_op => BinOp::Lt,
                    Rule::le_op => BinOp::Le,
                    Rule::gt_op => BinOp::Gt,
                    Rule::ge_op => BinOp::Ge,
                    Rule::add_op => BinOp::Add,
                    Rule::sub_op => BinOp::Sub,
                    Rule::mul_op => BinOp::Mul,
                    Rule::div_op => BinOp::Div,
                    Rule::rem_op => BinOp::Rem,
                    _ => BinOp::MatMul,
                };
                this.borrow_mut().binary(lhs, bop, rhs)
            })
            .parse(p.into_inner());
        built
    }

    /// `lhs op rhs`: continues `lhs` when it is a chain of `op`'s level not written in
    /// parentheses, so a flat run of operators stays one node however long it is.
    fn binary(&mut self, lhs: Built, op: BinOp, rhs: Built) -> Built {
        let span = lhs.expr.span.to(rhs.expr.span);
        match lhs {
            Built {
                expr: Expr { kind: ExprKind::Binary(first, mut rest), .. },
                depth,
                grouped,
            } if !grouped && rest[0].0.level() == op.level() => {
                let depth = (depth - 1).max(rhs.depth);
                rest.push((op, rhs.expr));
                self.node(ExprKind::Binary(first, rest), span, depth)
            }
            lhs => {
                let depth = lhs.depth.max(rhs.depth);
                self.node(ExprKind::Binary(Box::new(lhs.expr), vec![(op, rhs.expr)]), span, depth)
            }
        }
    }

    /// `1 .5` or `0. 7`: a field of a number literal. It parses (a literal, then `.5`), but the
    /// spaces are all that keep it from being the decimal `1.5`, which `mgnc fmt` would write;
    /// a number has no fields, so this is always a typo for a decimal.
    fn number_field(&mut self, lhs: &Expr, span: Span) {
        if matches!(lhs.kind, ExprKind::Int(_) | ExprKind::Float(_)) {
            let text = &self.text[span.start as usize..span.end as usize];
            let joined: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            self.diags.push(
                Diagnostic::error("E0001", "a number has no fields", span, "a number, then `.`")
                    .with_help(format!("write the decimal number without spaces: `{joined}`")),
            );
        }
    }

    /// Wraps a new node one level above children of depth `child_depth`, or reports the
    /// depth limit once and cuts the tree off there.
    fn node(&mut self, kind: ExprKind, span: Span, child_depth: usize) -> Built {
        if child_depth + 1 > limits::MAX_EXPR_DEPTH {
            if !self.diags.iter().any(|d| d.code == "E0003") {
                self.diags.push(
                    Diagnostic::error(
                        "E0003",
                        format!(
                            "expression is nested more than {} levels deep",
                            limits::MAX_EXPR_DEPTH
                        ),
                        span,
                        "this expression is too deep",
                    )
                    .with_help("bind inner parts of it to names with `let`")
                    .with_note(
                        "brackets, calls, `if`s and each `.name`, `[i]` or `^T` in a row add a \
                         level; operators in a row (`a + b + c …`) do not",
                    ),
                );
            }
            return Built { expr: Expr { kind: ExprKind::Error, span }, depth: 0, grouped: false };
        }
        Built { expr: Expr { kind, span }, depth: child_depth + 1, grouped: false }
    }

    fn primary(&mut self, p: Pair<Rule>) -> Built {
        let span = self.span(&p);
        let leaf = |kind| Built { expr: Expr { kind, span }, depth: 1, grouped: false };
        match p.as_rule() {
            Rule::int => match p.as_str().parse::<i64>() {
                Ok(v) => leaf(ExprKind::Int(v)),
                Err(_) => {
                    self.diags.push(Diagnostic::error(
                        "E0004",
                        "integer literal is too large",
                        span,
                        "does not fit in a 64-bit signed integer",
                    ));
                    leaf(ExprKind::Error)
                }
            },
            Rule::float => match p.as_str().parse::<f64>() {
                Ok(v) if v.is_finite() => leaf(ExprKind::Float(v)),
                _ => {
                    self.diags.push(Diagnostic::error(
                        "E0004",
                        "float literal is too large",
                        span,
                        "does not fit in a 64-bit float",
                    ));
                    leaf(ExprKind::Error)
                }
            },
            Rule::bool_lit => leaf(ExprKind::Bool(p.as_str() == "true")),
            Rule::string => {
                let raw = p.as_str();
                leaf(ExprKind::Str(raw[1..raw.len() - 1].to_string()))
            }
            Rule::dtype_lit => leaf(ExprKind::DType(
                DTypeName::parse(p.as_str()).expect("grammar admits only dtypes"),
            )),
            Rule::self_kw => leaf(ExprKind::SelfRef),
            Rule::ident => leaf(ExprKind::Name(p.as_str().to_string())),
            Rule::paren_or_tuple | Rule::list => {
                let is_list = p.as_rule() == Rule::list;
                let trailing_comma = p.as_str().trim_end_matches(')').trim_end().ends_with(',');
                let parts: Vec<Built> = p.into_inner().map(|q| self.built(q)).collect();
                let depth = parts.iter().map(|b| b.depth).max().unwrap_or(0);
                if !is_list && parts.len() == 1 && !trailing_comma {
                    // Parentheses only group: keep the inner node, widened to the parens.
                    let mut inner = parts.into_iter().next().unwrap();
                    inner.expr.span = span;
                    inner.grouped = true;
                    return inner;
                }
                let items = parts.into_iter().map(|b| b.expr).collect();
                let kind = if is_list { ExprKind::List(items) } else { ExprKind::Tuple(items) };
                self.node(kind, span, depth)
            }
            Rule::if_expr => {
                let mut branches = Vec::new();
                let mut otherwise = None;
                let mut cond: Option<Expr> = None;
                for q in p.into_inner() {
                    match q.as_rule() {
                        Rule::expr => cond = Some(self.expr(q)),
                        Rule::block => {
                            let b = self.block(q);
                            match cond.take() {
                                Some(c) => branches.push((c, b)),
                                None => otherwise = Some(b),
                            }
                        }
                        _ => {}
                    }
                }
                leaf(ExprKind::If { branches, otherwise })
            }
            r => unreachable!("not a primary: {r:?}"),
        }
    }
}

/// Moves `end` back over trailing whitespace, line comments and block comments.
fn trim_end(text: &str, start: usize, mut end: usize) -> usize {
    let b = text.as_bytes();
    loop {
        while end > start && b[end - 1].is_ascii_whitespace() {
            end -= 1;
        }
        let line_start = text[..end].rfind('\n').map(|i| i + 1).unwrap_or(0).max(start);
        if let Some(i) = line_comment_start(&text[line_start..end]) {
            end = line_start + i;
            continue;
        }
        if text[start..end].ends_with("*/") {
            if let Some(i) = text[start..end - 2].rfind("/*") {
                end = start + i;
                continue;
            }
        }
        return end;
    }
}

/// Offset of a `//` comment in one line, ignoring `//` inside strings.
fn line_comment_start(line: &str) -> Option<usize> {
    let mut in_string = false;
    let b = line.as_bytes();
    for i in 0..b.len() {
        match b[i] {
            b'"' => in_string = !in_string,
            b'/' if !in_string && b.get(i + 1) == Some(&b'/') => return Some(i),
            _ => {}
        }
    }
    None
}

/// Drops the leading keyword pairs (`kw_*`) of a rule's children.
fn skip_kw(pairs: Pairs<Rule>) -> impl Iterator<Item = Pair<Rule>> {
    pairs.filter(|p| {
        !matches!(
            p.as_rule(),
            Rule::kw_use
                | Rule::kw_as
                | Rule::kw_const
                | Rule::kw_fn
                | Rule::kw_layer
                | Rule::kw_model
                | Rule::kw_input
                | Rule::kw_output
                | Rule::kw_loss
                | Rule::kw_forward
                | Rule::kw_param
                | Rule::kw_buffer
                | Rule::kw_state
                | Rule::kw_init
                | Rule::kw_repeat
                | Rule::kw_name
                | Rule::kw_let
                | Rule::kw_if
                | Rule::kw_else
        )
    })
}

#[cfg(test)]
mod tests;
