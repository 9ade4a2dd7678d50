//! Scaled dot-product attention (causal, masked, grouped KV heads) with its derivatives, and
//! rotary position embeddings.
//!
//! For one batch item and query head `h` (sharing KV head `h / (Hq/Hkv)`):
//! `S = scale·q·kᵀ + mask`, causal positions `j > i + (Tk − Tq)` set to −inf,
//! `P = softmax_rows(S)` (a row with every key masked is all zeros, not NaN), `out = P·v`.
//! Derivatives: `dv = Pᵀ·dy`, `dP = dy·vᵀ`, `dS = P ∘ (dP − rowsum(dP ∘ P))`,
//! `dq = scale·dS·k`, `dk = scale·dSᵀ·q`, `dmask = dS` (in the scores' shape); a KV head sums
//! over the query heads it serves.
//!
//! A few queries (decoding, one token against a KV cache) take their products with the keys and
//! the values in one pass over each (`matvec`), not through the GEMM, which would first copy them.

use super::float::{gemm, par_chunks, Float, Mat};
use super::layout::{broadcast_strides, numel, walk};
use super::matvec::{few_rows, STREAMED_ROWS};
use super::{by_float, check_shape, err, floats, KResult};
use mgn_ir::op::GradPart;
use mgn_ir::shape::attention::Dims;
use mgn_ir::{Data, Tensor};

/// The sizes of one attention op, checked, and where each (batch, head)'s mask starts.
struct Attn {
    batch: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
    scale: f64,
    /// Per (batch, query head): the offset of its `[Tq, Tk]` mask, and the row and column strides.
    mask: Option<(Vec<usize>, usize, usize)>,
}

fn dims(q: &[usize], k: &[usize], v: &[usize]) -> KResult<Dims> {
    Ok(mgn_ir::shape::attention::dims(q, k, v)?)
}

impl Attn {
    fn new(x: &[&Tensor], causal: bool, scale: f64, has_mask: bool) -> KResult<Attn> {
        let Dims { batch, hq, hkv, tq, tk, d, dv, scores } =
            dims(&x[0].shape, &x[1].shape, &x[2].shape)?;
        let r = scores.len();
        let mask = if has_mask {
            let st = broadcast_strides(&x[3].shape, &scores)?;
            let mut starts = Vec::with_capacity(numel(&scores[..r - 2]));
            walk(&scores[..r - 2], [&st[..r - 2]], |[o]| starts.push(o));
            Some((starts, st[r - 2], st[r - 1]))
        } else {
            None
        };
        Ok(Attn { batch, hq, hkv, tq, tk, d, dv, causal, scale, mask })
    }

    fn out_shape(&self, q_shape: &[usize]) -> Vec<usize> {
        let mut s = q_shape.to_vec();
        *s.last_mut().expect("rank checked") = self.dv;
        s
    }

    /// Query heads per KV head.
    fn rep(&self) -> usize {
        self.hq / self.hkv
    }

    /// `P` (`[Tq, Tk]`) of batch item `b`, query head `h`.
    fn probs<T: Float>(&self, q: &[T], k: &[T], mask: Option<&[T]>, b: usize, h: usize) -> Vec<T> {
        let (tq, tk, d) = (self.tq, self.tk, self.d);
        let kvh = h / self.rep();
        let qh = &q[(b * self.hq + h) * tq * d..][..tq * d];
        let kh = &k[(b * self.hkv + kvh) * tk * d..][..tk * d];
        let mut s = if tq <= STREAMED_ROWS {
            // A few queries (decoding): one pass over the keys, no packed copy of them.
            let mut s = few_rows(qh, tq, kh, d, tk, true);
            s.iter_mut().for_each(|v| *v *= T::of(self.scale));
            s
        } else {
            let mut s = vec![T::zero(); tq * tk];
            let (qm, km) = (Mat::new(qh, d, 1), Mat::new(kh, d, 1).t());
            gemm(tq, d, tk, T::of(self.scale), qm, km, T::zero(), &mut s, tk);
            s
        };
        self.softmax_rows(&mut s, mask, b, h);
        s
    }

