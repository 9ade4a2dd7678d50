//! Normalization: layer norm, RMS norm and group norm (one block-wise kernel), and batch norm,
//! with the derivative of each input.
//!
//! Statistics are computed in f64 with the biased variance; the normalized value is
//! `x̂ = (x − mean)·rstd` with `rstd = 1/sqrt(var + eps)` (RMS norm: no mean, `var = mean(x²)`),
//! and the output `x̂·w + b`. With `g = dy·w`, the derivative of a block of `L` elements is
//! `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))` (RMS norm: without the `mean(g)` term).

use super::float::{par_chunks, Float};
use super::layout::numel;
use super::{by_float, err, floats, KResult};
use mgn_ir::op::GradPart;
use mgn_ir::{Data, Tensor};

/// How a norm sees `x`: consecutive blocks of `len` elements, each normalized on its own;
/// element `i` of block `b` uses affine parameter `param(b, i)`.
struct Blocks<F: Fn(usize, usize) -> usize + Sync> {
    len: usize,
    /// Subtract the mean (layer and group norm) or not (RMS norm).
    center: bool,
    eps: f64,
    param: F,
}

/// A norm's weight and bias, when present.
type Affine<T> = (Option<Vec<T>>, Option<Vec<T>>);

/// The optional affine parameters of a norm, as inputs `first`, `first + 1`.
fn affine<T: Float>(
    x: &[&Tensor],
    first: usize,
    has_weight: bool,
    has_bias: bool,
    size: usize,
) -> KResult<Affine<T>> {
    let mut next = first;
    let mut take = |present: bool, name: &str| -> KResult<Option<Vec<T>>> {
        if !present {
            return Ok(None);
        }
        let t = x[next];
        next += 1;
        if t.shape != [size] {
            return err(format!("{name} must have shape [{size}], found {:?}", t.shape));
        }
        Ok(Some(floats::<T>(t, name)?.into_owned()))
    };
    Ok((take(has_weight, "weight")?, take(has_bias, "bias")?))
}

impl<F: Fn(usize, usize) -> usize + Sync> Blocks<F> {
    /// Mean (0 without centring) and rstd of one block.
    fn stats<T: Float>(&self, x: &[T]) -> (f64, f64) {
        let n = x.len() as f64;
        let mean = if self.center { x.iter().map(|v| v.f64()).sum::<f64>() / n } else { 0.0 };
        let var = x.iter().map(|v| (v.f64() - mean).powi(2)).sum::<f64>() / n;
        (mean, 1.0 / (var + self.eps).sqrt())
    }

    fn forward<T: Float>(&self, x: &[T], w: Option<&[T]>, b: Option<&[T]>) -> Vec<T> {
        let mut out = vec![T::zero(); x.len()];
        par_chunks(&mut out, self.len, self.len * 8, |blk, o| {
            let xb = &x[blk * self.len..(blk + 1) * self.len];
            let (mean, rstd) = self.stats(xb);
            for (i, o) in o.iter_mut().enumerate() {
                let p = (self.param)(blk, i);
                let mut y = (xb[i].f64() - mean) * rstd;
                if let Some(w) = w {
                    y *= w[p].f64();
                }
                if let Some(b) = b {
                    y += b[p].f64();
                }
                *o = T::of(y);
            }
        });
        out
    }

    /// The derivative of input `part` (`params` elements for the weight and bias).
    fn backward<T: Float>(
        &self,
        x: &[T],
        w: Option<&[T]>,
        dy: &[T],
        part: GradPart,
        params: usize,
    ) -> Vec<T> {
        let len = self.len;
        if part == GradPart::Input {
            let mut dx = vec![T::zero(); x.len()];
            par_chunks(&mut dx, len, len * 16, |blk, o| {
                let (xb, gb) = (&x[blk * len..(blk + 1) * len], &dy[blk * len..(blk + 1) * len]);
                let (mean, rstd) = self.stats(xb);
                let xhat: Vec<f64> = xb.iter().map(|v| (v.f64() - mean) * rstd).collect();
                let g: Vec<f64> = (0..len)
                    .map(|i| gb[i].f64() * w.map_or(1.0, |w| w[(self.param)(blk, i)].f64()))
                    .collect();
                let mean_g = if self.center { g.iter().sum::<f64>() / len as f64 } else { 0.0 };
                let mean_gx = g.iter().zip(&xhat).map(|(g, x)| g * x).sum::<f64>() / len as f64;
                for (i, o) in o.iter_mut().enumerate() {
                    *o = T::of(rstd * (g[i] - mean_g - xhat[i] * mean_gx));
                }
            });
            return dx;
        }
        // Weight: Σ dy·x̂ per parameter; bias: Σ dy.
        let mut acc = vec![0f64; params];
        for (blk, (xb, gb)) in x.chunks_exact(len).zip(dy.chunks_exact(len)).enumerate() {
            let (mean, rstd) = if part == GradPart::Weight { self.stats(xb) } else { (0.0, 0.0) };
            for i in 0..len {
                let v = if part == GradPart::Weight {
                    gb[i].f64() * (xb[i].f64() - mean) * rstd
                } else {
                    gb[i].f64()
                };
                acc[(self.param)(blk, i)] += v;
            }
        }
        acc.into_iter().map(T::of).collect()
    }
}

