//! `torch.matmul`: 1-D operands are promoted (and the added axis dropped again), the leading
//! (batch) axes broadcast, and each matrix product is one GEMM.

use super::float::{gemm, par_chunks, Mat};
use super::layout::{broadcast_shapes, broadcast_strides, numel, walk};
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
        let mut out = vec![T::zero(); numel(&batch) * m * n];
        if numel(bb) == 1 && numel(ab) == numel(&batch) {
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
