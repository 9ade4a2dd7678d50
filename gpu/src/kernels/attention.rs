//! Tiled attention kernels: the forward (flash-attention style) and the three derivatives.
//!
//! Formulas are the CPU backend's (`cpu/attention.rs`): `S = scale·q·kᵀ + mask`, causal keys
//! `j > i + (Tk − Tq)` hidden, `P = softmax_rows(S)` with a row that sees no key all zeros,
//! `out = P·v`; `dS = P ∘ (dP − rowdot)` with `dP = dy·vᵀ` and `rowdot = Σ_j P·dP`,
//! `dq = scale·dS·k`, `dk = scale·dSᵀ·q`, `dv = Pᵀ·dy`; a KV head sums over the query heads
//! it serves (`h / (Hq/Hkv)`).
//!
//! Every kernel is one workgroup of `width` invocations per tile of output rows, with the tiles
//! it multiplies staged in one workgroup array `sh` (at most 16 KiB, the Vulkan floor, so the
//! same kernel runs under `MGN_MIN_SPEC=1`). Tile sizes are powers of two chosen per op from the
//! head dims, the lengths and the width (`Tiles::choose`), so every `/` and `%` in the loops is by
//! a power-of-two constant (a shift); the few divisions by other constants sit in tile loads and
//! workgroup set-up. Two mappings of the invocations recur:
//!
//! - the *score* mapping: invocation `tid` scores pairs `(row sr0 + kk·RSTEP, key sj)` of a
//!   `BQ × BK` tile, `sj = tid % BK`, so one key row of `K` is reused across its rows;
//! - the *output* mapping: invocation `tid` owns row `tid / TPR` and columns `tid % TPR + c·TPR`,
//!   so the reads of a value tile and the stores are consecutive across invocations.
//!
//! Masked and causal positions: a hidden position has no probability at all (`ok` false); an
//! additive mask of `-inf` gives `exp(-inf) = 0`; a row whose every score is hidden or `-inf`
//! ends with sum 0 and writes zeros, as on the CPU. Running maxima start at −FLT_MAX rather than
//! −inf because WGSL has no infinite literals; a finite score of −FLT_MAX still counts, as on the
//! CPU.
//!
//! The derivatives as compiled receive `q, k, v, mask?, dy` but not the forward's output or its
//! row statistics, so each recomputes per query row the maximum `m`, the sum `l` and (for dq and
//! dk) `rowdot`, in one online pass over the keys (`stats_pass`): every invocation keeps partial
//! `(m, l, u = Σ e^(s−m)·dP)` over its own keys, and the partials of a row merge in shared memory
//! once per query tile. dq does that once per query tile. dk and dv own a block of keys and
//! must see every query that reads them, so they recompute the statistics of every query tile
//! against all keys — `Tk / BK` times the forward's score work.
//!
//! The GPU session therefore rewrites its plan (`gpu/attention_stats.rs`): one `AttentionStats`
//! step (`row_stats`, the statistics pass without dy) stores `(m, 1/l)` per query row, and each
//! derivative reads it after dy, dq and dk also the forward output (`rowdot = dy·out`, one dot
//! per row; see `Given`). Then dq is a single pass over its key tiles, and dk and dv
//! (`grad_kv_given`) a single pass over the query tiles that see their own keys: `O(Tq·BK·D)`
//! per key tile instead of `O(Tq·Tk·D)`.

use super::{load, store, strides, KernelSource, Operand};
use mgn_ir::op::{GradPart, Op};
use mgn_ir::plan::Step;
use mgn_ir::shape::attention::{dims, Dims};
use mgn_ir::shape::broadcast_strides;

/// The workgroup array every kernel stays within, in f32 words (16 KiB: the Vulkan floor).
const SHARED_WORDS: usize = 4096;

/// −FLT_MAX: the "nothing seen yet" maximum (WGSL has no −inf literal).
const NEG: &str = "-3.4028235e38";

/// Kernels for `Op::Attention`, `Op::AttentionStats` and `Op::AttentionGrad` (with or without
/// the statistics the GPU session adds: see `Given`).
pub fn generate(
    step: &Step,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let need = |k: usize| super::need_inputs(step, inputs, k);
    match &step.op {
        Op::Attention { causal, scale, has_mask } => {
            need(3 + *has_mask as usize)?;
            let a = Attn::new(inputs, *causal, *scale, *has_mask)?;
            forward(&a, out, width as usize)
        }
        Op::AttentionStats { causal, scale, has_mask } => {
            need(2 + *has_mask as usize)?;
            // Attention's sizes with k standing in for v, which the statistics never read.
            let mut x = vec![inputs[0].clone(), inputs[1].clone(), inputs[1].clone()];
            x.extend(inputs.get(2).cloned());
            let a = Attn::new(&x, *causal, *scale, *has_mask)?;
            let mut want = a.q.shape.clone();
            *want.last_mut().expect("rank checked") = 2;
            if out.shape != want {
                return Err(format!(
                    "attention_stats: the result is {:?}, expected {want:?}",
                    out.shape
                ));
            }
            row_stats(&a, out, width as usize)
        }
        Op::AttentionGrad { causal, scale, has_mask, part } => {
            let base = 4 + *has_mask as usize;
            need(base)?;
            let a = Attn::new(inputs, *causal, *scale, *has_mask)?;
            if a.dy.is_none() {
                return Err("attention_grad needs dy after q, k, v and the mask".into());
            }
            let given = Given::of(&a, &inputs[base..], *part)?;
            match part {
                GradPart::Q => grad_q(&a, given.as_ref(), out, width as usize),
                GradPart::K | GradPart::V => {
                    grad_kv(&a, *part == GradPart::K, given.as_ref(), out, width as usize)
                }
                other => {
                    Err(format!("attention has no {other:?} input to differentiate (Q, K or V)"))
                }
            }
        }
        other => Err(format!("`{}` is not attention", other.describe())),
    }
}

/// Row statistics a derivative kernel is given instead of computing them: `stats` (an
/// `AttentionStats` of its q, k and mask: `(m, 1/l)` per query row) and, for dq and dk, the
/// forward output `out`, from which `rowdot_i = Σ_j P_ij·dP_ij = dy_i·out_i` is one dot per row.
/// dq and dk without `out` ignore `stats` and run their statistics pass (still correct).
struct Given<'a> {
    stats: &'a Operand,
    out: Option<&'a Operand>,
}

