//! The typing rules of the GPU's own ops: the shape a step of each must have, given its
//! inputs' (the plan's ops are typed by `mgn_ir::infer`). `GpuPlan::validate` applies them, so
//! a pass that mistypes a step fails in the tests, and a dynamic plan's program at a run's
//! sizes (`dynamic.rs`) is refused when a fitted shape is not what the op makes there.

use super::GpuOp;
use mgn_ir::infer::{self, Ty};
use mgn_ir::op::{GradPart, Op};
use mgn_ir::shape::{broadcast, matmul};

/// Whether a step of the private op `op` over `x` may produce `out` (inputs already counted).
pub(super) fn check_private(op: &GpuOp, x: &[Ty], out: Ty) -> Result<(), String> {
    let (_, o) = out;
    let want = |shape: Vec<usize>, what: &str| -> Result<(), String> {
        if o == shape.as_slice() {
            Ok(())
        } else {
            Err(format!("{what} gives {shape:?}, but the step is {o:?}"))
        }
    };
    match op {
        GpuOp::Plan(_) => unreachable!("plan ops are typed by mgn_ir::infer"),
        GpuOp::AttentionStats { .. } => want(with_last(x[0].1, 2)?, "the statistics of q"),
        GpuOp::AttentionOnTiles { causal, scale, has_mask } => {
            let attention = Op::Attention { causal: *causal, scale: *scale, has_mask: *has_mask };
            infer::check(&attention, x, out).map_err(|e| format!("the attention {e}"))
        }
        GpuOp::AttentionGradWithStats { part, has_mask, .. } => {
            let stats = x[4 + *has_mask as usize].1;
            if stats != with_last(x[0].1, 2)?.as_slice() {
                return Err(format!("statistics {stats:?} do not fit q {:?}", x[0].1));
            }
            let of = match part {
                GradPart::K => 1,
                GradPart::V => 2,
                GradPart::Mask => {
                    let d = mgn_ir::shape::attention::dims(x[0].1, x[1].1, x[2].1)
                        .map_err(|e| format!("the attention {e}"))?;
                    return want(d.scores, "the scores");
                }
                _ => 0,
            };
            want(x[of].1.to_vec(), "the derivative's operand")
        }
        GpuOp::NormWeightGradPartial { chunk, .. } => {
            let d = *x[0].1.last().ok_or("a norm of a scalar")?;
            let rows = x[0].1.iter().product::<usize>() / d.max(1);
            same(x[1].1, x[0].1, "dy")?;
            want(vec![rows.div_ceil((*chunk).max(1)), d], "rows in chunks")
        }
        GpuOp::BatchMoments { .. }
        | GpuOp::BatchGradSums { .. }
        | GpuOp::BatchNormWithMoments { .. }
        | GpuOp::BatchNormGradWithSums { .. } => check_batch(op, x, out),
        GpuOp::ConvSplit { conv, splits } => match o.split_first() {
            Some((&s, rest)) if s == *splits => {
                infer::check(conv, x, (out.0, rest)).map_err(|e| format!("the split {e}"))
            }
            _ => Err(format!("{o:?} is not {splits} convolutions' outputs")),
        },
        GpuOp::CrossEntropyRows => {
            let c = *x[0].1.last().ok_or("logits without a class axis")?;
            same(x[1].1, &x[0].1[..x[0].1.len() - 1], "the targets")?;
            want(vec![x[0].1.iter().product::<usize>() / c.max(1)], "one term per row")
        }
        GpuOp::Fused { .. } => x.iter().try_for_each(|t| broadcasts(t.1, o)),
        GpuOp::AttentionProbs { .. } => {
            x[1..].iter().try_for_each(|t| broadcasts(t.1, x[0].1))?;
            want(x[0].1.to_vec(), "the scores")
        }
        GpuOp::MatMulEpilogue { ta, tb, .. } => {
            want(product(x, *ta, *tb)?, "the product")?;
            x[2..].iter().try_for_each(|t| broadcasts(t.1, o))
        }
        GpuOp::ConvEpilogue { conv, .. } => {
            let operands = super::op::conv_operands(conv)?;
            infer::check(conv, &x[..operands], out).map_err(|e| format!("the convolution {e}"))?;
            x[operands..].iter().try_for_each(|t| broadcasts(t.1, o))
        }
        GpuOp::NormEpilogue { norm, .. } => {
            let operands = super::op::norm_operands(norm)?;
            infer::check(norm, &x[..operands], out).map_err(|e| format!("the norm {e}"))?;
            x[operands..].iter().try_for_each(|t| broadcasts(t.1, o))
        }
        GpuOp::MatMulT { ta, tb, splits, .. } => {
            let mut shape = product(x, *ta, *tb)?;
            if *splits > 1 {
                shape.insert(0, *splits);
            }
            want(shape, "the product")
        }
        GpuOp::ScatterInPlace { axis, rope: None } => {
            infer::check(&mgn_ir::op::Op::SliceScatter { axis: *axis }, x, out)
                .map_err(|e| e.to_string())
        }
        GpuOp::ScatterInPlace { rope: Some(_), .. }
        | GpuOp::ProductPair { .. }
        | GpuOp::RotatedAttention { .. } => check_decoding(op, x, out),
        GpuOp::PermutedStore { .. } | GpuOp::NormedProduct { .. } => check_wrapped(op, x, out),
        GpuOp::SplitSum { splits, .. } => {
            let mut partials = o.to_vec();
            partials.insert(0, *splits);
            same(x[0].1, &partials, "the partial products")?;
            x[1..].iter().try_for_each(|t| broadcasts(t.1, o))
        }
    }
}

