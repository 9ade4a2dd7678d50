//! The forward for many query rows (`Op::Attention` past the decode kernel's few): both of
//! its products register-blocked, as the tiled matrix product runs them, with an online softmax
//! between them, so no `Tq × Tk` score matrix is ever stored.
//!
//! One workgroup per (batch·query head, tile of `BQ` query rows); invocation `(tx, ty)` of a
//! `TX × TY` grid owns the tile's rows `4·ty .. 4·ty + 4`. For each block of `BK = 4·TX` keys:
//!
//! 1. `S = Q·Kᵀ` over panels of `BD` head dims: Q's and K's panels are staged transposed (dim
//!    major), and the invocation multiplies a vec4 of its rows by a vec4 of its keys
//!    `4·tx .. 4·tx + 4` per dim — a 4×4 register block.
//! 2. The block's row maxima: each invocation's partial maximum of its four keys goes to shared
//!    memory, one invocation per row merges them with the row's running maximum `m`, and everyone
//!    rescales what it holds by `e^(m_old − m_new)`: its share of the row sums `l` and its output
//!    accumulators.
//! 3. `P = e^(S − m)` goes to shared memory (key major), and `O += P·V` over panels of `BJ` keys
//!    of V: the invocation's rows against its value columns `4·(tx + TX·c) ..`, vec4 by vec4.
//!
//! At the end each row's sum is the sum of its invocations' shares, and `O / l` is stored. A
//! hidden key (causal, or past the lengths) has no probability at all; a row that sees no key
//! ends with `l = 0` and stores zeros, as on the CPU.
//!
//! Panels are at most 16 deep (`MAX_PANEL`), which fits the 16 KiB floor at 128 invocations, and
//! pass through registers: each invocation issues all its loads of a panel before it stores any.
//! The block's scratch (the partial maxima, then the partial sums) lies in P's buffer, which
//! nothing reads at those times.
//!
//! Where it runs: attentions the plan does not take through their score matrix
//! (`rewrite/attention_matmul.rs`): short sequences, score matrices past that path's budget
//! (long-context prefill) or past what the device holds (`rewrite::for_device`), and tests'
//! `AttentionPath::Tiled`. Measured on the H200 (docs/benchmarks/) it runs 2.4–2.6× faster than the
//! scalar-loop forward it replaced at long sequences, but the score-matrix path is faster still
//! where it applies (Whisper's attention 116 µs against 235: its products run 8×8 register blocks
//! at 29 TFLOP/s) and even at 128 positions whole forwards are no faster with this kernel, so the
//! default path is unchanged.

use super::parts::key_end;
use super::{entry, fill, Attn, NEG};
use crate::kernels::{load, store, KernelSource, Operand};

/// Invocations along a row: 16, so a block holds 64 keys and a warp of 32 covers two rows.
const TX: usize = 16;
/// Keys per block.
const BK: usize = 4 * TX;
/// The deepest panels: measured on an H100 (docs/benchmarks/), 16-deep panels of Q, K and V
/// ran Whisper's attention in 300 µs, whole-head panels (Q staged once, K and V prefetched a
/// block ahead, 36 KiB) in 450.
const MAX_PANEL: usize = 16;
/// The widest value rows the kernel holds (`4 · CO` accumulators per row, `CO = ⌈Dv / 64⌉`).
pub(super) const MAX_DV: usize = 256;

/// The tile sizes of one kernel, all in f32 words where they are sizes of shared memory.
#[derive(Debug, PartialEq)]
struct Blocks {
    /// Invocations, query rows per tile (`4 · TY`).
    w: usize,
    bq: usize,
    /// Head dims per panel of Q and K, and keys per panel of V.
    bd: usize,
    bj: usize,
    /// The head dims padded to whole panels, the value columns to whole vec4s of every
    /// invocation (`4 · TX · CO`).
    dp: usize,
    dvp: usize,
}

