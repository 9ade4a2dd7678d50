//! The derivative kernels: dq (`grad_q`), dk and dv (`grad_kv`) and the mask's (`grad_mask`),
//! each with the row statistics recomputed or given (`AttentionGradWithStats`).

use super::parts::{key_end, load_given, score, stats_pass, StatsLayout};
use super::{fill, kernel, odd, Attn, Given, Tiles};
use crate::kernels::{store, KernelSource, Operand};

/// The WGSL both dq and the mask's derivative are made from: per (batch·query head, query
/// tile), the rows' statistics, then every pair's `dS = P ∘ (dP − rowdot)` over the key tiles
/// up to `$KEND$`. What each does with a pair's `ds` (`$USE_DS$`: dq keeps it in shared memory,
/// the mask's derivative stores it), after each key tile (`$AFTER_TILE$`) and at the end
/// (`$TAIL$`) is its own; its `$NAME$`s are filled there.
const DS_PASS: &str = "let bh = wid / $NQB$u;
    let q0 = (wid - bh * $NQB$u) * $BQ$u;
    let kvrow = (bh / $HQ$u) * $HKV$u + (bh % $HQ$u) / $REP$u;
    let mbase = $MBASE$;
    let sj = tid % $BK$u;
    let sr0 = tid / $BK$u;
    $BEFORE$
    $STAGE_Q$
    $STAGE_Y$
    $STATS$
    for (var k0 = 0u; k0 < $KEND$; k0 = k0 + $BK$u) {
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
                $USE_DS$
            }
        }
        $AFTER_TILE$
    }
    $TAIL$";

/// dq's parts of `DS_PASS`: the output mapping and accumulator, `dS` into shared memory, then
/// `dq += dS·K` per key tile and the store.
const GRAD_Q_BEFORE: &str = "let pr = tid / $TPR$u;
    let pc = tid % $TPR$u;
    var acc: array<f32, $CPT$>;";
const GRAD_Q_USE_DS: &str = "sh[$DSO$u + r * $SB$u + sj] = ds;";
const GRAD_Q_AFTER_TILE: &str = "workgroupBarrier();
        for (var jj = 0u; jj < $BK$u; jj = jj + 1u) {
            let ds = sh[$DSO$u + pr * $SB$u + jj];
            let kb = $KO$u + jj * $KD$u + pc;
            for (var c = 0u; c < $CPT$u; c = c + 1u) {
                acc[c] = acc[c] + ds * sh[kb + c * $TPR$u];
            }
        }";
const GRAD_Q_TAIL: &str = "let qi = q0 + pr;
    if (qi < $TQ$u) {
        for (var c = 0u; c < $CPT$u; c = c + 1u) {
            let col = pc + c * $TPR$u;
            if (col < $D$u) {
                $STORE$
            }
        }
    }";

/// `DS_PASS` with its parts in place (their own `$NAME$`s left for `fill`).
fn ds_pass(before: &str, kend: &str, use_ds: &str, after_tile: &str, tail: &str) -> String {
    DS_PASS
        .replace("$BEFORE$", before)
        .replace("$KEND$", kend)
        .replace("$USE_DS$", use_ds)
        .replace("$AFTER_TILE$", after_tile)
        .replace("$TAIL$", tail)
}

/// Where `DS_PASS` keeps its q and dy tiles, the rows' statistics and the K and V tiles in
/// `sh`, the same for dq and the mask's derivative: `q`, `y`, `k`, `v` are (offset, row
/// stride); `m`, `l`, `r` the rows' max, `l` (or `1/l`) and rowdot.
struct DsLayout {
    q: (usize, usize),
    y: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
    m: usize,
    l: usize,
    r: usize,
}

impl DsLayout {
    fn new(a: &Attn, t: &Tiles) -> DsLayout {
        let (qd, yd, kd, vd) = (odd(a.d), odd(a.dv), odd(a.d), odd(a.dv));
        let yo = t.bq * qd;
        let m = yo + t.bq * yd;
        let ko = m + 3 * t.bq;
        DsLayout {
            q: (0, qd),
            y: (yo, yd),
            k: (ko, kd),
            v: (ko + t.bk * kd, vd),
            m,
            l: m + t.bq,
            r: m + 2 * t.bq,
        }
    }

