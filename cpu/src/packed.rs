//! Packed weights used where they are read, without their f32 copy: `matmul(x, dequantize(W))`
//! (W read as it is or transposed) decodes W block by block as it multiplies, and
//! `gather(dequantize(E), ids)` decodes only the rows it gathers.
//!
//! A packed weight is a quarter or less of its f32 values; decoding it whole before each
//! product would hold that f32 copy and read it again. [`fusions`] finds, in a plan, the
//! `Dequantize` steps whose every reader (a product with the weight on the right, possibly
//! through a transpose of it, or a lookup along its first axis) can read the packed bytes
//! instead; those steps, and the transposes between, are not computed at all. A `Dequantize`
//! with any other reader is computed as before, and its readers read its values: decoding it
//! again for each fused reader would cost more than the copy saves.
//!
//! Products by few rows (decoding, one token at a time) stream each packed row of W once:
//! decode a block, take its dot products with the rows of x (`streamed`), the rows of W split
//! over the cores. Products by many rows decode W a tile at a time into a small buffer and
//! multiply it with the GEMM every other product uses (`tiled`). Both equal decoding W whole
//! and multiplying, up to the order of the sums.

use super::float::{gemm, par_chunks, Float, Mat};
use super::layout::numel;
use super::{by_float, check_shape, err, floats, KResult, KernelError};
use mgn_ir::op::Op;
use mgn_ir::packed::{decode_block, dequantize_rows};
use mgn_ir::{DType, Data, Plan, Tensor};

/// How the executor runs one step of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fused {
    /// As usual: [`crate::eval`] on its inputs.
    No,
    /// Not at all: a `Dequantize` (or a transpose of one) whose readers all read the packed
    /// parameter instead. Nothing reads its value.
    Skip,
    /// `x @ W` (`transposed`: `x @ Wᵀ`), W the packed parameter `param`.
    MatMul { x: u32, param: usize, transposed: bool },
    /// Rows `ids` of the packed parameter `param`, along its first axis.
    Gather { param: usize, ids: u32 },
}

/// Each step's [`Fused`], for a validated plan.
pub fn fusions(plan: &Plan) -> Vec<Fused> {
    let steps = &plan.steps;
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, s) in steps.iter().enumerate() {
        for &x in &s.inputs {
            readers[x as usize].push(i);
        }
    }
    // Values the plan hands out or keeps are read after the run, by the caller.
    let mut kept = vec![false; steps.len()];
    let results = plan.outputs.iter().map(|(_, v)| *v).chain(plan.loss);
    let results = results.chain(plan.grads.iter().chain(&plan.state_writes).map(|(_, v)| *v));
    results.for_each(|v| kept[v as usize] = true);

    let mut fused = vec![Fused::No; steps.len()];
    for (d, s) in steps.iter().enumerate() {
        let (Op::Dequantize, [p]) = (&s.op, &s.inputs[..]) else { continue };
        let Op::Param { index: param } = steps[*p as usize].op else { continue };
        if kept[d] || readers[d].is_empty() {
            continue;
        }
        let d32 = d as u32;
        // A product reads W on the right, and not on the left too.
        let product = |r: usize, w: u32| {
            let s = &steps[r];
            matches!(s.op, Op::MatMul) && s.inputs[1] == w && s.inputs[0] != w && !kept[w as usize]
        };
        let matrix = s.shape.len() == 2;
        let mut plan_d = Vec::new();
        let all = readers[d].iter().all(|&r| {
            let step = &steps[r];
            if matrix && product(r, d32) {
                let x = step.inputs[0];
                plan_d.push((r, Fused::MatMul { x, param, transposed: false }));
                return true;
            }
            if let (true, Op::Permute { perm }) = (matrix, &step.op) {
                let t = r as u32;
                let fits = perm[..] == [1, 0] && !kept[r] && !readers[r].is_empty();
                if fits && readers[r].iter().all(|&rr| product(rr, t)) {
                    plan_d.push((r, Fused::Skip));
                    for &rr in &readers[r] {
                        let x = steps[rr].inputs[0];
                        plan_d.push((rr, Fused::MatMul { x, param, transposed: true }));
                    }
                    return true;
                }
                return false;
            }
            let lookup = matches!(step.op, Op::Gather { axis: 0 });
            if lookup && step.inputs[0] == d32 && step.inputs[1] != d32 {
                plan_d.push((r, Fused::Gather { param, ids: step.inputs[1] }));
                return true;
            }
            false
        });
        if all {
            fused[d] = Fused::Skip;
            for (r, f) in plan_d {
                fused[r] = f;
            }
        }
    }
    fused
}

/// Runs a fused step: `inputs` are `[x, W]` for a product, `[E, ids]` for a lookup, the packed
/// parameter as it is stored. `dtype` and `shape` are the step's.
pub fn eval_fused(
    fused: &Fused,
    inputs: &[&Tensor],
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor, KernelError> {
    let (what, data) = match fused {
        Fused::MatMul { transposed, .. } => {
            ("matmul", matmul(inputs[0], inputs[1], *transposed, shape))
        }
        Fused::Gather { .. } => ("gather", gather(inputs[0], inputs[1], shape)),
        other => return err(format!("{other:?} is not a fused kernel")),
    };
    let mut data = data.map_err(|e| KernelError(format!("{what} of a packed weight: {}", e.0)))?;
    if dtype.is_half() {
        super::pointwise::round_to_half(&mut data, dtype);
    }
    Ok(Tensor { dtype, shape: shape.to_vec(), data })
}

/// The packed bytes of `w` and its 2-D shape.
fn packed_matrix(w: &Tensor) -> KResult<(&[u8], usize, usize)> {
    match (&w.data, &w.shape[..]) {
        (Data::Packed(b), &[r, c]) if w.dtype.bytes_for(r * c) == Some(b.len()) => Ok((b, r, c)),
        _ => err(format!("the weight must be a packed matrix, not {}{:?}", w.dtype, w.shape)),
    }
}

/// Up to this many rows of x, the product streams W's packed rows once (`streamed`); beyond,
/// the GEMM on decoded tiles (`tiled`) does more work per decoded value than a dot product.
pub(crate) const STREAMED_ROWS: usize = 8;

/// `x @ W` or `x @ Wᵀ` (`transposed`; W `[N, K]`), x `[.., M, K]` or `[K]`.
fn matmul(x: &Tensor, w: &Tensor, transposed: bool, shape: &[usize]) -> KResult<Data> {
    let (bytes, wr, wc) = packed_matrix(w)?;
    let (k, n) = if transposed { (wc, wr) } else { (wr, wc) };
    let Some(&xk) = x.shape.last() else { return err("x needs at least one axis") };
    if xk != k {
        let w_as = if transposed { format!("[{wr}, {wc}]ᵀ") } else { format!("{:?}", w.shape) };
        return err(format!("cannot multiply {:?} by {w_as}: inner sizes {xk} and {k}", x.shape));
    }
    let mut out_shape = x.shape[..x.shape.len() - 1].to_vec();
    out_shape.push(n);
    check_shape(&out_shape, shape)?;
    let rows = numel(&x.shape) / k;
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
                    chunk[r * cols + c] = xr.iter().zip(&vals).map(|(&a, &b)| a * b).sum();
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
fn gather(table: &Tensor, ids: &Tensor, shape: &[usize]) -> KResult<Data> {
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
