//! Matrix products on the device's cooperative-matrix units (`VK_KHR_cooperative_matrix`): f16
//! operands into f32 accumulators, which is what the mixed policies ask of every product
//! whose operands they round to f16 (`compiler/src/precision.rs`).
//!
//! A workgroup of `SM × SN` subgroups owns a `bm × bn` output tile, and subgroup `s` a block
//! of `RM × RN` of the device's `T × T` tiles in it. Panels `2T` deep of A and B are fetched a
//! panel ahead into registers (as the tiled kernel does) and converted to f16 as they are
//! staged into shared memory — exactly: the values are f16 already, halves or f32 values the
//! policy rounds — and each subgroup loads its tiles from there and multiplies them into its
//! accumulators. Results leave through a `T × T` f32 scratch per subgroup, so each element is
//! stored through the same edge guards, scale and epilogue as every other product kernel's.
//!
//! Which subgroup owns which block is read from `subgroup_id`, so the kernel is written for a
//! device whose subgroups have one fixed size (`DeviceLimits::subgroup_size`): the workgroup
//! is exactly `SM · SN` of them.

use super::panels::{moved_slot, registers, Panels};
use super::{split_depth_of, Geometry};
use crate::kernels::{f16_view_decl, word_half, Coop, Ext, KernelSource};
use mgn_ir::DType;

/// The subgroup grid of a workgroup (`sm × sn` subgroups), each subgroup's block of tiles
/// (`rm × rn`), and the panels' depth in tiles — for the products and the convolutions alike.
/// Panels two tiles deep, and blocks of 2×2 tiles on 2×4 subgroups for products where that
/// fits (`grid_for`), 2×2 subgroups elsewhere and for convolutions. In a test build,
/// `MGN_COOP_GRID=SMxSN:RMxRN:D` sets another for the `matmul_throughput` sweep
/// (`bench/coop_sweep.sh`), as `MGN_MM_TILE` does the tiled kernel's; a release build reads
/// neither.
///
/// The grids on an H100 (docs/benchmarks/): larger blocks a subgroup (4×4, or 2×4 on 4×2
/// subgroups) take 200–255 registers an invocation and run some shapes 3–10× slower; the 2×4
/// subgroups of 2×2 tiles are the fastest or near it on every workload shape measured.
///
/// Each panel is fetched into registers while the one before it is multiplied. Staging each
/// panel straight into shared memory in its own iteration instead (one B tile live at a time)
/// was measured on an H100 and lost on every shape, 1.1–12× (docs/benchmarks/2026-12-06.md,
/// "Cooperative-matrix products: where the time goes"), so it was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CoopGrid {
    pub sm: usize,
    pub sn: usize,
    pub rm: usize,
    pub rn: usize,
    pub depth: usize,
}

impl CoopGrid {
    const DEFAULT: CoopGrid = CoopGrid { sm: 2, sn: 2, rm: 2, rn: 2, depth: 2 };
    /// The products' grid where it fits: 2×4 subgroups of 2×2 tiles (64 × 128 outputs a
    /// workgroup). On an H100 it ran every workload's product measured 1.0–3.2× faster than
    /// the 2×2 grid (docs/benchmarks/2026-12-06.md, "Cooperative-matrix products: where the time
    /// goes").
    const WIDE: CoopGrid = CoopGrid { sn: 4, ..CoopGrid::DEFAULT };

    /// The override `MGN_COOP_GRID` asks for in a test build (the sweep's), if any.
    fn asked() -> Option<CoopGrid> {
        #[cfg(test)]
        return std::env::var("MGN_COOP_GRID").ok().and_then(|v| CoopGrid::parse(&v));
        #[cfg(not(test))]
        None
    }

    /// The grid convolutions are generated with.
    pub(crate) fn current() -> CoopGrid {
        CoopGrid::asked().unwrap_or(CoopGrid::DEFAULT)
    }

