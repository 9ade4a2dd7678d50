//! Extraction: one term per e-class, read back from the saturated e-graph.
//!
//! The cost of a term is the bytes it moves and the dispatches it takes on the GPU (a reshape
//! is a view: no dispatch, no bytes; an input or a parameter is already there). A class that
//! some graph node computes counts nothing as an operand — it is computed anyway — so the costs
//! stay those of each node, not of the whole tree under it (a graph reads each value many
//! times; a tree would count it every time).
//!
//! Every class gets a position: a node's class the index of the first node in it, a class only
//! a rewrite made just after the latest of its operands. A class may only be computed from
//! classes positioned before it, so the extracted graph has no cycle (a reshape of a reshape
//! back to `x` is `x`'s class, and must not be read to compute `x`), and keeps the original
//! execution order.

use super::encode::Keys;
use super::names::{binary_of, dtype_of, unary_of};
use super::prims::dims;
use egglog::sort::{F, S};
use egglog::{EGraph, Error, Value};
use mgn_ir::op::{BinaryOp, UnaryOp};
use mgn_ir::{DType, Op};
use std::collections::HashMap;

/// What a dispatch costs in bytes moved: a launch and a barrier take a few microseconds, in
/// which an H200 moves megabytes.
const DISPATCH_BYTES: u64 = 4 << 20;

/// An e-node's constructor and its attributes.
#[derive(Clone, Debug)]
pub(super) enum Head {
    Op(usize),
    OpN(usize),
    Nil,
    Cons,
    Const(f64),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Permute(Vec<usize>),
    // The dtype or shape these give is their class's.
    Cast,
    Reshape,
    SumTo,
    BroadcastTo,
}

pub(super) struct ENode {
    pub(super) head: Head,
    /// Operand classes.
    pub(super) children: Vec<usize>,
    pub(super) class: usize,
}

/// The saturated e-graph as plain data: e-nodes over dense class numbers.
pub(super) struct View {
    pub(super) enodes: Vec<ENode>,
    /// Each class's dtype and shape (`None` for operand lists).
    pub(super) types: Vec<Option<(DType, Vec<usize>)>>,
    /// The class of each graph node, by index (`None` for nodes not inserted).
    pub(super) class_of_node: Vec<Option<usize>>,
}

/// The constructors of `rules.egg`, with how many leading columns are attributes.
const CONSTRUCTORS: [(&str, usize); 18] = [
    ("Op0", 1),
    ("Op1", 1),
    ("Op2", 1),
    ("Op3", 1),
    ("Op4", 1),
    ("Op5", 1),
    ("Op6", 1),
    ("OpN", 1),
    ("Nil", 0),
    ("Cons", 0),
    ("Const", 2),
    ("Unary", 1),
    ("Binary", 1),
    ("Cast", 1),
    ("Permute", 1),
    ("Reshape", 1),
    ("SumTo", 1),
    ("BroadcastTo", 1),
];

impl View {
    pub(super) fn read(eg: &EGraph, nodes: usize) -> Result<View, String> {
        let err = |e: Error| e.to_string();
        let mut ids: HashMap<Value, usize> = HashMap::new();
        let mut id = |v: Value| {
            let n = ids.len();
            *ids.entry(v).or_insert(n)
        };
        let mut enodes = Vec::new();
        for (name, attrs) in CONSTRUCTORS {
            let mut rows = Vec::new();
            eg.constructor_enodes(name, |e| {
                if !e.subsumed {
                    rows.push((e.children.to_vec(), e.eclass));
                }
            })
            .map_err(err)?;
            for (cols, eclass) in rows {
                let head = head(eg, name, &cols[..attrs])?;
                let children = cols[attrs..].iter().map(|&v| id(v)).collect();
                enodes.push(ENode { head, children, class: id(eclass) });
            }
        }
        let mut types = vec![None; ids.len()];
        let mut shapes = Vec::new();
        eg.function_entries("shape", |e| shapes.push((e.inputs[0], e.output))).map_err(err)?;
        let mut dtypes = HashMap::new();
        eg.function_entries("dtype", |e| {
            dtypes.insert(e.inputs[0], e.output);
        })
        .map_err(err)?;
        for (c, s) in shapes {
            let d = dtypes.get(&c).and_then(|&d| dtype_of(&eg.value_to_base::<S>(d)));
            if let (Some(&k), Some(d)) = (ids.get(&c), d) {
                types[k] = Some((d, dims(&eg.value_to_base::<S>(s))));
            }
        }
        let mut class_of_node = vec![None; nodes];
        eg.function_entries("node", |e| {
            let i = eg.value_to_base::<i64>(e.inputs[0]) as usize;
            class_of_node[i] = ids.get(&e.output).copied();
        })
        .map_err(err)?;
        Ok(View { enodes, types, class_of_node })
    }

    pub(super) fn classes(&self) -> usize {
        self.types.len()
    }

    /// Bytes of a value of class `c`.
    fn bytes(&self, c: usize) -> u64 {
        self.types[c]
            .as_ref()
            .map_or(0, |(d, s)| (s.iter().product::<usize>() * d.size_bytes()) as u64)
    }
}

