//! Products by a few rows (decoding: one token at a time) with a weight read where it lies:
//! `x @ W` for W stored `[K, N]`, or `x @ Wᵀ` for W stored `[N, K]` (a linear layer's weight,
//! read through its transpose without copying it).
//!
//! A product of one row by a weight is bound by reading the weight: every value is used once.
//! The GEMM every other product uses first packs its operands into its own buffers, which for
//! one row means copying the whole weight each time; these kernels stream W once instead, its
//! rows split over the cores, each value loaded straight into a multiply-add. The sums go in
//! another order than the GEMM's, so the results equal it up to rounding.

use super::float::{par_chunks, Float};

/// Up to this many rows of x the products stream the weight (one pass over W serves every
/// row); beyond, the GEMM does more work per value loaded than these kernels.
pub(crate) const STREAMED_ROWS: usize = 8;

/// Output columns computed together, a task of the cores: 64 rows of a transposed W, or 64
/// columns of each row of a plain one (256 contiguous bytes of f32), so that a task's reads
/// stream.
const GROUP: usize = 64;

/// `x @ W` (`transposed`: `x @ Wᵀ`) for x `[rows, k]` and W stored row-major `[k, n]`
/// (`transposed`: `[n, k]`); the result `[rows, n]`. `rows` is at most a few
/// ([`STREAMED_ROWS`]): W is read once for all of them.
pub(crate) fn few_rows<T: Float>(
    x: &[T],
    rows: usize,
    w: &[T],
    k: usize,
    n: usize,
    transposed: bool,
) -> Vec<T> {
    debug_assert!(x.len() == rows * k && w.len() == k * n);
    // Each group of columns is computed for every row into `buf` ([rows, cols of the group],
    // group after group), then put in place; with one row that is already the result.
    let mut buf = vec![T::zero(); rows * n];
    par_chunks(&mut buf, rows * GROUP, rows * GROUP * k, |g, chunk| {
        let (n0, cols) = (g * GROUP, chunk.len() / rows);
        if transposed {
            for c in 0..cols {
                let wr = &w[(n0 + c) * k..(n0 + c + 1) * k];
                for r in 0..rows {
                    chunk[r * cols + c] = dot(&x[r * k..(r + 1) * k], wr);
                }
            }
        } else {
            for kk in 0..k {
                let wr = &w[kk * n + n0..kk * n + n0 + cols];
                for r in 0..rows {
                    axpy(x[r * k + kk], wr, &mut chunk[r * cols..(r + 1) * cols]);
                }
            }
        }
    });
    if rows == 1 {
        return buf;
    }
    let mut out = vec![T::zero(); rows * n];
    for (g, chunk) in buf.chunks(rows * GROUP).enumerate() {
        let (n0, cols) = (g * GROUP, chunk.len() / rows);
        for r in 0..rows {
            out[r * n + n0..r * n + n0 + cols].copy_from_slice(&chunk[r * cols..(r + 1) * cols]);
        }
    }
    out
}

/// Independent partial sums of a dot product: as many as a few vector registers hold, so the
/// compiler keeps them in registers and vectorizes the loop without reordering any one sum.
const LANES: usize = 16;

/// `Σ a_i·b_i`, in `LANES` interleaved partial sums added at the end.
pub(crate) fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail = ac.remainder().iter().zip(bc.remainder()).fold(T::zero(), |s, (&p, &q)| s + p * q);
    let mut acc = [T::zero(); LANES];
    for (p, q) in ac.zip(bc) {
        for i in 0..LANES {
            acc[i] += p[i] * q[i];
        }
    }
    // Pairwise, halving: the same tree whatever the length.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0] + tail
}

/// `o ← o + a·v`.
fn axpy<T: Float>(a: T, v: &[T], o: &mut [T]) {
    o.iter_mut().zip(v).for_each(|(o, &v)| *o += a * v);
}