impl Blocks {
    /// The blocks of `a` at `width` invocations within `shared` bytes, or None when the heads
    /// are too wide or the workgroup too narrow.
    fn of(a: &Attn, width: usize, shared: usize) -> Option<Blocks> {
        if a.dv > MAX_DV || a.d == 0 || a.dv == 0 || width < 64 {
            return None;
        }
        let w = if width >= 128 { 128 } else { 64 };
        let bq = 4 * (w / TX);
        let dvp = a.dv.div_ceil(BK) * BK;
        let words = shared / 4;
        // P (and the scratch in it) and the row statistics have fixed sizes; the panels share
        // what is left.
        let rest = words.checked_sub(BK * (bq + 4) + 2 * bq)?;
        let pow2_at_most =
            |n: usize| if n == 0 { 0 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) };
        let bd = pow2_at_most(rest / (bq + 4 + BK + 4)).min(MAX_PANEL).min(a.d.next_power_of_two());
        let bj = pow2_at_most(rest / dvp).min(MAX_PANEL);
        if bd == 0 || bj == 0 {
            return None;
        }
        Some(Blocks { w, bq, bd, bj, dp: a.d.div_ceil(bd) * bd, dvp })
    }

    /// Words of one row of Q's panel (and of P): the tile's rows and 4 of padding, so the
    /// transposing stores of consecutive dims fall in different banks.
    fn qs(&self) -> usize {
        self.bq + 4
    }

    /// Where K's panel starts (V's panel starts at 0, where Q's does).
    fn ko(&self) -> usize {
        self.bd * self.qs()
    }

    /// Words of the panels' region: Q and K panels, or V's.
    fn region(&self) -> usize {
        (self.ko() + self.bd * (BK + 4)).max(self.bj * self.dvp)
    }

    /// Where P starts, the row statistics, and the whole array, in words.
    fn layout(&self) -> (usize, usize, usize) {
        let po = self.region();
        let so = po + BK * self.qs();
        (po, so, so + 2 * self.bq)
    }
}

/// The blocked forward of `a`, or None when its heads or the device do not suit it (the tiled
/// forward runs then).
pub(super) fn forward(
    a: &Attn,
    out: &Operand,
    width: usize,
    shared: usize,
) -> Option<KernelSource> {
    let b = Blocks::of(a, width, shared)?;
    let nqb = a.tq.div_ceil(b.bq);
    let groups = a.batch * a.hq * nqb;
    if groups == 0 {
        return None;
    }
    let (po, so, words) = b.layout();
    let (q, k, v) = panels(a, &b);
    let decls = format!("{}{}\n    {}\n    {}\n    ", accumulators(&b), q.0, k.0, v.0);
    let body = fill(
        &PANELS.replace("$STEPS$", BLOCK),
        &[
            ("NQB", nqb.to_string()),
            ("BQ", b.bq.to_string()),
            ("BK", BK.to_string()),
            ("BD", b.bd.to_string()),
            ("BJ", b.bj.to_string()),
            ("DP", b.dp.to_string()),
            ("TX", TX.to_string()),
            ("HQ", a.hq.to_string()),
            ("HKV", a.hkv.to_string()),
            ("REP", a.rep().to_string()),
            ("MBASE", a.mask_layout().0),
            ("PO", po.to_string()),
            ("SO", so.to_string()),
            ("NEG", NEG.into()),
            ("KEND", key_end(a, b.bq)),
            ("DECLS", decls),
            ("FETCH_Q", q.1),
            ("PUT_Q", q.2),
            ("FETCH_K", k.1),
            ("PUT_K", k.2),
            ("FETCH_V", v.1),
            ("PUT_V", v.2),
            ("S_PANEL", s_panel(&b)),
            ("SCORES", scores(a)),
            ("RESCALE", rescale(&b)),
            ("STORE_P", store_p(&b)),
            ("PV_PANEL", pv_panel(&b)),
            ("SHARES", shares(&b)),
            ("STORES", stores(a, &b, out)),
        ],
    );
    let array = format!("var<workgroup> sh: array<vec4<f32>, {}>;", words / 4);
    Some(KernelSource {
        body: entry(b.w, &array, groups, &body),
        invocations: (groups * b.w) as u64,
        dropout_node: None,
        width: Some(b.w as u32),
    })
}

/// A panel's registers, the WGSL that loads them and the WGSL that stores them to `sh`.
type Staged = (String, String, String);

