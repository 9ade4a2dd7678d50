//! Declared types: checking values against them, and matching tensors against shape patterns
//! such as `f32[..B, T, 3 * d]`, which bind the dims they name where those are not bound yet.

use super::*;
use mgn_syntax::visit::{self, Visit};

impl<'p> Evaluator<'p> {
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
            TypeExpr::Tuple(ts, tspan) => self.check_tuple(ts, *tspan, v, span, what),
        }
    }

    fn check_tuple(
        &mut self,
        ts: &[TypeExpr],
        tspan: Span,
        v: Value,
        span: Span,
        what: &str,
    ) -> R<Value> {
        // A tuple of numbers also takes one number for every element, as PyTorch's layers
        // take `kernel_size = 3` for `(3, 3)`.
        let numbers = ts.iter().all(|t| {
            matches!(t, TypeExpr::Scalar(ScalarType::Dim | ScalarType::Int | ScalarType::Float, _))
        });
        if numbers && matches!(v, Value::Int(_) | Value::Float(_)) {
            let copies = Value::Tuple(Rc::new(vec![v; ts.len()]));
            return self.check_tuple(ts, tspan, copies, span, what);
        }
        let Value::Tuple(items) = &v else {
            return Err(Diagnostic::error(
                "E0201",
                format!("{what} must be a tuple of {}, found {}", ts.len(), self.describe(&v)),
                span,
                "expected a tuple",
            )
            .with_label(tspan, "declared here"));
        };
        if items.len() != ts.len() {
            return Err(Diagnostic::error(
                "E0201",
                format!("{what} must be a tuple of {}, found a tuple of {}", ts.len(), items.len()),
                span,
                "wrong length",
            )
            .with_label(tspan, "declared here"));
        }
        let items = items.clone();
        let mut out = Vec::new();
        for (i, (t, item)) in ts.iter().zip(items.iter()).enumerate() {
            let what = format!("element {i} of {what}");
            out.push(self.check_type(t, item.clone(), span, &what)?);
        }
        Ok(Value::Tuple(Rc::new(out)))
    }

    pub(super) fn check_return(
        &mut self,
        t: &TypeExpr,
        v: Value,
        body: &Block,
        what: &str,
    ) -> R<Value> {
        let span = body.tail.as_ref().map(|e| e.span).unwrap_or(body.span);
        self.check_type(t, v, span, &format!("the result of {what}"))
    }

    /// Matches a tensor against a type pattern such as `f32[..B, T, 3 * d]`.
    pub fn match_tensor(&mut self, t: &TensorType, id: NodeId, span: Span, what: &str) -> R<()> {
        let (dtype, shape) = self.ty(id);
        let shape = shape.to_vec();
        let want = pattern_dtype(t);
        if want.is_packed() {
            return Err(packed::not_packed(want, t.span, "a tensor type pattern"));
        }
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
        let m = Match { t, id, span, what, dtype, shape };
        let (positions, group_len) = self.match_rank(&m)?;
        // Bare names bind (or compare) first, so `[B, T, B * T]` works in any order.
        let mut deferred = Vec::new();
        for (d, &pos) in t.dims.iter().zip(&positions) {
            match d {
                DimItem::Variadic(id) => self.match_group(&m, id, pos..pos + group_len)?,
                DimItem::Expr(e) => match (&e.kind, self.binder(e.span)) {
                    (ExprKind::Name(n), Some(def)) => {
                        self.bind(n, def, Value::Int(m.shape[pos] as i64))
                    }
                    _ => deferred.push((e, pos)),
                },
            }
        }
        for (e, pos) in deferred {
            self.match_dim(&m, e, pos)?;
        }
        Ok(())
    }

    /// Checks the rank; returns the position in the shape of each item of the pattern, and
    /// how many axes the `..` group (if any) spans.
    fn match_rank(&mut self, m: &Match) -> R<(Vec<usize>, usize)> {
        let variadics = m.t.dims.iter().filter(|d| matches!(d, DimItem::Variadic(_))).count();
        if variadics > 1 {
            return Err(Diagnostic::error(
                "E0206",
                "a tensor type can have only one `..` group",
                m.t.span,
                "two `..` groups",
            ));
        }
        let fixed = m.t.dims.len() - variadics;
        let rank_ok = if variadics == 0 { m.shape.len() == fixed } else { m.shape.len() >= fixed };
        if !rank_ok {
            let expected = self.pattern_str(m.t);
            return Err(self.mismatch(m, expected).with_note(format!(
                "expected {} ax{}, found {}",
                if variadics == 0 { fixed.to_string() } else { format!("at least {fixed}") },
                if fixed == 1 { "is" } else { "es" },
                m.shape.len()
            )));
        }
        let group_len = m.shape.len() - fixed;
        let mut positions = Vec::new();
        let mut at = 0;
        for d in &m.t.dims {
            positions.push(at);
            at += if matches!(d, DimItem::Variadic(_)) { group_len } else { 1 };
        }
        Ok((positions, group_len))
    }

    /// `..B`: binds the group of axes, or compares it with the group bound before.
    fn match_group(&mut self, m: &Match, id: &Ident, axes: std::ops::Range<usize>) -> R<()> {
        let got: Vec<Value> = m.shape[axes].iter().map(|&x| Value::Int(x as i64)).collect();
        let def = self.def_of(id.span);
        match self.local(def) {
            None => self.bind(&id.name, def, Value::List(Rc::new(got))),
            Some(Value::List(prev)) => {
                let same = prev.len() == got.len()
                    && prev
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| matches!((a, b), (Value::Int(x), Value::Int(y)) if x == y));
                if !same {
                    let expected = self.pattern_str(m.t);
                    return Err(self.mismatch(m, expected).with_note(format!(
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
        Ok(())
    }

    /// An axis whose size an expression gives: evaluated (its names are bound by now) and
    /// compared.
    fn match_dim(&mut self, m: &Match, e: &Expr, pos: usize) -> R<()> {
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
                let snippet = self.prog.sources.snippet(e.span);
                return Err(Diagnostic::error(
                    "E0205",
                    format!("cannot infer the dims in `{snippet}` from {}", m.what),
                    e.span,
                    "unknown size",
                )
                .with_help(concat!(
                    "give each unknown dim its own axis (`[B, n]`) ",
                    "or pass it as a `dim` parameter"
                )));
            }
            Err(err) => return Err(err),
        };
        if want != m.shape[pos] as i64 {
            let expected = self.pattern_str(m.t);
            return Err(self
                .mismatch(m, expected)
                .with_note(format!("axis {pos}: expected {want}, found {}", m.shape[pos])));
        }
        Ok(())
    }

    fn mismatch(&self, m: &Match, expected: String) -> Diagnostic {
        let found = fmt_type(m.dtype, &m.shape);
        let d = Diagnostic::error(
            "E0205",
            format!("{} has shape {found}, expected {expected}", m.what),
            m.span,
            format!("this is {found}"),
        )
        .with_label(m.t.span, format!("expected {expected}{}", self.bound_note(m.t)));
        self.origin_label(d, &Value::Tensor(m.id), m.span, "it was")
    }

    /// The definition a name written in a pattern denotes: its own span where it defines one.
    fn def_of(&self, span: Span) -> Span {
        match self.prog.resolution.target(span) {
            Some(Target::Def { span: def, .. }) => def,
            _ => span,
        }
    }

    /// Where a bare name in a shape pattern binds the axis' size: at its own span where it
    /// defines a dim, at the definition it denotes where that has no value yet (a dim of a
    /// return type, met in the body); `None` where it has a value to compare with.
    fn binder(&self, span: Span) -> Option<Span> {
        match self.prog.resolution.target(span) {
            // Not a name the front end saw bind or refer to anything: it binds here.
            None => Some(span),
            Some(Target::Def { span: def, .. }) => self.local(def).is_none().then_some(def),
            Some(_) => None,
        }
    }

    /// Shape pattern with known dims filled in: `f32[8, T, 128]`.
    fn pattern_str(&mut self, t: &TensorType) -> String {
        let dims: Vec<String> = t
            .dims
            .iter()
            .map(|d| match d {
                DimItem::Variadic(id) => match self.try_lookup(id.span) {
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
        format!("{}[{}]", pattern_dtype(t), dims.join(", "))
    }

    /// " (with d = 128, heads = 4)": the values of names used in a pattern.
    fn bound_note(&self, t: &TensorType) -> String {
        let mut parts = Vec::new();
        for d in &t.dims {
            if let DimItem::Expr(e) = d {
                for (n, span) in dim_names(e) {
                    if let Some(Value::Int(i)) = self.try_lookup(span) {
                        let s = format!("{n} = {i}");
                        if !parts.contains(&s) && !e.span.is_empty() {
                            parts.push(s);
                        }
                    }
                }
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
        if dim_names(e).iter().any(|(_, span)| self.try_lookup(*span).is_none()) {
            return None;
        }
        match self.eval(e) {
            Ok(Value::Int(i)) => Some(i),
            _ => None,
        }
    }
}

/// A tensor being matched against a pattern, for the messages of each step.
struct Match<'a> {
    t: &'a TensorType,
    id: NodeId,
    span: Span,
    what: &'a str,
    dtype: DType,
    shape: Vec<usize>,
}

/// The names a dim expression reads through arithmetic and call arguments (not callees,
/// fields or anything else), with where each is written.
fn dim_names(e: &Expr) -> Vec<(&str, Span)> {
    struct DimNames<'e>(Vec<(&'e str, Span)>);
    impl<'e> Visit<'e> for DimNames<'e> {
        fn visit_expr(&mut self, e: &'e Expr) {
            match &e.kind {
                ExprKind::Name(n) => self.0.push((n, e.span)),
                ExprKind::Unary(..) | ExprKind::Binary(..) => visit::walk_expr(self, e),
                ExprKind::Call { args, .. } => {
                    for a in args {
                        self.visit_expr(&a.value);
                    }
                }
                _ => {}
            }
        }
    }
    let mut v = DimNames(Vec::new());
    v.visit_expr(e);
    v.0
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

/// A pattern's element type: always written out (the grammar admits a `dtype` name as a
/// tensor type only in a parameter's declaration).
fn pattern_dtype(t: &TensorType) -> DType {
    match &t.dtype {
        ElemType::Named(d) => dtype_of(*d),
        ElemType::Value(_) => unreachable!("a pattern's element type is written out"),
    }
}
