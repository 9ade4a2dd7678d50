//! The forward of an attention whose q, k and v are f16 (the mixed precision policy's), both of
//! its products on the device's cooperative-matrix units, with an online softmax between them,
//! so no `Tq × Tk` score matrix is stored and neither product runs at the f32 rate.
//!
//! A workgroup of `NS` subgroups owns `NS · T` query rows of one (batch item, query head), `T`
//! rows a subgroup, where `T × T` is the device's f16 tile. Q's rows are staged once as f16 and
//! held as `D / T` A-matrices. For each block of `BK` keys:
//!
//! 1. K's and V's rows are staged as f16 (`hs`), and each subgroup multiplies its Q tiles by Kᵀ
//!    (K's rows read column-major are Kᵀ's columns) into `BK / T` f32 tiles, stored to its
//!    scratch (`fs`).
//! 2. Its lanes read their rows' scores back (`LPR` lanes a row, each a strided share of the
//!    keys), scale and mask them, take the block's row maxima (the shares meet in `fr`), and
//!    rescale their row sums `l` and output accumulators by `e^(m_old − m_new)`.
//! 3. `P = e^(S − m_new)` is stored for the tiles as two f16 matrices, `hi` and
//!    `lo = f16(P − hi)`, where `hi` is P with its significand cut to f16's 10 bits (0 below
//!    f16's normal range): an f16 exactly, so `P − hi` is exact in f32 and `lo` carries P's
//!    next 11 bits. `hi + lo` is P to about 21 bits (within 3·10⁻⁸ below 2⁻¹⁴), so `P·V` on
//!    f16 tiles is the f32-probabilities product the policy and the CPU compute (the policy
//!    rounds q, k and v to f16; softmax stays f32), not one of probabilities rounded to f16.
//!    Both halves are staged with the conversion the device was probed for.
//! 4. `hi·V + lo·V` goes to the scratch, and each lane adds its rows' share to its accumulators.
//!
//! At the end the shares of each row's sum meet, and `O / l` is stored (zeros for a row that
//! saw no key, as on the CPU). Hidden keys (causal, past the lengths) have no probability at
//! all; masked ones `e^(−inf) = 0`.
//!
//! Where it runs: an attention the rewrite marked `GpuOp::AttentionOnTiles` — under a test's
//! `AttentionPath::Tiles` (no session takes it), an f16 attention nothing differentiates (an
//! inference plan's), on a device whose tiles take its heads and whose shared memory holds the
//! blocks (`runs_on_tensor_cores`). Opt-in because its one timing lost: on an H100 the first
//! version (K and V loaded one element after another, blocks of 48 keys) ran Whisper's forward 2.2×
//! slower than the score-matrix path (docs/benchmarks/); the prefetch of the next block is not yet
//! timed.

use super::parts::key_end;
use super::{fill, Attn, NEG};
use crate::kernels::matmul::{subgroup_guard, NAN};
use crate::kernels::{f16_view_decl, fetch_word, load, store, word_half, Coop, KernelSource};
use crate::kernels::{Operand, Target};
use mgn_ir::shape::attention::Dims;
use mgn_ir::DType;

/// Subgroups a workgroup, where the width allows: on an H100, Whisper's mixed forward took
/// 2.39 ms with 4, 3.46 with 2 and 4.87 with 1 (docs/benchmarks/2026-12-06.md, "Attention on
/// the tensor cores"; `MGN_COOP_ATTENTION`, the switch that set it, is gone).
const SUBGROUPS: usize = 4;
/// f16's smallest normal number, 2⁻¹⁴: below it P's high half is 0 (see the header).
const MIN_NORMAL: &str = "6.1035156e-5";

/// The most keys a block: K's and V's elements for the next block wait in registers while
/// this one is multiplied, `2 · BK · D / W` of them an invocation.
const MAX_KEYS: usize = 32;

