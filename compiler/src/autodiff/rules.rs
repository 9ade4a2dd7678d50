//! The local rule of every differentiable op: given a forward node and the gradient `dy` of its
//! result, the nodes computing the gradient of each of its inputs. One function per family of
//! ops (point-wise, movement and reductions, normalizations, windows and attention), so each
//! stays readable; `rule` picks the family.

use super::Builder;
use crate::graph::{BinaryOp, GradPart, Node, NodeId, Op, ReduceOp, UnaryOp};
use mgn_ir::op::PadMode;
use mgn_syntax::Diagnostic;

/// (input position, gradient node) for each input that gets a gradient.
type Grads = Vec<(usize, NodeId)>;

impl Builder<'_> {
    /// The gradient of each differentiable input of `n`.
    pub(super) fn rule(&mut self, n: NodeId, dy: NodeId) -> Result<Grads, Diagnostic> {
        let node = self.g.node(n).clone();
        let grads = match &node.op {
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } | Op::Arange => Some(vec![]),
            // No gradient flows through either (`stop_gradient` is the point of the op).
            Op::ArgMax { .. } | Op::StopGradient => Some(vec![]),
            // A comparison's result is `bool`, top-k's integer positions: nothing to
            // differentiate.
            Op::Compare(_) | Op::TopK { .. } => Some(vec![]),
            Op::Where => Some(self.where_rule(n, dy, &node)),
            Op::Cumsum { .. } | Op::TakeAlong { .. } => Some(self.scan_rule(n, dy, &node)),
            Op::Narrow { .. } | Op::SliceScatter { .. } => Some(self.window_rule(n, dy, &node)),
            Op::Unary(_) | Op::Pow { .. } | Op::Binary(_) | Op::Cast | Op::MatMul => {
                Some(self.pointwise(n, dy, &node))
            }
            Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::GroupNorm { .. }
            | Op::BatchNorm { .. }
            | Op::Dropout { .. } => Some(self.norm(n, dy, &node)),
            Op::Pad { .. } | Op::Interpolate { .. } => Some(self.spatial(n, dy, &node)),
            _ => self.movement(n, dy, &node).or_else(|| self.windows(n, dy, &node)),
        };
        grads.ok_or_else(|| {
            Diagnostic::error(
                "E0702",
                format!("cannot differentiate `{}`", node.op.describe()),
                node.user_span,
                "second derivatives are not supported",
            )
        })
    }

    /// The one gradient of input 0: `op` over `inputs`, of input 0's shape.
    pub(super) fn only(&mut self, n: NodeId, node: &Node, op: Op, inputs: Vec<NodeId>) -> Grads {
        let s = self.shape(node.inputs[0]);
        vec![(0, self.push_like(n, op, inputs, s))]
    }

    fn pointwise(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Grads {
        let x = |i: usize| node.inputs[i];
        match &node.op {
            // relu'(x) = [x > 0] = [relu(x) > 0] (NaN included: 0 both ways), so the
            // derivative reads the result, as PyTorch's relu does: the next layer's weight
            // gradient keeps the result for the backward pass anyway, and the input need not
            // be kept beside it (a batch norm's output, a residual sum).
            Op::Unary(UnaryOp::Relu) => {
                self.only(n, node, Op::UnaryGrad(UnaryOp::Relu), vec![n, dy])
            }
            Op::Unary(u) => self.only(n, node, Op::UnaryGrad(*u), vec![x(0), dy]),
            Op::Pow { exponent } => {
                let s = self.shape(x(0));
                let pm1 = self.push_like(n, Op::Pow { exponent: exponent - 1.0 }, vec![x(0)], s);
                let c = self.push_like(n, Op::Constant { value: *exponent }, vec![], vec![]);
                let scaled = self.binary(n, BinaryOp::Mul, pm1, c);
                vec![(0, self.binary(n, BinaryOp::Mul, scaled, dy))]
            }
            Op::Binary(op) => self.binary_rule(n, dy, *op, x(0), x(1)),
            Op::Cast => {
                let dtype = self.g.node(x(0)).dtype;
                let grads = self.only(n, node, Op::Cast, vec![dy]);
                self.g.nodes[grads[0].1 .0 as usize].dtype = dtype;
                grads
            }
            Op::MatMul => self.matmul_rule(n, dy, x(0), x(1)),
            _ => unreachable!("rule() sends only point-wise ops and products here"),
        }
    }

    fn binary_rule(&mut self, n: NodeId, dy: NodeId, op: BinaryOp, a: NodeId, b: NodeId) -> Grads {
        let (ga, gb) = match op {
            BinaryOp::Maximum | BinaryOp::Minimum => return self.extremum_rule(n, dy, op, a, b),
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

    fn matmul_rule(&mut self, n: NodeId, dy: NodeId, a: NodeId, b: NodeId) -> Grads {
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

    /// Movement, selection and reductions; `None` for ops of another family.
    fn movement(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Option<Grads> {
        let x = |i: usize| node.inputs[i];
        Some(match &node.op {
            Op::Permute { perm } => {
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                self.only(n, node, Op::Permute { perm: inv }, vec![dy])
            }
            Op::Reshape => {
                let s = self.shape(x(0));
                vec![(0, self.reshape(n, dy, s))]
            }
            Op::Concat { axis } => {
                let mut start = 0;
                let mut out = Vec::new();
                for (i, &input) in node.inputs.iter().enumerate() {
                    let s = self.shape(input);
                    let end = start + s[*axis];
                    let slice = Op::Slice { axis: *axis, start, end };
                    out.push((i, self.push_like(n, slice, vec![dy], s)));
                    start = end;
                }
                out
            }
            Op::Slice { axis, start, end } => {
                let op = Op::SliceGrad { axis: *axis, start: *start, end: *end };
                self.only(n, node, op, vec![dy])
            }
            Op::Gather { axis } => {
                self.only(n, node, Op::GatherGrad { axis: *axis }, vec![x(1), dy])
            }
            Op::Reduce { op, axes, keepdim } => {
                let op = Op::ReduceGrad { op: *op, axes: axes.clone(), keepdim: *keepdim };
                self.only(n, node, op, vec![x(0), n, dy])
            }
            Op::Softmax { axis, log } => {
                self.only(n, node, Op::SoftmaxGrad { axis: *axis, log: *log }, vec![n, dy])
            }
            // `broadcast_to` / `expand`: the gradient sums back over the broadcast axes.
            Op::BroadcastTo => self.only(n, node, Op::SumTo, vec![dy]),
            _ => return None,
        })
    }

    /// The normalizations (a gradient for x, and for the weight and bias when present) and
    /// dropout.
    fn norm(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Grads {
        let training = self.training;
        let all = [GradPart::Input, GradPart::Weight, GradPart::Bias];
        match node.op.clone() {
            Op::LayerNorm { eps, has_weight, has_bias } => {
                let mk = |part| Op::LayerNormGrad { eps, has_weight, has_bias, part };
                self.parts(n, dy, node, &all.map(mk), (has_weight, has_bias), 1)
            }
            Op::RmsNorm { eps, has_weight } => {
                let mk = |part| Op::RmsNormGrad { eps, has_weight, part };
                self.parts(n, dy, node, &all.map(mk), (has_weight, false), 1)
            }
            Op::GroupNorm { groups, eps, has_weight, has_bias } => {
                let mk = |part| Op::GroupNormGrad { groups, eps, has_weight, has_bias, part };
                self.parts(n, dy, node, &all.map(mk), (has_weight, has_bias), 1)
            }
            Op::BatchNorm { eps, has_weight, has_bias, .. } => {
                let mk = |part| Op::BatchNormGrad { eps, has_weight, has_bias, part, training };
                // Inputs: x, running_mean, running_var, weight?, bias? — the statistics are
                // buffers, never differentiated.
                self.parts(n, dy, node, &all.map(mk), (has_weight, has_bias), 3)
            }
            Op::Dropout { p } if training => {
                self.only(n, node, Op::DropoutGrad { p, forward: n.0 }, vec![dy])
            }
            Op::Dropout { .. } => vec![(0, dy)],
            _ => unreachable!("rule() sends only normalizations and dropout here"),
        }
    }

    /// Gradients of a norm: input 0 always, the weight and bias when `has` says they are
    /// present. `ops` are the derivative ops for (input, weight, bias); each reads the forward
    /// op's inputs followed by `dy`. `first_affine` is the input position of the weight (after
    /// x and, for batch norm, the running statistics).
    fn parts(
        &mut self,
        n: NodeId,
        dy: NodeId,
        node: &Node,
        ops: &[Op; 3],
        has: (bool, bool),
        first_affine: usize,
    ) -> Grads {
        let mut inputs = node.inputs.clone();
        inputs.push(dy);
        let weight = has.0.then_some(first_affine);
        let bias = has.1.then_some(first_affine + has.0 as usize);
        let mut out = Vec::new();
        for (pos, op) in [Some(0), weight, bias].into_iter().zip(ops) {
            if let Some(pos) = pos {
                let s = self.shape(node.inputs[pos]);
                out.push((pos, self.push_like(n, op.clone(), inputs.clone(), s)));
            }
        }
        out
    }

    /// Convolution, pooling, upsampling, attention, rotary embeddings and the loss; `None` for
    /// anything else (an op autodiff itself made: second derivatives are not supported).
    fn windows(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Option<Grads> {
        let x = |i: usize| node.inputs[i];
        Some(match &node.op {
            Op::Conv { stride, padding, dilation, groups, has_bias } => {
                let (sx, sw) = (self.shape(x(0)), self.shape(x(1)));
                let (stride, padding, dilation, groups) =
                    (stride.clone(), padding.clone(), dilation.clone(), *groups);
                let di = Op::ConvGradInput {
                    stride: stride.clone(),
                    padding: padding.clone(),
                    dilation: dilation.clone(),
                    groups,
                };
                let dx = self.push_like(n, di, vec![dy, x(1)], sx);
                let dw = Op::ConvGradWeight { stride, padding, dilation, groups };
                let dw = self.push_like(n, dw, vec![x(0), dy], sw.clone());
                let mut out = vec![(0, dx), (1, dw)];
                if *has_bias {
                    let axes: Vec<usize> = (0..self.shape(dy).len()).filter(|&a| a != 1).collect();
                    let sum = Op::Reduce { op: ReduceOp::Sum, axes, keepdim: false };
                    out.push((2, self.push_like(n, sum, vec![dy], vec![sw[0]])));
                }
                out
            }
            // A transposed convolution (`conv_transpose*d`): the adjoint of the convolution's
            // input derivative is the convolution, and its weight derivative is the
            // convolution's with the roles of x and dy exchanged.
            Op::ConvGradInput { stride, padding, dilation, groups } => {
                let (sx, sw) = (self.shape(x(0)), self.shape(x(1)));
                let conv = Op::Conv {
                    stride: stride.clone(),
                    padding: padding.clone(),
                    dilation: dilation.clone(),
                    groups: *groups,
                    has_bias: false,
                };
                let dx = self.push_like(n, conv, vec![dy, x(1)], sx);
                let dw = Op::ConvGradWeight {
                    stride: stride.clone(),
                    padding: padding.clone(),
                    dilation: dilation.clone(),
                    groups: *groups,
                };
                vec![(0, dx), (1, self.push_like(n, dw, vec![dy, x(0)], sw))]
            }
            Op::Pool { op, kernel, stride, padding } => {
                let grad = Op::PoolGrad {
                    op: *op,
                    kernel: kernel.clone(),
                    stride: stride.clone(),
                    padding: padding.clone(),
                };
                self.only(n, node, grad, vec![x(0), dy])
            }
            Op::Upsample { scale } => {
                self.only(n, node, Op::UpsampleGrad { scale: *scale }, vec![dy])
            }
            Op::Attention { causal, scale, has_mask } => {
                let mut inputs = node.inputs.clone();
                inputs.push(dy);
                let mut out = Vec::new();
                for (i, part) in [(0, GradPart::Q), (1, GradPart::K), (2, GradPart::V)] {
                    let s = self.shape(x(i));
                    let op = Op::AttentionGrad {
                        causal: *causal,
                        scale: *scale,
                        has_mask: *has_mask,
                        part,
                    };
                    out.push((i, self.push_like(n, op, inputs.clone(), s)));
                }
                // A mask is added to the scores, so its derivative is dS (in the scores' shape)
                // summed over what it broadcast along. Lowering drops it when the mask depends on
                // nothing trained (a constant causal or padding mask).
                if *has_mask {
                    let op = Op::AttentionGrad {
                        causal: *causal,
                        scale: *scale,
                        has_mask: true,
                        part: GradPart::Mask,
                    };
                    let scores = mgn_ir::shape::attention::dims(
                        &self.shape(x(0)),
                        &self.shape(x(1)),
                        &self.shape(x(2)),
                    )
                    .expect("a checked attention's operands fit")
                    .scores;
                    let ds = self.push_like(n, op, inputs, scores);
                    out.push((3, self.sum_to(n, ds, x(3))));
                }
                out
            }
            Op::Rope { theta, offset, inverse } => {
                // The rotation's derivative is the rotation by the negative angle.
                let op = Op::Rope { theta: *theta, offset: *offset, inverse: !inverse };
                // A run-time start (decoding) rotates the derivative by the same positions.
                let inputs = std::iter::once(dy).chain(node.inputs.get(1).copied()).collect();
                self.only(n, node, op, inputs)
            }
            Op::SoftmaxCrossEntropy => {
                self.only(n, node, Op::SoftmaxCrossEntropyGrad, vec![x(0), x(1), dy])
            }
            _ => return None,
        })
    }
}

impl Builder<'_> {
    /// Padding and resampling: each derivative sends every element of `dy` back to the
    /// elements it was read from.
    fn spatial(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Grads {
        match node.op.clone() {
            Op::Pad { widths, mode: PadMode::Constant, .. } => {
                // The adjoint of constant padding is the interior: one slice per padded axis.
                let mut g = dy;
                for (axis, &[b, e]) in widths.iter().enumerate() {
                    if b + e > 0 {
                        let mut s = self.shape(g);
                        let end = s[axis] - e;
                        s[axis] = end - b;
                        g = self.push_like(n, Op::Slice { axis, start: b, end }, vec![g], s);
                    }
                }
                vec![(0, g)]
            }
            // Reflected and replicated elements were read more than once: their derivatives add.
            Op::Pad { widths, mode, .. } => {
                self.only(n, node, Op::PadGrad { widths, mode }, vec![dy])
            }
            Op::Interpolate { mode, size, scale, align_corners } => {
                let op = Op::InterpolateGrad { mode, size, scale, align_corners };
                self.only(n, node, op, vec![dy])
            }
            _ => unreachable!("rule() sends only padding and resampling here"),
        }
    }
}
