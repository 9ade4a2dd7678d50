//! The forward for few query rows per (batch, head): decoding against a KV cache (one row), or
//! a handful of rows at once. It parallelises over the *keys* inside the workgroup.
//!
//! Why it exists: the tiled forward (`forward.rs`) gives a workgroup a tile of `BQ = 2^⌈log Tq⌉`
//! query rows, and with one row the 16 KiB budget leaves it `BK = 8` keys a tile at head dim 64:
//! 8 of 256 invocations score, every output invocation walks every key serially, and there are
//! only `batch·Hq` workgroups (9 for SmolLM2) — about 55 µs per dispatch on an H200 for 256
//! cached keys, where the work is a few µs.
//!
//! Here one workgroup owns one query row. Per chunk of `C` keys (an online softmax across
//! chunks, so any `Tk` runs):
//!
//! 1. scores: `TPK` neighbouring invocations share a key and split its head dim (each reads a
//!    contiguous run of the key row, so the reads coalesce); the partial dots land in `sh` and
//!    one invocation per key sums them, scales, adds the mask and keeps the score;
//! 2. each invocation folds its own scores into `(max, Σe^(s−max))`, and a tree over the
//!    workgroup merges those pairs: the chunk's max and sum in `log₂ W` steps;
//! 3. scores become `p = e^(s − m)` against the running max, the accumulators are rescaled,
//!    then `W / CW` groups of `CW` invocations each take every `(W/CW)`-th key of the chunk and
//!    accumulate `p·v` over `CPT` columns (consecutive invocations read consecutive columns).
//!
//! At the end the groups' accumulators are summed through `sh` and divided by the sum. The
//! query row stays in registers; K and V are read straight from memory (each is read once per
//! query row, so the path is for few rows: see `MAX_ROWS`).
//!
//! Measured on an H200 (`decode_attention_latency`, one dispatch alone, with a mask): SmolLM2's
//! 9 heads over 3, head dim 64, one row against 256 keys take 10 µs instead of 50 (1024 keys:
//! 27 instead of 184); 30 independent copies in one submission, 3 µs each. What is left is one
//! SM's bandwidth: 9 workgroups stream K and V, 128 KiB each, on a GPU of 132 SMs. Going further
//! means splitting the keys over workgroups and merging their `(m, l, acc)` in a second step
//! (flash-decoding), which needs scratch memory and a step of the plan of its own.
//!
//! What it honours is the tiled forward's contract: the additive mask broadcast along any axis
//! (`Attn::mask_layout`), causality (the key loop ends at the row's last visible key, as
//! `key_end` computes it), grouped KV heads (`kvrow`), the scale, rows that see no key (sum 0:
//! zeros), the running max starting at −FLT_MAX. The forward writes only `out` (the training
//! statistics are `AttentionStats`' own kernel), so nothing else is owed.

use super::parts::key_end;
use super::{fill, kernel, odd, Attn, NEG, SHARED_WORDS};
use crate::kernels::select::rope_value;
use crate::kernels::{load, store, KernelSource, Operand};

/// The most query rows per (batch, head) that take this kernel. Each row's workgroup reads all
/// of its head's K and V, so the traffic grows with the rows, while the tiled kernel shares each
/// K/V tile among up to 64 rows. At head dim 64 the tiled kernel's tile is `BQ·BK` = 8 pairs for
/// one row, 32 for two and 64 for four (of 256 invocations), with every output invocation
/// walking all keys serially; from 8 rows on it scores 128 pairs a tile and its workgroups
/// (`batch·Hq·⌈Tq/BQ⌉`) start to fill the GPU, so past 4 rows it is the better trade.
pub(super) const MAX_ROWS: usize = 4;

/// The sizes of one decode kernel (all powers of two but the derived counts).
struct Geometry {
    /// Invocations sharing one key's dot product, and the query words each holds (`⌈D/TPK⌉`).
    tpk: usize,
    epl: usize,
    /// Columns of V per group step, and the columns each invocation accumulates (`⌈Dv/CW⌉`).
    cw: usize,
    cpt: usize,
    /// Keys per chunk.
    chunk: usize,
}

impl Geometry {
    /// Row stride of the partial dots (odd: the summing invocations hit distinct banks).
    fn ps(&self) -> usize {
        odd(self.tpk)
    }

