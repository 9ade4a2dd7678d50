//! The operands of scaled dot-product attention.

use super::{fail, numel, ShapeError};

/// The sizes of an attention's operands, checked: q `[..B, Hq, Tq, D]`, k `[..B, Hkv, Tk, D]`,
/// v `[..B, Hkv, Tk, Dv]`, `Hkv` dividing `Hq` (grouped KV heads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dims {
    /// The product of the leading axes.
    pub batch: usize,
    pub hq: usize,
    pub hkv: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
    /// `[..B, Hq, Tq, Tk]`, what the scores (and a mask broadcast to them) have.
    pub scores: Vec<usize>,
}

impl Dims {
    /// The output's shape, `[..B, Hq, Tq, Dv]`.
    pub fn out(&self) -> Vec<usize> {
        let r = self.scores.len();
        let mut s = self.scores[..r - 1].to_vec();
        s.push(self.dv);
        s
    }
}

pub fn dims(q: &[usize], k: &[usize], v: &[usize]) -> Result<Dims, ShapeError> {
    let r = q.len();
    if r < 3 || k.len() != r || v.len() != r {
        return fail(format!(
            "q {q:?}, k {k:?} and v {v:?} must be [..B, heads, T, D] of one rank (at least 3)"
        ));
    }
    let lead = &q[..r - 3];
    let (hq, tq, d) = (q[r - 3], q[r - 2], q[r - 1]);
    let (hkv, tk, dk) = (k[r - 3], k[r - 2], k[r - 1]);
    if &k[..r - 3] != lead
        || &v[..r - 3] != lead
        || dk != d
        || v[r - 3] != hkv
        || v[r - 2] != tk
        || hkv == 0
        || hq % hkv != 0
    {
        return fail(format!(
            "q {q:?}, k {k:?} and v {v:?} do not fit together (k and v share heads and \
             length, KV heads divide query heads)"
        ));
    }
    let mut scores = lead.to_vec();
    scores.extend([hq, tq, tk]);
    Ok(Dims { batch: numel(lead), hq, hkv, tq, tk, d, dv: v[r - 1], scores })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_heads_fit_and_others_do_not() {
        let d = dims(&[2, 8, 5, 16], &[2, 2, 7, 16], &[2, 2, 7, 4]).unwrap();
        assert_eq!((d.batch, d.hq, d.hkv, d.tq, d.tk, d.d, d.dv), (2, 8, 2, 5, 7, 16, 4));
        assert_eq!(d.scores, vec![2, 8, 5, 7]);
        assert_eq!(d.out(), vec![2, 8, 5, 4]);
        assert!(dims(&[2, 8, 5, 16], &[2, 3, 7, 16], &[2, 3, 7, 4]).is_err());
        assert!(dims(&[8, 16], &[8, 16], &[8, 16]).is_err());
    }
}
