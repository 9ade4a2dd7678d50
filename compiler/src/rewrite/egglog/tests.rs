use super::*;
use crate::graph::{BinaryOp, Node, NodeId, Op, UnaryOp};

use crate::rewrite::test_node as node;

fn graph(nodes: Vec<Node>, outputs: &[u32]) -> Graph {
    let outputs = outputs.iter().map(|&o| (format!("y{o}"), NodeId(o))).collect();
    Graph { nodes, outputs, ..Graph::default() }
}

/// The op computing output `k` of `g`, and its operands' ops.
fn output(g: &Graph, k: usize) -> (Op, Vec<Op>) {
    let n = g.node(g.outputs[k].1);
    (n.op.clone(), n.inputs.iter().map(|&x| g.node(x).op.clone()).collect())
}

fn input(name: &str, shape: Vec<usize>) -> Node {
    node(Op::Input { name: name.into() }, vec![], shape)
}

#[test]
fn the_greedy_rules_hold() {
    let mut g = graph(
        vec![
            input("x", vec![2, 3]),
            node(Op::Permute { perm: vec![1, 0] }, vec![0], vec![3, 2]),
            node(Op::Permute { perm: vec![1, 0] }, vec![1], vec![2, 3]),
            node(Op::Unary(UnaryOp::Sigmoid), vec![2], vec![2, 3]),
            node(Op::Binary(BinaryOp::Mul), vec![3, 2], vec![2, 3]),
            node(Op::Reshape, vec![0], vec![6]),
            node(Op::Reshape, vec![5], vec![3, 2]),
            node(Op::Reshape, vec![6], vec![2, 3]),
            node(Op::Cast, vec![0], vec![2, 3]),
        ],
        &[4, 6, 7, 8],
    );
    let report = saturate(&mut g).expect("rewrites");
    assert!(report.saturated, "{report:?}");
    let x = Op::Input { name: "x".into() };
    // permute(permute(x)) is x, and sigmoid(x) · x is silu(x).
    assert_eq!(output(&g, 0), (Op::Unary(UnaryOp::Silu), vec![x.clone()]));
    // reshape(reshape(x)) reads x; a reshape back to x's shape, or a cast to its dtype, is x.
    assert_eq!(output(&g, 1), (Op::Reshape, vec![x.clone()]));
    assert_eq!(output(&g, 2).0, x);
    assert_eq!(output(&g, 3).0, x);
    // Only x, the silu and one reshape are left.
    assert_eq!(g.nodes.len(), 3);
}

#[test]
fn size_one_axes_are_summed_broadcast_and_permuted_by_reshaping() {
    let mut g = graph(
        vec![
            input("x", vec![1, 4, 3]),
            node(Op::SumTo, vec![0], vec![4, 3]),
            node(Op::BroadcastTo, vec![1], vec![1, 1, 4, 3]),
            node(Op::Permute { perm: vec![1, 0, 2] }, vec![0], vec![4, 1, 3]),
            // Summing a real batch, and moving an axis of 4 past one of 3, stay.
            input("b", vec![2, 4, 3]),
            node(Op::SumTo, vec![4], vec![4, 3]),
            node(Op::Permute { perm: vec![0, 2, 1] }, vec![0], vec![1, 3, 4]),
        ],
        &[1, 2, 3, 5, 6],
    );
    saturate(&mut g).expect("rewrites");
    let ops: Vec<Op> = (0..5).map(|k| output(&g, k).0).collect();
    assert_eq!(ops[..3], [Op::Reshape, Op::Reshape, Op::Reshape]);
    assert_eq!(ops[3], Op::SumTo);
    assert_eq!(ops[4], Op::Permute { perm: vec![0, 2, 1] });
}

#[test]
fn constants_fold_in_f32_and_exact_identities_vanish() {
    let c = |v: f64| node(Op::Constant { value: v }, vec![], vec![]);
    let mut g = graph(
        vec![
            input("x", vec![3]),
            c(0.1),
            c(0.2),
            node(Op::Binary(BinaryOp::Add), vec![1, 2], vec![]),
            node(Op::Unary(UnaryOp::Neg), vec![3], vec![]),
            c(1.0),
            node(Op::Binary(BinaryOp::Mul), vec![0, 5], vec![3]),
            node(Op::Unary(UnaryOp::Neg), vec![6], vec![3]),
            node(Op::Unary(UnaryOp::Neg), vec![7], vec![3]),
            c(0.0),
            // x + 0 stays: it would turn -0 into +0.
            node(Op::Binary(BinaryOp::Add), vec![0, 9], vec![3]),
        ],
        &[4, 8, 10],
    );
    saturate(&mut g).expect("rewrites");
    assert_eq!(output(&g, 0).0, Op::Constant { value: -(0.1f32 + 0.2f32) as f64 });
    assert_eq!(output(&g, 1).0, Op::Input { name: "x".into() });
    assert_eq!(output(&g, 2).0, Op::Binary(BinaryOp::Add));
}

#[test]
fn equal_pure_nodes_merge_and_dropouts_stay_apart() {
    let mut g = graph(
        vec![
            input("x", vec![4]),
            node(Op::Unary(UnaryOp::Exp), vec![0], vec![4]),
            node(Op::Unary(UnaryOp::Exp), vec![0], vec![4]),
            node(
                Op::Reduce { op: mgn_ir::op::ReduceOp::Sum, axes: vec![0], keepdim: false },
                vec![1],
                vec![],
            ),
            node(
                Op::Reduce { op: mgn_ir::op::ReduceOp::Sum, axes: vec![0], keepdim: false },
                vec![2],
                vec![],
            ),
            node(Op::Dropout { p: 0.5 }, vec![0], vec![4]),
            node(Op::Dropout { p: 0.5 }, vec![0], vec![4]),
        ],
        &[3, 4, 5, 6],
    );
    saturate(&mut g).expect("rewrites");
    assert_eq!(g.outputs[0].1, g.outputs[1].1, "one exp and one sum");
    assert_ne!(g.outputs[2].1, g.outputs[3].1, "two masks");
    assert_eq!(g.nodes.len(), 5);
}

/// A chain of `n` permutes cycling through `perms`, from an input of shape `shape`.
fn chain(n: usize, perms: &[Vec<usize>], shape: Vec<usize>) -> Graph {
    let mut nodes = vec![input("x", shape)];
    for k in 0..n {
        let p = perms[k % perms.len()].clone();
        let s = nodes[k].shape.clone();
        let shape = p.iter().map(|&a| s[a]).collect();
        nodes.push(node(Op::Permute { perm: p }, vec![k as u32], shape));
    }
    graph(nodes, &[n as u32])
}

#[test]
fn long_chains_stay_within_the_bounds() {
    // Transposes that cancel in pairs saturate: 300 of them are x.
    let mut g = chain(300, &[vec![1, 0, 2]], vec![2, 3, 5]);
    let report = saturate(&mut g).expect("rewrites");
    assert!(report.saturated, "{report:?}");
    assert_eq!(g.nodes.len(), 1);
    // Permutes that generate all 120 orders of five axes fill the e-graph with composites
    // (a bound may stop it first): whatever was found is extracted, far shorter than the chain.
    let mut g = chain(300, &[vec![1, 0, 2, 3, 4], vec![1, 2, 3, 4, 0]], vec![2, 3, 4, 5, 6]);
    let report = saturate(&mut g).expect("rewrites");
    assert!(report.iterations <= MAX_ITERATIONS, "{report:?}");
    assert!(g.nodes.len() < 300, "{report:?}");
}
