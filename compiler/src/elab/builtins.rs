//! The builtin functions: one typing rule each, and the graph node(s) each one produces.
//!
//! Arguments are bound by name against each builtin's parameter list (`?` marks an optional
//! one); the rule then checks kinds, dtypes and shapes and names the argument at fault.

use super::eval::{as_f64, ArgVal, Evaluator, R};
use super::shape;
use super::value::Value;
use crate::front::did_you_mean;
use crate::ir::{fmt_type, BinaryOp, InitSpec, NodeId, Op, PoolOp, ReduceOp, UnaryOp};
use mgn_runtime::DType;
use mgn_syntax::{Diagnostic, Span};
use std::rc::Rc;

pub struct Builtin {
    pub name: &'static str,
    /// Parameter names; a trailing `?` marks an optional one.
    pub params: &'static [&'static str],
    pub doc: &'static str,
    run: fn(&mut Evaluator, &Args) -> R<Value>,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "builtin {}", self.name)
    }
}

macro_rules! b {
    ($name:literal, [$($p:literal),*], $doc:literal, $run:expr) => {
        Builtin { name: $name, params: &[$($p),*], doc: $doc, run: $run }
    };
}

static BUILTINS: &[Builtin] = &[
    // pointwise
    b!("relu", ["x"], "max(x, 0)", |e, a| unary(e, a, UnaryOp::Relu, |x| x.max(0.0))),
    b!("gelu", ["x"], "GELU with the exact erf form", |e, a| unary(e, a, UnaryOp::Gelu, |x| 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)))),
    b!("gelu_tanh", ["x"], "GELU with the tanh approximation", |e, a| unary(e, a, UnaryOp::GeluTanh, |x| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()))),
    b!("silu", ["x"], "x * sigmoid(x)", |e, a| unary(e, a, UnaryOp::Silu, |x| x / (1.0 + (-x).exp()))),
    b!("sigmoid", ["x"], "1 / (1 + exp(-x))", |e, a| unary(e, a, UnaryOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp()))),
    b!("tanh", ["x"], "hyperbolic tangent", |e, a| unary(e, a, UnaryOp::Tanh, f64::tanh)),
    b!("exp", ["x"], "e^x", |e, a| unary(e, a, UnaryOp::Exp, f64::exp)),
    b!("log", ["x"], "natural logarithm", |e, a| unary(e, a, UnaryOp::Log, f64::ln)),
    b!("sqrt", ["x"], "square root", |e, a| unary(e, a, UnaryOp::Sqrt, f64::sqrt)),
    b!("rsqrt", ["x"], "1 / sqrt(x)", |e, a| unary(e, a, UnaryOp::Rsqrt, |x| 1.0 / x.sqrt())),
    b!("abs", ["x"], "absolute value", |e, a| unary(e, a, UnaryOp::Abs, f64::abs)),
    b!("sin", ["x"], "sine", |e, a| unary(e, a, UnaryOp::Sin, f64::sin)),
    b!("cos", ["x"], "cosine", |e, a| unary(e, a, UnaryOp::Cos, f64::cos)),
    b!("square", ["x"], "x * x", |e, a| unary(e, a, UnaryOp::Square, |x| x * x)),
    b!("pow", ["x", "p"], "x raised to a constant power p", pow),
    b!("cast", ["x", "dtype"], "converts the element type", cast),
    b!("float", ["x"], "a compile-time number as a float", |e, a| Ok(Value::Float(a.number(e, "x")?))),
    b!("int", ["x"], "a compile-time number as an integer (truncating)", int_of),
    b!("floor_div", ["a", "b"], "integer division rounding down", |e, a| int_div(e, a, false)),
    b!("ceil_div", ["a", "b"], "integer division rounding up", |e, a| int_div(e, a, true)),
    // shapes
    b!("matmul", ["a", "b"], "matrix product, same as `a @ b`", |e, a| {
        let (x, y) = (a.raw("a"), a.raw("b"));
        matmul(e, (&x.0, x.1), (&y.0, y.1), a.span).map(Value::Tensor)
    }),
    b!("transpose", ["x", "a?", "b?"], "swaps two axes (the last two by default)", transpose),
    b!("permute", ["x", "axes"], "reorders all axes", permute),
    b!("reshape", ["x", "shape"], "same elements, new shape; one -1 is inferred", reshape),
    b!("unsqueeze", ["x", "axis"], "inserts a size-1 axis", unsqueeze),
    b!("squeeze", ["x", "axis"], "removes a size-1 axis", squeeze),
    b!("flatten", ["x", "start?", "end?"], "merges axes start..=end (1 and -1 by default)", flatten),
    b!("concat", ["tensors", "axis?"], "joins tensors along an axis (0 by default)", concat),
    b!("split", ["x", "parts", "axis?"], "splits into a count of equal parts or a list of sizes; returns a tuple", split),
    b!("slice", ["x", "axis", "start", "end"], "elements start..end along an axis", slice),
    b!("gather", ["x", "index", "axis?"], "selects along an axis by an integer tensor", gather),
    b!("embedding", ["weight", "ids"], "rows of `weight` selected by integer `ids`", embedding),
    b!("arange", ["n"], "i32[n] holding 0 … n-1", arange),
    // reductions
    b!("sum", ["x", "axis?", "keepdim?"], "sum over axes (all by default)", |e, a| reduce(e, a, ReduceOp::Sum)),
    b!("mean", ["x", "axis?", "keepdim?"], "mean over axes (all by default)", |e, a| reduce(e, a, ReduceOp::Mean)),
    b!("max", ["x", "axis?", "keepdim?"], "maximum over axes (all by default)", |e, a| reduce(e, a, ReduceOp::Max)),
    b!("min", ["x", "axis?", "keepdim?"], "minimum over axes (all by default)", |e, a| reduce(e, a, ReduceOp::Min)),
    b!("argmax", ["x", "axis?"], "index of the maximum along an axis, as i32", argmax),
    b!("softmax", ["x", "axis?"], "softmax along an axis (the last by default)", |e, a| softmax(e, a, false)),
    b!("log_softmax", ["x", "axis?"], "log of softmax along an axis (the last by default)", |e, a| softmax(e, a, true)),
    // normalization
    b!("layer_norm", ["x", "weight?", "bias?", "eps?"], "normalizes over the last axis", layer_norm),
    b!("rms_norm", ["x", "weight?", "eps?"], "divides by the root mean square over the last axis", rms_norm),
    b!("group_norm", ["x", "groups", "weight?", "bias?", "eps?"], "normalizes groups of channels of [N, C, ...]", group_norm),
    b!("batch_norm", ["x", "running_mean", "running_var", "weight?", "bias?", "momentum?", "eps?"], "batch normalization over [N, C, ...]", batch_norm),
    b!("dropout", ["x", "p?"], "zeroes elements with probability p in training; identity in inference", dropout),
    // convolution and resampling
    b!("conv1d", ["x", "weight", "bias?", "stride?", "padding?", "dilation?", "groups?"], "1-D convolution of [N, Cin, L]", |e, a| conv(e, a, 1)),
    b!("conv2d", ["x", "weight", "bias?", "stride?", "padding?", "dilation?", "groups?"], "2-D convolution of [N, Cin, H, W]", |e, a| conv(e, a, 2)),
    b!("max_pool2d", ["x", "kernel", "stride?", "padding?"], "2-D max pooling of [N, C, H, W]", |e, a| pool(e, a, PoolOp::Max)),
    b!("avg_pool2d", ["x", "kernel", "stride?", "padding?"], "2-D average pooling of [N, C, H, W]", |e, a| pool(e, a, PoolOp::Avg)),
    b!("upsample", ["x", "scale?"], "nearest-neighbour upsampling of [N, C, L] or [N, C, H, W]", upsample),
    // attention
    b!("attention", ["q", "k", "v", "causal?", "scale?", "mask?"], "scaled dot-product attention with grouped KV heads", attention),
    b!("rope", ["x", "theta?", "offset?"], "rotary position embedding over [.., T, D]", rope),
    // losses
    b!("softmax_cross_entropy", ["logits", "targets"], "mean cross-entropy of logits [.., C] and integer targets [..]", softmax_cross_entropy),
    // initializers
    b!("zeros", [], "initializer: all zeros", |_, _| Ok(Value::Init(InitSpec::Constant(0.0)))),
    b!("ones", [], "initializer: all ones", |_, _| Ok(Value::Init(InitSpec::Constant(1.0)))),
    b!("constant", ["value"], "initializer: every element `value`", |e, a| Ok(Value::Init(InitSpec::Constant(a.number(e, "value")?)))),
    b!("normal", ["mean?", "std?"], "initializer: normal distribution (0, 1 by default)", normal),
    b!("uniform", ["low?", "high?"], "initializer: uniform distribution (-1, 1 by default)", uniform),
];