/// A `rows × cols` panel through registers: every slot's load is issued before any is stored,
/// so their latencies overlap. Slot p of an invocation is element e = tid + p·W of the panel,
/// (e / cols, e % cols): consecutive invocations load consecutive words of a row. `guard`,
/// `src` and `dst` are WGSL over `r` and `c`: whether the element exists, its value, and its
/// word in `sh`.
fn panel(
    w: usize,
    name: &str,
    (rows, cols): (usize, usize),
    guard: &str,
    src: &str,
    dst: &str,
) -> Staged {
    let n = rows * cols;
    let (mut fetch, mut put) = (String::new(), String::new());
    for p in 0..n.div_ceil(w) {
        let at = format!("let e = tid + {}u; let r = e / {cols}u; let c = e % {cols}u;", p * w);
        let inside = if (p + 1) * w <= n { String::new() } else { format!("e < {n}u && ") };
        let get = format!("{name}{p} = 0.0; if ({inside}{guard}) {{ {name}{p} = {src}; }}");
        fetch += &format!("{{ {at} {get} }}\n        ");
        let put_one = format!("let at = {dst}; sh[at >> 2u][at & 3u] = {name}{p};");
        put += &if inside.is_empty() {
            format!("{{ {at} {put_one} }}\n        ")
        } else {
            format!("{{ {at} if (e < {n}u) {{ {put_one} }} }}\n        ")
        };
    }
    let decl = (0..n.div_ceil(w)).map(|p| format!("var {name}{p}: f32;")).collect::<Vec<_>>();
    (decl.join(" "), fetch, put)
}

/// The Q, K and V panels of `b`'s blocks.
fn panels(a: &Attn, b: &Blocks) -> (Staged, Staged, Staged) {
    let (d, dv, tq, tk) = (a.d, a.dv, a.tq, a.tk);
    let (qs, ks, ko) = (b.qs(), BK + 4, b.ko());
    let q = panel(
        b.w,
        "rq",
        (b.bq, b.bd),
        &format!("q0 + r < {tq}u && d0 + c < {d}u"),
        &load(a.q, &format!("(bh * {tq}u + q0 + r) * {d}u + d0 + c")),
        &format!("c * {qs}u + r"),
    );
    let k = panel(
        b.w,
        "rk",
        (BK, b.bd),
        &format!("k0 + r < {tk}u && d0 + c < {d}u"),
        &load(a.k, &format!("(kvrow * {tk}u + k0 + r) * {d}u + d0 + c")),
        &format!("{ko}u + c * {ks}u + r"),
    );
    let v = panel(
        b.w,
        "rv",
        (b.bj, b.dvp),
        &format!("k0 + j0 + r < {tk}u && c < {dv}u"),
        &load(a.v, &format!("(kvrow * {tk}u + k0 + j0 + r) * {dv}u + c")),
        &format!("r * {}u + c", b.dvp),
    );
    (q, k, v)
}

/// S += Q·Kᵀ over one panel: a vec4 of rows times a vec4 of keys per dim.
fn s_panel(b: &Blocks) -> String {
    let (qs, ks, ko) = (b.qs(), BK + 4, b.ko());
    let mut s = String::new();
    for dd in 0..b.bd {
        s += &format!(
            "let qa{dd} = sh[{}u + ty];\n            let kb{dd} = sh[{}u + tx];\n            ",
            dd * qs / 4,
            (ko + dd * ks) / 4
        );
        for (i, comp) in ["x", "y", "z", "w"].iter().enumerate() {
            s += &format!("s{i} = s{i} + qa{dd}.{comp} * kb{dd};\n            ");
        }
    }
    s
}

/// The scores of the block: scaled, masked, hidden keys at −FLT_MAX with `ok` false.
fn scores(a: &Attn) -> String {
    let (tq, tk) = (a.tq, a.tk);
    let (_, msq, msk) = a.mask_layout();
    let causal = if a.causal { format!(" && j + {tq}u <= qi + {tk}u") } else { String::new() };
    let mask = match a.mask {
        Some(m) => format!(" + {}", load(m, &format!("mbase + qi * {msq}u + j * {msk}u"))),
        None => String::new(),
    };
    let mut scores = String::new();
    for i in 0..4 {
        for (c, comp) in ["x", "y", "z", "w"].iter().enumerate() {
            scores += &fill(
                "{
                let qi = q0 + 4u * ty + $I$u;
                let j = k0 + 4u * tx + $C$u;
                ok$I$.$COMP$ = qi < $TQ$u && j < $TK$u$CAUSAL$;
                if (ok$I$.$COMP$) {
                    s$I$.$COMP$ = s$I$.$COMP$ * $SCALE$$MASK$;
                } else {
                    s$I$.$COMP$ = $NEG$;
                }
            }
            ",
                &[
                    ("I", i.to_string()),
                    ("C", c.to_string()),
                    ("COMP", comp.to_string()),
                    ("TQ", tq.to_string()),
                    ("TK", tk.to_string()),
                    ("CAUSAL", causal.clone()),
                    ("SCALE", format!("{:?}", a.scale as f32)),
                    ("MASK", mask.clone()),
                    ("NEG", NEG.into()),
                ],
            );
        }
    }
    scores
}

