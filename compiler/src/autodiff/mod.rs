//! Reverse-mode automatic differentiation over the graph IR.
//!
//! Walks the graph backwards from the loss and appends, for every node on a path from a trained
//! parameter to the loss, the nodes computing the gradient of each of its inputs. Contributions
//! that reach one node along several paths are summed. Every derivative node keeps the span of
//! the forward node it differentiates, so errors and NaN reports in the backward pass still name
//! the model's line.

use crate::graph::{BinaryOp, GradPart, Graph, Node, NodeId, Op, UnaryOp};
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// Which parameters to differentiate, and with which semantics.
pub struct GradOptions<'a> {
    /// Training semantics (batch statistics, dropout active) or inference semantics.
    pub training: bool,
    /// Parameters whose checkpoint name starts with one of these are frozen (no gradient).
    pub frozen: &'a [String],
}

/// Appends the backward pass to `g`; returns (parameter index, gradient node) for every
/// trainable parameter that is not frozen, in parameter order. A parameter the loss does not
/// depend on gets an explicit zero gradient.
pub fn differentiate(
    g: &mut Graph,
    opts: &GradOptions,
) -> Result<Vec<(usize, NodeId)>, Diagnostic> {
    let Some(loss) = g.loss else {
        return Err(Diagnostic::error(
            "E0701",
            format!("model `{}` has no `loss`, so there is nothing to differentiate", g.model),
            Span::default(),
            "no loss",
        )
        .with_help("add `loss expr` to the model's forward, or build with `--mode infer`"));
    };
    let trained: Vec<usize> = (0..g.params.len())
        .filter(|&i| {
            g.params[i].trainable && !opts.frozen.iter().any(|f| is_frozen(&g.params[i].name, f))
        })
        .collect();

    // Which nodes depend on a trained parameter (only those need gradients).
    let forward_len = g.nodes.len();
    let mut needs = vec![false; forward_len];
    for (i, n) in g.nodes.iter().enumerate() {
        needs[i] = match n.op {
            Op::Param { index } => trained.contains(&index),
            _ => n.dtype.is_float() && n.inputs.iter().any(|x| needs[x.0 as usize]),
        };
    }

    let mut grads: Vec<Option<NodeId>> = vec![None; forward_len];
    let mut b = Builder { g, training: opts.training };
    let one = b.push_like(loss, Op::Constant { value: 1.0 }, vec![], vec![]);
    grads[loss.0 as usize] = Some(one);

    for i in (0..forward_len).rev() {
        let Some(dy) = grads[i] else { continue };
        if !needs[i] {
            continue;
        }
        let node = NodeId(i as u32);
        let contributions = b.rule(node, dy)?;
        for (input_pos, grad) in contributions {
            let x = b.g.node(node).inputs[input_pos];
            if !needs[x.0 as usize] {
                continue;
            }
            let slot = &mut grads[x.0 as usize];
            *slot = Some(match *slot {
                None => grad,
                Some(prev) => b.push_like(
                    x,
                    Op::Binary(BinaryOp::Add),
                    vec![prev, grad],
                    b.g.node(x).shape.clone(),
                ),
            });
        }
    }

    let mut out = Vec::new();
    for p in trained {
        let node = b.g.params[p].node;
        let grad = match grads[node.0 as usize] {
            Some(gr) => gr,
            None => {
                let zero = b.push_like(node, Op::Constant { value: 0.0 }, vec![], vec![]);
                let shape = b.g.node(node).shape.clone();
                b.push_like(node, Op::BroadcastTo, vec![zero], shape)
            }
        };
        out.push((p, grad));
    }
    Ok(out)
}

/// `prefix` freezes the parameter itself and everything under it (`model.embed_tokens`).
pub fn is_frozen(name: &str, prefix: &str) -> bool {
    name == prefix || name.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.'))
}

struct Builder<'g> {
    g: &'g mut Graph,
    training: bool,
}

