//! The greedy engine (`--rewrites greedy`, the default): local rules applied in place to a fixed
//! point.
//!
//! Each rule replaces a node by a cheaper equivalent built only from nodes defined before it,
//! so rewriting in place keeps the node list in execution order; a node that becomes another
//! node's alias is left for lowering's liveness pass to drop.
//!
//! Rules:
//! - `permute(permute(x, p), q)` → `permute(x, p∘q)`, or `x` when that is the identity (autodiff
//!   transposes already-transposed weights for every matmul gradient);
//! - `permute(x, identity)` → `x`;
//! - `reshape(reshape(x))` → `reshape(x)`, and a reshape to `x`'s own shape → `x`;
//! - `x * sigmoid(x)` (either order) → `silu(x)`;
//! - `cast(x)` to `x`'s own dtype → `x`.

use crate::graph::{BinaryOp, Graph, NodeId, Op, UnaryOp};

/// Rewrites `g` until no rule applies; returns how many rewrites were made.
pub fn simplify(g: &mut Graph) -> usize {
    let mut total = 0;
    // Nodes already replaced by an alias: nothing reads them any more, so no rule revisits them.
    let mut aliased = vec![false; g.nodes.len()];
    loop {
        let n = pass(g, &mut aliased);
        total += n;
        if n == 0 {
            return total;
        }
    }
}

/// One sweep in order: rewrite each node, redirecting uses of nodes that became aliases.
fn pass(g: &mut Graph, aliased: &mut [bool]) -> usize {
    let mut alias: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
    let mut count = 0;
    for i in 0..g.nodes.len() {
        // Uses of earlier aliases see their replacements.
        let inputs: Vec<NodeId> = g.nodes[i].inputs.iter().map(|x| alias[x.0 as usize]).collect();
        g.nodes[i].inputs = inputs;
        if aliased[i] {
            continue;
        }
        match rule(g, i) {
            Some(Rewrite::Alias(x)) => {
                alias[i] = x;
                aliased[i] = true;
                count += 1;
            }
            Some(Rewrite::Replace(op, inputs)) => {
                g.nodes[i].op = op;
                g.nodes[i].inputs = inputs;
                count += 1;
            }
            None => {}
        }
    }
    let remap = |x: &mut NodeId| *x = alias[x.0 as usize];
    g.outputs.iter_mut().for_each(|(_, x)| remap(x));
    if let Some(l) = g.loss.as_mut() {
        remap(l);
    }
    count
}

enum Rewrite {
    /// The node computes exactly the value of another (earlier) node.
    Alias(NodeId),
    /// The node becomes this op over these (earlier) inputs.
    Replace(Op, Vec<NodeId>),
}

fn rule(g: &Graph, i: usize) -> Option<Rewrite> {
    let n = &g.nodes[i];
    let node = |x: NodeId| g.node(x);
    match &n.op {
        Op::Permute { perm } => {
            if perm.iter().enumerate().all(|(a, &p)| a == p) {
                return Some(Rewrite::Alias(n.inputs[0]));
            }
            let inner = node(n.inputs[0]);
            if let Op::Permute { perm: p } = &inner.op {
                // out[a] = inner[perm[a]] = x[p[perm[a]]].
                let composed: Vec<usize> = perm.iter().map(|&a| p[a]).collect();
                return Some(if composed.iter().enumerate().all(|(a, &c)| a == c) {
                    Rewrite::Alias(inner.inputs[0])
                } else {
                    Rewrite::Replace(Op::Permute { perm: composed }, vec![inner.inputs[0]])
                });
            }
            None
        }
        Op::Reshape => {
            let x = n.inputs[0];
            if node(x).shape == n.shape {
                return Some(Rewrite::Alias(x));
            }
            if let Op::Reshape = node(x).op {
                let src = node(x).inputs[0];
                return Some(if node(src).shape == n.shape {
                    Rewrite::Alias(src)
                } else {
                    Rewrite::Replace(Op::Reshape, vec![src])
                });
            }
            None
        }
        Op::Binary(BinaryOp::Mul) => {
            let (a, b) = (n.inputs[0], n.inputs[1]);
            let is_sigmoid_of = |s: NodeId, x: NodeId| {
                matches!(node(s).op, Op::Unary(UnaryOp::Sigmoid)) && node(s).inputs[0] == x
            };
            let x = if is_sigmoid_of(b, a) {
                a
            } else if is_sigmoid_of(a, b) {
                b
            } else {
                return None;
            };
            // Only when no broadcasting is involved: silu keeps x's shape.
            (node(x).shape == n.shape).then(|| Rewrite::Replace(Op::Unary(UnaryOp::Silu), vec![x]))
        }
        Op::Cast if node(n.inputs[0]).dtype == n.dtype => Some(Rewrite::Alias(n.inputs[0])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rewrite::test_node as node;

    #[test]
    fn double_transpose_cancels_and_silu_fuses() {
        let mut g = Graph {
            nodes: vec![
                node(Op::Input { name: "x".into() }, vec![], vec![2, 3]),
                node(Op::Permute { perm: vec![1, 0] }, vec![0], vec![3, 2]),
                node(Op::Permute { perm: vec![1, 0] }, vec![1], vec![2, 3]),
                node(Op::Unary(UnaryOp::Sigmoid), vec![2], vec![2, 3]),
                node(Op::Binary(BinaryOp::Mul), vec![2, 3], vec![2, 3]),
            ],
            outputs: vec![("y".into(), NodeId(4))],
            ..Graph::default()
        };
        assert!(simplify(&mut g) >= 2);
        // permute(permute(x)) is x; x * sigmoid(x) is silu(x) of x itself.
        assert_eq!(g.nodes[4].op, Op::Unary(UnaryOp::Silu));
        assert_eq!(g.nodes[4].inputs, vec![NodeId(0)]);
    }

    #[test]
    fn reshape_chains_collapse() {
        let mut g = Graph {
            nodes: vec![
                node(Op::Input { name: "x".into() }, vec![], vec![2, 3, 4]),
                node(Op::Reshape, vec![0], vec![6, 4]),
                node(Op::Reshape, vec![1], vec![24]),
                node(Op::Reshape, vec![2], vec![2, 3, 4]),
            ],
            outputs: vec![("a".into(), NodeId(2)), ("b".into(), NodeId(3))],
            ..Graph::default()
        };
        simplify(&mut g);
        assert_eq!(g.nodes[2].inputs, vec![NodeId(0)], "reshape of a reshape reads the source");
        assert_eq!(g.outputs[1].1, NodeId(0), "a reshape back to the source's shape is the source");
    }
}
