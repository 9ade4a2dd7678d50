//! Kernels that move elements without arithmetic (any storage), and the derivatives of slicing
//! and gathering.

use super::layout::{numel, split_at_axis, strides, walk};
use super::{by_float, check_axis, check_shape, err, floats, ints, map_data, KResult};
use mgn_ir::{Data, Tensor};

pub(crate) fn permute(x: &Tensor, perm: &[usize], shape: &[usize]) -> KResult<Data> {
    let rank = x.shape.len();
    let mut seen = vec![false; rank];
    for &p in perm {
        if p >= rank || std::mem::replace(&mut seen[p], true) {
            return err(format!(
                "{perm:?} is not a permutation of the {rank} axes of {:?}",
                x.shape
            ));
        }
    }
    if perm.len() != rank {
        return err(format!("{perm:?} is not a permutation of the {rank} axes of {:?}", x.shape));
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    check_shape(&out_shape, shape)?;
    let st = strides(&x.shape);
    let read: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    Ok(map_data!(&x.data, v => {
        let mut out = Vec::with_capacity(v.len());
        walk(&out_shape, [&read], |[i]| out.push(v[i]));
        out
    }))
}

pub(crate) fn reshape(x: &Tensor, shape: &[usize]) -> KResult<Data> {
    if numel(shape) != x.data.len() {
        return err(format!(
            "cannot reshape {:?} ({} elements) to {shape:?}",
            x.shape,
            x.data.len()
        ));
    }
    Ok(x.data.clone())
}

/// Joins along `axis`; float inputs of mixed storage join as F64.
pub(crate) fn concat(xs: &[&Tensor], axis: usize, shape: &[usize]) -> KResult<Data> {
    let Some(first) = xs.first() else { return err("needs at least one input") };
    let rank = first.shape.len();
    check_axis(axis, rank, "axis")?;
    let mut out_shape = first.shape.clone();
    out_shape[axis] = 0;
    for (i, t) in xs.iter().enumerate() {
        let same_elsewhere =
            t.shape.len() == rank && (0..rank).all(|k| k == axis || t.shape[k] == first.shape[k]);
        if !same_elsewhere {
            return err(format!(
                "input {i} has shape {:?}, which differs from input 0's {:?} off axis {axis}",
                t.shape, first.shape
            ));
        }
        out_shape[axis] += t.shape[axis];
    }
    check_shape(&out_shape, shape)?;
    let (outer, _, inner) = split_at_axis(&out_shape, axis);
    let ints_in = xs.iter().filter(|t| matches!(t.data, Data::I32(_))).count();
    if ints_in == xs.len() {
        let parts = xs.iter().map(|t| ints(t, "input")).collect::<KResult<Vec<_>>>()?;
        return Ok(Data::I32(join(&parts, xs, outer, axis, inner)));
    }
    if ints_in > 0 {
        return err("cannot join integer tensors with float ones");
    }
    by_float!(xs, T => (|| {
        let owned = xs.iter().map(|t| floats::<T>(t, "input")).collect::<KResult<Vec<_>>>()?;
        let parts: Vec<&[T]> = owned.iter().map(|c| c.as_ref()).collect();
        Ok(join(&parts, xs, outer, axis, inner))
    })())
}

fn join<E: Copy>(
    parts: &[&[E]],
    xs: &[&Tensor],
    outer: usize,
    axis: usize,
    inner: usize,
) -> Vec<E> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for o in 0..outer {
        for (p, t) in parts.iter().zip(xs) {
            let run = t.shape[axis] * inner;
            out.extend_from_slice(&p[o * run..(o + 1) * run]);
        }
    }
    out
}

fn check_range(x_shape: &[usize], axis: usize, start: usize, end: usize) -> KResult<()> {
    check_axis(axis, x_shape.len(), "axis")?;
    if !(start < end && end <= x_shape[axis]) {
        return err(format!(
            "{start}..{end} is out of range for axis {axis} of size {}",
            x_shape[axis]
        ));
    }
    Ok(())
}

pub(crate) fn slice(
    x: &Tensor,
    axis: usize,
    start: usize,
    end: usize,
    shape: &[usize],
) -> KResult<Data> {
    check_range(&x.shape, axis, start, end)?;
    let mut out_shape = x.shape.clone();
    out_shape[axis] = end - start;
    check_shape(&out_shape, shape)?;
    let (outer, len, inner) = split_at_axis(&x.shape, axis);
    Ok(map_data!(&x.data, v => {
        let mut out = Vec::with_capacity(numel(&out_shape));
        for o in 0..outer {
            out.extend_from_slice(&v[(o * len + start) * inner..(o * len + end) * inner]);
        }
        out
    }))
}

/// A start read at run time (`i32[]`), clamped so `len` elements from it stay inside an axis
/// of `size` (XLA's dynamic-slice rule; the GPU kernels clamp the same way, as they cannot fail).
pub(crate) fn clamped_start(start: &Tensor, size: usize, len: usize) -> KResult<usize> {
    match ints(start, "the start")? {
        [s] => Ok(((*s).max(0) as usize).min(size.saturating_sub(len))),
        v => err(format!("the start must be one i32, found {} elements", v.len())),
    }
}

/// `torch.narrow` with a run-time start: `len` elements of `axis` from the clamped start.
pub(crate) fn narrow(
    x: &Tensor,
    start: &Tensor,
    axis: usize,
    len: usize,
    shape: &[usize],
) -> KResult<Data> {
    check_axis(axis, x.shape.len(), "axis")?;
    let s = clamped_start(start, x.shape[axis], len)?;
    slice(x, axis, s, s + len, shape)
}

