//! Sizes as polynomials in a plan's dynamic sizes: what one number of a plan (an axis of a
//! step's shape, a slice's end) is at any value of them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// `Σ coef · Π sizes[i]` over its terms; a term's list names a size once per power
/// (`[0, 1]` is `B·T`, `[1, 1]` is `T²`, `[]` the constant). Terms are kept sorted and
/// merged, without zero coefficients, so equal polynomials compare equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Poly(Vec<(i64, Vec<u32>)>);

impl Poly {
    pub fn constant(c: i64) -> Poly {
        Poly::from_terms(vec![(c, vec![])])
    }

    /// The size with index `i` itself.
    pub fn var(i: usize) -> Poly {
        Poly::from_terms(vec![(1, vec![i as u32])])
    }

    /// The polynomial of these terms, normalized (sorted, merged, zeros dropped).
    pub fn from_terms(terms: Vec<(i64, Vec<u32>)>) -> Poly {
        let mut terms: Vec<(i64, Vec<u32>)> = terms
            .into_iter()
            .map(|(c, mut m)| {
                m.sort_unstable();
                (c, m)
            })
            .collect();
        terms.sort_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| a.1.cmp(&b.1)));
        let mut out: Vec<(i64, Vec<u32>)> = Vec::with_capacity(terms.len());
        for (c, m) in terms {
            match out.last_mut() {
                Some(last) if last.1 == m => last.0 += c,
                _ => out.push((c, m)),
            }
        }
        out.retain(|t| t.0 != 0);
        Poly(out)
    }

    pub fn terms(&self) -> &[(i64, Vec<u32>)] {
        &self.0
    }

    /// Its value at `sizes` (`None` when a term names a size past them or overflows).
    pub fn eval(&self, sizes: &[usize]) -> Option<i64> {
        let mut sum: i64 = 0;
        for (c, m) in &self.0 {
            let mut t = *c;
            for &i in m {
                t = t.checked_mul(i64::try_from(*sizes.get(i as usize)?).ok()?)?;
            }
            sum = sum.checked_add(t)?;
        }
        Some(sum)
    }

    /// Whether no term names a size.
    pub fn is_constant(&self) -> bool {
        self.0.iter().all(|(_, m)| m.is_empty())
    }

    /// `Some(i)` when this is exactly size `i` (an axis that is the size itself).
    pub fn as_var(&self) -> Option<usize> {
        match self.0.as_slice() {
            [(1, m)] if m.len() == 1 => Some(m[0] as usize),
            _ => None,
        }
    }

    /// The largest index of a size it names, plus one (0 for a constant).
    pub fn arity(&self) -> usize {
        self.0.iter().flat_map(|(_, m)| m.iter()).map(|&i| i as usize + 1).max().unwrap_or(0)
    }

    /// For people: `12·B·T + 1`, with `names` for the sizes.
    pub fn display<'a>(&'a self, names: &'a [&'a str]) -> impl fmt::Display + 'a {
        Shown { poly: self, names }
    }
}

struct Shown<'a> {
    poly: &'a Poly,
    names: &'a [&'a str],
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.poly.0.is_empty() {
            return f.write_str("0");
        }
        // The highest powers first, as people write them.
        for (k, (c, m)) in self.poly.0.iter().rev().enumerate() {
            let (sign, mag) = if *c < 0 { ("-", c.unsigned_abs()) } else { ("+", *c as u64) };
            match (k, sign) {
                (0, "-") => f.write_str("-")?,
                (0, _) => {}
                (_, s) => write!(f, " {s} ")?,
            }
            let names: Vec<String> = m
                .iter()
                .map(|&i| self.names.get(i as usize).map_or(format!("s{i}"), |n| n.to_string()))
                .collect();
            match (mag, names.is_empty()) {
                (_, true) => write!(f, "{mag}")?,
                (1, false) => f.write_str(&names.join("·"))?,
                (_, false) => write!(f, "{mag}·{}", names.join("·"))?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_normalized_and_evaluated() {
        let p = Poly::from_terms(vec![(3, vec![1, 0]), (1, vec![]), (9, vec![0, 1]), (0, vec![1])]);
        assert_eq!(p.terms(), &[(1, vec![]), (12, vec![0, 1])]);
        assert_eq!(p.eval(&[2, 5]), Some(121));
        assert_eq!(p.eval(&[2]), None, "a size past the given ones");
        assert_eq!(p.display(&["B", "T"]).to_string(), "12·B·T + 1");
        assert_eq!(Poly::var(1).as_var(), Some(1));
        assert_eq!(Poly::from_terms(vec![(2, vec![1])]).as_var(), None);
        let minus = Poly::from_terms(vec![(-1, vec![]), (1, vec![1])]);
        assert_eq!(minus.display(&["B", "T"]).to_string(), "T - 1");
        assert!(Poly::constant(4).is_constant());
        assert_eq!(Poly::from_terms(vec![(1, vec![1, 1])]).eval(&[0, 7]), Some(49));
    }

    #[test]
    fn overflow_is_none_not_a_wrap() {
        let p = Poly::from_terms(vec![(i64::MAX, vec![0])]);
        assert_eq!(p.eval(&[2]), None);
    }
}
