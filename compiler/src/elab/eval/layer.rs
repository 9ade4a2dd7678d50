//! Layer instances: binding a layer's config, then creating its fields in order
//! (parameters and buffers become `Param` nodes named by their field path).

use super::*;

impl<'p> Evaluator<'p> {
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
            locals: Locals::default(),
            fields: Some((l.name.name.clone(), Vec::new())),
            model: false,
            step: FrameStep::new(StepKind::Layer, &l.name, l.span),
        };
        let what = format!("`{}`", l.name.name);
        let saved_ctor = self.ctor_path.take();
        let r = self.in_frame(frame, span, |ev| {
            ev.enter_params(&l.params, args, &what, l.name.span, span)?;
            let config = ev.frame().locals.to_vec();
            ev.create_fields(&l.fields, &path)?;
            let fields = ev.frame().fields.take().map(|(_, f)| f).unwrap_or_default();
            Ok(Rc::new(LayerInst {
                type_name: l.name.name.clone(),
                module,
                item: index,
                path: path.clone(),
                config,
                fields,
                span,
            }))
        });
        self.ctor_path = saved_ctor;
        r
    }

    /// Creates fields in order into the current frame: each is visible to the ones after it
    /// (as `self.name`, and by its bare name where the resolution says it denotes the field).
    pub fn create_fields(&mut self, fields: &[FieldDef], path: &str) -> R<()> {
        for f in fields {
            let v = self.field_value(f, path)?;
            if let Some((_, fields)) = &mut self.frame().fields {
                fields.push((f.name.name.clone(), v.clone()));
            }
            self.bind(&f.name.name, f.name.span, v);
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
            Value::Sequence(s) if !s.items.is_empty() => Some(sequence::describe_sequence(s)),
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
            FieldInit::Tensor { kind, ty, init } => {
                self.tensor_field(f, *kind, ty, init.as_ref(), full)
            }
            FieldInit::Repeat { count, index, name, body } => {
                self.repeat_field(count, index.as_ref(), name.as_ref(), body, &full)
            }
            FieldInit::Expr(e) if self.is_tied_call(e) => self.tied_field(f, e, &full),
            FieldInit::Expr(e) => self.construct(e, &full),
        }
    }

    /// `name = param f32[..] init e`, `buffer ...` or `const ...`: a `Param` node named by the
    /// field path.
    fn tensor_field(
        &mut self,
        f: &FieldDef,
        kind: TensorKind,
        ty: &TensorType,
        init: Option<&Expr>,
        full: String,
    ) -> R<Value> {
        let (dtype, shape) = self.concrete_type(ty, "a parameter")?;
        let what = format!("a `{}` field", kind.keyword());
        self.check_packed((dtype, &shape), Some(kind), ty.span, &what)?;
        let init = match init {
            None => InitSpec::Constant(0.0),
            Some(e) => {
                let v = self.eval(e)?;
                match v {
                    Value::Tensor(node) => self.computed_init(node, (dtype, &shape), ty, e)?,
                    v => match self.as_init(v, e.span)? {
                        Value::Init(i) => i,
                        _ => unreachable!("as_init returns an Init"),
                    },
                }
            }
        };
        let index = self.graph.params.len();
        let node = self.add(Op::Param { index }, Vec::new(), dtype, shape.clone(), f.span)?;
        // A packed parameter is frozen: no gradient reaches a few bits per weight.
        let trainable = kind == TensorKind::Param && !dtype.is_packed();
        let persistent = !matches!(kind, TensorKind::Const | TensorKind::State);
        let kind = kind.keyword();
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
            trainable,
            persistent,
            state: kind == "state",
            node,
            span: f.span,
        });
        if dtype.is_packed() {
            return Ok(Value::Tensor(self.dequantized(node, f.span)?));
        }
        Ok(Value::Tensor(node))
    }

    /// Evaluates a tensor type whose dims must all be known (parameters, model inputs).
    pub fn concrete_type(&mut self, t: &TensorType, what: &str) -> R<(DType, Vec<usize>)> {
        let dtype = self.elem_type(t)?;
        let mut shape = Vec::new();
        for d in &t.dims {
            match d {
                DimItem::Variadic(id) => {
                    return Err(Diagnostic::error(
                        "E0206",
                        format!("the shape of {what} must be fully known"),
                        id.span,
                        concat!(
                            "a `..` group is only allowed in patterns ",
                            "(parameter, return and `let` types)"
                        ),
                    ))
                }
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
                    fmt_type(dtype, &shape)
                ),
                t.span,
                "too large",
            ));
        }
        Ok((dtype, shape))
    }
}

fn show_config(config: &[Local]) -> String {
    config
        .iter()
        .map(|l| match &l.value {
            Value::Int(i) => format!("{} = {i}", l.name),
            Value::Float(f) => format!("{} = {f:?}", l.name),
            Value::Bool(b) => format!("{} = {b}", l.name),
            Value::DType(d) => format!("{} = {d}", l.name),
            Value::Init(i) => format!("{} = {i}", l.name),
            v => format!("{} = {}", l.name, v.kind()),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The bindings a layer's `forward` starts with: its config, then its fields, each under its
/// definition.
pub(super) fn layer_locals(inst: &LayerInst, l: &LayerItem) -> Vec<Local> {
    let mut locals = inst.config.clone();
    for (f, (name, value)) in l.fields.iter().zip(&inst.fields) {
        locals.push(Local { name: name.clone(), def: f.name.span, value: value.clone() });
    }
    locals
}