fn check_part(part: GradPart, has_weight: bool, has_bias: bool) -> KResult<()> {
    match part {
        GradPart::Input => Ok(()),
        GradPart::Weight if has_weight => Ok(()),
        GradPart::Bias if has_bias => Ok(()),
        _ => err(format!("has no {part:?} input to differentiate")),
    }
}

fn check_dy(x: &Tensor, dy: &Tensor) -> KResult<()> {
    if x.shape != dy.shape {
        return err(format!("dy {:?} must have x's shape {:?}", dy.shape, x.shape));
    }
    Ok(())
}

fn last_axis(x: &Tensor) -> KResult<usize> {
    match x.shape.last() {
        Some(&d) => Ok(d),
        None => err("needs at least one axis, found a scalar"),
    }
}

// ---- layer norm and RMS norm ------------------------------------------------------------------

pub(crate) fn layer_norm(
    x: &[&Tensor],
    eps: f64,
    has_weight: bool,
    has_bias: bool,
) -> KResult<Data> {
    let d = last_axis(x[0])?;
    let blocks = Blocks { len: d, center: true, eps, param: |_, i| i };
    by_float!(x, T => (|| {
        let (w, b) = affine::<T>(x, 1, has_weight, has_bias, d)?;
        Ok(blocks.forward(&floats::<T>(x[0], "x")?, w.as_deref(), b.as_deref()))
    })())
}

/// Inputs `x, weight?, bias?, dy`.
pub(crate) fn layer_norm_grad(
    x: &[&Tensor],
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    part: GradPart,
) -> KResult<Data> {
    check_part(part, has_weight, has_bias)?;
    let d = last_axis(x[0])?;
    let dy = x[x.len() - 1];
    check_dy(x[0], dy)?;
    let blocks = Blocks { len: d, center: true, eps, param: |_, i| i };
    by_float!(x, T => (|| {
        let (w, _) = affine::<T>(x, 1, has_weight, has_bias, d)?;
        let (xv, dyv) = (floats::<T>(x[0], "x")?, floats::<T>(dy, "dy")?);
        Ok(blocks.backward(&xv, w.as_deref(), &dyv, part, d))
    })())
}

pub(crate) fn rms_norm(x: &[&Tensor], eps: f64, has_weight: bool) -> KResult<Data> {
    let d = last_axis(x[0])?;
    let blocks = Blocks { len: d, center: false, eps, param: |_, i| i };
    by_float!(x, T => (|| {
        let (w, _) = affine::<T>(x, 1, has_weight, false, d)?;
        Ok(blocks.forward(&floats::<T>(x[0], "x")?, w.as_deref(), None))
    })())
}

/// Inputs `x, weight?, dy`.
pub(crate) fn rms_norm_grad(
    x: &[&Tensor],
    eps: f64,
    has_weight: bool,
    part: GradPart,
) -> KResult<Data> {
    check_part(part, has_weight, false)?;
    let d = last_axis(x[0])?;
    let dy = x[x.len() - 1];
    check_dy(x[0], dy)?;
    let blocks = Blocks { len: d, center: false, eps, param: |_, i| i };
    by_float!(x, T => (|| {
        let (w, _) = affine::<T>(x, 1, has_weight, false, d)?;
        let (xv, dyv) = (floats::<T>(x[0], "x")?, floats::<T>(dy, "dy")?);
        Ok(blocks.backward(&xv, w.as_deref(), &dyv, part, d))
    })())
}

// ---- group norm -----------------------------------------------------------------------------

/// `x: [N, C, ...]`: channels, spatial size per channel, block length.
fn group_layout(x: &Tensor, groups: usize) -> KResult<(usize, usize, usize)> {
    if x.shape.len() < 2 {
        return err(format!("needs [N, C, ...], found {:?}", x.shape));
    }
    let (c, spatial) = (x.shape[1], numel(&x.shape[2..]));
    if groups == 0 || c % groups != 0 {
        return err(format!("cannot split {c} channels into {groups} groups"));
    }
    Ok((c, spatial, c / groups * spatial))
}

