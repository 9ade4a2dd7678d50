//! Calls: of builtins, `fn`s, layer types (instantiation, inside field initializers only),
//! layer instances (their `forward`) and repeated layers; and binding arguments to the
//! declared parameters.

use super::*;
use crate::front::{continued_call, nearest, paren_on_new_line, replace_with};

impl<'p> Evaluator<'p> {
    pub(super) fn call_expr(&mut self, callee: &Expr, args: &[Arg], span: Span) -> R<Value> {
        let f = self.eval(callee)?;
        // A layer type called while a field is being initialized becomes that field.
        let ctor_path = match &f {
            Value::Item(m, i) if matches!(self.prog.item(*m, *i), Item::Layer(_)) => {
                self.ctor_path.take()
            }
            _ => None,
        };
        // `full_precision(x)` marks every node its argument makes (`Node::full_precision`),
        // with its derivatives unless `derivatives = false`.
        let pin = match &f {
            Value::Builtin(b) if b.name == builtins::FULL_PRECISION => {
                Some(self.pins_derivatives(args)? as usize)
            }
            _ => None,
        };
        pin.into_iter().for_each(|k| self.full_precision[k] += 1);
        let vals = self.eval_args(args);
        pin.into_iter().for_each(|k| self.full_precision[k] -= 1);
        self.call(f, callee.span, vals?, span, ctor_path)
    }

    /// Whether a call of `full_precision` keeps its argument's derivatives in f32: its
    /// `derivatives` argument (named, or second), evaluated before the argument it pins. A
    /// value that is no bool is the builtin's own error, reported when it is called.
    fn pins_derivatives(&mut self, args: &[Arg]) -> R<bool> {
        let given = args.iter().enumerate().find(|(k, a)| match &a.name {
            Some(name) => name.name == "derivatives",
            None => *k == 1,
        });
        match given {
            Some((_, a)) => Ok(!matches!(self.eval(&a.value)?, Value::Bool(false))),
            None => Ok(true),
        }
    }

    pub(super) fn eval_args(&mut self, args: &[Arg]) -> R<Vec<ArgVal>> {
        let mut vals = Vec::with_capacity(args.len());
        for a in args {
            vals.push(ArgVal {
                name: a.name.clone(),
                value: self.eval(&a.value)?,
                span: a.value.span,
            });
        }
        Ok(vals)
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
                _ => Err(self.not_callable(&f, callee_span, span)),
            },
            Value::Layer(inst) => self.call_forward(inst, args, span),
            Value::Sequence(seq) => self.call_sequence(&seq, args, span),
            other => Err(self.not_callable(&other, callee_span, span)),
        }
    }

    fn not_callable(&self, f: &Value, callee_span: Span, span: Span) -> Diagnostic {
        let d = Diagnostic::error(
            "E0201",
            format!("{} is not callable", self.describe(f)),
            callee_span,
            "not a function or layer",
        );
        match paren_on_new_line(self.prog, callee_span, span) {
            Some(paren) => continued_call(self.prog, d, callee_span, paren),
            None => d,
        }
    }

    /// Calls each item in turn, its result the next item's first argument; a nested sequence
    /// is called the same way.
    fn call_sequence(&mut self, seq: &Sequence, args: Vec<ArgVal>, span: Span) -> R<Value> {
        if let Some(first) = args.first() {
            if first.name.is_some() {
                return Err(Diagnostic::error(
                    "E0401",
                    "the first argument of a repeated layer must be positional",
                    first.span,
                    "named",
                )
                .with_help(concat!(
                    "each copy's result is passed on as the next copy's first argument: ",
                    "write `blocks(x, ...)`"
                )));
            }
        }
        let mut args = args;
        for item in &seq.items {
            let (out, what) = match item {
                Value::Layer(inst) => {
                    (self.call_forward(inst.clone(), args.clone(), span)?, &inst.type_name)
                }
                Value::Sequence(inner) => {
                    (self.call_sequence(inner, args.clone(), span)?, &inner.path)
                }
                _ => unreachable!("a sequence holds layers and sequences"),
            };
            if !matches!(out, Value::Tensor(_)) {
                return Err(Diagnostic::error(
                    "E0201",
                    format!(
                        "a repeated `{what}` must return one tensor to feed the next copy, \
                         found {}",
                        self.describe(&out)
                    ),
                    span,
                    "in this call",
                ));
            }
            let ArgVal { name, span: s0, .. } = args.remove(0);
            args.insert(0, ArgVal { name, value: out, span: s0 });
        }
        Ok(args.into_iter().next().map(|a| a.value).unwrap_or_else(Value::unit))
    }

    fn call_fn(
        &mut self,
        module: ModId,
        func: &'p FnItem,
        args: Vec<ArgVal>,
        span: Span,
    ) -> R<Value> {
        let step = FrameStep::new(StepKind::Fn, &func.name, func.span);
        let frame = Frame { module, locals: Locals::default(), fields: None, model: false, step };
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
            locals: layer::layer_locals(&inst, l).into(),
            fields: Some((inst.type_name.clone(), inst.fields.clone())),
            model: false,
            step: FrameStep {
                origin: Some(inst.span),
                ..FrameStep::new(StepKind::Forward, &l.name, l.span)
            },
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
        let slots = match_args(params, args, what, def)?;
        for (p, slot) in params.iter().zip(slots) {
            // Left out, or given something missing itself (an optional parameter passed on):
            // an optional parameter is bound to "not given", never type-checked.
            let slot = slot.filter(|a| !(p.optional && a.value.is_missing()));
            if p.optional && slot.is_none() {
                let value = Value::Omitted { param: p.name.span };
                let text = "not given (optional)".to_string();
                self.facts.push(Fact { span: p.name.span, kind: FactKind::Arg, text });
                self.bind(&p.name.name, p.name.span, value);
                continue;
            }
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
            self.bind(&p.name.name, p.name.span, value);
        }
        Ok(())
    }

    fn check_param(&mut self, p: &Param, v: Value, span: Span, what: &str) -> R<Value> {
        self.check_type(&p.ty, v, span, &format!("argument `{}` of {what}", p.name.name))
    }

    /// Turns an initializer-valued expression result into an `InitSpec` (`zeros` may be
    /// written without parentheses).
    pub fn as_init(&mut self, v: Value, span: Span) -> R<Value> {
        let called = match &v {
            Value::Init(_) => return Ok(v),
            Value::Builtin(_) | Value::Item(..) => {
                self.call(v.clone(), span, Vec::new(), span, None)
            }
            _ => Ok(v.clone()),
        };
        match called {
            Ok(Value::Init(i)) => Ok(Value::Init(i)),
            _ => Err(Diagnostic::error(
                "E0201",
                format!("expected an initializer, found {}", self.describe(&v)),
                span,
                "not an initializer",
            )
            .with_help(concat!(
                "use zeros, ones, constant(v), normal(mean, std), uniform(low, high) ",
                "or a `std.init` function"
            ))),
        }
    }
}

