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
//! - a permute that moves only axes of size 1 → a reshape (the same bytes in the same order, so
//!   no copy: decoding one token transposes `[1, 1, heads, d]` four times per layer);
//! - `reshape(reshape(x))` → `reshape(x)`, and a reshape to `x`'s own shape → `x`;
//! - `x * sigmoid(x)` (either order) → `silu(x)`;
//! - `cast(x)` to `x`'s own dtype → `x`;
//! - a pure node that repeats an earlier one (the same op over the same inputs, the same type) →
//!   that node (common subexpressions: every attention layer builds the same causal mask from
//!   the same position input).

use std::collections::HashMap;

use crate::graph::{BinaryOp, Graph, Node, NodeId, Op, UnaryOp};

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
    let mut seen: HashMap<String, NodeId> = HashMap::new();
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
        if let Some(key) = cse_key(&g.nodes[i]) {
            match seen.get(&key) {
                Some(&earlier) => {
                    alias[i] = earlier;
                    aliased[i] = true;
                    count += 1;
                }
                None => {
                    seen.insert(key, NodeId(i as u32));
                }
            }
        }
    }
    let remap = |x: &mut NodeId| *x = alias[x.0 as usize];
    g.outputs.iter_mut().for_each(|(_, x)| remap(x));
    if let Some(l) = g.loss.as_mut() {
        remap(l);
    }
    count
}

/// What makes a node equal to another: its op, inputs and type. Only for ops whose value is a
/// function of exactly these — not dropout (its mask is drawn per node), nor inputs, parameters
/// or the ops whose training behaviour is tied to the node (batch norm's running statistics).
fn cse_key(n: &Node) -> Option<String> {
    let pure = matches!(
        n.op,
        Op::Constant { .. }
            | Op::Arange
            | Op::Unary(_)
            | Op::Pow { .. }
            | Op::Binary(_)
            | Op::Cast
            | Op::Permute { .. }
            | Op::Reshape
            | Op::Compare(_)
            | Op::Where
            | Op::BroadcastTo
            | Op::Slice { .. }
            | Op::Narrow { .. }
            | Op::Rope { .. }
            | Op::MatMul
    );
    pure.then(|| format!("{:?} {:?} {:?} {:?}", n.op, n.inputs, n.dtype, n.shape))
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
            // Only axes of size 1 move when the others keep their order: the layout is the same.
            let x = &node(n.inputs[0]).shape;
            let moved: Vec<usize> = perm.iter().copied().filter(|&a| x[a] != 1).collect();
            moved
                .windows(2)
                .all(|w| w[0] < w[1])
                .then(|| Rewrite::Replace(Op::Reshape, vec![n.inputs[0]]))
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

    #[test]
    fn permutes_of_unit_axes_are_reshapes() {
        let mut g = Graph {
            nodes: vec![
                node(Op::Input { name: "x".into() }, vec![], vec![1, 1, 9, 64]),
                node(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![0], vec![1, 9, 1, 64]),
                node(Op::Permute { perm: vec![0, 3, 1, 2] }, vec![0], vec![1, 64, 1, 9]),
            ],
            outputs: vec![("a".into(), NodeId(1)), ("b".into(), NodeId(2))],
            ..Graph::default()
        };
        simplify(&mut g);
        assert_eq!(g.nodes[1].op, Op::Reshape, "only the size-1 axes move");
        assert!(matches!(g.nodes[2].op, Op::Permute { .. }), "9 and 64 swap: a real transpose");
    }

    #[test]
    fn repeated_pure_nodes_merge_and_dropouts_do_not() {
        let mut g = Graph {
            nodes: vec![
                node(Op::Input { name: "x".into() }, vec![], vec![4]),
                node(Op::Unary(UnaryOp::Exp), vec![0], vec![4]),
                node(Op::Unary(UnaryOp::Exp), vec![0], vec![4]),
                node(Op::Binary(BinaryOp::Add), vec![1, 2], vec![4]),
                node(Op::Binary(BinaryOp::Add), vec![2, 1], vec![4]),
                node(Op::Dropout { p: 0.5 }, vec![3], vec![4]),
                node(Op::Dropout { p: 0.5 }, vec![3], vec![4]),
            ],
            outputs: vec![
                ("a".into(), NodeId(3)),
                ("b".into(), NodeId(4)),
                ("c".into(), NodeId(5)),
                ("d".into(), NodeId(6)),
            ],
            ..Graph::default()
        };
        simplify(&mut g);
        assert_eq!(g.nodes[3].inputs, vec![NodeId(1), NodeId(1)], "the second exp is the first");
        assert_eq!(g.outputs[1].1, NodeId(3), "exp + exp once");
        assert_ne!(g.outputs[2].1, g.outputs[3].1, "each dropout draws its own mask");
    }
}