/// The widest heads (`D` and `Dv`): Q's tiles and the output accumulators live in registers.
const MAX_HEAD: usize = 128;
/// The most output accumulators an invocation holds.
const MAX_HELD: usize = 64;

/// The kernel's sizes: tiles, lanes, blocks and shared-memory strides (in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    /// The tile edge and the subgroup size.
    t: usize,
    s: usize,
    /// Subgroups a workgroup, keys a block.
    ns: usize,
    bk: usize,
    /// Lanes sharing a row, rows a lane holds (one of the two is 1).
    lpr: usize,
    rpl: usize,
    d: usize,
    dv: usize,
}

impl Layout {
    /// The layout for heads `d` and `dv` on `coop` within `width` invocations and `shared`
    /// bytes: the largest key block that fits, or None.
    fn of(d: usize, dv: usize, coop: Coop, width: usize, shared: usize) -> Option<Layout> {
        let (t, s) = (coop.tile as usize, coop.subgroup as usize);
        let shapes = t > 0 && s > 0 && t.is_power_of_two() && s.is_power_of_two();
        if !shapes
            || d == 0
            || dv == 0
            || !d.is_multiple_of(t)
            || !dv.is_multiple_of(t)
            || d.max(dv) > MAX_HEAD
        {
            return None;
        }
        let ns = SUBGROUPS.min(width / s);
        let (lpr, rpl) = ((s / t).max(1), (t / s).max(1));
        if ns == 0 || !(dv / lpr).is_multiple_of(4) || rpl * dv / lpr > MAX_HELD {
            return None;
        }
        let fits = |bk: usize| {
            let l = Layout { t, s, ns, bk, lpr, rpl, d, dv };
            (bk.is_multiple_of(t) && bk.is_multiple_of(lpr) && l.shared_bytes() <= shared)
                .then_some(l)
        };
        [64, 48, 32, 16, 8].into_iter().filter(|&bk| bk <= MAX_KEYS).find_map(fits)
    }

    fn width(&self) -> usize {
        self.ns * self.s
    }

    /// Query rows a workgroup.
    fn bq(&self) -> usize {
        self.ns * self.t
    }

    /// Row strides of the staged K and V rows and of P, in halves: 16-byte aligned rows that
    /// start in different banks.
    fn skd(&self) -> usize {
        self.d + 8
    }
    fn svd(&self) -> usize {
        self.dv + 8
    }
    fn sp(&self) -> usize {
        self.bk + 8
    }

    /// Halves of `hp` a subgroup owns: its Q rows before the key loop, P's two halves in it.
    fn hpr(&self) -> usize {
        (2 * self.t * self.sp()).max(self.t * self.skd())
    }

    /// Row stride of a subgroup's f32 scratch: scores, then `P·V`.
    fn ss(&self) -> usize {
        self.bk.max(self.dv) + 4
    }

    /// Elements of `hs` (K's block, then V's), `hp`, `fs` and `fr`.
    fn sizes(&self) -> (usize, usize, usize, usize) {
        let hs = self.bk * (self.skd() + self.svd());
        let fs = self.ns * self.t * self.ss();
        (hs, self.ns * self.hpr(), fs, self.ns * self.t * self.lpr)
    }

    fn shared_bytes(&self) -> usize {
        let (hs, hp, fs, fr) = self.sizes();
        2 * (hs + hp) + 4 * (fs + fr)
    }
}

/// Whether an attention of `dims` with operands of `dtype` runs on this kernel on `target`:
/// what the rewrite asks before it keeps the attention whole.
pub(crate) fn runs_on_tensor_cores(dims: &Dims, dtype: DType, target: &Target) -> bool {
    let fits = |c: Coop| {
        let (w, shared) = (target.width as usize, target.shared_bytes as usize);
        Layout::of(dims.d, dims.dv, c, w, shared).is_some()
    };
    dtype == DType::F16 && dims.tq > super::decode::MAX_ROWS && target.coop.is_some_and(fits)
}

