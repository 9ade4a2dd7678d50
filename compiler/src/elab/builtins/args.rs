//! Binding call arguments to a builtin's parameters, and typed access to them for the rules.

use super::Builtin;
use crate::elab::eval::{as_f64, bind_args, plural, ArgVal, Evaluator, R};
use crate::elab::value::Value;
use crate::front::{did_you_mean, nearest, replace_with};
use crate::graph::{fmt_type, NodeId, Op};
use mgn_ir::shape;
use mgn_ir::DType;
use mgn_syntax::ast::Ident;
use mgn_syntax::{Diagnostic, Span};
use std::rc::Rc;

pub struct Args {
    builtin: &'static Builtin,
    vals: Vec<Option<(Value, Span)>>,
    /// How many arguments the call wrote (an omitted value passed on counts too).
    pub written: usize,
    pub span: Span,
}

pub fn call(ev: &mut Evaluator, b: &'static Builtin, args: Vec<ArgVal>, span: Span) -> R<Value> {
    let names: Vec<&str> = b.params.iter().map(|p| p.trim_end_matches('?')).collect();
    let written = args.len();
    let too_many = |a: &ArgVal| {
        if b.name == super::EINSUM {
            return too_many_operands(a, written - 1);
        }
        let n = names.len();
        let msg = format!("`{}` takes at most {n} argument{}", b.name, plural(n));
        Diagnostic::error("E0401", msg, a.span, "unexpected argument").with_note(signature(b))
    };
    let unknown = |n: &Ident| {
        let msg = format!("`{}` has no parameter named `{}`", b.name, n.name);
        let d = Diagnostic::error("E0401", msg, n.span, "unknown parameter");
        match nearest(&n.name, names.iter().copied()) {
            Some(c) => replace_with(d.with_help(format!("did you mean `{c}`?")), n.span, c),
            None => d.with_note(signature(b)),
        }
    };
    let slots = bind_args(&names, args, too_many, unknown)?;
    // An absent optional field, or an optional parameter the caller left out, passed to an
    // optional parameter counts as not given.
    let vals: Vec<Option<(Value, Span)>> = (slots.into_iter().zip(b.params))
        .map(|(a, p)| a.filter(|a| !(a.value.is_missing() && p.ends_with('?'))))
        .map(|a| a.map(|a| (a.value, a.span)))
        .collect();
    for (i, p) in b.params.iter().enumerate() {
        if !p.ends_with('?') && vals[i].is_none() {
            return Err(Diagnostic::error(
                "E0401",
                format!("missing argument `{p}` in this call to `{}`", b.name),
                span,
                format!("`{p}` not given"),
            )
            .with_note(signature(b)));
        }
    }
    let args = Args { builtin: b, vals, written, span };
    (b.run)(ev, &args)
}

/// `einsum` with more than two operands: counted as operands, not arguments (its spec is one),
/// with the way to contract more.
fn too_many_operands(a: &ArgVal, operands: usize) -> Diagnostic {
    Diagnostic::error(
        "E0401",
        format!("`einsum` takes one or two operands, found {operands}"),
        a.span,
        "a third operand",
    )
    .with_help("contract two at a time: `einsum(\"ik,kl->il\", einsum(\"ij,jk->ik\", a, b), c)`")
}

/// The value of a builtin value (`training`), read where its name is written.
pub fn read(ev: &mut Evaluator, b: &'static Builtin, span: Span) -> R<Value> {
    (b.run)(ev, &Args { builtin: b, vals: Vec::new(), written: 0, span })
}

pub fn signature(b: &Builtin) -> String {
    format!("`{}({})`", b.name, b.params.join(", "))
}

impl Args {
    pub(super) fn slot(&self, name: &str) -> usize {
        self.builtin
            .params
            .iter()
            .position(|p| p.trim_end_matches('?') == name)
            .expect("builtins ask only for their own parameters")
    }

    pub(super) fn get(&self, name: &str) -> Option<&(Value, Span)> {
        self.vals[self.slot(name)].as_ref()
    }

    pub(super) fn raw(&self, name: &str) -> (Value, Span) {
        self.get(name).cloned().expect("required arguments are checked before the rule runs")
    }

