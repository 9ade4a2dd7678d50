//! Shape rules, written once for every stage: broadcasting, matrix products, axes, windows of
//! convolutions and pooling, attention operands. The elaborator types user code with them, the
//! plan validator and `infer` check plans with them, and both backends size their kernels with
//! them, so no stage can disagree with another about a shape.
//!
//! Functions return `None` or a [`ShapeError`] naming the shapes; the elaborator turns those
//! into diagnostics at the user's line, the backends into errors naming the step.

pub mod attention;
pub mod conv;
pub mod resample;

use std::fmt;

/// Why shapes do not fit an op: a sentence naming them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

pub(crate) fn fail<T>(msg: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(msg.into()))
}

/// Elements of a shape whose product is known to fit (a validated plan's, a tensor's).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Elements of a shape, or `None` if the product overflows.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Row-major strides of a contiguous tensor.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// NumPy broadcasting. On failure returns the (right-aligned) axis of the result that disagrees.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, usize> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| match (pad(a, i), pad(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(i),
        })
        .collect()
}

/// Strides (one per axis of `to`) that read a contiguous tensor of shape `from` at every index
/// of `to`: 0 on the axes that broadcasting adds or stretches.
pub fn broadcast_strides(from: &[usize], to: &[usize]) -> Result<Vec<usize>, ShapeError> {
    if from.len() > to.len() {
        return fail(format!("shape {from:?} does not broadcast to {to:?}"));
    }
    let lead = to.len() - from.len();
    let st = strides(from);
    let mut out = vec![0; to.len()];
    for (i, (&f, &s)) in from.iter().zip(&st).enumerate() {
        if f == to[lead + i] {
            out[lead + i] = if f == 1 { 0 } else { s };
        } else if f != 1 {
            return fail(format!("shape {from:?} does not broadcast to {to:?}"));
        }
    }
    Ok(out)
}

/// `shape` seen as `[outer, shape[axis], inner]`.
pub fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (numel(&shape[..axis]), shape[axis], numel(&shape[axis + 1..]))
}

/// Resolves a possibly negative axis against `rank`.
pub fn axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

#[derive(Debug, PartialEq)]
pub enum MatmulError {
    Scalar,
    Inner { k_left: usize, k_right: usize },
    Batch { axis: usize },
}

impl fmt::Display for MatmulError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatmulError::Scalar => write!(f, "a matrix product needs operands with an axis"),
            MatmulError::Inner { k_left, k_right } => {
                write!(f, "inner sizes differ: {k_left} and {k_right}")
            }
            MatmulError::Batch { axis } => write!(f, "batch axis {axis} does not broadcast"),
        }
    }
}

/// PyTorch `matmul` shapes: 1-D operands are promoted and the added axis removed again;
/// leading (batch) axes broadcast.
pub fn matmul(a: &[usize], b: &[usize]) -> Result<Vec<usize>, MatmulError> {
    if a.is_empty() || b.is_empty() {
        return Err(MatmulError::Scalar);
    }
    let a2: Vec<usize> = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2: Vec<usize> = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (m, k1) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k1 != k2 {
        return Err(MatmulError::Inner { k_left: k1, k_right: k2 });
    }
    let mut out = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])
        .map_err(|axis| MatmulError::Batch { axis })?;
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(n);
    }
    Ok(out)
}

/// Output length of a convolution or pooling window along one axis (PyTorch's formula), if at
/// least 1.
pub fn window_out(
    len: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)?;
    let padded = len.checked_add(padding.checked_mul(2)?)?;
    if padded < span || stride == 0 {
        return None;
    }
    Some((padded - span) / stride + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[8, 1, 4], &[3, 1]), Ok(vec![8, 3, 4]));
        assert_eq!(broadcast(&[], &[2, 2]), Ok(vec![2, 2]));
        assert_eq!(broadcast(&[8, 3], &[8, 4]), Err(1));
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), Ok(vec![0, 1, 0]));
        assert!(broadcast_strides(&[3, 2], &[3, 4]).is_err());
    }

    #[test]
    fn matmul_follows_pytorch() {
        assert_eq!(matmul(&[8, 64, 32], &[32, 16]), Ok(vec![8, 64, 16]));
        assert_eq!(matmul(&[32], &[32, 16]), Ok(vec![16]));
        assert_eq!(matmul(&[4, 32], &[32]), Ok(vec![4]));
        assert_eq!(matmul(&[2, 1, 4, 5], &[3, 5, 6]), Ok(vec![2, 3, 4, 6]));
        assert_eq!(matmul(&[4, 5], &[6, 7]), Err(MatmulError::Inner { k_left: 5, k_right: 6 }));
        assert_eq!(matmul(&[2, 4, 5], &[3, 5, 6]), Err(MatmulError::Batch { axis: 0 }));
    }

    #[test]
    fn windows_match_pytorch_formula() {
        assert_eq!(window_out(224, 7, 2, 3, 1), Some(112));
        assert_eq!(window_out(3000, 3, 2, 1, 1), Some(1500));
        assert_eq!(window_out(8, 3, 1, 0, 2), Some(4));
        assert_eq!(window_out(2, 5, 1, 0, 1), None);
        assert_eq!(window_out(2, 0, 1, 0, 1), None);
        assert_eq!(window_out(usize::MAX, 3, 1, 1, 1), None);
    }

    #[test]
    fn negative_axes() {
        assert_eq!(axis(-1, 3), Some(2));
        assert_eq!(axis(3, 3), None);
        assert_eq!(axis(-4, 3), None);
    }

    #[test]
    fn strides_and_splits() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(split_at_axis(&[2, 3, 4], 1), (2, 3, 4));
        assert_eq!(checked_numel(&[1 << 40, 1 << 40]), None);
    }
}