/// The forward of `a` on cooperative matrices, or None where it does not suit them.
pub(super) fn forward(
    a: &Attn,
    out: &Operand,
    coop: Coop,
    width: usize,
    shared: usize,
) -> Option<KernelSource> {
    let halves = [a.q, a.k, a.v].iter().all(|o| o.dtype == DType::F16);
    let l = Layout::of(a.d, a.dv, coop, width, shared)?;
    let nqb = a.tq.div_ceil(l.bq());
    let groups = a.batch * a.hq * nqb;
    if !halves || groups == 0 || out.dtype != DType::F32 {
        return None;
    }
    // Operands whose words hold halves are staged through the arena's f16 view.
    let viewed = |o: &Operand| Operand { f16_view: o.packs_halves(), ..o.clone() };
    let (q, k, v) = (viewed(a.q), viewed(a.k), viewed(a.v));
    let (hs, hp, fs, fr) = l.sizes();
    let w = l.width();
    let t = l.t;
    let a_tile = format!("coop_mat{t}x{t}<f16,A>");
    let b_tile = format!("coop_mat{t}x{t}<f16,B>");
    let c_tile = format!("coop_mat{t}x{t}<f32,C>");
    let (tq, tk, d) = (a.tq, a.tk, a.d);
    let kv = KeyPanels::of(&l, &k, &v, tk);
    let body = fill(
        BODY,
        &[
            ("GUARD", subgroup_guard("subgroup", "subgroups", "sid", "whole", l.ns)),
            ("NQB", nqb.to_string()),
            ("BQ", l.bq().to_string()),
            ("HQ", a.hq.to_string()),
            ("HKV", a.hkv.to_string()),
            ("REP", a.rep().to_string()),
            ("MBASE", a.mask_layout().0),
            ("STAGE_Q", stage(&q, "(bh * $TQ$u + q0 + r)", (l.bq(), d, tq), "q0", &q_slot(&l))),
            ("Q_TILES", q_tiles(&l, &a_tile)),
            ("LANES", lanes(&l)),
            ("KEND", key_end(a, l.bq())),
            ("KV_REGS", kv.regs),
            ("FETCH_FIRST", kv.fetch.replace("$K$", "0u")),
            ("PUT_KV", kv.put),
            ("FETCH_NEXT", kv.fetch.replace("$K$", "k0 + $BK$u")),
            ("SCORES", scores(&l, &b_tile, &c_tile)),
            ("SOFTMAX", softmax(a, &l)),
            ("PV", pv(&l, &a_tile, &b_tile, &c_tile)),
            ("ADD_PV", add_pv(&l)),
            ("SUMS", sums(&l)),
            ("STORES", stores(&l, out)),
            ("TQ", tq.to_string()),
            ("TK", tk.to_string()),
            ("FS", (t * l.ss()).to_string()),
            ("HPR", l.hpr().to_string()),
            ("LPR", l.lpr.to_string()),
            ("BK", l.bk.to_string()),
            ("GROUPS", groups.to_string()),
            ("W", w.to_string()),
        ],
    );
    let decls = format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n{}\
         var<workgroup> hs: array<f16, {hs}>;\nvar<workgroup> hp: array<f16, {hp}>;\n\
         var<workgroup> fs: array<f32, {fs}>;\nvar<workgroup> fr: array<f32, {fr}>;\n",
        f16_view_decl(&[&q, &k, &v]),
    );
    Some(KernelSource {
        body: decls + &body,
        invocations: (groups * w) as u64,
        dropout_node: None,
        width: Some(w as u32),
    })
}