pub fn lookup(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

pub fn is_builtin(name: &str) -> bool {
    lookup(name).is_some()
}

pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|b| b.name)
}

pub fn all() -> &'static [Builtin] {
    BUILTINS
}

// ---- argument binding -----------------------------------------------------------------------

pub struct Args {
    builtin: &'static Builtin,
    vals: Vec<Option<(Value, Span)>>,
    pub span: Span,
}

pub fn call(ev: &mut Evaluator, b: &'static Builtin, args: Vec<ArgVal>, span: Span) -> R<Value> {
    let names: Vec<&str> = b.params.iter().map(|p| p.trim_end_matches('?')).collect();
    let mut vals: Vec<Option<(Value, Span)>> = vec![None; names.len()];
    let mut positional = 0;
    let mut named_seen = false;
    for a in args {
        let slot = match &a.name {
            None if named_seen => {
                return Err(Diagnostic::error("E0401", "a positional argument follows a named one", a.span, "positional argument")
                    .with_help("give positional arguments first, then named ones"));
            }
            None => {
                if positional >= names.len() {
                    return Err(Diagnostic::error(
                        "E0401",
                        format!("`{}` takes at most {} argument{}", b.name, names.len(), super::eval::plural(names.len())),
                        a.span,
                        "unexpected argument",
                    )
                    .with_note(signature(b)));
                }
                positional += 1;
                positional - 1
            }
            Some(n) => {
                named_seen = true;
                match names.iter().position(|p| *p == n.name) {
                Some(i) => {
                    if vals[i].is_some() {
                        return Err(Diagnostic::error("E0401", format!("argument `{}` is given twice", n.name), n.span, "given again here"));
                    }
                    i
                }
                None => {
                    let mut d = Diagnostic::error("E0401", format!("`{}` has no parameter named `{}`", b.name, n.name), n.span, "unknown parameter");
                    d = match did_you_mean(&n.name, names.iter().copied()) {
                        Some(h) => d.with_help(h),
                        None => d.with_note(signature(b)),
                    };
                    return Err(d);
                }
                }
            }
        };
        // An absent optional field passed to an optional parameter counts as not given.
        if matches!(a.value, Value::Absent { .. }) && b.params[slot].ends_with('?') {
            continue;
        }
        vals[slot] = Some((a.value, a.span));
    }
    for (i, p) in b.params.iter().enumerate() {
        if !p.ends_with('?') && vals[i].is_none() {
            return Err(Diagnostic::error("E0401", format!("missing argument `{p}` in this call to `{}`", b.name), span, format!("`{p}` not given")).with_note(signature(b)));
        }
    }
    let args = Args { builtin: b, vals, span };
    (b.run)(ev, &args)
}

pub fn signature(b: &Builtin) -> String {
    format!("`{}({})`", b.name, b.params.join(", "))
}

impl Args {
    fn slot(&self, name: &str) -> usize {
        self.builtin.params.iter().position(|p| p.trim_end_matches('?') == name).expect("builtins ask only for their own parameters")
    }

    fn get(&self, name: &str) -> Option<&(Value, Span)> {
        self.vals[self.slot(name)].as_ref()
    }

    fn raw(&self, name: &str) -> (Value, Span) {
        self.get(name).cloned().expect("required arguments are checked before the rule runs")
    }

    fn wrong(&self, ev: &Evaluator, name: &str, want: &str) -> Diagnostic {
        let (v, s) = self.get(name).expect("only present arguments are wrong");
        let mut d = Diagnostic::error("E0201", format!("argument `{name}` of `{}` must be {want}, found {}", self.builtin.name, ev.describe(v)), *s, format!("expected {want}"));
        if let Value::Absent { field } = v {
            d = d.with_label(*field, "this field does not exist: its `if` condition is false");
        }
        d
    }

    fn tensor(&self, ev: &Evaluator, name: &str) -> R<(NodeId, Span)> {
        match self.get(name) {
            Some((Value::Tensor(t), s)) => Ok((*t, *s)),
            _ => Err(self.wrong(ev, name, "a tensor")),
        }
    }

    fn opt_tensor(&self, ev: &Evaluator, name: &str) -> R<Option<(NodeId, Span)>> {
        match self.get(name) {
            None => Ok(None),
            Some(_) => self.tensor(ev, name).map(Some),
        }
    }

    fn int_or(&self, ev: &Evaluator, name: &str, default: i64) -> R<i64> {
        match self.get(name) {
            None => Ok(default),
            Some((Value::Int(i), _)) => Ok(*i),
            _ => Err(self.wrong(ev, name, "an integer")),
        }
    }

    fn number(&self, ev: &Evaluator, name: &str) -> R<f64> {
        match self.get(name) {
            Some((Value::Int(_) | Value::Float(_), _)) => Ok(as_f64(&self.get(name).expect("matched").0)),
            _ => Err(self.wrong(ev, name, "a number")),
        }
    }

    fn number_or(&self, ev: &Evaluator, name: &str, default: f64) -> R<f64> {
        if self.get(name).is_none() {
            return Ok(default);
        }
        self.number(ev, name)
    }

    fn bool_or(&self, ev: &Evaluator, name: &str, default: bool) -> R<bool> {
        match self.get(name) {
            None => Ok(default),
            Some((Value::Bool(b), _)) => Ok(*b),
            _ => Err(self.wrong(ev, name, "a bool")),
        }
    }

