//! The extracted terms back into a graph: the classes the results need, each computed once by
//! its chosen e-node, in the order of their positions (the original order, with what a rewrite
//! made just before its first use).

use super::encode::Keys;
use super::extract::{Choice, Head, View};
use crate::graph::{Graph, Node, NodeId, Op};
use mgn_syntax::Span;

/// Where a node comes from: its span, its user's span, and whether it stays in full precision.
type Origin = (Span, Span, crate::graph::Pin);

/// The graph `g` becomes: its results, parameters and inputs computed by the chosen terms.
pub(super) fn rebuild(
    g: &Graph,
    view: &View,
    choice: &Choice,
    keys: &Keys,
) -> Result<Graph, String> {
    let class = |id: NodeId| {
        view.class_of_node
            .get(id.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| format!("{id} has no class"))
    };
    let mut roots = Vec::new();
    for id in g.params.iter().map(|p| p.node).chain(g.inputs.iter().map(|(_, id)| *id)) {
        roots.push(class(id)?);
    }
    let written = g.state_writes.iter().map(|(_, id)| *id);
    for id in g.outputs.iter().map(|(_, id)| *id).chain(g.loss).chain(written) {
        roots.push(class(id)?);
    }
    let spans = needed(g, view, choice, keys, roots)?;
    let mut order: Vec<usize> = (0..view.classes()).filter(|&c| spans[c].is_some()).collect();
    order.sort_by_key(|&c| choice.pos[c]);
    let mut new_id: Vec<Option<NodeId>> = vec![None; view.classes()];
    let mut nodes = Vec::new();
    for c in order {
        let e = &view.enodes[choice.enode[c].ok_or("a needed class has no term")?];
        if matches!(e.head, Head::Nil | Head::Cons) {
            continue;
        }
        let mut inputs = Vec::new();
        for d in operands(view, choice, e)? {
            inputs.push(new_id[d].ok_or("an operand is computed after its use")?);
        }
        let (mut op, dtype, shape) = op_of(view, keys, c, &e.head)?;
        if let Op::DropoutGrad { forward, .. } = &mut op {
            let f = new_id[class(NodeId(*forward))?].ok_or("a dropout after its derivative")?;
            *forward = f.0;
        }
        let (span, user_span, full_precision) = spans[c].expect("needed");
        nodes.push(Node { op, inputs, dtype, shape, span, user_span, full_precision });
        new_id[c] = Some(NodeId(nodes.len() as u32 - 1));
    }
    let map = |id: NodeId| -> Result<NodeId, String> {
        new_id[class(id)?].ok_or_else(|| format!("{id} was not computed"))
    };
    let mut params = g.params.clone();
    for p in &mut params {
        p.node = map(p.node)?;
    }
    let results = |list: &[(String, NodeId)]| -> Result<Vec<(String, NodeId)>, String> {
        list.iter().map(|(n, id)| Ok((n.clone(), map(*id)?))).collect()
    };
    Ok(Graph {
        model: g.model.clone(),
        config: g.config.clone(),
        nodes,
        params,
        inputs: results(&g.inputs)?,
        outputs: results(&g.outputs)?,
        loss: g.loss.map(map).transpose()?,
        state_writes: (g.state_writes.iter())
            .map(|(p, id)| Ok((*p, map(*id)?)))
            .collect::<Result<_, String>>()?,
        aliases: g.aliases.clone(),
        counters: g.counters.clone(),
        training: g.training,
        loss_scaling: g.loss_scaling.clone(),
    })
}

/// The classes the roots need through the chosen terms, each with the spans its node gets: a
/// node's own, or for a class a rewrite made, its first user's.
fn needed(
    g: &Graph,
    view: &View,
    choice: &Choice,
    keys: &Keys,
    roots: Vec<usize>,
) -> Result<Vec<Option<Origin>>, String> {
    let mut spans: Vec<Option<Origin>> = vec![None; view.classes()];
    let own = |c: usize| {
        choice.pos[c].filter(|p| p.1 == 0).map(|p| {
            let n = &g.nodes[p.0];
            (n.span, n.user_span, n.full_precision)
        })
    };
    let mut seen = vec![false; view.classes()];
    let mut stack: Vec<(usize, Option<Origin>)> = roots.into_iter().map(|c| (c, None)).collect();
    while let Some((c, user)) = stack.pop() {
        if seen[c] {
            continue;
        }
        seen[c] = true;
        spans[c] = own(c).or(user);
        let e = &view.enodes[choice.enode[c].ok_or("a needed class has no term")?];
        stack.extend(e.children.iter().map(|&d| (d, spans[c])));
        if let Head::Op(k) = e.head {
            // A dropout derivative replays its forward node's mask: that node stays.
            if let Op::DropoutGrad { forward, .. } = keys.ops[k].0 {
                let f = view.class_of_node[forward as usize].ok_or("a dropout was not inserted")?;
                stack.push((f, spans[c]));
            }
        }
    }
    Ok(spans)
}

/// The operand classes of `e`, with an operand list (`OpN`) read through its chosen terms.
fn operands(view: &View, choice: &Choice, e: &super::extract::ENode) -> Result<Vec<usize>, String> {
    let Head::OpN(_) = e.head else { return Ok(e.children.clone()) };
    let mut out = Vec::new();
    let mut list = e.children[0];
    loop {
        let cell = &view.enodes[choice.enode[list].ok_or("an operand list has no term")?];
        match cell.head {
            Head::Cons => {
                out.push(cell.children[0]);
                list = cell.children[1];
            }
            _ => return Ok(out),
        }
    }
}

/// The op, dtype and shape of class `c` computed by an e-node with head `head`.
fn op_of(
    view: &View,
    keys: &Keys,
    c: usize,
    head: &Head,
) -> Result<(Op, mgn_ir::DType, Vec<usize>), String> {
    if let Head::Op(k) | Head::OpN(k) = head {
        return Ok(keys.ops[*k].clone());
    }
    let (dtype, shape) = view.types[c].clone().ok_or("a class has no type")?;
    let op = match head {
        Head::Const(value) => Op::Constant { value: *value },
        Head::Unary(u) => Op::Unary(*u),
        Head::Binary(b) => Op::Binary(*b),
        Head::Cast => Op::Cast,
        Head::Permute(perm) => Op::Permute { perm: perm.clone() },
        Head::Reshape => Op::Reshape,
        Head::SumTo => Op::SumTo,
        Head::BroadcastTo => Op::BroadcastTo,
        Head::Op(_) | Head::OpN(_) | Head::Nil | Head::Cons => unreachable!("handled above"),
    };
    Ok((op, dtype, shape))
}
