//! Compile-time values: what an expression evaluates to during elaboration.

use crate::front::ModId;
use crate::graph::{InitSpec, NodeId};
use mgn_ir::DType;
use mgn_syntax::Span;
use std::rc::Rc;

#[derive(Clone, Debug)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(Rc<str>),
    DType(DType),
    /// A node of the graph being built.
    Tensor(NodeId),
    Tuple(Rc<Vec<Value>>),
    List(Rc<Vec<Value>>),
    Init(InitSpec),
    Layer(Rc<LayerInst>),
    /// The copies made by `repeat(n)`, applied in order when called.
    Repeated(Rc<Vec<Rc<LayerInst>>>),
    /// A field whose `if` condition was false.
    Absent {
        field: Span,
    },
    /// An optional parameter (`name?: type`) the call left out.
    Omitted {
        param: Span,
    },
    /// A `fn`, `layer`, `model` or `const` item.
    Item(ModId, usize),
    Module(ModId),
    Builtin(&'static super::builtins::Builtin),
}

/// A value bound to a name while evaluating. `def` is the span of the definition it binds
/// (a parameter's name, a `let` pattern's name, a dim in a shape pattern, a field's name): a
/// use of the name finds it through the `Resolution`, which says which definition it denotes.
#[derive(Clone, Debug)]
pub struct Local {
    pub name: String,
    pub def: Span,
    pub value: Value,
}

/// An instantiated layer: its config values and its fields (parameters are `Tensor`s that
/// point at `Param` nodes).
#[derive(Debug)]
pub struct LayerInst {
    pub type_name: String,
    pub module: ModId,
    pub item: usize,
    /// Checkpoint path of this instance (`blocks.0.attn`), empty for the model itself.
    pub path: String,
    /// Config parameters and the dims their shape patterns bound.
    pub config: Vec<Local>,
    pub fields: Vec<(String, Value)>,
}

impl LayerInst {
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

impl Value {
    pub fn unit() -> Value {
        Value::Tuple(Rc::new(Vec::new()))
    }

    /// An absent field or an omitted optional argument: passed on to an optional parameter,
    /// it counts as not given.
    pub fn is_missing(&self) -> bool {
        matches!(self, Value::Absent { .. } | Value::Omitted { .. })
    }

    /// "an int", "a tuple", ... for messages; tensors are described with their type by the caller.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Bool(_) => "a bool",
            Value::Str(_) => "a string",
            Value::DType(_) => "a dtype",
            Value::Tensor(_) => "a tensor",
            Value::Tuple(t) if t.is_empty() => "nothing",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Init(_) => "an initializer",
            Value::Layer(_) => "a layer",
            Value::Repeated(_) => "a repeated layer",
            Value::Absent { .. } => "an absent field",
            Value::Omitted { .. } => "an optional argument that was not given",
            Value::Item(..) => "an item",
            Value::Module(_) => "a module",
            Value::Builtin(_) => "a builtin function",
        }
    }
}
