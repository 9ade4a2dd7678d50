//! A normed product's row statistics taken from the panels its main loop stages, instead of a
//! pass over its rows before the first panel (`row_norm::row_stats`). Measured on an H100,
//! that pass — a loop of dependent loads over each tile's rows — cost more than the norm's
//! level it saved (docs/benchmarks/); the staged elements are every element of the tile's
//! rows anyway, one panel at a time, so each invocation sums the ones it stages and the sums
//! meet in shared memory after the loop.
//!
//! The normalisation cannot be applied while staging, since the mean and `rstd` are known only
//! at the end; it is applied to the results instead. With `d = a − p` for a pilot `p` of the
//! row, the staged element `d · γ_k` and the accumulator `acc = Σ_k d_ik γ_k W_kj`:
//!
//! ```text
//! Σ_k ((a_ik − μ_i) · r_i · γ_k + β_k) · W_kj = r_i · (acc_ij − μ'_i · g_j) + h_j
//! ```
//!
//! where `μ' = mean(d) = μ − p`, `g_j = Σ_k γ_k W_kj` and `h_j = Σ_k β_k W_kj`, the columns'
//! sums, taken from B's staged panels the same way. An RMS norm has no mean: `d = a` and the
//! result is `r_i · acc_ij`.
//!
//! The pilot is why this is as exact as two passes: `var = Σd²/K − μ'²` loses digits in
//! proportion to `(μ'/σ)²`, and `acc − μ'·g` in proportion to `μ'/σ`. With `p` the mean of the
//! row's first 16 elements, `μ'` is a fraction of `σ` even for rows far from zero mean or with
//! one large channel, where the raw sums (`p = 0`) would lose most of the variance.
//!
//! Only a whole product: a k range sees only part of each row (split products keep the
//! pass of their own).

use super::{Geometry, RowNorm};
use crate::kernels::{f32_lit, load};

/// Elements of a row whose mean is its pilot.
const PILOT: usize = 16;

/// The pilot of A's row `row` (see the module header): the mean of its first elements, summed
/// in one order wherever it is computed, so that every invocation finds the same value.
pub(super) fn pilot(g: &Geometry, row: &str) -> String {
    let k = &g.k;
    let count = PILOT.min(k.n.max(1));
    // A dynamic k is at least 1; read within it.
    let terms: Vec<String> = (0..count)
        .map(|j| load(&g.a, &format!("abase + {row} * {k} + min({j}u, {k} - 1u)")))
        .collect();
    format!("({}) / {}", terms.join(" + "), f32_lit(count as f64))
}

/// `g`'s norm where it takes its statistics from the staged panels (see the module header):
/// a whole product's.
pub(super) fn of(g: &Geometry) -> Option<&RowNorm> {
    g.norm.as_ref().filter(|_| g.splits == 1)
}

/// Shared memory beside the panels: a mean and `rstd` a row, and for a layer norm its column
/// sums (`g`, and `h` with a bias).
pub(super) fn shared_bytes(n: &RowNorm, bm: usize, bn: usize) -> usize {
    let columns = usize::from(n.center) + usize::from(n.center && n.bias.is_some());
    4 * (2 * bm + columns * bn)
}

/// The shared arrays (`shared_bytes`).
pub(super) fn declarations(n: &RowNorm, bm: usize, bn: usize) -> String {
    let mut s = format!(
        "var<workgroup> nm_mu: array<f32, {bm}>;\nvar<workgroup> nm_rs: array<f32, {bm}>;\n"
    );
    if n.center {
        s += &format!("var<workgroup> nm_g: array<f32, {bn}>;\n");
    }
    if n.center && n.bias.is_some() {
        s += &format!("var<workgroup> nm_h: array<f32, {bn}>;\n");
    }
    s
}

