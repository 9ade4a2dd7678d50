//! The implicit GEMM every convolution runs as: the tile shapes, the cost model that picks one,
//! and the kernel that stages operand slices into shared memory and accumulates register blocks.

use crate::kernels::{fetch_word, word_value, KernelSource, Operand, Target};

mod coop;
#[cfg(test)]
mod tests;

/// One convolution as a batch of matrix products, one per group:
/// `C[g][m][n] = Σ_k A[g][m][k] · B[g][k][n]`, where A and B are never materialised: each
/// workgroup stages a `BK`-deep slice of its A and B tiles into shared memory, gathering the
/// elements straight from the tensors (`Loader`), zero where the tile overhangs the matrix or a
/// window reaches into the padding.
pub(super) struct Gemm {
    pub(super) groups: usize,
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    /// A WGSL expression of the group `g` (and of what the loaders' `pre` statements define from
    /// it alone) bounding the K loop below `k` for that group — 0 skips the loop and stores zeros.
    pub(super) k_end: Option<String>,
    /// Split K across workgroups: each group's K is cut into ranges this deep (a multiple of
    /// every `bk`, so only the last range has a tail), range `sp` computed by workgroups of its
    /// own and stored apart by the epilogue, which sees `sp`; a second pass adds them up. For
    /// long reductions onto few outputs (weight derivatives), where even the workgroup's own
    /// split of K leaves most of the GPU idle.
    pub(super) split_depth: Option<usize>,
}

/// Every `bk` the chooser offers divides this: the depth a K split's ranges are rounded to.
pub(super) const SPLIT_ALIGN: usize = 64;

impl Gemm {
    /// How many K ranges each group has (1 without a split).
    fn splits(&self) -> usize {
        self.split_depth.map_or(1, |d| self.k.div_ceil(d))
    }

    /// For workgroup `id` of a grid with `tiles` output tiles a group: statements defining the
    /// group `g` (and with a K split the range `sp`), and the expressions of where its K loop
    /// begins and ends (`k_end` may bound a group's K further).
    fn ranges(&self, tiles: usize) -> (String, String, String) {
        let k_end = self.k_end.clone().unwrap_or(format!("{}u", self.k));
        match self.split_depth {
            Some(d) => (
                format!(
                    "let sp = (id / {tiles}u) % {}u;\n    let g = id / {}u;",
                    self.splits(),
                    tiles * self.splits()
                ),
                format!("sp * {d}u"),
                format!("min(sp * {d}u + {d}u, {k_end})"),
            ),
            None => (format!("let g = id / {tiles}u;"), "0u".to_string(), k_end),
        }
    }

    /// The GEMM one workgroup sees, for the tile chooser: a split's ranges are groups of their
    /// own, each `split_depth` deep.
    fn per_workgroup(&self) -> Gemm {
        Gemm {
            groups: self.groups * self.splits(),
            k: self.split_depth.unwrap_or(self.k).min(self.k),
            k_end: None,
            split_depth: None,
            ..*self
        }
    }
}

/// How one operand's tile is staged.
pub(super) struct Loader {
    /// Consecutive invocations take consecutive k (true) or consecutive rows m / columns n
    /// (false): whichever is contiguous in memory, so that the staging loads coalesce.
    pub(super) k_fast: bool,
    /// Statements run once per invocation before the k loop. They may use `g` (the group),
    /// `m0`, `n0` (the tile's first row and column) and `fa` / `fb`, this invocation's index
    /// along the fast axis of A's / B's staging (fixed for the whole loop): when the fast axis is
    /// m or n, everything that depends on the row or column alone is computed here once.
    pub(super) pre: String,
    /// Statements that fetch the word holding the element at tile row (A) or column (B) `r`
    /// and depth `k` into `v` (a `u32` var, 0 before: 0.0 in every float type), with `fetch`;
    /// only run for `m0 + r < M` (`n0 + r < N`) and `k < K`.
    pub(super) body: String,
    /// The operand `body` reads: how its words become f32s when they are staged.
    pub(super) operand: Operand,
}

