//! What one step asks of the GPU: its arithmetic and the memory traffic it cannot avoid, for the
//! roofline of a profile (`mgnc bench --profile`): a dispatch's floor on a device is
//! `max(flops / f32 rate, bytes / copy rate)`.
//!
//! Products, convolutions and attention count their multiply-adds exactly (two FLOPs each, the
//! products a kernel computes, including the score matrix an attention derivative recomputes).
//! Every other step counts one FLOP per output element: those are bound by their traffic, which
//! is what their floor uses. Traffic is each input read once and the output written once, in
//! the arena's 32-bit words — a kernel that re-reads an operand from memory moves more.

use crate::program::GpuOp;
use mgn_ir::op::{GradPart, Op};

/// A step's arithmetic (FLOPs) and minimal memory traffic (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    pub flops: f64,
    pub bytes: f64,
}

impl Work {
    /// The least time this work takes on a device of `flops_per_s` and `bytes_per_s`, in seconds.
    pub fn floor_s(&self, flops_per_s: f64, bytes_per_s: f64) -> f64 {
        (self.flops / flops_per_s).max(self.bytes / bytes_per_s)
    }
}

impl std::ops::AddAssign for Work {
    fn add_assign(&mut self, o: Work) {
        self.flops += o.flops;
        self.bytes += o.bytes;
    }
}

fn numel(shape: &[usize]) -> f64 {
    shape.iter().product::<usize>() as f64
}

/// The work of `op` with inputs of these shapes and an output of `out`.
pub fn of(op: &GpuOp, inputs: &[&[usize]], out: &[usize]) -> Work {
    let read = match (op, inputs) {
        // A lookup reads its indices and the rows they pick, not the whole table: an
        // embedding's 49,152 rows counted whole made its floor 3× its time.
        (GpuOp::Plan(Op::Gather { .. }), [_, indices]) => numel(indices) + numel(out),
        _ => inputs.iter().map(|s| numel(s)).sum::<f64>(),
    };
    let bytes = 4.0 * (read + numel(out));
    let flops = flops(op, inputs, out).unwrap_or_else(|| numel(out));
    Work { flops, bytes }
}

/// The multiply-adds (×2) of the products, convolutions and attentions; None for the rest.
fn flops(op: &GpuOp, inputs: &[&[usize]], out: &[usize]) -> Option<f64> {
    let product = |ta: bool, splits: usize, extra: usize| {
        let a = inputs.first()?;
        let k = if ta { a.len().checked_sub(2).map(|i| a[i])? } else { *a.last()? };
        let outputs = numel(out) / splits.max(1) as f64;
        Some(2.0 * outputs * k as f64 + outputs * extra as f64)
    };
    match op {
        GpuOp::PermutedStore { op, shape, .. } => flops(op, inputs, shape),
        // The norm's few FLOPs per element of x are left out: the product's bound the step.
        GpuOp::NormedProduct { op, .. } => flops(op, inputs, out),
        GpuOp::Plan(Op::MatMul) => product(false, 1, 0),
        GpuOp::MatMulT { ta, splits, .. } => product(*ta, *splits, 0),
        GpuOp::MatMulEpilogue { program, ta, .. } => product(*ta, 1, program.len()),
        GpuOp::ProductPair { program } => {
            Some(2.0 * product(false, 1, 0)? + numel(out) * program.len() as f64)
        }
        GpuOp::Plan(
            conv @ (Op::Conv { .. } | Op::ConvGradInput { .. } | Op::ConvGradWeight { .. }),
        ) => conv_flops(conv, inputs, out),
        GpuOp::ConvSplit { conv, .. } => conv_flops(conv, inputs, out.get(1..)?),
        GpuOp::ConvEpilogue { conv, program } => {
            Some(conv_flops(conv, inputs, out)? + numel(out) * program.len() as f64)
        }
        GpuOp::Plan(Op::Attention { .. })
        | GpuOp::AttentionOnTiles { .. }
        | GpuOp::RotatedAttention { .. } => attention(inputs, 2),
        GpuOp::AttentionStats { .. } => attention(inputs, 1),
        GpuOp::Plan(Op::AttentionGrad { part, .. })
        | GpuOp::AttentionGradWithStats { part, .. } => {
            // Scores, then dP = dy·vᵀ and the part's product (dq, dk); dv needs no dP.
            attention(inputs, if *part == GradPart::V { 2 } else { 3 })
        }
        _ => None,
    }
}