/// Matches arguments to parameters: positional ones in order, then named ones by name.
fn match_args(
    params: &[Param],
    args: Vec<ArgVal>,
    what: &str,
    def: Span,
) -> R<Vec<Option<ArgVal>>> {
    let names: Vec<&str> = params.iter().map(|p| p.name.name.as_str()).collect();
    let too_many = |a: &ArgVal| {
        let n = params.len();
        let msg = format!("{what} takes {n} argument{} but more were given", plural(n));
        Diagnostic::error("E0401", msg, a.span, "unexpected argument")
            .with_label(def, "defined here")
    };
    bind_args(&names, args, too_many, |n| unknown_param(params, n, what, def))
}

/// Matches arguments to the parameters `names`, for user functions and builtins alike:
/// positional arguments in order, then named ones by name, each parameter given at most once.
/// The callee words the two failures that depend on it: `too_many` positional arguments, and
/// an `unknown` name.
pub(crate) fn bind_args(
    names: &[&str],
    args: Vec<ArgVal>,
    too_many: impl Fn(&ArgVal) -> Diagnostic,
    unknown: impl Fn(&Ident) -> Diagnostic,
) -> R<Vec<Option<ArgVal>>> {
    let mut slots: Vec<Option<ArgVal>> = names.iter().map(|_| None).collect();
    let mut positional = 0;
    let mut named_seen = false;
    for a in args {
        let slot = match &a.name {
            None if named_seen => {
                return Err(Diagnostic::error(
                    "E0401",
                    "a positional argument follows a named one",
                    a.span,
                    "positional argument",
                )
                .with_help("give positional arguments first, then named ones"));
            }
            None if positional >= names.len() => return Err(too_many(&a)),
            None => {
                positional += 1;
                positional - 1
            }
            Some(n) => {
                named_seen = true;
                let Some(i) = names.iter().position(|p| *p == n.name) else {
                    return Err(unknown(n));
                };
                if slots[i].is_some() {
                    return Err(Diagnostic::error(
                        "E0401",
                        format!("argument `{}` is given twice", n.name),
                        n.span,
                        "given again here",
                    ));
                }
                i
            }
        };
        slots[slot] = Some(a);
    }
    Ok(slots)
}

fn unknown_param(params: &[Param], n: &Ident, what: &str, def: Span) -> Diagnostic {
    let d = Diagnostic::error(
        "E0401",
        format!("{what} has no parameter named `{}`", n.name),
        n.span,
        "unknown parameter",
    )
    .with_label(def, "defined here");
    let names: Vec<&str> = params.iter().map(|p| p.name.name.as_str()).collect();
    match nearest(&n.name, names.iter().copied()) {
        Some(c) => replace_with(d.with_help(format!("did you mean `{c}`?")), n.span, c),
        None => d.with_note(format!("its parameters are: {}", names.join(", "))),
    }
}