/// The statements of a `Loader::body` that fetch element `index` of `o`: its word into `v`
/// and, for a half value, the element's bit offset into `vs`. The conversion waits for the
/// staging (`kernels::Fetched`).
pub(super) fn fetch(o: &Operand, index: &str) -> String {
    let f = fetch_word(o, index);
    match f.shift {
        Some(shift) => format!("v = {}; vs = {shift};", f.word),
        None => format!("v = {};", f.word),
    }
}

/// A tile shape: `tm × tn` outputs per workgroup, `rm × rn` per invocation (rows strided by
/// `tm / rm`, columns by `tn / rn`, so that neighbouring invocations read neighbouring shared
/// words and store neighbouring outputs), `s` invocations splitting each `bk`-deep slice of K
/// (summed through shared memory at the end).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tile {
    tm: usize,
    tn: usize,
    rm: usize,
    rn: usize,
    s: usize,
    bk: usize,
}

/// Shared memory every Vulkan device has (maxComputeSharedMemorySize's floor), in `f32` words:
/// the most the chooser's tiles take even where the device has more. Offered the H200's 48 KiB,
/// the cost model picks deeper slices that run slower (ResNet-50's forward 3.2 → 4.2 ms,
/// forward + backward 9.6 → 12.6): it prices the barriers a deeper slice saves above what the
/// lower occupancy costs.
const SHARED_WORDS: usize = 16 * 1024 / 4;

/// Workgroup slots of the target (an H200: 132 SMs, about 512 resident invocations each at
/// these kernels' register use), in invocations: the tile chooser weighs a second wave of
/// workgroups against fewer, larger tiles.
const RESIDENT_INVOCATIONS: usize = 132 * 512;

impl Tile {
    fn tmt(&self) -> usize {
        self.tm / self.rm
    }

    fn tnt(&self) -> usize {
        self.tn / self.rn
    }

    /// Row stride of A's and B's staged slices, in words: the tile's extent rounded up to
    /// whole vec4s (the register block reads them as vec4s), and one vec4 of padding when the
    /// staging writes along k, so that those stores (a row apart) spread over the banks.
    fn lda(&self, a: &Loader) -> usize {
        self.tm.next_multiple_of(4) + 4 * a.k_fast as usize
    }

    fn ldb(&self, b: &Loader) -> usize {
        self.tn.next_multiple_of(4) + 4 * b.k_fast as usize
    }

    /// Shared words with rows `lda` and `ldb` apart: both staged slices, or the partial sums
    /// of the `s − 1` other slices.
    fn shared_words_with(&self, lda: usize, ldb: usize) -> usize {
        (self.bk * (lda + ldb)).max((self.s - 1) * self.tm * self.tn)
    }

    /// Shared words whatever the loaders (the padding both could take).
    fn shared_words(&self) -> usize {
        self.shared_words_with(self.tm.next_multiple_of(4) + 4, self.tn.next_multiple_of(4) + 4)
    }

    /// Rows (columns) of the tile this invocation's register block holds: with `r ≥ 4` per
    /// invocation, runs of 4 adjacent ones (read from the staged slice as one vec4), the
    /// invocations' runs side by side; else single ones strided by the invocation count.
    fn owned(r: usize, threads: usize, i: usize, who: &str) -> String {
        if r >= 4 {
            format!("{}u + {who} * 4u", (i / 4) * threads * 4 + i % 4)
        } else {
            format!("{}u + {who}", i * threads)
        }
    }