/// `x` with `src` written over the clamped `start ..` of `axis` (a KV-cache write).
pub(crate) fn slice_scatter(
    x: &Tensor,
    src: &Tensor,
    start: &Tensor,
    axis: usize,
) -> KResult<Data> {
    let mut out = x.data.clone();
    slice_scatter_into(&mut out, &x.shape, src, start, axis)?;
    Ok(out)
}

/// `slice_scatter` written into `out` (x's values, of `shape`): only `src`'s rows are written.
/// On an error `out` is unchanged.
pub(crate) fn slice_scatter_into(
    out: &mut Data,
    shape: &[usize],
    src: &Tensor,
    start: &Tensor,
    axis: usize,
) -> KResult<()> {
    check_axis(axis, shape.len(), "axis")?;
    let (outer, len, inner) = split_at_axis(shape, axis);
    let w = src.shape[axis];
    let s = clamped_start(start, len, w)?;
    fn place<T: Copy>(
        out: &mut [T],
        src: &[T],
        (outer, len, inner): (usize, usize, usize),
        s: usize,
        w: usize,
    ) {
        for o in 0..outer {
            let to = (o * len + s) * inner;
            out[to..to + w * inner].copy_from_slice(&src[o * w * inner..(o + 1) * w * inner]);
        }
    }
    // f32 values into an f64 reference tensor (or back), as the other kernels accept them.
    let converted = match (&*out, &src.data) {
        (Data::F32(_), Data::F64(v)) => Some(Data::F32(v.iter().map(|&a| a as f32).collect())),
        (Data::F64(_), Data::F32(v)) => Some(Data::F64(v.iter().map(|&a| a as f64).collect())),
        _ => None,
    };
    let geo = (outer, len, inner);
    match (out, converted.as_ref().unwrap_or(&src.data)) {
        (Data::F32(o), Data::F32(v)) => place(o, v, geo, s, w),
        (Data::F64(o), Data::F64(v)) => place(o, v, geo, s, w),
        (Data::I32(o), Data::I32(v)) => place(o, v, geo, s, w),
        _ => return err("x and src are stored as different types"),
    }
    Ok(())
}

/// `[dy]` → zeros of the step's shape with `dy` at `start..end` of `axis`.
pub(crate) fn slice_grad(
    dy: &Tensor,
    axis: usize,
    start: usize,
    end: usize,
    shape: &[usize],
) -> KResult<Data> {
    check_range(shape, axis, start, end)?;
    let mut dy_shape = shape.to_vec();
    dy_shape[axis] = end - start;
    if dy.shape != dy_shape {
        return err(format!("dy has shape {:?}, expected {dy_shape:?}", dy.shape));
    }
    let (outer, len, inner) = split_at_axis(shape, axis);
    let run = (end - start) * inner;
    by_float!(&[dy], T => floats::<T>(dy, "dy").map(|v| {
        let mut out = vec![T::zero(); numel(shape)];
        for o in 0..outer {
            let dst = (o * len + start) * inner..(o * len + end) * inner;
            out[dst].copy_from_slice(&v[o * run..(o + 1) * run]);
        }
        out
    }))
}

/// Checks every index against the axis size; an index outside it is an error naming both.
pub(crate) fn checked_indices(index: &Tensor, axis: usize, size: usize) -> KResult<Vec<usize>> {
    ints(index, "index")?
        .iter()
        .map(|&i| {
            if i < 0 || i as usize >= size {
                err(format!("index {i} is out of range for axis {axis} of size {size}"))
            } else {
                Ok(i as usize)
            }
        })
        .collect()
}

/// `index_select`: the axis is replaced by the index tensor's shape.
pub(crate) fn gather(x: &Tensor, index: &Tensor, axis: usize, shape: &[usize]) -> KResult<Data> {
    check_axis(axis, x.shape.len(), "axis")?;
    let mut out_shape = x.shape[..axis].to_vec();
    out_shape.extend_from_slice(&index.shape);
    out_shape.extend_from_slice(&x.shape[axis + 1..]);
    check_shape(&out_shape, shape)?;
    let (outer, len, inner) = split_at_axis(&x.shape, axis);
    let idx = checked_indices(index, axis, len)?;
    Ok(map_data!(&x.data, v => {
        let mut out = Vec::with_capacity(numel(&out_shape));
        for o in 0..outer {
            for &i in &idx {
                out.extend_from_slice(&v[(o * len + i) * inner..(o * len + i + 1) * inner]);
            }
        }
        out
    }))
}

/// `[index, dy]` → dx of the step's shape: `dy` scatter-added at `index` along `axis`
/// (a repeated index accumulates).
pub(crate) fn gather_grad(
    index: &Tensor,
    dy: &Tensor,
    axis: usize,
    shape: &[usize],
) -> KResult<Data> {
    check_axis(axis, shape.len(), "axis")?;
    let mut dy_shape = shape[..axis].to_vec();
    dy_shape.extend_from_slice(&index.shape);
    dy_shape.extend_from_slice(&shape[axis + 1..]);
    if dy.shape != dy_shape {
        return err(format!("dy has shape {:?}, expected {dy_shape:?}", dy.shape));
    }
    let (outer, len, inner) = split_at_axis(shape, axis);
    let idx = checked_indices(index, axis, len)?;
    by_float!(&[dy], T => floats::<T>(dy, "dy").map(|v| {
        let mut out = vec![T::zero(); numel(shape)];
        for o in 0..outer {
            for (k, &i) in idx.iter().enumerate() {
                let src = &v[(o * idx.len() + k) * inner..(o * idx.len() + k + 1) * inner];
                let row = (o * len + i) * inner..(o * len + i + 1) * inner;
                for (d, &s) in out[row].iter_mut().zip(src) {
                    *d += s;
                }
            }
        }
        out
    }))
}
