//! Packed weights used where they are read, without their f32 copy: `matmul(x, dequantize(W))`
//! (W read as it is or transposed) decodes W block by block as it multiplies, and
//! `gather(dequantize(E), ids)` decodes only the rows it gathers.
//!
//! A packed weight is a quarter or less of its f32 values; decoding it whole before each
//! product would hold that f32 copy and read it again. `crate::fused` finds the steps of a plan
//! that run here instead of the dequantize.
//!
//! Products by few rows (decoding, one token at a time) stream each packed row of W once:
//! decode a block, take its dot products with the rows of x (`streamed`), the rows of W split
//! over the cores. Products by many rows decode W a tile at a time into a small buffer and
//! multiply it with the GEMM every other product uses (`tiled`). Both equal decoding W whole
//! and multiplying, up to the order of the sums.

use super::float::{gemm, par_chunks, Float, Mat};
use super::layout::numel;
use super::{by_float, check_shape, err, floats, KResult};
use mgn_ir::packed::{decode_block, dequantize_rows};
use mgn_ir::{DType, Data, Tensor};

use super::matvec::dot;
pub(crate) use super::matvec::STREAMED_ROWS;

/// The packed bytes of `w` and its 2-D shape.
fn packed_matrix(w: &Tensor) -> KResult<(&[u8], usize, usize)> {
    match (&w.data, &w.shape[..]) {
        (Data::Packed(b), &[r, c]) if w.dtype.bytes_for(r * c) == Some(b.len()) => Ok((b, r, c)),
        _ => err(format!("the weight must be a packed matrix, not {}{:?}", w.dtype, w.shape)),
    }
}

/// `x @ W` or `x @ Wᵀ` (`transposed`; W `[N, K]`), x `[.., M, K]` or `[K]`. Up to
/// [`STREAMED_ROWS`] rows of x, W's packed rows are read once (`streamed`); beyond, the GEMM on
/// decoded tiles (`tiled`) does more work per decoded value than a dot product.
pub(crate) fn matmul(x: &Tensor, w: &Tensor, transposed: bool, shape: &[usize]) -> KResult<Data> {
    let (bytes, wr, wc) = packed_matrix(w)?;
    let (_, _, rows) = crate::matmul::weight_product_sizes(x, w, transposed, shape)?;
    let w = Packed { dtype: w.dtype, bytes, rows: wr, cols: wc };
    by_float!(&[x], T => floats::<T>(x, "x").map(|xv| {
        if rows <= STREAMED_ROWS {
            streamed(&xv, rows, &w, transposed)
        } else {
            tiled(&xv, rows, &w, transposed)
        }
    }))
}

/// A packed matrix: `rows × cols` values in blocks along each row.
struct Packed<'a> {
    dtype: DType,
    bytes: &'a [u8],
    rows: usize,
    cols: usize,
}

impl Packed<'_> {
    /// (values, bytes) of a block.
    fn block(&self) -> (usize, usize) {
        self.dtype.block().expect("a packed type")
    }
    fn row_bytes(&self) -> usize {
        let (len, size) = self.block();
        self.cols / len * size
    }
    /// Row `r`'s values `[from, from + out.len())` (whole blocks) into `out`.
    fn decode<T: Float>(&self, r: usize, from: usize, out: &mut [T], tmp: &mut [f32]) {
        let (len, size) = self.block();
        let row = &self.bytes[r * self.row_bytes()..(r + 1) * self.row_bytes()];
        let blocks = row[from / len * size..].chunks_exact(size);
        // f32 values are decoded where they go; f64 ones through `tmp`.
        if let Some(out) = T::as_f32_mut(out) {
            for (block, o) in blocks.zip(out.chunks_exact_mut(len)) {
                decode_block(self.dtype, block, o);
            }
            return;
        }
        for (block, o) in blocks.zip(out.chunks_exact_mut(len)) {
            decode_block(self.dtype, block, &mut tmp[..len]);
            o.iter_mut().zip(&tmp[..len]).for_each(|(o, &v)| *o = T::of(v as f64));
        }
    }
}

