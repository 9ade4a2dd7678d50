//! Pure shape rules shared by operators and builtins: broadcasting, matmul, axes, conv sizes.

/// NumPy broadcasting. On failure returns the (right-aligned) axis of the result that disagrees.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, usize> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(i),
        };
    }
    Ok(out)
}

#[derive(Debug, PartialEq)]
pub enum MatmulError {
    Scalar,
    Inner { k_left: usize, k_right: usize },
    Batch { axis: usize },
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

/// Resolves a possibly negative axis against `rank`.
pub fn axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Output length of a convolution or pooling window along one axis, if at least 1.
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

pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[8, 1, 4], &[3, 1]), Ok(vec![8, 3, 4]));
        assert_eq!(broadcast(&[], &[2, 2]), Ok(vec![2, 2]));
        assert_eq!(broadcast(&[8, 3], &[8, 4]), Err(1));
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
    }

    #[test]
    fn negative_axes() {
        assert_eq!(axis(-1, 3), Some(2));
        assert_eq!(axis(3, 3), None);
        assert_eq!(axis(-4, 3), None);
    }
}