/// `check_private` for the ops that wrap another step's op: a result stored permuted, a
/// product of normed rows.
fn check_wrapped(op: &GpuOp, x: &[Ty], out: Ty) -> Result<(), String> {
    let (_, o) = out;
    match op {
        GpuOp::PermutedStore { op, shape, view, perm } => {
            op.check(x, (out.0, shape))?;
            if view.iter().product::<usize>() != shape.iter().product::<usize>() {
                return Err(format!("{shape:?} cannot be seen as {view:?}"));
            }
            let mut seen = perm.clone();
            seen.sort_unstable();
            if seen != (0..view.len()).collect::<Vec<_>>() {
                return Err(format!("{perm:?} is no permutation of {} axes", view.len()));
            }
            let permuted: Vec<usize> = perm.iter().map(|&a| view[a]).collect();
            if o != permuted.as_slice() {
                return Err(format!(
                    "the permuted result gives {permuted:?}, but the step is {o:?}"
                ));
            }
            Ok(())
        }
        GpuOp::NormedProduct { norm, op, rounded } => {
            if !matches!(norm, Op::LayerNorm { .. } | Op::RmsNorm { .. }) {
                return Err(format!("`{}` is not a norm over rows", norm.describe()));
            }
            let (inner, params) = x.split_at(x.len() + 1 - super::op::norm_operands(norm)?);
            let normed: Vec<Ty> = [&inner[..1], params].concat();
            infer::check(norm, &normed, inner[0]).map_err(|e| format!("the norm {e}"))?;
            let mut inner = inner.to_vec();
            if let Some(h) = rounded {
                if !h.is_half() || inner[0].0 != mgn_ir::DType::F32 {
                    return Err(format!("a norm of {:?} rounded to {h:?}", inner[0].0));
                }
                // The product reads the rounded value.
                inner[0].0 = *h;
            }
            op.check(&inner, out)
        }
        _ => unreachable!("not a wrapping op"),
    }
}

/// `check_private` for decoding's fused steps: a cache write that rotates the keys it writes
/// or an attention that rotates its queries (`rewrite::rope_scatter`), and a pair of products
/// (`rewrite::product_pairs`).
fn check_decoding(op: &GpuOp, x: &[Ty], out: Ty) -> Result<(), String> {
    let o = out.1;
    match op {
        GpuOp::ScatterInPlace { axis, rope: Some(rope) } => {
            // The rotation keeps src's type; the scatter then takes it as it took the rope's.
            let rope_in: Vec<Ty> = [&x[1..2], &x[3..]].concat();
            infer::check(rope, &rope_in, x[1]).map_err(|e| format!("the rope {e}"))?;
            infer::check(&mgn_ir::op::Op::SliceScatter { axis: *axis }, &x[..3], out)
                .map_err(|e| e.to_string())
        }
        GpuOp::ProductPair { .. } => {
            same(o, &product(x, false, true)?, "the first product")?;
            same(o, &product(&[x[0], x[2]], false, true)?, "the second product")?;
            x[3..].iter().try_for_each(|t| broadcasts(t.1, o))
        }
        GpuOp::RotatedAttention { attention, rope, rounded } => {
            // The rotation keeps q's type; the attention then takes it as it took the rope's
            // (or its cast's, rounded to a half type).
            let n = 3 + matches!(attention, Op::Attention { has_mask: true, .. }) as usize;
            let rope_in: Vec<Ty> = [&x[..1], &x[n..]].concat();
            infer::check(rope, &rope_in, x[0]).map_err(|e| format!("the rope {e}"))?;
            if rounded.is_some_and(|h| !h.is_half() || x[0].0 != mgn_ir::DType::F32) {
                return Err(format!("queries of {:?} rounded to {rounded:?}", x[0].0));
            }
            let q = (rounded.unwrap_or(x[0].0), x[0].1);
            let operands: Vec<Ty> = [&[q][..], &x[1..n]].concat();
            infer::check(attention, &operands, out).map_err(|e| format!("the attention {e}"))
        }
        _ => unreachable!("not a decoding step"),
    }
}

