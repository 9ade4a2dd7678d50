//! Scans and selections along an axis: `cumsum`, `topk` (indices), `take_along` (values at
//! indices, `torch.gather`) and its derivative. A tensor is seen as `[outer, len, inner]`
//! around the axis; each `(outer, inner)` pair is one row.

use super::float::Float;
use super::layout::{numel, split_at_axis};
use super::{by_float, check_axis, check_shape, err, floats, ints, KResult};
use mgn_ir::{Data, Tensor};
use std::cmp::Ordering;

/// The flat position of element `j` of row `(o, i)`.
fn at(o: usize, j: usize, i: usize, len: usize, inner: usize) -> usize {
    (o * len + j) * inner + i
}

/// Running sums along `axis` (from the end when `reverse`): floats accumulate in f64, integers
/// wrap in i32 like every integer sum.
pub(crate) fn cumsum(x: &Tensor, axis: usize, reverse: bool) -> KResult<Data> {
    check_axis(axis, x.shape.len(), "axis")?;
    let (outer, len, inner) = split_at_axis(&x.shape, axis);
    let order = |j: usize| if reverse { len - 1 - j } else { j };
    if let Data::I32(v) = &x.data {
        let mut out = vec![0i32; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = 0i32;
                for j in (0..len).map(order) {
                    acc = acc.wrapping_add(v[at(o, j, i, len, inner)]);
                    out[at(o, j, i, len, inner)] = acc;
                }
            }
        }
        return Ok(Data::I32(out));
    }
    by_float!(&[x], T => floats::<T>(x, "x").map(|v| {
        let mut out = vec![T::zero(); v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = 0f64;
                for j in (0..len).map(order) {
                    acc += v[at(o, j, i, len, inner)].f64();
                    out[at(o, j, i, len, inner)] = T::of(acc);
                }
            }
        }
        out
    }))
}

/// The order `topk` ranks by, largest first: NaN above every number, −0 equal to +0, ties to
/// the lower position.
fn rank(a: (f64, usize), b: (f64, usize)) -> Ordering {
    let key = |v: f64| if v.is_nan() { (1, 0.0) } else { (0, v) };
    let (ka, kb) = (key(a.0), key(b.0));
    kb.0.cmp(&ka.0).then(kb.1.partial_cmp(&ka.1).unwrap_or(Ordering::Equal)).then(a.1.cmp(&b.1))
}

/// The positions of the `k` largest elements of each row along `axis`, largest first.
pub(crate) fn topk(x: &Tensor, k: usize, axis: usize, shape: &[usize]) -> KResult<Data> {
    check_axis(axis, x.shape.len(), "axis")?;
    let (outer, len, inner) = split_at_axis(&x.shape, axis);
    let mut want = x.shape.clone();
    want[axis] = k;
    check_shape(&want, shape)?;
    if k > len {
        return err(format!("k = {k} is more than the axis' {len} elements"));
    }
    // Every i32 and f32 is exact in f64, so one comparison serves all storages.
    let v = x.to_f64_vec();
    let mut out = vec![0i32; numel(shape)];
    let mut row: Vec<(f64, usize)> = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            row.clear();
            row.extend((0..len).map(|j| (v[at(o, j, i, len, inner)], j)));
            row.sort_by(|a, b| rank(*a, *b));
            for (t, &(_, j)) in row[..k].iter().enumerate() {
                out[at(o, t, i, k, inner)] = j as i32;
            }
        }
    }
    Ok(Data::I32(out))
}

/// Each index checked against the axis it reads.
fn positions(index: &Tensor, len: usize) -> KResult<Vec<usize>> {
    ints(index, "index")?
        .iter()
        .map(|&j| match usize::try_from(j) {
            Ok(j) if j < len => Ok(j),
            _ => err(format!("index {j} is out of range for an axis of {len}")),
        })
        .collect()
}

/// `x` read along `axis` at `index` (which has `x`'s shape but on `axis`).
pub(crate) fn take_along(x: &Tensor, index: &Tensor, axis: usize) -> KResult<Data> {
    check_axis(axis, x.shape.len(), "axis")?;
    let (outer, len, inner) = split_at_axis(&x.shape, axis);
    let k = index.shape[axis];
    let idx = positions(index, len)?;
    let source = |t: usize| {
        let (o, rest) = (t / (k * inner), t % (k * inner));
        at(o, idx[t], rest % inner, len, inner)
    };
    debug_assert_eq!(idx.len(), outer * k * inner);
    Ok(match &x.data {
        Data::I32(v) => Data::I32((0..idx.len()).map(|t| v[source(t)]).collect()),
        Data::F32(v) => Data::F32((0..idx.len()).map(|t| v[source(t)]).collect()),
        Data::F64(v) => Data::F64((0..idx.len()).map(|t| v[source(t)]).collect()),
        Data::Packed(_) => unreachable!("{}", crate::PACKED_ONLY_DEQUANTIZED),
    })
}

/// `[index, dy]` → zeros of `shape` with `dy` added at `index` along `axis` (f64 sums).
pub(crate) fn take_along_grad(
    index: &Tensor,
    dy: &Tensor,
    axis: usize,
    shape: &[usize],
) -> KResult<Data> {
    check_axis(axis, shape.len(), "axis")?;
    let (_, len, inner) = split_at_axis(shape, axis);
    let k = index.shape[axis];
    let idx = positions(index, len)?;
    by_float!(&[dy], T => floats::<T>(dy, "dy").map(|v| {
        let mut acc = vec![0f64; numel(shape)];
        for (t, &j) in idx.iter().enumerate() {
            let (o, rest) = (t / (k * inner), t % (k * inner));
            acc[at(o, j, rest % inner, len, inner)] += v[t].f64();
        }
        acc.into_iter().map(T::of).collect::<Vec<T>>()
    }))
}
