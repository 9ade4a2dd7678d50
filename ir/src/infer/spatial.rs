//! The typing rules of padding and resampling, and of their derivatives.

use super::{fail, float, show, take, Rule, ShapeError, Ty};
use crate::op::Op;
use crate::shape::resample::{interpolated, interpolation, padded};

/// `pad`, `interpolate`, and `pad_grad`, which determine their result.
pub(super) fn infer_spatial(op: &Op, x: &[Ty]) -> Rule {
    match op {
        Op::Pad { widths, mode, value } => {
            let [a] = take(x)?;
            float(*a, "the operand")?;
            if !value.is_finite() {
                return fail(format!("the padding value {value} is not finite"));
            }
            Ok(Some((a.0, padded(a.1, widths, *mode)?)))
        }
        Op::PadGrad { widths, mode } => {
            let [dy] = take(x)?;
            float(*dy, "dy")?;
            if widths.len() != dy.1.len() {
                return fail(format!(
                    "pad widths {widths:?} need one pair per axis of {}",
                    show(*dy)
                ));
            }
            let mut dx = Vec::with_capacity(widths.len());
            for (&n, &[b, e]) in dy.1.iter().zip(widths) {
                match n.checked_sub(b + e) {
                    Some(d) if d > 0 => dx.push(d),
                    _ => return fail(format!("{} is not padded by {widths:?}", show(*dy))),
                }
            }
            // The padded shape of dx is dy's, and the mode's conditions hold.
            padded(&dx, widths, *mode)?;
            Ok(Some((dy.0, dx)))
        }
        Op::Interpolate { mode, size, scale, align_corners } => {
            let [a] = take(x)?;
            float(*a, "the input")?;
            interpolation(a.1, size, scale.as_deref(), *mode, *align_corners)?;
            Ok(Some((a.0, interpolated(a.1, size))))
        }
        _ => unreachable!("`infer` sends padding and resampling here"),
    }
}

/// `interpolate_grad`'s result is the forward input's shape, which the step gives.
pub(super) fn given_spatial(op: &Op, x: &[Ty], out: Ty) -> Result<(), ShapeError> {
    match op {
        Op::InterpolateGrad { mode, size, scale, align_corners } => {
            float(out, "the result")?;
            interpolation(out.1, size, scale.as_deref(), *mode, *align_corners)?;
            let want = interpolated(out.1, size);
            if x[0].1 != want.as_slice() {
                return fail(format!("dy must have shape {want:?}, found {}", show(x[0])));
            }
            Ok(())
        }
        _ => unreachable!("`given` sends interpolate_grad here"),
    }
}