impl<'a> Given<'a> {
    fn of(a: &Attn, extra: &'a [Operand], part: GradPart) -> Result<Option<Given<'a>>, String> {
        let Some(stats) = extra.first() else { return Ok(None) };
        let mut want = a.q.shape.clone();
        *want.last_mut().expect("rank checked") = 2;
        if stats.shape != want || !stats.dtype.is_float() {
            return Err(format!(
                "attention_grad: the statistics are {:?}, expected {want:?}",
                stats.shape
            ));
        }
        let out = extra.get(1);
        if let (Some(o), Some(dy)) = (out, a.dy) {
            if o.shape != dy.shape {
                return Err(format!(
                    "attention_grad: the forward output is {:?}, expected dy's {:?}",
                    o.shape, dy.shape
                ));
            }
        }
        if extra.len() > 2 {
            return Err(format!("attention_grad takes at most two inputs after dy (statistics, forward output), found {}", extra.len()));
        }
        Ok(match part {
            GradPart::V => Some(Given { stats, out: None }),
            _ => out.map(|o| Given { stats, out: Some(o) }),
        })
    }
}

/// The sizes of one attention op and its operands (`q, k, v, mask?`, then `dy` for derivatives).
struct Attn<'a> {
    q: &'a Operand,
    k: &'a Operand,
    v: &'a Operand,
    mask: Option<&'a Operand>,
    dy: Option<&'a Operand>,
    /// Batch items (the product of the leading axes).
    batch: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
    scale: f64,
    /// `[..B, Hq, Tq, Tk]`, what the mask broadcasts to.
    scores: Vec<usize>,
    /// The mask's stride along each axis of `scores` (0 where it broadcasts); empty without one.
    mask_strides: Vec<usize>,
}

impl<'a> Attn<'a> {
    fn new(x: &'a [Operand], causal: bool, scale: f64, has_mask: bool) -> Result<Attn<'a>, String> {
        let msg = |e: mgn_ir::shape::ShapeError| format!("attention: {e}");
        let Dims { batch, hq, hkv, tq, tk, d, dv, scores } =
            dims(&x[0].shape, &x[1].shape, &x[2].shape).map_err(msg)?;
        let mask = if has_mask { Some(&x[3]) } else { None };
        let mask_strides = match mask {
            Some(m) => broadcast_strides(&m.shape, &scores).map_err(msg)?,
            None => Vec::new(),
        };
        let dy = x.get(3 + has_mask as usize);
        Ok(Attn {
            q: &x[0],
            k: &x[1],
            v: &x[2],
            mask,
            dy,
            batch,
            hq,
            hkv,
            tq,
            tk,
            d,
            dv,
            causal,
            scale,
            scores,
            mask_strides,
        })
    }

    fn rep(&self) -> usize {
        self.hq / self.hkv
    }

    /// The mask's word offset of `(bh, 0, 0)` as a WGSL expression of `bh` (evaluated once per
    /// head, not per score), and its strides along the query and key axes (0 where it broadcasts).
    fn mask_layout(&self) -> (String, usize, usize) {
        if self.mask.is_none() {
            return ("0u".into(), 0, 0);
        }
        let (r, st) = (self.scores.len(), &self.mask_strides);
        let heads = &self.scores[..r - 2];
        let hs = strides(heads);
        let terms: Vec<String> = (0..r - 2)
            .filter(|&a| st[a] != 0)
            .map(|a| format!("((bh / {}u) % {}u) * {}u", hs[a], heads[a], st[a]))
            .collect();
        let base = if terms.is_empty() { "0u".to_string() } else { terms.join(" + ") };
        (base, st[r - 2], st[r - 1])
    }
}

/// Replaces every `$NAME$` of `template` by its value; a token left over is a generator bug.
fn fill(template: &str, values: &[(&str, String)]) -> String {
    let mut s = template.to_string();
    for (name, value) in values {
        s = s.replace(&format!("${name}$"), value);
    }
    debug_assert!(!s.contains('$'), "unfilled token in\n{s}");
    s
}

/// Odd row strides in shared memory: invocations reading the same column of different rows hit
/// different banks.
fn odd(n: usize) -> usize {
    n | 1
}

/// Tile sizes (powers of two) and the two invocation mappings derived from them.
#[derive(Clone, Copy, Debug)]
struct Tiles {
    w: usize,
    /// Query rows per tile.
    bq: usize,
    /// Keys per tile.
    bk: usize,
    /// Score pairs per invocation (`⌈BQ·BK / W⌉`) and the row step between them (`W / BK`).
    spt: usize,
    rstep: usize,
}

impl Tiles {
    /// The template values every kernel over these tiles of `a` fills in: tile sizes, scoring
    /// steps, heads, lengths and the mask's per-head base.
    fn values(&self, a: &Attn) -> Vec<(&'static str, String)> {
        vec![
            ("BQ", self.bq.to_string()),
            ("BK", self.bk.to_string()),
            ("SPT", self.spt.to_string()),
            ("RSTEP", self.rstep.to_string()),
            ("HQ", a.hq.to_string()),
            ("HKV", a.hkv.to_string()),
            ("REP", a.rep().to_string()),
            ("TQ", a.tq.to_string()),
            ("TK", a.tk.to_string()),
            ("MBASE", a.mask_layout().0),
        ]
    }

    /// The best `(BQ, BK)` whose workgroup array `words(bq, bk)` fits in 16 KiB: first enough
    /// score pairs to busy every invocation, then by `prefer`. `BQ` at most `max_q`, `BK` at
    /// most `max_k` (both rounded up to powers of two), `BK ≤ W`.
    fn choose(
        w: usize,
        max_q: usize,
        max_k: usize,
        words: impl Fn(usize, usize) -> usize,
        prefer: impl Fn(usize, usize) -> (usize, usize, usize),
    ) -> Result<Tiles, String> {
        let pow2 = |n: usize| n.max(1).next_power_of_two();
        let (cap_q, cap_k) = (pow2(max_q).min(w).min(64), pow2(max_k).min(w).min(64));
        // ((busy invocations, preference), BQ, BK) of the best fit so far.
        type Fit = ((usize, (usize, usize, usize)), usize, usize);
        let mut best: Option<Fit> = None;
        let mut bq = 1;
        while bq <= cap_q {
            let mut bk = 1;
            while bk <= cap_k {
                if words(bq, bk) <= SHARED_WORDS {
                    let key = ((bq * bk).min(w), prefer(bq, bk));
                    if best.as_ref().is_none_or(|b| key > b.0) {
                        best = Some((key, bq, bk));
                    }
                }
                bk *= 2;
            }
            bq *= 2;
        }
        let (_, bq, bk) = best.ok_or_else(|| {
            format!(
                "attention: head dims do not fit a {} KiB workgroup tile",
                SHARED_WORDS * 4 / 1024
            )
        })?;
        Ok(Tiles { w, bq, bk, spt: (bq * bk).div_ceil(w), rstep: w / bk })
    }
}

/// WGSL copying rows `row0 .. row0 + rows` (`cols` words each, contiguous from word `src` of
/// `o`) into `sh[dst + r·stride + c]`; rows at or past `limit` read as zeros. Consecutive
/// invocations load consecutive words.
#[allow(clippy::too_many_arguments)]
fn stage(
    o: &Operand,
    src: &str,
    row0: &str,
    limit: usize,
    rows: usize,
    cols: usize,
    dst: usize,
    stride: usize,
    w: usize,
) -> String {
    fill(
        "for (var x = tid; x < $N$u; x = x + $W$u) {
        let rr = x / $COLS$u;
        var v = 0.0;
        if ($ROW0$ + rr < $LIMIT$u) {
            v = $LOAD$;
        }
        sh[$DST$u + rr * $STRIDE$u + (x - rr * $COLS$u)] = v;
    }",
        &[
            ("N", (rows * cols).to_string()),
            ("W", w.to_string()),
            ("COLS", cols.to_string()),
            ("ROW0", row0.into()),
            ("LIMIT", limit.to_string()),
            ("LOAD", load(o, &format!("{src} + x"))),
            ("DST", dst.to_string()),
            ("STRIDE", stride.to_string()),
        ],
    )
}

