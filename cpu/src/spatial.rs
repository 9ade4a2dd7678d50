//! Padding and resampling (`pad`, `interpolate`) and their derivatives. Where each output
//! element reads from is `mgn_ir::shape::resample`'s, shared with the GPU kernels.

use super::float::Float;
use super::layout::{numel, strides};
use super::{by_float, check_shape, err, floats, KResult};
use mgn_ir::op::{InterpMode, PadMode};
use mgn_ir::shape::resample::{interpolated, interpolation, pad_source, padded, Axis};
use mgn_ir::{Data, Tensor};

/// For every element of the padded shape in row-major order, the offset of the input element
/// it reads (`None` in constant padding).
fn pad_sources(
    shape: &[usize],
    widths: &[[usize; 2]],
    mode: PadMode,
) -> KResult<Vec<Option<usize>>> {
    let out = padded(shape, widths, mode)?;
    let st = strides(shape);
    // Per axis, the offset each output coordinate reads along it.
    let tables: Vec<Vec<Option<usize>>> = (0..shape.len())
        .map(|a| {
            let (n, b, s) = (shape[a], widths[a][0], st[a]);
            (0..out[a]).map(|o| pad_source(o, n, b, mode).map(|j| j * s)).collect()
        })
        .collect();
    let mut all = Vec::with_capacity(numel(&out));
    fn visit(tables: &[Vec<Option<usize>>], at: Option<usize>, all: &mut Vec<Option<usize>>) {
        match tables.split_first() {
            None => all.push(at),
            Some((t, rest)) => {
                for &o in t {
                    visit(rest, at.zip(o).map(|(a, b)| a + b), all);
                }
            }
        }
    }
    visit(&tables, Some(0), &mut all);
    Ok(all)
}

pub(crate) fn pad(
    x: &Tensor,
    widths: &[[usize; 2]],
    mode: PadMode,
    value: f64,
    shape: &[usize],
) -> KResult<Data> {
    check_shape(&padded(&x.shape, widths, mode)?, shape)?;
    let sources = pad_sources(&x.shape, widths, mode)?;
    by_float!(&[x], T => floats::<T>(x, "x").map(|v| {
        sources.iter().map(|s| s.map_or(T::of(value), |at| v[at])).collect::<Vec<T>>()
    }))
}

/// `[dy]` → dx: every element of `dy` added to the element of `x` it read.
pub(crate) fn pad_grad(
    dy: &Tensor,
    widths: &[[usize; 2]],
    mode: PadMode,
    shape: &[usize],
) -> KResult<Data> {
    let dy_shape = padded(shape, widths, mode)?;
    if dy.shape != dy_shape {
        return err(format!("dy has shape {:?}, padding {shape:?} gives {dy_shape:?}", dy.shape));
    }
    let sources = pad_sources(shape, widths, mode)?;
    by_float!(&[dy], T => floats::<T>(dy, "dy").map(|g| {
        let mut dx = vec![T::zero(); numel(shape)];
        for (s, &gv) in sources.iter().zip(g.iter()) {
            if let Some(at) = s {
                dx[*at] += gv;
            }
        }
        dx
    }))
}

/// Which of an axis's taps (`Axis::taps`) are read: one for nearest, both for linear (PyTorch
/// reads both even when one weight is 0).
fn used(a: &Axis) -> &'static [usize] {
    match a.mode {
        InterpMode::Nearest => &[0],
        InterpMode::Linear => &[0, 1],
    }
}

/// The resampled axes of an interpolation of `x_shape`, and (planes, input [H, W]).
fn axes(
    x_shape: &[usize],
    size: &[usize],
    scale: Option<&[f64]>,
    mode: InterpMode,
    align_corners: bool,
) -> KResult<([Axis; 2], usize, usize)> {
    let ax = interpolation(x_shape, size, scale, mode, align_corners)?;
    let planes = x_shape[0] * x_shape[1];
    Ok((ax, planes, ax[0].inp * ax[1].inp))
}

/// `out[p, j, k] = Σ wh·(Σ ww·x[p, ih, iw])` over the taps of `j` along H and of `k` along W,
/// summed in PyTorch's order.
pub(crate) fn interpolate(
    x: &Tensor,
    mode: InterpMode,
    size: &[usize],
    scale: Option<&[f64]>,
    align_corners: bool,
    shape: &[usize],
) -> KResult<Data> {
    check_shape(&interpolated(&x.shape, size), shape)?;
    let ([ah, aw], planes, plane) = axes(&x.shape, size, scale, mode, align_corners)?;
    by_float!(&[x], T => floats::<T>(x, "x").map(|v| {
        let mut out = Vec::with_capacity(planes * ah.out * aw.out);
        for p in 0..planes {
            let xp = &v[p * plane..][..plane];
            for j in 0..ah.out {
                let th = ah.taps(j);
                for k in 0..aw.out {
                    let tw = aw.taps(k);
                    let mut acc = T::zero();
                    for &a in used(&ah) {
                        let row = &xp[th[a].0 * aw.inp..][..aw.inp];
                        let mut inner = T::zero();
                        for &b in used(&aw) {
                            inner += T::of(tw[b].1 as f64) * row[tw[b].0];
                        }
                        acc += T::of(th[a].1 as f64) * inner;
                    }
                    out.push(acc);
                }
            }
        }
        out
    }))
}

/// `[dy]` → dx of the step's shape: each element of `dy` spread over the elements it read.
pub(crate) fn interpolate_grad(
    dy: &Tensor,
    mode: InterpMode,
    size: &[usize],
    scale: Option<&[f64]>,
    align_corners: bool,
    shape: &[usize],
) -> KResult<Data> {
    let want = interpolated(shape, size);
    if dy.shape != want {
        return err(format!("dy has shape {:?}, expected {want:?}", dy.shape));
    }
    let ([ah, aw], planes, plane) = axes(shape, size, scale, mode, align_corners)?;
    by_float!(&[dy], T => floats::<T>(dy, "dy").map(|g| {
        let mut dx = vec![T::zero(); planes * plane];
        let l = ah.out * aw.out;
        for p in 0..planes {
            let dp = &mut dx[p * plane..][..plane];
            for j in 0..ah.out {
                let th = ah.taps(j);
                for k in 0..aw.out {
                    let tw = aw.taps(k);
                    let gv = g[p * l + j * aw.out + k];
                    for &a in used(&ah) {
                        for &b in used(&aw) {
                            let w = T::of(th[a].1 as f64) * T::of(tw[b].1 as f64);
                            dp[th[a].0 * aw.inp + tw[b].0] += w * gv;
                        }
                    }
                }
            }
        }
        dx
    }))
}
