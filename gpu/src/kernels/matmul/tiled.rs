//! The general matrix-product kernel: output tiles, panels staged through registers into shared
//! memory, a register block per invocation.

use super::panel_stats;
use super::panels::{moved_slot, registers, Panels};
use super::row_norm as norm;
use super::{entry, split_depth_of, Geometry, RowNorm, BK, FILL};
use crate::kernels::{word_value, Ext, KernelSource};

/// The shape of a tiled kernel: outputs per invocation (`tm × tn`, multiples of 4), invocations
/// per workgroup, the panels' depth, and whether the panels are double-buffered (one barrier
/// per panel instead of two).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tile {
    pub tm: usize,
    pub tn: usize,
    pub threads: usize,
    pub bk: usize,
    pub double: bool,
}

/// The tile for `g` on workgroups of `width` within `shared` bytes of shared memory: 8×8
/// outputs an invocation when that still gives `FILL` tiles and k is `DEEP_K` deep, with 16-deep
/// panels where the device has the room for them (16.6 KiB at 256 invocations, above the 16 KiB
/// floor) and 8-deep ones elsewhere; else 4×4 with 16-deep panels (8.4 KiB: the 8×8 tile's
/// 8-deep footprint, half the barriers per multiply-add for a tile that has few of them).
///
/// Measured on the H200 (`matmul_throughput`, docs/benchmarks/): 16-deep panels take the 8×8
/// tile from 34.8 to 38.9 TFLOP/s on 4096²; the 16-deep 4×4 tile is 3–12% faster than the
/// 8-deep one on every workload's product; tiles of 128 invocations win alone on some shapes
/// but lose in whole plans, where a level's products share the GPU.
fn choose(g: &Geometry, width: usize, shared: usize) -> Tile {
    let (tx_n, ty_n) = grid(width);
    let tiles = g.m.n.div_ceil(ty_n * 8) * g.n.n.div_ceil(tx_n * 8) * g.batches().n;
    let big = tiles >= FILL && g.k.n >= DEEP_K;
    let t = if big { 8 } else { 4 };
    let deep = Tile { tm: t, tn: t, threads: width, bk: 2 * BK, double: false };
    if Tiling::of(g, deep).shared_bytes() <= shared {
        deep
    } else {
        Tile { bk: BK, ..deep }
    }
}

/// The least depth at which the 8×8 tile pays: with a shallow k its few panels do not amortise
/// the larger tile's loads and stores. Measured on the H200: Whisper's scores (6 × 1500², k 64)
/// take 120 µs in 8×8 tiles and 92 in 4×4 ones; SmolLM2's head (k 576) 206 against 256.
const DEEP_K: usize = 256;

/// The invocation grid `(tx_n, ty_n)` of a workgroup of `threads`: as square as a power of two
/// allows, wider than tall.
fn grid(threads: usize) -> (usize, usize) {
    let tx_n = 1usize << (threads.trailing_zeros().div_ceil(2));
    (tx_n, threads / tx_n)
}

impl Tile {
    /// Output rows and columns of one tile.
    fn extent(&self) -> (usize, usize) {
        let (tx_n, ty_n) = grid(self.threads);
        (ty_n * self.tm, tx_n * self.tn)
    }

    /// The tile a test build's `MGN_MM_TILE` forces, if any.
    fn forced() -> Option<Tile> {
        #[cfg(test)]
        return Tile::from_env();
        #[cfg(not(test))]
        None
    }

    /// `MGN_MM_TILE=8x8:256:8[:d]`: the `matmul_throughput` sweep's override of the chooser,
    /// read by a test build only (a release build's tiles are `choose`'s).
    #[cfg(test)]
    fn from_env() -> Option<Tile> {
        let v = std::env::var("MGN_MM_TILE").ok()?;
        let parts: Vec<&str> = v.split(':').collect();
        let (tm, tn) = parts.first()?.split_once('x')?;
        Some(Tile {
            tm: tm.parse().ok()?,
            tn: tn.parse().ok()?,
            threads: parts.get(1)?.parse().ok()?,
            bk: parts.get(2)?.parse().ok()?,
            double: parts.contains(&"d"),
        })
    }
}