    pub(super) fn wrong(&self, ev: &Evaluator, name: &str, want: &str) -> Diagnostic {
        let (v, s) = self.get(name).expect("only present arguments are wrong");
        let mut d = Diagnostic::error(
            "E0201",
            format!(
                "argument `{name}` of `{}` must be {want}, found {}",
                self.builtin.name,
                ev.describe(v)
            ),
            *s,
            format!("expected {want}"),
        );
        if let Value::Absent { field } = v {
            d = d.with_label(*field, "this field does not exist: its `if` condition is false");
        }
        if let Value::Omitted { param } = v {
            d = d.with_label(*param, "this optional parameter was not given");
        }
        d
    }

    pub(super) fn tensor(&self, ev: &Evaluator, name: &str) -> R<(NodeId, Span)> {
        match self.get(name) {
            Some((Value::Tensor(t), s)) => Ok((*t, *s)),
            _ => Err(self.wrong(ev, name, "a tensor")),
        }
    }

    pub(super) fn opt_tensor(&self, ev: &Evaluator, name: &str) -> R<Option<(NodeId, Span)>> {
        match self.get(name) {
            None => Ok(None),
            Some(_) => self.tensor(ev, name).map(Some),
        }
    }

    pub(super) fn int_or(&self, ev: &Evaluator, name: &str, default: i64) -> R<i64> {
        match self.get(name) {
            None => Ok(default),
            Some((Value::Int(i), _)) => Ok(*i),
            _ => Err(self.wrong(ev, name, "an integer")),
        }
    }

    pub(super) fn number(&self, ev: &Evaluator, name: &str) -> R<f64> {
        match self.get(name) {
            Some((Value::Int(_) | Value::Float(_), _)) => {
                Ok(as_f64(&self.get(name).expect("matched").0))
            }
            _ => Err(self.wrong(ev, name, "a number")),
        }
    }

    pub(super) fn number_or(&self, ev: &Evaluator, name: &str, default: f64) -> R<f64> {
        if self.get(name).is_none() {
            return Ok(default);
        }
        self.number(ev, name)
    }

    pub(super) fn bool_or(&self, ev: &Evaluator, name: &str, default: bool) -> R<bool> {
        match self.get(name) {
            None => Ok(default),
            Some((Value::Bool(b), _)) => Ok(*b),
            _ => Err(self.wrong(ev, name, "a bool")),
        }
    }

    /// One of `choices` (a string argument), or `default` when not given; a typo gets the
    /// nearest choice as help.
    pub(super) fn choice<'c>(
        &self,
        ev: &Evaluator,
        name: &str,
        choices: &[&'c str],
        default: &'c str,
    ) -> R<&'c str> {
        let Some((v, s)) = self.get(name) else { return Ok(default) };
        let listed = || choices.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
        let Value::Str(text) = v else {
            return Err(self.wrong(ev, name, &format!("one of {}", listed())));
        };
        if let Some(c) = choices.iter().find(|c| ***c == **text) {
            return Ok(c);
        }
        let d = Diagnostic::error(
            "E0201",
            format!(
                "`{name}` of `{}` must be one of {}, found \"{text}\"",
                self.builtin.name,
                listed()
            ),
            *s,
            "unknown choice",
        );
        Err(match did_you_mean(text, choices.iter().copied()) {
            Some(h) => d.with_help(h),
            None => d,
        })
    }

    /// A number or a list/tuple of numbers.
    pub(super) fn numbers(&self, ev: &Evaluator, name: &str) -> R<Option<Vec<f64>>> {
        let want = "a number or a list of numbers";
        match self.get(name) {
            None => Ok(None),
            Some((v @ (Value::Int(_) | Value::Float(_)), _)) => Ok(Some(vec![as_f64(v)])),
            Some((Value::List(l) | Value::Tuple(l), _)) => l
                .iter()
                .map(|v| match v {
                    Value::Int(_) | Value::Float(_) => Ok(as_f64(v)),
                    _ => Err(self.wrong(ev, name, want)),
                })
                .collect::<R<Vec<f64>>>()
                .map(Some),
            _ => Err(self.wrong(ev, name, want)),
        }
    }

    /// An integer or a list/tuple of integers.
    pub(super) fn ints(&self, ev: &Evaluator, name: &str) -> R<Option<Vec<i64>>> {
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

    pub(super) fn span_of(&self, name: &str) -> Span {
        self.get(name).map(|(_, s)| *s).unwrap_or(self.span)
    }

    pub(super) fn axis(&self, ev: &Evaluator, name: &str, default: i64, rank: usize) -> R<usize> {
        let a = self.int_or(ev, name, default)?;
        shape::axis(a, rank).ok_or_else(|| self.axis_error(name, a, rank))
    }

    pub(super) fn axis_error(&self, name: &str, a: i64, rank: usize) -> Diagnostic {
        Diagnostic::error(
            "E0207",
            format!(
                "axis {a} is out of range for a tensor with {rank} ax{}",
                if rank == 1 { "is" } else { "es" }
            ),
            self.span_of(name),
            "axis out of range",
        )
        .with_help(if rank == 0 {
            "a scalar has no axes".to_string()
        } else {
            format!("valid axes are -{rank} … {}", rank as i64 - 1)
        })
    }

    pub(super) fn name(&self) -> &'static str {
        self.builtin.name
    }

    /// The builtin's signature, for notes: `` `clamp(x, min?, max?)` ``.
    pub(super) fn signature(&self) -> String {
        signature(self.builtin)
    }
}