/// The product by few rows of x: out `[rows, n]`, W's packed rows read once. The columns of the
/// output are split over the cores into groups; each group's values for every row of x are
/// computed into `buf` (group by group, each `[rows, cols of the group]`), then put in place.
fn streamed<T: Float>(x: &[T], rows: usize, w: &Packed, transposed: bool) -> Vec<T> {
    let (len, _) = w.block();
    let (k, n) = if transposed { (w.cols, w.rows) } else { (w.rows, w.cols) };
    // Transposed, a group is W's rows; else whole blocks of W's columns.
    let group = if transposed { 16 } else { len.max(64) };
    let mut buf = vec![T::zero(); rows * n];
    par_chunks(&mut buf, rows * group, rows * group * k, |g, chunk| {
        let (n0, cols) = (g * group, chunk.len() / rows);
        let mut tmp = [0f32; 256];
        let mut vals = vec![T::zero(); if transposed { k } else { cols }];
        if transposed {
            for c in 0..cols {
                w.decode(n0 + c, 0, &mut vals, &mut tmp);
                for r in 0..rows {
                    let xr = &x[r * k..(r + 1) * k];
                    chunk[r * cols + c] = dot(xr, &vals);
                }
            }
        } else {
            for kk in 0..k {
                w.decode(kk, n0, &mut vals, &mut tmp);
                for r in 0..rows {
                    let a = x[r * k + kk];
                    let o = &mut chunk[r * cols..(r + 1) * cols];
                    o.iter_mut().zip(&vals).for_each(|(o, &b)| *o += a * b);
                }
            }
        }
    });
    if rows == 1 {
        return buf;
    }
    let mut out = vec![T::zero(); rows * n];
    for (g, chunk) in buf.chunks(rows * group).enumerate() {
        let (n0, cols) = (g * group, chunk.len() / rows);
        for r in 0..rows {
            out[r * n + n0..r * n + n0 + cols].copy_from_slice(&chunk[r * cols..(r + 1) * cols]);
        }
    }
    out
}

/// Values of W decoded at a time by `tiled`: 1 MiB of f32, a tile the caches hold.
const TILE_VALUES: usize = 1 << 18;

/// The product by many rows of x: W decoded a tile of rows at a time (on all cores) and
/// multiplied by the GEMM. Transposed, a tile of W's rows is a block of the output's columns;
/// else it is a slice of the contraction, accumulated into the output.
fn tiled<T: Float>(x: &[T], rows: usize, w: &Packed, transposed: bool) -> Vec<T> {
    let (k, n) = if transposed { (w.cols, w.rows) } else { (w.rows, w.cols) };
    let tile_rows = (TILE_VALUES / w.cols).clamp(1, w.rows);
    let mut out = vec![T::zero(); rows * n];
    let mut tile = vec![T::zero(); tile_rows * w.cols];
    for r0 in (0..w.rows).step_by(tile_rows) {
        let t = tile_rows.min(w.rows - r0);
        let tile = &mut tile[..t * w.cols];
        par_chunks(tile, w.cols, w.cols, |i, row| w.decode(r0 + i, 0, row, &mut [0f32; 256]));
        if transposed {
            let b = Mat::new(&tile[..], 1, k);
            let a = Mat::new(x, k, 1);
            gemm(rows, k, t, T::one(), a, b, T::zero(), &mut out[r0..], n);
        } else {
            let (a, b) = (Mat::new(&x[r0..], k, 1), Mat::new(&tile[..], n, 1));
            let beta = if r0 == 0 { T::zero() } else { T::one() };
            gemm(rows, t, n, T::one(), a, b, beta, &mut out, n);
        }
    }
    out
}

/// `gather(dequantize(E), ids)` along E's first axis: only the gathered rows decoded.
pub(crate) fn gather(table: &Tensor, ids: &Tensor, shape: &[usize]) -> KResult<Data> {
    let (Data::Packed(bytes), Some(&count)) = (&table.data, table.shape.first()) else {
        return err(format!("the table must be packed, not {}{:?}", table.dtype, table.shape));
    };
    let mut out_shape = ids.shape.clone();
    out_shape.extend_from_slice(&table.shape[1..]);
    check_shape(&out_shape, shape)?;
    let row = numel(&table.shape) / count;
    if table.dtype.bytes_for(numel(&table.shape)) != Some(bytes.len()) {
        return err(format!("the table {:?} holds {} bytes", table.shape, bytes.len()));
    }
    let idx = super::movement::checked_indices(ids, 0, count)?;
    let mut out = vec![0f32; idx.len() * row];
    dequantize_rows(table.dtype, bytes, row, &idx, &mut out);
    Ok(Data::F32(out))
}