    /// An integer or a list/tuple of integers.
    fn ints(&self, ev: &Evaluator, name: &str) -> R<Option<Vec<i64>>> {
        match self.get(name) {
            None => Ok(None),
            Some((Value::Int(i), _)) => Ok(Some(vec![*i])),
            Some((Value::List(l) | Value::Tuple(l), _)) => {
                let mut out = Vec::new();
                for v in l.iter() {
                    match v {
                        Value::Int(i) => out.push(*i),
                        _ => return Err(self.wrong(ev, name, "an integer or a list of integers")),
                    }
                }
                Ok(Some(out))
            }
            _ => Err(self.wrong(ev, name, "an integer or a list of integers")),
        }
    }

    fn span_of(&self, name: &str) -> Span {
        self.get(name).map(|(_, s)| *s).unwrap_or(self.span)
    }

    fn axis(&self, ev: &Evaluator, name: &str, default: i64, rank: usize) -> R<usize> {
        let a = self.int_or(ev, name, default)?;
        shape::axis(a, rank).ok_or_else(|| self.axis_error(name, a, rank))
    }

    fn axis_error(&self, name: &str, a: i64, rank: usize) -> Diagnostic {
        Diagnostic::error("E0207", format!("axis {a} is out of range for a tensor with {rank} ax{}", if rank == 1 { "is" } else { "es" }), self.span_of(name), "axis out of range")
            .with_help(if rank == 0 { "a scalar has no axes".to_string() } else { format!("valid axes are -{rank} … {}", rank as i64 - 1) })
    }

    fn name(&self) -> &'static str {
        self.builtin.name
    }
}

fn float_tensor(ev: &Evaluator, a: &Args, name: &str) -> R<(NodeId, Span)> {
    let (t, s) = a.tensor(ev, name)?;
    if !ev.ty(t).0.is_float() {
        return Err(Diagnostic::error("E0202", format!("`{}` needs a float tensor for `{name}`, found {}", a.name(), ev.type_str(t)), s, format!("this is {}", ev.type_str(t)))
            .with_help("convert it with `cast(x, f32)`"));
    }
    Ok((t, s))
}

fn int_tensor(ev: &Evaluator, a: &Args, name: &str) -> R<(NodeId, Span)> {
    let (t, s) = a.tensor(ev, name)?;
    if !ev.ty(t).0.is_int() {
        return Err(Diagnostic::error("E0202", format!("`{}` needs integer `{name}`, found {}", a.name(), ev.type_str(t)), s, format!("this is {}", ev.type_str(t)))
            .with_help("indices and class labels are i32 (or i64) tensors"));
    }
    Ok((t, s))
}

/// Checks that an optional per-feature tensor (a norm's weight or bias) has shape `[n]`.
fn vector_of(ev: &Evaluator, a: &Args, name: &str, n: usize, dtype: DType, why: &str) -> R<Option<NodeId>> {
    let Some((t, s)) = a.opt_tensor(ev, name)? else { return Ok(None) };
    let (d, shape) = ev.ty(t);
    if shape != [n] || d != dtype {
        return Err(Diagnostic::error("E0203", format!("`{name}` of `{}` must be {}, found {}", a.name(), fmt_type(dtype, &[n]), ev.type_str(t)), s, format!("this is {}", ev.type_str(t)))
            .with_note(why.to_string()));
    }
    Ok(Some(t))
}

fn node(ev: &mut Evaluator, op: Op, inputs: Vec<NodeId>, dtype: DType, shape: Vec<usize>, span: Span) -> R<Value> {
    ev.add(op, inputs, dtype, shape, span).map(Value::Tensor)
}

fn tuple_of(vals: Vec<Value>) -> Value {
    Value::Tuple(Rc::new(vals))
}

// ---- pointwise --------------------------------------------------------------------------

fn unary(ev: &mut Evaluator, a: &Args, op: UnaryOp, scalar: fn(f64) -> f64) -> R<Value> {
    match a.get("x") {
        Some((Value::Int(i), s)) if matches!(op, UnaryOp::Abs) => {
            i.checked_abs().map(Value::Int).ok_or_else(|| Diagnostic::error("E0301", "integer overflow", *s, "|x| does not fit in 64 bits"))
        }
        Some((Value::Int(_) | Value::Float(_), _)) => super::eval::finite(a.span, Value::Float(scalar(a.number(ev, "x")?))),
        _ => {
            let (t, _) = float_tensor(ev, a, "x")?;
            let (d, s) = ev.ty(t);
            let s = s.to_vec();
            node(ev, Op::Unary(op), vec![t], d, s, a.span)
        }
    }
}

fn pow(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let p = a.number(ev, "p")?;
    match a.get("x") {
        Some((Value::Int(_) | Value::Float(_), _)) => super::eval::finite(a.span, Value::Float(a.number(ev, "x")?.powf(p))),
        _ => {
            let (t, _) = float_tensor(ev, a, "x")?;
            let (d, s) = ev.ty(t);
            let s = s.to_vec();
            node(ev, Op::Pow { exponent: p }, vec![t], d, s, a.span)
        }
    }
}

fn cast(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let dtype = match a.get("dtype") {
        Some((Value::DType(d), _)) => *d,
        _ => return Err(a.wrong(ev, "dtype", "a dtype such as f32")),
    };
    let s = ev.ty(t).1.to_vec();
    node(ev, Op::Cast, vec![t], dtype, s, a.span)
}

fn int_of(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let x = a.number(ev, "x")?;
    if !x.is_finite() || x.abs() > 9.0e18 {
        return Err(Diagnostic::error("E0301", format!("{x} does not fit in an integer"), a.span_of("x"), "out of range"));
    }
    Ok(Value::Int(x.trunc() as i64))
}

fn int_div(ev: &mut Evaluator, a: &Args, ceil: bool) -> R<Value> {
    let (Some((Value::Int(x), _)), Some((Value::Int(y), ys))) = (a.get("a"), a.get("b")) else {
        let bad = if matches!(a.get("a"), Some((Value::Int(_), _))) { "b" } else { "a" };
        return Err(a.wrong(ev, bad, "an integer"));
    };
    if *y <= 0 {
        return Err(Diagnostic::error("E0301", format!("`{}` needs a positive divisor, found {y}", a.name()), *ys, "not positive"));
    }
    let q = x.div_euclid(*y);
    Ok(Value::Int(if ceil && x.rem_euclid(*y) != 0 { q + 1 } else { q }))
}

