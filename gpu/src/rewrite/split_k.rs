//! Products with few output tiles and a deep k run split along k: a `MatMulT` with `splits`
//! computes each k range's product into its own slice, and the step itself becomes a
//! `SplitSum` adding the slices up (through the product's epilogue, if it had one). The same
//! for convolutions (`GpuOp::ConvSplit`), whose implicit GEMMs have the same shape problem:
//! ResNet-50's weight gradients reduce over samples × positions (50,176 deep for the stem) onto
//! a few thousand weights, and its last stage's convolutions have 196 output columns.
//!
//! The tiled kernel gives each workgroup one output tile and walks all of k. A weight
//! derivative `xᵀ·dy` of a 384-wide layer over Whisper's 1,500 positions has 36 tiles of 64×64
//! and walks 1,500 deep; SmolLM2's projections at 128 tokens have 18: a few dozen workgroups on
//! a GPU with 132 SMs. Split k ways, the same product has k times the workgroups, each walking
//! 1/k of the depth; the partial products cost one more pass over a small output.

use crate::kernels::{FILL, SKINNY};
use crate::program::{Elem, GpuOp, Program, Step};
use mgn_ir::op::Op;
use mgn_ir::DType;

/// Products with at least this many 64×64 tiles fill the GPU; from `HALF_FULL`, only a deep
/// k (`DEEP`) still pays for splitting. Measured on the H200: Whisper's attention products (144
/// tiles, 1,500 deep) 145 → 95 µs split in two, its 384-deep projections (144 tiles) 44 → 49 µs
/// plus the sum.
const ENOUGH_TILES: usize = FILL;
/// From this many tiles a shallow product stays whole: half a wave of workgroups walking all of
/// a short k beats twice as many and a sum. Measured on the H200 against 132 (2026-12-04, two
/// rounds): MiniLM's forward 2.12 / 2.17 → 2.01 / 2.03 ms (its 96-tile, 384-deep projections),
/// SmolVLA's 2.76 / 2.78 → 2.67 / 2.73 and its forward + backward 6.09 / 6.12 → 5.81 / 6.04,
/// Whisper and the U-Net within their spread.
const HALF_FULL: usize = 64;
const DEEP: usize = 1024;
/// Each k range is at least this deep (shallower ranges spend more on the partials' traffic
/// than they win).
const MIN_DEPTH: usize = 128;
const MAX_SPLITS: usize = 16;

