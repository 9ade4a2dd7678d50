//! Reductions, arg-max, softmax and the cross-entropy loss, with their derivatives.

use super::float::{par_chunks, Float};
use super::layout::{broadcast_strides, numel, split_at_axis, strides, walk};
use super::{by_float, check_axis, check_shape, err, floats, ints, KResult};
use mgn_ir::op::ReduceOp;
use mgn_ir::{Data, Tensor};

/// The reduced axes checked, and the shape with them set to 1 (the keepdim shape, whose element
/// order is also the order without keepdim).
fn kept_shape(x_shape: &[usize], axes: &[usize]) -> KResult<Vec<usize>> {
    let mut kept = x_shape.to_vec();
    for (i, &a) in axes.iter().enumerate() {
        check_axis(a, x_shape.len(), "axis")?;
        if axes[..i].contains(&a) {
            return err(format!("axis {a} is listed twice"));
        }
        kept[a] = 1;
    }
    Ok(kept)
}

fn out_shape(x_shape: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    let reduced = |i| axes.contains(&i);
    (0..x_shape.len())
        .filter_map(|i| if reduced(i) { keepdim.then_some(1) } else { Some(x_shape[i]) })
        .collect()
}

/// Max or min that propagates NaN, as PyTorch's reductions do.
fn extreme<T: Float>(op: ReduceOp, acc: T, v: T) -> T {
    let better = if op == ReduceOp::Max { v > acc } else { v < acc };
    if acc.is_nan() || v.is_nan() {
        T::nan()
    } else if better {
        v
    } else {
        acc
    }
}

pub(crate) fn reduce(
    op: ReduceOp,
    x: &Tensor,
    axes: &[usize],
    keepdim: bool,
    shape: &[usize],
) -> KResult<Data> {
    let kept = kept_shape(&x.shape, axes)?;
    check_shape(&out_shape(&x.shape, axes, keepdim), shape)?;
    let to_out = broadcast_strides(&kept, &x.shape)?;
    let count = numel(&x.shape) / numel(&kept).max(1);
    let xs = strides(&x.shape);
    if let Data::I32(v) = &x.data {
        let (init, f): (i32, fn(i32, i32) -> i32) = match op {
            ReduceOp::Sum => (0, i32::wrapping_add),
            ReduceOp::Max => (i32::MIN, i32::max),
            ReduceOp::Min => (i32::MAX, i32::min),
            ReduceOp::Mean => return err("mean needs a float tensor"),
        };
        let mut out = vec![init; numel(&kept)];
        walk(&x.shape, [&xs, &to_out], |[i, o]| out[o] = f(out[o], v[i]));
        return Ok(Data::I32(out));
    }
    by_float!(&[x], T => (|| {
        let v = floats::<T>(x, "x")?;
        Ok(match op {
            ReduceOp::Sum | ReduceOp::Mean => {
                let mut acc = vec![0f64; numel(&kept)];
                walk(&x.shape, [&xs, &to_out], |[i, o]| acc[o] += v[i].f64());
                let div = if op == ReduceOp::Mean { count as f64 } else { 1.0 };
                acc.into_iter().map(|s| T::of(s / div)).collect::<Vec<T>>()
            }
            ReduceOp::Max | ReduceOp::Min => {
                let init = if op == ReduceOp::Max { T::neg_infinity() } else { T::infinity() };
                let mut out = vec![init; numel(&kept)];
                walk(&x.shape, [&xs, &to_out], |[i, o]| out[o] = extreme(op, out[o], v[i]));
                out
            }
        })
    })())
}

