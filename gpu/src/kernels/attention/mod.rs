//! Tiled attention kernels: the forward (flash-attention style) and the three derivatives.
//!
//! Formulas are the CPU backend's (`cpu/attention.rs`): `S = scale·q·kᵀ + mask`, causal keys
//! `j > i + (Tk − Tq)` hidden, `P = softmax_rows(S)` with a row that sees no key all zeros,
//! `out = P·v`; `dS = P ∘ (dP − rowdot)` with `dP = dy·vᵀ` and `rowdot = Σ_j P·dP`,
//! `dq = scale·dS·k`, `dk = scale·dSᵀ·q`, `dv = Pᵀ·dy`, `dmask = dS` (the scores' shape); a
//! KV head sums over the query heads it serves (`h / (Hq/Hkv)`).
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
//! The GPU therefore rewrites its plan (`rewrite/attention_stats.rs`): one `AttentionStats`
//! step (`row_stats`, the statistics pass without dy) stores `(m, 1/l)` per query row, and the
//! derivatives become `AttentionGradWithStats`, reading it after dy, dq and dk also the forward
//! output (`rowdot = dy·out`, one dot per row; see `Given`). Then dq is a single pass over its
//! key tiles, and dk and dv (`grad_kv_given`) a single pass over the query tiles that see their
//! own keys: `O(Tq·BK·D)` per key tile instead of `O(Tq·Tk·D)`.
//!
//! Submodules: the shared WGSL pieces (`parts`: staging, scoring, the statistics pass), the
//! forward and statistics kernels (`forward`), the forward for few query rows, parallel over
//! the keys (`decode`), the derivatives (`grad`: dq, dk, dv and the mask's dS).

mod blocked;
mod coop;
mod decode;
mod forward;
mod grad;
mod parts;
#[cfg(test)]
mod tests;

use super::{strides, KernelSource, Operand, Target};
use crate::program::GpuOp;
use forward::{forward, row_stats};
use grad::{grad_kv, grad_mask, grad_q};
use mgn_ir::op::{GradPart, Op};
use mgn_ir::shape::attention::{dims, Dims};
use mgn_ir::shape::broadcast_strides;
use parts::stage;

pub(crate) use coop::runs_on_tensor_cores;

/// The workgroup array every kernel stays within, in f32 words (16 KiB: the Vulkan floor).
const SHARED_WORDS: usize = 4096;

/// −FLT_MAX: the "nothing seen yet" maximum (WGSL has no −inf literal).
const NEG: &str = "-3.4028235e38";

/// Whether the decode kernel (`decode.rs`) runs an attention of queries `q`, keys `k` and
/// values `v` of these shapes at any workgroup width: the one kernel that rotates the queries
/// as it loads them (`GpuOp::RotatedAttention`).
pub(crate) fn decodes(q: &[usize], k: &[usize], v: &[usize]) -> bool {
    dims(q, k, v).is_ok_and(|d| d.batch * d.hq > 0 && decode::decodes(d.tq, d.d, d.dv, d.tk))
}

/// Kernels for `Op::Attention` and `Op::AttentionGrad` as compiled, and for the GPU's
/// `AttentionStats` and `AttentionGradWithStats` (see `Given`).
pub fn generate(
    op: &GpuOp,
    inputs: &[Operand],
    out: &Operand,
    target: Target,
) -> Result<KernelSource, String> {
    let width = target.width;
    let need = |k: usize| {
        if inputs.len() < k {
            Err(format!("`{}` needs {k} inputs, found {}", op.describe(), inputs.len()))
        } else {
            Ok(())
        }
    };
    let w = width as usize;
    match op {
        GpuOp::Plan(Op::Attention { causal, scale, has_mask })
        | GpuOp::AttentionOnTiles { causal, scale, has_mask } => {
            need(3 + *has_mask as usize)?;
            let a = Attn::new(inputs, *causal, *scale, *has_mask)?;
            // Few query rows a head (decoding): parallel over the keys instead (`decode`);
            // past them, where the rewrite asked for it, f16 heads on cooperative matrices
            // (`coop`), else both products register-blocked (`blocked`) where the heads suit
            // it: 2.4-2.6x the scalar loop's speed at long sequences and no slower anywhere on
            // an H200 (docs/benchmarks/2026-12-05.md, "Attention without its score matrix"),
            // so the scalar loop is only the fallback for heads the blocked kernel cannot take.
            let shared = target.shared_bytes as usize;
            let on_tiles = matches!(op, GpuOp::AttentionOnTiles { .. });
            let tiles = || {
                let coop = target.coop.filter(|_| on_tiles)?;
                coop::forward(&a, out, coop, w, shared)
            };
            let blocked = || blocked::forward(&a, out, w, shared);
            match decode::forward(&a, out, w).or_else(tiles).or_else(blocked) {
                Some(k) => Ok(k),
                None => forward(&a, out, w),
            }
        }
        GpuOp::RotatedAttention {
            attention: Op::Attention { causal, scale, has_mask },
            rope: Op::Rope { theta, offset, inverse },
            rounded,
        } => {
            let n = 3 + *has_mask as usize;
            need(n)?;
            let a = Attn::new(&inputs[..n], *causal, *scale, *has_mask)?;
            // The queries rotated as the decode kernel loads them: only that kernel does.
            let (theta, offset, inverse, rounded) = (*theta, *offset, *inverse, *rounded);
            let rope = decode::Rotation { theta, offset, inverse, rounded };
            let start = inputs.get(n);
            decode::rotated(&a, rope, start, out, w).ok_or_else(|| {
                format!("`{}`: too many query rows or too wide a head to decode", op.describe())
            })
        }
        GpuOp::AttentionStats { causal, scale, has_mask } => {
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
            row_stats(&a, out, w)
        }
        GpuOp::Plan(Op::AttentionGrad { causal, scale, has_mask, part }) => {
            let base = 4 + *has_mask as usize;
            need(base)?;
            if inputs.len() > base {
                return Err(format!(
                    "attention_grad takes q, k, v, the mask if any and dy, found {} inputs",
                    inputs.len()
                ));
            }
            grad(&Attn::new(inputs, *causal, *scale, *has_mask)?, *part, None, out, w)
        }
        GpuOp::AttentionGradWithStats { causal, scale, has_mask, part } => {
            let base = 4 + *has_mask as usize;
            need(base + 1)?;
            let a = Attn::new(inputs, *causal, *scale, *has_mask)?;
            let given = Given::of(&a, &inputs[base..], *part)?;
            grad(&a, *part, Some(&given), out, w)
        }
        other => Err(format!("`{}` is not attention", other.describe())),
    }
}