/// The product's (m, k, n, batch items) from its operands as stored and its output.
fn geometry(a: &[usize], b: &[usize], out: &[usize], ta: bool, tb: bool) -> Option<[usize; 4]> {
    let (ra, rb) = (a.len(), b.len());
    if ra < 2 || rb < 2 {
        return None;
    }
    let (m, k) = if ta { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
    let n = if tb { b[rb - 2] } else { b[rb - 1] };
    // Checked: sizes past the address space (`--set frames=4294967295`) have no geometry to
    // split, and must not wrap into one.
    let total = out.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let mn = m.checked_mul(n).filter(|&mn| mn > 0)?;
    Some([m, k, n, total / mn])
}

/// The 64×64 output tiles of `batches` products of `m` × `n`; `None` past `usize`.
fn tile_count(batches: usize, m: usize, n: usize) -> Option<usize> {
    batches.checked_mul(m.div_ceil(64))?.checked_mul(n.div_ceil(64))
}

/// How many k ranges the product gets: 1 when it fills the GPU already or is too shallow.
pub(crate) fn splits_for([m, k, n, batches]: [usize; 4]) -> usize {
    // The skinny kernels split k over lanes already.
    if m <= SKINNY || n <= SKINNY {
        return 1;
    }
    // A tile count past `usize` fills any GPU; none (an empty product) needs no split.
    let Some(tiles) = tile_count(batches, m, n).filter(|&t| t > 0) else { return 1 };
    if tiles >= ENOUGH_TILES || (tiles >= HALF_FULL && k < DEEP) {
        return 1;
    }
    let want = FILL.div_ceil(tiles).min(k / MIN_DEPTH).min(MAX_SPLITS);
    if want < 2 {
        return 1;
    }
    // The ranges the kernel will make of that many (`split_depth`): none empty.
    k.div_ceil(crate::kernels::split_depth(k, want))
}

/// Splits the products that leave the GPU idle (see the module header).
pub(super) fn split_products(program: &mut Program) {
    for id in program.order().to_vec() {
        let s = program.step(id);
        let (ta, tb, alpha, epilogue) = match &s.op {
            GpuOp::Plan(Op::MatMul) => (false, false, 1.0, None),
            GpuOp::MatMulT { ta, tb, alpha, splits: 1 } => (*ta, *tb, *alpha, None),
            GpuOp::MatMulEpilogue { program, ta, tb } => (*ta, *tb, 1.0, Some(program.clone())),
            _ => continue,
        };
        if s.dtype != DType::F32 || s.inputs.len() < 2 {
            continue;
        }
        let (a, b) = (program.step(s.inputs[0]), program.step(s.inputs[1]));
        let Some(g) = geometry(&a.shape, &b.shape, &s.shape, ta, tb) else { continue };
        let splits = program.choose("split products", id, || splits_for(g));
        if splits < 2 {
            continue;
        }
        let mut shape = vec![splits];
        shape.extend(&s.shape);
        let partial = Step {
            op: GpuOp::MatMulT { ta, tb, alpha, splits },
            inputs: s.inputs[..2].to_vec(),
            dtype: DType::F32,
            shape,
            loc: s.loc.clone(),
        };
        let extra = s.inputs[2..].to_vec();
        let partial = program.insert_before(id, partial);
        let s = program.step_mut(id);
        // An epilogue's Input(k) is its step's input k + 1, past a and b; the sum's is input
        // k, past the partials: the same extra inputs either way.
        s.op = GpuOp::SplitSum { splits, program: epilogue.unwrap_or(vec![Elem::Input(0)]) };
        s.inputs = [vec![partial], extra].concat();
    }
}

/// Each range of a split convolution is at least this deep. Measured on the H200 against 512:
/// ResNet-50's training step 5–6% faster, its minimal shape 7–10%, the U-Net within its spread.
const MIN_CONV_DEPTH: usize = 256;
const MAX_CONV_SPLITS: usize = 64;

/// How many ranges a convolution's GEMM — `m` × `n` outputs per group, a reduction `k` deep —
/// gets: 1 when its 64×64 tiles fill the GPU or the reduction is short. At batch 4, ResNet-50's
/// stem weight gradient (64 × 147, 50,176 deep) has 3 tiles; its last stage's 3×3 convolutions
/// (512 × 196, 4,608 deep) 32.
pub(crate) fn conv_splits_for(groups: usize, m: usize, n: usize, k: usize) -> usize {
    let Some(tiles) = tile_count(groups, m, n).filter(|&t| t > 0) else { return 1 };
    if tiles >= ENOUGH_TILES / 2 {
        return 1;
    }
    let want = FILL.div_ceil(tiles).min(k / MIN_CONV_DEPTH).min(MAX_CONV_SPLITS);
    if want < 2 {
        return 1;
    }
    k.div_ceil(crate::kernels::conv::split_depth(k, want))
}

/// A convolution's GEMM as the kernels run it, `(groups, m, n, k)`, for the convolutions that
/// can run split (`GpuOp::ConvSplit`): not one with a bias, nor a strided input gradient
/// (its phases are GEMMs of their own).
fn conv_gemm(op: &Op, second: &[usize], out: &[usize]) -> Option<[usize; 4]> {
    let spatial = |s: &[usize]| s[2..].iter().product::<usize>();
    match op {
        Op::Conv { groups, has_bias: false, .. } => {
            Some([*groups, out[1] / groups, out[0] * spatial(out), second[1] * spatial(second)])
        }
        Op::ConvGradInput { stride, dilation, groups, .. }
            if dilation.iter().any(|&d| d != 1) || stride.iter().all(|&s| s == 1) =>
        {
            let (m, n) = (second[1], out[0] * spatial(out));
            Some([*groups, m, n, second[0] / groups * spatial(second)])
        }
        Op::ConvGradWeight { groups, .. } => {
            Some([*groups, out[0] / groups, out[1..].iter().product(), second[0] * spatial(second)])
        }
        _ => None,
    }
}

/// Splits the convolutions that leave the GPU idle: the step becomes a `SplitSum` of a
/// `ConvSplit`'s ranges.
pub(super) fn split_convolutions(program: &mut Program) {
    for id in program.order().to_vec() {
        let s = program.step(id);
        // A fused program goes on to the sum (a convolution with one has no bias to split).
        let (conv, epilogue) = match &s.op {
            GpuOp::Plan(conv) if s.inputs.len() == 2 => (conv, vec![Elem::Input(0)]),
            GpuOp::ConvEpilogue { conv, program } => (conv, program.clone()),
            _ => continue,
        };
        if s.dtype != DType::F32 || s.shape.len() < 3 {
            continue;
        }
        let second = &program.step(s.inputs[1]).shape;
        let Some([groups, m, n, k]) = conv_gemm(conv, second, &s.shape) else { continue };
        let conv = conv.clone();
        let splits = program.choose("split convolutions", id, || conv_splits_for(groups, m, n, k));
        if splits < 2 {
            continue;
        }
        let mut shape = vec![splits];
        shape.extend(&s.shape);
        let inputs = program.step(id).inputs.clone();
        let partial = Step {
            op: GpuOp::ConvSplit { conv, splits },
            inputs: inputs[..2].to_vec(),
            dtype: DType::F32,
            shape,
            loc: s.loc.clone(),
        };
        let partial = program.insert_before(id, partial);
        let s = program.step_mut(id);
        // The epilogue's Input(k) is its step's input k + 1, past x and w; the sum's is input
        // k, past the partials: the same extra inputs either way.
        s.op = GpuOp::SplitSum { splits, program: epilogue };
        s.inputs = [vec![partial], inputs[2..].to_vec()].concat();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_convolutions_with_few_tiles_and_a_long_reduction_split() {
        // ResNet-50 at batch 4: weight gradients of the stem (3 tiles, 50,176 deep) and of a 3×3
        // of stage 1 (9 tiles); a 3×3 of stage 4 (32 tiles, 4,608 deep).
        assert_eq!(conv_splits_for(1, 64, 147, 50176), 61);
        assert_eq!(conv_splits_for(1, 64, 576, 12544), 28);
        assert_eq!(conv_splits_for(1, 512, 196, 4608), 9);
        // Its weight gradient (576 tiles, 196 deep) and a tiny test shape: as they are.
        assert_eq!(conv_splits_for(1, 512, 4608, 196), 1);
        assert_eq!(conv_splits_for(2, 5, 9, 300), 1);
        for k in [1024, 1500, 4097, 50176] {
            let s = conv_splits_for(1, 8, 27, k);
            let depth = crate::kernels::conv::split_depth(k, s);
            assert!((s - 1) * depth < k && s * depth >= k, "k {k}: {s} × {depth}");
        }
    }

    #[test]
    fn only_products_that_leave_the_gpu_idle_split() {
        // Whisper's weight derivative: 36 tiles, 1,500 deep.
        assert_eq!(splits_for([384, 1500, 384, 1]), 8);
        // SmolLM2's projection at 128 tokens: 18 tiles, 576 deep (ranges of 144).
        assert_eq!(splits_for([128, 576, 576, 1]), 4);
        // Sizes past the address space, and empty products: never split, never a panic.
        assert_eq!(splits_for([usize::MAX / 2, 4096, usize::MAX / 2, 3]), 1);
        assert_eq!(splits_for([128, 576, 576, 0]), 1);
        assert_eq!(conv_splits_for(usize::MAX, 1 << 40, 1 << 40, 4096), 1);
        assert_eq!(
            geometry(&[usize::MAX, 64], &[64, usize::MAX], &[usize::MAX, 2], false, false),
            None
        );
        // Whisper's attention products: 144 tiles, split in two.
        assert_eq!(splits_for([1500, 1500, 64, 6]), 2);
        // Half full (or a third: MiniLM's 96 tiles) and 384 deep: as it is.
        assert_eq!(splits_for([1500, 384, 384, 1]), 1);
        assert_eq!(splits_for([1024, 384, 384, 1]), 1);
        // A quarter full and 384 deep (48 tiles): split.
        assert_eq!(splits_for([128, 384, 1536, 1]), 3);
        // Full already, shallow, or skinny.
        assert_eq!(splits_for([1500, 384, 1536, 4]), 1);
        assert_eq!(splits_for([128, 200, 128, 1]), 1);
        assert_eq!(splits_for([4, 4096, 4096, 1]), 1);
        // No range is ever empty.
        for k in [257, 300, 1000, 1500, 4097] {
            let s = splits_for([100, k, 100, 1]);
            let depth = crate::kernels::split_depth(k, s);
            assert!((s - 1) * depth < k && s * depth >= k, "k {k}: {s} × {depth}");
        }
    }

    #[test]
    fn convolution_gemms_are_the_kernels_and_only_splittable_ones_have_one() {
        let geo = |stride: usize, dilation: usize| (vec![stride; 2], vec![1; 2], vec![dilation; 2]);
        let (s, p, d) = geo(1, 1);
        let conv = |has_bias| Op::Conv {
            stride: s.clone(),
            padding: p.clone(),
            dilation: d.clone(),
            groups: 2,
            has_bias,
        };
        // x [4, 6, 9, 9], w [10, 3, 3, 3], y [4, 10, 9, 9].
        let (x, w, y) = ([4, 6, 9, 9], [10, 3, 3, 3], [4, 10, 9, 9]);
        assert_eq!(conv_gemm(&conv(false), &w, &y), Some([2, 5, 324, 27]));
        assert_eq!(conv_gemm(&conv(true), &w, &y), None);
        let gi = |(stride, padding, dilation)| Op::ConvGradInput {
            stride,
            padding,
            dilation,
            groups: 2,
        };
        assert_eq!(conv_gemm(&gi(geo(1, 1)), &w, &x), Some([2, 3, 324, 45]));
        assert_eq!(conv_gemm(&gi(geo(2, 2)), &w, &x), Some([2, 3, 324, 45]));
        assert_eq!(conv_gemm(&gi(geo(2, 1)), &w, &x), None, "phased");
        let gw =
            Op::ConvGradWeight { stride: s.clone(), padding: p.clone(), dilation: d, groups: 2 };
        assert_eq!(conv_gemm(&gw, &y, &w), Some([2, 5, 27, 324]));
    }

    #[test]
    fn geometry_reads_stored_shapes() {
        assert_eq!(geometry(&[2, 7, 5], &[2, 7, 3], &[2, 5, 3], true, false), Some([5, 7, 3, 2]));
        assert_eq!(geometry(&[5, 7], &[3, 7], &[5, 3], false, true), Some([5, 7, 3, 1]));
        assert_eq!(geometry(&[7], &[7, 3], &[3], false, false), None);
    }
}