/// WGSL scoring pair `(r, sj)` of the key tile at `k0` against the query tile at `q0`: `okk`
/// (the key is visible), `sc` (`scale·q·k + mask`, −FLT_MAX when hidden) and with `dp` also
/// `dpv` (`dy·v`). Q rows at `qo` (stride `qd`), K at `ko` (`kd`), dy at `yo` (`yd`), V at `vo` (`vd`).
fn score(
    a: &Attn,
    qo: usize,
    qd: usize,
    ko: usize,
    kd: usize,
    dp: Option<(usize, usize, usize, usize)>,
) -> String {
    let (_, msq, msk) = a.mask_layout();
    let mask = match a.mask {
        Some(m) => format!(" + {}", load(m, &format!("mbase + qi * {msq}u + j * {msk}u"))),
        None => String::new(),
    };
    let causal =
        if a.causal { format!(" && j + {}u <= qi + {}u", a.tq, a.tk) } else { String::new() };
    let dpv = match dp {
        Some((yo, yd, vo, vd)) => fill(
            "
            for (var e = 0u; e < $DV$u; e = e + 1u) {
                dpv = dpv + sh[$YO$u + r * $YD$u + e] * sh[$VO$u + sj * $VD$u + e];
            }",
            &[
                ("DV", a.dv.to_string()),
                ("YO", yo.to_string()),
                ("YD", yd.to_string()),
                ("VO", vo.to_string()),
                ("VD", vd.to_string()),
            ],
        ),
        None => String::new(),
    };
    fill(
        "let qi = q0 + r;
            let j = k0 + sj;
            let okk = qi < $TQ$u && j < $TK$u$CAUSAL$;
            var sc = $NEG$;
            var dpv = 0.0;
            if (okk) {
                var dot = 0.0;
                for (var e = 0u; e < $D$u; e = e + 1u) {
                    dot = dot + sh[$QO$u + r * $QD$u + e] * sh[$KO$u + sj * $KD$u + e];
                }
                sc = dot * $SCALE$$MASK$;$DPV$
            }",
        &[
            ("TQ", a.tq.to_string()),
            ("TK", a.tk.to_string()),
            ("CAUSAL", causal),
            ("NEG", NEG.into()),
            ("D", a.d.to_string()),
            ("QO", qo.to_string()),
            ("QD", qd.to_string()),
            ("KO", ko.to_string()),
            ("KD", kd.to_string()),
            ("SCALE", format!("{:?}", a.scale as f32)),
            ("MASK", mask),
            ("DPV", dpv),
        ],
    )
}

/// The end of the key loop for the query tile at `q0`: every key, or under causality only up to
/// the last key its last row sees (tiles entirely above the diagonal are skipped).
fn key_end(a: &Attn, bq: usize) -> String {
    if a.causal {
        format!("min({tk}u, max(q0 + {bq}u + {tk}u, {tq}u) - {tq}u)", tk = a.tk, tq = a.tq)
    } else {
        format!("{}u", a.tk)
    }
}

/// Where the statistics pass finds its operands and leaves its results, in `sh` words.
struct StatsLayout {
    qo: usize,
    qd: usize,
    /// dy rows, when `rowdot` is wanted: `(yo, yd)`.
    y: Option<(usize, usize)>,
    ko: usize,
    kd: usize,
    vo: usize,
    vd: usize,
    /// Partials, `3·BQ·BK` words, free once the key loop is over (may alias the K and V tiles).
    part: usize,
    /// Row max, sum and rowdot, `BQ` words each.
    mo: usize,
    lo: usize,
    ro: usize,
}

/// WGSL for one pass over the keys of the query tile at `q0` (staged at `qo`, and dy at `yo`),
/// leaving each row's max, sum of exponentials and (with dy) rowdot in `sh[mo/lo/ro + r]`.
/// Each invocation keeps online partials over its own pairs; they merge once at the end.
/// With `save_own`, the pairs of the key tile starting at `kown` keep their score, visibility
/// and dP in `own_s`, `own_ok`, `own_dp` (dk and dv need no second pass over their own keys).
fn stats_pass(a: &Attn, t: &Tiles, l: &StatsLayout, save_own: bool) -> String {
    let rowdot = l.y.is_some();
    let stage_v = if rowdot {
        stage(
            a.v,
            &format!("kvrow * {}u + k0 * {}u", a.tk * a.dv, a.dv),
            "k0",
            a.tk,
            t.bk,
            a.dv,
            l.vo,
            l.vd,
            t.w,
        )
    } else {
        String::new()
    };
    let save = if save_own {
        "
                if (k0 == kown) {
                    own_s[kk] = sc;
                    own_ok[kk] = okk;
                    own_dp[kk] = dpv;
                }"
    } else {
        ""
    };
    fill(
        "var pm: array<f32, $SPT$>;
    var pl: array<f32, $SPT$>;
    var pu: array<f32, $SPT$>;
    for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
        pm[kk] = $NEG$;
    }
    let kend = $KEND$;
    for (var k0 = 0u; k0 < kend; k0 = k0 + $BK$u) {
        workgroupBarrier();
        $STAGE_K$
        $STAGE_V$
        workgroupBarrier();
        for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
            let r = sr0 + kk * $RSTEP$u;
            if (r < $BQ$u) {
            $SCORE$$SAVE$
                if (okk) {
                    let mn = max(pm[kk], sc);
                    let c = exp(pm[kk] - mn);
                    let ex = exp(sc - mn);
                    pl[kk] = pl[kk] * c + ex;
                    pu[kk] = pu[kk] * c + ex * dpv;
                    pm[kk] = mn;
                }
            }
        }
    }
    workgroupBarrier();
    for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
        let r = sr0 + kk * $RSTEP$u;
        if (r < $BQ$u) {
            let at = $PART$u + (r * $BK$u + sj) * 3u;
            sh[at] = pm[kk];
            sh[at + 1u] = pl[kk];
            sh[at + 2u] = pu[kk];
        }
    }
    workgroupBarrier();
    if (tid < $BQ$u) {
        var m = $NEG$;
        var l = 0.0;
        var u = 0.0;
        for (var jj = 0u; jj < $BK$u; jj = jj + 1u) {
            let at = $PART$u + (tid * $BK$u + jj) * 3u;
            let qm = sh[at];
            let ql = sh[at + 1u];
            if (ql > 0.0) {
                let mn = max(m, qm);
                let c1 = exp(m - mn);
                let c2 = exp(qm - mn);
                l = l * c1 + ql * c2;
                u = u * c1 + sh[at + 2u] * c2;
                m = mn;
            }
        }
        sh[$MO$u + tid] = m;
        sh[$LO$u + tid] = l;
        sh[$RO$u + tid] = select(0.0, u / l, l > 0.0);
    }
    workgroupBarrier();",
        &[
            ("SPT", t.spt.to_string()),
            ("NEG", NEG.into()),
            ("KEND", key_end(a, t.bq)),
            ("BK", t.bk.to_string()),
            ("BQ", t.bq.to_string()),
            ("RSTEP", t.rstep.to_string()),
            (
                "STAGE_K",
                stage(
                    a.k,
                    &format!("kvrow * {}u + k0 * {}u", a.tk * a.d, a.d),
                    "k0",
                    a.tk,
                    t.bk,
                    a.d,
                    l.ko,
                    l.kd,
                    t.w,
                ),
            ),
            ("STAGE_V", stage_v),
            ("SCORE", score(a, l.qo, l.qd, l.ko, l.kd, l.y.map(|(yo, yd)| (yo, yd, l.vo, l.vd)))),
            ("SAVE", save.into()),
            ("PART", l.part.to_string()),
            ("MO", l.mo.to_string()),
            ("LO", l.lo.to_string()),
            ("RO", l.ro.to_string()),
        ],
    )
}