    /// The statistics pass's view of it (its partials alias the K and V tiles).
    fn stats(&self) -> StatsLayout {
        let (((qo, qd), (ko, kd)), (vo, vd)) = ((self.q, self.k), self.v);
        let (mo, lo, ro) = (self.m, self.l, self.r);
        StatsLayout { qo, qd, y: Some(self.y), ko, kd, vo, vd, part: ko, mo, lo, ro }
    }

    /// The rows' statistics as the pass reads them, and how `l` is applied: given (`1/l`,
    /// multiplied) or computed (`l`, divided), the key loop's end `kend` defined either way.
    fn row_stats(&self, a: &Attn, t: &Tiles, given: Option<&Given>) -> (String, &'static str) {
        match given {
            Some(g) => {
                let (yo, yd) = self.y;
                let load = load_given(a, g, t.bq, yo, yd, self.m, self.l, self.r);
                (format!("let kend = {};\n    {load}", key_end(a, t.bq)), "*")
            }
            None => (stats_pass(a, t, &self.stats(), false), "/"),
        }
    }

    /// The `$NAME$`s of `DS_PASS` itself (its parts' own are the caller's).
    fn values(
        &self,
        a: &Attn,
        t: &Tiles,
        (stats, per_l): (String, &str),
        w: usize,
    ) -> Vec<(&'static str, String)> {
        let dy = a.dy.expect("checked");
        let (((qo, qd), (yo, yd)), ((ko, kd), (vo, vd))) = ((self.q, self.y), (self.k, self.v));
        let mut values = vec![
            ("NQB", a.tq.div_ceil(t.bq).to_string()),
            ("STAGE_Q", a.stage_queries(a.q, t.bq, a.d, qo, qd, w)),
            ("STAGE_Y", a.stage_queries(dy, t.bq, a.dv, yo, yd, w)),
            ("STATS", stats),
            ("PER_L", per_l.into()),
            ("STAGE_K", a.stage_keys(a.k, t.bk, a.d, ko, kd, w)),
            ("STAGE_V", a.stage_keys(a.v, t.bk, a.dv, vo, vd, w)),
            ("SCORE", score(a, qo, qd, ko, kd, Some((yo, yd, vo, vd)))),
            ("LO", self.l.to_string()),
            ("MO", self.m.to_string()),
            ("RO", self.r.to_string()),
        ];
        values.extend(t.values(a));
        values
    }
}

/// dq: one workgroup per (batch·query head, query tile). The statistics pass gives each row's
/// max, sum and rowdot once (or they are `given`: then the row max, `1/l` and `dy·out`); a
/// second pass over the key tiles forms `dS = P ∘ (dP − rowdot)` per pair into shared memory
/// and accumulates `dq += dS·K` in the output mapping (over D).
pub(super) fn grad_q(
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
    let l = DsLayout::new(a, &t);
    let (ko, kd) = l.k;
    let dso = ko + (t.bk * (kd + l.v.1)).max(part(t.bq, t.bk));
    let groups = a.batch * a.hq * a.tq.div_ceil(t.bq);
    if groups == 0 || d == 0 {
        return Ok(kernel(w, 1, 0, ""));
    }
    let template = ds_pass(GRAD_Q_BEFORE, "kend", GRAD_Q_USE_DS, GRAD_Q_AFTER_TILE, GRAD_Q_TAIL);
    let mut values = l.values(a, &t, l.row_stats(a, &t, given), w);
    values.extend([
        ("TPR", tpr.to_string()),
        ("CPT", cpt.to_string()),
        ("DSO", dso.to_string()),
        ("SB", (t.bk + 1).to_string()),
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
    ]);
    let body = fill(&template, &values);
    Ok(kernel(w, words, groups, &body))
}

