//! Row-major layout arithmetic: strides, broadcasting, and a strided walk over a shape.

use super::{err, KResult};

pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides of a contiguous tensor.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// NumPy broadcasting of two shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> KResult<Vec<usize>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| match (pad(a, i), pad(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

/// Strides (one per axis of `to`) that read a contiguous tensor of shape `from` at every index
/// of `to`: 0 on the axes that broadcasting adds or stretches.
pub(crate) fn broadcast_strides(from: &[usize], to: &[usize]) -> KResult<Vec<usize>> {
    if from.len() > to.len() {
        return err(format!("shape {from:?} does not broadcast to {to:?}"));
    }
    let lead = to.len() - from.len();
    let st = strides(from);
    let mut out = vec![0; to.len()];
    for (i, (&f, &s)) in from.iter().zip(&st).enumerate() {
        if f == to[lead + i] {
            out[lead + i] = if f == 1 { 0 } else { s };
        } else if f != 1 {
            return err(format!("shape {from:?} does not broadcast to {to:?}"));
        }
    }
    Ok(out)
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

/// `shape` seen as `[outer, shape[axis], inner]`.
pub(crate) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (numel(&shape[..axis]), shape[axis], numel(&shape[axis + 1..]))
}