/// Before the loop: each row's pilot into `nm_mu` (a layer norm's; a row past m has 0), and
/// every slot's sums at zero. `slots` are A's slot count and, for each of B's slots, the slot
/// whose depth it reads (its own, or slot 0's: they share the norm's weight and bias there).
pub(super) fn setup(
    g: &Geometry,
    n: &RowNorm,
    bm: usize,
    width: usize,
    slots: (usize, &[usize]),
) -> String {
    let mut s = String::new();
    for p in 0..slots.0 {
        s += &format!("    var nq{p} = 0.0;\n");
    }
    if !n.center {
        return s;
    }
    s += &format!(
        "    for (var nr = t; nr < {bm}u; nr = nr + {width}u) {{\n        \
         let nrow = m0 + nr;\n        var pilot = 0.0;\n        \
         if (nrow < {}) {{ pilot = {}; }}\n        nm_mu[nr] = pilot;\n    }}\n    \
         workgroupBarrier();\n",
        g.m,
        pilot(g, "nrow")
    );
    for p in 0..slots.0 {
        s += &format!("    let np{p} = nm_mu[min(ar{p}, {}u)];\n    var ns{p} = 0.0;\n", bm - 1);
    }
    for (q, &source) in slots.1.iter().enumerate() {
        s += &format!("    var ng{q} = 0.0; var nh{q} = 0.0;\n");
        if source == q {
            s += &format!("    var gw{q} = 1.0; var gb{q} = 0.0;\n");
        }
    }
    s
}

/// The statements that stage A's element `v` of slot `p` (`target` the shared word): `d` summed
/// and staged times the norm's weight (slot `source`'s, the same depth). Past k, `d` is 0;
/// `panel` is which panel the registers hold, `bk` deep.
pub(super) fn stage_a(
    g: &Geometry,
    n: &RowNorm,
    v: &str,
    (p, source): (usize, usize),
    (panel, bk): (&str, usize),
    target: &str,
) -> String {
    let mut d = if n.center { format!("{v} - np{p}") } else { v.to_string() };
    if n.center && (!g.k.is_fixed() || !g.k.n.is_multiple_of(bk)) {
        d = format!("select(0.0, {d}, {panel} * {bk}u + ak{p} < {})", g.k);
    }
    let mut s = format!("{{ let d{p} = {d}; nq{p} = nq{p} + d{p} * d{p};");
    if n.center {
        s += &format!(" ns{p} = ns{p} + d{p};");
    }
    let scaled = if n.weight.is_some() { format!("d{p} * nw{source}") } else { format!("d{p}") };
    s + &format!(" {target} = {scaled}; }}")
}

/// For a layer norm, B's element `v` of slot `q` into its column's sums, with the weight and
/// bias slot `source` loaded for its depth (a word past k or n was fetched as 0).
pub(super) fn stage_b(n: &RowNorm, v: &str, (q, source): (usize, usize)) -> String {
    if !n.center {
        return String::new();
    }
    let mut s = format!(" ng{q} = ng{q} + gw{source} * ({v});");
    if n.bias.is_some() {
        s += &format!(" nh{q} = nh{q} + gb{source} * ({v});");
    }
    s
}

/// For a layer norm, the loads of its weight and bias at the depth of B's slot `q` in the
/// panel at `k0` (a depth past k reads the last element; B's word there is 0).
pub(super) fn fetched_b(g: &Geometry, n: &RowNorm, q: usize, k0: &str) -> String {
    if !n.center {
        return String::new();
    }
    let at = format!("min({k0} + bk{q}, {} - 1u)", g.k);
    super::row_norm::loads(n, (&format!("gw{q}"), &format!("gb{q}")), &at)
}

/// Where each slot's sums meet after the loop: (A's slots and their guard, B's slots and their
/// guard, the panels' row strides in vec4s).
pub(super) struct Meeting<'a> {
    pub a: (usize, Option<usize>),
    pub b: (usize, Option<usize>),
    pub strides: (usize, usize),
    pub tile: (usize, usize, usize),
    pub width: usize,
    pub k: &'a crate::kernels::Ext,
}