/// `a op b` with broadcasting; a number on one side becomes a scalar of the tensor's dtype.
pub fn elementwise(ev: &mut Evaluator, op: BinaryOp, l: (&Value, Span), r: (&Value, Span), span: Span) -> R<NodeId> {
    let ld = if let Value::Tensor(t) = l.0 { Some(ev.ty(*t).0) } else { None };
    let rd = if let Value::Tensor(t) = r.0 { Some(ev.ty(*t).0) } else { None };
    let dtype = ld.or(rd).expect("one side is a tensor");
    let sym = match op {
        BinaryOp::Add => "+",
        BinaryOp::Sub => "-",
        BinaryOp::Mul => "*",
        BinaryOp::Div => "/",
    };
    let operand = |ev: &mut Evaluator, v: &Value, s: Span| -> R<NodeId> {
        match v {
            Value::Tensor(t) => Ok(*t),
            Value::Int(i) => ev.add(Op::Constant { value: *i as f64 }, vec![], dtype, vec![], s),
            Value::Float(f) if dtype.is_float() => ev.add(Op::Constant { value: *f }, vec![], dtype, vec![], s),
            Value::Float(_) => Err(Diagnostic::error("E0202", format!("cannot combine a float with an integer tensor ({dtype}) in `{sym}`"), s, "a float")
                .with_help(format!("convert the tensor with `cast(x, f32)` first"))),
            other => Err(Diagnostic::error("E0201", format!("`{sym}` cannot combine a tensor with {}", ev.describe(other)), s, "not a tensor or number")),
        }
    };
    let a = operand(ev, l.0, l.1)?;
    let b = operand(ev, r.0, r.1)?;
    let (da, sa) = ev.ty(a);
    let (db, sb) = ev.ty(b);
    if da != db {
        let _ = span;
        let d = Diagnostic::error("E0202", format!("`{sym}` needs operands of one dtype, found {} and {}", fmt_type(da, sa), fmt_type(db, sb)), r.1, format!("this is {}", fmt_type(db, sb)))
            .with_label(l.1, format!("this is {}", fmt_type(da, sa)))
            .with_help(format!("convert one side, e.g. `cast(x, {})`", if da.is_float() { da } else { db }));
        return Err(d);
    }
    let (sa, sb) = (sa.to_vec(), sb.to_vec());
    match shape::broadcast(&sa, &sb) {
        Ok(out) => ev.add(Op::Binary(op), vec![a, b], da, out, span),
        Err(axis) => {
            let rank = sa.len().max(sb.len());
            let pick = |s: &[usize]| if axis + s.len() >= rank { s[axis + s.len() - rank] } else { 1 };
            let d = Diagnostic::error("E0203", format!("cannot broadcast {} with {} in `{sym}`", fmt_type(da, &sa), fmt_type(db, &sb)), r.1, format!("this is {}", fmt_type(db, &sb)))
                .with_label(l.1, format!("this is {}", fmt_type(da, &sa)))
                .with_note(format!("sizes {} and {} differ at axis {} of the result; broadcast sizes must be equal or 1", pick(&sa), pick(&sb), axis));
            let d = ev.origin_label(d, l.0, l.1, "the left side was");
            Err(ev.origin_label(d, r.0, r.1, "the right side was"))
        }
    }
}

pub fn matmul(ev: &mut Evaluator, l: (&Value, Span), r: (&Value, Span), span: Span) -> R<NodeId> {
    let side = |ev: &Evaluator, v: &Value, s: Span| -> R<NodeId> {
        match v {
            Value::Tensor(t) => Ok(*t),
            other => Err(Diagnostic::error("E0201", format!("`@` needs tensors on both sides, found {}", ev.describe(other)), s, "not a tensor")
                .with_help("to scale a tensor by a number use `*`")),
        }
    };
    let a = side(ev, l.0, l.1)?;
    let b = side(ev, r.0, r.1)?;
    let (da, sa) = ev.ty(a);
    let (db, sb) = ev.ty(b);
    let (sa, sb) = (sa.to_vec(), sb.to_vec());
    if da != db || !da.is_float() {
        let (bad, good) = if da.is_float() { (r, l) } else { (l, r) };
        let (bad_t, good_t) = if da.is_float() { (fmt_type(db, &sb), fmt_type(da, &sa)) } else { (fmt_type(da, &sa), fmt_type(db, &sb)) };
        let _ = span;
        return Err(Diagnostic::error("E0202", format!("`@` needs two float tensors of one dtype, found {} and {}", fmt_type(da, &sa), fmt_type(db, &sb)), bad.1, format!("this is {bad_t}"))
            .with_label(good.1, format!("this is {good_t}"))
            .with_help("convert with `cast(x, f32)`"));
    }
    match shape::matmul(&sa, &sb) {
        Ok(out) => ev.add(Op::MatMul, vec![a, b], da, out, span),
        Err(e) => {
            let (msg, note) = match e {
                shape::MatmulError::Scalar => ("`@` needs tensors with at least one axis".to_string(), None),
                shape::MatmulError::Inner { k_left, k_right } => (
                    format!("cannot multiply {} by {}", fmt_type(da, &sa), fmt_type(db, &sb)),
                    Some(format!("the last axis of the left side ({k_left}) must equal the second-to-last axis of the right side ({k_right})")),
                ),
                shape::MatmulError::Batch { axis } => (
                    format!("the batch axes of {} and {} do not broadcast", fmt_type(da, &sa), fmt_type(db, &sb)),
                    Some(format!("batch axis {axis} differs; batch sizes must be equal or 1")),
                ),
            };
            let mut d = Diagnostic::error("E0204", msg, r.1, format!("this is {}", fmt_type(db, &sb))).with_label(l.1, format!("this is {}", fmt_type(da, &sa)));
            if let Some(n) = note {
                d = d.with_note(n);
            }
            if matches!(e, shape::MatmulError::Inner { .. }) && sa.last() == sb.last() && sb.len() >= 2 {
                d = d.with_help("the right side may need transposing: `a @ b^T`");
            }
            let d = ev.origin_label(d, l.0, l.1, "the left side was");
            Err(ev.origin_label(d, r.0, r.1, "the right side was"))
        }
    }
}

// ---- shapes -----------------------------------------------------------------------------

pub fn swap_axes(ev: &mut Evaluator, t: NodeId, i: usize, j: usize, span: Span) -> R<NodeId> {
    let (d, s) = ev.ty(t);
    let mut perm: Vec<usize> = (0..s.len()).collect();
    perm.swap(i, j);
    let out: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
    ev.add(Op::Permute { perm }, vec![t], d, out, span)
}

fn transpose(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let rank = ev.ty(t).1.len();
    if rank < 2 {
        return Err(Diagnostic::error("E0206", format!("`transpose` needs at least 2 axes, found {}", ev.type_str(t)), a.span_of("x"), "cannot transpose"));
    }
    let i = a.axis(ev, "a", -2, rank)?;
    let j = a.axis(ev, "b", -1, rank)?;
    swap_axes(ev, t, i, j, a.span).map(Value::Tensor)
}

fn permute(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axes = a.ints(ev, "axes")?.expect("required");
    if axes.len() != s.len() {
        return Err(Diagnostic::error("E0206", format!("`permute` of {} needs {} axes, found {}", fmt_type(d, &s), s.len(), axes.len()), a.span_of("axes"), format!("{} axes given", axes.len())));
    }
    let mut perm = Vec::new();
    for &x in &axes {
        let p = shape::axis(x, s.len()).ok_or_else(|| a.axis_error("axes", x, s.len()))?;
        if perm.contains(&p) {
            return Err(Diagnostic::error("E0206", format!("`permute` names axis {p} twice"), a.span_of("axes"), "not a permutation").with_help("list every axis exactly once"));
        }
        perm.push(p);
    }
    let out = perm.iter().map(|&p| s[p]).collect();
    node(ev, Op::Permute { perm }, vec![t], d, out, a.span)
}