/// Element `index` of `o` loaded in two parts, as the products' panels are: `(zero, load,
/// half)`, the register's zero, the expression loading it (its word, or for a sliced or summed
/// view its f32 value through `load`) and `half(register)`, the f16 staged from it — exact, the
/// policy having rounded the value to f16. `$K$` in `index` is the block's first key, `k0` when
/// staged.
fn fetched_half(o: &Operand, index: &str) -> (&'static str, String, impl Fn(&str) -> String) {
    let viewed = o.sliced.is_some() || o.summed > 1;
    let (zero, word, shift) = if viewed {
        ("0.0", load(o, index), None)
    } else {
        let f = fetch_word(o, index);
        (f.zero, f.word, f.shift.map(|sh| sh.replace("$K$", "k0")))
    };
    let o = o.clone();
    let half = move |reg: &str| {
        if viewed {
            crate::halves::staged_f16(reg)
        } else {
            word_half(&o, reg, shift.as_deref().unwrap_or("0u"))
        }
    };
    (zero, word, half)
}

/// The f16 value of element `index` of `o`, loaded and converted at once (`fetched_half`).
fn half_at(o: &Operand, index: &str) -> String {
    let (_, word, half) = fetched_half(o, index);
    half(&word)
}

/// WGSL staging `rows × cols` elements of `o` (row `r` from word `row · cols`, where `row` is
/// a WGSL expression of `r`; rows at or past `limit` from `start` read as zeros) as f16 into
/// `slot`, an expression `array[...]` of `r` and `c`.
fn stage(
    o: &Operand,
    row: &str,
    (rows, cols, limit): (usize, usize, usize),
    start: &str,
    slot: &str,
) -> String {
    let value = half_at(o, &format!("{row} * {cols}u + c"));
    format!(
        "for (var x = tid; x < {n}u; x = x + $W$u) {{
        let r = x / {cols}u;
        let c = x % {cols}u;
        var h = 0.0h;
        if ({start} + r < {limit}u) {{ h = {value}; }}
        {slot} = h;
    }}",
        n = rows * cols
    )
}

/// K's and V's elements of a key block through registers: each invocation fetches its
/// elements of the next block (the raw words, converted only when staged, so the loads stay in
/// flight while the current block is multiplied) and stages them at the top of the next
/// iteration. Element `e = tid + p·W` of K's block is key `e / D`, dim `e % D`; V's likewise.
struct KeyPanels {
    regs: String,
    /// `$K$`: the block's first key.
    fetch: String,
    put: String,
}

impl KeyPanels {
    fn of(l: &Layout, k: &Operand, v: &Operand, tk: usize) -> KeyPanels {
        let w = l.width();
        let (mut regs, mut fetch, mut put) = (String::new(), String::new(), String::new());
        for (name, o, cols, slot) in [("rk", k, l.d, kv_slot(l, 0)), ("rv", v, l.dv, kv_slot(l, 1))]
        {
            let n = l.bk * cols;
            for p in 0..n.div_ceil(w) {
                let at =
                    format!("let e = tid + {}u; let r = e / {cols}u; let c = e % {cols}u;", p * w);
                let index = format!("(kvrow * {tk}u + $K$ + r) * {cols}u + c");
                let reg = format!("{name}{p}");
                let (zero, word, half) = fetched_half(o, &index);
                let value = half(&reg);
                let whole = if (p + 1) * w <= n { String::new() } else { format!("e < {n}u && ") };
                regs += &format!("var {reg} = {zero};\n    ");
                fetch += &format!(
                    "{{ {at} {reg} = {zero}; \
                     if ({whole}$K$ + r < {tk}u) {{ {reg} = {word}; }} }}\n        "
                );
                let guard =
                    if whole.is_empty() { String::new() } else { format!("if (e < {n}u) ") };
                put += &format!("{{ {at} {guard}{{ {slot} = {value}; }} }}\n        ");
            }
        }
        KeyPanels { regs, fetch, put }
    }
}

/// Where Q's row `r` (of the workgroup's) and column `c` are staged: in its subgroup's `hp`.
fn q_slot(l: &Layout) -> String {
    format!("hp[(r / {t}u) * {}u + (r % {t}u) * {}u + c]", l.hpr(), l.skd(), t = l.t)
}

