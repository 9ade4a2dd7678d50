//! The evaluator: runs a model's definition at compile time with concrete config values,
//! checking every type and shape as it goes and appending graph nodes for tensor operations.
//!
//! Checking and elaboration are one pass: a shape is known exactly when the op that makes it
//! is added, so each error can name both shapes and where each came from.

use super::builtins;
use super::value::{LayerInst, Value};
use crate::front::{did_you_mean, Binding, ModId, Program};
use crate::graph::{fmt_type, BinaryOp, Graph, InitSpec, Node, NodeId, Op, ParamInfo, UnaryOp};
use crate::source::Origin;
use mgn_ir::shape;
use mgn_ir::DType;
use mgn_syntax::ast::*;
use mgn_syntax::{Diagnostic, Span};
use std::collections::HashMap;
use std::rc::Rc;

pub type R<T> = Result<T, Diagnostic>;

/// Deepest nesting of layer, fn and const evaluation.
const MAX_CALL_DEPTH: usize = 96;
/// Most nodes one model may elaborate to.
const MAX_NODES: usize = 2_000_000;
/// Largest element count of one tensor (2^40).
const MAX_NUMEL: usize = 1 << 40;
/// Largest `repeat` count.
const MAX_REPEAT: i64 = 10_000;

pub struct Frame {
    pub module: ModId,
    /// Innermost last: `let`s, parameters, pattern-bound dims, config and fields.
    pub locals: Vec<(String, Value)>,
    /// The enclosing layer's fields (for `self.x`) and its type name.
    pub fields: Option<(String, Vec<(String, Value)>)>,
    /// True while evaluating a model's forward: `output` and `loss` record into the graph.
    pub model: bool,
}

/// An evaluated call argument.
#[derive(Clone)]
pub struct ArgVal {
    pub name: Option<Ident>,
    pub value: Value,
    pub span: Span,
}

pub struct Evaluator<'p> {
    pub prog: &'p Program,
    pub graph: Graph,
    frames: Vec<Frame>,
    /// Spans of the calls being evaluated, for `Node::user_span`.
    call_sites: Vec<Span>,
    depth: usize,
    consts: HashMap<(ModId, usize), Value>,
    /// Set while a field initializer runs: a layer call there instantiates under this path.
    ctor_path: Option<String>,
    is_std: Vec<bool>,
    /// Where each output was declared, for "declared twice".
    output_spans: Vec<(String, Span)>,
    /// What elaboration learned about source spans, for the language server.
    pub facts: Vec<Fact>,
}

/// A fact about a span of source, recorded while elaborating (hover, inlay hints).
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    pub span: Span,
    pub kind: FactKind,
    /// `f32[8, 64, 128]`, or a fuller description for parameters and layers.
    pub text: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactKind {
    /// The value of an expression.
    Expr,
    /// The name bound by a `let` (inlay hints show these).
    Let,
    /// A parameter or buffer field: shape and checkpoint name.
    Param,
    /// A sub-layer field: the layer and its arguments.
    Layer,
    /// A parameter of a `fn`, `forward` or layer config: what it was bound to in a call.
    Arg,
}