/// The tiled kernel. Invocations form a `tx_n × ty_n` grid; invocation (tx, ty) owns the
/// output rows `i4 * ty_n * 4 + ty * 4 + 0..4` and columns `j4 * tx_n * 4 + tx * 4 + 0..4` of the
/// tile, so that its reads from shared memory are whole vec4s and neighbouring invocations
/// read neighbouring vec4s (no bank conflicts). Each panel of A and B (`Tile::bk` deep) is staged
/// through registers: the next panel's loads are in flight while this one is multiplied.
pub(super) fn tiled(g: &Geometry, width: usize, shared: usize) -> KernelSource {
    // A normed product's row statistics take shared memory beside the panels (for the largest
    // tile on `width` invocations).
    let (tx_n, ty_n) = grid(width);
    let stats = match (panel_stats::of(g), &g.norm) {
        (Some(n), _) => panel_stats::shared_bytes(n, ty_n * 8, tx_n * 8),
        (None, Some(_)) => norm::shared_bytes(width, ty_n * 8),
        (None, None) => 0,
    };
    let shared = shared.saturating_sub(stats);
    let tile =
        Tile::forced().filter(|t| t.threads <= width).unwrap_or_else(|| choose(g, width, shared));
    let t = Tiling::of(g, tile);
    // A's panel is stored transposed (k-major) so invocations read their rows as vec4s; 4
    // padding floats per k row spread the transposing stores over every bank.
    let mut panels = format!(
        "var<workgroup> mm_a: array<vec4<f32>, {}>;\nvar<workgroup> mm_b: array<vec4<f32>, {}>;\n",
        t.bufs() * t.bk * t.sa,
        t.bufs() * t.bk * t.sb
    );
    let mut s = t.setup(g);
    match (panel_stats::of(g), &g.norm) {
        (Some(n), _) => {
            panels += &panel_stats::declarations(n, t.bm, t.bn);
            let b_sources: Vec<usize> = (0..t.p.pb).map(|q| t.b_source(g, q)).collect();
            s += &panel_stats::setup(g, n, t.bm, tile.threads, (t.p.pa, &b_sources));
        }
        (None, Some(n)) => {
            panels += &norm::declarations(t.bm, tile.threads);
            s += &norm::row_stats(g, n, t.bm, tile.threads);
        }
        (None, None) => {}
    }
    let s = s + &t.k_loop(g) + &t.meet(g) + &t.stores(g);
    let groups = t.per_batch.mul(&g.batches()).times(g.splits);
    let mut k = entry(&panels, tile.threads, &groups, s.trim_start());
    if tile.threads != width {
        k.width = Some(tile.threads as u32);
    }
    k
}

/// The sizes of a tiled kernel (see `tiled`).
struct Tiling {
    width: usize,
    bk: usize,
    double: bool,
    /// The invocation grid.
    tx_n: usize,
    ty_n: usize,
    /// Outputs per invocation (8×8 or 4×4) and per tile.
    tm: usize,
    tn: usize,
    bm: usize,
    bn: usize,
    tiles_n: Ext,
    per_batch: Ext,
    /// Panels along k (of one k range when split).
    kt: Ext,
    /// The depth of one k range (`k` itself unless split).
    ks: Ext,
    /// Row strides of the staged panels, in vec4s.
    sa: usize,
    sb: usize,
    /// Which panel elements each invocation moves, and where the tiles overhang.
    p: Panels,
}

impl Tiling {
    /// Panel buffers: two when double-buffered.
    fn bufs(&self) -> usize {
        if self.double {
            2
        } else {
            1
        }
    }

    /// Bytes of shared memory the staged panels take.
    fn shared_bytes(&self) -> usize {
        16 * self.bufs() * self.bk * (self.sa + self.sb)
    }