fn reshape(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let dims = a.ints(ev, "shape")?.expect("required");
    let total = shape::numel(&s).expect("checked when created");
    let mut out = Vec::new();
    let mut infer = None;
    for (i, &x) in dims.iter().enumerate() {
        match x {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            -1 => return Err(Diagnostic::error("E0203", "`reshape` can infer only one dimension", a.span_of("shape"), "two `-1`s")),
            x if x >= 1 => out.push(x as usize),
            x => return Err(Diagnostic::error("E0301", format!("`reshape` to a dimension of {x}"), a.span_of("shape"), "dimensions must be positive")),
        }
    }
    let Some(known) = shape::numel(&out) else {
        return Err(Diagnostic::error("E0301", format!("`reshape` to {:?} overflows", dims), a.span_of("shape"), "too many elements"));
    };
    if let Some(i) = infer {
        if known == 0 || total % known != 0 {
            return Err(Diagnostic::error("E0203", format!("cannot reshape {} ({total} elements) to {:?}", fmt_type(d, &s), dims), a.span_of("shape"), format!("{total} is not divisible by {known}")));
        }
        out[i] = total / known;
    } else if known != total {
        let d = Diagnostic::error("E0203", format!("cannot reshape {} ({total} elements) to {} ({known} elements)", fmt_type(d, &s), fmt_type(d, &out)), a.span_of("shape"), format!("{known} elements"))
            .with_label(a.span_of("x"), format!("{total} elements"));
        return Err(d);
    }
    node(ev, Op::Reshape, vec![t], d, out, a.span)
}

fn unsqueeze(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let mut s = s.to_vec();
    let ax = a.axis(ev, "axis", 0, s.len() + 1)?;
    s.insert(ax, 1);
    node(ev, Op::Reshape, vec![t], d, s, a.span)
}

fn squeeze(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let mut s = s.to_vec();
    let ax = a.axis(ev, "axis", 0, s.len())?;
    if s[ax] != 1 {
        return Err(Diagnostic::error("E0203", format!("`squeeze` of axis {ax} of {}: its size is {}, not 1", fmt_type(d, &s), s[ax]), a.span_of("axis"), "not a size-1 axis"));
    }
    s.remove(ax);
    node(ev, Op::Reshape, vec![t], d, s, a.span)
}

fn flatten(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let start = a.axis(ev, "start", 1, s.len())?;
    let end = a.axis(ev, "end", -1, s.len())?;
    if start > end {
        return Err(Diagnostic::error("E0207", format!("`flatten` start axis {start} is after end axis {end}"), a.span, "empty range"));
    }
    let mut out = s[..start].to_vec();
    out.push(s[start..=end].iter().product());
    out.extend_from_slice(&s[end + 1..]);
    node(ev, Op::Reshape, vec![t], d, out, a.span)
}

fn concat(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let items = match a.get("tensors") {
        Some((Value::List(l) | Value::Tuple(l), _)) => l.clone(),
        _ => return Err(a.wrong(ev, "tensors", "a list of tensors")),
    };
    let span = a.span_of("tensors");
    let mut ids = Vec::new();
    for v in items.iter() {
        match v {
            Value::Tensor(t) => ids.push(*t),
            other => return Err(Diagnostic::error("E0201", format!("`concat` needs tensors, found {}", ev.describe(other)), span, "in this list")),
        }
    }
    let Some(&first) = ids.first() else {
        return Err(Diagnostic::error("E0201", "`concat` needs at least one tensor", span, "empty list"));
    };
    let (d0, s0) = ev.ty(first);
    let s0 = s0.to_vec();
    let axis = a.axis(ev, "axis", 0, s0.len())?;
    let mut out = s0.clone();
    out[axis] = 0;
    for (i, &t) in ids.iter().enumerate() {
        let (d, s) = ev.ty(t);
        let ok = d == d0 && s.len() == s0.len() && s.iter().zip(&s0).enumerate().all(|(k, (x, y))| k == axis || x == y);
        if !ok {
            return Err(Diagnostic::error(
                "E0203",
                format!("`concat` along axis {axis} needs equal dtypes and equal sizes on every other axis, but tensor 0 is {} and tensor {i} is {}", fmt_type(d0, &s0), fmt_type(d, s)),
                span,
                "in this list",
            ));
        }
        out[axis] += s[axis];
    }
    node(ev, Op::Concat { axis }, ids, d0, out, a.span)
}

fn split(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", -1, s.len())?;
    let len = s[axis];
    let sizes: Vec<usize> = match a.get("parts") {
        Some((Value::Int(n), ps)) => {
            let n = *n;
            if n < 1 || len % n as usize != 0 {
                return Err(Diagnostic::error("E0203", format!("cannot split axis {axis} of size {len} into {n} equal parts"), *ps, format!("{len} is not divisible by {n}"))
                    .with_help("pass a list of sizes to split unevenly: `split(x, [a, b], axis)`"));
            }
            vec![len / n as usize; n as usize]
        }
        Some((Value::List(_) | Value::Tuple(_), ps)) => {
            let ps = *ps;
            let sizes = a.ints(ev, "parts")?.expect("present");
            if sizes.iter().any(|&x| x < 1) || sizes.iter().sum::<i64>() != len as i64 {
                return Err(Diagnostic::error("E0203", format!("split sizes {:?} do not add up to the size of axis {axis} ({len})", sizes), ps, "sizes must be positive and sum to the axis"));
            }
            sizes.into_iter().map(|x| x as usize).collect()
        }
        _ => return Err(a.wrong(ev, "parts", "a count or a list of sizes")),
    };
    let mut parts = Vec::new();
    let mut start = 0;
    for n in sizes {
        let mut out = s.clone();
        out[axis] = n;
        parts.push(node(ev, Op::Slice { axis, start, end: start + n }, vec![t], d, out, a.span)?);
        start += n;
    }
    Ok(tuple_of(parts))
}

fn slice(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", 0, s.len())?;
    let len = s[axis] as i64;
    let norm = |x: i64| if x < 0 { x + len } else { x };
    let start = norm(a.int_or(ev, "start", 0)?);
    let end = norm(a.int_or(ev, "end", len)?);
    if !(0 <= start && start < end && end <= len) {
        return Err(Diagnostic::error("E0207", format!("slice {start}..{end} is out of range for axis {axis} of size {len}"), a.span, "empty or out of range")
            .with_note(format!("the slice must satisfy 0 <= start < end <= {len}")));
    }
    let mut out = s.clone();
    out[axis] = (end - start) as usize;
    node(ev, Op::Slice { axis, start: start as usize, end: end as usize }, vec![t], d, out, a.span)
}

fn gather_impl(ev: &mut Evaluator, a: &Args, x: &str, index: &str, axis: usize) -> R<Value> {
    let (t, _) = a.tensor(ev, x)?;
    let (i, _) = int_tensor(ev, a, index)?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let mut out = s[..axis].to_vec();
    out.extend_from_slice(ev.ty(i).1);
    out.extend_from_slice(&s[axis + 1..]);
    node(ev, Op::Gather { axis }, vec![t, i], d, out, a.span)
}

fn gather(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let rank = ev.ty(t).1.len();
    let axis = a.axis(ev, "axis", 0, rank)?;
    gather_impl(ev, a, "x", "index", axis)
}

fn embedding(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (w, ws) = a.tensor(ev, "weight")?;
    if ev.ty(w).1.len() != 2 {
        return Err(Diagnostic::error("E0206", format!("`embedding` needs a 2-D weight [num, dim], found {}", ev.type_str(w)), ws, "not 2-D"));
    }
    gather_impl(ev, a, "weight", "ids", 0)
}