/// Where K's (`which` 0) or V's (1) row `r` and column `c` of the block are staged in `hs`.
fn kv_slot(l: &Layout, which: usize) -> String {
    if which == 0 {
        format!("hs[r * {}u + c]", l.skd())
    } else {
        format!("hs[{}u + r * {}u + c]", l.bk * l.skd(), l.svd())
    }
}

/// The subgroup's Q tiles, loaded once.
fn q_tiles(l: &Layout, a_tile: &str) -> String {
    let base = "sid * $HPR$u";
    (0..l.d / l.t)
        .map(|kk| {
            let at = format!("{base} + {}u", kk * l.t);
            format!("let qa{kk} = coopLoadT<{a_tile}>(&hp[{at}], {}u);", l.skd())
        })
        .collect::<Vec<_>>()
        .join("\n    ")
}

/// Each lane's rows (`row{i}`, `qi{i}`), running maxima and sums, and output accumulators.
fn lanes(l: &Layout) -> String {
    let mut s = format!("let part = lane % {}u;\n", l.lpr);
    for i in 0..l.rpl {
        s += &format!(
            "    let row{i} = lane / {lpr}u + {off}u;\n    let qi{i} = q0 + sid * {t}u + row{i};\n\
             \x20   var m{i} = {NEG};\n    var l{i} = 0.0;\n",
            lpr = l.lpr,
            off = i * l.s / l.lpr,
            t = l.t,
        );
        for c in 0..l.dv / l.lpr / 4 {
            s += &format!("    var o{i}_{c} = vec4<f32>(0.0);\n");
        }
    }
    s
}

/// Each subgroup's `Q·Kᵀ` tiles into its scratch.
fn scores(l: &Layout, b_tile: &str, c_tile: &str) -> String {
    let mut s = String::new();
    for j in 0..l.bk / l.t {
        s += &format!("{{\n            var c = {c_tile}();\n");
        for kk in 0..l.d / l.t {
            let at = j * l.t * l.skd() + kk * l.t;
            s += &format!(
                "            c = coopMultiplyAdd(qa{kk}, \
                 coopLoad<{b_tile}>(&hs[{at}u], {}u), c);\n",
                l.skd()
            );
        }
        s += &format!(
            "            coopStoreT(c, &fs[sid * $FS$u + {}u], {}u);\n        }}\n        ",
            j * l.t,
            l.ss()
        );
    }
    s
}

