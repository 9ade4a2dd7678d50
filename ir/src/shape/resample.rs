//! Padding and resampling: where each output element of `pad` and `interpolate` reads from,
//! written once for the shape rules, both backends' kernels and their derivatives.
//!
//! `interpolate`'s index math is PyTorch's (`aten/src/ATen/native/UpSample.h`), in f32 as
//! PyTorch computes it for f32 tensors, so that a non-integer scale picks the same source
//! elements and the same weights: the ratio is `1 / scale` when a scale was given and
//! `in / out` otherwise (`(in − 1) / (out − 1)` with `align_corners`), nearest reads
//! `min(floor(j · ratio), in − 1)`, and linear reads the two neighbours of
//! `ratio · (j + 0.5) − 0.5` (clamped at 0) or of `ratio · j` with `align_corners`.

use super::{fail, ShapeError};
use crate::op::{InterpMode, PadMode};

/// The padded shape, after checking the widths against the mode.
pub fn padded(
    shape: &[usize],
    widths: &[[usize; 2]],
    mode: PadMode,
) -> Result<Vec<usize>, ShapeError> {
    if widths.len() != shape.len() {
        return fail(format!("pad widths {widths:?} need one pair per axis of {shape:?}"));
    }
    let mut out = Vec::with_capacity(shape.len());
    for (a, (&n, &[b, e])) in shape.iter().zip(widths).enumerate() {
        if mode == PadMode::Reflect && (b >= n || e >= n) {
            return fail(format!(
                "reflect padding of ({b}, {e}) needs widths below the size {n} of axis {a}"
            ));
        }
        let total = n.checked_add(b).and_then(|s| s.checked_add(e));
        out.push(total.ok_or_else(|| ShapeError(format!("padding axis {a} overflows")))?);
    }
    Ok(out)
}

/// The input coordinate that output coordinate `o` of an axis of size `n` padded by `before`
/// reads; `None` in constant padding.
pub fn pad_source(o: usize, n: usize, before: usize, mode: PadMode) -> Option<usize> {
    let j = o as i64 - before as i64;
    let last = n as i64 - 1;
    let j = match mode {
        PadMode::Constant if j < 0 || j > last => return None,
        PadMode::Constant => j,
        PadMode::Reflect if j < 0 => -j,
        PadMode::Reflect if j > last => 2 * last - j,
        PadMode::Reflect => j,
        PadMode::Replicate => j.clamp(0, last),
    };
    Some(j as usize)
}

/// One resampled axis: its input and output sizes and the ratio PyTorch's index math uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Axis {
    pub inp: usize,
    pub out: usize,
    pub mode: InterpMode,
    pub align_corners: bool,
    /// PyTorch's `scale` for this axis: in/out, 1/scale, or (in−1)/(out−1), in f32.
    pub ratio: f32,
}

impl Axis {
    /// `scale` is the user's scale factor when one was given (it then sets the ratio, as in
    /// PyTorch without `recompute_scale_factor`; `align_corners` ignores it).
    pub fn new(
        inp: usize,
        out: usize,
        scale: Option<f64>,
        mode: InterpMode,
        align_corners: bool,
    ) -> Axis {
        let ratio = if align_corners && mode == InterpMode::Linear {
            if out > 1 {
                (inp as f32 - 1.0) / (out as f32 - 1.0)
            } else {
                0.0
            }
        } else {
            match scale {
                Some(s) if s > 0.0 => (1.0 / s) as f32,
                _ => inp as f32 / out as f32,
            }
        };
        Axis { inp, out, mode, align_corners, ratio }
    }

    /// The input coordinate nearest mode reads for output `j`.
    pub fn nearest(&self, j: usize) -> usize {
        if self.out == self.inp {
            j
        } else if self.out == 2 * self.inp {
            j >> 1
        } else {
            ((j as f32 * self.ratio).floor() as usize).min(self.inp - 1)
        }
    }

    /// The two input coordinates linear mode reads for output `j` and their weights.
    pub fn linear(&self, j: usize) -> (usize, usize, f32, f32) {
        if self.out == self.inp {
            return (j, j, 1.0, 0.0);
        }
        let src = if self.align_corners {
            self.ratio * j as f32
        } else {
            (self.ratio * (j as f32 + 0.5) - 0.5).max(0.0)
        };
        let i0 = (src.floor() as usize).min(self.inp - 1);
        let l1 = (src - i0 as f32).clamp(0.0, 1.0);
        let i1 = if i0 < self.inp - 1 { i0 + 1 } else { i0 };
        (i0, i1, 1.0 - l1, l1)
    }