/// WGSL loading the given statistics of the query tile at `q0` (head `bh`) into
/// `sh[mo/lo/ro + r]`: the row maximum, `1/l` (0 for a row that sees no key) and, with the
/// forward output, `rowdot = dy·out` (dy staged at `yo`, row stride `yd`). Barriers on both
/// sides: dy must be staged before, and every scorer reads the rows after.
#[allow(clippy::too_many_arguments)]
fn load_given(
    a: &Attn,
    g: &Given,
    bq: usize,
    yo: usize,
    yd: usize,
    mo: usize,
    lo: usize,
    ro: usize,
) -> String {
    let rowdot = match g.out {
        Some(o) => fill(
            "
            for (var e = 0u; e < $DV$u; e = e + 1u) {
                rd = rd + sh[$YO$u + tid * $YD$u + e] * $OUT$;
            }",
            &[
                ("DV", a.dv.to_string()),
                ("YO", yo.to_string()),
                ("YD", yd.to_string()),
                ("OUT", load(o, &format!("row * {}u + e", a.dv))),
            ],
        ),
        None => String::new(),
    };
    fill(
        "workgroupBarrier();
    if (tid < $BQ$u) {
        let qi = q0 + tid;
        var m = $NEG$;
        var inv = 0.0;
        var rd = 0.0;
        if (qi < $TQ$u) {
            let row = bh * $TQ$u + qi;
            m = $M$;
            inv = $INV$;$ROWDOT$
        }
        sh[$MO$u + tid] = m;
        sh[$LO$u + tid] = inv;
        sh[$RO$u + tid] = rd;
    }
    workgroupBarrier();",
        &[
            ("BQ", bq.to_string()),
            ("NEG", NEG.into()),
            ("TQ", a.tq.to_string()),
            ("M", load(g.stats, "row * 2u")),
            ("INV", load(g.stats, "row * 2u + 1u")),
            ("ROWDOT", rowdot),
            ("MO", mo.to_string()),
            ("LO", lo.to_string()),
            ("RO", ro.to_string()),
        ],
    )
}

/// `AttentionStats`: one workgroup per (batch·query head, query tile), the statistics pass of
/// the derivatives without dy (so without V), then `(m, 1/l)` per row.
fn row_stats(a: &Attn, out: &Operand, w: usize) -> Result<KernelSource, String> {
    let d = a.d;
    // The Q tile, the row results, then the K tile, which the partials alias once the keys are done.
    let words = |bq: usize, bk: usize| bq * odd(d) + 3 * bq + (bk * odd(d)).max(3 * bq * bk);
    let t = Tiles::choose(w, a.tq, a.tk, words, |bq, bk| (bk.min(16), bq, bk))?;
    let qd = odd(d);
    let (qo, mo) = (0, t.bq * qd);
    let (lo, ro, ko) = (mo + t.bq, mo + 2 * t.bq, mo + 3 * t.bq);
    let nqb = a.tq.div_ceil(t.bq);
    let groups = a.batch * a.hq * nqb;
    if groups == 0 || d == 0 {
        return Ok(kernel(w, 1, 0, ""));
    }
    let layout = StatsLayout { qo, qd, y: None, ko, kd: qd, vo: 0, vd: 0, part: ko, mo, lo, ro };
    let body = fill(
        "let bh = wid / $NQB$u;
    let q0 = (wid - bh * $NQB$u) * $BQ$u;
    let kvrow = (bh / $HQ$u) * $HKV$u + (bh % $HQ$u) / $REP$u;
    let mbase = $MBASE$;
    let sj = tid % $BK$u;
    let sr0 = tid / $BK$u;
    $STAGE_Q$
    $STATS$
    let qi = q0 + tid;
    if (tid < $BQ$u && qi < $TQ$u) {
        let l = sh[$LO$u + tid];
        $STORE_M$
        $STORE_INV$
    }",
        &[
            vec![
                ("NQB", nqb.to_string()),
                (
                    "STAGE_Q",
                    stage(
                        a.q,
                        &format!("(bh * {}u + q0) * {d}u", a.tq),
                        "q0",
                        a.tq,
                        t.bq,
                        d,
                        qo,
                        qd,
                        w,
                    ),
                ),
                ("STATS", stats_pass(a, &t, &layout, false)),
                ("LO", lo.to_string()),
                (
                    "STORE_M",
                    store(out, &format!("(bh * {}u + qi) * 2u", a.tq), &format!("sh[{mo}u + tid]")),
                ),
                (
                    "STORE_INV",
                    store(
                        out,
                        &format!("(bh * {}u + qi) * 2u + 1u", a.tq),
                        "select(0.0, 1.0 / l, l > 0.0)",
                    ),
                ),
            ],
            t.values(a),
        ]
        .concat(),
    );
    Ok(kernel(w, t.bq * qd + 3 * t.bq + (t.bk * qd).max(3 * t.bq * t.bk), groups, &body))
}

/// The kernel's entry: `workgroup_size(W)`, the linear workgroup id `wid` (the session folds
/// the grid into three dimensions), and a uniform exit past the last tile.
fn entry(w: usize, words: usize, groups: usize, body: &str) -> String {
    format!(
        "var<workgroup> sh: array<f32, {words}>;

@compute @workgroup_size({w})
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {{
    let wid = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    if (wid >= {groups}u) {{
        return;
    }}
    {body}
}}
"
    )
}

fn kernel(w: usize, words: usize, groups: usize, body: &str) -> KernelSource {
    KernelSource {
        body: entry(w, words, groups, body),
        invocations: (groups * w) as u64,
        dropout_node: None,
    }
}