/// The derivative of q, k or v, with or without given statistics.
fn grad(
    a: &Attn,
    part: GradPart,
    given: Option<&Given>,
    out: &Operand,
    w: usize,
) -> Result<KernelSource, String> {
    if a.dy.is_none() {
        return Err("attention_grad needs dy after q, k, v and the mask".into());
    }
    match part {
        GradPart::Q => grad_q(a, given, out, w),
        GradPart::K | GradPart::V => grad_kv(a, part == GradPart::K, given, out, w),
        GradPart::Mask if a.mask.is_some() => grad_mask(a, given, out, w),
        other => {
            Err(format!("attention has no {other:?} input to differentiate (Q, K, V or a mask)"))
        }
    }
}

/// Row statistics a derivative kernel is given instead of computing them: `stats` (an
/// `AttentionStats` of its q, k and mask: `(m, 1/l)` per query row) and, for dq and dk, the
/// forward output `out`, from which `rowdot_i = Σ_j P_ij·dP_ij = dy_i·out_i` is one dot per row.
struct Given<'a> {
    stats: &'a Operand,
    out: Option<&'a Operand>,
}

impl<'a> Given<'a> {
    /// The statistics and (for q and k) the forward output among the inputs after dy.
    fn of(a: &Attn, extra: &'a [Operand], part: GradPart) -> Result<Given<'a>, String> {
        let what = "attention_grad with_stats";
        let stats = extra.first().ok_or_else(|| format!("{what}: no statistics after dy"))?;
        let mut want = a.q.shape.clone();
        *want.last_mut().expect("rank checked") = 2;
        if stats.shape != want || !stats.dtype.is_float() {
            return Err(format!("{what}: the statistics are {:?}, expected {want:?}", stats.shape));
        }
        let out = match part {
            GradPart::V => None,
            _ => Some(extra.get(1).ok_or_else(|| {
                format!("{what}: dq and dk need the forward output after the statistics")
            })?),
        };
        if let (Some(o), Some(dy)) = (out, a.dy) {
            if o.shape != dy.shape {
                return Err(format!(
                    "{what}: the forward output is {:?}, expected dy's {:?}",
                    o.shape, dy.shape
                ));
            }
        }
        let want = 1 + out.is_some() as usize;
        if extra.len() != want {
            return Err(format!("{what}: {want} inputs after dy, found {}", extra.len()));
        }
        Ok(Given { stats, out })
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

    /// WGSL staging the `rows` rows from query `q0` of head `bh` of `o` (q or dy, `cols` words
    /// a row) into `sh[dst + r·stride]` (see `stage`).
    fn stage_queries(
        &self,
        o: &Operand,
        rows: usize,
        cols: usize,
        dst: usize,
        stride: usize,
        w: usize,
    ) -> String {
        let src = format!("(bh * {}u + q0) * {cols}u", self.tq);
        stage(o, &src, "q0", self.tq, rows, cols, dst, stride, w)
    }

    /// WGSL staging the `rows` rows from key `k0` of KV head `kvrow` of `o` (k or v).
    fn stage_keys(
        &self,
        o: &Operand,
        rows: usize,
        cols: usize,
        dst: usize,
        stride: usize,
        w: usize,
    ) -> String {
        let src = format!("kvrow * {}u + k0 * {cols}u", self.tk * cols);
        stage(o, &src, "k0", self.tk, rows, cols, dst, stride, w)
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

/// The kernel's entry: the workgroup array `array` declares, `workgroup_size(W)`, the linear
/// workgroup id `wid` (the session folds the grid into three dimensions), and a uniform exit
/// past the last tile.
fn entry(w: usize, array: &str, groups: usize, body: &str) -> String {
    format!(
        "{array}

@compute @workgroup_size({w})
fn main(@builtin(local_invocation_index) tid: u32, \
    @builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) groups: vec3<u32>) {{
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
        body: entry(w, &format!("var<workgroup> sh: array<f32, {words}>;"), groups, body),
        invocations: (groups * w) as u64,
        dropout_node: None,
        width: None,
    }
}
