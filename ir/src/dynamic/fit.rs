//! Which numbers of a structure depend on the dynamic sizes, and how: the structure (a plan, a
//! GPU program, as JSON) is made at every probe point; a number equal at all of them is a
//! constant, integers that differ are fitted as a multilinear polynomial at the corners
//! (each size at its largest value or one below) and checked at the other points (one near
//! the smallest sizes, one between), and anything else that differs is a misfit, located by
//! its JSON pointer.
//!
//! The check points are far from the corners on purpose: a floor division (`⌈T / 64⌉`, a
//! stride-2 convolution's length) agrees with a line at two neighbouring points, never at
//! three spread ones.

use super::{Poly, SizeVar};
use serde_json::Value;

/// The points a structure is made at: `points[0]` is the bound (every size at its largest),
/// the first `2^S` are the corners, the rest the check points.
#[derive(Clone, Debug, PartialEq)]
pub struct Probes {
    pub points: Vec<Vec<usize>>,
    corners: usize,
}

impl Probes {
    /// The probe points of sizes whose ranges hold at least two values each.
    pub fn new(sizes: &[SizeVar]) -> Probes {
        let s = sizes.len();
        let mut points: Vec<Vec<usize>> = (0..1usize << s)
            .map(|c| {
                (sizes.iter().enumerate())
                    .map(|(j, v)| if c >> j & 1 == 1 { v.max - 1 } else { v.max })
                    .collect()
            })
            .collect();
        let corners = points.len();
        // Near the bottom, but not 1 where avoidable: axes of size 1 are rewritten (a permute
        // of them is a reshape), which would change the structure, not just its numbers.
        let low: Vec<usize> = sizes.iter().map(|v| v.min.max(2).min(v.max)).collect();
        let mid: Vec<usize> = sizes.iter().zip(&low).map(|(v, &l)| (l + v.max) / 2).collect();
        for p in [low, mid] {
            if !points.contains(&p) {
                points.push(p);
            }
        }
        Probes { points, corners }
    }

    /// The corners alone: for structures whose every number is already known to be a
    /// polynomial or is checked at each size it is used at (a backend's program, typed again
    /// at every run's sizes), where the far points would only make other choices.
    pub fn corners(sizes: &[SizeVar]) -> Probes {
        let mut p = Probes::new(sizes);
        p.points.truncate(p.corners);
        p
    }

    /// Every size at its largest: the point a dynamic plan itself is made at.
    pub fn bound(&self) -> &[usize] {
        &self.points[0]
    }
}

/// Why values made at the probe points are not one structure with polynomial numbers.
#[derive(Clone, Debug, PartialEq)]
pub enum Misfit {
    /// They differ in shape (an op, a key, a list's length) at this JSON pointer.
    Structure { at: String },
    /// A number that is not an integer differs (a constant computed from a size).
    NotInteger { at: String },
    /// Integers that no multilinear polynomial of the sizes gives (a floor division, a
    /// minimum): the value at each probe point.
    NotPolynomial { at: String, values: Vec<i64> },
}

impl Misfit {
    /// The JSON pointer of the first difference.
    pub fn at(&self) -> &str {
        match self {
            Misfit::Structure { at } | Misfit::NotInteger { at } => at,
            Misfit::NotPolynomial { at, .. } => at,
        }
    }
}

/// The JSON pointers of the numbers that differ between `values` (one per probe point, in
/// `probes.points` order) with their polynomials, in document order. Only numbers at
/// pointers `may_vary` accepts (sizes, not axes, indices or source columns) may differ.
pub fn fit(
    probes: &Probes,
    values: &[&Value],
    may_vary: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, Poly)>, Misfit> {
    assert_eq!(values.len(), probes.points.len(), "one value per probe point");
    let mut sites = Vec::new();
    let mut walker = Walker { probes, may_vary, sites: &mut sites };
    walker.walk(values, &mut String::new())?;
    Ok(sites)
}

struct Walker<'a> {
    probes: &'a Probes,
    may_vary: &'a dyn Fn(&str) -> bool,
    sites: &'a mut Vec<(String, Poly)>,
}

