//! The evaluator: runs a model's definition at compile time with concrete config values,
//! checking every type and shape as it goes and appending graph nodes for tensor operations.
//!
//! Checking and elaboration are one pass: a shape is known exactly when the op that makes it
//! is added, so each error can name both shapes and where each came from.
//!
//! What a name denotes is read from the program's `Resolution` (the front end's one lookup
//! order); the evaluator only keeps the values bound so far, each under the span of the
//! definition it binds (`Local`). This file holds the evaluator's state, frames, node
//! creation and names; `expr` evaluates expressions and blocks, `call` calls and argument
//! binding, `pattern` types and shape patterns, `layer` layer instances and their fields.

mod call;
mod computed;
mod copy_names;
mod counters;
pub(crate) use call::bind_args;
mod expr;
mod layer;
pub(crate) mod packed;
mod pattern;
mod sequence;
mod state;
mod tied;
pub mod trace;

use super::builtins;
pub use super::value::Local;
use super::value::{LayerInst, Locals, Sequence, Value};
use crate::front::{suggest, ModId, Program, Target};
use crate::graph::dump::thousands;
use crate::graph::{
    fmt_type, BinaryOp, CompareOp, Graph, InitSpec, Node, NodeId, Op, ParamInfo, UnaryOp,
};
use crate::source::Origin;
use mgn_ir::shape;
use mgn_ir::DType;
use mgn_syntax::ast::*;
use mgn_syntax::{Diagnostic, Span, StepKind};
use std::collections::HashMap;
use std::rc::Rc;

pub type R<T> = Result<T, Diagnostic>;

/// Deepest nesting of layer, fn and const evaluation: deep enough for a recursive scan over
/// thousands of steps, a guard against recursion that never stops.
pub const MAX_CALL_DEPTH: usize = 10_000;
/// When less stack than this is left on entering a frame, evaluation goes on on a new segment.
const STACK_RED_ZONE: usize = 1 << 20;
/// Size of each stack segment taken from the heap.
const STACK_SEGMENT: usize = 16 << 20;
/// Most nodes one model may elaborate to.
const MAX_NODES: usize = 2_000_000;
/// Largest element count of one tensor (2^40).
const MAX_NUMEL: usize = 1 << 40;
/// Largest `repeat` count.
const MAX_REPEAT: i64 = 10_000;

pub struct Frame {
    pub module: ModId,
    /// Innermost last: `let`s, parameters, pattern-bound dims, config, fields and inputs.
    pub locals: Locals,
    /// The enclosing layer's fields (for `self.x`) and its type name.
    pub fields: Option<(String, Vec<(String, Value)>)>,
    /// True while evaluating a model's forward: `output` and `loss` record into the graph.
    pub model: bool,
    /// What is being evaluated, for the trace of an error raised inside it.
    pub step: FrameStep,
}

/// The definition a frame evaluates: its kind, its name and its whole span (an error inside
/// that span is inside the frame).
pub struct FrameStep {
    pub kind: StepKind,
    pub name: String,
    pub def: Span,
    /// For a layer's forward: where the instance was created.
    pub origin: Option<Span>,
}