impl<'p> Evaluator<'p> {
    pub fn new(prog: &'p Program) -> Evaluator<'p> {
        let is_std =
            prog.sources.files().map(|(_, f)| matches!(f.origin, Origin::Std(_))).collect();
        Evaluator {
            prog,
            graph: Graph::default(),
            frames: Vec::new(),
            call_sites: Vec::new(),
            depth: 0,
            consts: HashMap::new(),
            ctor_path: None,
            is_std,
            output_spans: Vec::new(),
            facts: Vec::new(),
        }
    }

    // ---- frames and nodes ---------------------------------------------------------------

    pub fn frame(&mut self) -> &mut Frame {
        self.frames.last_mut().expect("evaluation always runs in a frame")
    }

    /// Runs `f` in a new frame, popping it again whatever `f` returns.
    pub fn in_frame<T>(
        &mut self,
        frame: Frame,
        call_site: Span,
        f: impl FnOnce(&mut Self) -> R<T>,
    ) -> R<T> {
        if self.depth >= MAX_CALL_DEPTH {
            return Err(Diagnostic::error(
                "E0601",
                format!("calls are nested more than {MAX_CALL_DEPTH} deep"),
                call_site,
                "this call is too deep",
            )
            .with_help("is a `fn`, `const` or layer defined in terms of itself?"));
        }
        self.depth += 1;
        self.frames.push(frame);
        self.call_sites.push(call_site);
        let r = f(self);
        self.call_sites.pop();
        self.frames.pop();
        self.depth -= 1;
        r
    }

    pub fn bind(&mut self, name: &str, v: Value) {
        self.frame().locals.push((name.to_string(), v));
    }

    fn user_span(&self, span: Span) -> Span {
        std::iter::once(&span)
            .chain(self.call_sites.iter().rev())
            .find(|s| !self.is_std.get(s.file.0 as usize).copied().unwrap_or(false))
            .copied()
            .unwrap_or(span)
    }

    /// Appends a node after checking the global limits.
    pub fn add(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        dtype: DType,
        shape: Vec<usize>,
        span: Span,
    ) -> R<NodeId> {
        if self.graph.nodes.len() >= MAX_NODES {
            return Err(Diagnostic::error(
                "E0601",
                format!("the model has more than {MAX_NODES} operations"),
                span,
                "limit reached here",
            )
            .with_help("check `repeat` counts and model arguments"));
        }
        match shape::checked_numel(&shape) {
            Some(n) if n <= MAX_NUMEL => {}
            _ => {
                return Err(Diagnostic::error(
                    "E0301",
                    format!("tensor {} has more than 2^40 elements", fmt_type(dtype, &shape)),
                    span,
                    "this tensor is too large",
                ))
            }
        }
        let user_span = self.user_span(span);
        self.facts.push(Fact { span, kind: FactKind::Expr, text: fmt_type(dtype, &shape) });
        self.graph.nodes.push(Node { op, inputs, dtype, shape, span, user_span });
        Ok(NodeId(self.graph.nodes.len() as u32 - 1))
    }

    pub fn ty(&self, id: NodeId) -> (DType, &[usize]) {
        let n = self.graph.node(id);
        (n.dtype, &n.shape)
    }

    pub fn type_str(&self, id: NodeId) -> String {
        let (d, s) = self.ty(id);
        fmt_type(d, s)
    }

    /// "a tensor f32[8, 64]" or "an integer (3)".
    pub fn describe(&self, v: &Value) -> String {
        match v {
            Value::Tensor(id) => format!("a tensor {}", self.type_str(*id)),
            Value::Int(i) => format!("an integer ({i})"),
            Value::Float(f) => format!("a float ({f:?})"),
            Value::Bool(b) => format!("a bool ({b})"),
            Value::Layer(l) => format!("a layer `{}`", l.type_name),
            Value::Item(m, i) => match self.prog.item(*m, *i) {
                Item::Fn(f) => format!("the function `{}`", f.name.name),
                Item::Layer(l) => format!("the layer type `{}`", l.name.name),
                Item::Const(c) => format!("the constant `{}`", c.name.name),
                Item::Use(_) => "an import".into(),
            },
            Value::Builtin(b) => format!("the builtin `{}`", b.name),
            other => other.kind().to_string(),
        }
    }

    /// A secondary label at the place a tensor was made, unless that is `here` already.
    pub fn origin_label(&self, d: Diagnostic, v: &Value, here: Span, what: &str) -> Diagnostic {
        let Value::Tensor(id) = v else { return d };
        let n = self.graph.node(*id);
        let origin = match n.op {
            Op::Param { index } => self.graph.params[index].span,
            _ => n.user_span,
        };
        let overlaps =
            origin.file == here.file && origin.start < here.end && here.start < origin.end;
        if overlaps || origin == Span::default() {
            return d;
        }
        let verb = if matches!(n.op, Op::Input { .. } | Op::Param { .. }) {
            "declared"
        } else {
            "produced"
        };
        d.with_label(origin, format!("{what} {verb} here as {}", self.type_str(*id)))
    }

    // ---- names ---------------------------------------------------------------------------

    pub fn lookup(&mut self, name: &str, span: Span) -> R<Value> {
        let f = self.frames.last().expect("in a frame");
        if let Some((_, v)) = f.locals.iter().rev().find(|(n, _)| n == name) {
            return Ok(v.clone());
        }
        match self.prog.module(f.module).scope.get(name).copied() {
            Some(Binding::Item { module, index, .. }) => self.item_value(module, index, span),
            Some(Binding::Module { module, .. }) => Ok(Value::Module(module)),
            None if name == "bool" => Ok(Value::DType(DType::Bool)),
            None => match builtins::lookup(name) {
                Some(b) => Ok(Value::Builtin(b)),
                None => {
                    let f = self.frames.last().expect("in a frame");
                    let mut candidates: Vec<&str> =
                        f.locals.iter().map(|(n, _)| n.as_str()).collect();
                    candidates.extend(self.prog.module(f.module).scope.keys().map(String::as_str));
                    for b in builtins::names() {
                        candidates.push(b);
                    }
                    let mut d = Diagnostic::error(
                        "E0101",
                        format!("cannot find `{name}` in this scope"),
                        span,
                        "not found",
                    );
                    if let Some(h) = did_you_mean(name, candidates) {
                        d = d.with_help(h);
                    }
                    Err(d)
                }
            },
        }
    }

    fn item_value(&mut self, module: ModId, index: usize, span: Span) -> R<Value> {
        let Item::Const(c) = self.prog.item(module, index) else {
            return Ok(Value::Item(module, index));
        };
        if let Some(v) = self.consts.get(&(module, index)) {
            return Ok(v.clone());
        }
        let frame = Frame { module, locals: Vec::new(), fields: None, model: false };
        let v = self.in_frame(frame, span, |ev| {
            let v = ev.eval(&c.value)?;
            match &c.ty {
                Some(t) => {
                    ev.check_type(t, v, c.value.span, &format!("constant `{}`", c.name.name))
                }
                None => Ok(v),
            }
        })?;
        self.consts.insert((module, index), v.clone());
        Ok(v)
    }

    // ---- expressions ---------------------------------------------------------------------

    pub fn eval(&mut self, e: &Expr) -> R<Value> {
        match &e.kind {
            ExprKind::Int(i) => Ok(Value::Int(*i)),
            ExprKind::Float(f) => Ok(Value::Float(*f)),
            ExprKind::Bool(b) => Ok(Value::Bool(*b)),
            ExprKind::Str(s) => Ok(Value::Str(s.as_str().into())),
            ExprKind::DType(d) => Ok(Value::DType(dtype_of(*d))),
            ExprKind::Name(n) => self.lookup(n, e.span),
            ExprKind::SelfRef => Err(Diagnostic::error(
                "E0101",
                "`self` must be followed by a field name",
                e.span,
                "expected `self.field`",
            )),
            ExprKind::Error => Err(Diagnostic::error(
                "E0001",
                "this expression could not be parsed",
                e.span,
                "invalid",
            )),
            ExprKind::Field(base, field) => self.field(base, field),
            ExprKind::Index(base, index) => {
                let b = self.eval(base)?;
                let i = self.eval(index)?;
                self.index(b, base.span, i, index.span)
            }
            ExprKind::Unary(op, a) => {
                let v = self.eval(a)?;
                match (op, v) {
                    (UnOp::Neg, Value::Int(i)) => {
                        i.checked_neg().map(Value::Int).ok_or_else(|| overflow(e.span))
                    }
                    (UnOp::Neg, Value::Float(f)) => Ok(Value::Float(-f)),
                    (UnOp::Neg, Value::Tensor(t)) => {
                        let (d, s) = self.ty(t);
                        let s = s.to_vec();
                        Ok(Value::Tensor(self.add(
                            Op::Unary(UnaryOp::Neg),
                            vec![t],
                            d,
                            s,
                            e.span,
                        )?))
                    }
                    (UnOp::Not, Value::Bool(b)) => Ok(Value::Bool(!b)),
                    (op, v) => Err(Diagnostic::error(
                        "E0201",
                        format!(
                            "cannot apply `{}` to {}",
                            if *op == UnOp::Neg { "-" } else { "!" },
                            self.describe(&v)
                        ),
                        a.span,
                        "this operand",
                    )),
                }
            }
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
                let l = self.expect_bool(a)?;
                if (*op == BinOp::And && !l) || (*op == BinOp::Or && l) {
                    return Ok(Value::Bool(l));
                }
                Ok(Value::Bool(self.expect_bool(b)?))
            }
            ExprKind::Binary(op, a, b) => {
                let l = self.eval(a)?;
                let r = self.eval(b)?;
                self.binary(*op, l, a.span, r, b.span, e.span)
            }
            ExprKind::Transpose(a) => {
                let v = self.eval(a)?;
                let Value::Tensor(t) = v else {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!("`^T` needs a tensor, found {}", self.describe(&v)),
                        a.span,
                        "not a tensor",
                    ));
                };
                let rank = self.ty(t).1.len();
                if rank < 2 {
                    let d = Diagnostic::error(
                        "E0206",
                        format!("`^T` needs at least 2 axes, found {}", self.type_str(t)),
                        e.span,
                        "cannot transpose",
                    )
                    .with_help(
                        "a 1-D tensor has nothing to swap; reshape it to [1, n] or [n, 1] first",
                    );
                    return Err(self.origin_label(d, &v, a.span, "it was"));
                }
                Ok(Value::Tensor(builtins::swap_axes(self, t, rank - 2, rank - 1, e.span)?))
            }
            ExprKind::Call { callee, args } => self.call_expr(callee, args, e.span),
            ExprKind::Tuple(xs) => {
                Ok(Value::Tuple(Rc::new(xs.iter().map(|x| self.eval(x)).collect::<R<_>>()?)))
            }
            ExprKind::List(xs) => {
                Ok(Value::List(Rc::new(xs.iter().map(|x| self.eval(x)).collect::<R<_>>()?)))
            }
            ExprKind::If { branches, otherwise } => {
                for (c, b) in branches {
                    if self.expect_bool(c)? {
                        return self.eval_block(b);
                    }
                }
                match otherwise {
                    Some(b) => self.eval_block(b),
                    None => Ok(Value::unit()),
                }
            }
        }
    }

    fn expect_bool(&mut self, e: &Expr) -> R<bool> {
        match self.eval(e)? {
            Value::Bool(b) => Ok(b),
            v => Err(Diagnostic::error(
                "E0201",
                format!("expected a bool, found {}", self.describe(&v)),
                e.span,
                "not a bool",
            )
            .with_help("conditions are compile-time: compare config values, e.g. `i % 2 == 1`")),
        }
    }

    fn field(&mut self, base: &Expr, field: &Ident) -> R<Value> {
        if let ExprKind::SelfRef = base.kind {
            let f = self.frames.last().expect("in a frame");
            let Some((layer, fields)) = &f.fields else {
                return Err(Diagnostic::error(
                    "E0101",
                    "`self` is only available inside a layer or model",
                    base.span,
                    "no enclosing layer",
                ));
            };
            return match fields.iter().find(|(n, _)| *n == field.name) {
                Some((_, v)) => Ok(v.clone()),
                None => {
                    let mut d = Diagnostic::error(
                        "E0101",
                        format!("`{layer}` has no field `{}`", field.name),
                        field.span,
                        "unknown field",
                    );
                    if let Some(h) =
                        did_you_mean(&field.name, fields.iter().map(|(n, _)| n.as_str()))
                    {
                        d = d.with_help(h);
                    }
                    Err(d)
                }
            };
        }
        let b = self.eval(base)?;
        match &b {
            Value::Module(m) => {
                let module = self.prog.module(*m);
                match module.item_index(&field.name) {
                    Some(i) => self.item_value(*m, i, field.span),
                    None => {
                        let mut d = Diagnostic::error(
                            "E0103",
                            format!("`{}` has no item named `{}`", module.name, field.name),
                            field.span,
                            "not found in this module",
                        );
                        if let Some(h) = did_you_mean(&field.name, module.item_names()) {
                            d = d.with_help(h);
                        }
                        Err(d)
                    }
                }
            }
            Value::Layer(inst) => match inst.field(&field.name) {
                Some(v) => Ok(v.clone()),
                None => {
                    let mut d = Diagnostic::error(
                        "E0101",
                        format!("layer `{}` has no field `{}`", inst.type_name, field.name),
                        field.span,
                        "unknown field",
                    );
                    if let Some(h) =
                        did_you_mean(&field.name, inst.fields.iter().map(|(n, _)| n.as_str()))
                    {
                        d = d.with_help(h);
                    }
                    Err(d)
                }
            },
            Value::Tuple(items) => match field.name.parse::<usize>() {
                Ok(i) if i < items.len() => Ok(items[i].clone()),
                _ => Err(Diagnostic::error(
                    "E0201",
                    format!("a tuple of {} has no element `{}`", items.len(), field.name),
                    field.span,
                    "no such element",
                )),
            },
            other => Err(Diagnostic::error(
                "E0201",
                format!("{} has no field `{}`", self.describe(other), field.name),
                field.span,
                "no such field",
            )),
        }
    }

    fn index(&mut self, base: Value, base_span: Span, index: Value, index_span: Span) -> R<Value> {
        let Value::Int(i) = index else {
            return Err(Diagnostic::error(
                "E0201",
                format!("an index must be an integer, found {}", self.describe(&index)),
                index_span,
                "not an integer",
            ));
        };
        let (len, what) = match &base {
            Value::Repeated(l) => (l.len(), "repeated layer"),
            Value::Tuple(t) => (t.len(), "tuple"),
            Value::List(t) => (t.len(), "list"),
            Value::Tensor(_) => {
                return Err(Diagnostic::error(
                    "E0201",
                    "tensors cannot be indexed with `[]`",
                    base_span,
                    "a tensor",
                )
                .with_help("use `slice(x, axis, start, end)` or `gather(x, index, axis)`"))
            }
            other => {
                return Err(Diagnostic::error(
                    "E0201",
                    format!("{} cannot be indexed", self.describe(other)),
                    base_span,
                    "not indexable",
                ))
            }
        };
        let Some(k) = shape::axis(i, len) else {
            return Err(Diagnostic::error(
                "E0207",
                format!("index {i} is out of range for a {what} of length {len}"),
                index_span,
                "out of range",
            ));
        };
        Ok(match base {
            Value::Repeated(l) => Value::Layer(l[k].clone()),
            Value::Tuple(t) | Value::List(t) => t[k].clone(),
            _ => unreachable!("checked above"),
        })
    }

    fn binary(
        &mut self,
        op: BinOp,
        l: Value,
        ls: Span,
        r: Value,
        rs: Span,
        span: Span,
    ) -> R<Value> {
        use Value::*;
        match (&l, &r) {
            (Int(a), Int(b)) => return int_binary(op, *a, *b, ls, rs, span),
            (Int(_) | Float(_), Int(_) | Float(_)) => {
                let (a, b) = (as_f64(&l), as_f64(&r));
                return finite(
                    span,
                    match op {
                        BinOp::Add => Float(a + b),
                        BinOp::Sub => Float(a - b),
                        BinOp::Mul => Float(a * b),
                        BinOp::Div => Float(a / b),
                        BinOp::Rem => Float(a % b),
                        BinOp::Eq => Bool(a == b),
                        BinOp::Ne => Bool(a != b),
                        BinOp::Lt => Bool(a < b),
                        BinOp::Le => Bool(a <= b),
                        BinOp::Gt => Bool(a > b),
                        BinOp::Ge => Bool(a >= b),
                        _ => return Err(self.bad_operands(op, &l, &r, span)),
                    },
                );
            }
            (Bool(a), Bool(b)) if matches!(op, BinOp::Eq | BinOp::Ne) => {
                return Ok(Bool((a == b) == (op == BinOp::Eq)))
            }
            (Str(a), Str(b)) if matches!(op, BinOp::Eq | BinOp::Ne) => {
                return Ok(Bool((a == b) == (op == BinOp::Eq)))
            }
            (DType(a), DType(b)) if matches!(op, BinOp::Eq | BinOp::Ne) => {
                return Ok(Bool((a == b) == (op == BinOp::Eq)))
            }
            _ => {}
        }
        let tensor_side = matches!(l, Tensor(_)) || matches!(r, Tensor(_));
        if !tensor_side {
            return Err(self.bad_operands(op, &l, &r, span));
        }
        if op == BinOp::MatMul {
            return builtins::matmul(self, (&l, ls), (&r, rs), span).map(Tensor);
        }
        let bop = match op {
            BinOp::Add => BinaryOp::Add,
            BinOp::Sub => BinaryOp::Sub,
            BinOp::Mul => BinaryOp::Mul,
            BinOp::Div => BinaryOp::Div,
            _ => {
                return Err(Diagnostic::error(
                    "E0201",
                    format!("`{}` is not defined on tensors", op.symbol()),
                    span,
                    "here",
                )
                .with_help(
                    "tensors support + - * / and @; comparisons work on compile-time values",
                ))
            }
        };
        builtins::elementwise(self, bop, (&l, ls), (&r, rs), span).map(Tensor)
    }

    fn bad_operands(&self, op: BinOp, l: &Value, r: &Value, span: Span) -> Diagnostic {
        Diagnostic::error(
            "E0201",
            format!(
                "`{}` cannot combine {} and {}",
                op.symbol(),
                self.describe(l),
                self.describe(r)
            ),
            span,
            "invalid operands",
        )
    }

    // ---- calls ---------------------------------------------------------------------------

    fn call_expr(&mut self, callee: &Expr, args: &[Arg], span: Span) -> R<Value> {
        let f = self.eval(callee)?;
        // A layer type called while a field is being initialized becomes that field.
        let ctor_path = match &f {
            Value::Item(m, i) if matches!(self.prog.item(*m, *i), Item::Layer(_)) => {
                self.ctor_path.take()
            }
            _ => None,
        };
        let mut vals = Vec::with_capacity(args.len());
        for a in args {
            vals.push(ArgVal {
                name: a.name.clone(),
                value: self.eval(&a.value)?,
                span: a.value.span,
            });
        }
        self.call(f, callee.span, vals, span, ctor_path)
    }

    pub fn call(
        &mut self,
        f: Value,
        callee_span: Span,
        args: Vec<ArgVal>,
        span: Span,
        ctor_path: Option<String>,
    ) -> R<Value> {
        match f {
            Value::Builtin(b) => builtins::call(self, b, args, span),
            Value::Item(m, i) => match self.prog.item(m, i) {
                Item::Fn(func) => self.call_fn(m, func, args, span),
                Item::Layer(l) => match ctor_path {
                    Some(path) if l.kind == LayerKind::Layer => {
                        Ok(Value::Layer(self.instantiate(m, i, args, span, path)?))
                    }
                    Some(_) => Err(Diagnostic::error(
                        "E0108",
                        format!("`{}` is a model and cannot be used as a layer", l.name.name),
                        callee_span,
                        "a model",
                    )
                    .with_help("declare it with `layer` to reuse it inside another model")),
                    None => Err(Diagnostic::error(
                        "E0108",
                        format!("layer `{}` is created here, outside a field", l.name.name),
                        span,
                        "layers are created as fields",
                    )
                    .with_help(format!(
                        "declare it as a field, `name = {}(...)`, and call `name(x)` in forward",
                        l.name.name
                    ))),
                },
                _ => Err(Diagnostic::error(
                    "E0201",
                    format!("{} is not callable", self.describe(&f)),
                    callee_span,
                    "not a function or layer",
                )),
            },
            Value::Layer(inst) => self.call_forward(inst, args, span),
            Value::Repeated(list) => {
                if let Some(first) = args.first() {
                    if first.name.is_some() {
                        return Err(Diagnostic::error("E0401", "the first argument of a repeated layer must be positional", first.span, "named")
                            .with_help("each copy's result is passed on as the next copy's first argument: write `blocks(x, ...)`"));
                    }
                }
                let mut args = args;
                for inst in list.iter() {
                    let out = self.call_forward(inst.clone(), args.clone(), span)?;
                    if !matches!(out, Value::Tensor(_)) {
                        return Err(Diagnostic::error("E0201", format!("a repeated `{}` must return one tensor to feed the next copy, found {}", inst.type_name, self.describe(&out)), span, "in this call"));
                    }
                    let ArgVal { name, span: s0, .. } = args.remove(0);
                    args.insert(0, ArgVal { name, value: out, span: s0 });
                }
                Ok(args.into_iter().next().map(|a| a.value).unwrap_or_else(Value::unit))
            }
            other => Err(Diagnostic::error(
                "E0201",
                format!("{} is not callable", self.describe(&other)),
                callee_span,
                "not a function or layer",
            )),
        }
    }

    fn call_fn(
        &mut self,
        module: ModId,
        func: &'p FnItem,
        args: Vec<ArgVal>,
        span: Span,
    ) -> R<Value> {
        let frame = Frame { module, locals: Vec::new(), fields: None, model: false };
        let what = format!("`{}`", func.name.name);
        // A function never creates layers, even when called from a field initializer.
        let saved_ctor = self.ctor_path.take();
        let r = self.in_frame(frame, span, |ev| {
            ev.enter_params(&func.params, args, &what, func.name.span, span)?;
            let v = ev.eval_block(&func.body)?;
            match &func.ret {
                Some(t) => ev.check_return(t, v, &func.body, &what),
                None => Ok(v),
            }
        });
        self.ctor_path = saved_ctor;
        r
    }

    fn call_forward(&mut self, inst: Rc<LayerInst>, args: Vec<ArgVal>, span: Span) -> R<Value> {
        let Item::Layer(l) = self.prog.item(inst.module, inst.item) else {
            unreachable!("instances come from layer items")
        };
        let Some(fwd) = l.forward.first() else {
            return Err(Diagnostic::error(
                "E0108",
                format!("layer `{}` has no `forward` and cannot be called", l.name.name),
                span,
                "called here",
            )
            .with_label(l.name.span, "defined here"));
        };
        let frame = Frame {
            module: inst.module,
            locals: layer_locals(&inst),
            fields: Some((inst.type_name.clone(), inst.fields.clone())),
            model: false,
        };
        let what = format!("`{}`", l.name.name);
        self.in_frame(frame, span, |ev| {
            ev.enter_params(&fwd.params, args, &what, l.name.span, span)?;
            let v = ev.eval_block(&fwd.body)?;
            match &fwd.ret {
                Some(t) => ev.check_return(t, v, &fwd.body, &what),
                None => Ok(v),
            }
        })
    }

    /// Binds call arguments to declared parameters in the current (callee) frame: positional,
    /// then named, then defaults (evaluated here, so they can use earlier parameters).
    pub fn enter_params(
        &mut self,
        params: &'p [Param],
        args: Vec<ArgVal>,
        what: &str,
        def: Span,
        call: Span,
    ) -> R<()> {
        let mut slots: Vec<Option<ArgVal>> = params.iter().map(|_| None).collect();
        let mut positional = 0;
        let mut named_seen = false;
        for a in args {
            match &a.name {
                None if named_seen => {
                    return Err(Diagnostic::error(
                        "E0401",
                        "a positional argument follows a named one",
                        a.span,
                        "positional argument",
                    )
                    .with_help("give positional arguments first, then named ones"));
                }
                None => {
                    if positional >= params.len() {
                        return Err(Diagnostic::error(
                            "E0401",
                            format!(
                                "{what} takes {} argument{} but more were given",
                                params.len(),
                                plural(params.len())
                            ),
                            a.span,
                            "unexpected argument",
                        )
                        .with_label(def, "defined here"));
                    }
                    slots[positional] = Some(a);
                    positional += 1;
                }
                Some(n) => {
                    named_seen = true;
                    let Some(i) = params.iter().position(|p| p.name.name == n.name) else {
                        let mut d = Diagnostic::error(
                            "E0401",
                            format!("{what} has no parameter named `{}`", n.name),
                            n.span,
                            "unknown parameter",
                        )
                        .with_label(def, "defined here");
                        d = match did_you_mean(&n.name, params.iter().map(|p| p.name.name.as_str()))
                        {
                            Some(h) => d.with_help(h),
                            None => d.with_note(format!(
                                "its parameters are: {}",
                                params
                                    .iter()
                                    .map(|p| p.name.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )),
                        };
                        return Err(d);
                    };
                    if slots[i].is_some() {
                        return Err(Diagnostic::error(
                            "E0401",
                            format!("argument `{}` is given twice", n.name),
                            n.span,
                            "given again here",
                        ));
                    }
                    slots[i] = Some(a);
                }
            }
        }
        for (p, slot) in params.iter().zip(slots) {
            let (value, span) = match slot {
                Some(a) => (a.value, a.span),
                None => match &p.default {
                    Some(d) => (self.eval(d)?, d.span),
                    None => {
                        return Err(Diagnostic::error(
                            "E0401",
                            format!("missing argument `{}` in this call to {what}", p.name.name),
                            call,
                            format!("`{}` not given", p.name.name),
                        )
                        .with_label(p.span, "declared here without a default"))
                    }
                },
            };
            let value = self.check_param(p, value, span, what)?;
            // Hover on a parameter shows what it was bound to in this instantiation.
            let text = match &value {
                Value::Tensor(t) => self.type_str(*t),
                other => self.describe(other),
            };
            self.facts.push(Fact { span: p.name.span, kind: FactKind::Arg, text });
            self.bind(&p.name.name, value);
        }
        Ok(())
    }

    fn check_param(&mut self, p: &Param, v: Value, span: Span, what: &str) -> R<Value> {
        self.check_type(&p.ty, v, span, &format!("argument `{}` of {what}", p.name.name))
    }

    /// Checks (and where needed converts) a value against a declared type; tensor types are
    /// patterns that bind new dim names in the current frame.
    pub fn check_type(&mut self, t: &TypeExpr, v: Value, span: Span, what: &str) -> R<Value> {
        match t {
            TypeExpr::Scalar(s, tspan) => {
                let ok = match (s, &v) {
                    (ScalarType::Dim, Value::Int(i)) => {
                        if *i < 1 {
                            return Err(Diagnostic::error(
                                "E0301",
                                format!("{what} must be a positive dim, found {i}"),
                                span,
                                "not positive",
                            )
                            .with_label(*tspan, "declared as `dim` here"));
                        }
                        Some(v.clone())
                    }
                    (ScalarType::Int, Value::Int(_))
                    | (ScalarType::Bool, Value::Bool(_))
                    | (ScalarType::DType, Value::DType(_)) => Some(v.clone()),
                    (ScalarType::Float, Value::Int(i)) => Some(Value::Float(*i as f64)),
                    (ScalarType::Float, Value::Float(_)) | (ScalarType::Init, Value::Init(_)) => {
                        Some(v.clone())
                    }
                    (ScalarType::Init, Value::Builtin(_) | Value::Item(..)) => {
                        Some(self.as_init(v.clone(), span)?)
                    }
                    _ => None,
                };
                ok.ok_or_else(|| {
                    let mut d = Diagnostic::error(
                        "E0201",
                        format!("{what} must be {}, found {}", scalar_desc(*s), self.describe(&v)),
                        span,
                        format!("expected {}", s.name()),
                    )
                    .with_label(*tspan, "declared here");
                    if *s == ScalarType::Dim && matches!(v, Value::Float(_)) {
                        d = d.with_help("dims are whole numbers; drop the fractional part");
                    }
                    d
                })
            }
            TypeExpr::Tensor(tt) => {
                let Value::Tensor(id) = v else {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!("{what} must be a tensor, found {}", self.describe(&v)),
                        span,
                        "expected a tensor",
                    )
                    .with_label(tt.span, "declared here"));
                };
                self.match_tensor(tt, id, span, what)?;
                Ok(v)
            }
            TypeExpr::Tuple(ts, tspan) => {
                let Value::Tuple(items) = &v else {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!(
                            "{what} must be a tuple of {}, found {}",
                            ts.len(),
                            self.describe(&v)
                        ),
                        span,
                        "expected a tuple",
                    )
                    .with_label(*tspan, "declared here"));
                };
                if items.len() != ts.len() {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!(
                            "{what} must be a tuple of {}, found a tuple of {}",
                            ts.len(),
                            items.len()
                        ),
                        span,
                        "wrong length",
                    )
                    .with_label(*tspan, "declared here"));
                }
                let items = items.clone();
                let mut out = Vec::new();
                for (i, (t, item)) in ts.iter().zip(items.iter()).enumerate() {
                    out.push(self.check_type(
                        t,
                        item.clone(),
                        span,
                        &format!("element {i} of {what}"),
                    )?);
                }
                Ok(Value::Tuple(Rc::new(out)))
            }
        }
    }

    fn check_return(&mut self, t: &TypeExpr, v: Value, body: &Block, what: &str) -> R<Value> {
        let span = body.tail.as_ref().map(|e| e.span).unwrap_or(body.span);
        self.check_type(t, v, span, &format!("the result of {what}"))
    }

    /// Matches a tensor against a type pattern such as `f32[..B, T, 3 * d]`.
    pub fn match_tensor(&mut self, t: &TensorType, id: NodeId, span: Span, what: &str) -> R<()> {
        let (dtype, shape) = self.ty(id);
        let shape = shape.to_vec();
        let want = dtype_of(t.dtype);
        if dtype != want {
            let d = Diagnostic::error(
                "E0202",
                format!("{what} must be {want}, found {}", fmt_type(dtype, &shape)),
                span,
                format!("this is {}", fmt_type(dtype, &shape)),
            )
            .with_label(t.span, format!("{want} expected here"));
            let d = if dtype.is_float() != want.is_float() {
                d.with_help(format!("convert it with `cast(x, {want})`"))
            } else {
                d
            };
            return Err(d);
        }
        let variadics: Vec<usize> = t
            .dims
            .iter()
            .enumerate()
            .filter(|(_, d)| matches!(d, DimItem::Variadic(_)))
            .map(|(i, _)| i)
            .collect();
        if variadics.len() > 1 {
            return Err(Diagnostic::error(
                "E0206",
                "a tensor type can have only one `..` group",
                t.span,
                "two `..` groups",
            ));
        }
        let fixed = t.dims.len() - variadics.len();
        let rank_ok =
            if variadics.is_empty() { shape.len() == fixed } else { shape.len() >= fixed };
        let mismatch = |ev: &Evaluator, expected: String| {
            let d = Diagnostic::error(
                "E0205",
                format!("{what} has shape {}, expected {expected}", fmt_type(dtype, &shape)),
                span,
                format!("this is {}", fmt_type(dtype, &shape)),
            )
            .with_label(t.span, format!("expected {expected}{}", ev.bound_note(t)));
            ev.origin_label(d, &Value::Tensor(id), span, "it was")
        };
        if !rank_ok {
            let expected = self.pattern_str(t);
            let mut d = mismatch(self, expected);
            d = d.with_note(format!(
                "expected {} ax{}, found {}",
                if variadics.is_empty() { fixed.to_string() } else { format!("at least {fixed}") },
                if fixed == 1 { "is" } else { "es" },
                shape.len()
            ));
            return Err(d);
        }
        let group_len = shape.len() - fixed;
        // Position in `shape` of each pattern item.
        let mut positions = Vec::new();
        let mut at = 0;
        for d in &t.dims {
            positions.push(at);
            at += if matches!(d, DimItem::Variadic(_)) { group_len } else { 1 };
        }
        // Bare names bind (or compare) first, so `[B, T, B * T]` works in any order.
        let mut deferred = Vec::new();
        for (d, &pos) in t.dims.iter().zip(&positions) {
            match d {
                DimItem::Variadic(id) => {
                    let got: Vec<Value> =
                        shape[pos..pos + group_len].iter().map(|&x| Value::Int(x as i64)).collect();
                    match self.local(&id.name) {
                        None => self.bind(&id.name, Value::List(Rc::new(got))),
                        Some(Value::List(prev)) => {
                            let same = prev.len() == got.len() && prev.iter().zip(&got).all(|(a, b)| matches!((a, b), (Value::Int(x), Value::Int(y)) if x == y));
                            if !same {
                                let expected = self.pattern_str(t);
                                return Err(mismatch(self, expected).with_note(format!(
                                    "`..{}` was bound to a different group of axes earlier",
                                    id.name
                                )));
                            }
                        }
                        Some(_) => {
                            return Err(Diagnostic::error(
                                "E0206",
                                format!("`..{}` is already bound to a single value", id.name),
                                id.span,
                                "not a group of axes",
                            ))
                        }
                    }
                }
                DimItem::Expr(Expr { kind: ExprKind::Name(n), span: nspan })
                    if self.try_lookup(n).is_none() =>
                {
                    let _ = nspan;
                    self.bind(n, Value::Int(shape[pos] as i64));
                }
                DimItem::Expr(e) => deferred.push((e, pos)),
            }
        }
        for (e, pos) in deferred {
            let want = match self.eval(e) {
                Ok(Value::Int(i)) => i,
                Ok(v) => {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!("a dimension must be an integer, found {}", self.describe(&v)),
                        e.span,
                        "not an integer",
                    ))
                }
                Err(err) if err.code == "E0101" => {
                    return Err(Diagnostic::error("E0205", format!("cannot infer the dims in `{}` from {what}", self.prog.sources.snippet(e.span)), e.span, "unknown size")
                        .with_help("give each unknown dim its own axis (`[B, n]`) or pass it as a `dim` parameter"));
                }
                Err(err) => return Err(err),
            };
            if want != shape[pos] as i64 {
                let expected = self.pattern_str(t);
                return Err(mismatch(self, expected)
                    .with_note(format!("axis {pos}: expected {want}, found {}", shape[pos])));
            }
        }
        Ok(())
    }

    /// Shape pattern with known dims filled in: `f32[8, T, 128]`.
    fn pattern_str(&mut self, t: &TensorType) -> String {
        let dims: Vec<String> = t
            .dims
            .iter()
            .map(|d| match d {
                DimItem::Variadic(id) => match self.try_lookup(&id.name) {
                    Some(Value::List(l)) => l
                        .iter()
                        .map(|v| if let Value::Int(i) = v { i.to_string() } else { "?".into() })
                        .collect::<Vec<_>>()
                        .join(", "),
                    _ => format!("..{}", id.name),
                },
                DimItem::Expr(e) => match self.try_eval_int(e) {
                    Some(i) => i.to_string(),
                    None => self.prog.sources.snippet(e.span).to_string(),
                },
            })
            .filter(|s| !s.is_empty())
            .collect();
        format!("{}[{}]", dtype_of(t.dtype), dims.join(", "))
    }

    /// " (with d = 128, heads = 4)": the values of names used in a pattern.
    fn bound_note(&self, t: &TensorType) -> String {
        let mut parts = Vec::new();
        for d in &t.dims {
            if let DimItem::Expr(e) = d {
                collect_names(e, &mut |n| {
                    if let Some(Value::Int(i)) = self.try_lookup(n) {
                        let s = format!("{n} = {i}");
                        if !parts.contains(&s) && e.span.len() > 0 {
                            parts.push(s);
                        }
                    }
                });
            }
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" (with {})", parts.join(", "))
        }
    }

    fn try_eval_int(&mut self, e: &Expr) -> Option<i64> {
        // Only side-effect-free dim expressions are evaluated here.
        let mut names_ok = true;
        collect_names(e, &mut |n| names_ok &= self.try_lookup(n).is_some());
        if !names_ok {
            return None;
        }
        match self.eval(e) {
            Ok(Value::Int(i)) => Some(i),
            _ => None,
        }
    }

    fn local(&self, name: &str) -> Option<Value> {
        let f = self.frames.last()?;
        f.locals.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    }

    /// Looks a name up without reporting: locals, then module items (not builtins).
    fn try_lookup(&self, name: &str) -> Option<Value> {
        if let Some(v) = self.local(name) {
            return Some(v);
        }
        let f = self.frames.last()?;
        match self.prog.module(f.module).scope.get(name)? {
            Binding::Item { module, index, .. } => match self.consts.get(&(*module, *index)) {
                Some(v) => Some(v.clone()),
                None => Some(Value::Item(*module, *index)),
            },
            Binding::Module { module, .. } => Some(Value::Module(*module)),
        }
    }

    /// Turns an initializer-valued expression result into an `InitSpec` (`zeros` may be
    /// written without parentheses).
    pub fn as_init(&mut self, v: Value, span: Span) -> R<Value> {
        match v {
            Value::Init(_) => Ok(v),
            Value::Builtin(_) | Value::Item(..) => {
                let r = self.call(v.clone(), span, Vec::new(), span, None);
                match r {
                    Ok(Value::Init(i)) => Ok(Value::Init(i)),
                    _ => Err(Diagnostic::error("E0201", format!("expected an initializer, found {}", self.describe(&v)), span, "not an initializer")
                        .with_help("use zeros, ones, constant(v), normal(mean, std), uniform(low, high) or a `std.init` function")),
                }
            }
            other => Err(Diagnostic::error("E0201", format!("expected an initializer, found {}", self.describe(&other)), span, "not an initializer")
                .with_help("use zeros, ones, constant(v), normal(mean, std), uniform(low, high) or a `std.init` function")),
        }
    }

    // ---- blocks --------------------------------------------------------------------------

    pub fn eval_block(&mut self, b: &Block) -> R<Value> {
        let mark = self.frame().locals.len();
        let r = self.eval_block_inner(b);
        self.frame().locals.truncate(mark);
        r
    }

    fn eval_block_inner(&mut self, b: &Block) -> R<Value> {
        for s in &b.stmts {
            match s {
                Stmt::Let { pat, ty, value, .. } => {
                    let mut v = self.eval(value)?;
                    if let Some(t) = ty {
                        v = self.check_type(t, v, value.span, "this `let`")?;
                    }
                    self.bind_pattern(pat, v, value.span)?;
                }
                Stmt::Output { name, value, span } => {
                    let v = match value {
                        Some(e) => self.eval(e)?,
                        None => self.lookup(&name.name, name.span)?,
                    };
                    let vspan = value.as_ref().map(|e| e.span).unwrap_or(name.span);
                    let Value::Tensor(id) = v else {
                        return Err(Diagnostic::error(
                            "E0201",
                            format!("an output must be a tensor, found {}", self.describe(&v)),
                            vspan,
                            "not a tensor",
                        ));
                    };
                    if let Some((_, prev)) = self.output_spans.iter().find(|(n, _)| *n == name.name)
                    {
                        return Err(Diagnostic::error(
                            "E0106",
                            format!("output `{}` is declared twice", name.name),
                            *span,
                            "second declaration",
                        )
                        .with_label(*prev, "first declared here"));
                    }
                    self.output_spans.push((name.name.clone(), *span));
                    self.graph.outputs.push((name.name.clone(), id));
                }
                Stmt::Loss { value, span } => {
                    let v = self.eval(value)?;
                    let Value::Tensor(id) = v else {
                        return Err(Diagnostic::error(
                            "E0201",
                            format!("the loss must be a tensor, found {}", self.describe(&v)),
                            value.span,
                            "not a tensor",
                        ));
                    };
                    let (dt, shape) = self.ty(id);
                    if !shape.is_empty() || !dt.is_float() {
                        let d = Diagnostic::error(
                            "E0203",
                            format!(
                                "the loss must be a scalar float tensor such as f32[], found {}",
                                self.type_str(id)
                            ),
                            value.span,
                            format!("this is {}", self.type_str(id)),
                        );
                        let d = if !shape.is_empty() {
                            d.with_help("reduce it to a scalar, e.g. `mean(...)`")
                        } else {
                            d
                        };
                        return Err(d);
                    }
                    if self.graph.loss.is_some() {
                        return Err(Diagnostic::error(
                            "E0106",
                            "a model has only one `loss`",
                            *span,
                            "second `loss`",
                        )
                        .with_help("add the terms into one expression: `loss a + 0.1 * b`"));
                    }
                    self.graph.loss = Some(id);
                }
            }
        }
        match &b.tail {
            Some(e) => self.eval(e),
            None => Ok(Value::unit()),
        }
    }

    fn bind_pattern(&mut self, p: &Pattern, v: Value, span: Span) -> R<()> {
        match p {
            Pattern::Name(id) => {
                let text = match &v {
                    Value::Tensor(t) => self.type_str(*t),
                    other => self.describe(other),
                };
                self.facts.push(Fact { span: id.span, kind: FactKind::Let, text });
                self.bind(&id.name, v);
                Ok(())
            }
            Pattern::Wildcard(_) => Ok(()),
            Pattern::Tuple(ps, pspan) => {
                let Value::Tuple(items) = &v else {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!("cannot unpack {} into {} names", self.describe(&v), ps.len()),
                        span,
                        "not a tuple",
                    )
                    .with_label(*pspan, "unpacked here"));
                };
                if items.len() != ps.len() {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!("cannot unpack a tuple of {} into {} names", items.len(), ps.len()),
                        span,
                        format!("a tuple of {}", items.len()),
                    )
                    .with_label(*pspan, format!("{} names here", ps.len())));
                }
                let items = items.clone();
                for (p, item) in ps.iter().zip(items.iter()) {
                    self.bind_pattern(p, item.clone(), span)?;
                }
                Ok(())
            }
        }
    }

    // ---- layers --------------------------------------------------------------------------

    /// Creates a layer instance: binds its config, then creates each field in order.
    pub fn instantiate(
        &mut self,
        module: ModId,
        index: usize,
        args: Vec<ArgVal>,
        span: Span,
        path: String,
    ) -> R<Rc<LayerInst>> {
        let Item::Layer(l) = self.prog.item(module, index) else {
            unreachable!("instantiate is called on layer items")
        };
        let frame = Frame {
            module,
            locals: Vec::new(),
            fields: Some((l.name.name.clone(), Vec::new())),
            model: false,
        };
        let what = format!("`{}`", l.name.name);
        let saved_ctor = self.ctor_path.take();
        let r = self.in_frame(frame, span, |ev| {
            ev.enter_params(&l.params, args, &what, l.name.span, span)?;
            let config = ev.frame().locals.clone();
            ev.create_fields(&l.fields, &path, &config)?;
            let fields = ev.frame().fields.take().map(|(_, f)| f).unwrap_or_default();
            Ok(Rc::new(LayerInst {
                type_name: l.name.name.clone(),
                module,
                item: index,
                path: path.clone(),
                config,
                fields,
            }))
        });
        self.ctor_path = saved_ctor;
        r
    }

    /// Creates fields in order into the current frame: each is visible to the ones after it
    /// (by bare name unless a config parameter has that name, and always as `self.name`).
    pub fn create_fields(
        &mut self,
        fields: &[FieldDef],
        path: &str,
        config: &[(String, Value)],
    ) -> R<()> {
        for f in fields {
            let v = self.field_value(f, path)?;
            let frame = self.frame();
            if let Some((_, fields)) = &mut frame.fields {
                fields.push((f.name.name.clone(), v.clone()));
            }
            if !config.iter().any(|(n, _)| *n == f.name.name) {
                frame.locals.push((f.name.name.clone(), v));
            }
        }
        Ok(())
    }

    fn field_value(&mut self, f: &FieldDef, path: &str) -> R<Value> {
        let v = self.field_value_inner(f, path)?;
        let text = match &v {
            Value::Layer(inst) => Some(format!(
                "layer `{}` at `{}` ({})",
                inst.type_name,
                inst.path,
                show_config(&inst.config)
            )),
            Value::Repeated(list) => list.first().map(|first| {
                format!(
                    "{} × layer `{}` at `{}`",
                    list.len(),
                    first.type_name,
                    first.path.rsplit_once('.').map(|(p, _)| p).unwrap_or(&first.path)
                )
            }),
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => Some(self.describe(&v)),
            _ => None,
        };
        if let Some(text) = text {
            self.facts.push(Fact { span: f.name.span, kind: FactKind::Layer, text });
        }
        Ok(v)
    }

    fn field_value_inner(&mut self, f: &FieldDef, path: &str) -> R<Value> {
        if let Some(c) = &f.cond {
            if !self.expect_bool(c)? {
                return Ok(Value::Absent { field: f.name.span });
            }
        }
        let full =
            if path.is_empty() { f.name.name.clone() } else { format!("{path}.{}", f.name.name) };
        match &f.init {
            FieldInit::Tensor { trainable, ty, init } => {
                let (dtype, shape) = self.concrete_type(ty, "a parameter")?;
                let init = match init {
                    None => InitSpec::Constant(0.0),
                    Some(e) => {
                        let v = self.eval(e)?;
                        match self.as_init(v, e.span)? {
                            Value::Init(i) => i,
                            _ => unreachable!("as_init returns an Init"),
                        }
                    }
                };
                let index = self.graph.params.len();
                let node =
                    self.add(Op::Param { index }, Vec::new(), dtype, shape.clone(), f.span)?;
                let kind = if *trainable { "param" } else { "buffer" };
                self.facts.push(Fact {
                    span: f.name.span,
                    kind: FactKind::Param,
                    text: format!(
                        "{kind} {} `{full}` ({} elements, init {init})",
                        fmt_type(dtype, &shape),
                        crate::graph::dump::thousands(shape.iter().product())
                    ),
                });
                self.graph.params.push(ParamInfo {
                    name: full,
                    dtype,
                    shape,
                    init,
                    trainable: *trainable,
                    node,
                    span: f.span,
                });
                Ok(Value::Tensor(node))
            }
            FieldInit::Repeat { count, index, body } => {
                let n = match self.eval(count)? {
                    Value::Int(n) if (0..=MAX_REPEAT).contains(&n) => n,
                    Value::Int(n) => {
                        return Err(Diagnostic::error(
                            "E0301",
                            format!("repeat count {n} is out of range"),
                            count.span,
                            format!("must be between 0 and {MAX_REPEAT}"),
                        ))
                    }
                    v => {
                        return Err(Diagnostic::error(
                            "E0201",
                            format!(
                                "a repeat count must be an integer, found {}",
                                self.describe(&v)
                            ),
                            count.span,
                            "not an integer",
                        ))
                    }
                };
                let mut list = Vec::new();
                for i in 0..n {
                    if let Some(id) = index {
                        self.bind(&id.name, Value::Int(i));
                    }
                    self.ctor_path = Some(format!("{full}.{i}"));
                    let v = self.eval(body);
                    self.ctor_path = None;
                    if index.is_some() {
                        self.frame().locals.pop();
                    }
                    match v? {
                        Value::Layer(inst) if inst.path != format!("{full}.{i}") => {
                            return Err(Diagnostic::error("E0108", format!("`repeat` would reuse the existing layer `{}` instead of making copies", inst.path), body.span, "an existing layer")
                                .with_help("call the layer type to make new copies: `repeat(n) Block(...)`"))
                        }
                        Value::Layer(inst) => list.push(inst),
                        other => {
                            return Err(Diagnostic::error("E0201", format!("`repeat` needs a layer, found {}", self.describe(&other)), body.span, "not a layer")
                                .with_help("write `repeat(n) Block(...)`"))
                        }
                    }
                }
                Ok(Value::Repeated(Rc::new(list)))
            }
            FieldInit::Expr(Expr { kind: ExprKind::List(items), .. }) => {
                // `[Conv2d(...), BatchNorm2d(...)]`: layers named `field.0`, `field.1`, ...
                // applied in order (PyTorch's nn.Sequential); a list of other values stays a list.
                let mut values = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    self.ctor_path = Some(format!("{full}.{i}"));
                    let v = self.eval(item);
                    self.ctor_path = None;
                    values.push(v?);
                }
                let layers: Vec<Rc<LayerInst>> = values
                    .iter()
                    .filter_map(|v| if let Value::Layer(l) = v { Some(l.clone()) } else { None })
                    .collect();
                if let Some((i, l)) =
                    layers.iter().enumerate().find(|(i, l)| l.path != format!("{full}.{i}"))
                {
                    return Err(Diagnostic::error("E0108", format!("element {i} reuses the existing layer `{}`", l.path), items[i].span, "an existing layer")
                        .with_help("call the layer type to make a new layer here; sharing weights between fields is not supported"));
                }
                if layers.len() == values.len() && !layers.is_empty() {
                    Ok(Value::Repeated(Rc::new(layers)))
                } else if layers.is_empty() {
                    Ok(Value::List(Rc::new(values)))
                } else {
                    Err(Diagnostic::error("E0201", "a list field must hold only layers or no layers", f.span, "mixed list")
                        .with_help("layers in a list are applied in order; keep other values in separate fields"))
                }
            }
            FieldInit::Expr(e) => {
                self.ctor_path = Some(full);
                let v = self.eval(e);
                self.ctor_path = None;
                v
            }
        }
    }

    /// Evaluates a tensor type whose dims must all be known (parameters, model inputs).
    pub fn concrete_type(&mut self, t: &TensorType, what: &str) -> R<(DType, Vec<usize>)> {
        let mut shape = Vec::new();
        for d in &t.dims {
            match d {
                DimItem::Variadic(id) => return Err(Diagnostic::error(
                    "E0206",
                    format!("the shape of {what} must be fully known"),
                    id.span,
                    "a `..` group is only allowed in patterns (parameter, return and `let` types)",
                )),
                DimItem::Expr(e) => match self.eval(e)? {
                    Value::Int(i) if i >= 1 => shape.push(i as usize),
                    Value::Int(i) => {
                        return Err(Diagnostic::error(
                            "E0301",
                            format!("dimension {i} of {what} is not positive"),
                            e.span,
                            format!("this is {i}"),
                        )
                        .with_help("every dimension must be at least 1"))
                    }
                    v => {
                        return Err(Diagnostic::error(
                            "E0201",
                            format!("a dimension must be an integer, found {}", self.describe(&v)),
                            e.span,
                            "not an integer",
                        ))
                    }
                },
            }
        }
        if shape::checked_numel(&shape).is_none_or(|n| n > MAX_NUMEL) {
            return Err(Diagnostic::error(
                "E0301",
                format!(
                    "{what} with shape {} has more than 2^40 elements",
                    fmt_type(dtype_of(t.dtype), &shape)
                ),
                t.span,
                "too large",
            ));
        }
        Ok((dtype_of(t.dtype), shape))
    }
}