    /// Estimated time of the whole GEMM on the target, in cycles: the waves of workgroups times
    /// one workgroup's instructions per invocation (FMAs, shared reads, staging loads with their
    /// index arithmetic, barriers per slice, the split's sum at the end; an SM issues about a
    /// quarter instruction per cycle to each of its resident invocations), plus the words all
    /// tiles stage from memory at about 1400 words per cycle (L2). Few large tiles waste the
    /// machine; many small ones re-read the operands.
    fn cost(&self, gm: &Gemm, width: usize) -> f64 {
        let tiles = gm.groups * gm.m.div_ceil(self.tm) * gm.n.div_ceil(self.tn);
        let waves = tiles.div_ceil((RESIDENT_INVOCATIONS / width).max(1));
        let steps = gm.k.div_ceil(self.bk) as f64;
        let depth = (self.bk / self.s) as f64;
        let loads = (self.bk * self.tm).div_ceil(width) + (self.bk * self.tn).div_ceil(width);
        let per_step = depth * (self.rm * self.rn) as f64
            + 0.5 * depth * (self.rm + self.rn) as f64
            + 6.0 * loads as f64
            + 20.0;
        let tail = (self.rm * self.rn * if self.s > 1 { 2 * self.s } else { 1 }) as f64;
        let traffic = (tiles * (self.tm + self.tn)) as f64 * steps * self.bk as f64;
        4.0 * waves as f64 * (steps * per_step + tail + 40.0) + traffic / 1400.0
    }
}

/// The cheapest tile for `gm` on workgroups of `width` invocations that fits in `shared_words`
/// of shared memory, or None when `width` is not a power of two we can tile with.
fn choose_tile(gm: &Gemm, width: usize, shared_words: usize) -> Option<Tile> {
    if !width.is_power_of_two() || width < 16 {
        return None;
    }
    let pows = |max: usize| (0..).map(|e| 1usize << e).take_while(move |&v| v <= max);
    let mut best: Option<(f64, Tile)> = None;
    for s in pows(32.min(width)) {
        for tmt in pows(width / s) {
            let tnt = width / s / tmt;
            for rm in pows(8) {
                for rn in pows(8) {
                    let (tm, tn) = (tmt * rm, tnt * rn);
                    if rm * rn > 32 || tm > 128.min(width) || tn > 128.min(width) {
                        continue;
                    }
                    for bk in [8, 16, 32, 64] {
                        let t = Tile { tm, tn, rm, rn, s, bk };
                        if bk < s || bk > width || t.shared_words() > shared_words {
                            continue;
                        }
                        let c = t.cost(gm, width);
                        if best.is_none_or(|(b, _)| c < b) {
                            best = Some((c, t));
                        }
                    }
                }
            }
        }
    }
    best.map(|(_, t)| t)
}

/// The tiled kernel for `gm`: `epilogue` stores `acc` for in-group row `m` and column `n` of
/// group `g`. Returns None when no tile fits (the caller falls back to one invocation per
/// output element).
pub(super) fn implicit_gemm(
    gm: &Gemm,
    a: &Loader,
    b: &Loader,
    epilogue: &str,
    target: Target,
) -> Option<KernelSource> {
    let w = target.width as usize;
    if let Some(c) = target.coop.filter(|_| takes_coop(gm, a, b, target)) {
        return Some(coop::kernel(gm, a, b, epilogue, c));
    }
    let shared_words = SHARED_WORDS.min(target.shared_bytes as usize / 4);
    #[cfg(test)]
    let forced =
        tests::FORCED.with(|f| f.borrow().iter().copied().find(|t| t.tmt() * t.tnt() * t.s == w));
    #[cfg(not(test))]
    let forced = None;
    let t = match forced {
        Some(t) => t,
        None => choose_tile(&gm.per_workgroup(), w, shared_words)?,
    };
    #[cfg(test)]
    tests::MADE.with(|m| m.borrow_mut().push(((gm.groups, gm.m, gm.n, gm.k), t)));
    Some(gemm_kernel(gm, &t, a, b, epilogue, w))
}

/// Whether `implicit_gemm` runs `gm` on cooperative matrices (`coop::fits`). A caller whose
/// loaders read halves asks first, and builds them again reading through the f16 view.
pub(super) fn takes_coop(gm: &Gemm, a: &Loader, b: &Loader, target: Target) -> bool {
    target.coop.is_some_and(|c| coop::fits(gm, a, b, c, target))
}

