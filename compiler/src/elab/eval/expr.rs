//! Expressions, and blocks with their statements (`let`, and a model's `output` and `loss`,
//! which record into the graph).

use super::*;
use crate::elab::value::item_path;

impl<'p> Evaluator<'p> {
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
            ExprKind::Unary(op, a) => self.unary(*op, a, e.span),
            ExprKind::Binary(first, rest) => self.chain(first, rest),
            ExprKind::Transpose(a) => self.transpose(a, e.span),
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

    /// Operators of one level in a row, left to right: `a - b + c` is `(a - b) + c`. `&&` and
    /// `||` short-circuit: the operands after the deciding one are not evaluated.
    fn chain(&mut self, first: &Expr, rest: &[(BinOp, Expr)]) -> R<Value> {
        if matches!(rest[0].0, BinOp::And | BinOp::Or) {
            let v = self.eval(first)?;
            if let Value::Tensor(_) = v {
                // On masks (bool tensors) every operand is evaluated; on bools `&&` and `||`
                // short-circuit.
                let (mut acc, mut span) = (v, first.span);
                for (op, b) in rest {
                    let r = self.eval(b)?;
                    let whole = span.to(b.span);
                    let and = *op == BinOp::And;
                    let t = builtins::logic(self, and, (&acc, span), (&r, b.span), whole)?;
                    (acc, span) = (Value::Tensor(t), whole);
                }
                return Ok(acc);
            }
            let mut l = self.as_bool(v, first)?;
            for (op, b) in rest {
                if (*op == BinOp::And && !l) || (*op == BinOp::Or && l) {
                    break;
                }
                l = self.expect_bool(b)?;
            }
            return Ok(Value::Bool(l));
        }
        let mut acc = self.eval(first)?;
        let mut span = first.span;
        for (op, b) in rest {
            let r = self.eval(b)?;
            let whole = span.to(b.span);
            acc = self.binary(*op, acc, span, r, b.span, whole)?;
            span = whole;
        }
        Ok(acc)
    }

    fn unary(&mut self, op: UnOp, a: &Expr, span: Span) -> R<Value> {
        let v = self.eval(a)?;
        match (op, v) {
            (UnOp::Neg, Value::Int(i)) => {
                i.checked_neg().map(Value::Int).ok_or_else(|| overflow(span))
            }
            (UnOp::Neg, Value::Float(f)) => Ok(Value::Float(-f)),
            (UnOp::Neg, Value::Tensor(t)) if self.ty(t).0 != DType::Bool => {
                let (d, s) = self.ty(t);
                let s = s.to_vec();
                Ok(Value::Tensor(self.add(Op::Unary(UnaryOp::Neg), vec![t], d, s, span)?))
            }
            (UnOp::Not, Value::Bool(b)) => Ok(Value::Bool(!b)),
            (UnOp::Not, Value::Tensor(t)) => {
                Ok(Value::Tensor(builtins::not(self, t, a.span, span)?))
            }
            (op, v) => Err(Diagnostic::error(
                "E0201",
                format!(
                    "cannot apply `{}` to {}",
                    if op == UnOp::Neg { "-" } else { "!" },
                    self.describe(&v)
                ),
                a.span,
                "this operand",
            )),
        }
    }

