//! Results stored permuted (`GpuOp::PermutedStore`): a kernel computes its result at its own
//! shape and `store` puts element `i` where `Op::Permute` of it would have it, so the permute's
//! copy — a dispatch and a barrier for each of attention's head splits and merges — is gone.

use super::Operand;

/// Where a result's elements go: the result seen as `view` (its elements in order), permuted
/// by `perm` (`Op::Permute`'s: axis `j` of the stored value is axis `perm[j]` of the view).
#[derive(Clone, Debug, PartialEq)]
pub struct Permuted {
    pub view: Vec<usize>,
    pub perm: Vec<usize>,
}

impl Permuted {
    /// The WGSL expression of the stored index of the element whose index in the view is `i`:
    /// each of the view's axes at its stride in the stored value. Axes of size 1 drop out, and
    /// neighbours that stay neighbours in the stored value count as one axis.
    pub fn index(&self, i: &str) -> String {
        let stored: Vec<usize> = self.perm.iter().map(|&a| self.view[a]).collect();
        // Axis `perm[j]` of the view is axis `j` of the stored value.
        let mut at = vec![0; self.view.len()];
        for (j, stride) in super::strides(&stored).into_iter().enumerate() {
            at[self.perm[j]] = stride;
        }
        // (size, stride in the stored value), outermost first, merged where contiguous.
        let mut axes: Vec<(usize, usize)> = Vec::new();
        for (k, &d) in self.view.iter().enumerate() {
            if d == 1 {
                continue;
            }
            match axes.last_mut() {
                Some((size, s)) if *s == at[k] * d => {
                    *size *= d;
                    *s = at[k];
                }
                _ => axes.push((d, at[k])),
            }
        }
        let mut inner = 1;
        let mut terms = Vec::new();
        for (k, &(size, s)) in axes.iter().enumerate().rev() {
            let mut t = if inner == 1 { format!("({i})") } else { format!("(({i}) / {inner}u)") };
            if k > 0 {
                t = format!("({t} % {size}u)");
            }
            if s != 1 {
                t = format!("{t} * {s}u");
            }
            terms.push(t);
            inner *= size;
        }
        if terms.is_empty() {
            return "0u".into();
        }
        terms.reverse();
        format!("({})", terms.join(" + "))
    }
}

impl Operand {
    /// This output stored permuted as `p` says.
    pub fn permuted(&self, shape: &[usize], p: Permuted) -> Operand {
        Operand { shape: shape.to_vec(), permuted: Some(p), follows: vec![], ..self.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::index_eval::eval;

    /// Where `Op::Permute` puts element `i` of the view, by coordinates.
    fn permuted_at(view: &[usize], perm: &[usize], i: usize) -> usize {
        let mut coords = vec![0; view.len()];
        let mut rest = i;
        for k in (0..view.len()).rev() {
            coords[k] = rest % view[k];
            rest /= view[k];
        }
        perm.iter().fold(0, |at, &a| at * view[a] + coords[a])
    }

    #[test]
    fn every_element_goes_where_the_permute_puts_it() {
        let cases: [(&[usize], &[usize]); 7] = [
            (&[2, 5, 3, 4], &[0, 2, 1, 3]), // a head split
            (&[1, 3, 5, 4], &[0, 2, 1, 3]), // a head merge, batch 1
            (&[2, 3, 4], &[0, 2, 1]),
            (&[2, 3, 4, 5], &[0, 2, 3, 1]), // channels last
            (&[3, 1, 4, 1], &[3, 2, 0, 1]),
            (&[2, 3], &[0, 1]), // the identity: one axis
            (&[1, 1], &[1, 0]),
        ];
        for (view, perm) in cases {
            let p = Permuted { view: view.to_vec(), perm: perm.to_vec() };
            let expr = p.index("i");
            let n: usize = view.iter().product();
            for i in 0..n {
                let got = eval(&expr.replace('i', &i.to_string()));
                assert_eq!(got, permuted_at(view, perm, i) as u64, "{view:?} {perm:?}: {expr}");
            }
        }
        let identity = Permuted { view: vec![2, 3], perm: vec![0, 1] };
        assert_eq!(identity.index("i"), "((i))");
    }
}