    /// Row stride of a group's accumulators in the final sum: one spare `CW` so the groups of
    /// one warp write different banks.
    fn fs(&self) -> usize {
        (self.cpt + 1) * self.cw
    }

    /// `sh` words: the partial dots (which the final sum reuses), the chunk's scores, and the
    /// `(max, sum)` pairs of the tree.
    fn words(&self, w: usize) -> usize {
        (self.chunk * self.ps()).max(w / self.cw * self.fs()) + self.chunk + 2 * w
    }

    /// The geometry for `a` at width `w`, or None when the shape is not one for this kernel.
    fn of(a: &Attn, w: usize) -> Option<Geometry> {
        let groups = a.batch * a.hq * a.tq;
        if groups == 0 {
            return None;
        }
        Geometry::sized(a.tq, a.d, a.dv, a.tk, w)
    }

    /// `of` by the sizes alone: `tq` query rows a head, head dims `d` and `dv`, `tk` keys.
    fn sized(tq: usize, d: usize, dv: usize, tk: usize, w: usize) -> Option<Geometry> {
        let a = Sizes { tq, d, dv, tk };
        if a.tq > MAX_ROWS || a.d == 0 || a.dv == 0 || !w.is_power_of_two() {
            return None;
        }
        let pow2 = |n: usize| n.next_power_of_two();
        // Eight lanes a key (a 32-byte sector each read), more for wide heads so no invocation
        // holds more than 16 query words in registers.
        let tpk = pow2(a.d).min(8).max(pow2(a.d) / 16);
        // Likewise eight columns a step, up to 16 accumulators an invocation.
        let cw = pow2(a.dv).min(8).max(pow2(a.dv) / 16);
        if tpk > w || cw > w {
            return None;
        }
        let mut g = Geometry {
            tpk,
            epl: a.d.div_ceil(tpk),
            cw,
            cpt: a.dv.div_ceil(cw),
            chunk: pow2(a.tk.max(1)),
        };
        while g.words(w) > SHARED_WORDS {
            if g.chunk == 1 {
                return None;
            }
            g.chunk /= 2;
        }
        Some(g)
    }
}

/// The sizes `Geometry::sized` reads.
struct Sizes {
    tq: usize,
    d: usize,
    dv: usize,
    tk: usize,
}

/// Whether this kernel runs an attention of these sizes (`tq` query rows a head, head dims `d`
/// and `dv`, `tk` keys) at every workgroup width a device may give it (64 to 256): a step
/// only this kernel can run (`GpuOp::RotatedAttention`) is made only for those.
pub(crate) fn decodes(tq: usize, d: usize, dv: usize, tk: usize) -> bool {
    [64, 128, 256].iter().all(|&w| Geometry::sized(tq, d, dv, tk, w).is_some())
}

/// A rotary embedding (`Op::Rope`'s fields) the kernel applies to each query word it loads.
pub(super) struct Rotation {
    pub theta: f64,
    pub offset: usize,
    pub inverse: bool,
    /// The half type each rotated word is rounded to (`GpuOp::RotatedAttention`'s `rounded`).
    pub rounded: Option<mgn_ir::DType>,
}