    /// `P` of the query heads that share KV head `kvh` of batch item `b`, stacked
    /// (`[rep·Tq, Tk]`), for a few queries (`rep·Tq` at most [`STREAMED_ROWS`]): one pass over
    /// the keys serves them all.
    fn probs_shared<T: Float>(
        &self,
        q: &[T],
        k: &[T],
        mask: Option<&[T]>,
        b: usize,
        kvh: usize,
    ) -> Vec<T> {
        let (tq, tk, d, rep) = (self.tq, self.tk, self.d, self.rep());
        let qb = &q[(b * self.hq + kvh * rep) * tq * d..][..rep * tq * d];
        let kh = &k[(b * self.hkv + kvh) * tk * d..][..tk * d];
        let mut s = few_rows(qb, rep * tq, kh, d, tk, true);
        s.iter_mut().for_each(|v| *v *= T::of(self.scale));
        for (r, sh) in s.chunks_exact_mut(tq * tk).enumerate() {
            self.softmax_rows(sh, mask, b, kvh * rep + r);
        }
        s
    }

    /// Scaled scores `s` (`[Tq, Tk]`) of query head `h` to probabilities: the mask added, the
    /// causal positions hidden, each row's softmax.
    fn softmax_rows<T: Float>(&self, s: &mut [T], mask: Option<&[T]>, b: usize, h: usize) {
        let tk = self.tk;
        for (i, row) in s.chunks_exact_mut(tk).enumerate() {
            if let (Some(m), Some((starts, rs, cs))) = (mask, &self.mask) {
                let base = starts[b * self.hq + h] + i * rs;
                row.iter_mut().enumerate().for_each(|(j, v)| *v += m[base + j * cs]);
            }
            if self.causal {
                // Key j is visible to query i when j <= i + (Tk - Tq): aligned to the end.
                row.iter_mut()
                    .enumerate()
                    .filter(|(j, _)| j + self.tq > i + self.tk)
                    .for_each(|(_, v)| *v = T::neg_infinity());
            }
            let m =
                row.iter().fold(T::neg_infinity(), |a, &v| if v > a || v.is_nan() { v } else { a });
            if m == T::neg_infinity() {
                row.iter_mut().for_each(|v| *v = T::zero());
                continue;
            }
            let sum: f64 = row
                .iter_mut()
                .map(|v| {
                    *v = (*v - m).exp();
                    v.f64()
                })
                .sum();
            row.iter_mut().for_each(|v| *v /= T::of(sum));
        }
    }

    /// `dS` (`[Tq, Tk]`, before the scale) of batch item `b`, query head `h`, given its `P`.
    fn dscores<T: Float>(&self, p: &[T], v: &[T], dy: &[T], b: usize, h: usize) -> Vec<T> {
        let (tq, tk, dv) = (self.tq, self.tk, self.dv);
        let vh = &v[(b * self.hkv + h / self.rep()) * tk * dv..][..tk * dv];
        let gh = &dy[(b * self.hq + h) * tq * dv..][..tq * dv];
        let mut dp = vec![T::zero(); tq * tk];
        gemm(
            tq,
            dv,
            tk,
            T::one(),
            Mat::new(gh, dv, 1),
            Mat::new(vh, dv, 1).t(),
            T::zero(),
            &mut dp,
            tk,
        );
        for (prow, drow) in p.chunks_exact(tk).zip(dp.chunks_exact_mut(tk)) {
            let dot =
                T::of(prow.iter().zip(drow.iter()).map(|(&p, &d)| (p * d).f64()).sum::<f64>());
            for (d, &p) in drow.iter_mut().zip(prow) {
                *d = p * (*d - dot);
            }
        }
        dp
    }
}