/// `[x, y, dy]` → dx: sum spreads `dy`, mean spreads `dy / count`, max/min route `dy` to the
/// first element (row-major) of each reduced group that equals the result.
pub(crate) fn reduce_grad(
    op: ReduceOp,
    x: &Tensor,
    y: &Tensor,
    dy: &Tensor,
    axes: &[usize],
    keepdim: bool,
) -> KResult<Data> {
    let kept = kept_shape(&x.shape, axes)?;
    let want = out_shape(&x.shape, axes, keepdim);
    if y.shape != want || dy.shape != want {
        return err(format!(
            "y {:?} and dy {:?} must have the reduced shape {want:?}",
            y.shape, dy.shape
        ));
    }
    let to_out = broadcast_strides(&kept, &x.shape)?;
    let count = numel(&x.shape) / numel(&kept).max(1);
    let xs = strides(&x.shape);
    by_float!(&[x, y, dy], T => (|| {
        let (xv, yv, g) = (floats::<T>(x, "x")?, floats::<T>(y, "y")?, floats::<T>(dy, "dy")?);
        let mut dx = vec![T::zero(); xv.len()];
        match op {
            ReduceOp::Sum => walk(&x.shape, [&xs, &to_out], |[i, o]| dx[i] = g[o]),
            ReduceOp::Mean => {
                let c = T::of(count as f64);
                walk(&x.shape, [&xs, &to_out], |[i, o]| dx[i] = g[o] / c)
            }
            ReduceOp::Max | ReduceOp::Min => {
                let mut routed = vec![false; yv.len()];
                walk(&x.shape, [&xs, &to_out], |[i, o]| {
                    let hit = xv[i] == yv[o] || (xv[i].is_nan() && yv[o].is_nan());
                    if hit && !routed[o] {
                        routed[o] = true;
                        dx[i] = g[o];
                    }
                })
            }
        }
        Ok(dx)
    })())
}

/// Index of the first maximum along `axis` (NaN counts as the maximum, as in PyTorch).
pub(crate) fn argmax(x: &Tensor, axis: usize, shape: &[usize]) -> KResult<Data> {
    check_axis(axis, x.shape.len(), "axis")?;
    let mut want = x.shape.clone();
    want.remove(axis);
    check_shape(&want, shape)?;
    let (outer, n, inner) = split_at_axis(&x.shape, axis);
    if n > i32::MAX as usize {
        return err("the axis is too long for i32 indices");
    }
    let v: Vec<f64> = x.to_f64_vec();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| v[(o * n + k) * inner + i];
            let mut best = 0;
            for k in 1..n {
                if at(best).is_nan() {
                    break;
                }
                if at(k) > at(best) || at(k).is_nan() {
                    best = k;
                }
            }
            out.push(best as i32);
        }
    }
    Ok(Data::I32(out))
}

// ---- softmax --------------------------------------------------------------------------------

/// Calls `f(start, stride, put)` for every 1-D line along `axis`: element `k` of the line is at
/// `start + k·stride` of the input, and `put(k, v)` stores the result there. The lines of one
/// outer index are handed out together, so the output can be split over the cores.
fn lines<T: Float>(
    shape: &[usize],
    axis: usize,
    out: &mut [T],
    f: impl Fn(usize, usize, &mut dyn FnMut(usize, T)) + Sync,
) {
    let (_, n, inner) = split_at_axis(shape, axis);
    par_chunks(out, n * inner, n * inner * 8, |o, block| {
        for i in 0..inner {
            let start = o * n * inner + i;
            f(start, inner, &mut |k, v| block[k * inner + i] = v);
        }
    });
}

pub(crate) fn softmax(x: &Tensor, axis: usize, log: bool) -> KResult<Data> {
    check_axis(axis, x.shape.len(), "axis")?;
    let n = x.shape[axis];
    by_float!(&[x], T => (|| {
        let v = floats::<T>(x, "x")?;
        let mut out = vec![T::zero(); v.len()];
        lines(&x.shape, axis, &mut out, |start, stride, put| {
            let at = |k: usize| v[start + k * stride];
            let max = |a: T, b: T| if b > a || b.is_nan() { b } else { a };
            let m = (0..n).map(at).fold(T::neg_infinity(), max);
            let e: Vec<T> = (0..n).map(|k| (at(k) - m).exp()).collect();
            let sum: f64 = e.iter().map(|v| v.f64()).sum();
            for (k, &ek) in e.iter().enumerate() {
                put(k, if log { at(k) - m - T::of(sum.ln()) } else { ek / T::of(sum) });
            }
        });
        Ok(out)
    })())
}