/// `check_private` for a training batch norm's steps over chunks (`rewrite::batch_moments`).
fn check_batch(op: &GpuOp, x: &[Ty], out: Ty) -> Result<(), String> {
    let o = out.1;
    let want = |shape: Vec<usize>, what: &str| same(o, &shape, what);
    match op {
        GpuOp::BatchMoments { chunk } => want(moments_shape(x[0].1, *chunk)?, "chunks of x"),
        GpuOp::BatchGradSums { chunk } => {
            same(x[1].1, x[0].1, "dy")?;
            let shape = moments_shape(x[0].1, *chunk)?;
            same(x[2].1, &shape, "the moments")?;
            want(shape, "chunks of x")
        }
        GpuOp::BatchNormWithMoments { norm, chunk, .. } => {
            let operands = super::op::norm_operands(norm)?;
            infer::check(norm, &x[..operands], out).map_err(|e| format!("the norm {e}"))?;
            same(x[operands].1, &moments_shape(x[0].1, *chunk)?, "the moments")?;
            x[operands + 1..].iter().try_for_each(|t| broadcasts(t.1, o))
        }
        GpuOp::BatchNormGradWithSums { grad, chunk } => {
            let operands = super::op::batch_grad_operands(grad)?;
            infer::check(grad, &x[..operands], out).map_err(|e| format!("the derivative {e}"))?;
            let shape = moments_shape(x[0].1, *chunk)?;
            same(x[operands].1, &shape, "the moments")?;
            same(x[operands + 1].1, &shape, "the sums")
        }
        _ => unreachable!("not a batch norm's step over chunks"),
    }
}

/// `[C, K, 2]`: a `BatchMoments` of `x: [N, C, ...]` in chunks of `chunk`.
pub(crate) fn moments_shape(x: &[usize], chunk: usize) -> Result<Vec<usize>, String> {
    let [n, c, space @ ..] = x else { return Err(format!("needs [N, C, ...], found {x:?}")) };
    if chunk == 0 {
        return Err("chunks of no values".into());
    }
    let len = n * space.iter().product::<usize>();
    Ok(vec![*c, len.div_ceil(chunk), 2])
}

/// `shape` with its last axis replaced by `n`.
fn with_last(shape: &[usize], n: usize) -> Result<Vec<usize>, String> {
    let (_, rest) = shape.split_last().ok_or("a scalar where axes are needed")?;
    Ok([rest, &[n]].concat())
}

fn same(a: &[usize], b: &[usize], what: &str) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{what} {a:?} should be {b:?}"))
    }
}

fn broadcasts(from: &[usize], to: &[usize]) -> Result<(), String> {
    match broadcast(from, to) {
        Ok(s) if s == to => Ok(()),
        _ => Err(format!("{from:?} does not broadcast to {to:?}")),
    }
}

/// The shape of `op(a) · op(b)` for operands stored as `x[0]`, `x[1]`.
fn product(x: &[Ty], ta: bool, tb: bool) -> Result<Vec<usize>, String> {
    let swap = |s: &[usize], on: bool| {
        let mut s = s.to_vec();
        let r = s.len();
        if on && r >= 2 {
            s.swap(r - 2, r - 1);
        }
        s
    };
    matmul(&swap(x[0].1, ta), &swap(x[1].1, tb)).map_err(|e| format!("{e:?}"))
}