    /// The input coordinates output `j` reads, with their weights (nearest: one of weight 1).
    pub fn taps(&self, j: usize) -> [(usize, f32); 2] {
        match self.mode {
            InterpMode::Nearest => [(self.nearest(j), 1.0), (0, 0.0)],
            InterpMode::Linear => {
                let (i0, i1, l0, l1) = self.linear(j);
                [(i0, l0), (i1, l1)]
            }
        }
    }
}

/// The resampled axes of an `interpolate` of `shape` (`[N, C, L]` or `[N, C, H, W]`) to
/// `size`, checked; 1-D gets a height of 1 kept as is.
pub fn interpolation(
    shape: &[usize],
    size: &[usize],
    scale: Option<&[f64]>,
    mode: InterpMode,
    align_corners: bool,
) -> Result<[Axis; 2], ShapeError> {
    let spatial = shape.len().wrapping_sub(2);
    if !(1..=2).contains(&spatial) {
        return fail(format!("interpolation needs [N, C, L] or [N, C, H, W], found {shape:?}"));
    }
    if size.len() != spatial || size.contains(&0) {
        return fail(format!("the size {size:?} needs one positive size per spatial axis"));
    }
    if let Some(s) = scale {
        if s.len() != spatial || s.iter().any(|&v| !(v.is_finite() && v > 0.0)) {
            return fail(format!("the scale {s:?} needs one positive factor per spatial axis"));
        }
    }
    let axis =
        |a: usize| Axis::new(shape[2 + a], size[a], scale.map(|s| s[a]), mode, align_corners);
    Ok(match spatial {
        1 => [Axis::new(1, 1, None, InterpMode::Nearest, false), axis(0)],
        _ => [axis(0), axis(1)],
    })
}

/// `[N, C, ..size]`.
pub fn interpolated(shape: &[usize], size: &[usize]) -> Vec<usize> {
    shape[..2].iter().chain(size).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_sources_follow_each_mode() {
        let src = |mode| (0..7).map(|o| pad_source(o, 3, 2, mode)).collect::<Vec<_>>();
        let c = src(PadMode::Constant);
        assert_eq!(c, vec![None, None, Some(0), Some(1), Some(2), None, None]);
        let r: Vec<_> = src(PadMode::Reflect).into_iter().flatten().collect();
        assert_eq!(r, vec![2, 1, 0, 1, 2, 1, 0]);
        let e: Vec<_> = src(PadMode::Replicate).into_iter().flatten().collect();
        assert_eq!(e, vec![0, 0, 0, 1, 2, 2, 2]);
        assert!(padded(&[2, 3], &[[0, 0], [3, 0]], PadMode::Reflect).is_err());
        assert_eq!(padded(&[2, 3], &[[1, 0], [0, 2]], PadMode::Constant), Ok(vec![3, 5]));
    }

    /// Values from PyTorch 2.x's `F.interpolate` index math.
    #[test]
    fn interpolation_indices_are_pytorchs() {
        // nearest 5 -> 3 (size): ratio 5/3, floor(j · 1.6666666) = 0, 1, 3.
        let a = Axis::new(5, 3, None, InterpMode::Nearest, false);
        assert_eq!((0..3).map(|j| a.nearest(j)).collect::<Vec<_>>(), vec![0, 1, 3]);
        // nearest with scale 1.5 from 4: out 6, ratio 1/1.5.
        let a = Axis::new(4, 6, Some(1.5), InterpMode::Nearest, false);
        assert_eq!((0..6).map(|j| a.nearest(j)).collect::<Vec<_>>(), vec![0, 0, 1, 2, 2, 3]);
        // scale 1.2 on 3 gives out 3 == in: copied, not floor(j / 1.2).
        let a = Axis::new(3, 3, Some(1.2), InterpMode::Nearest, false);
        assert_eq!((0..3).map(|j| a.nearest(j)).collect::<Vec<_>>(), vec![0, 1, 2]);
        // linear 2 -> 4, half-pixel centres: src = 0.5 (j + 0.5) − 0.5, clamped at 0.
        let a = Axis::new(2, 4, None, InterpMode::Linear, false);
        let taps: Vec<_> = (0..4).map(|j| a.linear(j)).collect();
        assert_eq!(taps[0], (0, 1, 1.0, 0.0));
        assert_eq!(taps[1], (0, 1, 0.75, 0.25));
        assert_eq!(taps[2], (0, 1, 0.25, 0.75));
        assert_eq!(taps[3], (1, 1, 0.75, 0.25));
        // align_corners 3 -> 5: src = j / 2.
        let a = Axis::new(3, 5, None, InterpMode::Linear, true);
        assert_eq!(a.linear(1), (0, 1, 0.5, 0.5));
        assert_eq!(a.linear(4), (2, 2, 1.0, 0.0));
        assert!(interpolation(&[1, 2, 3], &[0], None, InterpMode::Nearest, false).is_err());
    }
}