    /// `SMxSN:RMxRN:D`, every number at least 1.
    #[cfg(test)]
    fn parse(v: &str) -> Option<CoopGrid> {
        let pair = |p: &str| -> Option<(usize, usize)> {
            let (a, b) = p.split_once('x')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        let mut parts = v.split(':');
        let (sm, sn) = pair(parts.next()?)?;
        let (rm, rn) = pair(parts.next()?)?;
        let depth = parts.next()?.parse().ok()?;
        let g = CoopGrid { sm, sn, rm, rn, depth };
        let all = [sm, sn, rm, rn, depth];
        (parts.next().is_none() && all.iter().all(|&x| x >= 1)).then_some(g)
    }

    /// Subgroups in a workgroup.
    pub(crate) fn subgroups(&self) -> usize {
        self.sm * self.sn
    }

    /// The workgroup's output tile and panel depth for the device's `t × t` tiles:
    /// `(bm, bn, bk)`.
    pub(crate) fn extents(&self, t: usize) -> (usize, usize, usize) {
        (self.sm * self.rm * t, self.sn * self.rn * t, self.depth * t)
    }
}
/// A quiet NaN: what a kernel stores when its workgroup did not get the subgroups it was
/// written for (`subgroup_guard`).
pub(crate) const NAN: &str = "bitcast<f32>(0x7fc00000u)";

/// Statements defining `sid`, the subgroup's number clamped into the grid (so that its
/// scratch and tiles stay inside the workgroup's memory whatever the driver did), and `whole`,
/// whether the workgroup has exactly the grid's subgroups: a driver that gave a pipeline
/// another subgroup size than the device reports (Vulkan allows it where the sizes vary, and
/// the kernel is only chosen where they do not) makes every result NaN instead of writing out
/// of bounds.
pub(crate) fn subgroup_guard(id: &str, count: &str, sid: &str, whole: &str, n: usize) -> String {
    format!("let {sid} = min({id}, {}u);\n    let {whole} = {count} == {n}u;", n - 1)
}

/// Halves of padding after each staged row: rows stay 16-byte aligned for the tile loads and
/// start in different banks.
const PAD: usize = 8;

/// The grid `g` runs on cooperative matrices with, if it does: both operands f16 (stored as
/// halves or rounded from f32), a workgroup of `SM · SN` subgroups within `width` invocations,
/// and its panels within `shared` bytes. The grid is `MGN_COOP_GRID`'s, else the wide one where
/// it fits (22 KiB of shared memory at 16 × 16 tiles, above the 16 KiB floor), else the 2×2
/// one. Products of a few rows or columns keep the skinny kernels (the caller picks those
/// first): they are bandwidth-bound, and a tile would be mostly padding.
///
/// Every plan's f16 products take them, inference and training alike. On an H100 an
/// inference plan's (weights held as halves, staged with no conversion) ran 1.2–3.3× faster
/// than the tiled kernel on every workload shape measured (Whisper's fc1 45 µs against 78). A
/// training plan's read two rounded views (its parameters stay f32), each element rounded as
/// it is staged: with the rounding written out in software the tiles lost there as often as
/// they won (SmolLM2's forward + backward 1.07–1.17×), and with the device's own conversion
/// (`device::rounding`, which the H100 passes) they take the training cells of the four
/// transformer workloads to 0.68–0.88 (docs/benchmarks/2026-12-06.md,
/// "Tensor cores for training products").
pub(super) fn grid_for(g: &Geometry, coop: Coop, width: usize, shared: usize) -> Option<CoopGrid> {
    if g.a.dtype != DType::F16 || g.b.dtype != DType::F16 || g.ot {
        return None;
    }
    let fit = |grid: CoopGrid| {
        let s = Shape::of(g, coop, grid);
        (s.width <= width && s.shared_bytes() <= shared).then_some(grid)
    };
    match CoopGrid::asked() {
        Some(grid) => fit(grid),
        None => fit(CoopGrid::WIDE).or_else(|| fit(CoopGrid::DEFAULT)),
    }
}

/// The kernel's sizes.
struct Shape {
    grid: CoopGrid,
    t: usize,
    subgroup: usize,
    width: usize,
    bm: usize,
    bn: usize,
    bk: usize,
    /// Row strides of the staged panels, in halves.
    sa: usize,
    sb: usize,
    /// Which panel elements each invocation moves, and where the tiles overhang.
    p: Panels,
    tiles_n: Ext,
    per_batch: Ext,
    /// Panels along k (of one k range when split), and that range's depth.
    kt: Ext,
}

impl Shape {
    fn of(g: &Geometry, coop: Coop, grid: CoopGrid) -> Shape {
        let (t, subgroup) = (coop.tile as usize, coop.subgroup as usize);
        let width = grid.subgroups() * subgroup;
        let (bm, bn, bk) = grid.extents(t);
        let tiles_n = g.n.div_ceil(bn);
        let ks = if g.splits > 1 { split_depth_of(&g.k, g.splits) } else { g.k.clone() };
        Shape {
            grid,
            t,
            subgroup,
            width,
            bm,
            bn,
            bk,
            sa: bk + PAD,
            sb: bn + PAD,
            p: Panels::of(g, (bm, bn, bk), width),
            per_batch: g.m.div_ceil(bm).mul(&tiles_n),
            tiles_n,
            kt: ks.div_ceil(bk),
        }
    }

