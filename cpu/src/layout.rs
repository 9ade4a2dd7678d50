//! Row-major layout: the shape rules of `mgn_ir::shape`, and a strided walk over a shape.

use super::{err, KResult};
pub(crate) use mgn_ir::shape::{numel, split_at_axis, strides};

/// NumPy broadcasting of two shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> KResult<Vec<usize>> {
    mgn_ir::shape::broadcast(a, b)
        .or_else(|_| err(format!("shapes {a:?} and {b:?} do not broadcast")))
}

/// Strides (one per axis of `to`) that read a contiguous tensor of shape `from` at every index
/// of `to`: 0 on the axes that broadcasting adds or stretches.
pub(crate) fn broadcast_strides(from: &[usize], to: &[usize]) -> KResult<Vec<usize>> {
    Ok(mgn_ir::shape::broadcast_strides(from, to)?)
}

/// Calls `f` with the offsets, one per stride set, of every index of `shape` in row-major order.
/// With contiguous strides as one of the sets, that offset is the running element index.
pub(crate) fn walk<const N: usize>(
    shape: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut([usize; N]),
) {
    if shape.contains(&0) {
        return;
    }
    let Some((&last, outer)) = shape.split_last() else {
        f([0; N]);
        return;
    };
    let r = shape.len();
    let inner: [usize; N] = std::array::from_fn(|j| strides[j][r - 1]);
    let mut idx = vec![0; outer.len()];
    let mut base = [0usize; N];
    loop {
        let mut off = base;
        for _ in 0..last {
            f(off);
            for j in 0..N {
                off[j] += inner[j];
            }
        }
        // Advance the odometer over the outer axes, last first.
        let mut ax = outer.len();
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            if idx[ax] < outer[ax] {
                for j in 0..N {
                    base[j] += strides[j][ax];
                }
                break;
            }
            for j in 0..N {
                base[j] -= strides[j][ax] * (outer[ax] - 1);
            }
            idx[ax] = 0;
        }
    }
}