fn arange(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let n = a.int_or(ev, "n", 0)?;
    if n < 1 {
        return Err(Diagnostic::error("E0301", format!("`arange` needs a positive length, found {n}"), a.span_of("n"), "not positive"));
    }
    node(ev, Op::Arange, vec![], DType::I32, vec![n as usize], a.span)
}

// ---- reductions and normalization ---------------------------------------------------------

fn reduce(ev: &mut Evaluator, a: &Args, op: ReduceOp) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    if op == ReduceOp::Mean && !d.is_float() {
        return Err(Diagnostic::error("E0202", format!("`mean` needs a float tensor, found {}", fmt_type(d, &s)), a.span_of("x"), "not float").with_help("convert it with `cast(x, f32)`"));
    }
    let mut axes = Vec::new();
    match a.ints(ev, "axis")? {
        None => axes.extend(0..s.len()),
        Some(list) if list.is_empty() => {
            return Err(Diagnostic::error("E0207", format!("`{}` over an empty list of axes", a.name()), a.span_of("axis"), "no axes")
                .with_help("leave `axis` out to reduce over every axis"));
        }
        Some(list) => {
            for x in list {
                let ax = shape::axis(x, s.len()).ok_or_else(|| a.axis_error("axis", x, s.len()))?;
                if axes.contains(&ax) {
                    return Err(Diagnostic::error("E0207", format!("axis {ax} is listed twice"), a.span_of("axis"), "duplicate axis"));
                }
                axes.push(ax);
            }
        }
    }
    axes.sort_unstable();
    let keepdim = a.bool_or(ev, "keepdim", false)?;
    let out: Vec<usize> = s.iter().enumerate().filter_map(|(i, &x)| if axes.contains(&i) { keepdim.then_some(1) } else { Some(x) }).collect();
    node(ev, Op::Reduce { op, axes, keepdim }, vec![t], d, out, a.span)
}

fn argmax(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = a.tensor(ev, "x")?;
    let s = ev.ty(t).1.to_vec();
    let axis = a.axis(ev, "axis", -1, s.len())?;
    let mut out = s.clone();
    out.remove(axis);
    node(ev, Op::ArgMax { axis }, vec![t], DType::I32, out, a.span)
}

fn softmax(ev: &mut Evaluator, a: &Args, log: bool) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let axis = a.axis(ev, "axis", -1, s.len())?;
    node(ev, Op::Softmax { axis, log }, vec![t], d, s, a.span)
}

fn eps(ev: &Evaluator, a: &Args, default: f64) -> R<f64> {
    let e = a.number_or(ev, "eps", default)?;
    if e <= 0.0 || !e.is_finite() {
        return Err(Diagnostic::error("E0301", format!("`eps` must be positive, found {e}"), a.span_of("eps"), "not positive"));
    }
    Ok(e)
}

fn last_dim(ev: &Evaluator, a: &Args, t: NodeId) -> R<usize> {
    ev.ty(t).1.last().copied().ok_or_else(|| Diagnostic::error("E0206", format!("`{}` needs at least one axis, found a scalar", a.name()), a.span_of("x"), "a scalar"))
}

fn layer_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let n = last_dim(ev, a, t)?;
    let why = format!("layer_norm normalizes over the last axis, of size {n}");
    let w = vector_of(ev, a, "weight", n, d, &why)?;
    let b = vector_of(ev, a, "bias", n, d, &why)?;
    let eps = eps(ev, a, 1e-5)?;
    let inputs = std::iter::once(t).chain(w).chain(b).collect();
    node(ev, Op::LayerNorm { eps, has_weight: w.is_some(), has_bias: b.is_some() }, inputs, d, s, a.span)
}

fn rms_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let n = last_dim(ev, a, t)?;
    let w = vector_of(ev, a, "weight", n, d, &format!("rms_norm normalizes over the last axis, of size {n}"))?;
    let eps = eps(ev, a, 1e-6)?;
    let inputs = std::iter::once(t).chain(w).collect();
    node(ev, Op::RmsNorm { eps, has_weight: w.is_some() }, inputs, d, s, a.span)
}

/// Channels of an `[N, C, ...]` input with at least `min_rank` axes.
fn channels(ev: &Evaluator, a: &Args, t: NodeId, min_rank: usize, max_rank: usize, layout: &str) -> R<usize> {
    let s = ev.ty(t).1;
    if s.len() < min_rank || s.len() > max_rank {
        return Err(Diagnostic::error("E0206", format!("`{}` needs {layout}, found {}", a.name(), ev.type_str(t)), a.span_of("x"), format!("{} axes", s.len())));
    }
    Ok(s[1])
}

fn group_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let c = channels(ev, a, t, 2, 8, "[N, C, ...]")?;
    let groups = a.int_or(ev, "groups", 1)?;
    if groups < 1 || c % groups as usize != 0 {
        return Err(Diagnostic::error("E0203", format!("`group_norm` cannot split {c} channels into {groups} groups"), a.span_of("groups"), format!("{c} is not divisible by {groups}")));
    }
    let why = format!("group_norm has one weight per channel ({c})");
    let w = vector_of(ev, a, "weight", c, d, &why)?;
    let b = vector_of(ev, a, "bias", c, d, &why)?;
    let eps = eps(ev, a, 1e-5)?;
    let inputs = std::iter::once(t).chain(w).chain(b).collect();
    node(ev, Op::GroupNorm { groups: groups as usize, eps, has_weight: w.is_some(), has_bias: b.is_some() }, inputs, d, s, a.span)
}

fn batch_norm(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    let c = channels(ev, a, t, 2, 5, "[N, C], [N, C, L] or [N, C, H, W]")?;
    let why = format!("batch_norm keeps one statistic per channel ({c})");
    let mut stats = Vec::new();
    for name in ["running_mean", "running_var"] {
        let (r, rs) = a.tensor(ev, name)?;
        vector_of(ev, a, name, c, d, &why)?;
        let is_buffer = ev.graph.param_of(r).is_some_and(|p| !p.trainable);
        if !is_buffer {
            let mut dg = Diagnostic::error("E0203", format!("`{name}` of `batch_norm` must be a `buffer` field"), rs, "not a buffer")
                .with_help("declare it as `buffer f32[C] init zeros` (ones for the variance): running statistics are state, not trained");
            if let Some(p) = ev.graph.param_of(r) {
                dg = dg.with_label(p.span, "declared as a trainable `param` here");
            }
            return Err(dg);
        }
        stats.push(r);
    }
    let w = vector_of(ev, a, "weight", c, d, &why)?;
    let b = vector_of(ev, a, "bias", c, d, &why)?;
    let momentum = a.number_or(ev, "momentum", 0.1)?;
    if !(0.0..=1.0).contains(&momentum) {
        return Err(Diagnostic::error("E0301", format!("`momentum` must be between 0 and 1, found {momentum}"), a.span_of("momentum"), "out of range"));
    }
    let eps = eps(ev, a, 1e-5)?;
    let inputs = std::iter::once(t).chain(stats).chain(w).chain(b).collect();
    node(ev, Op::BatchNorm { eps, momentum, has_weight: w.is_some(), has_bias: b.is_some() }, inputs, d, s, a.span)
}