/// One workgroup per (batch·query head, tile of BQ queries); key tiles stream through shared
/// memory with an online softmax. Per key tile: stage K and V; score the tile's pairs into `S`;
/// each scorer turns its pairs into `P = e^(s − m_new)` with its row's running max, while the
/// output invocations rescale their accumulators by `e^(m_old − m_new)`; then `acc += P·V`.
fn forward(a: &Attn, out: &Operand, w: usize) -> Result<KernelSource, String> {
    let (d, dv) = (a.d, a.dv);
    // Output mapping: TPR = W / BQ invocations per row, CPT columns each; V rows are padded to
    // CPT·TPR words so the column loop needs no bound.
    let geometry = |bq: usize, bk: usize| {
        let tpr = w / bq;
        let cpt = dv.div_ceil(tpr).max(1);
        (tpr, cpt, bq * odd(d) + bk * odd(d) + bk * cpt * tpr + 2 * bq * (bk + 1))
    };
    let t =
        Tiles::choose(w, a.tq, a.tk, |bq, bk| geometry(bq, bk).2, |bq, bk| (bk.min(16), bq, bk))?;
    let (tpr, cpt, words) = geometry(t.bq, t.bk);
    let (qd, kd, vd, sb) = (odd(d), odd(d), cpt * tpr, t.bk + 1);
    let qo = 0;
    let ko = qo + t.bq * qd;
    let vo = ko + t.bk * kd;
    let so = vo + t.bk * vd;
    let po = so + t.bq * sb;
    let nqb = a.tq.div_ceil(t.bq);
    let groups = a.batch * a.hq * nqb;
    if groups == 0 || dv == 0 {
        return Ok(kernel(w, 1, 0, ""));
    }
    let body = fill(
        "let bh = wid / $NQB$u;
    let q0 = (wid - bh * $NQB$u) * $BQ$u;
    let kvrow = (bh / $HQ$u) * $HKV$u + (bh % $HQ$u) / $REP$u;
    let mbase = $MBASE$;
    let sj = tid % $BK$u;
    let sr0 = tid / $BK$u;
    let pr = tid / $TPR$u;
    let pc = tid % $TPR$u;
    $STAGE_Q$
    // Running max of each score row this invocation scores, and of its output row.
    var rm: array<f32, $SPT$>;
    for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
        rm[kk] = $NEG$;
    }
    var m = $NEG$;
    var l = 0.0;
    var acc: array<f32, $CPT$>;
    let kend = $KEND$;
    for (var k0 = 0u; k0 < kend; k0 = k0 + $BK$u) {
        workgroupBarrier();
        $STAGE_K$
        $STAGE_V$
        workgroupBarrier();
        var s: array<f32, $SPT$>;
        var ok: array<bool, $SPT$>;
        for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
            let r = sr0 + kk * $RSTEP$u;
            if (r < $BQ$u) {
            $SCORE$
                s[kk] = sc;
                ok[kk] = okk;
                sh[$SO$u + r * $SB$u + sj] = sc;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
            let r = sr0 + kk * $RSTEP$u;
            if (r < $BQ$u) {
                var mt = rm[kk];
                for (var jj = 0u; jj < $BK$u; jj = jj + 1u) {
                    mt = max(mt, sh[$SO$u + r * $SB$u + jj]);
                }
                rm[kk] = mt;
                sh[$PO$u + r * $SB$u + sj] = select(0.0, exp(s[kk] - mt), ok[kk]);
            }
        }
        var mt = m;
        for (var jj = 0u; jj < $BK$u; jj = jj + 1u) {
            mt = max(mt, sh[$SO$u + pr * $SB$u + jj]);
        }
        let corr = exp(m - mt);
        m = mt;
        workgroupBarrier();
        l = l * corr;
        for (var c = 0u; c < $CPT$u; c = c + 1u) {
            acc[c] = acc[c] * corr;
        }
        for (var jj = 0u; jj < $BK$u; jj = jj + 1u) {
            let p = sh[$PO$u + pr * $SB$u + jj];
            l = l + p;
            let vb = $VO$u + jj * $VD$u + pc;
            for (var c = 0u; c < $CPT$u; c = c + 1u) {
                acc[c] = acc[c] + p * sh[vb + c * $TPR$u];
            }
        }
    }
    let qi = q0 + pr;
    if (qi < $TQ$u) {
        let inv = select(0.0, 1.0 / l, l > 0.0);
        for (var c = 0u; c < $CPT$u; c = c + 1u) {
            let col = pc + c * $TPR$u;
            if (col < $DV$u) {
                $STORE$
            }
        }
    }",
        &[
            vec![
                ("NQB", nqb.to_string()),
                ("TPR", tpr.to_string()),
                ("CPT", cpt.to_string()),
                ("NEG", NEG.into()),
                ("KEND", key_end(a, t.bq)),
                (
                    "STAGE_Q",
                    stage(
                        a.q,
                        &format!("(bh * {}u + q0) * {d}u", a.tq),
                        "q0",
                        a.tq,
                        t.bq,
                        d,
                        qo,
                        qd,
                        w,
                    ),
                ),
                (
                    "STAGE_K",
                    stage(
                        a.k,
                        &format!("kvrow * {}u + k0 * {d}u", a.tk * d),
                        "k0",
                        a.tk,
                        t.bk,
                        d,
                        ko,
                        kd,
                        w,
                    ),
                ),
                (
                    "STAGE_V",
                    stage(
                        a.v,
                        &format!("kvrow * {}u + k0 * {dv}u", a.tk * dv),
                        "k0",
                        a.tk,
                        t.bk,
                        dv,
                        vo,
                        vd,
                        w,
                    ),
                ),
                ("SCORE", score(a, qo, qd, ko, kd, None)),
                ("SO", so.to_string()),
                ("PO", po.to_string()),
                ("SB", sb.to_string()),
                ("VO", vo.to_string()),
                ("VD", vd.to_string()),
                ("DV", dv.to_string()),
                (
                    "STORE",
                    store(out, &format!("(bh * {}u + qi) * {dv}u + col", a.tq), "acc[c] * inv"),
                ),
            ],
            t.values(a),
        ]
        .concat(),
    );
    Ok(kernel(w, words, groups, &body))
}

