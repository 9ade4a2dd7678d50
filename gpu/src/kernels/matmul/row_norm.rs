//! The tiled product's side of `GpuOp::NormedProduct` where the product is split along k: a
//! layer norm or RMS norm of A's rows, computed where A is staged instead of by a dispatch of
//! its own before the product. (A whole product sums its rows from the panels it stages
//! instead, `panel_stats`.)
//!
//! Each workgroup first finds the mean and `rstd` of its tile's rows (`row_stats`: two passes
//! over each row, the first summing it less its pilot, `panel_stats::pilot`), then stages
//! `(a − mean) · rstd · weight + bias` where it staged `a`. The weight and bias are loaded with
//! the panel they scale, a panel ahead (`fetched`), so their loads wait with the panel's. The
//! statistics cost each tile two reads of its rows, which every column tile of the product
//! reads again anyway; what goes is the norm's level — its dispatch, the barrier after it, and
//! the normed value's write and reads.

use super::panel_stats::pilot;
use super::{Geometry, RowNorm};
use crate::kernels::{f32_lit, load};

/// Shared memory for the statistics of a tile of at most `bm` rows on `width` invocations:
/// one partial sum an invocation, and a pilot, a mean and `rstd` a row.
pub(super) fn shared_bytes(width: usize, bm: usize) -> usize {
    4 * (width + 3 * bm)
}

/// The declarations of the statistics' shared arrays (`shared_bytes`).
pub(super) fn declarations(bm: usize, width: usize) -> String {
    format!(
        "var<workgroup> nm_red: array<f32, {width}>;\n\
         var<workgroup> nm_mu: array<f32, {bm}>;\n\
         var<workgroup> nm_rs: array<f32, {bm}>;\n\
         var<workgroup> nm_pi: array<f32, {bm}>;\n"
    )
}

/// The mean and `rstd` of each of the tile's `bm` rows (from `m0`) into `nm_mu` and `nm_rs`,
/// and a barrier. Invocations share a row where there are more of them than rows, each
/// summing every `lanes`-th element; a row past m gets mean 0 (its results are never stored).
pub(super) fn row_stats(g: &Geometry, n: &RowNorm, bm: usize, width: usize) -> String {
    let (m, k) = (&g.m, &g.k);
    let lanes = if width >= bm && width.is_multiple_of(bm) { width / bm } else { 1 };
    let a = load(&g.a, &format!("abase + nrow * {k} + nk"));
    // Σ over this invocation's elements of row `nrow` of `term(a)`, into `acc`.
    let sum = |acc: &str, term: &str| {
        format!(
            "        var {acc} = 0.0;\n        \
             if (nrow < {m}) {{\n            \
             for (var nk = nl; nk < {k}; nk = nk + {lanes}u) {{\n                \
             let x = {a};\n                {acc} = {acc} + {term};\n            }}\n        }}\n"
        )
    };
    let (rstd, mean) = (format!("1.0 / sqrt(nss / f32({k}) + {})", f32_lit(n.eps)), "nmean");
    // A layer norm's rows are summed less their pilot (`panel_stats::pilot`): the
    // difference of two nearby floats is exact, where a row far from zero mean would lose the
    // digits of its mean that its spread needs. `nm_mu` holds the mean less the pilot.
    let centered = if n.center { "(x - npilot - nmean) * (x - npilot - nmean)" } else { "x * x" };
    let mut s = String::from("    {\n");
    if lanes == 1 {
        // An invocation a row, for as many rows as it takes.
        s += &format!("    for (var nr = t; nr < {bm}u; nr = nr + {width}u) {{\n");
        s += "        let nrow = m0 + nr;\n        let nl = 0u;\n";
        if n.center {
            s += &format!("        let npilot = {};\n", pilot(g, &format!("min(nrow, {m} - 1u)")));
            s += &sum("ns", "x - npilot");
            s += &format!("        let nmean = ns / f32({k});\n        nm_pi[nr] = npilot;\n");
        } else {
            s += "        let nmean = 0.0;\n";
        }
        s += &sum("nss", centered);
        s += &format!("        nm_mu[nr] = {mean};\n        nm_rs[nr] = {rstd};\n    }}\n");
    } else {
        // `lanes` invocations a row; each pass's partial sums meet in `nm_red`.
        let gather = |acc: &str| {
            let terms: Vec<String> =
                (0..lanes).map(|j| format!("nm_red[nr * {lanes}u + {j}u]")).collect();
            format!(
                "        nm_red[t] = {acc};\n        workgroupBarrier();\n        \
                 let {acc}_all = {};\n        workgroupBarrier();\n",
                terms.join(" + ")
            )
        };
        s += &format!(
            "        let nl = t % {lanes}u;\n        let nr = t / {lanes}u;\n        \
             let nrow = m0 + nr;\n"
        );
        if n.center {
            s += &format!("        let npilot = {};\n", pilot(g, &format!("min(nrow, {m} - 1u)")));
            s += &sum("ns", "x - npilot");
            s += &gather("ns");
            s += &format!("        let nmean = ns_all / f32({k});\n");
            s += "        if (nl == 0u) { nm_pi[nr] = npilot; }\n";
        } else {
            s += "        let nmean = 0.0;\n";
        }
        s += &sum("nss_part", centered);
        s += &gather("nss_part");
        s += "        let nss = nss_part_all;\n";
        s += &format!("        if (nl == 0u) {{ nm_mu[nr] = {mean}; nm_rs[nr] = {rstd}; }}\n");
    }
    // Every row's statistics are in before any panel is staged.
    s + "    }\n    workgroupBarrier();\n"
}

