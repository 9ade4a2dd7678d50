//! Cross-entropy with class weights and an ignored target value, PyTorch's
//! `cross_entropy(weight =, ignore_index =)`, built from the element-wise ops: the
//! log-probability of each target read with `take_along`, weighted by `weight[target]` (0 for an
//! ignored one), and the weighted mean. Without either option the builtin makes the one
//! `SoftmaxCrossEntropy` node it always made.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::graph::{BinaryOp, CompareOp, NodeId, Op, ReduceOp};
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// `Σ w_i · nll_i / Σ w_i` over the rows, `w_i = weight[t_i]` (1 without a weight) and 0 where
/// `t_i == ignore`: PyTorch's mean over the targets it does not ignore. Every target ignored
/// gives 0 / 0, NaN, as in PyTorch.
pub(super) fn weighted(
    ev: &mut Evaluator,
    (logits, targets): (NodeId, NodeId),
    weight: Option<NodeId>,
    ignore: Option<i64>,
    span: Span,
) -> R<NodeId> {
    let (d, sl) = ev.ty(logits);
    let sl = sl.to_vec();
    let (dt, st) = ev.ty(targets);
    let st = st.to_vec();
    let class = sl.len() - 1;
    let node =
        |ev: &mut Evaluator, op, inputs, dtype, shape| checked(ev, op, inputs, dtype, shape, span);
    let keep = match ignore {
        None => None,
        Some(i) => {
            let c = node(ev, Op::Constant { value: i as f64 }, vec![], dt, vec![])?;
            Some(node(ev, Op::Compare(CompareOp::Ne), vec![targets, c], DType::Bool, st.clone())?)
        }
    };
    // An ignored target reads class 0 (its term is weighted 0), so no index is out of range.
    let safe = match keep {
        None => targets,
        Some(k) => {
            let zero = node(ev, Op::Constant { value: 0.0 }, vec![], dt, vec![])?;
            node(ev, Op::Where, vec![k, targets, zero], dt, st.clone())?
        }
    };
    let lsm = node(ev, Op::Softmax { axis: class, log: true }, vec![logits], d, sl.clone())?;
    let mut column = st.clone();
    column.push(1);
    let index = node(ev, Op::Reshape, vec![safe], dt, column.clone())?;
    let picked = node(ev, Op::TakeAlong { axis: class }, vec![lsm, index], d, column)?;
    let picked = node(ev, Op::Reshape, vec![picked], d, st.clone())?;
    let mut w = match weight {
        Some(w) => Some(node(ev, Op::Gather { axis: 0 }, vec![w, safe], d, st.clone())?),
        None => None,
    };
    if let Some(k) = keep {
        let m = node(ev, Op::Cast, vec![k], d, st.clone())?;
        w = Some(match w {
            Some(w) => node(ev, Op::Binary(BinaryOp::Mul), vec![w, m], d, st.clone())?,
            None => m,
        });
    }
    let all: Vec<usize> = (0..st.len()).collect();
    let sum = Op::Reduce { op: ReduceOp::Sum, axes: all, keepdim: false };
    let w = w.expect("a weight or an ignored index gives weights");
    let terms = node(ev, Op::Binary(BinaryOp::Mul), vec![picked, w], d, st.clone())?;
    let total = node(ev, sum.clone(), vec![terms], d, vec![])?;
    let norm = node(ev, sum, vec![w], d, vec![])?;
    let mean = node(ev, Op::Binary(BinaryOp::Div), vec![total, norm], d, vec![])?;
    node(ev, Op::Unary(crate::graph::UnaryOp::Neg), vec![mean], d, vec![])
}

/// The `ignore_index` argument, when given: an integer that fits the targets' 32 bits.
pub(super) fn ignore_index(ev: &Evaluator, a: &Args) -> R<Option<i64>> {
    if a.get("ignore_index").is_none() {
        return Ok(None);
    }
    let i = a.int_or(ev, "ignore_index", 0)?;
    if i32::try_from(i).is_err() {
        return Err(Diagnostic::error(
            "E0301",
            format!("`ignore_index` {i} does not fit the 32-bit targets"),
            a.span_of("ignore_index"),
            "out of range",
        ));
    }
    Ok(Some(i))
}