/// A convolution's multiply-adds ×2: every output element of the forward takes `cin/groups ×
/// taps` of them, and both derivatives take as many as the forward.
fn conv_flops(conv: &Op, inputs: &[&[usize]], out: &[usize]) -> Option<f64> {
    // (the forward's output, the weight)
    let (y, w) = match conv {
        Op::Conv { .. } => (out, *inputs.get(1)?),
        Op::ConvGradInput { .. } => (*inputs.first()?, *inputs.get(1)?),
        Op::ConvGradWeight { .. } => (*inputs.get(1)?, out),
        _ => return None,
    };
    let per_output = numel(w) / *w.first()? as f64;
    Some(2.0 * numel(y) * per_output)
}

/// `products` score-sized products of an attention over `[.., Tq, D]` queries and
/// `[.., Tk, D]` keys, each `2·Tq·Tk·D` FLOPs per head.
fn attention(inputs: &[&[usize]], products: usize) -> Option<f64> {
    let (q, k) = (inputs.first()?, inputs.get(1)?);
    let tk = *k.get(k.len().checked_sub(2)?)?;
    Some(products as f64 * 2.0 * numel(q) * tk as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_moves_the_rows_it_picks() {
        // 3 indices into a [1000, 8] table: the indices, three rows, and the output.
        let w = of(&GpuOp::Plan(Op::Gather { axis: 0 }), &[&[1000, 8], &[3]], &[3, 8]);
        assert_eq!(w.bytes, 4.0 * (3.0 + 24.0 + 24.0));
    }

    #[test]
    fn a_product_counts_two_flops_per_multiply_add() {
        let w = of(&GpuOp::Plan(Op::MatMul), &[&[2, 3, 5], &[2, 5, 7]], &[2, 3, 7]);
        assert_eq!(w.flops, 2.0 * 2.0 * 3.0 * 7.0 * 5.0);
        assert_eq!(w.bytes, 4.0 * (30.0 + 70.0 + 42.0));
        // Transposed a holds [k, m]; a split product's output has the splits in front.
        let t = GpuOp::MatMulT { ta: true, tb: false, alpha: 1.0, splits: 4 };
        let w = of(&t, &[&[5, 3], &[5, 7]], &[4, 3, 7]);
        assert_eq!(w.flops, 2.0 * 3.0 * 7.0 * 5.0);
    }

    #[test]
    fn both_convolution_derivatives_cost_the_forward() {
        let conv = |op: Op| GpuOp::Plan(op);
        let (x, w, y): (&[usize], &[usize], &[usize]) =
            (&[2, 8, 9, 9], &[4, 8, 3, 3], &[2, 4, 7, 7]);
        let (stride, padding, dilation) = (vec![1, 1], vec![0, 0], vec![1, 1]);
        let fwd = Op::Conv {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups: 1,
            has_bias: false,
        };
        let gi = Op::ConvGradInput {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups: 1,
        };
        let gw = Op::ConvGradWeight { stride, padding, dilation, groups: 1 };
        let expected = 2.0 * (2 * 4 * 7 * 7) as f64 * (8 * 9) as f64;
        assert_eq!(of(&conv(fwd), &[x, w], y).flops, expected);
        assert_eq!(of(&conv(gi), &[y, w], x).flops, expected);
        assert_eq!(of(&conv(gw.clone()), &[x, y], w).flops, expected);
        let split = GpuOp::ConvSplit { conv: gw, splits: 3 };
        assert_eq!(of(&split, &[x, y], &[3, 4, 8, 3, 3]).flops, expected);
    }

    #[test]
    fn attention_counts_its_score_sized_products() {
        let (q, k): (&[usize], &[usize]) = (&[1, 2, 10, 4], &[1, 2, 30, 4]);
        let fwd = GpuOp::Plan(Op::Attention { causal: false, scale: 0.5, has_mask: false });
        assert_eq!(of(&fwd, &[q, k, k], q).flops, 2.0 * 2.0 * 80.0 * 30.0);
        let dv = GpuOp::AttentionGradWithStats {
            causal: false,
            scale: 0.5,
            has_mask: false,
            part: GradPart::V,
        };
        assert_eq!(of(&dv, &[q, k, k, q], k).flops, 2.0 * 2.0 * 80.0 * 30.0);
    }

    #[test]
    fn other_steps_are_judged_by_their_traffic() {
        let relu = GpuOp::Plan(Op::Unary(mgn_ir::op::UnaryOp::Relu));
        let w = of(&relu, &[&[1000]], &[1000]);
        assert_eq!((w.flops, w.bytes), (1000.0, 8000.0));
        // At 67 TFLOP/s and 4.3 TB/s the copy rate bounds it.
        assert_eq!(w.floor_s(67e12, 4.3e12), 8000.0 / 4.3e12);
    }
}