/// `[y, dy]` → dx with `y` the forward output: softmax `y·(dy − Σ dy·y)`,
/// log-softmax `dy − exp(y)·Σ dy`.
pub(crate) fn softmax_grad(y: &Tensor, dy: &Tensor, axis: usize, log: bool) -> KResult<Data> {
    check_axis(axis, y.shape.len(), "axis")?;
    if y.shape != dy.shape {
        return err(format!("y {:?} and dy {:?} differ in shape", y.shape, dy.shape));
    }
    let n = y.shape[axis];
    by_float!(&[y, dy], T => (|| {
        let (yv, g) = (floats::<T>(y, "y")?, floats::<T>(dy, "dy")?);
        let mut out = vec![T::zero(); yv.len()];
        lines(&y.shape, axis, &mut out, |start, stride, put| {
            let at = |k: usize| start + k * stride;
            if log {
                let s = T::of((0..n).map(|k| g[at(k)].f64()).sum::<f64>());
                (0..n).for_each(|k| put(k, g[at(k)] - yv[at(k)].exp() * s));
            } else {
                let s = T::of((0..n).map(|k| (g[at(k)] * yv[at(k)]).f64()).sum::<f64>());
                (0..n).for_each(|k| put(k, yv[at(k)] * (g[at(k)] - s)));
            }
        });
        Ok(out)
    })())
}

// ---- cross-entropy ----------------------------------------------------------------------------

/// Rows and classes of `logits [..N, C]` against `targets [..N]`, with the targets checked.
fn ce_layout(logits: &Tensor, targets: &Tensor) -> KResult<(usize, usize, Vec<usize>)> {
    let Some((&c, lead)) = logits.shape.split_last() else {
        return err("logits must have a class axis");
    };
    if targets.shape != lead {
        return err(format!(
            "targets {:?} must be the logits' shape {:?} without the class axis",
            targets.shape, logits.shape
        ));
    }
    let t = ints(targets, "targets")?
        .iter()
        .map(|&t| {
            if t < 0 || t as usize >= c {
                err(format!("target {t} is out of range for {c} classes"))
            } else {
                Ok(t as usize)
            }
        })
        .collect::<KResult<Vec<_>>>()?;
    Ok((numel(lead), c, t))
}

/// Mean over all leading positions of `−log_softmax(logits)[target]`.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor, shape: &[usize]) -> KResult<Data> {
    check_shape(&[], shape)?;
    let (rows, c, t) = ce_layout(logits, targets)?;
    by_float!(&[logits], T => (|| {
        let v = floats::<T>(logits, "logits")?;
        let total: f64 = row_losses(&v, c, &t).sum();
        Ok(vec![T::of(total / rows as f64)])
    })())
}

/// `logsumexp(row) − row[target]` per row of `c` logits.
fn row_losses<'a, T: Float>(
    v: &'a [T],
    c: usize,
    targets: &'a [usize],
) -> impl Iterator<Item = f64> + 'a {
    targets.iter().enumerate().map(move |(r, &t)| {
        let row: Vec<f64> = v[r * c..(r + 1) * c].iter().map(|x| x.f64()).collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln() - row[t]
    })
}

/// `[logits, targets, dloss]` → `(softmax(logits) − one_hot(targets)) · dloss / N`.
pub(crate) fn cross_entropy_grad(
    logits: &Tensor,
    targets: &Tensor,
    dloss: &Tensor,
) -> KResult<Data> {
    let (rows, c, t) = ce_layout(logits, targets)?;
    if dloss.data.len() != 1 {
        return err(format!("dloss must be a scalar, found shape {:?}", dloss.shape));
    }
    by_float!(&[logits, dloss], T => (|| {
        let v = floats::<T>(logits, "logits")?;
        let scale = floats::<T>(dloss, "dloss")?[0].f64() / rows as f64;
        let mut out = vec![T::zero(); v.len()];
        par_chunks(&mut out, c, c * 8, |r, o| {
            let row = &v[r * c..(r + 1) * c];
            let m = row.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
            let sum: f64 = row.iter().map(|&x| (x - m).exp().f64()).sum();
            for (k, o) in o.iter_mut().enumerate() {
                let p = (row[k] - m).exp().f64() / sum;
                *o = T::of((p - if k == t[r] { 1.0 } else { 0.0 }) * scale);
            }
        });
        Ok(out)
    })())
}
