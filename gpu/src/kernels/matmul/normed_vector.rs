//! The few-columns kernel's side of `GpuOp::NormedProduct`: one-token decoding's products of a
//! normed activation by a weight (`[n ≤ 8, k] · Wᵀ`, run swapped: B is the activation, each of
//! its columns one normed row). Every workgroup reads the whole activation anyway, once per
//! weight row it owns, and the activation is small (SmolLM2's 576 values a token), so each
//! workgroup first finds its columns' statistics in a pass of its own over them, then reads
//! `(x − μ) · r · γ + β` in place of `x` in the main loop. That pass is a few loads an
//! invocation and one reduction; the norm's own dispatch, which it replaces, is a level with a
//! barrier (~5 µs on an H100) in front of every product of the layer.
//!
//! A layer norm's statistics take two passes (the mean, then the squares about it), so that a
//! row far from zero mean keeps its variance's digits; an RMS norm's take one.

use super::{reduce_lanes, Geometry, RowNorm};
use crate::kernels::{f32_lit, load};

/// The statistics' pass (see the module header), for B's `n` columns of `k`: each column `j`
/// gets `p{j}` and `mu{j}` (its first element, and its mean less that; both 0 for an RMS norm)
/// and `rs{j}`, its reciprocal standard deviation. Uses `mm_red` (`n · width` f32s), and
/// leaves it free for the main loop's reduction.
pub(super) fn statistics(g: &Geometry, norm: &RowNorm, width: usize) -> String {
    let (k, n) = (&g.k, g.n.n);
    let sum_over = |term: &dyn Fn(usize) -> String| {
        let mut s = String::new();
        for j in 0..n {
            s.push_str(&format!(
                "    {{\n        var s = 0.0;\n        \
                 for (var e = t; e < {k}; e = e + {width}u) {{\n            \
                 let v = {};\n            s = s + {};\n        }}\n        \
                 mm_red[{o}u + t] = s;\n    }}\n",
                load(&g.b, &g.b_at("e", &format!("{j}u"))),
                term(j),
                o = j * width,
            ));
        }
        // The tree over the whole workgroup; `lane` is the invocation here.
        s.push_str("    {\n    let lane = t;\n");
        reduce_lanes(&mut s, width, 1, n, width);
        s.push_str("    }\n    workgroupBarrier();\n");
        s
    };
    let kf = format!("f32({k})");
    let mut s = String::new();
    if norm.center {
        // Sums of `v − p`, `p` the column's first element: a row far from zero mean (300 ± 1)
        // would lose its mean's last digits in a sum of the raw values, and every normed
        // element with them.
        for j in 0..n {
            s += &format!("    let p{j} = {};\n", load(&g.b, &g.b_at("0u", &format!("{j}u"))));
        }
        s += &sum_over(&|j| format!("(v - p{j})"));
        for j in 0..n {
            s += &format!("    let mu{j} = mm_red[{}u] / {kf};\n", j * width);
        }
        // Every invocation has read the sums before any overwrites them.
        s += "    workgroupBarrier();\n";
        s += &sum_over(&|j| format!("(v - p{j} - mu{j}) * (v - p{j} - mu{j})"));
    } else {
        s += &sum_over(&|_| "v * v".into());
        for j in 0..n {
            s += &format!("    let p{j} = 0.0;\n    let mu{j} = 0.0;\n");
        }
    }
    for j in 0..n {
        s += &format!(
            "    let rs{j} = inverseSqrt(mm_red[{}u] / {kf} + {});\n",
            j * width,
            f32_lit(norm.eps)
        );
    }
    // The main loop's reduction reuses `mm_red`.
    s += "    workgroupBarrier();\n";
    s
}

/// The normed value of B's column `j` at `kk`, whose raw value is `v`.
pub(super) fn normed(norm: &RowNorm, v: &str, kk: &str, j: usize) -> String {
    let mut s = format!("(({v}) - p{j} - mu{j}) * rs{j}");
    if let Some(w) = &norm.weight {
        s = format!("{s} * {}", load(w, &format!("({kk})")));
    }
    if let Some(b) = &norm.bias {
        s = format!("({s} + {})", load(b, &format!("({kk})")));
    }
    match norm.rounded {
        Some(h) => crate::halves::round(h, &s),
        None => s,
    }
}

/// Whether the normed product `g` runs here: a few rows (at most `SKINNY`) by a transposed
/// 2-D weight of more columns than that, whole, neither operand packed (a packed weight's rows
/// take `packed_rows`, which reads no norm).
pub(super) fn takes(g: &Geometry) -> bool {
    g.m.n <= super::SKINNY
        && g.n.n > super::SKINNY
        && g.bt
        && !g.at
        && g.batch.is_empty()
        && g.splits == 1
        && g.k.is_fixed()
        && !g.a.dtype.is_packed()
        && !g.b.dtype.is_packed()
}
