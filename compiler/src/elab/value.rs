//! Compile-time values: what an expression evaluates to during elaboration.

use crate::front::ModId;
use crate::graph::{InitSpec, NodeId};
use mgn_ir::DType;
use mgn_syntax::Span;
use std::collections::HashMap;
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
    /// Layers applied in order when called: the copies made by `repeat(n)`, a list field, or a
    /// list nested in one.
    Sequence(Rc<Sequence>),
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

/// A frame's bindings in the order they were made, with an index by definition: a lookup
/// costs the same however many bindings a frame holds (a forward of 20,000 `let`s).
#[derive(Clone, Debug, Default)]
pub struct Locals {
    list: Vec<Local>,
    /// Where the live binding of each definition is in `list`. A definition has at most one
    /// live binding in a frame: a block's bindings end with it, and nothing binds a
    /// definition twice before that.
    by_def: HashMap<Span, usize>,
}

impl Locals {
    pub fn push(&mut self, local: Local) {
        self.by_def.insert(local.def, self.list.len());
        self.list.push(local);
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Drops the bindings made after the first `len`.
    pub fn truncate(&mut self, len: usize) {
        while self.list.len() > len {
            self.pop();
        }
    }

    pub fn pop(&mut self) -> Option<Local> {
        let l = self.list.pop()?;
        if self.by_def.get(&l.def) == Some(&self.list.len()) {
            self.by_def.remove(&l.def);
        }
        Some(l)
    }

    /// The live binding of the definition at `def`.
    pub fn get(&self, def: Span) -> Option<&Local> {
        self.by_def.get(&def).map(|&i| &self.list[i])
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Local> {
        self.list.iter()
    }

    pub fn to_vec(&self) -> Vec<Local> {
        self.list.clone()
    }
}

impl From<Vec<Local>> for Locals {
    fn from(list: Vec<Local>) -> Locals {
        let mut l = Locals::default();
        for local in list {
            l.push(local);
        }
        l
    }
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
    /// Where it was created (the layer call in a field initializer).
    pub span: Span,
}

/// Layers applied in order, each one's result the next one's first argument (PyTorch's
/// `nn.Sequential`): a `repeat` field, a list field, or a list nested in one. Each item is a
/// `Value::Layer` or a nested `Value::Sequence`, whose path is this path and the item's name
/// (its position, or the name a `repeat` pattern gave it).
#[derive(Debug)]
pub struct Sequence {
    /// Checkpoint path of the sequence (`features.1`).
    pub path: String,
    pub items: Vec<Value>,
}

impl Sequence {
    /// The item named `name` (the last segment of its path): `features.0`, `layers.block_3`.
    pub fn item(&self, name: &str) -> Option<&Value> {
        self.items.iter().find(|v| item_path(v).and_then(|p| p.rsplit('.').next()) == Some(name))
    }
}

/// The checkpoint path of a layer or a sequence.
pub fn item_path(v: &Value) -> Option<&str> {
    match v {
        Value::Layer(l) => Some(&l.path),
        Value::Sequence(s) => Some(&s.path),
        _ => None,
    }
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
            Value::Sequence(_) => "a sequence of layers",
            Value::Absent { .. } => "an absent field",
            Value::Omitted { .. } => "an optional argument that was not given",
            Value::Item(..) => "an item",
            Value::Module(_) => "a module",
            Value::Builtin(_) => "a builtin function",
        }
    }
}