fn show_config(config: &[(String, Value)]) -> String {
    config
        .iter()
        .map(|(n, v)| match v {
            Value::Int(i) => format!("{n} = {i}"),
            Value::Float(f) => format!("{n} = {f:?}"),
            Value::Bool(b) => format!("{n} = {b}"),
            Value::DType(d) => format!("{n} = {d}"),
            _ => format!("{n} = {}", v.kind()),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn layer_locals(inst: &LayerInst) -> Vec<(String, Value)> {
    let mut locals = inst.config.clone();
    for (n, v) in &inst.fields {
        if !inst.config.iter().any(|(c, _)| c == n) {
            locals.push((n.clone(), v.clone()));
        }
    }
    locals
}

fn collect_names(e: &Expr, f: &mut impl FnMut(&str)) {
    match &e.kind {
        ExprKind::Name(n) => f(n),
        ExprKind::Unary(_, a) => collect_names(a, f),
        ExprKind::Binary(_, a, b) => {
            collect_names(a, f);
            collect_names(b, f);
        }
        ExprKind::Call { args, .. } => args.iter().for_each(|a| collect_names(&a.value, f)),
        _ => {}
    }
}

pub fn dtype_of(d: DTypeName) -> DType {
    match d {
        DTypeName::F32 => DType::F32,
        DTypeName::F16 => DType::F16,
        DTypeName::BF16 => DType::BF16,
        DTypeName::I32 => DType::I32,
        DTypeName::I64 => DType::I64,
        DTypeName::U32 => DType::U32,
        DTypeName::Bool => DType::Bool,
    }
}

fn scalar_desc(s: ScalarType) -> &'static str {
    match s {
        ScalarType::Dim => "a dim (a positive integer)",
        ScalarType::Int => "an integer",
        ScalarType::Float => "a float",
        ScalarType::Bool => "a bool",
        ScalarType::Init => "an initializer",
        ScalarType::DType => "a dtype",
    }
}

/// Compile-time numbers stay finite: an infinity or NaN is an error where it arises.
pub fn finite(span: Span, v: Value) -> R<Value> {
    match v {
        Value::Float(f) if !f.is_finite() => Err(Diagnostic::error(
            "E0301",
            format!(
                "this computes {}, not a finite number",
                if f.is_nan() {
                    "NaN"
                } else if f > 0.0 {
                    "infinity"
                } else {
                    "-infinity"
                }
            ),
            span,
            "not finite",
        )),
        v => Ok(v),
    }
}

pub fn as_f64(v: &Value) -> f64 {
    match v {
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        _ => f64::NAN,
    }
}

fn overflow(span: Span) -> Diagnostic {
    Diagnostic::error("E0301", "integer overflow", span, "the result does not fit in 64 bits")
}

pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn int_binary(op: BinOp, a: i64, b: i64, ls: Span, rs: Span, span: Span) -> R<Value> {
    use Value::*;
    Ok(match op {
        BinOp::Add => Int(a.checked_add(b).ok_or_else(|| overflow(span))?),
        BinOp::Sub => Int(a.checked_sub(b).ok_or_else(|| overflow(span))?),
        BinOp::Mul => Int(a.checked_mul(b).ok_or_else(|| overflow(span))?),
        BinOp::Div | BinOp::Rem if b == 0 => {
            return Err(Diagnostic::error("E0301", "division by zero", rs, "this is 0"));
        }
        BinOp::Div => {
            let rem = a.checked_rem(b).ok_or_else(|| overflow(span))?;
            if rem != 0 {
                let _ = ls;
                return Err(Diagnostic::error("E0301", format!("{a} is not divisible by {b}"), span, format!("{a} / {b} leaves a remainder of {rem}"))
                    .with_help("dims divide exactly; choose sizes that divide, or use floor_div(a, b) / ceil_div(a, b) to round"));
            }
            Int(a.checked_div(b).ok_or_else(|| overflow(span))?)
        }
        BinOp::Rem => Int(a.checked_rem_euclid(b).ok_or_else(|| overflow(span))?),
        BinOp::Eq => Bool(a == b),
        BinOp::Ne => Bool(a != b),
        BinOp::Lt => Bool(a < b),
        BinOp::Le => Bool(a <= b),
        BinOp::Gt => Bool(a > b),
        BinOp::Ge => Bool(a >= b),
        BinOp::MatMul | BinOp::And | BinOp::Or => {
            return Err(Diagnostic::error(
                "E0201",
                format!("`{}` cannot combine two integers", op.symbol()),
                span,
                "invalid operands",
            ))
        }
    })
}