/// The mask's part of `DS_PASS`: each pair's `ds` stored, every key of the row (hidden ones as 0).
const GRAD_MASK_USE_DS: &str = "if (qi < $TQ$u && j < $TK$u) {
                    $STORE$
                }";

/// The mask's derivative, `dS = P ∘ (dP − rowdot)` of every score, in the scores' full shape
/// `[..B, Hq, Tq, Tk]`: one workgroup per (batch·query head, query tile), as dq's. The rows'
/// statistics come from the statistics pass (or are `given`), then one pass over every key tile
/// scores each pair and stores its `dS` — zero where the key is hidden (causal, a `-inf` mask)
/// or the row sees no key, so every element is written. Nothing accumulates: the work is dq's
/// without its product, and the result is as large as the score matrix it describes.
pub(super) fn grad_mask(
    a: &Attn,
    given: Option<&Given>,
    out: &Operand,
    w: usize,
) -> Result<KernelSource, String> {
    let (d, dv) = (a.d, a.dv);
    if out.shape != a.scores {
        return Err(format!(
            "attention_grad mask: the result is {:?}, expected the scores' {:?}",
            out.shape, a.scores
        ));
    }
    // Q, dy tiles; K and V tiles (the statistics pass's partials alias them); statistics.
    let part = |bq: usize, bk: usize| if given.is_some() { 0 } else { 3 * bq * bk };
    let words = |bq: usize, bk: usize| {
        bq * (odd(d) + odd(dv)) + (bk * (odd(d) + odd(dv))).max(part(bq, bk)) + 3 * bq
    };
    // Wide key tiles first: consecutive invocations then store consecutive scores of a row.
    let t = Tiles::choose(w, a.tq, a.tk, words, |bq, bk| (bk, bq, 0))?;
    let groups = a.batch * a.hq * a.tq.div_ceil(t.bq);
    if groups == 0 || a.tk == 0 {
        return Ok(kernel(w, 1, 0, ""));
    }
    let l = DsLayout::new(a, &t);
    let template = ds_pass("", "$TK$u", GRAD_MASK_USE_DS, "", "");
    let mut values = l.values(a, &t, l.row_stats(a, &t, given), w);
    let at = format!("(bh * {}u + qi) * {}u + j", a.tq, a.tk);
    values.push(("STORE", store(out, &at, "ds")));
    let body = fill(&template, &values);
    Ok(kernel(w, words(t.bq, t.bk), groups, &body))
}

/// dk (`is_k`) or dv: one workgroup per (batch·KV head, tile of BK keys), accumulating in
/// registers over the query heads sharing the KV head and their query tiles (under causality,
/// only the tiles with a query that sees one of its keys). Per query tile: stage q and dy, run
/// the statistics pass over every key (keeping the scores and dP of its own keys), then form
/// `P` (dv) or `dS` (dk) for its own keys into shared memory and accumulate `Pᵀ·dy` or `dSᵀ·q`
/// in the output mapping (key `tid / TPR`, columns `tid % TPR + c·TPR`).
pub(super) fn grad_kv(
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
        pair: "let okk = own_ok[kk];\n                    \
               let sc = own_s[kk];\n                    \
               let dpv = own_dp[kk];"
            .into(),
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
    let stage_v = if is_k { a.stage_keys(a.v, t.bk, dv, vo, vd, w) } else { String::new() };
    let pass = KvPass {
        own: format!(
            "let k0 = kown;\n    {}\n    {stage_v}",
            a.stage_keys(a.k, t.bk, d, ko, kd, w)
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

/// The WGSL of `kv_kernel`, its `$NAME$`s filled there.
const KV_KERNEL: &str = "let bkv = wid / $NKB$u;
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
    }";

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
        &KV_KERNEL
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
                ("STAGE_Q", a.stage_queries(a.q, t.bq, d, o.qo, o.qd, w)),
                ("STAGE_Y", a.stage_queries(dy, t.bq, dv, o.yo, o.yd, w)),
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