/// The WGSL of `forward`, its `$NAME$`s filled there.
const DECODE: &str = "let bh = wid / $TQ$u;
    let qi = wid - bh * $TQ$u;
    // `key_end`'s name for the first row of a query tile: here the only one.
    let q0 = qi;
    let kvrow = (bh / $HQ$u) * $HKV$u + (bh % $HQ$u) / $REP$u;
    let mbase = $MBASE$;
    let lane = tid % $TPK$u;
    let qrow = (bh * $TQ$u + qi) * $D$u + lane;
    $LOAD_Q$
    let vc = tid % $CW$u;
    let g = tid / $CW$u;
    var acc: array<f32, $CPT$>;
    var m = $NEG$;
    var l = 0.0;
    let kend = $KEND$;
    for (var k0 = 0u; k0 < kend; k0 = k0 + $C$u) {
        let cn = min($C$u, kend - k0);
        // The previous chunk's probabilities are read up to here.
        workgroupBarrier();
        for (var kb = tid / $TPK$u; kb < cn; kb = kb + $KPP$u) {
            let krow = (kvrow * $TK$u + k0 + kb) * $D$u + lane;
            var dot = 0.0;
            $DOT$
            sh[$PO$u + kb * $PS$u + lane] = dot;
        }
        workgroupBarrier();
        // This invocation's keys: scores, and their (max, sum) online.
        var mt = $NEG$;
        var lt = 0.0;
        for (var j = tid; j < cn; j = j + $W$u) {
            var dot = 0.0;
            for (var i = 0u; i < $TPK$u; i = i + 1u) {
                dot = dot + sh[$PO$u + j * $PS$u + i];
            }
            let kj = k0 + j;
            let sc = dot * $SCALE$$MASK$;
            sh[$SO$u + j] = sc;
            let mn = max(mt, sc);
            lt = lt * exp(mt - mn) + exp(sc - mn);
            mt = mn;
        }
        sh[$RO$u + tid] = mt;
        sh[$LO$u + tid] = lt;
        workgroupBarrier();
        for (var s = $HALF$u; s > 0u; s = s >> 1u) {
            if (tid < s) {
                let m1 = sh[$RO$u + tid];
                let m2 = sh[$RO$u + tid + s];
                let mn = max(m1, m2);
                sh[$LO$u + tid] = sh[$LO$u + tid] * exp(m1 - mn)
                    + sh[$LO$u + tid + s] * exp(m2 - mn);
                sh[$RO$u + tid] = mn;
            }
            workgroupBarrier();
        }
        let mc = sh[$RO$u];
        let mn = max(m, mc);
        let corr = exp(m - mn);
        l = l * corr + sh[$LO$u] * exp(mc - mn);
        m = mn;
        for (var c = 0u; c < $CPT$u; c = c + 1u) {
            acc[c] = acc[c] * corr;
        }
        // Each invocation turns the scores it wrote into probabilities.
        for (var j = tid; j < cn; j = j + $W$u) {
            sh[$SO$u + j] = exp(sh[$SO$u + j] - mn);
        }
        workgroupBarrier();
        for (var jj = g; jj < cn; jj = jj + $G$u) {
            let p = sh[$SO$u + jj];
            let vrow = (kvrow * $TK$u + k0 + jj) * $DV$u + vc;
            $PV$
        }
    }
    // The groups' accumulators, summed over the groups (over the partial dots, last read before
    // the tree's barriers).
    workgroupBarrier();
    for (var c = 0u; c < $CPT$u; c = c + 1u) {
        sh[g * $FS$u + c * $CW$u + vc] = acc[c];
    }
    workgroupBarrier();
    let inv = select(0.0, 1.0 / l, l > 0.0);
    for (var x = tid; x < $DV$u; x = x + $W$u) {
        var sum = 0.0;
        for (var gg = 0u; gg < $G$u; gg = gg + 1u) {
            sum = sum + sh[gg * $FS$u + x];
        }
        $STORE$
    }";

/// Unrolled WGSL lines, one per `i < n`, for word `lane + i·step` of a row; the lines that can
/// pass the row's end `limit` are guarded by `guard` (the lane's name).
fn unrolled(
    n: usize,
    step: usize,
    limit: usize,
    guard: &str,
    line: impl Fn(usize) -> String,
) -> String {
    (0..n)
        .map(|i| {
            let body = line(i);
            if (i + 1) * step <= limit {
                body
            } else {
                format!("if ({guard} + {}u < {limit}u) {{ {body} }}", i * step)
            }
        })
        .collect::<Vec<_>>()
        .join("\n            ")
}

/// The decode forward of `a` (see the module doc), or None when its shape is not one for this
/// kernel (too many query rows, heads too wide for the budget): the tiled forward runs then.
pub(super) fn forward(a: &Attn, out: &Operand, w: usize) -> Option<KernelSource> {
    let g = Geometry::of(a, w)?;
    let load_q = load_queries(&g, a.d, |i, off| {
        format!("qv{i} = {};", load(a.q, &format!("qrow + {off}u")))
    });
    Some(kernel_with(a, &g, load_q, out, w))
}