    /// `a^T`: swaps the last two axes.
    fn transpose(&mut self, a: &Expr, span: Span) -> R<Value> {
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
                span,
                "cannot transpose",
            )
            .with_help("a 1-D tensor has nothing to swap; reshape it to [1, n] or [n, 1] first");
            return Err(self.origin_label(d, &v, a.span, "it was"));
        }
        Ok(Value::Tensor(builtins::swap_axes(self, t, rank - 2, rank - 1, span)?))
    }

    pub(super) fn expect_bool(&mut self, e: &Expr) -> R<bool> {
        let v = self.eval(e)?;
        self.as_bool(v, e)
    }

    fn as_bool(&mut self, v: Value, e: &Expr) -> R<bool> {
        match v {
            Value::Bool(b) => Ok(b),
            Value::Tensor(_) => Err(Diagnostic::error(
                "E0201",
                format!("expected a compile-time bool, found {}", self.describe(&v)),
                e.span,
                "tensor data",
            )
            .with_help(
                "conditions are compile-time; to choose element by element use \
                 `where(cond, a, b)`",
            )),
            v => Err(Diagnostic::error(
                "E0201",
                format!("expected a bool, found {}", self.describe(&v)),
                e.span,
                "not a bool",
            )
            .with_help("conditions are compile-time: compare config values, e.g. `i % 2 == 1`")),
        }
    }

    pub(super) fn field(&mut self, base: &Expr, field: &Ident) -> R<Value> {
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
                    let d = Diagnostic::error(
                        "E0101",
                        format!("`{layer}` has no field `{}`", field.name),
                        field.span,
                        "unknown field",
                    );
                    let names = fields.iter().map(|(n, _)| n.as_str());
                    Err(suggest(d, field.span, &field.name, names))
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
                        let d = Diagnostic::error(
                            "E0103",
                            format!("`{}` has no item named `{}`", module.name, field.name),
                            field.span,
                            "not found in this module",
                        );
                        Err(suggest(d, field.span, &field.name, module.item_names()))
                    }
                }
            }
            Value::Layer(inst) => match inst.field(&field.name) {
                Some(v) => Ok(v.clone()),
                None => {
                    let d = Diagnostic::error(
                        "E0101",
                        format!("layer `{}` has no field `{}`", inst.type_name, field.name),
                        field.span,
                        "unknown field",
                    );
                    let names = inst.fields.iter().map(|(n, _)| n.as_str());
                    Err(suggest(d, field.span, &field.name, names))
                }
            },
            Value::Sequence(seq) => sequence_item(seq, field),
            Value::Tuple(items) => match field.name.parse::<usize>() {
                Ok(i) if i < items.len() => Ok(items[i].clone()),
                _ => Err(Diagnostic::error(
                    "E0201",
                    format!("a tuple of {} has no element `{}`", items.len(), field.name),
                    field.span,
                    "no such element",
                )),
            },
            Value::Tensor(_) => {
                let d = Diagnostic::error(
                    "E0201",
                    format!("{} has no field `{}`", self.describe(&b), field.name),
                    field.span,
                    "no such field",
                );
                Err(tensor_field_help(d, &field.name))
            }
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
            Value::Sequence(s) => (s.items.len(), "sequence of layers"),
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
            Value::Sequence(s) => s.items[k].clone(),
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
        let cmp = match op {
            BinOp::Eq => Some(CompareOp::Eq),
            BinOp::Ne => Some(CompareOp::Ne),
            BinOp::Lt => Some(CompareOp::Lt),
            BinOp::Le => Some(CompareOp::Le),
            BinOp::Gt => Some(CompareOp::Gt),
            BinOp::Ge => Some(CompareOp::Ge),
            _ => None,
        };
        if let Some(c) = cmp {
            return builtins::compare(self, c, (&l, ls), (&r, rs), span).map(Tensor);
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
                .with_help("tensors support + - * / @, comparisons, and && || ! on masks"))
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

    // ---- blocks --------------------------------------------------------------------------

    pub fn eval_block(&mut self, b: &Block) -> R<Value> {
        let mark = self.frame().locals.len();
        let r = self.eval_block_inner(b);
        self.frame().locals.truncate(mark);
        r
    }

    fn eval_block_inner(&mut self, b: &Block) -> R<Value> {
        self.eval_stmts(b)?;
        match &b.tail {
            Some(e) => self.eval(e),
            None => Ok(Value::unit()),
        }
    }

    /// A block's statements, binding its `let`s in the current frame.
    pub(super) fn eval_stmts(&mut self, b: &Block) -> R<()> {
        for s in &b.stmts {
            match s {
                Stmt::Let { pat, ty, value, .. } => {
                    let mut v = self.eval(value)?;
                    if let Some(t) = ty {
                        v = self.check_type(t, v, value.span, "this `let`")?;
                    }
                    self.bind_pattern(pat, v, value.span)?;
                }
                Stmt::Output { name, value, span } => self.output(name, value.as_ref(), *span)?,
                Stmt::Loss { value, span } => self.loss(value, *span)?,
                Stmt::Assign { field, value, span } => self.assign(field, value, *span)?,
            }
        }
        Ok(())
    }

    /// `output name = e` (or `output name`): records a result of the model.
    fn output(&mut self, name: &Ident, value: Option<&Expr>, span: Span) -> R<()> {
        let v = match value {
            Some(e) => self.eval(e)?,
            None => self.lookup(&name.name, name.span)?,
        };
        let vspan = value.map(|e| e.span).unwrap_or(name.span);
        let Value::Tensor(id) = v else {
            return Err(Diagnostic::error(
                "E0201",
                format!("an output must be a tensor, found {}", self.describe(&v)),
                vspan,
                "not a tensor",
            ));
        };
        if let Some((_, prev)) = self.output_spans.iter().find(|(n, _)| *n == name.name) {
            return Err(Diagnostic::error(
                "E0106",
                format!("output `{}` is declared twice", name.name),
                span,
                "second declaration",
            )
            .with_label(*prev, "first declared here"));
        }
        self.output_spans.push((name.name.clone(), span));
        self.graph.outputs.push((name.name.clone(), id));
        Ok(())
    }

    /// `loss e`: records the model's loss, a scalar float tensor.
    fn loss(&mut self, value: &Expr, span: Span) -> R<()> {
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
                span,
                "second `loss`",
            )
            .with_help("add the terms into one expression: `loss a + 0.1 * b`"));
        }
        self.graph.loss = Some(id);
        Ok(())
    }

    fn bind_pattern(&mut self, p: &Pattern, v: Value, span: Span) -> R<()> {
        match p {
            Pattern::Name(id) => {
                let text = match &v {
                    Value::Tensor(t) => self.type_str(*t),
                    other => self.describe(other),
                };
                self.facts.push(Fact { span: id.span, kind: FactKind::Let, text });
                self.bind(&id.name, id.span, v);
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
}

/// `seq.name`: the item of a sequence named `name` (its position, or its `repeat` name).
fn sequence_item(seq: &Sequence, field: &Ident) -> R<Value> {
    if let Some(v) = seq.item(&field.name) {
        return Ok(v.clone());
    }
    let names: Vec<&str> =
        seq.items.iter().filter_map(|v| item_path(v)?.rsplit('.').next()).collect();
    let d = Diagnostic::error(
        "E0101",
        format!("the sequence `{}` has no item `{}`", seq.path, field.name),
        field.span,
        "unknown item",
    );
    Err(suggest(d, field.span, &field.name, names.iter().copied()))
}

fn overflow(span: Span) -> Diagnostic {
    Diagnostic::error("E0301", "integer overflow", span, "the result does not fit in 64 bits")
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
                return Err(Diagnostic::error(
                    "E0301",
                    format!("{a} is not divisible by {b}"),
                    span,
                    format!("{a} / {b} leaves a remainder of {rem}"),
                )
                .with_help(concat!(
                    "dims divide exactly; choose sizes that divide, ",
                    "or use floor_div(a, b) / ceil_div(a, b) to round"
                )));
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

/// What a tensor field written out of a PyTorch habit is in mgn: `x.T` is `x^T`, and shapes
/// are read through type patterns, not `x.shape`.
fn tensor_field_help(d: Diagnostic, field: &str) -> Diagnostic {
    match field {
        "T" | "mT" | "t" => d.with_help(
            "`x^T` swaps the last two axes (`transpose(x, a, b)` swaps any two); tensors have no \
             fields",
        ),
        "shape" | "size" | "ndim" | "dim" => d.with_help(
            "sizes are known at compile time and named by type patterns: declare \
                 `x: f32[B, T, d]` as a parameter (or `let y: f32[B, T, d] = x`) and use `B`, \
                 `T`, `d`",
        ),
        "dtype" => {
            d.with_help("the element type is part of the tensor's type; `cast(x, dt)` converts it")
        }
        "detach" => {
            d.with_help("`stop_gradient(x)` is PyTorch's `x.detach()`: tensors have no methods")
        }
        _ => d.with_note(
            "tensors have no fields: `.name` reaches fields of layers, items of \
             modules and positions of tuples",
        ),
    }
}