/// How one invocation moves its share of an operand's `bk`-deep slice: into registers at a
/// given depth (`fetch`, issued a slice ahead so the loads are in flight while the current slice
/// is multiplied) and from them into `sm[base + kk·stride + r]` (`stage`). `rows` is the
/// tile's extent along m (A) or n (B), `bound` the matrix's, `origin` the tile's first row or
/// column, `fast` this invocation's index along the staging's fast axis. `sink` makes the
/// statement that stores, at a staged index, the element of the operand held in a register
/// (`reg`, and `{reg}s` its bit offset for a half): `sm`'s f32 words here, the
/// cooperative-matrix kernel's f16 panels.
struct Staging {
    decl: String,
    stage: String,
    /// The loads of the slice that starts at depth `kf`.
    fetch: String,
}

#[allow(clippy::too_many_arguments)]
fn staging(
    ld: &Loader,
    bk: usize,
    name: &str,
    k_len: usize,
    rows: usize,
    bound: usize,
    origin: &str,
    fast: &str,
    base: usize,
    stride: usize,
    w: usize,
    sink: &dyn Fn(&str, &Operand, &str) -> String,
) -> Staging {
    let fast_len = if ld.k_fast { bk } else { rows };
    let slow_len = if ld.k_fast { rows } else { bk };
    let per_pass = w / fast_len;
    let passes = slow_len.div_ceil(per_pass);
    let (r, k) = if ld.k_fast { ("sl_", fast) } else { (fast, "sl_") };
    let mut st = Staging { decl: String::new(), stage: String::new(), fetch: String::new() };
    for j in 0..passes {
        let reg = format!("{name}{j}");
        // Past the slice on the slow axis (a tile smaller than a staging pass): nothing.
        let live = ((j + 1) * per_pass > slow_len)
            .then(|| format!("tid / {fast_len}u + {}u < {slow_len}u", j * per_pass));
        // A half value's words also carry their element's bit offset.
        let halves = ld.operand.halves_in_words();
        let zero = crate::kernels::zero(&ld.operand);
        let (shift_decl, shift_keep) = if halves {
            (format!("var {reg}s = 0u;\n    "), format!("\n            {reg}s = vs;"))
        } else {
            (String::new(), String::new())
        };
        st.decl.push_str(&format!("var {reg} = {zero};\n    {shift_decl}"));
        st.fetch.push_str(&format!(
            "{{
            let sl_ = tid / {fast_len}u + {off}u;
            let r = {r};
            let kk = {k};
            let k = kf + kk;
            var v = {zero};{vs}
            if ({live} && {origin} + r < {bound}u && k < {k_len}u) {{
                {body}
            }}
            {reg} = v;{shift_keep}
        }}
        ",
            off = j * per_pass,
            body = ld.body,
            live = live.as_deref().unwrap_or("true"),
            vs = if halves { "\n            var vs = 0u;" } else { "" },
        ));
        let at = format!("{base}u + ({k}) * {stride}u + {r}");
        let staged = sink(&at, &ld.operand, &reg);
        let store = format!("{{ let sl_ = tid / {fast_len}u + {}u; {staged} }}", j * per_pass);
        match live {
            None => st.stage.push_str(&format!("{store}\n        ")),
            Some(live) => st.stage.push_str(&format!("if ({live}) {store}\n        ")),
        }
    }
    st
}

