//! Dequantized views: a packed parameter's `Op::Dequantize` read in place from the
//! parameter's words, each load decoding its element (`crate::packed`), so a quantized weight
//! stays packed in the arena and no step writes its f32 copy.
//!
//! A dequantize is a view when every step that reads it (directly, or through the views of it:
//! a reshape, a transpose products read in place, a rounded cast, a slice) is a kernel that
//! reads elements through `kernels::load` or `kernels::fetch_word`: the products (tiled,
//! cooperative-matrix, skinny, split, normed, with epilogues), the element-wise and fused
//! kernels, a gather's table (an embedding lookup reads only its packed rows) and a rotary
//! embedding. Any other reader (one reading raw words, as top-k does, or a convolution or
//! attention kernel with loads of its own) gets the dequantize as a step of its own, whose
//! kernel writes the f32 values (`kernels::plan_op`), and reads those.

use super::{rounded_views, sliced_views, transposed_views};
use crate::program::{GpuOp, GpuPlan};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;

/// Whether step `x` is a parameter, or a packed parameter's dequantize: what a transposed
/// view may read in place (a dequantize read through one is a view itself when it can be).
pub(super) fn param_or_dequantized(plan: &GpuPlan, x: usize) -> bool {
    match &plan.steps[x].op {
        GpuOp::Plan(Op::Param { .. }) => true,
        GpuOp::Plan(Op::Dequantize) => dequantizes_param(plan, x),
        _ => false,
    }
}

/// Whether step `i` is a dequantize of a packed parameter.
fn dequantizes_param(plan: &GpuPlan, i: usize) -> bool {
    let s = &plan.steps[i];
    let x = s.inputs.first().map(|&x| &plan.steps[x as usize]);
    s.op == GpuOp::Plan(Op::Dequantize)
        && x.is_some_and(|x| x.dtype.is_packed() && matches!(x.op, GpuOp::Plan(Op::Param { .. })))
}

/// Which steps are dequantized views (see the module's header).
pub fn dequantized_views(plan: &GpuPlan) -> Vec<bool> {
    let n = plan.steps.len();
    if !(0..n).any(|i| dequantizes_param(plan, i)) {
        return vec![false; n];
    }
    let def_use = DefUse::of(plan);
    let (transposed, rounded, sliced) =
        (transposed_views(plan), rounded_views(plan), sliced_views(plan));
    // Whether every reader of `v` reads its elements by loads, looking through views of it
    // (later steps first: readers come after).
    let mut by_loads = vec![false; n];
    for v in (0..n).rev() {
        by_loads[v] = !def_use.result[v]
            && !def_use.readers[v].is_empty()
            && def_use.readers[v].iter().all(|&r| {
                let r = r as usize;
                let view = transposed[r]
                    || rounded[r]
                    || sliced[r]
                    || plan.steps[r].op == GpuOp::Plan(Op::Reshape);
                if view {
                    by_loads[r]
                } else {
                    loads_elements(&plan.steps[r].op)
                }
            });
    }
    (0..n).map(|i| dequantizes_param(plan, i) && by_loads[i]).collect()
}

/// Whether the kernel of `op` reads each of its operands only through `kernels::load` and
/// `kernels::fetch_word`.
fn loads_elements(op: &GpuOp) -> bool {
    match op {
        GpuOp::MatMulT { .. }
        | GpuOp::MatMulEpilogue { .. }
        | GpuOp::ProductPair { .. }
        | GpuOp::Fused { .. }
        | GpuOp::SplitSum { .. } => true,
        GpuOp::NormedProduct { op, .. } | GpuOp::PermutedStore { op, .. } => loads_elements(op),
        GpuOp::Plan(op) => matches!(
            op,
            Op::MatMul
                | Op::Gather { .. }
                | Op::Rope { .. }
                | Op::Unary(_)
                | Op::UnaryGrad(_)
                | Op::Binary(_)
                | Op::Pow { .. }
                | Op::Compare(_)
                | Op::Where
                | Op::Cast
                | Op::BroadcastTo
                | Op::StopGradient
        ),
        _ => false,
    }
}