/// dq: one workgroup per (batch·query head, query tile). The statistics pass gives each row's
/// max, sum and rowdot once (or they are `given`: then the row max, `1/l` and `dy·out`); a
/// second pass over the key tiles forms `dS = P ∘ (dP − rowdot)` per pair into shared memory
/// and accumulates `dq += dS·K` in the output mapping (over D).
fn grad_q(
    a: &Attn,
    given: Option<&Given>,
    out: &Operand,
    w: usize,
) -> Result<KernelSource, String> {
    let (d, dv) = (a.d, a.dv);
    // The statistics pass's partials (none when the statistics are given).
    let part = |bq: usize, bk: usize| if given.is_some() { 0 } else { 3 * bq * bk };
    let geometry = |bq: usize, bk: usize| {
        let tpr = w / bq;
        let cpt = d.div_ceil(tpr).max(1);
        // Q, dy, K, V tiles (partials alias K and V), dS, statistics, and slack for the column
        // overrun of the last K row in the dq loop (columns past D are computed and dropped).
        let tiles = (bk * (odd(d) + odd(dv))).max(part(bq, bk));
        (tpr, cpt, bq * (odd(d) + odd(dv)) + tiles + bq * (bk + 1) + 3 * bq + cpt * tpr)
    };
    let t =
        Tiles::choose(w, a.tq, a.tk, |bq, bk| geometry(bq, bk).2, |bq, bk| (bk.min(16), bq, bk))?;
    let (tpr, cpt, words) = geometry(t.bq, t.bk);
    let (qd, yd, kd, vd, sb) = (odd(d), odd(dv), odd(d), odd(dv), t.bk + 1);
    let qo = 0;
    let yo = qo + t.bq * qd;
    let mo = yo + t.bq * yd;
    let (lo, ro) = (mo + t.bq, mo + 2 * t.bq);
    let ko = mo + 3 * t.bq;
    let vo = ko + t.bk * kd;
    let dso = ko + (t.bk * (kd + vd)).max(part(t.bq, t.bk));
    let nqb = a.tq.div_ceil(t.bq);
    let groups = a.batch * a.hq * nqb;
    if groups == 0 || d == 0 {
        return Ok(kernel(w, 1, 0, ""));
    }
    let dy = a.dy.expect("checked");
    let layout = StatsLayout { qo, qd, y: Some((yo, yd)), ko, kd, vo, vd, part: ko, mo, lo, ro };
    // `sh[LO]` holds the row sum `l`, or with given statistics `1/l`.
    let (stats, per_l) = match given {
        Some(g) => (
            format!(
                "let kend = {};\n    {}",
                key_end(a, t.bq),
                load_given(a, g, t.bq, yo, yd, mo, lo, ro)
            ),
            "*",
        ),
        None => (stats_pass(a, &t, &layout, false), "/"),
    };
    let body = fill(
        "let bh = wid / $NQB$u;
    let q0 = (wid - bh * $NQB$u) * $BQ$u;
    let kvrow = (bh / $HQ$u) * $HKV$u + (bh % $HQ$u) / $REP$u;
    let mbase = $MBASE$;
    let sj = tid % $BK$u;
    let sr0 = tid / $BK$u;
    let pr = tid / $TPR$u;
    let pc = tid % $TPR$u;
    $STAGE_Q$
    $STAGE_Y$
    $STATS$
    var acc: array<f32, $CPT$>;
    for (var k0 = 0u; k0 < kend; k0 = k0 + $BK$u) {
        workgroupBarrier();
        $STAGE_K$
        $STAGE_V$
        workgroupBarrier();
        for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
            let r = sr0 + kk * $RSTEP$u;
            if (r < $BQ$u) {
            $SCORE$
                let lr = sh[$LO$u + r];
                var ds = 0.0;
                if (okk && lr > 0.0) {
                    ds = exp(sc - sh[$MO$u + r]) $PER_L$ lr * (dpv - sh[$RO$u + r]);
                }
                sh[$DSO$u + r * $SB$u + sj] = ds;
            }
        }
        workgroupBarrier();
        for (var jj = 0u; jj < $BK$u; jj = jj + 1u) {
            let ds = sh[$DSO$u + pr * $SB$u + jj];
            let kb = $KO$u + jj * $KD$u + pc;
            for (var c = 0u; c < $CPT$u; c = c + 1u) {
                acc[c] = acc[c] + ds * sh[kb + c * $TPR$u];
            }
        }
    }
    let qi = q0 + pr;
    if (qi < $TQ$u) {
        for (var c = 0u; c < $CPT$u; c = c + 1u) {
            let col = pc + c * $TPR$u;
            if (col < $D$u) {
                $STORE$
            }
        }
    }",
        &[
            vec![
                ("NQB", nqb.to_string()),
                ("TPR", tpr.to_string()),
                ("CPT", cpt.to_string()),
                (
                    "STAGE_Q",
                    stage(
                        a.q,
                        &format!("(bh * {}u + q0) * {d}u", a.tq),
                        "q0",
                        a.tq,
                        t.bq,
                        d,
                        qo,
                        qd,
                        w,
                    ),
                ),
                (
                    "STAGE_Y",
                    stage(
                        dy,
                        &format!("(bh * {}u + q0) * {dv}u", a.tq),
                        "q0",
                        a.tq,
                        t.bq,
                        dv,
                        yo,
                        yd,
                        w,
                    ),
                ),
                ("STATS", stats),
                ("PER_L", per_l.into()),
                (
                    "STAGE_K",
                    stage(
                        a.k,
                        &format!("kvrow * {}u + k0 * {d}u", a.tk * d),
                        "k0",
                        a.tk,
                        t.bk,
                        d,
                        ko,
                        kd,
                        w,
                    ),
                ),
                (
                    "STAGE_V",
                    stage(
                        a.v,
                        &format!("kvrow * {}u + k0 * {dv}u", a.tk * dv),
                        "k0",
                        a.tk,
                        t.bk,
                        dv,
                        vo,
                        vd,
                        w,
                    ),
                ),
                ("SCORE", score(a, qo, qd, ko, kd, Some((yo, yd, vo, vd)))),
                ("LO", lo.to_string()),
                ("MO", mo.to_string()),
                ("RO", ro.to_string()),
                ("DSO", dso.to_string()),
                ("SB", sb.to_string()),
                ("KO", ko.to_string()),
                ("KD", kd.to_string()),
                ("D", d.to_string()),
                (
                    "STORE",
                    store(
                        out,
                        &format!("(bh * {}u + qi) * {d}u + col", a.tq),
                        &format!("acc[c] * {:?}", a.scale as f32),
                    ),
                ),
            ],
            t.values(a),
        ]
        .concat(),
    );
    Ok(kernel(w, words, groups, &body))
}

/// dk (`is_k`) or dv: one workgroup per (batch·KV head, tile of BK keys), accumulating in
/// registers over the query heads sharing the KV head and their query tiles (under causality,
/// only the tiles with a query that sees one of its keys). Per query tile: stage q and dy, run
/// the statistics pass over every key (keeping the scores and dP of its own keys), then form
/// `P` (dv) or `dS` (dk) for its own keys into shared memory and accumulate `Pᵀ·dy` or `dSᵀ·q`
/// in the output mapping (key `tid / TPR`, columns `tid % TPR + c·TPR`).
fn grad_kv(
    a: &Attn,
    is_k: bool,
    given: Option<&Given>,
    out: &Operand,
    w: usize,
) -> Result<KernelSource, String> {
    if let Some(g) = given {
        return grad_kv_given(a, is_k, g, out, w);
    }
    let (d, dv) = (a.d, a.dv);
    let cols = if is_k { d } else { dv };
    let geometry = |bq: usize, bk: usize| {
        let tpr = w / bk;
        let cpt = cols.div_ceil(tpr).max(1);
        // q and dy tiles, statistics, then one region for the K (and for dk V) tiles of the
        // statistics pass, its partials and the P / dS tile, which are live one after another.
        let tiles = if is_k { bk * (odd(d) + odd(dv)) } else { bk * odd(d) };
        let scratch = tiles.max(3 * bq * bk).max(bq * (bk + 1));
        (tpr, cpt, bq * (odd(d) + odd(dv)) + 3 * bq + scratch + cpt * tpr)
    };
    // Larger key tiles first: the statistics are recomputed once per key tile.
    let t = Tiles::choose(w, a.tq, a.tk, |bq, bk| geometry(bq, bk).2, |bq, bk| (bk, bq, 0))?;
    let (tpr, cpt, words) = geometry(t.bq, t.bk);
    let o = KvLayout::new(d, dv, &t);
    let (ko, kd, vo, vd) = (o.mo + 3 * t.bq, odd(d), o.mo + 3 * t.bq + t.bk * odd(d), odd(dv));
    let layout = StatsLayout {
        qo: o.qo,
        qd: o.qd,
        y: if is_k { Some((o.yo, o.yd)) } else { None },
        ko,
        kd,
        vo,
        vd,
        part: ko,
        mo: o.mo,
        lo: o.lo,
        ro: o.ro,
    };
    let pass = KvPass {
        own: String::new(),
        tile: format!(
            "var own_s: array<f32, {spt}>;
            var own_ok: array<bool, {spt}>;
            var own_dp: array<f32, {spt}>;
            {stats}",
            spt = t.spt,
            stats = stats_pass(a, &t, &layout, true),
        ),
        pair: "let okk = own_ok[kk];\n                    let sc = own_s[kk];\n                    let dpv = own_dp[kk];".into(),
        prob: "exp(sc - sh[$MO$u + r]) / lrow",
    };
    kv_kernel(a, is_k, &t, (tpr, cpt, words), &KvLayout { po: ko, ..o }, pass, out, w)
}