/// WGSL that declares the query words `qv0`, `qv1`… of the lane and gives each the value
/// `assign(i, offset)` assigns (the word at `qrow + offset`). Words the lane does not own (past
/// D) stay 0 and are never multiplied.
fn load_queries(g: &Geometry, d: usize, assign: impl Fn(usize, usize) -> String) -> String {
    (0..g.epl)
        .map(|i| {
            let off = i * g.tpk;
            let body = assign(i, off);
            if (i + 1) * g.tpk <= d {
                format!("var qv{i} = 0.0;\n    {body}")
            } else {
                format!("var qv{i} = 0.0;\n    if (lane + {off}u < {d}u) {{ {body} }}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n    ")
}

/// `forward` of the queries rotated by `rope` (its run-time start `start`, if any) as they are
/// loaded (`GpuOp::RotatedAttention`): each query word is `rope_value` of its element, which
/// reads its partner half a row away, so the rotation costs the kernel a second load a word.
pub(super) fn rotated(
    a: &Attn,
    rope: Rotation,
    start: Option<&Operand>,
    out: &Operand,
    w: usize,
) -> Option<KernelSource> {
    let g = Geometry::of(a, w)?;
    let value = rope_value(rope.theta, rope.offset, rope.inverse, a.q, start).ok()?;
    // In a block of its own per word, `i` the word's element of q, as `rope_value` reads it.
    let word = match rope.rounded {
        Some(h) => crate::halves::round(h, "rope_v"),
        None => "rope_v".into(),
    };
    let load_q = load_queries(&g, a.d, |i, off| {
        format!("{{\n    let i = qrow + {off}u;\n    {value}\n    qv{i} = {word};\n    }}")
    });
    Some(kernel_with(a, &g, load_q, out, w))
}

/// The decode kernel of `a` in geometry `g`, its query words loaded by the WGSL `load_q`
/// (which declares `qv0`, `qv1`… from `qrow`).
fn kernel_with(a: &Attn, g: &Geometry, load_q: String, out: &Operand, w: usize) -> KernelSource {
    let (d, dv) = (a.d, a.dv);
    let (po, so) = (0, (g.chunk * g.ps()).max(w / g.cw * g.fs()));
    let (ro, lo) = (so + g.chunk, so + g.chunk + w);
    let (_, msq, msk) = a.mask_layout();
    let mask = match a.mask {
        Some(m) => format!(" + {}", load(m, &format!("mbase + qi * {msq}u + kj * {msk}u"))),
        None => String::new(),
    };
    let dot = unrolled(g.epl, g.tpk, d, "lane", |i| {
        format!("dot = dot + qv{i} * {};", load(a.k, &format!("krow + {}u", i * g.tpk)))
    });
    let pv = unrolled(g.cpt, g.cw, dv, "vc", |c| {
        format!("acc[{c}] = acc[{c}] + p * {};", load(a.v, &format!("vrow + {}u", c * g.cw)))
    });
    let body = fill(
        DECODE,
        &[
            ("TQ", a.tq.to_string()),
            ("TK", a.tk.to_string()),
            ("HQ", a.hq.to_string()),
            ("HKV", a.hkv.to_string()),
            ("REP", a.rep().to_string()),
            ("MBASE", a.mask_layout().0),
            ("D", d.to_string()),
            ("DV", dv.to_string()),
            ("W", w.to_string()),
            ("HALF", (w / 2).to_string()),
            ("TPK", g.tpk.to_string()),
            ("KPP", (w / g.tpk).to_string()),
            ("CW", g.cw.to_string()),
            ("CPT", g.cpt.to_string()),
            ("G", (w / g.cw).to_string()),
            ("C", g.chunk.to_string()),
            ("PS", g.ps().to_string()),
            ("FS", g.fs().to_string()),
            ("PO", po.to_string()),
            ("SO", so.to_string()),
            ("RO", ro.to_string()),
            ("LO", lo.to_string()),
            ("NEG", NEG.into()),
            ("KEND", key_end(a, 1)),
            ("LOAD_Q", load_q),
            ("DOT", dot),
            ("PV", pv),
            ("SCALE", format!("{:?}", a.scale as f32)),
            ("MASK", mask),
            ("STORE", store(out, &format!("(bh * {}u + qi) * {dv}u + x", a.tq), "sum * inv")),
        ],
    );
    kernel(w, g.words(w), a.batch * a.hq * a.tq, &body)
}