    fn of(g: &Geometry, tile: Tile) -> Tiling {
        let (m, k, n) = (&g.m, &g.k, &g.n);
        let (width, bk) = (tile.threads, tile.bk);
        let (tx_n, ty_n) = grid(tile.threads);
        let (tm, tn) = (tile.tm, tile.tn);
        let (bm, bn) = tile.extent();
        let tiles_n = n.div_ceil(bn);
        // Element e of A's bm×BK panel is (e / BK, e % BK) and of B's BK×bn panel (e / bn,
        // e % bn), so consecutive invocations read consecutive words of a row of A or of B (of
        // A's stored rows, (e % bm, e / bm), when it is stored transposed).
        Tiling {
            width,
            bk,
            double: tile.double,
            tx_n,
            ty_n,
            tm,
            tn,
            bm,
            bn,
            per_batch: m.div_ceil(bm).mul(&tiles_n),
            tiles_n,
            kt: split_depth_of(k, g.splits).div_ceil(bk),
            ks: if g.splits > 1 { split_depth_of(k, g.splits) } else { k.clone() },
            sa: (bm + 4) / 4,
            // B's panel, stored from a transposed B, walks k fastest: padding as for A's.
            sb: if g.bt { (bn + 4) / 4 } else { bn / 4 },
            p: Panels::of(g, (bm, bn, bk), width),
        }
    }

    /// Whether A's slot `p` is slot 0 moved whole rows along the panel's slow axis
    /// (`moved_slot`): the compiler then keeps one set of addresses for both. Moved along
    /// rows (A as stored), it reads the same depth as slot 0.
    fn a_moved(&self, g: &Geometry, p: usize) -> bool {
        let (w, a_fast) = (self.width, if g.at { self.bm } else { self.bk });
        p > 0 && w.is_multiple_of(a_fast) && (g.at || (p * w / a_fast).is_multiple_of(4))
    }

    /// Whether B's slot `p` is slot 0 moved whole rows along the panel's slow axis, as A's
    /// (`a_moved`). Stored transposed, B's panel walks k fastest: moved along columns, the slot
    /// reads the same depth as slot 0.
    fn b_moved(&self, g: &Geometry, p: usize) -> bool {
        let (w, b_fast) = (self.width, if g.bt { self.bk } else { self.bn });
        p > 0 && w.is_multiple_of(b_fast) && (!g.bt || (p * w / b_fast).is_multiple_of(4))
    }

    /// The slot whose depth B's slot `p` reads, for what is loaded by depth (a norm's weight
    /// and bias): slot 0's where it is slot 0 moved along columns, else its own.
    fn b_source(&self, g: &Geometry, p: usize) -> usize {
        if g.bt && self.b_moved(g, p) {
            0
        } else {
            p
        }
    }