/// Inputs `q, k, v, mask?`.
pub(crate) fn attention(
    x: &[&Tensor],
    causal: bool,
    scale: f64,
    has_mask: bool,
    shape: &[usize],
) -> KResult<Data> {
    let a = Attn::new(x, causal, scale, has_mask)?;
    check_shape(&a.out_shape(&x[0].shape), shape)?;
    by_float!(x, T => (|| {
        let (q, k, v) = (floats::<T>(x[0], "q")?, floats::<T>(x[1], "k")?, floats::<T>(x[2], "v")?);
        let mask = x.get(3).map(|m| floats::<T>(m, "mask")).transpose()?;
        let (tq, tk, dv, rep) = (a.tq, a.tk, a.dv, a.rep());
        let mut out = vec![T::zero(); a.batch * a.hq * tq * dv];
        // One work item per (batch, KV head): the query heads it serves are contiguous. For a
        // few queries the items run one after another, each product split over the cores inside
        // (`few_rows`): a handful of KV heads would split unevenly, and nested splits wait on
        // each other.
        let streamed = rep * tq <= STREAMED_ROWS;
        let work = if streamed { 0 } else { rep * tq * tk * (a.d + dv) };
        par_chunks(&mut out, rep * tq * dv, work, |item, o| {
            let (b, kvh) = (item / a.hkv, item % a.hkv);
            let vh = &v[(b * a.hkv + kvh) * tk * dv..][..tk * dv];
            if streamed {
                // A few queries (decoding): the heads of this KV head together, one pass over
                // its keys and one over its values.
                let p = a.probs_shared(&q, &k, mask.as_deref(), b, kvh);
                o.copy_from_slice(&few_rows(&p, rep * tq, vh, tk, dv, false));
                return;
            }
            for r in 0..rep {
                let p = a.probs(&q, &k, mask.as_deref(), b, kvh * rep + r);
                gemm(
                    tq,
                    tk,
                    dv,
                    T::one(),
                    Mat::new(&p, tk, 1),
                    Mat::new(vh, dv, 1),
                    T::zero(),
                    &mut o[r * tq * dv..],
                    dv,
                );
            }
        });
        Ok(out)
    })())
}

/// Inputs `q, k, v, mask?, dy` → the gradient of q, k or v.
pub(crate) fn attention_grad(
    x: &[&Tensor],
    causal: bool,
    scale: f64,
    has_mask: bool,
    part: GradPart,
) -> KResult<Data> {
    let a = Attn::new(x, causal, scale, has_mask)?;
    let dy_t = x[x.len() - 1];
    if dy_t.shape != a.out_shape(&x[0].shape) {
        return err(format!(
            "dy has shape {:?}, expected {:?}",
            dy_t.shape,
            a.out_shape(&x[0].shape)
        ));
    }
    match part {
        GradPart::Q | GradPart::K | GradPart::V => {}
        GradPart::Mask if has_mask => return mask_grad(&a, x, dy_t),
        _ => return err(format!("has no {part:?} input to differentiate (Q, K, V or a mask)")),
    }
    by_float!(x, T => (|| {
        let (q, k, v) = (floats::<T>(x[0], "q")?, floats::<T>(x[1], "k")?, floats::<T>(x[2], "v")?);
        let mask = if has_mask { Some(floats::<T>(x[3], "mask")?) } else { None };
        let dy = floats::<T>(dy_t, "dy")?;
        let (tq, tk, d, dv, rep) = (a.tq, a.tk, a.d, a.dv, a.rep());
        let scale = T::of(a.scale);
        // Per (batch, KV head): its query heads' rows of dq, or its own rows of dk / dv.
        let chunk = match part {
            GradPart::Q => rep * tq * d,
            GradPart::K => tk * d,
            _ => tk * dv,
        };
        let mut out = vec![T::zero(); a.batch * a.hkv * chunk];
        par_chunks(&mut out, chunk, rep * tq * tk * (2 * d + 2 * dv), |item, o| {
            let (b, kvh) = (item / a.hkv, item % a.hkv);
            for r in 0..rep {
                let h = kvh * rep + r;
                let p = a.probs(&q, &k, mask.as_deref(), b, h);
                let acc = if r == 0 { T::zero() } else { T::one() };
                match part {
                    GradPart::V => {
                        let gh = &dy[(b * a.hq + h) * tq * dv..][..tq * dv];
                        gemm(
                            tk,
                            tq,
                            dv,
                            T::one(),
                            Mat::new(&p, tk, 1).t(),
                            Mat::new(gh, dv, 1),
                            acc,
                            o,
                            dv,
                        );
                    }
                    GradPart::K => {
                        let ds = a.dscores(&p, &v, &dy, b, h);
                        let qh = &q[(b * a.hq + h) * tq * d..][..tq * d];
                        gemm(
                            tk,
                            tq,
                            d,
                            scale,
                            Mat::new(&ds, tk, 1).t(),
                            Mat::new(qh, d, 1),
                            acc,
                            o,
                            d,
                        );
                    }
                    _ => {
                        let ds = a.dscores(&p, &v, &dy, b, h);
                        let kh = &k[(b * a.hkv + kvh) * tk * d..][..tk * d];
                        gemm(
                            tq,
                            tk,
                            d,
                            scale,
                            Mat::new(&ds, tk, 1),
                            Mat::new(kh, d, 1),
                            T::zero(),
                            &mut o[r * tq * d..],
                            d,
                        );
                    }
                }
            }
        });
        Ok(out)
    })())
}