fn dropout(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (t, _) = float_tensor(ev, a, "x")?;
    let p = a.number_or(ev, "p", 0.1)?;
    if !(0.0..1.0).contains(&p) {
        return Err(Diagnostic::error("E0301", format!("dropout probability must be in [0, 1), found {p}"), a.span_of("p"), "out of range"));
    }
    let (d, s) = ev.ty(t);
    let s = s.to_vec();
    node(ev, Op::Dropout { p }, vec![t], d, s, a.span)
}

// ---- convolution and resampling -------------------------------------------------------------

/// An int or a per-axis list for `spatial` axes.
fn per_axis(ev: &Evaluator, a: &Args, name: &str, default: usize, spatial: usize, min: i64) -> R<Vec<usize>> {
    let v = match a.ints(ev, name)? {
        None => vec![default; spatial],
        Some(v) if v.len() == 1 => vec![v[0].max(0) as usize; spatial],
        Some(v) if v.len() == spatial => v.iter().map(|&x| x.max(0) as usize).collect(),
        Some(v) => {
            return Err(Diagnostic::error("E0201", format!("`{name}` needs 1 or {spatial} values, found {}", v.len()), a.span_of(name), "wrong number of values"))
        }
    };
    if let Some(bad) = a.ints(ev, name)?.and_then(|l| l.into_iter().find(|&x| x < min)) {
        return Err(Diagnostic::error("E0301", format!("`{name}` must be at least {min}, found {bad}"), a.span_of(name), "out of range"));
    }
    Ok(v)
}

fn conv(ev: &mut Evaluator, a: &Args, spatial: usize) -> R<Value> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (w, ws) = float_tensor(ev, a, "weight")?;
    let (d, sx) = ev.ty(x);
    let sx = sx.to_vec();
    let sw = ev.ty(w).1.to_vec();
    let layout = if spatial == 1 { "[N, Cin, L]" } else { "[N, Cin, H, W]" };
    if sx.len() != spatial + 2 {
        return Err(Diagnostic::error("E0206", format!("`{}` needs an input {layout}, found {}", a.name(), fmt_type(d, &sx)), xs, format!("{} axes", sx.len())));
    }
    let wlayout = if spatial == 1 { "[Cout, Cin / groups, K]" } else { "[Cout, Cin / groups, Kh, Kw]" };
    if sw.len() != spatial + 2 || ev.ty(w).0 != d {
        return Err(Diagnostic::error("E0206", format!("`{}` needs a {d} weight {wlayout}, found {}", a.name(), ev.type_str(w)), ws, "wrong weight shape"));
    }
    let groups = a.int_or(ev, "groups", 1)?;
    let (cin, cout) = (sx[1], sw[0]);
    if groups < 1 || cin % groups as usize != 0 || cout % groups as usize != 0 {
        return Err(Diagnostic::error("E0203", format!("`groups = {groups}` must divide both the input channels ({cin}) and the output channels ({cout})"), a.span_of("groups"), "does not divide"));
    }
    let groups = groups as usize;
    if sw[1] * groups != cin {
        let d = Diagnostic::error("E0203", format!("`{}` input has {cin} channels but the weight expects {}", a.name(), sw[1] * groups), xs, format!("this is {}", fmt_type(d, &sx)))
            .with_label(ws, format!("weight {} takes {} input channel{}{}", ev.type_str(w), sw[1], super::eval::plural(sw[1]), if groups > 1 { format!(" per group ({groups} groups)") } else { String::new() }));
        return Err(d);
    }
    let stride = per_axis(ev, a, "stride", 1, spatial, 1)?;
    let padding = per_axis(ev, a, "padding", 0, spatial, 0)?;
    let dilation = per_axis(ev, a, "dilation", 1, spatial, 1)?;
    let mut out = vec![sx[0], cout];
    for i in 0..spatial {
        let k = sw[2 + i];
        match shape::window_out(sx[2 + i], k, stride[i], padding[i], dilation[i]) {
            Some(o) => out.push(o),
            None => {
                return Err(Diagnostic::error("E0203", format!("`{}` kernel of size {k} (dilation {}) does not fit spatial axis {} of size {} with padding {}", a.name(), dilation[i], i + 2, sx[2 + i], padding[i]), a.span, "output would be empty")
                    .with_label(xs, format!("this is {}", fmt_type(d, &sx))))
            }
        }
    }
    let bias = vector_of(ev, a, "bias", cout, d, &format!("a convolution has one bias per output channel ({cout})"))?;
    let inputs = [x, w].into_iter().chain(bias).collect();
    node(ev, Op::Conv { stride, padding, dilation, groups, has_bias: bias.is_some() }, inputs, d, out, a.span)
}

fn pool(ev: &mut Evaluator, a: &Args, op: PoolOp) -> R<Value> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    if s.len() != 4 {
        return Err(Diagnostic::error("E0206", format!("`{}` needs an input [N, C, H, W], found {}", a.name(), fmt_type(d, &s)), xs, format!("{} axes", s.len())));
    }
    let kernel = per_axis(ev, a, "kernel", 1, 2, 1)?;
    let stride = if a.get("stride").is_some() { per_axis(ev, a, "stride", 1, 2, 1)? } else { kernel.clone() };
    let padding = per_axis(ev, a, "padding", 0, 2, 0)?;
    let mut out = vec![s[0], s[1]];
    for i in 0..2 {
        if padding[i] * 2 > kernel[i] {
            return Err(Diagnostic::error("E0203", format!("padding {} is more than half the kernel size {}", padding[i], kernel[i]), a.span_of("padding"), "too much padding"));
        }
        match shape::window_out(s[2 + i], kernel[i], stride[i], padding[i], 1) {
            Some(o) => out.push(o),
            None => {
                return Err(Diagnostic::error("E0203", format!("pooling window {} does not fit axis {} of size {}", kernel[i], i + 2, s[2 + i]), a.span, "output would be empty")
                    .with_label(xs, format!("this is {}", fmt_type(d, &s))))
            }
        }
    }
    node(ev, Op::Pool { op, kernel, stride, padding }, vec![x], d, out, a.span)
}

fn upsample(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    if s.len() != 3 && s.len() != 4 {
        return Err(Diagnostic::error("E0206", format!("`upsample` needs [N, C, L] or [N, C, H, W], found {}", fmt_type(d, &s)), xs, format!("{} axes", s.len())));
    }
    let scale = a.int_or(ev, "scale", 2)?;
    if scale < 1 {
        return Err(Diagnostic::error("E0301", format!("`scale` must be at least 1, found {scale}"), a.span_of("scale"), "out of range"));
    }
    let mut out = Vec::new();
    for (i, &x) in s.iter().enumerate() {
        let size = if i >= 2 { x.checked_mul(scale as usize) } else { Some(x) };
        out.push(size.ok_or_else(|| Diagnostic::error("E0301", format!("`upsample` by {scale} makes axis {i} too large"), a.span_of("scale"), "overflow"))?);
    }
    node(ev, Op::Upsample { scale: scale as usize }, vec![x], d, out, a.span)
}

// ---- attention ------------------------------------------------------------------------------