    /// The tile's origin, the operands' bases, which panel elements this invocation moves (and
    /// where they go), and the accumulators.
    fn setup(&self, g: &Geometry) -> String {
        let (k, n, w, bn, sa, sb) = (&g.k, &g.n, self.width, self.bn, self.sa, self.sb);
        let mut s = String::new();
        let mut line = |x: String| {
            s.push_str("    ");
            s.push_str(&x);
            s.push('\n');
        };
        if g.splits > 1 {
            // Workgroups of one k range first, then the next range's; this range's first k, and
            // how many k it holds (the last may hold fewer, or none).
            let (items, ks) = (self.per_batch.mul(&g.batches()), &self.ks);
            line(format!("let split = g / {items};"));
            line(format!("let gs = g % {items};"));
            line(format!("let koff = split * {ks};"));
            line(format!("let klen = select(0u, min({ks}, {k} - koff), koff < {k});"));
        } else {
            line("let gs = g;".into());
            line("let koff = 0u;".into());
        }
        line(format!("let batch = gs / {};", self.per_batch));
        line(format!("let tile = gs % {};", self.per_batch));
        line(format!("let m0 = (tile / {}) * {}u;", self.tiles_n, self.bm));
        line(format!("let n0 = (tile % {}) * {bn}u;", self.tiles_n));
        for l in g.bases().lines() {
            line(l.trim().to_string());
        }
        line(format!("let tx = t % {}u;", self.tx_n));
        line(format!("let ty = t / {}u;", self.tx_n));
        let m = &g.m;
        // Slot p moves panel element t + p·w. When w is a multiple of the panel's fast extent,
        // slot p is slot 0 moved `d` whole rows along the slow axis, and its indices are slot
        // 0's plus literals: the compiler keeps one set of addresses, not one per slot.
        let (a_fast, b_fast) =
            (if g.at { self.bm } else { self.bk }, if g.bt { self.bk } else { bn });
        for p in 0..self.p.pa {
            line(format!("let ae{p} = t + {}u;", p * w));
            let d = p * w / a_fast;
            if self.a_moved(g, p) {
                let moved = if g.at {
                    moved_slot("a", p, ("ak", "ar"), (d, m), d * sa)
                } else {
                    moved_slot("a", p, ("ar", "ak"), (d, k), d / 4)
                };
                moved.into_iter().for_each(&mut line);
                line(format!("let ac{p} = ac0;"));
            } else {
                if g.at {
                    // A is stored [k, m]: consecutive invocations walk m within a row of it,
                    // as B's panel walks n.
                    line(format!("let ar{p} = ae{p} % {}u;", self.bm));
                    line(format!("let ak{p} = ae{p} / {}u;", self.bm));
                    line(format!("let ag{p} = abase + (koff + ak{p}) * {m} + m0 + ar{p};"));
                } else {
                    line(format!("let ar{p} = ae{p} / {}u;", self.bk));
                    line(format!("let ak{p} = ae{p} % {}u;", self.bk));
                    line(format!("let ag{p} = abase + (m0 + ar{p}) * {k} + koff + ak{p};"));
                }
                line(format!("let as{p} = ak{p} * {sa}u + ar{p} / 4u;"));
                line(format!("let ac{p} = ar{p} % 4u;"));
            }
            line(registers("a", p, &g.a));
            if g.norm.is_some() && !self.a_moved(g, p) {
                line(format!("var nw{p} = 1.0; var nb{p} = 0.0;"));
            }
        }
        for p in 0..self.p.pb {
            line(format!("let be{p} = t + {}u;", p * w));
            let d = p * w / b_fast;
            if self.b_moved(g, p) {
                let moved = if g.bt {
                    moved_slot("b", p, ("bc", "bk"), (d, k), d / 4)
                } else {
                    moved_slot("b", p, ("bk", "bc"), (d, n), d * sb)
                };
                moved.into_iter().for_each(&mut line);
                line(format!("let bq{p} = bq0;"));
            } else {
                if g.bt {
                    // B is stored [n, k]: consecutive invocations walk k within a column,
                    // which is contiguous there, as A's panel walks k within a row.
                    line(format!("let bk{p} = be{p} % {}u;", self.bk));
                    line(format!("let bc{p} = be{p} / {}u;", self.bk));
                    line(format!("let bg{p} = bbase + (n0 + bc{p}) * {k} + koff + bk{p};"));
                } else {
                    line(format!("let bk{p} = be{p} / {bn}u;"));
                    line(format!("let bc{p} = be{p} % {bn}u;"));
                    line(format!("let bg{p} = bbase + (koff + bk{p}) * {n} + n0 + bc{p};"));
                }
                line(format!("let bs{p} = bk{p} * {sb}u + bc{p} / 4u;"));
                line(format!("let bq{p} = bc{p} % 4u;"));
            }
            line(registers("b", p, &g.b));
        }
        for i in 0..self.tm {
            for j4 in 0..self.tn / 4 {
                line(format!("var c{i}_{j4} = vec4<f32>(0.0);"));
            }
        }
        s
    }

