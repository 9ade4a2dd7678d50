//! The WGSL pieces every attention kernel is assembled from: staging tiles into shared memory,
//! scoring a pair, where the key loop ends, the online statistics pass over the keys, and
//! loading given statistics.

use super::{fill, Attn, Given, Tiles, NEG};
use crate::kernels::{load, Operand};

/// WGSL copying rows `row0 .. row0 + rows` (`cols` words each, contiguous from word `src` of
/// `o`) into `sh[dst + r·stride + c]`; rows at or past `limit` read as zeros. Consecutive
/// invocations load consecutive words.
#[allow(clippy::too_many_arguments)]
pub(super) fn stage(
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
/// `dpv` (`dy·v`). Q rows at `qo` (stride `qd`), K at `ko` (`kd`), dy at `yo` (`yd`), V at `vo`
/// (`vd`).
pub(super) fn score(
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
pub(super) fn key_end(a: &Attn, bq: usize) -> String {
    if a.causal {
        format!("min({tk}u, max(q0 + {bq}u + {tk}u, {tq}u) - {tq}u)", tk = a.tk, tq = a.tq)
    } else {
        format!("{}u", a.tk)
    }
}

/// Where the statistics pass finds its operands and leaves its results, in `sh` words.
pub(super) struct StatsLayout {
    pub(super) qo: usize,
    pub(super) qd: usize,
    /// dy rows, when `rowdot` is wanted: `(yo, yd)`.
    pub(super) y: Option<(usize, usize)>,
    pub(super) ko: usize,
    pub(super) kd: usize,
    pub(super) vo: usize,
    pub(super) vd: usize,
    /// Partials, `3·BQ·BK` words, free once the key loop is over (may alias the K and V tiles).
    pub(super) part: usize,
    /// Row max, sum and rowdot, `BQ` words each.
    pub(super) mo: usize,
    pub(super) lo: usize,
    pub(super) ro: usize,
}

/// The WGSL of `stats_pass`, its `$NAME$`s filled there.
const STATS_PASS: &str = "var pm: array<f32, $SPT$>;
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
    workgroupBarrier();";

/// WGSL for one pass over the keys of the query tile at `q0` (staged at `qo`, and dy at `yo`),
/// leaving each row's max, sum of exponentials and (with dy) rowdot in `sh[mo/lo/ro + r]`.
/// Each invocation keeps online partials over its own pairs; they merge once at the end.
/// With `save_own`, the pairs of the key tile starting at `kown` keep their score, visibility
/// and dP in `own_s`, `own_ok`, `own_dp` (dk and dv need no second pass over their own keys).
pub(super) fn stats_pass(a: &Attn, t: &Tiles, l: &StatsLayout, save_own: bool) -> String {
    let rowdot = l.y.is_some();
    let stage_v =
        if rowdot { a.stage_keys(a.v, t.bk, a.dv, l.vo, l.vd, t.w) } else { String::new() };
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
        STATS_PASS,
        &[
            ("SPT", t.spt.to_string()),
            ("NEG", NEG.into()),
            ("KEND", key_end(a, t.bq)),
            ("BK", t.bk.to_string()),
            ("BQ", t.bq.to_string()),
            ("RSTEP", t.rstep.to_string()),
            ("STAGE_K", a.stage_keys(a.k, t.bk, a.d, l.ko, l.kd, t.w)),
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
pub(super) fn load_given(
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