/// O += P·V over one panel of V: the rows' probabilities of key j times the value columns.
fn pv_panel(b: &Blocks) -> String {
    let (po, _, _) = b.layout();
    let (qs, co) = (b.qs(), b.dvp / BK);
    let mut s = String::new();
    for jj in 0..b.bj {
        s += &format!(
            "let pj{jj} = sh[{}u + (j0 + {jj}u) * {}u + ty];\n            ",
            po / 4,
            qs / 4
        );
        for c in 0..co {
            s +=
                &format!("let vj{jj}_{c} = sh[{}u + tx];\n            ", (jj * b.dvp) / 4 + TX * c);
            for (i, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                s += &format!("o{i}_{c} = o{i}_{c} + pj{jj}.{comp} * vj{jj}_{c};\n            ");
            }
        }
    }
    s
}

/// Each row's share of the sums and its output accumulators.
fn accumulators(b: &Blocks) -> String {
    let mut decls = String::new();
    for i in 0..4 {
        decls += &format!("var l{i} = 0.0;\n    ");
        for c in 0..b.dvp / BK {
            decls += &format!("var o{i}_{c} = vec4<f32>(0.0);\n    ");
        }
    }
    decls
}

/// Each row's running maximum, the block's rescaling of everything held, the probabilities.
fn rescale(b: &Blocks) -> String {
    let (_, so, _) = b.layout();
    let mut s = String::new();
    for i in 0..4 {
        s += &format!(
            "{{
            let r = 4u * ty + {i}u;
            let m = sh[({so}u + r) >> 2u][r & 3u];
            let cr = sh[({so}u + {bq}u + r) >> 2u][r & 3u];
            p{i} = select(vec4<f32>(0.0), exp(s{i} - vec4<f32>(m)), ok{i});
            l{i} = l{i} * cr + p{i}.x + p{i}.y + p{i}.z + p{i}.w;\n",
            bq = b.bq
        );
        for c in 0..b.dvp / BK {
            s += &format!("            o{i}_{c} = o{i}_{c} * cr;\n");
        }
        s += "        }\n        ";
    }
    s
}

/// P stored key major: key 4·tx + c's probabilities of the invocation's four rows are one
/// vec4.
fn store_p(b: &Blocks) -> String {
    let (po, _, _) = b.layout();
    let mut s = String::new();
    for (c, comp) in ["x", "y", "z", "w"].iter().enumerate() {
        let p = format!("vec4<f32>(p0.{comp}, p1.{comp}, p2.{comp}, p3.{comp})");
        s += &format!("sh[{}u + (4u * tx + {c}u) * {}u + ty] = {p};\n        ", po / 4, b.qs() / 4);
    }
    s
}

/// Each invocation's shares of its rows' sums, to shared memory for the stores to add.
fn shares(b: &Blocks) -> String {
    let (po, _, _) = b.layout();
    let mut s = String::new();
    for i in 0..4 {
        let at = format!("let at = {po}u + (4u * ty + {i}u) * {TX}u + tx;");
        s += &format!("{{ {at} sh[at >> 2u][at & 3u] = l{i}; }}\n    ");
    }
    s
}