/// The lanes' scores of the block (key `kj{x} = k0 + x·LPR + part` in slot `x`), the row
/// maxima, the rescaling and P's two halves.
fn softmax(a: &Attn, l: &Layout) -> String {
    let (tq, tk) = (a.tq, a.tk);
    let (_, msq, msk) = a.mask_layout();
    let keys = l.bk / l.lpr;
    let (ss, sp, t, lpr) = (l.ss(), l.sp(), l.t, l.lpr);
    let mut s = String::new();
    for x in 0..keys {
        s += &format!("let kj{x} = k0 + {}u + part;\n        ", x * lpr);
    }
    for i in 0..l.rpl {
        s += &format!("var bm{i} = {NEG};\n        ");
        for x in 0..keys {
            let causal = if a.causal {
                format!(" && kj{x} + {tq}u <= qi{i} + {tk}u")
            } else {
                String::new()
            };
            let mask = match a.mask {
                Some(m) => {
                    format!(" + {}", load(m, &format!("mbase + qi{i} * {msq}u + kj{x} * {msk}u")))
                }
                None => String::new(),
            };
            let score = format!("fs[sid * {}u + row{i} * {ss}u + {}u + part]", t * ss, x * lpr);
            s += &format!(
                "let ok{i}_{x} = qi{i} < {tq}u && kj{x} < {tk}u{causal};
        var s{i}_{x} = {NEG};
        if (ok{i}_{x}) {{ s{i}_{x} = {score} * {scale:?}{mask}; }}
        bm{i} = max(bm{i}, s{i}_{x});
        ",
                scale = a.scale as f32,
            );
        }
    }
    if lpr > 1 {
        // The row's shares meet in `fr`.
        s += &format!(
            "let fr0 = (sid * {t}u + row0) * {lpr}u;
        fr[fr0 + part] = bm0;
        workgroupBarrier();
        for (var y = 0u; y < {lpr}u; y = y + 1u) {{ bm0 = max(bm0, fr[fr0 + y]); }}
        "
        );
    }
    for i in 0..l.rpl {
        s += &format!(
            "{{
            let mn = max(m{i}, bm{i});
            let alpha = exp(m{i} - mn);
            m{i} = mn;
            l{i} = l{i} * alpha;
"
        );
        for c in 0..l.dv / lpr / 4 {
            s += &format!("            o{i}_{c} = o{i}_{c} * alpha;\n");
        }
        for x in 0..keys {
            let at = format!("sid * {}u + row{i} * {sp}u + {}u + part", l.hpr(), x * lpr);
            s += &format!(
                "            {{
                let p = select(0.0, exp(s{i}_{x} - mn), ok{i}_{x});
                l{i} = l{i} + p;
                let hi = select(0.0, bitcast<f32>(bitcast<u32>(p) & 0xffffe000u), \
                 p >= {MIN_NORMAL});
                hp[{at}] = mgn_f16_staged(hi);
                hp[{at} + {lo}u] = mgn_f16_staged(p - hi);
            }}
",
                lo = t * sp
            );
        }
        s += "        }\n        ";
    }
    s
}

/// Each subgroup's `hi·V + lo·V` into its scratch.
fn pv(l: &Layout, a_tile: &str, b_tile: &str, c_tile: &str) -> String {
    let (t, sp, svd) = (l.t, l.sp(), l.svd());
    let v0 = l.bk * l.skd();
    let mut s = String::new();
    for jj in 0..l.dv / t {
        s += &format!("var acc{jj} = {c_tile}();\n        ");
    }
    for kk in 0..l.bk / t {
        s += &format!(
            "{{\n            let ph = coopLoadT<{a_tile}>(&hp[sid * $HPR$u + {}u], {sp}u);\n\
             \x20           let pl = coopLoadT<{a_tile}>(&hp[sid * $HPR$u + {}u], {sp}u);\n",
            kk * t,
            t * sp + kk * t
        );
        for jj in 0..l.dv / t {
            let at = v0 + kk * t * svd + jj * t;
            s += &format!(
                "            let vb{jj} = coopLoadT<{b_tile}>(&hs[{at}u], {svd}u);\n\
                 \x20           acc{jj} = coopMultiplyAdd(ph, vb{jj}, acc{jj});\n\
                 \x20           acc{jj} = coopMultiplyAdd(pl, vb{jj}, acc{jj});\n"
            );
        }
        s += "        }\n        ";
    }
    for jj in 0..l.dv / t {
        s +=
            &format!("coopStoreT(acc{jj}, &fs[sid * $FS$u + {}u], {}u);\n        ", jj * t, l.ss());
    }
    s
}

/// Each lane adds its rows' share of the block's `P·V` (columns `part · Dv/LPR ..`).
fn add_pv(l: &Layout) -> String {
    let cols = l.dv / l.lpr;
    let mut s = String::new();
    for i in 0..l.rpl {
        for c in 0..cols / 4 {
            let at = format!("sid * $FS$u + row{i} * {}u + part * {cols}u + {}u", l.ss(), 4 * c);
            s += &format!(
                "{{ let at = {at}; o{i}_{c} = o{i}_{c} + vec4<f32>(fs[at], fs[at + 1u], \
                 fs[at + 2u], fs[at + 3u]); }}\n        "
            );
        }
    }
    s
}