fn attention(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (q, qs) = float_tensor(ev, a, "q")?;
    let (k, ks) = float_tensor(ev, a, "k")?;
    let (v, vs) = float_tensor(ev, a, "v")?;
    let (d, sq) = ev.ty(q);
    let (sq, sk, sv) = (sq.to_vec(), ev.ty(k).1.to_vec(), ev.ty(v).1.to_vec());
    for (t, s, name) in [(q, qs, "q"), (k, ks, "k"), (v, vs, "v")] {
        if ev.ty(t).1.len() < 3 {
            return Err(Diagnostic::error("E0206", format!("`attention` needs `{name}` as [..B, heads, T, D], found {}", ev.type_str(t)), s, "too few axes")
                .with_help("split the model dimension into heads first, e.g. with `split_heads` from std.attention"));
        }
        if ev.ty(t).0 != d {
            return Err(Diagnostic::error("E0202", format!("`attention` needs q, k and v of one dtype, found {} and {}", d, ev.ty(t).0), s, "different dtype"));
        }
    }
    let r = sq.len();
    let mismatch = |msg: String, span: Span, label: String| Diagnostic::error("E0203", msg, span, label);
    if sk.len() != r || sv.len() != r {
        return Err(mismatch(format!("`attention` needs q, k and v of one rank, found {}, {} and {}", fmt_type(d, &sq), fmt_type(d, &sk), fmt_type(d, &sv)), a.span, "ranks differ".into()));
    }
    let batch = &sq[..r - 3];
    if &sk[..r - 3] != batch || &sv[..r - 3] != batch {
        return Err(mismatch(format!("`attention` batch axes differ: q is {}, k is {}, v is {}", fmt_type(d, &sq), fmt_type(d, &sk), fmt_type(d, &sv)), ks, "batch axes differ".into()));
    }
    let (hq, tq, dq) = (sq[r - 3], sq[r - 2], sq[r - 1]);
    let (hk, tk, dk) = (sk[r - 3], sk[r - 2], sk[r - 1]);
    let (hv, tv, dv) = (sv[r - 3], sv[r - 2], sv[r - 1]);
    if dq != dk {
        return Err(mismatch(format!("`attention` head size of q ({dq}) and k ({dk}) differ"), ks, format!("k is {}", fmt_type(d, &sk)))
            .with_label(qs, format!("q is {}", fmt_type(d, &sq))));
    }
    if hk != hv || tk != tv {
        return Err(mismatch(format!("`attention` needs k and v with the same heads and length, found {} and {}", fmt_type(d, &sk), fmt_type(d, &sv)), vs, format!("v is {}", fmt_type(d, &sv)))
            .with_label(ks, format!("k is {}", fmt_type(d, &sk))));
    }
    if hq % hk != 0 {
        return Err(mismatch(format!("`attention`: {hk} key/value heads cannot be shared among {hq} query heads"), ks, format!("k has {hk} heads"))
            .with_label(qs, format!("q has {hq} heads"))
            .with_help("with grouped KV heads the number of key/value heads must divide the number of query heads"));
    }
    let causal = a.bool_or(ev, "causal", false)?;
    let scale = a.number_or(ev, "scale", 1.0 / (dq as f64).sqrt())?;
    let mut inputs = vec![q, k, v];
    let mask = a.opt_tensor(ev, "mask")?;
    if let Some((m, ms)) = mask {
        let (md, msh) = ev.ty(m);
        let scores: Vec<usize> = batch.iter().copied().chain([hq, tq, tk]).collect();
        let fits = md == d && shape::broadcast(msh, &scores).is_ok_and(|b| b == scores);
        if !fits {
            return Err(Diagnostic::error("E0203", format!("`attention` mask {} does not broadcast to the scores {}", ev.type_str(m), fmt_type(d, &scores)), ms, "mask shape")
                .with_help("an additive mask of shape [B, 1, 1, Tk] (0 to keep, a large negative number to drop) fits every head and query"));
        }
        inputs.push(m);
    }
    let mut out = batch.to_vec();
    out.extend([hq, tq, dv]);
    node(ev, Op::Attention { causal, scale, has_mask: mask.is_some() }, inputs, d, out, a.span)
}

fn rope(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    if s.len() < 2 || s[s.len() - 1] % 2 != 0 {
        return Err(Diagnostic::error("E0203", format!("`rope` needs [.., T, D] with an even D, found {}", fmt_type(d, &s)), xs, format!("this is {}", fmt_type(d, &s)))
            .with_help("rotary embeddings rotate pairs of features, so the head size must be even"));
    }
    let theta = a.number_or(ev, "theta", 10000.0)?;
    let offset = a.int_or(ev, "offset", 0)?;
    if offset < 0 || theta <= 0.0 {
        return Err(Diagnostic::error("E0301", "`rope` needs a positive theta and a non-negative offset", a.span, "out of range"));
    }
    node(ev, Op::Rope { theta, offset: offset as usize, inverse: false }, vec![x], d, s, a.span)
}

fn softmax_cross_entropy(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (l, ls) = float_tensor(ev, a, "logits")?;
    let (t, ts) = int_tensor(ev, a, "targets")?;
    let (d, sl) = ev.ty(l);
    let (sl, st) = (sl.to_vec(), ev.ty(t).1.to_vec());
    if sl.is_empty() || st.as_slice() != &sl[..sl.len() - 1] {
        let want = if sl.is_empty() { "[..N]".to_string() } else { format!("{:?}", &sl[..sl.len() - 1]) };
        return Err(Diagnostic::error("E0203", format!("cross-entropy targets must have the logits' shape without the class axis, {want}, found {}", ev.type_str(t)), ts, format!("this is {}", ev.type_str(t)))
            .with_label(ls, format!("logits are {}", fmt_type(d, &sl))));
    }
    node(ev, Op::SoftmaxCrossEntropy, vec![l, t], d, vec![], a.span)
}

// ---- initializers ---------------------------------------------------------------------------

fn normal(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let mean = a.number_or(ev, "mean", 0.0)?;
    let std = a.number_or(ev, "std", 1.0)?;
    if !(std >= 0.0 && std.is_finite() && mean.is_finite()) {
        return Err(Diagnostic::error("E0301", format!("`normal` needs a finite mean and std >= 0, found std = {std}"), a.span, "invalid"));
    }
    Ok(Value::Init(InitSpec::Normal { mean, std }))
}

fn uniform(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let low = a.number_or(ev, "low", -1.0)?;
    let high = a.number_or(ev, "high", 1.0)?;
    if !(low <= high && low.is_finite() && high.is_finite()) {
        return Err(Diagnostic::error("E0301", format!("`uniform` needs low <= high, found {low} and {high}"), a.span, "invalid range"));
    }
    Ok(Value::Init(InitSpec::Uniform { low, high }))
}

fn erf(x: f64) -> f64 {
    libm::erf(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_accurate() {
        for (x, want) in [(0.0, 0.0), (0.5, 0.5204998778130465), (1.0, 0.8427007929497149), (2.0, 0.9953222650189527), (3.0, 0.9999779095030014), (-1.0, -0.8427007929497149)] {
            assert!((erf(x) - want).abs() < 1e-12, "erf({x}) = {} (want {want})", erf(x));
        }
    }

    #[test]
    fn builtin_names_are_unique_and_params_well_formed() {
        let mut names: Vec<&str> = names().collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
        for b in all() {
            let mut seen_optional = false;
            for p in b.params {
                assert!(!(seen_optional && !p.ends_with('?')), "{}: required parameter after an optional one", b.name);
                seen_optional |= p.ends_with('?');
            }
        }
    }
}
