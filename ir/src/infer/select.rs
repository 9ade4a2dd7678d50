//! The typing rules of comparisons, selection and scans: `compare`, `where`, `cumsum`, `topk`,
//! `take_along` and its derivative, and the windows at a run-time start.

use super::{axis_in, int, one_dtype, run_time_start, same, show, take, Rule, Ty};
use crate::dtype::DType;
use crate::op::Op;
use crate::shape::{broadcast, fail, ShapeError};

/// The broadcast shape of `a` and `b`, or an error naming both.
fn joint(a: (DType, &[usize]), b: (DType, &[usize])) -> Result<Vec<usize>, ShapeError> {
    broadcast(a.1, b.1).or_else(|_| fail(format!("{} and {} do not broadcast", show(a), show(b))))
}

pub(super) fn infer_select(op: &Op, x: &[Ty]) -> Rule {
    match op {
        Op::Compare(_) => {
            let [a, b] = take(x)?;
            one_dtype(*a, *b)?;
            Ok(Some((DType::Bool, joint(*a, *b)?)))
        }
        Op::Where => {
            let [c, a, b] = take(x)?;
            if c.0 != DType::Bool {
                return fail(format!("the condition must be a bool tensor, found {}", show(*c)));
            }
            one_dtype(*a, *b)?;
            let ab = joint(*a, *b)?;
            same((a.0, &joint(*c, (a.0, &ab))?))
        }
        Op::Cumsum { axis, .. } => {
            let [a] = take(x)?;
            number(*a)?;
            axis_in(*axis, *a)?;
            same(*a)
        }
        Op::TopK { k, axis } => {
            let [a] = take(x)?;
            number(*a)?;
            axis_in(*axis, *a)?;
            if *k < 1 || *k > a.1[*axis] {
                return fail(format!("k = {k} is out of range for axis {axis} of {}", show(*a)));
            }
            let mut out = a.1.to_vec();
            out[*axis] = *k;
            Ok(Some((DType::I32, out)))
        }
        Op::TakeAlong { axis } => {
            let [a, i] = take(x)?;
            along(*axis, *a, *i)?;
            Ok(Some((a.0, i.1.to_vec())))
        }
        _ => unreachable!("`infer` sends comparisons and selection here"),
    }
}

/// A number tensor: scans and selections order or add elements, which masks do not have.
fn number(t: Ty) -> Result<(), ShapeError> {
    if t.0 == DType::Bool {
        return fail(format!("needs a number tensor, found {}", show(t)));
    }
    Ok(())
}

/// `index` reads `x` along `axis`: an integer tensor of `x`'s rank and, but on `axis`, sizes.
pub(super) fn along(axis: usize, x: Ty, index: Ty) -> Result<(), ShapeError> {
    axis_in(axis, x)?;
    int(index, "the index")?;
    let fits = index.1.len() == x.1.len()
        && index.1.iter().zip(x.1).enumerate().all(|(a, (i, n))| a == axis || i == n);
    if !fits {
        return fail(format!(
            "the index {} does not read {} along axis {axis} (same rank, same sizes but there)",
            show(index),
            show(x)
        ));
    }
    Ok(())
}

/// Windows at a run-time start: `Narrow` and `SliceScatter`.
pub(super) fn infer_window(op: &Op, x: &[Ty]) -> Rule {
    match op {
        Op::Narrow { axis, len } => {
            let [a, start] = take(x)?;
            axis_in(*axis, *a)?;
            run_time_start(*start)?;
            if !(1..=a.1[*axis]).contains(len) {
                return fail(format!("{len} elements do not fit axis {axis} of {}", show(*a)));
            }
            let mut out = a.1.to_vec();
            out[*axis] = *len;
            Ok(Some((a.0, out)))
        }
        Op::SliceScatter { axis } => {
            let [a, src, start] = take(x)?;
            axis_in(*axis, *a)?;
            run_time_start(*start)?;
            let fits = src.0 == a.0
                && src.1.len() == a.1.len()
                && (1..=a.1[*axis]).contains(&src.1[*axis])
                && src.1.iter().zip(a.1).enumerate().all(|(k, (s, n))| k == *axis || s == n);
            if !fits {
                return fail(format!(
                    "{} does not fit into {} along axis {axis} (same dtype and rank, equal \
                     sizes but there, no longer there)",
                    show(*src),
                    show(*a)
                ));
            }
            same(*a)
        }
        _ => unreachable!("`infer` sends run-time windows here"),
    }
}
