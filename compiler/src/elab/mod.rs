//! Elaboration: type- and shape-checks a model with concrete argument values and produces its
//! graph IR. See `eval` for the evaluator and `builtins` for each builtin's typing rule.

pub mod builtins;
pub mod eval;
pub mod value;

use crate::front::{did_you_mean, ModId, Program};
use crate::graph::Graph;
use eval::{Evaluator, Frame, FrameStep};
use mgn_ir::plan::Mode;
use mgn_syntax::ast::{Item, LayerItem, LayerKind, ScalarType, TypeExpr};
use mgn_syntax::{Diagnostic, Span, StepKind};
use value::Value;

/// A `--set name=value` override of a model argument, or one value of a `--dynamic` size
/// (a probe point of `dynamic`), which must be a `dim`.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    pub name: String,
    pub value: String,
    pub flag: Flag,
}

/// The command-line flag a setting came from, as messages name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    Set,
    Dynamic,
}

impl std::fmt::Display for Flag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Flag::Set => "--set",
            Flag::Dynamic => "--dynamic",
        })
    }
}

impl Setting {
    /// `--set name=value`.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Setting {
        Setting { name: name.into(), value: value.into(), flag: Flag::Set }
    }
}

impl std::str::FromStr for Setting {
    type Err = String;
    fn from_str(s: &str) -> Result<Setting, String> {
        let (name, value) =
            s.split_once('=').ok_or_else(|| format!("expected `name=value`, found `{s}`"))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("expected `name=value`, found `{s}`"));
        }
        Ok(Setting::new(name, value.trim()))
    }
}

/// The models defined in a module, as (item index, item).
pub fn models(prog: &Program, module: ModId) -> Vec<(usize, &LayerItem)> {
    prog.module(module)
        .ast
        .items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| match item {
            Item::Layer(l) if l.kind == LayerKind::Model => Some((i, l)),
            _ => None,
        })
        .collect()
}

/// Elaborates model `index` of `module` with the given argument overrides, for an inference
/// plan (`training` is false).
pub fn elaborate(
    prog: &Program,
    module: ModId,
    index: usize,
    settings: &[Setting],
) -> Result<Graph, Diagnostic> {
    elaborate_in(prog, module, index, settings, Mode::Infer)
}

/// As `elaborate`, for a plan of `mode` (`training` is true in a training plan).
pub fn elaborate_in(
    prog: &Program,
    module: ModId,
    index: usize,
    settings: &[Setting],
    mode: Mode,
) -> Result<Graph, Diagnostic> {
    elaborate_with_facts(prog, module, index, settings, mode, &mut Vec::new())
}

/// As `elaborate_in`, also collecting facts about spans (types of expressions, `let`s,
/// fields) — as many as were learned before an error, if there is one.
pub fn elaborate_with_facts(
    prog: &Program,
    module: ModId,
    index: usize,
    settings: &[Setting],
    mode: Mode,
    facts: &mut Vec<eval::Fact>,
) -> Result<Graph, Diagnostic> {
    let Item::Layer(model) = prog.item(module, index) else {
        unreachable!("callers pass a model item")
    };
    check_settings(model, settings)?;
    let mut ev = Evaluator::new(prog);
    ev.training = mode == Mode::Train;
    ev.graph.model = model.name.name.clone();
    let frame = Frame {
        module,
        locals: Default::default(),
        fields: Some((model.name.name.clone(), Vec::new())),
        model: true,
        step: FrameStep::new(StepKind::Model, &model.name, model.span),
    };
    let result = ev.in_frame(frame, model.name.span, |ev| {
        for p in &model.params {
            if p.optional {
                return Err(Diagnostic::error(
                    "E0501",
                    format!("model argument `{}` cannot be optional", p.name.name),
                    p.span,
                    "`?` on a model argument",
                )
                .with_help("give it a default instead: `name: type = value`"));
            }
            let v = match settings.iter().rev().find(|s| s.name == p.name.name) {
                Some(s) => parse_setting(s, &p.ty, p.span)?,
                None => match &p.default {
                    Some(d) => ev.eval(d)?,
                    None => {
                        return Err(Diagnostic::error(
                            "E0501",
                            format!("model argument `{}` has no default", p.name.name),
                            p.span,
                            "needs a default",
                        )
                        .with_help(format!(
                            "give it one (`{}: ... = value`) or pass `--set {}=value`",
                            p.name.name, p.name.name
                        )))
                    }
                },
            };
            let from = settings.iter().rev().find(|s| s.name == p.name.name).map(|s| s.flag);
            let (span, what) = match (&p.default, from) {
                (Some(d), None) => (d.span, format!("model argument `{}`", p.name.name)),
                (_, flag) => (
                    p.name.span,
                    format!(
                        "model argument `{}` (from {})",
                        p.name.name,
                        flag.unwrap_or(Flag::Set)
                    ),
                ),
            };
            let v = ev.check_type(&p.ty, v, span, &what)?;
            ev.graph.config.push((p.name.name.clone(), show(&v)));
            ev.bind(&p.name.name, p.name.span, v);
        }
        ev.create_fields(&model.fields, "")?;
        for i in &model.inputs {
            let what = format!("input `{}`", i.name.name);
            let (dtype, shape) = ev.concrete_type(&i.ty, &what)?;
            ev.check_packed((dtype, &shape), None, i.ty.span, &what)?;
            let id = ev.add(
                crate::graph::Op::Input { name: i.name.name.clone() },
                Vec::new(),
                dtype,
                shape,
                i.span,
            )?;
            ev.graph.inputs.push((i.name.name.clone(), id));
            ev.bind(&i.name.name, i.name.span, Value::Tensor(id));
        }
        if let Some(fwd) = model.forward.first() {
            ev.eval_block(&fwd.body)?;
        }
        ev.check_counters()
    });
    facts.append(&mut ev.facts);
    result.map_err(|d| eval::trace::finish(&prog.sources, d))?;
    ev.graph.training = ev.read_training.then_some(ev.training);
    Ok(ev.graph)
}

