//! The graph into the e-graph: one term per live node, in order, with its class's type and the
//! `node` table that finds each node's class again after saturation.

use super::names::{binary_name, unary_name};
use super::prims::text;
use crate::graph::{Graph, Node, Op};
use egglog::{Core, EGraph, Error, FullState, IntoValue, RawValues, Value, Write};
use mgn_ir::DType;
use std::collections::HashMap;

/// The ops the rules see only as `OpK key …`: each key's op with its result's dtype and shape.
#[derive(Default)]
pub(super) struct Keys {
    pub(super) ops: Vec<(Op, DType, Vec<usize>)>,
    shared: HashMap<String, usize>,
}

impl Keys {
    /// The key of node `n`: shared by equal pure ops, so that the e-graph merges them; a node of
    /// its own for ops that are not pure functions of their operands.
    fn of(&mut self, n: &Node) -> usize {
        let entry = (n.op.clone(), n.dtype, n.shape.clone());
        if !pure(&n.op) {
            self.ops.push(entry);
            return self.ops.len() - 1;
        }
        let name = format!("{:?} {} {:?}", n.op, n.dtype, n.shape);
        *self.shared.entry(name).or_insert_with(|| {
            self.ops.push(entry);
            self.ops.len() - 1
        })
    }
}

/// Whether equal ops over equal operands compute equal values: not for inputs and parameters
/// (named values), dropout and its derivative (a random mask per node) or batch norm (which
/// updates its running statistics once per node in training).
fn pure(op: &Op) -> bool {
    !matches!(
        op,
        Op::Input { .. }
            | Op::Param { .. }
            | Op::Dropout { .. }
            | Op::DropoutGrad { .. }
            | Op::BatchNorm { .. }
    )
}

/// Adds the nodes `live` marks to `eg`, in order; returns the keys of the generic ops.
pub(super) fn insert(eg: &mut EGraph, g: &Graph, live: &[bool]) -> Result<Keys, Error> {
    let mut keys = Keys::default();
    eg.update(|mut fs| {
        let mut class: Vec<Option<Value>> = Vec::with_capacity(g.nodes.len());
        for (i, n) in g.nodes.iter().enumerate() {
            if !live[i] {
                class.push(None);
                continue;
            }
            let x: Vec<Value> = n
                .inputs
                .iter()
                .map(|id| class[id.0 as usize].expect("operands are live"))
                .collect();
            let c = term(&mut fs, &mut keys, n, &x)?;
            fs.set("shape", c, text(&n.shape))?;
            fs.set("dtype", c, n.dtype.name())?;
            fs.set("node", i as i64, c)?;
            class.push(Some(c));
        }
        Ok(())
    })?;
    Ok(keys)
}

/// The term of node `n` over its operands' classes `x`.
fn term(fs: &mut FullState, keys: &mut Keys, n: &Node, x: &[Value]) -> Result<Value, Error> {
    let shape = || text(&n.shape);
    match (&n.op, x) {
        // -0 would merge with +0 (the e-graph's floats compare them equal): kept generic.
        (Op::Constant { value }, []) if !(*value == 0.0 && value.is_sign_negative()) => {
            fs.add("Const", (*value, n.dtype.name()))
        }
        (Op::Unary(u), &[a]) => fs.add("Unary", (unary_name(*u), a)),
        (Op::Binary(b), &[a, c]) => fs.add("Binary", (binary_name(*b), a, c)),
        (Op::Cast, &[a]) => fs.add("Cast", (n.dtype.name(), a)),
        (Op::Permute { perm }, &[a]) => fs.add("Permute", (text(perm), a)),
        (Op::Reshape, &[a]) => fs.add("Reshape", (shape(), a)),
        (Op::SumTo, &[a]) => fs.add("SumTo", (shape(), a)),
        (Op::BroadcastTo, &[a]) => fs.add("BroadcastTo", (shape(), a)),
        _ => {
            let key = (keys.of(n) as i64).into_value(fs.base_values());
            if x.len() <= 6 {
                let row: Vec<Value> = std::iter::once(key).chain(x.iter().copied()).collect();
                return fs.add(&format!("Op{}", x.len()), RawValues(row));
            }
            let mut args = fs.add("Nil", RawValues(Vec::new()))?;
            for &a in x.iter().rev() {
                args = fs.add("Cons", RawValues(vec![a, args]))?;
            }
            fs.add("OpN", RawValues(vec![key, args]))
        }
    }
}
