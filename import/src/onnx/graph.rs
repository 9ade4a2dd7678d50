//! The model's graph as the translation reads it: nodes with decoded attributes and the module
//! path each came from, initializers as constants, inputs with their (possibly named) sizes.

use super::proto::{self, pb, ModelProto};
use super::value::Const;
use std::collections::HashMap;
use std::path::Path;

#[derive(Clone, Debug)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Tensor(Const),
    /// A kind the translation never reads (graphs, sparse tensors, type protos), by name.
    Other(&'static str),
}

#[derive(Clone, Debug)]
pub struct Node {
    pub op: String,
    pub domain: String,
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: HashMap<String, Attr>,
    /// The module path the exporter recorded (`layer1.0.conv1`), empty at the top.
    pub scope: String,
}

/// A graph input's size: a number, or a named (dynamic) axis.
#[derive(Clone, Debug, PartialEq)]
pub enum Size {
    Fixed(i64),
    Named(String),
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Input {
    pub name: String,
    pub dtype: i32,
    pub dims: Vec<Size>,
}

pub struct Graph {
    pub opset: i64,
    pub nodes: Vec<Node>,
    pub inits: HashMap<String, Const>,
    pub inputs: Vec<Input>,
    pub outputs: Vec<String>,
}

impl Graph {
    /// Reads the main graph; problems with individual tensors are collected, not fatal.
    pub fn read(model: &ModelProto, dir: &Path, problems: &mut Vec<String>) -> Graph {
        let g = model.graph.clone().unwrap_or_default();
        let opset = model
            .opset_import
            .iter()
            .find(|o| {
                o.domain.as_deref().unwrap_or("").is_empty()
                    || o.domain.as_deref() == Some("ai.onnx")
            })
            .and_then(|o| o.version)
            .unwrap_or(0);
        let mut inits = HashMap::new();
        for t in &g.initializer {
            match proto::tensor(t, dir) {
                Ok(c) => {
                    inits.insert(t.name.clone().unwrap_or_default(), c);
                }
                Err(e) => problems.push(format!("initializer: {e}")),
            }
        }
        if !g.sparse_initializer.is_empty() {
            problems.push(format!(
                "{} sparse initializers: mgn has no sparse tensors",
                g.sparse_initializer.len()
            ));
        }
        let inputs = g
            .input
            .iter()
            .filter(|v| !inits.contains_key(v.name.as_deref().unwrap_or("")))
            .map(input)
            .collect();
        let outputs = g.output.iter().map(|v| v.name.clone().unwrap_or_default()).collect();
        let nodes = g.node.iter().map(|n| node(n, dir, problems)).collect();
        Graph { opset, nodes, inits, inputs, outputs }
    }
}

fn input(v: &pb::ValueInfoProto) -> Input {
    use pb::tensor_shape_proto::dimension::Value;
    let name = v.name.clone().unwrap_or_default();
    let mut dtype = 0;
    let mut dims = Vec::new();
    if let Some(pb::type_proto::Value::TensorType(t)) =
        v.r#type.as_ref().and_then(|t| t.value.as_ref())
    {
        dtype = t.elem_type.unwrap_or(0);
        for d in t.shape.iter().flat_map(|s| &s.dim) {
            dims.push(match &d.value {
                Some(Value::DimValue(n)) if *n > 0 => Size::Fixed(*n),
                Some(Value::DimParam(p)) if !p.is_empty() => Size::Named(p.clone()),
                _ => Size::Unknown,
            });
        }
    }
    Input { name, dtype, dims }
}

fn node(n: &pb::NodeProto, dir: &Path, problems: &mut Vec<String>) -> Node {
    use pb::attribute_proto::AttributeType as T;
    let mut attrs = HashMap::new();
    for a in &n.attribute {
        let kind = T::try_from(a.r#type.unwrap_or(0)).unwrap_or(T::Undefined);
        let v = match kind {
            T::Int => Attr::Int(a.i.unwrap_or(0)),
            T::Float => Attr::Float(a.f.unwrap_or(0.0)),
            T::String => {
                Attr::Str(String::from_utf8_lossy(a.s.as_deref().unwrap_or(&[])).into_owned())
            }
            T::Ints => Attr::Ints(a.ints.clone()),
            T::Floats => Attr::Floats(a.floats.clone()),
            T::Tensor => match a.t.as_ref().map(|t| proto::tensor(t, dir)) {
                Some(Ok(c)) => Attr::Tensor(c),
                Some(Err(e)) => {
                    problems.push(format!("node `{}` ({}): {e}", n.name(), n.op_type()));
                    Attr::Other("tensor")
                }
                None => Attr::Other("tensor"),
            },
            T::Graph | T::Graphs => Attr::Other("graph"),
            T::SparseTensor | T::SparseTensors => Attr::Other("sparse tensor"),
            _ => Attr::Other("other"),
        };
        attrs.insert(a.name.clone().unwrap_or_default(), v);
    }
    let meta: HashMap<&str, &str> = n
        .metadata_props
        .iter()
        .map(|p| (p.key.as_deref().unwrap_or(""), p.value.as_deref().unwrap_or("")))
        .collect();
    let scope = match meta.get("namespace") {
        Some(ns) => dynamo_scope(ns),
        None => torchscript_scope(n.name()),
    };
    Node {
        op: n.op_type().to_string(),
        domain: n.domain().to_string(),
        name: n.name().to_string(),
        inputs: n.input.clone(),
        outputs: n.output.clone(),
        attrs,
        scope,
    }
}

/// The TorchScript exporter names a node by the modules it ran in and the op:
/// `/layer1/layer1.0/conv1/Conv`. A level may repeat its parent's path (`layer1.0` inside
/// `layer1`) or add to it (`conv1`): both give `layer1.0.conv1`.
pub fn torchscript_scope(name: &str) -> String {
    let Some(rest) = name.strip_prefix('/') else { return String::new() };
    let mut parts: Vec<&str> = rest.split('/').collect();
    parts.pop();
    // A level extends the one before it when it starts with that level's name and a dot
    // (`block` then `block.0`: items of a Sequential); otherwise it is a child of the path.
    let (mut base, mut path, mut last) = (String::new(), String::new(), "");
    let join = |a: &str, b: &str| if a.is_empty() { b.to_string() } else { format!("{a}.{b}") };
    for p in parts.into_iter().filter(|p| !p.is_empty()) {
        if !last.is_empty() && p.starts_with(last) && p[last.len()..].starts_with('.') {
            path = join(&base, p);
        } else {
            base = path.clone();
            path = join(&path, p);
        }
        last = p;
    }
    path
}

/// The dynamo exporter records `: Net/layer1: Sequential/layer1.0: Block/add: aten.add.Tensor`:
/// each level's full path before its `: class`; the last level is the op itself.
pub fn dynamo_scope(ns: &str) -> String {
    let levels: Vec<&str> = ns.split('/').collect();
    let n = levels.len().saturating_sub(1);
    levels[..n]
        .iter()
        .rev()
        .find_map(|l| l.split(": ").next().filter(|s| !s.is_empty()))
        .unwrap_or("")
        .to_string()
}

impl Node {
    pub fn int(&self, k: &str, default: i64) -> i64 {
        match self.attrs.get(k) {
            Some(Attr::Int(v)) => *v,
            _ => default,
        }
    }

    pub fn float(&self, k: &str, default: f32) -> f32 {
        match self.attrs.get(k) {
            Some(Attr::Float(v)) => *v,
            _ => default,
        }
    }

    pub fn ints(&self, k: &str) -> Option<Vec<i64>> {
        match self.attrs.get(k) {
            Some(Attr::Ints(v)) => Some(v.clone()),
            _ => None,
        }
    }

    pub fn string(&self, k: &str) -> Option<String> {
        match self.attrs.get(k) {
            Some(Attr::Str(v)) => Some(v.clone()),
            _ => None,
        }
    }

    /// The node's input `i`, `None` when absent or left empty (an optional input skipped).
    pub fn input(&self, i: usize) -> Option<&str> {
        self.inputs.get(i).map(String::as_str).filter(|s| !s.is_empty())
    }
}
