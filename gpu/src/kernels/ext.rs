//! Sizes as a kernel reads them (`Ext`): a number fixed when the kernel is generated, or — for
//! a size that follows a dynamic plan's sizes — the WGSL expression that computes it from the
//! sizes in the parameter block (`SIZE_WORD`), so the kernel is one source, one pipeline, at
//! every size. Each `Ext` also carries its value at this run's sizes, which the generators use
//! for their choices and the session for the grid.
//!
//! A generator that prints a value (`{}` of an `Ext`, not of its `n`) makes a kernel shared
//! across sizes; one that prints `n` makes a kernel of this size, which is as correct and only
//! compiles once per size.

use mgn_ir::dynamic::{Poly, MAX_SIZES};
use std::fmt;

/// The parameter-block word of the first dynamic size; the sizes fill the words up to 32.
pub const SIZE_WORD: usize = 32 - MAX_SIZES;

/// A size: its value now, and its WGSL expression when it follows the dynamic sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct Ext {
    pub n: usize,
    expr: Option<String>,
}

impl Ext {
    pub fn lit(n: usize) -> Ext {
        Ext { n, expr: None }
    }

    /// The size `poly` of the dynamic sizes, whose value now is `n`.
    pub fn of(n: usize, poly: &Poly) -> Ext {
        if poly.is_constant() {
            return Ext::lit(n);
        }
        Ext { n, expr: Some(wgsl(poly)) }
    }

    /// `n`, following `poly` when a dynamic plan gives one (an operand's axis: `Operand::dim`).
    pub fn following(n: usize, poly: Option<&Poly>) -> Ext {
        poly.map_or(Ext::lit(n), |p| Ext::of(n, p))
    }

    /// A bound the kernel computes as it runs (`expr`, at most `n`): a chunk's end. Not fixed,
    /// so a loop to it (`norm::strided`) takes its unrolled form at every size.
    pub fn varying(n: usize, expr: &str) -> Ext {
        Ext { n, expr: Some(expr.to_string()) }
    }

    /// Whether it is the same at every size.
    pub fn is_fixed(&self) -> bool {
        self.expr.is_none()
    }

    pub fn mul(&self, other: &Ext) -> Ext {
        match (&self.expr, &other.expr) {
            (None, None) => Ext::lit(self.n * other.n),
            _ if self.n == 1 && self.is_fixed() => other.clone(),
            _ if other.n == 1 && other.is_fixed() => self.clone(),
            _ => Ext { n: self.n * other.n, expr: Some(format!("({self} * {other})")) },
        }
    }

    pub fn add(&self, other: &Ext) -> Ext {
        match (&self.expr, &other.expr) {
            (None, None) => Ext::lit(self.n + other.n),
            _ if self.n == 0 && self.is_fixed() => other.clone(),
            _ if other.n == 0 && other.is_fixed() => self.clone(),
            _ => Ext { n: self.n + other.n, expr: Some(format!("({self} + {other})")) },
        }
    }

    /// `self − other`, for sizes where it is never negative (a window's room in its axis).
    pub fn sub(&self, other: &Ext) -> Ext {
        match (&self.expr, &other.expr) {
            (None, None) => Ext::lit(self.n - other.n),
            _ if other.n == 0 && other.is_fixed() => self.clone(),
            _ => Ext { n: self.n - other.n, expr: Some(format!("({self} - {other})")) },
        }
    }

    /// `⌈self / k⌉` (`k ≥ 1`).
    pub fn div_ceil(&self, k: usize) -> Ext {
        let k = k.max(1);
        match &self.expr {
            None => Ext::lit(self.n.div_ceil(k)),
            Some(_) if k == 1 => self.clone(),
            Some(e) => {
                Ext { n: self.n.div_ceil(k), expr: Some(format!("(({e} + {}u) / {k}u)", k - 1)) }
            }
        }
    }

    pub fn times(&self, k: usize) -> Ext {
        self.mul(&Ext::lit(k))
    }

    /// The product of `sizes` (1 for none).
    pub fn product<'a>(sizes: impl IntoIterator<Item = &'a Ext>) -> Ext {
        sizes.into_iter().fold(Ext::lit(1), |acc, e| acc.mul(e))
    }

    /// Row-major strides of `shape`.
    pub fn strides(shape: &[Ext]) -> Vec<Ext> {
        let mut s = vec![Ext::lit(1); shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1].mul(&shape[i + 1]);
        }
        s
    }
}

/// `(1u + 12u * params.p[7].x * params.p[7].y)`: the polynomial over the size words, as a u32
/// expression (positive terms first, so it never goes below zero on the way).
fn wgsl(poly: &Poly) -> String {
    let term = |c: i64, vars: &[u32]| {
        let mut factors: Vec<String> = vars.iter().map(|&j| size_word(j as usize)).collect();
        if c.unsigned_abs() != 1 || factors.is_empty() {
            factors.insert(0, format!("{}u", c.unsigned_abs()));
        }
        factors.join(" * ")
    };
    let (pos, neg): (Vec<_>, Vec<_>) = poly.terms().iter().partition(|(c, _)| *c > 0);
    let mut out: Vec<String> = pos.iter().map(|(c, v)| term(*c, v)).collect();
    let first = out.join(" + ");
    out.clear();
    let mut text = if first.is_empty() { "0u".to_string() } else { first };
    for (c, v) in neg {
        text = format!("{text} - {}", term(*c, v));
    }
    format!("({text})")
}

/// The WGSL expression of dynamic size `j`'s word in the parameter block.
pub fn size_word(j: usize) -> String {
    let w = SIZE_WORD + j;
    format!("params.p[{}].{}", w / 4, ["x", "y", "z", "w"][w % 4])
}

impl From<usize> for Ext {
    fn from(n: usize) -> Ext {
        Ext::lit(n)
    }
}

impl fmt::Display for Ext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.expr {
            Some(e) => f.write_str(e),
            None => write!(f, "{}u", self.n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_sizes_print_as_numbers_and_dynamic_ones_as_size_words() {
        let bt = Poly::from_terms(vec![(12, vec![0, 1]), (1, vec![])]);
        assert_eq!(Ext::of(25, &bt).to_string(), "(1u + 12u * params.p[7].x * params.p[7].y)");
        let t_minus_1 = Poly::from_terms(vec![(1, vec![1]), (-1, vec![])]);
        assert_eq!(Ext::of(4, &t_minus_1).to_string(), "(params.p[7].y - 1u)");
        let t = Ext::of(5, &Poly::var(1));
        let shape = [Ext::lit(2), t.clone(), Ext::lit(64)];
        let s = Ext::strides(&shape);
        assert_eq!(s[2].to_string(), "1u");
        assert_eq!(s[1].to_string(), "64u");
        assert_eq!(s[0].to_string(), "(64u * (params.p[7].y))");
        assert_eq!(s[0].n, 320);
        assert_eq!(Ext::product(&shape).n, 640);
        assert!(Ext::lit(3).times(4).is_fixed());
    }
}