/// The mask's derivative: `dS` of every (batch item, query head) in the scores' full shape
/// `[..B, Hq, Tq, Tk]` (the mask is added to the scores, so its derivative is theirs; hidden
/// causal positions and rows that see no key have `P = 0` and so `dS = 0`).
fn mask_grad(a: &Attn, x: &[&Tensor], dy_t: &Tensor) -> KResult<Data> {
    by_float!(x, T => (|| {
        let (q, k, v) = (floats::<T>(x[0], "q")?, floats::<T>(x[1], "k")?, floats::<T>(x[2], "v")?);
        let mask = floats::<T>(x[3], "mask")?;
        let dy = floats::<T>(dy_t, "dy")?;
        let (tq, tk, rep) = (a.tq, a.tk, a.rep());
        let mut out = vec![T::zero(); a.batch * a.hq * tq * tk];
        // One work item per (batch, KV head): its query heads' score matrices are contiguous.
        par_chunks(&mut out, rep * tq * tk, rep * tq * tk * (a.d + 2 * a.dv), |item, o| {
            let (b, kvh) = (item / a.hkv, item % a.hkv);
            for r in 0..rep {
                let h = kvh * rep + r;
                let p = a.probs(&q, &k, Some(&mask), b, h);
                o[r * tq * tk..][..tq * tk].copy_from_slice(&a.dscores(&p, &v, &dy, b, h));
            }
        });
        Ok(out)
    })())
}

// ---- rotary position embedding ----------------------------------------------------------------

/// Rotates pairs `(i, i + D/2)` of `x: [.., T, D]` by `(offset + t)·θ^(−2i/D)` (the Hugging Face
/// Llama `rotate_half` convention); `inverse` rotates by the negative angle. Angles are computed
/// in f64.
pub(crate) fn rope(x: &Tensor, theta: f64, offset: usize, inverse: bool) -> KResult<Data> {
    let r = x.shape.len();
    if r < 2 || !x.shape[r - 1].is_multiple_of(2) {
        return err(format!("needs [.., T, D] with an even D, found {:?}", x.shape));
    }
    let (t_len, d) = (x.shape[r - 2], x.shape[r - 1]);
    let half = d / 2;
    let sign = if inverse { -1.0 } else { 1.0 };
    // cos and sin per (position, pair).
    let table: Vec<(f64, f64)> = (0..t_len)
        .flat_map(|t| {
            (0..half).map(move |i| {
                let angle = (offset + t) as f64 * theta.powf(-2.0 * i as f64 / d as f64);
                (angle.cos(), sign * angle.sin())
            })
        })
        .collect();
    by_float!(&[x], T => floats::<T>(x, "x").map(|v| {
        let mut out = vec![T::zero(); v.len()];
        for (row, (src, dst)) in v.chunks_exact(d).zip(out.chunks_exact_mut(d)).enumerate() {
            let t = row % t_len;
            for i in 0..half {
                let (c, s) = table[t * half + i];
                let (a, b) = (src[i].f64(), src[i + half].f64());
                dst[i] = T::of(a * c - b * s);
                dst[i + half] = T::of(b * c + a * s);
            }
        }
        out
    }))
}