/// Each row's sum: its lanes' shares added in `fr` where a row has several lanes.
fn sums(l: &Layout) -> String {
    if l.lpr == 1 {
        return String::new();
    }
    format!(
        "workgroupBarrier();
    let fr0 = (sid * {t}u + row0) * {lpr}u;
    fr[fr0 + part] = l0;
    workgroupBarrier();
    l0 = 0.0;
    for (var y = 0u; y < {lpr}u; y = y + 1u) {{ l0 = l0 + fr[fr0 + y]; }}",
        t = l.t,
        lpr = l.lpr
    )
}

/// `O / l` of each row the lane holds, its columns `part · Dv/LPR ..`.
fn stores(l: &Layout, out: &Operand) -> String {
    let cols = l.dv / l.lpr;
    let mut s = String::new();
    for i in 0..l.rpl {
        s += &format!(
            "{{\n        let inv = select(0.0, 1.0 / l{i}, l{i} > 0.0);\n        \
             if (qi{i} < $TQ$u) {{\n            \
             let o = (bh * $TQ$u + qi{i}) * {dv}u + part * {cols}u;\n",
            dv = l.dv
        );
        for c in 0..cols / 4 {
            for (e, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                let value = format!("select({NAN}, o{i}_{c}.{comp} * inv, whole)");
                s += &format!(
                    "            {}\n",
                    store(out, &format!("o + {}u", 4 * c + e), &value)
                );
            }
        }
        s += "        }\n    }\n    ";
    }
    s
}

/// The kernel: Q staged and loaded as tiles, then per key block K and V staged, the scores, the
/// softmax, `P·V`; the sums and the stores.
const BODY: &str = "@compute @workgroup_size($W$)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) grid: vec3<u32>, \
    @builtin(local_invocation_index) tid: u32, @builtin(subgroup_id) subgroup: u32, \
    @builtin(subgroup_invocation_id) lane: u32, @builtin(num_subgroups) subgroups: u32) {
    let wid = wg.x + (wg.y + wg.z * grid.y) * grid.x;
    if (wid >= $GROUPS$u) { return; }
    $GUARD$
    let bh = wid / $NQB$u;
    let q0 = (wid - bh * $NQB$u) * $BQ$u;
    let kvrow = (bh / $HQ$u) * $HKV$u + (bh % $HQ$u) / $REP$u;
    let mbase = $MBASE$;
    $STAGE_Q$
    workgroupBarrier();
    $Q_TILES$
    $LANES$
    let kend = $KEND$;
    $KV_REGS$
    if (kend > 0u) {
        $FETCH_FIRST$
    }
    for (var k0 = 0u; k0 < kend; k0 = k0 + $BK$u) {
        workgroupBarrier();
        $PUT_KV$
        workgroupBarrier();
        if (k0 + $BK$u < kend) {
            $FETCH_NEXT$
        }
        $SCORES$
        workgroupBarrier();
        $SOFTMAX$
        workgroupBarrier();
        $PV$
        workgroupBarrier();
        $ADD_PV$
    }
    $SUMS$
    $STORES$
}
";

#[cfg(test)]
mod tests {
    use super::{forward, runs_on_tensor_cores, Layout};
    use crate::kernels::attention::Attn;
    use crate::kernels::{Coop, Operand, Target};
    use mgn_ir::shape::attention::dims;
    use mgn_ir::DType;

    /// An f16 operand: a rounded view (f32 words) or halves two to a word.
    fn half(offset: usize, shape: &[usize], rounded: bool) -> Operand {
        Operand { rounded, ..Operand::at(offset, shape, DType::F16) }
    }