/// One invocation's `rm × rn` register block, as WGSL: the accumulators' declarations, the
/// inner step over one depth `kk` of the staged slices (loads and FMAs), and the finish —
/// with a split K, slices past the first leave their sums in shared memory (after the loop's
/// last barrier, so the staged slices are dead) and slice 0 adds them up; then `epilogue`
/// stores each accumulator as `acc`.
fn register_block(gm: &Gemm, t: &Tile, epilogue: &str, lda: usize, ldb: usize) -> [String; 3] {
    let (tmt, tnt) = (t.tmt(), t.tnt());
    let boff = t.bk * lda;
    let (mut decl, mut fmas, mut loads) = (String::new(), String::new(), String::new());
    let (mut spill, mut gather, mut store) = (String::new(), String::new(), String::new());
    let word = |x: String| format!("sm[({x}) / 4u][({x}) % 4u]");
    let slot = |i: usize, j: usize| format!("{}u + tm_ * {tnt}u + tn_", (i * t.rn + j) * tmt * tnt);
    // A register of the block: a vec4 of 4 adjacent rows (columns), or one word.
    let operand = |name: &str, r: usize, threads: usize, who: &str, base: usize, ld: usize| {
        let mut s = String::new();
        if r >= 4 {
            for q in 0..r / 4 {
                s.push_str(&format!(
                    "let {name}{q} = sm[kk * {}u + {}u + {who}];\n            ",
                    ld / 4,
                    (base + q * threads * 4) / 4
                ));
            }
        } else {
            for q in 0..r {
                let at = format!("{base}u + kk * {ld}u + {who} + {}u", q * threads);
                s.push_str(&format!("let {name}{q} = {};\n            ", word(at)));
            }
        }
        s
    };
    let part = |name: &str, r: usize, i: usize| {
        if r >= 4 {
            format!("{name}{}.{}", i / 4, ["x", "y", "z", "w"][i % 4])
        } else {
            format!("{name}{i}")
        }
    };
    loads.push_str(&operand("a", t.rm, tmt, "tm_", 0, lda));
    loads.push_str(&operand("b", t.rn, tnt, "tn_", boff, ldb));
    let words = t.tm * t.tn;
    for i in 0..t.rm {
        for j in 0..t.rn {
            let c = format!("c{i}_{j}");
            decl.push_str(&format!("var {c} = 0.0;\n    "));
            fmas.push_str(&format!(
                "{c} = fma({}, {}, {c});\n            ",
                part("a", t.rm, i),
                part("b", t.rn, j)
            ));
            let spilled = word(format!("(sl - 1u) * {words}u + {}", slot(i, j)));
            spill.push_str(&format!("{spilled} = {c};\n        "));
            let kept = word(format!("q * {words}u + {}", slot(i, j)));
            gather.push_str(&format!("{c} = {c} + {kept};\n            "));
            store.push_str(&format!(
                "{{
        let m = m0 + {mi};
        let n = n0 + {nj};
        if (m < {mm}u && n < {nn}u) {{
            let acc = {c};
            {epilogue}
        }}
    }}
    ",
                mi = Tile::owned(t.rm, tmt, i, "tm_"),
                nj = Tile::owned(t.rn, tnt, j, "tn_"),
                mm = gm.m,
                nn = gm.n,
            ));
        }
    }
    let finish = if t.s > 1 {
        format!(
            "if (sl > 0u) {{
        {spill}
    }}
    workgroupBarrier();
    if (sl == 0u) {{
        for (var q = 0u; q < {others}u; q = q + 1u) {{
            {gather}
        }}
        {store}
    }}",
            others = t.s - 1,
        )
    } else {
        store
    };
    [decl, loads + &fmas, finish]
}

