//! `torch.matmul`: 1-D operands are promoted (and the added axis dropped again), the leading
//! (batch) axes broadcast, and each matrix product is one GEMM, or by a weight (a right operand
//! shared by the batch) with few rows, a pass over the weight (`matvec`). [`by_weight`] is the
//! product by a parameter read where it lies, transposed or not (`fused`).

use super::float::{gemm, par_chunks, Mat};
use super::layout::{broadcast_shapes, broadcast_strides, numel, walk};
use super::matvec::{few_rows, STREAMED_ROWS};
use super::{by_float, check_shape, err, floats, KResult};
use mgn_ir::{Data, Tensor};

pub(crate) fn matmul(a: &Tensor, b: &Tensor, shape: &[usize]) -> KResult<Data> {
    if a.shape.is_empty() || b.shape.is_empty() {
        return err("operands need at least one axis");
    }
    // Promote 1-D operands: [K] @ .. as [1, K], .. @ [K] as [K, 1].
    let a2 = if a.shape.len() == 1 { vec![1, a.shape[0]] } else { a.shape.clone() };
    let b2 = if b.shape.len() == 1 { vec![b.shape[0], 1] } else { b.shape.clone() };
    let (ab, &[m, k]) = a2.split_at(a2.len() - 2) else { unreachable!("rank >= 2") };
    let (bb, &[k2, n]) = b2.split_at(b2.len() - 2) else { unreachable!("rank >= 2") };
    if k != k2 {
        return err(format!(
            "cannot multiply {:?} by {:?}: inner sizes {k} and {k2} differ",
            a.shape, b.shape
        ));
    }
    let batch = broadcast_shapes(ab, bb)?;
    let mut out_shape = batch.clone();
    if a.shape.len() > 1 {
        out_shape.push(m);
    }
    if b.shape.len() > 1 {
        out_shape.push(n);
    }
    check_shape(&out_shape, shape)?;
    // Offsets of each batch item's matrices, in batch order.
    let (sa, sb) = (broadcast_strides(ab, &batch)?, broadcast_strides(bb, &batch)?);
    let mut offsets = Vec::with_capacity(numel(&batch));
    walk(&batch, [&sa, &sb], |[i, j]| offsets.push((i * m * k, j * k * n)));
    by_float!(&[a, b], T => (|| {
        let (av, bv) = (floats::<T>(a, "a")?, floats::<T>(b, "b")?);
        let shared = numel(bb) == 1 && numel(ab) == numel(&batch);
        if shared && numel(&batch) * m <= STREAMED_ROWS {
            // A weight by a few rows (decoding): one pass over the weight.
            return Ok(few_rows(&av, numel(&batch) * m, &bv, k, n, false));
        }
        let mut out = vec![T::zero(); numel(&batch) * m * n];
        if shared {
            // A shared right operand (a weight): fold the batch into the rows, one big GEMM.
            let rows = numel(&batch) * m;
            gemm(
                rows,
                k,
                n,
                T::one(),
                Mat::new(&av, k, 1),
                Mat::new(&bv, n, 1),
                T::zero(),
                &mut out,
                n,
            );
        } else {
            par_chunks(&mut out, m * n, m * k * n, |item, c| {
                let (oa, ob) = offsets[item];
                gemm(
                    m,
                    k,
                    n,
                    T::one(),
                    Mat::new(&av[oa..], k, 1),
                    Mat::new(&bv[ob..], n, 1),
                    T::zero(),
                    c,
                    n,
                );
            });
        }
        Ok(out)
    })())
}

/// `x @ W`, or with `transposed` `x @ Wᵀ` for W stored `[N, K]`: x `[.., K]` (or `[K]`), W a
/// float matrix (a parameter) read where it lies, never copied: by a few rows, one pass over
/// it (`matvec`); by more, the GEMM reading it through its strides.
pub(crate) fn by_weight(
    x: &Tensor,
    w: &Tensor,
    transposed: bool,
    shape: &[usize],
) -> KResult<Data> {
    let (k, n, rows) = weight_product_sizes(x, w, transposed, shape)?;
    by_float!(&[x, w], T => (|| {
        let (xv, wv) = (floats::<T>(x, "x")?, floats::<T>(w, "the weight")?);
        if rows <= STREAMED_ROWS {
            return Ok(few_rows(&xv, rows, &wv, k, n, transposed));
        }
        // W's element (kk, j) lies at j·K + kk when stored [N, K].
        let b = if transposed { Mat::new(&wv[..], 1, k) } else { Mat::new(&wv[..], n, 1) };
        let mut out = vec![T::zero(); rows * n];
        gemm(rows, k, n, T::one(), Mat::new(&xv, k, 1), b, T::zero(), &mut out, n);
        Ok(out)
    })())
}

/// `x[…, k] @ W` (or `@ Wᵀ` when `transposed`) for a weight `[wr, wc]`: its k, its n and x's
/// rows, once the inner sizes agree and the result is the `shape` the plan expects.
pub(crate) fn weight_product_sizes(
    x: &Tensor,
    w: &Tensor,
    transposed: bool,
    shape: &[usize],
) -> KResult<(usize, usize, usize)> {
    let &[wr, wc] = &w.shape[..] else {
        return err(format!("the weight must be a matrix, not {}{:?}", w.dtype, w.shape));
    };
    let (k, n) = if transposed { (wc, wr) } else { (wr, wc) };
    let Some(&xk) = x.shape.last() else { return err("x needs at least one axis") };
    if xk != k {
        let w_as = if transposed { format!("[{wr}, {wc}]ᵀ") } else { format!("{:?}", w.shape) };
        return err(format!("cannot multiply {:?} by {w_as}: inner sizes {xk} and {k}", x.shape));
    }
    let mut out_shape = x.shape[..x.shape.len() - 1].to_vec();
    out_shape.push(n);
    check_shape(&out_shape, shape)?;
    Ok((k, n, numel(&x.shape) / k))
}
