//! Reverse-mode automatic differentiation over the graph IR.
//!
//! Walks the graph backwards from the loss and appends, for every node on a path from a trained
//! parameter to the loss, the nodes computing the gradient of each of its inputs. Contributions
//! that reach one node along several paths are summed. Every derivative node keeps the span of
//! the forward node it differentiates, so errors and NaN reports in the backward pass still name
//! the model's line.
//!
//! `rules.rs` holds the local rule of every op, by family; this file the walk, the sums of
//! contributions and the small builders the rules share.

mod rules;
mod select;

use crate::graph::{BinaryOp, Graph, Node, NodeId, Op};
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// Which parameters to differentiate, and with which semantics.
pub struct GradOptions<'a> {
    /// Training semantics (batch statistics, dropout active) or inference semantics.
    pub training: bool,
    /// Parameters whose checkpoint name starts with one of these are frozen (no gradient).
    pub frozen: &'a [String],
    /// A loss scale (an `f32[]` node before the backward pass): the backward pass starts from
    /// it instead of 1, so every gradient is that many times the true one (backends divide it
    /// out where gradients are used: `mgn_ir::precision::LossScaling`).
    pub loss_scale: Option<NodeId>,
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
    let seed = match opts.loss_scale {
        Some(scale) => scale,
        None => b.push_like(loss, Op::Constant { value: 1.0 }, vec![], vec![]),
    };
    grads[loss.0 as usize] = Some(seed);

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
        let full_precision = o.full_precision.of_derivative();
        self.g.nodes.push(Node { op, inputs, dtype, shape, span, user_span, full_precision });
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
