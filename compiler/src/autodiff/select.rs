//! The local rules of comparisons and selection, and of `maximum` / `minimum`, which route the
//! gradient through masks: comparisons give no gradient (their result is `bool`), `where` sends
//! `dy` to the side it picked, and `maximum` / `minimum` to the larger / smaller operand, half
//! to each on a tie (PyTorch's convention). A running sum's gradient is the running sum of `dy`
//! the other way; values read at indices send theirs back to those positions; windows at a
//! run-time start send theirs back through the same window.

use super::Builder;
use crate::graph::{BinaryOp, Node, NodeId, Op};
use mgn_ir::op::CompareOp;
use mgn_ir::DType;

type Grads = Vec<(usize, NodeId)>;

impl Builder<'_> {
    /// `a op b` as a `bool` mask with `origin`'s spans.
    pub(super) fn compare(
        &mut self,
        origin: NodeId,
        op: CompareOp,
        a: NodeId,
        b: NodeId,
    ) -> NodeId {
        let shape = mgn_ir::shape::broadcast(&self.shape(a), &self.shape(b))
            .expect("operands of a checked graph broadcast");
        let id = self.push_like(origin, Op::Compare(op), vec![a, b], shape);
        self.g.nodes[id.0 as usize].dtype = DType::Bool;
        id
    }

    /// `where(cond, a, b)` with `origin`'s spans and float dtype.
    pub(super) fn select(&mut self, origin: NodeId, cond: NodeId, a: NodeId, b: NodeId) -> NodeId {
        let broadcast = |x: &[usize], y: &[usize]| {
            mgn_ir::shape::broadcast(x, y).expect("operands of a checked graph broadcast")
        };
        let ab = broadcast(&self.shape(a), &self.shape(b));
        let shape = broadcast(&self.shape(cond), &ab);
        self.push_like(origin, Op::Where, vec![cond, a, b], shape)
    }

    /// A scalar `value` of `origin`'s float dtype.
    pub(super) fn scalar(&mut self, origin: NodeId, value: f64) -> NodeId {
        self.push_like(origin, Op::Constant { value }, vec![], vec![])
    }

    /// `where`: `dy` to `a` where the condition holds, to `b` elsewhere; none to the condition.
    pub(super) fn where_rule(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Grads {
        let (c, a, b) = (node.inputs[0], node.inputs[1], node.inputs[2]);
        let zero = self.scalar(n, 0.0);
        let ga = self.select(n, c, dy, zero);
        let gb = self.select(n, c, zero, dy);
        vec![(1, self.sum_to(n, ga, a)), (2, self.sum_to(n, gb, b))]
    }

    /// `maximum(a, b)` (`minimum` with the comparisons swapped): `dy` to the larger side, `dy/2`
    /// to each on a tie. A NaN operand makes every comparison false, so both get `dy`, as in
    /// PyTorch.
    pub(super) fn extremum_rule(
        &mut self,
        n: NodeId,
        dy: NodeId,
        op: BinaryOp,
        a: NodeId,
        b: NodeId,
    ) -> Grads {
        let (lose_a, lose_b) = match op {
            BinaryOp::Maximum => (CompareOp::Lt, CompareOp::Gt),
            _ => (CompareOp::Gt, CompareOp::Lt),
        };
        let tie = self.compare(n, CompareOp::Eq, a, b);
        let half = self.scalar(n, 0.5);
        let shared = self.binary(n, BinaryOp::Mul, dy, half);
        let t = self.select(n, tie, shared, dy);
        let zero = self.scalar(n, 0.0);
        let a_loses = self.compare(n, lose_a, a, b);
        let ga = self.select(n, a_loses, zero, t);
        let b_loses = self.compare(n, lose_b, a, b);
        let gb = self.select(n, b_loses, zero, t);
        vec![(0, self.sum_to(n, ga, a)), (1, self.sum_to(n, gb, b))]
    }

    /// `cumsum` and `take_along`.
    pub(super) fn scan_rule(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Grads {
        match node.op {
            Op::Cumsum { axis, reverse } => {
                self.only(n, node, Op::Cumsum { axis, reverse: !reverse }, vec![dy])
            }
            Op::TakeAlong { axis } => {
                self.only(n, node, Op::TakeAlongGrad { axis }, vec![node.inputs[1], dy])
            }
            _ => unreachable!("rule() sends only scans and take_along here"),
        }
    }

    /// Windows at a run-time start: `narrow` sends `dy` into zeros at the window;
    /// `slice_scatter` sends `dy` outside the window to `x` and the window to `src`. The start
    /// is an integer and gets none.
    pub(super) fn window_rule(&mut self, n: NodeId, dy: NodeId, node: &Node) -> Grads {
        let (x, start) = (node.inputs[0], *node.inputs.last().expect("a start"));
        let zeros = |b: &mut Self, like: NodeId| {
            let zero = b.scalar(n, 0.0);
            let s = b.shape(like);
            b.push_like(n, Op::BroadcastTo, vec![zero], s)
        };
        match node.op {
            Op::Narrow { axis, .. } => {
                let all = zeros(self, x);
                let s = self.shape(x);
                let op = Op::SliceScatter { axis };
                vec![(0, self.push_like(n, op, vec![all, dy, start], s))]
            }
            Op::SliceScatter { axis } => {
                let src = node.inputs[1];
                let (xs, ss) = (self.shape(x), self.shape(src));
                let window = zeros(self, src);
                let op = Op::SliceScatter { axis };
                let gx = self.push_like(n, op, vec![dy, window, start], xs);
                let op = Op::Narrow { axis, len: ss[axis] };
                vec![(0, gx), (1, self.push_like(n, op, vec![dy, start], ss))]
            }
            _ => unreachable!("rule() sends only narrow and slice_scatter here"),
        }
    }
}