/// The loads of the norm's weight (`nw{p}`) and bias (`nb{p}`) at the depth of A's slot `p`
/// in the panel at `k0`: a depth past k reads the last element (what it stages is zeroed).
pub(super) fn fetched(g: &Geometry, n: &RowNorm, p: usize, k0: &str) -> String {
    let at = format!("min(koff + {k0} + ak{p}, {} - 1u)", g.k);
    loads(n, (&format!("nw{p}"), &format!("nb{p}")), &at)
}

/// The loads of the norm's weight and bias (those it has) at depth `at` into the registers
/// `regs` (weight, bias).
pub(super) fn loads(n: &RowNorm, (w_reg, b_reg): (&str, &str), at: &str) -> String {
    let mut s = String::new();
    if let Some(w) = &n.weight {
        s += &format!("        {w_reg} = {};\n", load(w, at));
    }
    if let Some(b) = &n.bias {
        s += &format!("        {b_reg} = {};\n", load(b, at));
    }
    s
}

/// A's element `v` of slot `p` as staged, normed: with the statistics of its row and the
/// weight and bias slot `source` fetched for its depth. Where the panel overhangs k (or this
/// k range), the element stays zero, as the unnormed product stages it; `panel` is which
/// panel the registers hold, each `bk` deep.
pub(super) fn staged(
    g: &Geometry,
    n: &RowNorm,
    v: &str,
    (p, source): (usize, usize),
    (panel, bk): (&str, usize),
) -> String {
    let centered =
        if n.center { format!("({v} - nm_pi[ar{p}] - nm_mu[ar{p}])") } else { format!("({v})") };
    let mut normed = format!("{centered} * nm_rs[ar{p}]");
    if n.weight.is_some() {
        normed = format!("{normed} * nw{source}");
    }
    if n.bias.is_some() {
        normed = format!("{normed} + nb{source}");
    }
    let overhangs = !g.k.is_fixed() || !g.k.n.is_multiple_of(bk) || g.splits > 1;
    if overhangs {
        let klen = if g.splits > 1 { "klen".to_string() } else { g.k.to_string() };
        format!("select(0.0, {normed}, {panel} * {bk}u + ak{p} < {klen})")
    } else {
        normed
    }
}