impl Walker<'_> {
    fn walk(&mut self, values: &[&Value], at: &mut String) -> Result<(), Misfit> {
        let first = values[0];
        if values.iter().all(|v| *v == first) {
            return Ok(());
        }
        let structure = || Misfit::Structure { at: at.clone() };
        match first {
            Value::Object(map) => {
                for v in &values[1..] {
                    let other = v.as_object().ok_or_else(structure)?;
                    if other.len() != map.len() || !other.keys().all(|k| map.contains_key(k)) {
                        return Err(structure());
                    }
                }
                for key in map.keys() {
                    let len = at.len();
                    at.push('/');
                    at.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    let children: Vec<&Value> = values.iter().map(|v| &v[key.as_str()]).collect();
                    self.walk(&children, at)?;
                    at.truncate(len);
                }
                Ok(())
            }
            Value::Array(items) => {
                if values.iter().any(|v| v.as_array().map(Vec::len) != Some(items.len())) {
                    return Err(structure());
                }
                for k in 0..items.len() {
                    let len = at.len();
                    at.push_str(&format!("/{k}"));
                    let children: Vec<&Value> = values.iter().map(|v| &v[k]).collect();
                    self.walk(&children, at)?;
                    at.truncate(len);
                }
                Ok(())
            }
            Value::Number(_) if !(self.may_vary)(at) => Err(structure()),
            Value::Number(_) => {
                let ints: Option<Vec<i64>> = values.iter().map(|v| v.as_i64()).collect();
                let Some(ints) = ints else {
                    return Err(if values.iter().all(|v| v.is_number()) {
                        Misfit::NotInteger { at: at.clone() }
                    } else {
                        structure()
                    });
                };
                let poly = fit_number(self.probes, &ints)
                    .ok_or_else(|| Misfit::NotPolynomial { at: at.clone(), values: ints })?;
                self.sites.push((at.clone(), poly));
                Ok(())
            }
            _ => Err(structure()),
        }
    }
}

/// The multilinear polynomial through the corner values, if it also gives the check points'.
fn fit_number(probes: &Probes, values: &[i64]) -> Option<Poly> {
    let s = probes.corners.trailing_zeros() as usize;
    let full = probes.corners - 1;
    // With y_j = x_j − (max_j − 1) ∈ {0, 1}, corner `c` (bit j set: size j one below its
    // largest) is y = !c. The Möbius transform of f over the y-cube gives the coefficients
    // of Π_{j∈M} y_j ...
    let f = |y: usize| values[!y & full] as i128;
    let mut d = vec![0i128; probes.corners];
    for (m, dm) in d.iter_mut().enumerate() {
        let mut sub = m;
        loop {
            let sign = if (m.count_ones() - sub.count_ones()) % 2 == 0 { 1 } else { -1 };
            *dm += sign * f(sub);
            if sub == 0 {
                break;
            }
            sub = (sub - 1) & m;
        }
    }
    // ... and expanding each Π (x_j − a_j) gives those of the monomials Π_{j∈T} x_j.
    let a: Vec<i128> = (0..s).map(|j| probes.points[full][j] as i128).collect();
    let mut terms = Vec::new();
    for t in 0..probes.corners {
        let mut c: i128 = 0;
        for (m, &dm) in d.iter().enumerate() {
            if m & t != t || dm == 0 {
                continue;
            }
            let rest = m & !t;
            let prod: i128 = (0..s).filter(|j| rest >> j & 1 == 1).map(|j| -a[j]).product();
            c = c.checked_add(dm.checked_mul(prod)?)?;
        }
        let vars: Vec<u32> = (0..s as u32).filter(|j| t >> j & 1 == 1).collect();
        terms.push((i64::try_from(c).ok()?, vars));
    }
    let poly = Poly::from_terms(terms);
    let all_agree = (probes.points.iter().zip(values)).all(|(p, &v)| poly.eval(p) == Some(v));
    all_agree.then_some(poly)
}

/// Writes each site's value at `sizes` into `value` (the structure as made at the bound).
pub fn patch(value: &mut Value, sites: &[(&str, &Poly)], sizes: &[usize]) -> Result<(), String> {
    for (at, poly) in sites {
        let n = poly
            .eval(sizes)
            .filter(|&n| n >= 0)
            .ok_or_else(|| format!("{} is negative or too large at the sizes {sizes:?}", at))?;
        let slot = value.pointer_mut(at).ok_or_else(|| format!("nothing is at {at}"))?;
        if !slot.is_u64() {
            return Err(format!("{at} is not a size"));
        }
        *slot = Value::from(n as u64);
    }
    Ok(())
}