/// Every `--set` or `--dynamic` name is an argument of the model.
fn check_settings(model: &LayerItem, settings: &[Setting]) -> Result<(), Diagnostic> {
    for s in settings {
        if !model.params.iter().any(|p| p.name.name == s.name) {
            let mut d = Diagnostic::error(
                "E0501",
                format!(
                    "`{} {}`: model `{}` has no argument `{}`",
                    s.flag, s.name, model.name.name, s.name
                ),
                model.name.span,
                "in this model",
            );
            let names: Vec<&str> = model.params.iter().map(|p| p.name.name.as_str()).collect();
            d = match did_you_mean(&s.name, names.iter().copied()) {
                Some(h) => d.with_help(h),
                None if names.is_empty() => d.with_note("this model takes no arguments"),
                None => d.with_note(format!("its arguments are: {}", names.join(", "))),
            };
            return Err(d);
        }
    }
    Ok(())
}

fn parse_setting(s: &Setting, ty: &TypeExpr, span: Span) -> Result<Value, Diagnostic> {
    let v = s.value.as_str();
    let bad = |what: &str| {
        Diagnostic::error(
            "E0501",
            format!("`{} {}={}`: expected {what}", s.flag, s.name, s.value),
            span,
            format!("`{}` is declared here", s.name),
        )
    };
    if s.flag == Flag::Dynamic && !matches!(ty, TypeExpr::Scalar(ScalarType::Dim, _)) {
        return Err(Diagnostic::error(
            "E0503",
            format!("`--dynamic {}`: only a `dim` argument can be dynamic", s.name),
            span,
            format!("`{}` is declared here, not as a `dim`", s.name),
        )
        .with_help("a dynamic size is a tensor axis; set other arguments with `--set`"));
    }
    match ty {
        TypeExpr::Scalar(ScalarType::Dim | ScalarType::Int, _) => {
            v.parse::<i64>().map(Value::Int).map_err(|_| bad("an integer"))
        }
        TypeExpr::Scalar(ScalarType::Float, _) => v
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Value::Float)
            .ok_or_else(|| bad("a number")),
        TypeExpr::Scalar(ScalarType::Bool, _) => match v {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(bad("`true` or `false`")),
        },
        TypeExpr::Scalar(ScalarType::DType, _) => mgn_syntax::ast::DTypeName::parse(v)
            .map(|d| Value::DType(eval::dtype_of(d)))
            .ok_or_else(|| bad("a dtype such as f32")),
        _ => Err(bad("a value of a type `--set` supports (dim, int, float, bool, dtype)")),
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::Float(f) => crate::graph::fmt_f64(*f),
        Value::Bool(b) => b.to_string(),
        Value::DType(d) => d.to_string(),
        other => other.kind().to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod training_tests;