impl FrameStep {
    pub fn new(kind: StepKind, name: &Ident, def: Span) -> FrameStep {
        FrameStep { kind, name: name.name.clone(), def, origin: None }
    }
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
    /// Set while `name = tied(p)` calls `tied`: the field's path and name, `p`'s second name.
    tie_path: Option<(String, Span)>,
    is_std: Vec<bool>,
    /// Where each output was declared, for "declared twice".
    output_spans: Vec<(String, Span)>,
    /// What elaboration learned about source spans, for the language server.
    pub facts: Vec<Fact>,
    /// How many `full_precision(…)` calls are being evaluated: nodes made inside one keep
    /// their contractions in f32 under a mixed precision policy — with their derivatives
    /// (`[1]`), or without them (`derivatives = false`, `[0]`).
    pub full_precision: [usize; 2],
    /// The value of `training`: whether the plan being built is a training plan.
    pub training: bool,
    /// Whether anything read `training`: then the graph is made for one mode only.
    pub read_training: bool,
    /// Where each of `graph.counters` was named (`batch_norm`'s `tracked`), for diagnostics.
    pub counter_sites: Vec<Span>,
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
            tie_path: None,
            is_std,
            output_spans: Vec::new(),
            facts: Vec::new(),
            full_precision: [0, 0],
            training: false,
            read_training: false,
            counter_sites: Vec::new(),
        }
    }

    /// The value of `training`, noting that the graph now depends on the plan's mode.
    pub fn read_training(&mut self) -> bool {
        self.read_training = true;
        self.training
    }

    // ---- frames and nodes ---------------------------------------------------------------

    pub fn frame(&mut self) -> &mut Frame {
        self.frames.last_mut().expect("evaluation always runs in a frame")
    }

    /// Runs `f` in a new frame, popping it again whatever `f` returns. An error raised inside
    /// the frame's definition records the frame in its trace (`trace::record`).
    pub fn in_frame<T>(
        &mut self,
        frame: Frame,
        call_site: Span,
        f: impl FnOnce(&mut Self) -> R<T>,
    ) -> R<T> {
        if self.depth >= MAX_CALL_DEPTH {
            return Err(Diagnostic::error(
                trace::DEPTH_CODE,
                format!(
                    "this call would nest calls {} deep; the limit is {}",
                    thousands(MAX_CALL_DEPTH + 1),
                    thousands(MAX_CALL_DEPTH)
                ),
                call_site,
                format!("call {}", thousands(MAX_CALL_DEPTH + 1)),
            )
            .with_help(
                "a `fn`, `const` or layer that calls itself needs a case that ends the recursion",
            ));
        }
        self.depth += 1;
        self.frames.push(frame);
        self.call_sites.push(call_site);
        // Deep recursion (a scan over thousands of steps) runs on stack segments taken from
        // the heap as needed, so it needs no large thread stack.
        let r = stacker::maybe_grow(STACK_RED_ZONE, STACK_SEGMENT, || f(self));
        self.call_sites.pop();
        let frame = self.frames.pop().expect("pushed above");
        self.depth -= 1;
        r.map_err(|d| trace::record(d, &frame.step, call_site))
    }

    /// Binds the definition named `name` at `def` to a value in the current frame.
    pub fn bind(&mut self, name: &str, def: Span, value: Value) {
        self.frame().locals.push(Local { name: name.to_string(), def, value });
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
        let full_precision = match self.full_precision {
            [_, both] if both > 0 => crate::graph::Pin::Both,
            [forward, _] if forward > 0 => crate::graph::Pin::Forward,
            _ => crate::graph::Pin::No,
        };
        self.graph.nodes.push(Node { op, inputs, dtype, shape, span, user_span, full_precision });
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
        let origin = match self.param_of(*id) {
            Some(index) => self.graph.params[index].span,
            None => n.user_span,
        };
        let overlaps =
            origin.file == here.file && origin.start < here.end && here.start < origin.end;
        if overlaps || origin == Span::default() {
            return d;
        }
        let verb = if matches!(n.op, Op::Input { .. }) || self.param_of(*id).is_some() {
            "declared"
        } else {
            "produced"
        };
        d.with_label(origin, format!("{what} {verb} here as {}", self.type_str(*id)))
    }

    // ---- names ---------------------------------------------------------------------------

    /// The value of the name written at `span`: what the resolution says it denotes, with a
    /// binding's value taken from the current frame.
    pub fn lookup(&mut self, name: &str, span: Span) -> R<Value> {
        match self.prog.resolution.target(span) {
            Some(Target::Def { span: def, .. }) => match self.local(def) {
                Some(v) => Ok(v),
                // Bound in a scope elaboration has not entered yet (a dim of a return type).
                None => Err(self.not_found(name, span)),
            },
            Some(Target::Item { module, index, .. }) => self.item_value(module, index, span),
            Some(Target::Module(m)) => Ok(Value::Module(m)),
            Some(Target::Builtin(b)) if b.value.is_some() => builtins::read(self, b, span),
            Some(Target::Builtin(b)) => Ok(Value::Builtin(b)),
            None => Err(self.not_found(name, span)),
        }
    }

    fn not_found(&self, name: &str, span: Span) -> Diagnostic {
        let f = self.frames.last().expect("in a frame");
        let mut candidates: Vec<&str> = f.locals.iter().map(|l| l.name.as_str()).collect();
        candidates.extend(self.prog.module(f.module).scope.keys().map(String::as_str));
        for b in builtins::names() {
            candidates.push(b);
        }
        let d = Diagnostic::error(
            "E0101",
            format!("cannot find `{name}` in this scope"),
            span,
            "not found",
        );
        suggest(d, span, name, candidates)
    }

    fn item_value(&mut self, module: ModId, index: usize, span: Span) -> R<Value> {
        let Item::Const(c) = self.prog.item(module, index) else {
            return Ok(Value::Item(module, index));
        };
        if let Some(v) = self.consts.get(&(module, index)) {
            return Ok(v.clone());
        }
        let step = FrameStep::new(StepKind::Const, &c.name, c.span);
        let frame = Frame { module, locals: Locals::default(), fields: None, model: false, step };
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

    /// The value bound to the definition at `def` in the current frame, if any yet.
    fn local(&self, def: Span) -> Option<Value> {
        let f = self.frames.last()?;
        f.locals.get(def).map(|l| l.value.clone())
    }

    /// The value of the name written at `span` if it is known without evaluating anything:
    /// a bound local, a module, an item (a constant evaluated already). Builtins and names
    /// not bound yet give `None`.
    fn try_lookup(&self, span: Span) -> Option<Value> {
        match self.prog.resolution.target(span)? {
            Target::Def { span: def, .. } => self.local(def),
            Target::Item { module, index, .. } => match self.consts.get(&(module, index)) {
                Some(v) => Some(v.clone()),
                None => Some(Value::Item(module, index)),
            },
            Target::Module(m) => Some(Value::Module(m)),
            Target::Builtin(_) => None,
        }
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
        DTypeName::Q8_0 => DType::Q8_0,
        DTypeName::Q4_0 => DType::Q4_0,
        DTypeName::Q4_1 => DType::Q4_1,
        DTypeName::Q4K => DType::Q4_K,
        DTypeName::Q6K => DType::Q6_K,
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

pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