impl Builder<'_> {
    /// Appends a derivative node of `origin`'s dtype, with `origin`'s spans.
    fn push_like(
        &mut self,
        origin: NodeId,
        op: Op,
        inputs: Vec<NodeId>,
        shape: Vec<usize>,
    ) -> NodeId {
        let o = self.g.node(origin);
        let dtype = if o.dtype.is_float() { o.dtype } else { DType::F32 };
        let (span, user_span) = (o.span, o.user_span);
        self.g.nodes.push(Node { op, inputs, dtype, shape, span, user_span });
        NodeId(self.g.nodes.len() as u32 - 1)
    }

    fn shape(&self, id: NodeId) -> Vec<usize> {
        self.g.node(id).shape.clone()
    }

    /// `dy` summed down to the shape of `x` (undoing broadcasting), if the shapes differ.
    fn sum_to(&mut self, origin: NodeId, dy: NodeId, x: NodeId) -> NodeId {
        let target = self.shape(x);
        if self.shape(dy) == target {
            dy
        } else {
            self.push_like(origin, Op::SumTo, vec![dy], target)
        }
    }

    fn binary(&mut self, origin: NodeId, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        let shape = mgn_ir::shape::broadcast(&self.shape(a), &self.shape(b))
            .expect("operands of a checked graph broadcast");
        self.push_like(origin, Op::Binary(op), vec![a, b], shape)
    }

    fn transpose_last(&mut self, origin: NodeId, x: NodeId) -> NodeId {
        let s = self.shape(x);
        let r = s.len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let out = perm.iter().map(|&p| s[p]).collect();
        self.push_like(origin, Op::Permute { perm }, vec![x], out)
    }

    fn reshape(&mut self, origin: NodeId, x: NodeId, shape: Vec<usize>) -> NodeId {
        if self.shape(x) == shape {
            x
        } else {
            self.push_like(origin, Op::Reshape, vec![x], shape)
        }
    }

    /// The gradient of each differentiable input of `n`, as (input position, gradient node).
    fn rule(&mut self, n: NodeId, dy: NodeId) -> Result<Vec<(usize, NodeId)>, Diagnostic> {
        let node = self.g.node(n).clone();
        let x = |i: usize| node.inputs[i];
        let shape_of = |b: &Self, i: usize| b.shape(node.inputs[i]);
        Ok(match &node.op {
            Op::Input { .. }
            | Op::Param { .. }
            | Op::Constant { .. }
            | Op::Arange
            | Op::ArgMax { .. } => vec![],
            Op::Unary(u) => {
                let s = shape_of(self, 0);
                vec![(0, self.push_like(n, Op::UnaryGrad(*u), vec![x(0), dy], s))]
            }
            Op::Pow { exponent } => {
                let s = shape_of(self, 0);
                let pm1 =
                    self.push_like(n, Op::Pow { exponent: exponent - 1.0 }, vec![x(0)], s.clone());
                let c = self.push_like(n, Op::Constant { value: *exponent }, vec![], vec![]);
                let scaled = self.binary(n, BinaryOp::Mul, pm1, c);
                vec![(0, self.binary(n, BinaryOp::Mul, scaled, dy))]
            }
            Op::Binary(op) => {
                let (a, b) = (x(0), x(1));
                let (ga, gb) = match op {
                    BinaryOp::Add => (dy, dy),
                    BinaryOp::Sub => {
                        let s = self.shape(dy);
                        (dy, self.push_like(n, Op::Unary(UnaryOp::Neg), vec![dy], s))
                    }
                    BinaryOp::Mul => {
                        (self.binary(n, BinaryOp::Mul, dy, b), self.binary(n, BinaryOp::Mul, dy, a))
                    }
                    BinaryOp::Div => {
                        let ga = self.binary(n, BinaryOp::Div, dy, b);
                        // d(a/b)/db = -a/b² = -(a/b)/b, reusing the forward result.
                        let q = self.binary(n, BinaryOp::Div, n, b);
                        let t = self.binary(n, BinaryOp::Mul, dy, q);
                        let s = self.shape(t);
                        let neg = self.push_like(n, Op::Unary(UnaryOp::Neg), vec![t], s);
                        (ga, neg)
                    }
                };
                let ga = self.sum_to(n, ga, a);
                let gb = self.sum_to(n, gb, b);
                vec![(0, ga), (1, gb)]
            }
            Op::Cast => {
                let s = shape_of(self, 0);
                let dtype = self.g.node(x(0)).dtype;
                let id = self.push_like(n, Op::Cast, vec![dy], s);
                self.g.nodes[id.0 as usize].dtype = dtype;
                vec![(0, id)]
            }
            Op::MatMul => self.matmul_rule(n, dy, x(0), x(1)),
            Op::Permute { perm } => {
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                let s = shape_of(self, 0);
                vec![(0, self.push_like(n, Op::Permute { perm: inv }, vec![dy], s))]
            }
            Op::Reshape => {
                let s = shape_of(self, 0);
                vec![(0, self.reshape(n, dy, s))]
            }
            Op::Concat { axis } => {
                let mut start = 0;
                let mut out = Vec::new();
                for i in 0..node.inputs.len() {
                    let s = shape_of(self, i);
                    let end = start + s[*axis];
                    out.push((
                        i,
                        self.push_like(n, Op::Slice { axis: *axis, start, end }, vec![dy], s),
                    ));
                    start = end;
                }
                out
            }
            Op::Slice { axis, start, end } => {
                let s = shape_of(self, 0);
                vec![(
                    0,
                    self.push_like(
                        n,
                        Op::SliceGrad { axis: *axis, start: *start, end: *end },
                        vec![dy],
                        s,
                    ),
                )]
            }
            Op::Gather { axis } => {
                let s = shape_of(self, 0);
                vec![(0, self.push_like(n, Op::GatherGrad { axis: *axis }, vec![x(1), dy], s))]
            }
            Op::Reduce { op, axes, keepdim } => {
                let s = shape_of(self, 0);
                vec![(
                    0,
                    self.push_like(
                        n,
                        Op::ReduceGrad { op: *op, axes: axes.clone(), keepdim: *keepdim },
                        vec![x(0), n, dy],
                        s,
                    ),
                )]
            }
            Op::Softmax { axis, log } => {
                let s = shape_of(self, 0);
                vec![(
                    0,
                    self.push_like(n, Op::SoftmaxGrad { axis: *axis, log: *log }, vec![n, dy], s),
                )]
            }
            Op::LayerNorm { eps, has_weight, has_bias } => {
                let mk = |part| Op::LayerNormGrad {
                    eps: *eps,
                    has_weight: *has_weight,
                    has_bias: *has_bias,
                    part,
                };
                self.parts(
                    n,
                    dy,
                    &node,
                    &[(0, mk(GradPart::Input)), (1, mk(GradPart::Weight)), (2, mk(GradPart::Bias))],
                    *has_weight,
                    *has_bias,
                    1,
                )
            }
            Op::RmsNorm { eps, has_weight } => {
                let mk = |part| Op::RmsNormGrad { eps: *eps, has_weight: *has_weight, part };
                self.parts(
                    n,
                    dy,
                    &node,
                    &[(0, mk(GradPart::Input)), (1, mk(GradPart::Weight))],
                    *has_weight,
                    false,
                    1,
                )
            }
            Op::GroupNorm { groups, eps, has_weight, has_bias } => {
                let mk = |part| Op::GroupNormGrad {
                    groups: *groups,
                    eps: *eps,
                    has_weight: *has_weight,
                    has_bias: *has_bias,
                    part,
                };
                self.parts(
                    n,
                    dy,
                    &node,
                    &[(0, mk(GradPart::Input)), (1, mk(GradPart::Weight)), (2, mk(GradPart::Bias))],
                    *has_weight,
                    *has_bias,
                    1,
                )
            }
            Op::BatchNorm { eps, has_weight, has_bias, .. } => {
                let training = self.training;
                let mk = |part| Op::BatchNormGrad {
                    eps: *eps,
                    has_weight: *has_weight,
                    has_bias: *has_bias,
                    part,
                    training,
                };
                // Inputs: x, running_mean, running_var, weight?, bias? — the statistics are buffers.
                self.parts(
                    n,
                    dy,
                    &node,
                    &[(0, mk(GradPart::Input)), (1, mk(GradPart::Weight)), (2, mk(GradPart::Bias))],
                    *has_weight,
                    *has_bias,
                    3,
                )
            }
            Op::Dropout { p } => {
                if self.training {
                    let s = shape_of(self, 0);
                    vec![(
                        0,
                        self.push_like(n, Op::DropoutGrad { p: *p, forward: n.0 }, vec![dy], s),
                    )]
                } else {
                    vec![(0, dy)]
                }
            }
            Op::Conv { stride, padding, dilation, groups, has_bias } => {
                let (sx, sw) = (shape_of(self, 0), shape_of(self, 1));
                let geometry = (stride.clone(), padding.clone(), dilation.clone(), *groups);
                let dx = self.push_like(
                    n,
                    Op::ConvGradInput {
                        stride: geometry.0.clone(),
                        padding: geometry.1.clone(),
                        dilation: geometry.2.clone(),
                        groups: geometry.3,
                    },
                    vec![dy, x(1)],
                    sx,
                );
                let dw = self.push_like(
                    n,
                    Op::ConvGradWeight {
                        stride: geometry.0,
                        padding: geometry.1,
                        dilation: geometry.2,
                        groups: geometry.3,
                    },
                    vec![x(0), dy],
                    sw.clone(),
                );
                let mut out = vec![(0, dx), (1, dw)];
                if *has_bias {
                    let axes: Vec<usize> = (0..self.shape(dy).len()).filter(|&a| a != 1).collect();
                    out.push((
                        2,
                        self.push_like(
                            n,
                            Op::Reduce { op: crate::graph::ReduceOp::Sum, axes, keepdim: false },
                            vec![dy],
                            vec![sw[0]],
                        ),
                    ));
                }
                out
            }
            Op::Pool { op, kernel, stride, padding } => {
                let s = shape_of(self, 0);
                vec![(
                    0,
                    self.push_like(
                        n,
                        Op::PoolGrad {
                            op: *op,
                            kernel: kernel.clone(),
                            stride: stride.clone(),
                            padding: padding.clone(),
                        },
                        vec![x(0), dy],
                        s,
                    ),
                )]
            }
            Op::Upsample { scale } => {
                let s = shape_of(self, 0);
                vec![(0, self.push_like(n, Op::UpsampleGrad { scale: *scale }, vec![dy], s))]
            }
            Op::Attention { causal, scale, has_mask } => {
                let mut inputs = node.inputs.clone();
                inputs.push(dy);
                let mut out = Vec::new();
                for (i, part) in [(0, GradPart::Q), (1, GradPart::K), (2, GradPart::V)] {
                    let s = shape_of(self, i);
                    out.push((
                        i,
                        self.push_like(
                            n,
                            Op::AttentionGrad {
                                causal: *causal,
                                scale: *scale,
                                has_mask: *has_mask,
                                part,
                            },
                            inputs.clone(),
                            s,
                        ),
                    ));
                }
                out
            }
            Op::Rope { theta, offset, inverse } => {
                let s = shape_of(self, 0);
                vec![(
                    0,
                    self.push_like(
                        n,
                        Op::Rope { theta: *theta, offset: *offset, inverse: !inverse },
                        vec![dy],
                        s,
                    ),
                )]
            }
            Op::SoftmaxCrossEntropy => {
                let s = shape_of(self, 0);
                vec![(0, self.push_like(n, Op::SoftmaxCrossEntropyGrad, vec![x(0), x(1), dy], s))]
            }
            other => {
                return Err(Diagnostic::error(
                    "E0702",
                    format!("cannot differentiate `{}`", other.describe()),
                    node.user_span,
                    "second derivatives are not supported",
                ))
            }
        })
    }

    /// Gradients of a norm: input 0 always, the weight and bias when present. The derivative
    /// op reads the forward op's inputs followed by `dy`. `first_affine` is the input position of
    /// the weight (after x and, for batch norm, the running statistics).
    #[allow(clippy::too_many_arguments)]
    fn parts(
        &mut self,
        n: NodeId,
        dy: NodeId,
        node: &Node,
        ops: &[(usize, Op)],
        has_weight: bool,
        has_bias: bool,
        first_affine: usize,
    ) -> Vec<(usize, NodeId)> {
        let mut inputs = node.inputs.clone();
        inputs.push(dy);
        let mut out = Vec::new();
        let mut next = first_affine;
        for (which, op) in ops {
            let pos = match which {
                0 => 0,
                1 if has_weight => {
                    next += 1;
                    next - 1
                }
                2 if has_bias => next,
                _ => continue,
            };
            let s = self.shape(node.inputs[pos]);
            out.push((pos, self.push_like(n, op.clone(), inputs.clone(), s)));
        }
        out
    }

    fn matmul_rule(&mut self, n: NodeId, dy: NodeId, a: NodeId, b: NodeId) -> Vec<(usize, NodeId)> {
        let (sa, sb, sy) = (self.shape(a), self.shape(b), self.shape(dy));
        // Promote 1-D operands as matmul does, then undo it on the gradients.
        let a2 = if sa.len() == 1 { self.reshape(n, a, vec![1, sa[0]]) } else { a };
        let b2 = if sb.len() == 1 { self.reshape(n, b, vec![sb[0], 1]) } else { b };
        let mut sy2 = sy.clone();
        if sa.len() == 1 {
            sy2.insert(sy2.len() - usize::from(sb.len() > 1), 1);
        }
        if sb.len() == 1 {
            sy2.push(1);
        }
        let dy2 = self.reshape(n, dy, sy2);
        let bt = self.transpose_last(n, b2);
        let at = self.transpose_last(n, a2);
        let da = self.matmul(n, dy2, bt);
        let db = self.matmul(n, at, dy2);
        let da = self.sum_to(n, da, a2);
        let db = self.sum_to(n, db, b2);
        let da = self.reshape(n, da, sa);
        let db = self.reshape(n, db, sb);
        vec![(0, da), (1, db)]
    }

    fn matmul(&mut self, origin: NodeId, a: NodeId, b: NodeId) -> NodeId {
        let shape = mgn_ir::shape::matmul(&self.shape(a), &self.shape(b))
            .expect("gradient matmuls are well-shaped");
        self.push_like(origin, Op::MatMul, vec![a, b], shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freezing_is_by_dotted_prefix() {
        assert!(is_frozen("model.embed_tokens.weight", "model.embed_tokens"));
        assert!(is_frozen("fc1.weight", "fc1.weight"));
        assert!(!is_frozen("fc10.weight", "fc1"));
    }
}
