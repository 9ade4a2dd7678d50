//! Products with few output tiles and a deep k run split along k: a `MatMulT` with `splits`
//! computes each k range's product into its own slice, and the step itself becomes a
//! `SplitSum` adding the slices up (through the product's epilogue, if it had one).
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

/// Products with at least this many 64×64 tiles fill the GPU; from half as many, only a deep
/// k (`DEEP`) still pays for splitting in two. Measured on the H200: Whisper's attention
/// products (144 tiles, 1,500 deep) 145 → 95 µs split in two, its 384-deep projections (144
/// tiles) 44 → 49 µs plus the sum.
const ENOUGH_TILES: usize = FILL;
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
    let total: usize = out.iter().product();
    (m * n > 0).then(|| [m, k, n, total / (m * n)])
}

/// How many k ranges the product gets: 1 when it fills the GPU already or is too shallow.
pub(crate) fn splits_for([m, k, n, batches]: [usize; 4]) -> usize {
    // The skinny kernels split k over lanes already.
    if m <= SKINNY || n <= SKINNY {
        return 1;
    }
    let tiles = batches * m.div_ceil(64) * n.div_ceil(64);
    if tiles >= ENOUGH_TILES || (tiles >= ENOUGH_TILES / 2 && k < DEEP) {
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
        let splits = splits_for(g);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_products_that_leave_the_gpu_idle_split() {
        // Whisper's weight derivative: 36 tiles, 1,500 deep.
        assert_eq!(splits_for([384, 1500, 384, 1]), 8);
        // SmolLM2's projection at 128 tokens: 18 tiles, 576 deep (ranges of 144).
        assert_eq!(splits_for([128, 576, 576, 1]), 4);
        // Whisper's attention products: 144 tiles, split in two.
        assert_eq!(splits_for([1500, 1500, 64, 6]), 2);
        // Half full and 384 deep: as it is.
        assert_eq!(splits_for([1500, 384, 384, 1]), 1);
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
    fn geometry_reads_stored_shapes() {
        assert_eq!(geometry(&[2, 7, 5], &[2, 7, 3], &[2, 5, 3], true, false), Some([5, 7, 3, 2]));
        assert_eq!(geometry(&[5, 7], &[3, 7], &[5, 3], false, true), Some([5, 7, 3, 1]));
        assert_eq!(geometry(&[7], &[7, 3], &[3], false, false), None);
    }
}
