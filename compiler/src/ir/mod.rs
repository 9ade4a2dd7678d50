//! The graph IR: a flat, typed list of mid-level ops in definition order (so the node list is
//! already a valid execution order), the parameter table with checkpoint names and initializers,
//! and the model's inputs, outputs and loss. Every node keeps the source span it came from.

pub mod dump;

use mgn_runtime::DType;
use mgn_syntax::Span;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Sigmoid,
    Tanh,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Sin,
    Cos,
    Square,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolOp {
    Max,
    Avg,
}

/// The op vocabulary. An op is here when its derivative is local and it lowers to one kernel
/// archetype; anything expressible from these (split, embedding, mse) is built from them.
/// Optional operands (norm weights, conv bias, attention mask) follow the required ones in
/// `Node::inputs`, in the order of their `has_*` flags.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Input { name: String },
    Param { index: usize },
    /// A scalar constant (shape `[]`), broadcast by its consumers.
    Constant { value: f64 },
    /// `0 … n-1` along the only axis.
    Arange,
    Unary(UnaryOp),
    Pow { exponent: f64 },
    /// Elementwise with NumPy broadcasting.
    Binary(BinaryOp),
    Cast,
    /// Batched matrix product with broadcasting over leading axes (PyTorch `matmul` rules).
    MatMul,
    Permute { perm: Vec<usize> },
    Reshape,
    Concat { axis: usize },
    Slice { axis: usize, start: usize, end: usize },
    /// `index_select`: the axis is replaced by the index tensor's shape.
    Gather { axis: usize },
    Reduce { op: ReduceOp, axes: Vec<usize>, keepdim: bool },
    ArgMax { axis: usize },
    Softmax { axis: usize, log: bool },
    LayerNorm { eps: f64, has_weight: bool, has_bias: bool },
    RmsNorm { eps: f64, has_weight: bool },
    GroupNorm { groups: usize, eps: f64, has_weight: bool, has_bias: bool },
    /// Inputs: x, running_mean, running_var, then weight and bias if present. Batch statistics
    /// in training plans (updating the running ones), running statistics in inference plans.
    BatchNorm { eps: f64, momentum: f64, has_weight: bool, has_bias: bool },
    /// Identity in inference plans.
    Dropout { p: f64 },
    Conv { stride: Vec<usize>, padding: Vec<usize>, dilation: Vec<usize>, groups: usize, has_bias: bool },
    Pool { op: PoolOp, kernel: Vec<usize>, stride: Vec<usize>, padding: Vec<usize> },
    /// Nearest-neighbour upsampling of the spatial axes (all after the first two).
    Upsample { scale: usize },
    Attention { causal: bool, scale: f64, has_mask: bool },
    Rope { theta: f64, offset: usize },
    /// Mean cross-entropy of logits `[.., C]` against integer targets `[..]`.
    SoftmaxCrossEntropy,
}

impl Op {
    /// Short name plus attributes, as printed in IR dumps.
    pub fn describe(&self) -> String {
        let list = |v: &[usize]| format!("[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "));
        match self {
            Op::Input { name } => format!("input {name}"),
            Op::Param { .. } => "param".into(),
            Op::Constant { value } => format!("constant {}", fmt_f64(*value)),
            Op::Arange => "arange".into(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Pow { exponent } => format!("pow {}", fmt_f64(*exponent)),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Cast => "cast".into(),
            Op::MatMul => "matmul".into(),
            Op::Permute { perm } => format!("permute {}", list(perm)),
            Op::Reshape => "reshape".into(),
            Op::Concat { axis } => format!("concat axis={axis}"),
            Op::Slice { axis, start, end } => format!("slice axis={axis} {start}..{end}"),
            Op::Gather { axis } => format!("gather axis={axis}"),
            Op::Reduce { op, axes, keepdim } => {
                format!("{} axes={}{}", format!("{op:?}").to_lowercase(), list(axes), if *keepdim { " keepdim" } else { "" })
            }
            Op::ArgMax { axis } => format!("argmax axis={axis}"),
            Op::Softmax { axis, log } => format!("{} axis={axis}", if *log { "log_softmax" } else { "softmax" }),
            Op::LayerNorm { eps, .. } => format!("layer_norm eps={}", fmt_f64(*eps)),
            Op::RmsNorm { eps, .. } => format!("rms_norm eps={}", fmt_f64(*eps)),
            Op::GroupNorm { groups, eps, .. } => format!("group_norm groups={groups} eps={}", fmt_f64(*eps)),
            Op::BatchNorm { eps, momentum, .. } => format!("batch_norm eps={} momentum={}", fmt_f64(*eps), fmt_f64(*momentum)),
            Op::Dropout { p } => format!("dropout p={}", fmt_f64(*p)),
            Op::Conv { stride, padding, dilation, groups, .. } => {
                format!("conv{}d stride={} padding={} dilation={} groups={groups}", stride.len(), list(stride), list(padding), list(dilation))
            }
            Op::Pool { op, kernel, stride, padding } => format!(
                "{}_pool{}d kernel={} stride={} padding={}",
                if *op == PoolOp::Max { "max" } else { "avg" },
                kernel.len(),
                list(kernel),
                list(stride),
                list(padding)
            ),
            Op::Upsample { scale } => format!("upsample scale={scale}"),
            Op::Attention { causal, scale, .. } => format!("attention{} scale={}", if *causal { " causal" } else { "" }, fmt_f64(*scale)),
            Op::Rope { theta, offset } => format!("rope theta={} offset={offset}", fmt_f64(*theta)),
            Op::SoftmaxCrossEntropy => "softmax_cross_entropy".into(),
        }
    }
}

/// Prints a float compactly and exactly enough to read back (`0.02`, `1e-5`, `10000`).
pub fn fmt_f64(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e6) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// How a parameter or buffer is initialized.
#[derive(Clone, Debug, PartialEq)]
pub enum InitSpec {
    Constant(f64),
    Normal { mean: f64, std: f64 },
    Uniform { low: f64, high: f64 },
}

impl fmt::Display for InitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitSpec::Constant(v) if *v == 0.0 => write!(f, "zeros"),
            InitSpec::Constant(v) if *v == 1.0 => write!(f, "ones"),
            InitSpec::Constant(v) => write!(f, "constant({})", fmt_f64(*v)),
            InitSpec::Normal { mean, std } => write!(f, "normal({}, {})", fmt_f64(*mean), fmt_f64(*std)),
            InitSpec::Uniform { low, high } => write!(f, "uniform({}, {})", fmt_g(*low), fmt_g(*high)),
        }
    }
}

/// Six significant digits, for derived bounds such as 1/sqrt(784).
fn fmt_g(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_string() }
}

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
}

#[derive(Clone, Debug)]
pub struct ParamInfo {
    /// Dotted checkpoint name, e.g. `blocks.0.attn.q_proj.weight`.
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub init: InitSpec,
    /// `param` fields are trained; `buffer` fields are state (saved, not trained).
    pub trainable: bool,
    pub node: NodeId,
    pub span: Span,
}

impl ParamInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
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

/// `f32[8, 64, 128]`.
pub fn fmt_type(dtype: DType, shape: &[usize]) -> String {
    format!("{dtype}[{}]", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}