    /// Every tile and subgroup size a device may have (one lane a row, several lanes a row,
    /// several rows a lane) makes a kernel naga validates, within the shared memory it was
    /// given, at the shapes of Whisper's encoder, a causal grouped-query attention with a mask
    /// and lengths that are not whole tiles, with operands as rounded views and as halves.
    #[test]
    fn kernels_for_every_tile_and_subgroup_validate() {
        let cases = [
            (1, 6, 6, 1500, 1500, 64, 64, false, false),
            (2, 4, 2, 37, 70, 32, 16, true, true),
            (1, 2, 1, 9, 5, 16, 32, true, false),
        ];
        for (t, s) in [(16, 32), (8, 8), (16, 16), (8, 32), (16, 8)] {
            let coop = Coop { tile: t, subgroup: s, everywhere: false };
            for (b, hq, hkv, tq, tk, d, dv, causal, rounded) in cases {
                let x = [
                    half(0, &[b, hq, tq, d], rounded),
                    half(1 << 20, &[b, hkv, tk, d], rounded),
                    half(2 << 20, &[b, hkv, tk, dv], rounded),
                    Operand::at(3 << 20, &[b, 1, tq, tk], DType::F32),
                ];
                let out = Operand::at(4 << 20, &[b, hq, tq, dv], DType::F32);
                let a = Attn::new(&x, causal, 0.125, causal).unwrap();
                let what = format!("tile {t}, subgroup {s}, {:?}", x[0].shape);
                if s < t && 2 * dv > super::MAX_HELD {
                    // Two rows a lane: too many accumulators for heads this wide.
                    assert!(forward(&a, &out, coop, 256, 49_152).is_none(), "{what}");
                    continue;
                }
                let src = forward(&a, &out, coop, 256, 49_152).unwrap_or_else(|| panic!("{what}"));
                crate::kernels::check::spirv(&src.body).unwrap_or_else(|e| panic!("{what}: {e}"));
                let l = Layout::of(d, dv, coop, 256, 49_152).unwrap();
                assert!(l.shared_bytes() <= 49_152, "{what}");
                assert_eq!(src.width, Some(l.width() as u32), "{what}");
                // P's two halves staged with the probed conversion.
                assert!(src.body.contains("mgn_f16_staged(p - hi)"), "{what}");
                assert_eq!(src.body.contains("arena_h"), !rounded, "{what}");
            }
        }
    }

    /// The key block shrinks to what the shared memory holds; heads that are not whole tiles,
    /// too wide, or too little memory for the smallest block have no kernel.
    #[test]
    fn the_key_block_is_the_largest_that_fits() {
        let coop = Coop { tile: 16, subgroup: 32, everywhere: false };
        let bk = |shared: usize| Layout::of(64, 64, coop, 256, shared).map(|l| l.bk);
        assert_eq!(bk(49_152), Some(super::MAX_KEYS));
        assert_eq!(bk(32_768), Some(16));
        assert_eq!(bk(16_384), None);
        assert_eq!(Layout::of(40, 64, coop, 256, 65_536), None);
        assert_eq!(Layout::of(64, 256, coop, 256, 1 << 20), None);
        assert!(Layout::of(64, 64, coop, 32, 65_536).is_some_and(|l| l.ns == 1));
    }

    /// The rewrite's question: f16 operands, a device with tiles, more rows than decoding's.
    #[test]
    fn only_f16_heads_on_a_device_with_tiles_run_on_them() {
        let d = dims(&[1, 6, 1500, 64], &[1, 6, 1500, 64], &[1, 6, 1500, 64]).unwrap();
        let coop = Coop { tile: 16, subgroup: 32, everywhere: false };
        let target = Target { width: 256, shared_bytes: 49_152, coop: Some(coop) };
        assert!(runs_on_tensor_cores(&d, DType::F16, &target));
        assert!(!runs_on_tensor_cores(&d, DType::F32, &target));
        assert!(!runs_on_tensor_cores(&d, DType::BF16, &target));
        assert!(!runs_on_tensor_cores(&d, DType::F16, &Target { coop: None, ..target }));
        let one = dims(&[1, 6, 1, 64], &[1, 6, 1500, 64], &[1, 6, 1500, 64]).unwrap();
        assert!(!runs_on_tensor_cores(&one, DType::F16, &target));
    }
}
