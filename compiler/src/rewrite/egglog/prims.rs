//! The primitives `rules.egg` calls: permutations, shapes and constant folding, over the strings
//! types travel as in the e-graph (`"8,128,384"`, `"0,2,1"`, `"f32"`).

use super::names::{binary_of, dtype_of, unary_of};
use egglog::sort::{F, S};
use egglog::{add_primitive, EGraph};
use mgn_ir::pointwise;

/// `"8,128,384"` → `[8, 128, 384]`; `""` is a scalar's shape.
pub(super) fn dims(s: &str) -> Vec<usize> {
    s.split(',').filter(|d| !d.is_empty()).map(|d| d.parse().unwrap_or(usize::MAX)).collect()
}

/// `[8, 128, 384]` → `"8,128,384"`.
pub(super) fn text(v: &[usize]) -> String {
    v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

/// `permute(permute(x, q), p)` permutes x by `composed[a] = q[p[a]]`.
fn perm_then(q: &[usize], p: &[usize]) -> Vec<usize> {
    p.iter().map(|&a| q.get(a).copied().unwrap_or(usize::MAX)).collect()
}

/// The shape of `permute(x, p)` for `x` of shape `s`.
fn permuted(s: &[usize], p: &[usize]) -> Vec<usize> {
    p.iter().map(|&a| s.get(a).copied().unwrap_or(0)).collect()
}

/// Whether permuting a tensor of shape `s` by `p` keeps its elements in order: the axes longer
/// than 1 keep their relative order, only axes of size 1 move.
fn moves_only_unit_axes(s: &[usize], p: &[usize]) -> bool {
    let kept: Vec<usize> =
        p.iter().copied().filter(|&a| s.get(a).is_some_and(|&n| n != 1)).collect();
    p.len() == s.len() && kept.windows(2).all(|w| w[0] < w[1])
}

/// `f(a)` as the backends compute a constant of dtype `d` (in f32), when `d` is a float and the
/// result finite.
fn fold_unary(f: &str, d: &str, a: f64) -> Option<f64> {
    let (op, dtype) = (unary_of(f)?, dtype_of(d)?);
    let y = pointwise::unary(op, a as f32) as f64;
    (dtype.is_float() && y.is_finite()).then_some(y)
}

/// `a f b` as the backends compute constants of dtype `d` (in f32), when `d` is a float and the
/// result finite.
fn fold_binary(f: &str, d: &str, a: f64, b: f64) -> Option<f64> {
    let (op, dtype) = (binary_of(f)?, dtype_of(d)?);
    let y = pointwise::binary(op, a as f32, b as f32) as f64;
    (dtype.is_float() && y.is_finite()).then_some(y)
}

/// Registers the primitives; `rules.egg` is parsed after this.
pub(super) fn register(eg: &mut EGraph) {
    add_primitive!(
        eg,
        "perm-then" = |q: S, p: S| -> S { S::new(text(&perm_then(&dims(&q), &dims(&p)))) }
    );
    add_primitive!(eg, "perm-identity" = |p: S| -?> () {
        dims(&p).iter().enumerate().all(|(a, &b)| a == b).then_some(())
    });
    add_primitive!(
        eg,
        "permute-shape" = |s: S, p: S| -> S { S::new(text(&permuted(&dims(&s), &dims(&p)))) }
    );
    add_primitive!(eg, "unit-moves" = |s: S, p: S| -?> () {
        moves_only_unit_axes(&dims(&s), &dims(&p)).then_some(())
    });
    add_primitive!(eg, "numel" = |s: S| -> i64 { dims(&s).iter().product::<usize>() as i64 });
    add_primitive!(eg, "fold-unary" = |f: S, d: S, a: F| -?> F {
        fold_unary(&f, &d, a.0 .0).map(|y| F::new(y.into()))
    });
    add_primitive!(eg, "fold-binary" = |f: S, d: S, a: F, b: F| -?> F {
        fold_binary(&f, &d, a.0 .0, b.0 .0).map(|y| F::new(y.into()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_compose_and_unit_moves_are_found() {
        // A transpose of a transpose is the identity; [0, 2, 1] after [1, 0, 2] is [1, 2, 0].
        assert_eq!(perm_then(&[1, 0], &[1, 0]), vec![0, 1]);
        assert_eq!(perm_then(&[1, 0, 2], &[0, 2, 1]), vec![1, 2, 0]);
        assert_eq!(permuted(&[2, 3, 4], &[2, 0, 1]), vec![4, 2, 3]);
        // [1, T, H, D] → [T, 1, H, D] moves only the unit axis; [B, T, H, D] → [B, H, T, D]
        // moves T past H.
        assert!(moves_only_unit_axes(&[1, 5, 2, 4], &[1, 0, 2, 3]));
        assert!(moves_only_unit_axes(&[2, 1, 3, 4], &[0, 2, 1, 3]));
        assert!(!moves_only_unit_axes(&[2, 5, 3, 4], &[0, 2, 1, 3]));
        assert_eq!(dims(""), Vec::<usize>::new());
        assert_eq!(text(&dims("8,128,384")), "8,128,384");
    }

    #[test]
    fn constants_fold_in_f32_and_only_to_finite_floats() {
        assert_eq!(fold_binary("add", "f32", 0.1, 0.2), Some((0.1f32 + 0.2f32) as f64));
        assert_eq!(fold_binary("div", "f32", 1.0, 0.0), None);
        assert_eq!(fold_binary("add", "i32", 1.0, 2.0), None);
        assert_eq!(fold_unary("neg", "f32", 2.0), Some(-2.0));
        assert_eq!(fold_unary("log", "f32", -1.0), None);
    }
}