/// dk or dv with the statistics given: the work per key tile is one pass over the query
/// tiles that see it, `O(Tq·BK·D)`, instead of a statistics pass over every key per query tile.
/// The workgroup's own K tile (and for dk its V tile) is staged once; per query tile: stage q
/// and dy, load the rows' `m`, `1/l` (and for dk `rowdot = dy·out`), score the own keys into
/// `P` (dv) or `dS` (dk) in shared memory, and accumulate `Pᵀ·dy` or `dSᵀ·q` as `grad_kv` does.
fn grad_kv_given(
    a: &Attn,
    is_k: bool,
    g: &Given,
    out: &Operand,
    w: usize,
) -> Result<KernelSource, String> {
    let (d, dv) = (a.d, a.dv);
    let cols = if is_k { d } else { dv };
    let geometry = |bq: usize, bk: usize| {
        let tpr = w / bk;
        let cpt = cols.div_ceil(tpr).max(1);
        // q and dy tiles, the rows' statistics, the own K (and for dk V) tile, the P / dS tile,
        // and slack for the column overrun of the last row in the accumulation.
        let own = if is_k { bk * (odd(d) + odd(dv)) } else { bk * odd(d) };
        (tpr, cpt, bq * (odd(d) + odd(dv)) + 3 * bq + own + bq * (bk + 1) + cpt * tpr)
    };
    // Larger key tiles first: every key tile reads all of q and dy.
    let t = Tiles::choose(w, a.tq, a.tk, |bq, bk| geometry(bq, bk).2, |bq, bk| (bk, bq, 0))?;
    let (tpr, cpt, words) = geometry(t.bq, t.bk);
    let o = KvLayout::new(d, dv, &t);
    let (kd, vd) = (odd(d), odd(dv));
    let ko = o.mo + 3 * t.bq;
    let vo = ko + t.bk * kd;
    let po = if is_k { vo + t.bk * vd } else { vo };
    let stage_v = if is_k {
        stage(a.v, &format!("kvrow * {}u + k0 * {dv}u", a.tk * dv), "k0", a.tk, t.bk, dv, vo, vd, w)
    } else {
        String::new()
    };
    let pass = KvPass {
        own: format!(
            "let k0 = kown;\n    {}\n    {stage_v}",
            stage(
                a.k,
                &format!("kvrow * {}u + k0 * {d}u", a.tk * d),
                "k0",
                a.tk,
                t.bk,
                d,
                ko,
                kd,
                w
            )
        ),
        tile: load_given(a, g, t.bq, o.yo, o.yd, o.mo, o.lo, o.ro),
        pair: score(a, o.qo, o.qd, ko, kd, is_k.then_some((o.yo, o.yd, vo, vd))),
        prob: "exp(sc - sh[$MO$u + r]) * lrow",
    };
    kv_kernel(a, is_k, &t, (tpr, cpt, words), &KvLayout { po, ..o }, pass, out, w)
}

/// Where a dk/dv kernel keeps its q and dy tiles (`qo`, `yo`, row strides `qd`, `yd`), the
/// rows' statistics (`mo`, `lo`, `ro`: max, `l` or `1/l`, rowdot) and the P / dS tile (`po`).
#[derive(Clone, Copy)]
struct KvLayout {
    qo: usize,
    qd: usize,
    yo: usize,
    yd: usize,
    mo: usize,
    lo: usize,
    ro: usize,
    po: usize,
}

impl KvLayout {
    /// q and dy tiles first, then the three statistics rows; `po` is the caller's.
    fn new(d: usize, dv: usize, t: &Tiles) -> KvLayout {
        let (qd, yd) = (odd(d), odd(dv));
        let yo = t.bq * qd;
        let mo = yo + t.bq * yd;
        KvLayout { qo: 0, qd, yo, yd, mo, lo: mo + t.bq, ro: mo + 2 * t.bq, po: 0 }
    }
}

/// What a dk/dv kernel does around the shared skeleton, with statistics computed
/// (`grad_kv`) or given (`grad_kv_given`).
struct KvPass {
    /// Before the query loop: the workgroup's own K (and for dk V) tile, when kept staged.
    own: String,
    /// Per query tile, after q and dy are staged: the rows' `m`, `l` (or `1/l`) and rowdot.
    tile: String,
    /// Per scored pair `(r, sj)`: defines `okk` (visible), `sc` (the score) and, for dk, `dpv`.
    pair: String,
    /// `p` from `sc`, the row maximum and `lrow` (the row's `l`, or `1/l` when given).
    prob: &'static str,
}

