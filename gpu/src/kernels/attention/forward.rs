//! The forward kernel (flash-attention style, online softmax over key tiles) and the row
//! statistics kernel (`AttentionStats`).

use super::parts::{key_end, score, stats_pass, StatsLayout};
use super::{fill, kernel, odd, Attn, Tiles, NEG};
use crate::kernels::{store, KernelSource, Operand};

/// `AttentionStats`: one workgroup per (batch·query head, query tile), the statistics pass of
/// the derivatives without dy (so without V), then `(m, 1/l)` per row.
pub(super) fn row_stats(a: &Attn, out: &Operand, w: usize) -> Result<KernelSource, String> {
    let d = a.d;
    // The Q tile, the row results, then the K tile, which the partials alias once the keys are
    // done.
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
                ("STAGE_Q", a.stage_queries(a.q, t.bq, d, qo, qd, w)),
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

/// The WGSL of `forward`, its `$NAME$`s filled there.
const FORWARD: &str = "let bh = wid / $NQB$u;
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
    }";

/// One workgroup per (batch·query head, tile of BQ queries); key tiles stream through shared
/// memory with an online softmax. Per key tile: stage K and V; score the tile's pairs into `S`;
/// each scorer turns its pairs into `P = e^(s − m_new)` with its row's running max, while the
/// output invocations rescale their accumulators by `e^(m_old − m_new)`; then `acc += P·V`.
pub(super) fn forward(a: &Attn, out: &Operand, w: usize) -> Result<KernelSource, String> {
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
        FORWARD,
        &[
            vec![
                ("NQB", nqb.to_string()),
                ("TPR", tpr.to_string()),
                ("CPT", cpt.to_string()),
                ("NEG", NEG.into()),
                ("KEND", key_end(a, t.bq)),
                ("STAGE_Q", a.stage_queries(a.q, t.bq, d, qo, qd, w)),
                ("STAGE_K", a.stage_keys(a.k, t.bk, d, ko, kd, w)),
                ("STAGE_V", a.stage_keys(a.v, t.bk, dv, vo, vd, w)),
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