    /// The loop over the panels: stage the registers, prefetch the next panel, multiply. With
    /// two buffers the registers go into the buffer not being read, so one barrier a panel
    /// suffices.
    fn k_loop(&self, g: &Geometry) -> String {
        let (kt, sa, sb, bk) = (&self.kt, self.sa, self.sb, self.bk);
        let (asize, bsize) = (bk * sa, bk * sb);
        let mut s = String::new();
        let staged = |partial: bool, e: String, size: usize, st: String| {
            if partial {
                format!("        if ({e} < {size}u) {{ {st} }}\n")
            } else {
                format!("        {st}\n")
            }
        };
        // `panel`: which panel along k the registers hold.
        let stage = |abuf: &str, bbuf: &str, panel: &str| {
            let mut s = String::new();
            for p in 0..self.p.pa {
                let v = word_value(&g.a, &format!("ra{p}"), &format!("sa{p}"));
                let target = format!("mm_a[{abuf}as{p}][ac{p}]");
                let source = (p, self.a_source(g, p));
                let st = match (panel_stats::of(g), &g.norm) {
                    (Some(n), _) => panel_stats::stage_a(g, n, &v, source, (panel, bk), &target),
                    (None, Some(n)) => {
                        format!("{target} = {};", norm::staged(g, n, &v, source, (panel, bk)))
                    }
                    (None, None) => format!("{target} = {v};"),
                };
                s.push_str(&staged(self.p.partial_a, format!("ae{p}"), self.bm * bk, st));
            }
            for p in 0..self.p.pb {
                let v = word_value(&g.b, &format!("rb{p}"), &format!("sb{p}"));
                let mut st = format!("mm_b[{bbuf}bs{p}][bq{p}] = {v};");
                if let Some(n) = panel_stats::of(g) {
                    st += &panel_stats::stage_b(n, &v, (p, self.b_source(g, p)));
                }
                s.push_str(&staged(self.p.partial_b, format!("be{p}"), bk * self.bn, st));
            }
            s
        };
        let fetch = |k0: &str| self.p.fetch(g, k0) + &self.norm_fetch(g, k0);
        if kt.n > 0 || !kt.is_fixed() {
            s.push_str("    {\n");
            s.push_str(&fetch("0u"));
            if self.double {
                s.push_str(&stage("", "", "0u"));
                s.push_str("        workgroupBarrier();\n");
            }
            s.push_str("    }\n");
        }
        s.push_str(&format!("    for (var kt = 0u; kt < {kt}; kt = kt + 1u) {{\n"));
        let (ra, rb) = if self.double {
            s.push_str(&format!("        let cura = (kt & 1u) * {asize}u;\n"));
            s.push_str(&format!("        let curb = (kt & 1u) * {bsize}u;\n"));
            ("cura + ", "curb + ")
        } else {
            // Everyone has finished reading the previous panels before they are overwritten.
            s.push_str("        workgroupBarrier();\n");
            s.push_str(&stage("", "", "kt"));
            s.push_str("        workgroupBarrier();\n");
            ("", "")
        };
        // The next panels' loads are in flight while this one is multiplied.
        s.push_str(&format!(
            "        if (kt + 1u < {kt}) {{\n        let k1 = (kt + 1u) * {bk}u;\n"
        ));
        s.push_str(&fetch("k1"));
        s.push_str("        }\n");
        for kk in 0..bk {
            for i4 in 0..self.tm / 4 {
                let at = kk * sa + i4 * self.ty_n;
                s.push_str(&format!("        let a{kk}_{i4} = mm_a[{ra}{at}u + ty];\n"));
            }
            for j4 in 0..self.tn / 4 {
                let at = kk * sb + j4 * self.tx_n;
                s.push_str(&format!("        let b{kk}_{j4} = mm_b[{rb}{at}u + tx];\n"));
            }
            for i in 0..self.tm {
                let (comp, i4) = (["x", "y", "z", "w"][i % 4], i / 4);
                for j4 in 0..self.tn / 4 {
                    s.push_str(&format!(
                        "        c{i}_{j4} = c{i}_{j4} + a{kk}_{i4}.{comp} * b{kk}_{j4};\n"
                    ));
                }
            }
        }
        if self.double {
            // The next panels go into the buffer this one is not.
            s.push_str(&format!("        if (kt + 1u < {kt}) {{\n"));
            let (a_next, b_next) = (format!("{asize}u - cura + "), format!("{bsize}u - curb + "));
            s.push_str(&stage(&a_next, &b_next, "(kt + 1u)"));
            s.push_str("        }\n        workgroupBarrier();\n");
        }
        s.push_str("    }\n");
        s
    }

    /// The slot whose norm weight and bias registers slot `p` of A uses: its own, or slot
    /// 0's when it is slot 0 moved along rows (the same depth).
    fn a_source(&self, g: &Geometry, p: usize) -> usize {
        if self.a_moved(g, p) {
            0
        } else {
            p
        }
    }

