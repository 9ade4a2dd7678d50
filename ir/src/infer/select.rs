//! The typing rules of comparisons and selection: `compare`, `where`.

use super::{one_dtype, same, show, take, Rule};
use crate::dtype::DType;
use crate::op::Op;
use crate::shape::{broadcast, fail, ShapeError};

/// The broadcast shape of `a` and `b`, or an error naming both.
fn joint(a: (DType, &[usize]), b: (DType, &[usize])) -> Result<Vec<usize>, ShapeError> {
    broadcast(a.1, b.1).or_else(|_| fail(format!("{} and {} do not broadcast", show(a), show(b))))
}

pub(super) fn infer_select(op: &Op, x: &[super::Ty]) -> Rule {
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
        _ => unreachable!("`infer` sends comparisons and selection here"),
    }
}