pub(super) fn float_tensor(ev: &Evaluator, a: &Args, name: &str) -> R<(NodeId, Span)> {
    let (t, s) = a.tensor(ev, name)?;
    if !ev.ty(t).0.is_float() {
        return Err(Diagnostic::error(
            "E0202",
            format!("`{}` needs a float tensor for `{name}`, found {}", a.name(), ev.type_str(t)),
            s,
            format!("this is {}", ev.type_str(t)),
        )
        .with_help("convert it with `cast(x, f32)`"));
    }
    Ok((t, s))
}

pub(super) fn int_tensor(ev: &Evaluator, a: &Args, name: &str) -> R<(NodeId, Span)> {
    let (t, s) = a.tensor(ev, name)?;
    if !ev.ty(t).0.is_int() {
        return Err(Diagnostic::error(
            "E0202",
            format!("`{}` needs integer `{name}`, found {}", a.name(), ev.type_str(t)),
            s,
            format!("this is {}", ev.type_str(t)),
        )
        .with_help("indices and class labels are i32 (or i64) tensors"));
    }
    Ok((t, s))
}

/// Checks that an optional per-feature tensor (a norm's weight or bias) has shape `[n]`.
pub(super) fn vector_of(
    ev: &Evaluator,
    a: &Args,
    name: &str,
    n: usize,
    dtype: DType,
    why: &str,
) -> R<Option<NodeId>> {
    let Some((t, s)) = a.opt_tensor(ev, name)? else { return Ok(None) };
    let (d, shape) = ev.ty(t);
    if shape != [n] || d != dtype {
        return Err(Diagnostic::error(
            "E0203",
            format!(
                "`{name}` of `{}` must be {}, found {}",
                a.name(),
                fmt_type(dtype, &[n]),
                ev.type_str(t)
            ),
            s,
            format!("this is {}", ev.type_str(t)),
        )
        .with_note(why.to_string()));
    }
    Ok(Some(t))
}

/// Adds the node a builtin computed, after the IR's typing rule for its op agrees with the
/// type the builtin gave it: the builtin's checks explain a mistake in the user's words, the
/// rule (`mgn_ir::infer`, shared with the validator and the backends) is the one definition of
/// what the op produces, and a disagreement is a compiler bug reported at this call.
pub(super) fn node(
    ev: &mut Evaluator,
    op: Op,
    inputs: Vec<NodeId>,
    dtype: DType,
    shape: Vec<usize>,
    span: Span,
) -> R<Value> {
    checked(ev, op, inputs, dtype, shape, span).map(Value::Tensor)
}

/// [`node`], returning the node itself.
pub fn checked(
    ev: &mut Evaluator,
    op: Op,
    inputs: Vec<NodeId>,
    dtype: DType,
    shape: Vec<usize>,
    span: Span,
) -> R<NodeId> {
    let types: Vec<(DType, &[usize])> = inputs.iter().map(|&x| ev.ty(x)).collect();
    if let Err(e) = mgn_ir::infer::check(&op, &types, (dtype, &shape)) {
        return Err(Diagnostic::error(
            "E0999",
            format!("internal error: `{}` typed against the IR's rule: {e}", op.describe()),
            span,
            "while elaborating this call",
        ));
    }
    ev.add(op, inputs, dtype, shape, span)
}

pub(super) fn tuple_of(vals: Vec<Value>) -> Value {
    Value::Tuple(Rc::new(vals))
}