/// The dk/dv skeleton: one workgroup per (KV head, key tile) walks the query tiles that see its
/// keys (every query head it serves), puts `P` (dv) or `dS` (dk) of its keys in shared memory
/// and accumulates `Pᵀ·dy` or `dSᵀ·q` in registers, stored once at the end.
#[allow(clippy::too_many_arguments)]
fn kv_kernel(
    a: &Attn,
    is_k: bool,
    t: &Tiles,
    (tpr, cpt, words): (usize, usize, usize),
    o: &KvLayout,
    pass: KvPass,
    out: &Operand,
    w: usize,
) -> Result<KernelSource, String> {
    let (d, dv) = (a.d, a.dv);
    let cols = if is_k { d } else { dv };
    let nkb = a.tk.div_ceil(t.bk);
    let groups = a.batch * a.hkv * nkb;
    if groups == 0 || cols == 0 {
        return Ok(kernel(w, 1, 0, ""));
    }
    let dy = a.dy.expect("checked");
    // The first query that sees key `kown` is `kown + Tq − Tk`; earlier tiles contribute nothing.
    let qfirst = if a.causal {
        format!(
            "((max(kown + {tq}u, {tk}u) - {tk}u) / {bq}u) * {bq}u",
            tq = a.tq,
            tk = a.tk,
            bq = t.bq
        )
    } else {
        "0u".into()
    };
    let weight = if is_k { "p * (dpv - sh[$RO$u + r])" } else { "p" };
    let (src, src_d) = if is_k { (o.qo, o.qd) } else { (o.yo, o.yd) };
    let scale = if is_k { format!(" * {:?}", a.scale as f32) } else { String::new() };
    let body = fill(
        &"let bkv = wid / $NKB$u;
    let kown = (wid - bkv * $NKB$u) * $BK$u;
    let kvrow = bkv;
    let b = bkv / $HKV$u;
    let kvh = bkv - b * $HKV$u;
    let sj = tid % $BK$u;
    let sr0 = tid / $BK$u;
    let pj = tid / $TPR$u;
    let pc = tid % $TPR$u;
    $OWN$
    var acc: array<f32, $CPT$>;
    let qfirst = $QFIRST$;
    for (var hr = 0u; hr < $REP$u; hr = hr + 1u) {
        let bh = b * $HQ$u + kvh * $REP$u + hr;
        let mbase = $MBASE$;
        for (var q0 = qfirst; q0 < $TQ$u; q0 = q0 + $BQ$u) {
            workgroupBarrier();
            $STAGE_Q$
            $STAGE_Y$
            $TILE$
            for (var kk = 0u; kk < $SPT$u; kk = kk + 1u) {
                let r = sr0 + kk * $RSTEP$u;
                if (r < $BQ$u) {
                    $PAIR$
                    let lrow = sh[$LO$u + r];
                    var wt = 0.0;
                    if (okk && lrow > 0.0) {
                        let p = $PROB$;
                        wt = $WEIGHT$;
                    }
                    sh[$PO$u + r * $SB$u + sj] = wt;
                }
            }
            workgroupBarrier();
            for (var r = 0u; r < $BQ$u; r = r + 1u) {
                let wt = sh[$PO$u + r * $SB$u + pj];
                let xb = $SRC$u + r * $SRCD$u + pc;
                for (var c = 0u; c < $CPT$u; c = c + 1u) {
                    acc[c] = acc[c] + wt * sh[xb + c * $TPR$u];
                }
            }
        }
    }
    let j = kown + pj;
    if (j < $TK$u) {
        for (var c = 0u; c < $CPT$u; c = c + 1u) {
            let col = pc + c * $TPR$u;
            if (col < $COLS$u) {
                $STORE$
            }
        }
    }"
        .replace("$OWN$", &pass.own)
        .replace("$TILE$", &pass.tile)
        .replace("$PAIR$", &pass.pair)
        .replace("$PROB$", pass.prob)
        .replace("$WEIGHT$", weight),
        &[
            vec![
                ("NKB", nkb.to_string()),
                ("TPR", tpr.to_string()),
                ("CPT", cpt.to_string()),
                ("QFIRST", qfirst),
                (
                    "STAGE_Q",
                    stage(
                        a.q,
                        &format!("(bh * {}u + q0) * {d}u", a.tq),
                        "q0",
                        a.tq,
                        t.bq,
                        d,
                        o.qo,
                        o.qd,
                        w,
                    ),
                ),
                (
                    "STAGE_Y",
                    stage(
                        dy,
                        &format!("(bh * {}u + q0) * {dv}u", a.tq),
                        "q0",
                        a.tq,
                        t.bq,
                        dv,
                        o.yo,
                        o.yd,
                        w,
                    ),
                ),
                ("LO", o.lo.to_string()),
                ("MO", o.mo.to_string()),
                ("RO", o.ro.to_string()),
                ("PO", o.po.to_string()),
                ("SB", (t.bk + 1).to_string()),
                ("SRC", src.to_string()),
                ("SRCD", src_d.to_string()),
                ("COLS", cols.to_string()),
                (
                    "STORE",
                    store(
                        out,
                        &format!("j * {cols}u + kvrow * {}u + col", a.tk * cols),
                        &format!("acc[c]{scale}"),
                    ),
                ),
            ],
            t.values(a),
        ]
        .concat(),
    );
    Ok(kernel(w, words, groups, &body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::DType;

    fn operand(offset: usize, shape: &[usize]) -> Operand {
        Operand::at(offset, shape, DType::F32)
    }

    /// Every kernel naga accepts (barriers in uniform control flow included), and its
    /// workgroup array within 16 KiB, at the shapes of the models we run and both widths.
    #[test]
    fn model_shaped_kernels_validate_and_fit_the_floor() {
        // (batch, Hq, Hkv, Tq, Tk, D, causal): Whisper tiny's encoder, SmolLM2-135M, a cross-attention, a tiny head.
        let shapes = [
            (1, 6, 6, 1500, 1500, 64, false),
            (1, 9, 3, 128, 128, 64, true),
            (2, 4, 2, 37, 70, 8, false),
            (1, 2, 1, 5, 3, 128, true),
        ];
        for (b, hq, hkv, tq, tk, d, causal) in shapes {
            for width in [256, 128, 64] {
                // q, k, v, mask, dy, then the statistics and the forward output.
                let x = [
                    operand(0, &[b, hq, tq, d]),
                    operand(1 << 20, &[b, hkv, tk, d]),
                    operand(2 << 20, &[b, hkv, tk, d]),
                    operand(3 << 20, &[tq, tk]),
                    operand(4 << 20, &[b, hq, tq, d]),
                    operand(6 << 20, &[b, hq, tq, 2]),
                    operand(7 << 20, &[b, hq, tq, d]),
                ];
                let grad = |part| Op::AttentionGrad { causal, scale: 0.125, has_mask: true, part };
                let steps = [
                    (Op::Attention { causal, scale: 0.125, has_mask: true }, 4),
                    (Op::AttentionStats { causal, scale: 0.125, has_mask: true }, 3),
                    (grad(GradPart::Q), 5),
                    (grad(GradPart::K), 5),
                    (grad(GradPart::V), 5),
                    (grad(GradPart::Q), 7),
                    (grad(GradPart::K), 7),
                    (grad(GradPart::V), 6),
                ];
                for (op, n) in steps {
                    let shape = match &op {
                        Op::AttentionGrad { part: GradPart::K | GradPart::V, .. } => {
                            vec![b, hkv, tk, d]
                        }
                        Op::AttentionStats { .. } => vec![b, hq, tq, 2],
                        _ => vec![b, hq, tq, d],
                    };
                    let step = crate::test_util::step(op.clone(), vec![], DType::F32, &shape);
                    // The statistics read q, k and the mask.
                    let stats_inputs = [x[0].clone(), x[1].clone(), x[3].clone()];
                    let inputs = if matches!(op, Op::AttentionStats { .. }) {
                        &stats_inputs[..]
                    } else {
                        &x[..n]
                    };
                    let src = generate(&step, inputs, &operand(5 << 20, &shape), width)
                        .unwrap_or_else(|e| panic!("{}: {e}", op.describe()));
                    assert_eq!(src.invocations % width as u64, 0);
                    let words: usize = src
                        .body
                        .split("array<f32, ")
                        .nth(1)
                        .and_then(|s| s.split('>').next())
                        .and_then(|n| n.parse().ok())
                        .expect("one workgroup array");
                    assert!(
                        words <= SHARED_WORDS,
                        "{} at width {width}: {words} words",
                        op.describe()
                    );
                    let full = format!("{}{}", crate::device::PRELUDE, src.body);
                    let mut m = naga::front::wgsl::parse_str(&full)
                        .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&full)));
                    for (k, (_, g)) in m.global_variables.iter_mut().enumerate() {
                        if g.binding.is_none()
                            && matches!(
                                g.space,
                                naga::AddressSpace::Storage { .. } | naga::AddressSpace::Uniform
                            )
                        {
                            g.binding = Some(naga::ResourceBinding { group: 0, binding: k as u32 });
                        }
                    }
                    naga::valid::Validator::new(
                        naga::valid::ValidationFlags::all(),
                        naga::valid::Capabilities::default(),
                    )
                    .validate(&m)
                    .unwrap_or_else(|e| {
                        panic!("{} at width {width}: {e:?}\n{full}", op.describe())
                    });
                }
            }
        }
    }
}