impl Meeting<'_> {
    /// Each slot's `sum` written where it staged its elements (A's into `mm_a`, B's into
    /// `mm_b`), then the `tile.2` partial sums of each row (column) added up by one invocation
    /// into `row` (`col`), between barriers.
    fn round(&self, a_sum: &str, b_sum: Option<&str>, row: &str, col: &str) -> String {
        let (bm, bn, bk) = self.tile;
        let guarded = |x: &str, p: usize, size: Option<usize>, st: String| match size {
            Some(size) => format!("    if ({x}e{p} < {size}u) {{ {st} }}\n"),
            None => format!("    {st}\n"),
        };
        let mut s = String::from("    workgroupBarrier();\n");
        for p in 0..self.a.0 {
            s += &guarded("a", p, self.a.1, format!("mm_a[as{p}][ac{p}] = {a_sum}{p};"));
        }
        if let Some(sum) = b_sum {
            for q in 0..self.b.0 {
                s += &guarded("b", q, self.b.1, format!("mm_b[bs{q}][bq{q}] = {sum}{q};"));
            }
        }
        s += "    workgroupBarrier();\n";
        let add = |buf: &str, stride: usize, i: &str| -> String {
            let terms: Vec<String> =
                (0..bk).map(|kk| format!("{buf}[{}u + {i} / 4u][{i} % 4u]", kk * stride)).collect();
            terms.join(" + ")
        };
        // One invocation a row (column), for as many as it takes: its partial sums added.
        let each = |i: &str, extent: usize, buf: &str, stride: usize, then: &str| {
            format!(
                "    for (var {i} = t; {i} < {extent}u; {i} = {i} + {}u) {{\n        \
                 let sum = {};\n{then}    }}\n",
                self.width,
                add(buf, stride, i)
            )
        };
        s += &each("nr", bm, "mm_a", self.strides.0, row);
        if b_sum.is_some() {
            s += &each("nc", bn, "mm_b", self.strides.1, col);
        }
        s
    }
}

/// After the loop: every row's `μ'` and `rstd` into `nm_mu` and `nm_rs`, and for a layer norm
/// each column's `g` (and with a bias `h`) into `nm_g` (`nm_h`), then a barrier.
pub(super) fn meet(n: &RowNorm, at: &Meeting) -> String {
    let k = at.k;
    let rstd = |var: &str| format!("1.0 / sqrt({var} + {})", f32_lit(n.eps));
    let mut s = String::new();
    if n.center {
        // Round one: the sums of d (over the pilots, which are no longer needed) and g.
        let (mu, g) = ("        nm_mu[nr] = sum;\n", "        nm_g[nc] = sum;\n");
        s += &at.round("ns", Some("ng"), mu, g);
        let stats = format!(
            "        let mu = nm_mu[nr] / f32({k});\n        \
             let nvar = max(sum / f32({k}) - mu * mu, 0.0);\n        \
             nm_mu[nr] = mu;\n        nm_rs[nr] = {};\n",
            rstd("nvar")
        );
        // Round two: the sums of d² and, with a bias, h.
        let h = n.bias.is_some().then_some("nh");
        s += &at.round("nq", h, &stats, "        nm_h[nc] = sum;\n");
    } else {
        let stats = format!("        nm_rs[nr] = {};\n", rstd(&format!("sum / f32({k})")));
        s += &at.round("nq", None, &stats, "");
    }
    s + "    workgroupBarrier();\n"
}

/// Register `c` of the results at tile row `row` and columns `col`.. `col + 3`, normed.
pub(super) fn corrected(n: &RowNorm, c: &str, row: &str, col: &str) -> String {
    if !n.center {
        return format!("        {c} = nm_rs[{row}] * {c};\n");
    }
    let v = |arr: &str| {
        let parts: Vec<String> = (0..4).map(|j| format!("{arr}[{col} + {j}u]")).collect();
        format!("vec4<f32>({})", parts.join(", "))
    };
    let h = if n.bias.is_some() { format!(" + {}", v("nm_h")) } else { String::new() };
    format!("        {c} = nm_rs[{row}] * ({c} - nm_mu[{row}] * {}){h};\n", v("nm_g"))
}
