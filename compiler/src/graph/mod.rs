//! The graph IR: a flat, typed list of mid-level ops in definition order (so the node list is
//! already a valid execution order), the parameter table with checkpoint names and initializers,
//! and the model's inputs, outputs and loss. Every node keeps the source span it came from.

pub mod dump;
mod steps;

use mgn_ir::DType;
use mgn_syntax::Span;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

pub use mgn_ir::op::{fmt_f64, BinaryOp, CompareOp, GradPart, Op, PoolOp, ReduceOp, UnaryOp};
pub use mgn_ir::plan::InitSpec;
pub use steps::to_steps;

#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<NodeId>,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The expression that produced this node (possibly inside a stdlib layer).
    pub span: Span,
    /// The nearest enclosing expression in a user file: the line to show a user.
    pub user_span: Span,
    /// Made inside `full_precision(…)` (or the derivative of such a node): a mixed precision
    /// policy leaves its operands in f32 (`precision.rs`).
    pub full_precision: Pin,
}

/// Whether a mixed precision policy leaves a node's operands in f32: `full_precision(x)` pins
/// what x makes and its derivatives, `full_precision(x, derivatives = false)` only what x makes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pin {
    /// Under the policy.
    #[default]
    No,
    /// In f32; its derivatives under the policy.
    Forward,
    /// In f32, and its derivatives too.
    Both,
}

impl Pin {
    /// What a derivative of a node pinned so is pinned as.
    pub fn of_derivative(self) -> Pin {
        match self {
            Pin::Both => Pin::Both,
            Pin::Forward | Pin::No => Pin::No,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ParamInfo {
    /// Dotted checkpoint name, e.g. `blocks.0.attn.q_proj.weight`.
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub init: InitSpec,
    /// `param` fields are trained; `buffer` and `const` fields are not.
    pub trainable: bool,
    /// `const` fields are not: every session computes them from `init`.
    pub persistent: bool,
    /// `state` fields: not trained or saved, written by the model's forward (a KV cache).
    pub state: bool,
    pub node: NodeId,
    pub span: Span,
}

impl ParamInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The field's keyword: `param`, `buffer`, `const` or `state`.
    pub fn kind(&self) -> &'static str {
        match (self.trainable, self.persistent) {
            _ if self.state => "state",
            (true, _) => "param",
            // A packed parameter is a `param` field the plan cannot train.
            (false, true) if self.dtype.is_packed() => "param",
            (false, true) => "buffer",
            (false, false) => "const",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub model: String,
    /// Model arguments after defaults and `--set`, in declaration order.
    pub config: Vec<(String, String)>,
    pub nodes: Vec<Node>,
    pub params: Vec<ParamInfo>,
    pub inputs: Vec<(String, NodeId)>,
    pub outputs: Vec<(String, NodeId)>,
    pub loss: Option<NodeId>,
    /// `self.field = value` in forward: (parameter index, node whose value replaces the
    /// buffer or `state` field once a run is over).
    pub state_writes: Vec<(usize, NodeId)>,
    /// `name = tied(param)`: second checkpoint names of parameters (`Plan::aliases`).
    pub aliases: Vec<mgn_ir::plan::ParamAlias>,
    /// Buffers that count the training steps run (`Plan::counters`).
    pub counters: Vec<usize>,
    /// The value of `training` the model read while it was elaborated: the graph is then made
    /// for that mode only. `None` when nothing read it, and the graph serves both modes.
    pub training: Option<bool>,
    /// Dynamic loss scaling, when the backward pass starts from a loss scale (`precision.rs`).
    pub loss_scaling: Option<mgn_ir::precision::LossScaling>,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    pub fn param_of(&self, id: NodeId) -> Option<&ParamInfo> {
        match self.node(id).op {
            Op::Param { index } => self.params.get(index),
            _ => None,
        }
    }

    pub fn param_count(&self, trainable: bool) -> usize {
        self.params.iter().filter(|p| p.trainable == trainable).map(ParamInfo::numel).sum()
    }
}

impl mgn_ir::analysis::Dataflow for Graph {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn inputs(&self, step: usize) -> impl Iterator<Item = u32> + '_ {
        self.nodes[step].inputs.iter().map(|x| x.0)
    }

    fn results(&self) -> Vec<u32> {
        let outputs = self.outputs.iter().map(|(_, id)| id.0);
        let written = self.state_writes.iter().map(|(_, id)| id.0);
        outputs.chain(self.loss.map(|id| id.0)).chain(written).collect()
    }
}

/// `f32[8, 64, 128]`.
pub fn fmt_type(dtype: DType, shape: &[usize]) -> String {
    format!("{dtype}[{}]", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}