/// The tiled kernel of `gm` with tile `t` (see `implicit_gemm`).
fn gemm_kernel(
    gm: &Gemm,
    t: &Tile,
    a: &Loader,
    b: &Loader,
    epilogue: &str,
    w: usize,
) -> KernelSource {
    let (mtiles, ntiles) = (gm.m.div_ceil(t.tm), gm.n.div_ceil(t.tn));
    let nwg = gm.groups * gm.splits() * mtiles * ntiles;
    let (_, kbegin, kend) = gm.ranges(mtiles * ntiles);
    let (tmt, tnt) = (t.tmt(), t.tnt());
    let (lda, ldb) = (t.lda(a), t.ldb(b));
    let boff = t.bk * lda;
    let [decl, inner, finish] = register_block(gm, t, epilogue, lda, ldb);
    let depth = t.bk / t.s;
    let sink = |at: &str, o: &Operand, reg: &str| {
        let v = word_value(o, reg, &format!("{reg}s"));
        format!("sm[({at}) / 4u][({at}) % 4u] = {v};")
    };
    let sa = staging(a, t.bk, "pa", gm.k, t.tm, gm.m, "m0", "fa", 0, lda, w, &sink);
    let sb = staging(b, t.bk, "pb", gm.k, t.tn, gm.n, "n0", "fb", boff, ldb, w, &sink);
    let words = t.shared_words_with(lda, ldb);
    // A constant trip count, so that the compiler can unroll the slice.
    let kk_of_q = if t.s > 1 { format!("sl * {depth}u + q") } else { "q".to_string() };
    let multiply = format!(
        "for (var q = 0u; q < {depth}u; q = q + 1u) {{
            let kk = {kk_of_q};
            {inner}
        }}"
    );
    let origin = origin(gm, (t.tm, t.tn, t.bk), a, b);
    let slices = slices(&(kbegin, kend), t.bk, &sa, &sb, &multiply);
    let body = format!(
        "var<workgroup> sm: array<vec4<f32>, {vec4s}>;

@compute @workgroup_size({w})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, \
         @builtin(local_invocation_index) tid: u32) {{
    {origin}
    let tn_ = tid % {tnt}u;
    let tm_ = (tid / {tnt}u) % {tmt}u;
    let sl = tid / {tmnt}u;
    {decl}
    {slices}
    {finish}
}}
",
        vec4s = words.div_ceil(4),
        tmnt = tmt * tnt,
    );
    KernelSource { body, invocations: nwg as u64 * w as u64, dropout_node: None, width: None }
}

/// The opening of a GEMM kernel's body for tiles of `(tm, tn)` and slices `bk` deep: the
/// workgroup's id (those past the grid leave), its group and K range (`Gemm::ranges`), the
/// tile's origin `m0`, `n0`, this invocation's index along each staging's fast axis (`fa`,
/// `fb`), and the loaders' `pre`.
fn origin(gm: &Gemm, (tm, tn, bk): (usize, usize, usize), a: &Loader, b: &Loader) -> String {
    let (mtiles, ntiles) = (gm.m.div_ceil(tm), gm.n.div_ceil(tn));
    let nwg = gm.groups * gm.splits() * mtiles * ntiles;
    let (group, ..) = gm.ranges(mtiles * ntiles);
    let fa_len = if a.k_fast { bk } else { tm };
    let fb_len = if b.k_fast { bk } else { tn };
    format!(
        "let id = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    if (id >= {nwg}u) {{ return; }}
    {group}
    let m0 = ((id / {ntiles}u) % {mtiles}u) * {tm}u;
    let n0 = (id % {ntiles}u) * {tn}u;
    let fa = tid % {fa_len}u;
    let fb = tid % {fb_len}u;
    {}
    {}",
        a.pre, b.pre
    )
}

/// The loop over K's slices from `kbegin` to `kend` (`Gemm::ranges`), `bk` deep: the staged
/// registers into shared memory, the next slice's loads issued, then `multiply` on this one.
fn slices(
    (kbegin, kend): &(String, String),
    bk: usize,
    sa: &Staging,
    sb: &Staging,
    multiply: &str,
) -> String {
    format!(
        "{}{}
    let kend = {kend};
    if ({kbegin} < kend) {{
        let kf = {kbegin};
        {fetch}
    }}
    for (var k0 = {kbegin}; k0 < kend; k0 = k0 + {bk}u) {{
        {}{}
        workgroupBarrier();
        if (k0 + {bk}u < kend) {{
            let kf = k0 + {bk}u;
            {fetch}
        }}
        {multiply}
        workgroupBarrier();
    }}",
        sa.decl,
        sb.decl,
        sa.stage,
        sb.stage,
        fetch = sa.fetch.clone() + &sb.fetch,
    )
}