pub(crate) fn group_norm(
    x: &[&Tensor],
    groups: usize,
    eps: f64,
    has_weight: bool,
    has_bias: bool,
) -> KResult<Data> {
    let (c, spatial, len) = group_layout(x[0], groups)?;
    // The channels of a group are contiguous in [N, C, S]: block b is group b % G of sample b / G.
    let blocks = Blocks {
        len,
        center: true,
        eps,
        param: move |b, i| (b % groups) * (c / groups) + i / spatial,
    };
    by_float!(x, T => (|| {
        let (w, b) = affine::<T>(x, 1, has_weight, has_bias, c)?;
        Ok(blocks.forward(&floats::<T>(x[0], "x")?, w.as_deref(), b.as_deref()))
    })())
}

/// Inputs `x, weight?, bias?, dy`.
pub(crate) fn group_norm_grad(
    x: &[&Tensor],
    groups: usize,
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    part: GradPart,
) -> KResult<Data> {
    check_part(part, has_weight, has_bias)?;
    let (c, spatial, len) = group_layout(x[0], groups)?;
    let dy = x[x.len() - 1];
    check_dy(x[0], dy)?;
    let blocks = Blocks {
        len,
        center: true,
        eps,
        param: move |b, i| (b % groups) * (c / groups) + i / spatial,
    };
    by_float!(x, T => (|| {
        let (w, _) = affine::<T>(x, 1, has_weight, has_bias, c)?;
        let (xv, dyv) = (floats::<T>(x[0], "x")?, floats::<T>(dy, "dy")?);
        Ok(blocks.backward(&xv, w.as_deref(), &dyv, part, c))
    })())
}

// ---- batch norm -----------------------------------------------------------------------------

/// `x: [N, C, ...]` as (N, C, spatial size); element `(n, c, s)` is at `(n·C + c)·S + s`.
fn batch_layout(x: &Tensor) -> KResult<(usize, usize, usize)> {
    if x.shape.len() < 2 {
        return err(format!("needs [N, C, ...], found {:?}", x.shape));
    }
    Ok((x.shape[0], x.shape[1], numel(&x.shape[2..])))
}

/// Per-channel (mean, rstd): the batch's (biased variance) in training, else the running ones.
fn batch_stats<T: Float>(
    x: &[T],
    (n, c, s): (usize, usize, usize),
    rm: &Tensor,
    rv: &Tensor,
    eps: f64,
    training: bool,
) -> KResult<Vec<(f64, f64)>> {
    if rm.shape != [c] || rv.shape != [c] {
        return err(format!(
            "running statistics must have shape [{c}], found {:?} and {:?}",
            rm.shape, rv.shape
        ));
    }
    if !training {
        let (m, v) = (rm.to_f64_vec(), rv.to_f64_vec());
        return Ok((0..c).map(|ch| (m[ch], 1.0 / (v[ch] + eps).sqrt())).collect());
    }
    if n * s <= 1 {
        return err(format!(
            "training needs more than one value per channel, found input shape [{n}, {c}, ..] \
             with {s} per sample"
        ));
    }
    Ok((0..c)
        .map(|ch| {
            let (mean, var) = channel_moments(x, (n, c, s), ch);
            (mean, 1.0 / (var + eps).sqrt())
        })
        .collect())
}

/// Mean and biased variance of channel `ch`.
fn channel_moments<T: Float>(x: &[T], (n, c, s): (usize, usize, usize), ch: usize) -> (f64, f64) {
    let values = || {
        (0..n).flat_map(move |i| x[(i * c + ch) * s..(i * c + ch + 1) * s].iter().map(|v| v.f64()))
    };
    let count = (n * s) as f64;
    let mean = values().sum::<f64>() / count;
    let var = values().map(|v| (v - mean).powi(2)).sum::<f64>() / count;
    (mean, var)
}