    /// For a normed product, the loads of the norm's weight and bias at the depths of A's
    /// slots in the panel at `k0`, beside the panel's own (`norm::fetched`).
    fn norm_fetch(&self, g: &Geometry, k0: &str) -> String {
        let Some(n) = &g.norm else { return String::new() };
        let sources = (0..self.p.pa).filter(|&p| !self.a_moved(g, p));
        if panel_stats::of(g).is_none() {
            return sources.map(|p| norm::fetched(g, n, p, k0)).collect();
        }
        // Statistics from the panels: A is staged times the weight only; B's slots sum the
        // columns.
        let weight_only = RowNorm { bias: None, ..n.clone() };
        let a: String = sources.map(|p| norm::fetched(g, &weight_only, p, k0)).collect();
        let b_sources = (0..self.p.pb).filter(|&q| self.b_source(g, q) == q);
        a + &b_sources.map(|q| panel_stats::fetched_b(g, n, q, k0)).collect::<String>()
    }

    /// For statistics from the panels, their meeting after the loop (`panel_stats::meet`).
    fn meet(&self, g: &Geometry) -> String {
        let Some(n) = panel_stats::of(g) else {
            return String::new();
        };
        let at = panel_stats::Meeting {
            a: (self.p.pa, self.p.partial_a.then_some(self.bm * self.bk)),
            b: (self.p.pb, self.p.partial_b.then_some(self.bk * self.bn)),
            strides: (self.sa, self.sb),
            tile: (self.bm, self.bn, self.bk),
            width: self.width,
            k: &g.k,
        };
        panel_stats::meet(n, &at)
    }

    /// The stores of the register block, guarded at the matrices' edges. With an epilogue, every
    /// result goes through it first and the stores follow: the arena is one buffer, so a
    /// store may alias any later load, and an epilogue's loads (a bias, a residual) between
    /// stores would each wait out a memory round trip in turn.
    fn stores(&self, g: &Geometry) -> String {
        let mut s = String::from("    let r0 = m0 + ty * 4u;\n    let q0 = n0 + tx * 4u;\n");
        if let Some(n) = panel_stats::of(g) {
            // The norm applied to the sums of the unnormed rows (`panel_stats`).
            for i in 0..self.tm {
                let row = format!("ty * 4u + {}u", (i / 4) * self.ty_n * 4 + i % 4);
                for j4 in 0..self.tn / 4 {
                    let col = format!("tx * 4u + {}u", j4 * self.tx_n * 4);
                    s += &panel_stats::corrected(n, &format!("c{i}_{j4}"), &row, &col);
                }
            }
        }
        if g.epilogue {
            s += &self.each_result(g, |at, c| format!("{c} = {};", g.result(at, c)));
            s += &self.each_result(g, |at, c| super::store(&g.out, at, c));
        } else {
            s += &self.each_result(g, |at, c| g.store(at, c));
        }
        s
    }

    /// `statement(at, c)` for each result of the register block inside the matrices, `at` its
    /// output word and `c` its register.
    fn each_result(&self, g: &Geometry, statement: impl Fn(&str, &str) -> String) -> String {
        let (m, n) = (&g.m, &g.n);
        let mut s = String::new();
        // Row i of the register block is tile row (i / 4) * ty_n * 4 + ty * 4 + i % 4.
        for i in 0..self.tm {
            let dr = (i / 4) * self.ty_n * 4 + i % 4;
            let mut row = String::new();
            for j4 in 0..self.tn / 4 {
                for (jj, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let dc = j4 * self.tx_n * 4 + jj;
                    let st = statement(&format!("orow + {dc}u"), &format!("c{i}_{j4}.{comp}"));
                    if self.p.edge_n {
                        row.push_str(&format!("        if (q0 + {dc}u < {n}) {{ {st} }}\n"));
                    } else {
                        row.push_str(&format!("        {st}\n"));
                    }
                }
            }
            let cond = if self.p.edge_m { format!("r0 + {dr}u < {m}") } else { "true".into() };
            s.push_str(&format!(
                "    if ({cond}) {{\n        \
                    let orow = obase + (r0 + {dr}u) * {n} + q0;\n{row}    }}\n"
            ));
        }
        s
    }
}