/// Each row's sum, then its outputs divided by it (zeros where the row saw no key).
fn stores(a: &Attn, b: &Blocks, out: &Operand) -> String {
    let (po, _, _) = b.layout();
    let (tq, dv) = (a.tq, a.dv);
    let mut s = String::new();
    for i in 0..4 {
        s += &format!(
            "{{
        let r = 4u * ty + {i}u;
        let qi = q0 + r;
        var l = 0.0;
        for (var x = 0u; x < {TX}u; x = x + 1u) {{
            let at = {po}u + r * {TX}u + x;
            l = l + sh[at >> 2u][at & 3u];
        }}
        let inv = select(0.0, 1.0 / l, l > 0.0);
        if (qi < {tq}u) {{\n"
        );
        for c in 0..b.dvp / BK {
            for (e, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                let col = format!("4u * (tx + {}u) + {e}u", TX * c);
                let st = store(
                    out,
                    &format!("(bh * {tq}u + qi) * {dv}u + col"),
                    &format!("o{i}_{c}.{comp} * inv"),
                );
                s += &format!("            {{ let col = {col}; if (col < {dv}u) {{ {st} }} }}\n");
            }
        }
        s += "        }\n    }\n    ";
    }
    s
}

/// The WGSL of `forward`: per key block, panels of Q and K staged in turn for the scores, then
/// panels of V for `P·V`. `$STEPS$` is `BLOCK`.
const PANELS: &str = "let bh = wid / $NQB$u;
    let q0 = (wid - bh * $NQB$u) * $BQ$u;
    let kvrow = (bh / $HQ$u) * $HKV$u + (bh % $HQ$u) / $REP$u;
    let mbase = $MBASE$;
    let tx = tid % $TX$u;
    let ty = tid / $TX$u;
    if (tid < $BQ$u) {
        let at = $SO$u + tid;
        sh[at >> 2u][at & 3u] = $NEG$;
    }
    $DECLS$
    let kend = $KEND$;
    for (var k0 = 0u; k0 < kend; k0 = k0 + $BK$u) {
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        var s2 = vec4<f32>(0.0);
        var s3 = vec4<f32>(0.0);
        for (var d0 = 0u; d0 < $DP$u; d0 = d0 + $BD$u) {
            $FETCH_Q$
            $FETCH_K$
            workgroupBarrier();
            $PUT_Q$
            $PUT_K$
            workgroupBarrier();
            $S_PANEL$
        }
        $STEPS$
        for (var j0 = 0u; j0 < $BK$u; j0 = j0 + $BJ$u) {
            $FETCH_V$
            workgroupBarrier();
            $PUT_V$
            workgroupBarrier();
            $PV_PANEL$
        }
    }
    workgroupBarrier();
    $SHARES$
    workgroupBarrier();
    $STORES$";

/// One key block's scores, maxima, rescaling and probabilities, `S` in `s0..s3`. The partial
/// maxima go to P's buffer: the last reads of P (the block before)
/// are behind the panels' barriers.
const BLOCK: &str = "var ok0 = vec4<bool>(false);
        var ok1 = vec4<bool>(false);
        var ok2 = vec4<bool>(false);
        var ok3 = vec4<bool>(false);
        $SCORES$
        {
            let r = 4u * ty;
            let at = $PO$u + r * $TX$u + tx;
            sh[at >> 2u][at & 3u] = max(max(s0.x, s0.y), max(s0.z, s0.w));
            let a1 = at + $TX$u;
            sh[a1 >> 2u][a1 & 3u] = max(max(s1.x, s1.y), max(s1.z, s1.w));
            let a2 = at + 2u * $TX$u;
            sh[a2 >> 2u][a2 & 3u] = max(max(s2.x, s2.y), max(s2.z, s2.w));
            let a3 = at + 3u * $TX$u;
            sh[a3 >> 2u][a3 & 3u] = max(max(s3.x, s3.y), max(s3.z, s3.w));
        }
        workgroupBarrier();
        if (tid < $BQ$u) {
            var mb = $NEG$;
            for (var x = 0u; x < $TX$u; x = x + 1u) {
                let at = $PO$u + tid * $TX$u + x;
                mb = max(mb, sh[at >> 2u][at & 3u]);
            }
            let am = $SO$u + tid;
            let ac = am + $BQ$u;
            let mo = sh[am >> 2u][am & 3u];
            let mn = max(mo, mb);
            sh[am >> 2u][am & 3u] = mn;
            sh[ac >> 2u][ac & 3u] = exp(mo - mn);
        }
        workgroupBarrier();
        var p0: vec4<f32>;
        var p1: vec4<f32>;
        var p2: vec4<f32>;
        var p3: vec4<f32>;
        $RESCALE$
        $STORE_P$";