/// The head of a row of constructor `name` from its attribute columns.
fn head(eg: &EGraph, name: &str, attrs: &[Value]) -> Result<Head, String> {
    let key = || eg.value_to_base::<i64>(attrs[0]) as usize;
    let string = || eg.value_to_base::<S>(attrs[0]).0;
    let unknown = |what: &str| format!("`{name}` of an unknown {what} `{}`", string());
    Ok(match name {
        "OpN" => Head::OpN(key()),
        "Nil" => Head::Nil,
        "Cons" => Head::Cons,
        "Const" => Head::Const(eg.value_to_base::<F>(attrs[0]).0 .0),
        "Unary" => Head::Unary(unary_of(&string()).ok_or_else(|| unknown("function"))?),
        "Binary" => Head::Binary(binary_of(&string()).ok_or_else(|| unknown("operator"))?),
        "Permute" => Head::Permute(dims(&string())),
        "Cast" => Head::Cast,
        "Reshape" => Head::Reshape,
        "SumTo" => Head::SumTo,
        "BroadcastTo" => Head::BroadcastTo,
        _ => Head::Op(key()),
    })
}

/// Where a class is computed: after the node of that index, `depth` rewrite-made classes in.
type Pos = (usize, usize);

/// The extracted term of every class that has one: its e-node, and its position.
pub(super) struct Choice {
    pub(super) enode: Vec<Option<usize>>,
    pub(super) pos: Vec<Option<Pos>>,
}

/// Picks each class's cheapest e-node among those whose operands are positioned before it.
pub(super) fn choose(view: &View, keys: &Keys) -> Choice {
    let pos = positions(view);
    let original: Vec<bool> =
        (0..view.classes()).map(|c| pos[c].is_some_and(|p| p.1 == 0)).collect();
    let mut order: Vec<usize> = (0..view.classes()).filter(|&c| pos[c].is_some()).collect();
    order.sort_by_key(|&c| pos[c]);
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); view.classes()];
    for (k, e) in view.enodes.iter().enumerate() {
        by_class[e.class].push(k);
    }
    let mut cost: Vec<u64> = vec![u64::MAX; view.classes()];
    let mut enode = vec![None; view.classes()];
    for c in order {
        let here = pos[c].expect("positioned");
        let mut best: Option<(u64, Pos, usize)> = None;
        for &k in &by_class[c] {
            let e = &view.enodes[k];
            let Some(last) = e
                .children
                .iter()
                .map(|&d| pos[d])
                .try_fold((0, 0), |m, p| p.filter(|&p| p < here).map(|p| m.max(p)))
            else {
                continue;
            };
            let operands = e.children.iter().filter(|&&d| !original[d]).map(|&d| cost[d]);
            let total = operands.fold(local_cost(view, keys, e), u64::saturating_add);
            // Ties go to the term reading the oldest values: what it stops reading can die.
            if best.is_none_or(|(b, l, _)| (total, last) < (b, l)) {
                best = Some((total, last, k));
            }
        }
        if let Some((total, _, k)) = best {
            cost[c] = total;
            enode[c] = Some(k);
        }
    }
    Choice { enode, pos }
}

/// Positions: a node's class at the first node in it; a class only a rewrite made just after
/// the latest operand of its earliest e-node (a fixed point: positions only move earlier).
fn positions(view: &View) -> Vec<Option<Pos>> {
    let mut pos: Vec<Option<Pos>> = vec![None; view.classes()];
    for (i, c) in view.class_of_node.iter().enumerate() {
        if let Some(c) = *c {
            pos[c] = Some(pos[c].map_or((i, 0), |p: Pos| p.min((i, 0))));
        }
    }
    let fixed: Vec<bool> = pos.iter().map(Option::is_some).collect();
    let mut changed = true;
    while changed {
        changed = false;
        for e in &view.enodes {
            if fixed[e.class] {
                continue;
            }
            let Some(last) =
                e.children.iter().try_fold((0, 0), |m: Pos, &d| pos[d].map(|p| m.max(p)))
            else {
                continue;
            };
            let candidate = (last.0, last.1 + 1);
            if pos[e.class].is_none_or(|p| candidate < p) {
                pos[e.class] = Some(candidate);
                changed = true;
            }
        }
    }
    pos
}

/// Bytes moved plus dispatches (as bytes) of one e-node, its operands aside.
fn local_cost(view: &View, keys: &Keys, e: &ENode) -> u64 {
    let moved = || view.bytes(e.class) + e.children.iter().map(|&d| view.bytes(d)).sum::<u64>();
    match &e.head {
        Head::Nil | Head::Cons => 0,
        // A view of its operand; the smallest cost, so that fewer reshapes win ties.
        Head::Reshape | Head::Const(_) => 1,
        Head::Op(k) | Head::OpN(k) => match keys.ops[*k].0 {
            Op::Input { .. } | Op::Param { .. } => 0,
            _ => DISPATCH_BYTES + moved(),
        },
        _ => DISPATCH_BYTES + moved(),
    }
}