    fn shared_bytes(&self) -> usize {
        2 * (self.bm * self.sa + self.bk * self.sb) + 4 * self.grid.subgroups() * self.t * self.t
    }

    /// `coop_mat{T}x{T}<scalar, role>`.
    fn matrix(&self, scalar: &str, role: &str) -> String {
        format!("coop_mat{t}x{t}<{scalar},{role}>", t = self.t)
    }
}

/// The cooperative-matrix kernel for `g` on `grid` (`grid_for`'s). Operands held as halves are
/// read through the arena's f16 view (`Operand::f16_view`): their elements are staged as they
/// are loaded, with no conversion.
pub(super) fn coop_with(g: &Geometry, coop: Coop, grid: CoopGrid) -> KernelSource {
    let mut viewed = g.clone();
    for o in [&mut viewed.a, &mut viewed.b] {
        o.f16_view = o.packs_halves();
    }
    let g = &viewed;
    let s = Shape::of(g, coop, grid);
    let groups = s.per_batch.mul(&g.batches()).times(g.splits);
    let view = f16_view_decl(&[&g.a, &g.b]);
    let mut body = format!(
        "enable f16;
enable wgpu_cooperative_matrix;
{view}var<workgroup> cm_a: array<f16, {}>;
var<workgroup> cm_b: array<f16, {}>;
var<workgroup> cm_c: array<f32, {}>;
@compute @workgroup_size({})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) grid: vec3<u32>, \
    @builtin(local_invocation_index) t: u32, @builtin(subgroup_id) subgroup: u32, \
    @builtin(subgroup_invocation_id) lane: u32, @builtin(num_subgroups) subgroups: u32) {{
    let g = wg.x + (wg.y + wg.z * grid.y) * grid.x;
    if (g >= {groups}) {{ return; }}
    {guard}
",
        s.bm * s.sa,
        s.bk * s.sb,
        s.grid.subgroups() * s.t * s.t,
        s.width,
        guard = subgroup_guard("subgroup", "subgroups", "sid", "whole", s.grid.subgroups()),
    );
    body += &setup(g, &s);
    body += &k_loop(g, &s);
    body += &stores(g, &s);
    body += "}\n";
    KernelSource {
        body,
        invocations: groups.n as u64 * s.width as u64,
        dropout_node: None,
        width: Some(s.width as u32),
    }
}

/// The tile's origin, the operands' bases, the panel elements this invocation moves and their
/// registers, and the accumulators.
fn setup(g: &Geometry, s: &Shape) -> String {
    let (m, k, n, w) = (&g.m, &g.k, &g.n, s.width);
    let mut out = String::new();
    let mut line = |x: String| {
        out.push_str("    ");
        out.push_str(&x);
        out.push('\n');
    };
    if g.splits > 1 {
        // As the tiled kernel: one k range's workgroups after another's.
        let items = s.per_batch.mul(&g.batches());
        let ks = split_depth_of(k, g.splits);
        line(format!("let split = g / {items};"));
        line(format!("let gs = g % {items};"));
        line(format!("let koff = split * {ks};"));
        line(format!("let klen = select(0u, min({ks}, {k} - koff), koff < {k});"));
    } else {
        line("let gs = g;".into());
        line("let koff = 0u;".into());
    }
    line(format!("let batch = gs / {};", s.per_batch));
    line(format!("let tile = gs % {};", s.per_batch));
    line(format!("let m0 = (tile / {}) * {}u;", s.tiles_n, s.bm));
    line(format!("let n0 = (tile % {}) * {}u;", s.tiles_n, s.bn));
    for l in g.bases().lines() {
        line(l.trim().to_string());
    }
    line(format!("let wm = sid / {}u;", s.grid.sn));
    line(format!("let wn = sid % {}u;", s.grid.sn));
    // Consecutive invocations move consecutive words of a stored row: along k for A as
    // stored [m, k] and B as [n, k], along m or n for the transposed layouts. Where the
    // workgroup covers whole stored rows of a panel, slot p is slot 0 moved (`moved_slot`).
    let (a_fast, b_fast) = (if g.at { s.bm } else { s.bk }, if g.bt { s.bk } else { s.bn });
    for p in 0..s.p.pa {
        line(format!("let ae{p} = t + {}u;", p * w));
        let d = p * w / a_fast;
        if p > 0 && w.is_multiple_of(a_fast) {
            // Staged as stored: A's rows of m, `sa` apart, k along them.
            let moved = if g.at {
                moved_slot("a", p, ("ak", "ar"), (d, m), d)
            } else {
                moved_slot("a", p, ("ar", "ak"), (d, k), d * s.sa)
            };
            moved.into_iter().for_each(&mut line);
        } else {
            if g.at {
                line(format!("let ar{p} = ae{p} % {}u;", s.bm));
                line(format!("let ak{p} = ae{p} / {}u;", s.bm));
                line(format!("let ag{p} = abase + (koff + ak{p}) * {m} + m0 + ar{p};"));
            } else {
                line(format!("let ar{p} = ae{p} / {}u;", s.bk));
                line(format!("let ak{p} = ae{p} % {}u;", s.bk));
                line(format!("let ag{p} = abase + (m0 + ar{p}) * {k} + koff + ak{p};"));
            }
            line(format!("let as{p} = ar{p} * {}u + ak{p};", s.sa));
        }
        line(registers("a", p, &g.a));
    }
    for p in 0..s.p.pb {
        line(format!("let be{p} = t + {}u;", p * w));
        let d = p * w / b_fast;
        if p > 0 && w.is_multiple_of(b_fast) {
            // B's staged rows of k, `sb` apart, n along them.
            let moved = if g.bt {
                moved_slot("b", p, ("bc", "bk"), (d, k), d)
            } else {
                moved_slot("b", p, ("bk", "bc"), (d, n), d * s.sb)
            };
            moved.into_iter().for_each(&mut line);
        } else {
            if g.bt {
                line(format!("let bk{p} = be{p} % {}u;", s.bk));
                line(format!("let bc{p} = be{p} / {}u;", s.bk));
                line(format!("let bg{p} = bbase + (n0 + bc{p}) * {k} + koff + bk{p};"));
            } else {
                line(format!("let bk{p} = be{p} / {}u;", s.bn));
                line(format!("let bc{p} = be{p} % {}u;", s.bn));
                line(format!("let bg{p} = bbase + (koff + bk{p}) * {n} + n0 + bc{p};"));
            }
            line(format!("let bs{p} = bk{p} * {}u + bc{p};", s.sb));
        }
        line(registers("b", p, &g.b));
    }
    let acc = s.matrix("f32", "C");
    for i in 0..s.grid.rm {
        for j in 0..s.grid.rn {
            line(format!("var c{i}_{j} = {acc}();"));
        }
    }
    out
}

/// The loop over the panels: stage the registers as f16, fetch the next panels, and multiply
/// this one's tiles into the accumulators.
fn k_loop(g: &Geometry, s: &Shape) -> String {
    let (kt, bk) = (&s.kt, s.bk);
    let mut out = String::new();
    if kt.n > 0 || !kt.is_fixed() {
        out += "    {\n";
        out += &s.p.fetch(g, "0u");
        out += "    }\n";
    }
    out += &format!("    for (var kt = 0u; kt < {kt}; kt = kt + 1u) {{\n");
    // Everyone has finished reading the previous panels before they are overwritten.
    out += "        workgroupBarrier();\n";
    out += &stage(g, s);
    out += "        workgroupBarrier();\n";
    out += &format!("        if (kt + 1u < {kt}) {{\n        let k1 = (kt + 1u) * {bk}u;\n");
    out += &s.p.fetch(g, "k1");
    out += "        }\n";
    out += &multiply(s);
    out += "    }\n";
    out
}

/// Each invocation's panel elements into shared memory as f16.
fn stage(g: &Geometry, s: &Shape) -> String {
    let bk = s.bk;
    let staged = |partial: bool, e: String, size: usize, st: String| {
        if partial {
            format!("        if ({e} < {size}u) {{ {st} }}\n")
        } else {
            format!("        {st}\n")
        }
    };
    let mut out = String::new();
    for p in 0..s.p.pa {
        let v = word_half(&g.a, &format!("ra{p}"), &format!("sa{p}"));
        let st = format!("cm_a[as{p}] = {v};");
        out += &staged(s.p.partial_a, format!("ae{p}"), s.bm * bk, st);
    }
    for p in 0..s.p.pb {
        let v = word_half(&g.b, &format!("rb{p}"), &format!("sb{p}"));
        let st = format!("cm_b[bs{p}] = {v};");
        out += &staged(s.p.partial_b, format!("be{p}"), bk * s.bn, st);
    }
    out
}

/// One panel's tiles multiplied into the accumulators.
fn multiply(s: &Shape) -> String {
    let t = s.t;
    let (ma, mb) = (s.matrix("f16", "A"), s.matrix("f16", "B"));
    let CoopGrid { rm, rn, .. } = s.grid;
    let b_tile = |kk: usize, j: usize| {
        let at = format!("{}u + wn * {}u + {}u", kk * t * s.sb, rn * t, j * t);
        format!("        let b{kk}_{j} = coopLoadT<{mb}>(&cm_b[{at}], {}u);\n", s.sb)
    };
    let fma = |kk: usize, i: usize, j: usize| {
        format!("        c{i}_{j} = coopMultiplyAdd(a{kk}_{i}, b{kk}_{j}, c{i}_{j});\n")
    };
    let mut out = String::new();
    for kk in 0..s.bk / t {
        for i in 0..rm {
            let at = format!("(wm * {}u + {}u) * {}u + {}u", rm * t, i * t, s.sa, kk * t);
            out += &format!("        let a{kk}_{i} = coopLoadT<{ma}>(&cm_a[{at}], {}u);\n", s.sa);
        }
        out.extend((0..rn).map(|j| b_tile(kk, j)));
        for i in 0..rm {
            out.extend((0..rn).map(|j| fma(kk, i, j)));
        }
    }
    out
}

/// Each accumulator through the subgroup's scratch, then out element by element: every
/// subgroup stores its tile (i, j) together, so the barriers around the scratch are reached by
/// the whole workgroup.
fn stores(g: &Geometry, s: &Shape) -> String {
    let (m, n, t) = (&g.m, &g.n, s.t);
    let tt = t * t;
    let mut out = format!("    let scratch = sid * {tt}u;\n");
    let CoopGrid { rm, rn, .. } = s.grid;
    for i in 0..rm {
        for j in 0..rn {
            out += &format!("    coopStoreT(c{i}_{j}, &cm_c[scratch], {t}u);\n");
            out += "    workgroupBarrier();\n";
            out += &format!("    for (var e = lane; e < {tt}u; e = e + {}u) {{\n", s.subgroup);
            out += &format!("        let row = m0 + wm * {}u + {}u + e / {t}u;\n", rm * t, i * t);
            out += &format!("        let col = n0 + wn * {}u + {}u + e % {t}u;\n", rn * t, j * t);
            let value = format!("select({NAN}, cm_c[scratch + e], whole)");
            let st = g.store(&format!("obase + row * {n} + col"), &value);
            let mut conds = Vec::new();
            if s.p.edge_m {
                conds.push(format!("row < {m}"));
            }
            if s.p.edge_n {
                conds.push(format!("col < {n}"));
            }
            if conds.is_empty() {
                out += &format!("        {st}\n");
            } else {
                out += &format!("        if ({}) {{ {st} }}\n", conds.join(" && "));
            }
            out += "    }\n    workgroupBarrier();\n";
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{coop_with, CoopGrid};
    use crate::kernels::{Coop, Operand};
    use mgn_ir::DType;

    #[test]
    fn the_grid_override_reads_three_fields_of_positive_numbers() {
        let g = CoopGrid::parse("4x2:2x4:3").unwrap();
        assert_eq!(g, CoopGrid { sm: 4, sn: 2, rm: 2, rn: 4, depth: 3 });
        assert_eq!((g.subgroups(), g.extents(16)), (8, (128, 128, 48)));
        let bad = ["", "2x2", "2x2:2x2", "2x2:2x2:2:1", "0x2:2x2:2", "2x2:2y2:2", "2x2:2x2:0"];
        for bad in bad.into_iter().chain(["2x2:2x2:2:d", "2x2:2x2:2:x"]) {
            assert_eq!(CoopGrid::parse(bad), None, "{bad}");
        }
    }

    /// Products take the wide grid where its workgroup and panels fit, the 2×2 one where only
    /// that fits (the 16 KiB floor of shared memory, 128 invocations), and none below.
    #[test]
    fn products_take_the_wide_grid_where_it_fits() {
        if std::env::var_os("MGN_COOP_GRID").is_some() {
            return;
        }
        let half = |offset: usize, shape: &[usize]| Operand::at(offset, shape, DType::F16);
        let inputs = [half(0, &[256, 256]), half(100_000, &[256, 256])];
        let out = Operand::at(200_000, &[256, 256], DType::F32);
        let g = super::Geometry::of(&inputs, &out).unwrap();
        let coop = Coop { tile: 16, subgroup: 32, everywhere: false };
        assert_eq!(super::grid_for(&g, coop, 1024, 49_152), Some(CoopGrid::WIDE));
        assert_eq!(super::grid_for(&g, coop, 1024, 16_384), Some(CoopGrid::DEFAULT));
        assert_eq!(super::grid_for(&g, coop, 128, 49_152), Some(CoopGrid::DEFAULT));
        assert_eq!(super::grid_for(&g, coop, 64, 49_152), None);
        let wide = coop_with(&g, coop, CoopGrid::WIDE);
        assert_eq!(wide.width, Some(256));
        // 256 invocations cover whole rows of both panels: later slots are the first's
        // addresses plus literals.
        for slot in ["let ag1 = ag0 + 8u * 256u;", "let bs1 = bs0 + 272u;"] {
            assert!(wide.body.contains(slot), "{slot}");
        }
    }

    /// Every grid makes a kernel naga validates and translates, of one workgroup its subgroups
    /// fill, whose tiles cover the product (the sweep on a device tries several).
    #[test]
    fn kernels_on_other_grids_validate() {
        let half = |offset: usize, shape: &[usize]| Operand::at(offset, shape, DType::F16);
        let (m, k, n) = (130, 70, 129);
        let inputs = [half(0, &[m, k]), half(1_000_000, &[k, n])];
        let out = Operand::at(9_000_000, &[m, n], DType::F32);
        let g = super::Geometry::of(&inputs, &out).unwrap();
        let coop = Coop { tile: 16, subgroup: 32, everywhere: true };
        for v in ["2x2:2x2:2", "2x2:4x2:2", "4x2:2x2:4", "2x2:4x4:2", "1x1:1x1:1"] {
            let grid = CoopGrid::parse(v).unwrap();
            let src = coop_with(&g, coop, grid);
            let width = grid.subgroups() as u32 * coop.subgroup;
            assert_eq!(src.width, Some(width), "{v}");
            let (bm, bn, _) = grid.extents(16);
            let tiles = (m.div_ceil(bm) * n.div_ceil(bn)) as u64;
            assert_eq!(src.invocations, tiles * width as u64, "{v}");
            crate::kernels::check::spirv(&src.body).unwrap_or_else(|e| panic!("{v}: {e}"));
        }
    }
}