/// Inputs `x, running_mean, running_var, weight?, bias?`.
pub(crate) fn batch_norm(
    x: &[&Tensor],
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    training: bool,
) -> KResult<Data> {
    let dims @ (_, c, s) = batch_layout(x[0])?;
    by_float!(x, T => (|| {
        let xv = floats::<T>(x[0], "x")?;
        let (w, b) = affine::<T>(x, 3, has_weight, has_bias, c)?;
        let stats = batch_stats(&xv, dims, x[1], x[2], eps, training)?;
        let mut out = vec![T::zero(); xv.len()];
        // Plane p = n·C + ch holds the S elements of sample n, channel ch.
        for (p, (src, dst)) in xv.chunks_exact(s).zip(out.chunks_exact_mut(s)).enumerate() {
            let ch = p % c;
            let (mean, rstd) = stats[ch];
            let scale = rstd * w.as_ref().map_or(1.0, |w| w[ch].f64());
            let shift = b.as_ref().map_or(0.0, |b| b[ch].f64());
            for (d, v) in dst.iter_mut().zip(src) {
                *d = T::of((v.f64() - mean) * scale + shift);
            }
        }
        Ok(out)
    })())
}

/// Inputs `x, running_mean, running_var, weight?, bias?, dy`. In training the batch statistics
/// depend on `x` (the full derivative); otherwise `dx = dy·w·rstd`.
pub(crate) fn batch_norm_grad(
    x: &[&Tensor],
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    part: GradPart,
    training: bool,
) -> KResult<Data> {
    check_part(part, has_weight, has_bias)?;
    let dims @ (n, c, s) = batch_layout(x[0])?;
    let dy = x[x.len() - 1];
    check_dy(x[0], dy)?;
    by_float!(x, T => (|| {
        let (xv, g) = (floats::<T>(x[0], "x")?, floats::<T>(dy, "dy")?);
        let (w, _) = affine::<T>(x, 3, has_weight, has_bias, c)?;
        let stats = batch_stats(&xv, dims, x[1], x[2], eps, training)?;
        let planes = || {
            let pairs = xv.chunks_exact(s).zip(g.chunks_exact(s));
            pairs.enumerate().map(|(p, (xp, gp))| (p % c, xp, gp))
        };
        // Per channel: Σ dy and Σ dy·x̂ (the bias and weight gradients, and the input's terms).
        let (mut sum_g, mut sum_gx) = (vec![0f64; c], vec![0f64; c]);
        for (ch, xp, gp) in planes() {
            let (mean, rstd) = stats[ch];
            for (xv, gv) in xp.iter().zip(gp) {
                sum_g[ch] += gv.f64();
                sum_gx[ch] += gv.f64() * (xv.f64() - mean) * rstd;
            }
        }
        Ok(match part {
            GradPart::Bias => sum_g.into_iter().map(T::of).collect::<Vec<T>>(),
            GradPart::Weight => sum_gx.into_iter().map(T::of).collect(),
            _ => {
                let count = (n * s) as f64;
                let mut dx = Vec::with_capacity(xv.len());
                for (ch, xp, gp) in planes() {
                    let (mean, rstd) = stats[ch];
                    let scale = rstd * w.as_ref().map_or(1.0, |w| w[ch].f64());
                    dx.extend(xp.iter().zip(gp).map(|(xv, gv)| {
                        let d = if training {
                        let centred = (xv.f64() - mean) * rstd * sum_gx[ch] / count;
                        gv.f64() - sum_g[ch] / count - centred
                    } else {
                        gv.f64()
                    };
                        T::of(scale * d)
                    }));
                }
                dx
            }
        })
    })())
}

pub(crate) fn batch_norm_update(
    x: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    momentum: f64,
) -> (Tensor, Tensor) {
    let (n, c, s) = batch_layout(x).unwrap_or_else(|e| panic!("batch_norm_update: {e}"));
    assert!(
        running_mean.shape == [c] && running_var.shape == [c],
        "batch_norm_update: running statistics must be [{c}] for x {:?}",
        x.shape
    );
    let xv = x.to_f64_vec();
    let (old_m, old_v) = (running_mean.to_f64_vec(), running_var.to_f64_vec());
    let count = n * s;
    let (mut new_m, mut new_v) = (Vec::with_capacity(c), Vec::with_capacity(c));
    for ch in 0..c {
        let (mean, var) = channel_moments(&xv, (n, c, s), ch);
        let unbiased = if count > 1 { var * count as f64 / (count - 1) as f64 } else { var };
        new_m.push((1.0 - momentum) * old_m[ch] + momentum * mean);
        new_v.push((1.0 - momentum) * old_v[ch] + momentum * unbiased);
    }
    let like = |t: &Tensor, v: Vec<f64>| {
        let data = if matches!(t.data, Data::F64(_)) {
            Data::F64(v)
        } else {
            Data::F32(v.into_iter().map(|x| x as f32).collect())
        };
        Tensor { dtype: t.dtype, shape: t.shape.clone(), data }
    };
    (like(running_mean, new_m), like(running_var, new_v))
}
