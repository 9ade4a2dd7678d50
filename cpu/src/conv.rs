//! Convolution (im2col + GEMM), max/average pooling and nearest upsampling, with derivatives.
//!
//! Everything is written for two spatial axes; a 1-D op runs as 2-D with a height of 1
//! (kernel 1, stride 1, padding 0, dilation 1 on that axis).
//!
//! Convolution, per group `g` and a chunk of the batch: `cols` is the `[R, nb·L]` matrix whose
//! row `r = (ci, kh, kw)` and column `(n, oh, ow)` holds the input element under kernel tap
//! `(kh, kw)` of output position `(oh, ow)` (zero in the padding), `R = Cin/G·KH·KW`,
//! `L = OH·OW`. Then `y_g = W_g·cols`, `dW_g = dy_g·colsᵀ` and `dcols = W_gᵀ·dy_g`, whose
//! entries are added back to the input positions they came from (col2im).

use super::float::{gemm, par_chunks, Float, Mat};
use super::layout::numel;
use super::{by_float, check_shape, err, floats, KResult};
use mgn_ir::op::PoolOp;
pub(crate) use mgn_ir::shape::conv::Geometry;
use mgn_ir::shape::conv::{upsample as up_layout, upsampled as scaled, Conv, Pool};
use mgn_ir::{Data, Tensor};

/// Upper bound on the elements of one `cols` matrix: the batch is processed in chunks under it.
/// Debug tests use a small bound, so that their small shapes also run in several chunks.
const COLS_LIMIT: usize = if cfg!(all(test, debug_assertions)) { 1 << 8 } else { 1 << 18 };

/// What the im2col GEMMs need of a convolution's sizes.
trait Cols {
    fn rows(&self) -> usize;
    fn l(&self) -> usize;
    fn chunk(&self) -> usize;
    fn row(&self, g: usize, r: usize) -> (usize, (usize, usize));
    fn im2col<T: Float>(&self, x: &[T], g: usize, n0: usize, nb: usize) -> Vec<T>;
    fn dy_matrix<T: Float>(&self, dy: &[T], g: usize, n0: usize, nb: usize) -> Vec<T>;
}

impl Cols for Conv {
    /// Rows of `cols` per group.
    fn rows(&self) -> usize {
        self.cin / self.g * self.k[0] * self.k[1]
    }

    fn l(&self) -> usize {
        self.out[0] * self.out[1]
    }

    /// Samples per chunk, so that `cols` stays under [`COLS_LIMIT`].
    fn chunk(&self) -> usize {
        (COLS_LIMIT / (self.rows() * self.l()).max(1)).clamp(1, self.n.max(1))
    }

    /// The input channel and kernel tap `(kh, kw)` of row `r` of group `g`'s `cols`.
    fn row(&self, g: usize, r: usize) -> (usize, (usize, usize)) {
        let taps = self.k[0] * self.k[1];
        let ci = g * (self.cin / self.g) + r / taps;
        (ci, ((r % taps) / self.k[1], r % self.k[1]))
    }

    /// `cols` of group `g` for samples `n0..n0 + nb`.
    fn im2col<T: Float>(&self, x: &[T], g: usize, n0: usize, nb: usize) -> Vec<T> {
        let (l, plane) = (self.l(), self.inp[0] * self.inp[1]);
        let mut cols = vec![T::zero(); self.rows() * nb * l];
        par_chunks(&mut cols, nb * l, nb * l, |r, row| {
            let (ci, tap) = self.row(g, r);
            for s in 0..nb {
                let xp = &x[((n0 + s) * self.cin + ci) * plane..][..plane];
                for oh in 0..self.out[0] {
                    for ow in 0..self.out[1] {
                        if let Some(at) = self.source(tap, (oh, ow)) {
                            row[s * l + oh * self.out[1] + ow] = xp[at];
                        }
                    }
                }
            }
        });
        cols
    }

    /// `dy` of group `g`, samples `n0..n0 + nb`, as the `[Cout/G, nb·L]` matrix.
    fn dy_matrix<T: Float>(&self, dy: &[T], g: usize, n0: usize, nb: usize) -> Vec<T> {
        let (l, cg) = (self.l(), self.cout / self.g);
        let mut m = Vec::with_capacity(cg * nb * l);
        for co in 0..cg {
            for s in 0..nb {
                m.extend_from_slice(&dy[((n0 + s) * self.cout + g * cg + co) * l..][..l]);
            }
        }
        m
    }
}

/// Inputs `x, weight, bias?`.
pub(crate) fn conv(x: &[&Tensor], geo: &Geometry, shape: &[usize]) -> KResult<Data> {
    let c = Conv::new(&x[0].shape, &x[1].shape, geo)?;
    check_shape(&c.out_shape(), shape)?;
    if let Some(b) = x.get(2) {
        if b.shape != [c.cout] {
            return err(format!("bias must have shape [{}], found {:?}", c.cout, b.shape));
        }
    }
    by_float!(x, T => (|| {
        let (xv, wv) = (floats::<T>(x[0], "x")?, floats::<T>(x[1], "weight")?);
        let bias = x.get(2).map(|b| floats::<T>(b, "bias")).transpose()?;
        let (l, cg, rows) = (c.l(), c.cout / c.g, c.rows());
        let mut out = vec![T::zero(); c.n * c.cout * l];
        let mut y = Vec::new();
        for n0 in (0..c.n).step_by(c.chunk()) {
            let nb = c.chunk().min(c.n - n0);
            for g in 0..c.g {
                let cols = c.im2col(&xv, g, n0, nb);
                y.resize(cg * nb * l, T::zero());
                gemm(
                    cg,
                    rows,
                    nb * l,
                    T::one(),
                    Mat::new(&wv[g * cg * rows..], rows, 1),
                    Mat::new(&cols, nb * l, 1),
                    T::zero(),
                    &mut y,
                    nb * l,
                );
                for co in 0..cg {
                    let b = bias.as_ref().map_or(T::zero(), |b| b[g * cg + co]);
                    for s in 0..nb {
                        let dst = &mut out[((n0 + s) * c.cout + g * cg + co) * l..][..l];
                        for (d, &v) in dst.iter_mut().zip(&y[(co * nb + s) * l..][..l]) {
                            *d = v + b;
                        }
                    }
                }
            }
        }
        Ok(out)
    })())
}

/// `[dy, weight]` → dx of the step's shape.
pub(crate) fn conv_grad_input(
    dy: &Tensor,
    w: &Tensor,
    geo: &Geometry,
    shape: &[usize],
) -> KResult<Data> {
    let c = Conv::new(shape, &w.shape, geo)?;
    if dy.shape != c.out_shape() {
        return err(format!(
            "dy has shape {:?}, but the convolution of {shape:?} gives {:?}",
            dy.shape,
            c.out_shape()
        ));
    }
    by_float!(&[dy, w], T => (|| {
        let (g_all, wv) = (floats::<T>(dy, "dy")?, floats::<T>(w, "weight")?);
        let (l, cg, rows, cin_g) = (c.l(), c.cout / c.g, c.rows(), c.cin / c.g);
        let plane = c.inp[0] * c.inp[1];
        let taps = c.k[0] * c.k[1];
        let mut dx = vec![T::zero(); c.n * c.cin * plane];
        for n0 in (0..c.n).step_by(c.chunk()) {
            let nb = c.chunk().min(c.n - n0);
            for g in 0..c.g {
                let dyg = c.dy_matrix(&g_all, g, n0, nb);
                let mut dcols = vec![T::zero(); rows * nb * l];
                gemm(
                    rows,
                    cg,
                    nb * l,
                    T::one(),
                    Mat::new(&wv[g * cg * rows..], rows, 1).t(),
                    Mat::new(&dyg, nb * l, 1),
                    T::zero(),
                    &mut dcols,
                    nb * l,
                );
                // col2im: each sample's slice of dx is written by one thread.
                let dx_chunk = &mut dx[n0 * c.cin * plane..(n0 + nb) * c.cin * plane];
                par_chunks(dx_chunk, c.cin * plane, rows * l, |s, dxs| {
                    for ci_l in 0..cin_g {
                        let dst = &mut dxs[(g * cin_g + ci_l) * plane..][..plane];
                        for t in 0..taps {
                            let r = ci_l * taps + t;
                            let src = &dcols[(r * nb + s) * l..][..l];
                            for oh in 0..c.out[0] {
                                for ow in 0..c.out[1] {
                                    if let Some(at) = c.source((t / c.k[1], t % c.k[1]), (oh, ow)) {
                                        dst[at] += src[oh * c.out[1] + ow];
                                    }
                                }
                            }
                        }
                    }
                });
            }
        }
        Ok(dx)
    })())
}

/// `[x, dy]` → dweight of the step's shape.
pub(crate) fn conv_grad_weight(
    x: &Tensor,
    dy: &Tensor,
    geo: &Geometry,
    shape: &[usize],
) -> KResult<Data> {
    let c = Conv::new(&x.shape, shape, geo)?;
    if dy.shape != c.out_shape() {
        return err(format!(
            "dy has shape {:?}, but the convolution of {:?} gives {:?}",
            dy.shape,
            x.shape,
            c.out_shape()
        ));
    }
    by_float!(&[x, dy], T => (|| {
        let (xv, g_all) = (floats::<T>(x, "x")?, floats::<T>(dy, "dy")?);
        let (l, cg, rows) = (c.l(), c.cout / c.g, c.rows());
        let mut dw = vec![T::zero(); c.cout * rows];
        for (chunk, n0) in (0..c.n).step_by(c.chunk()).enumerate() {
            let nb = c.chunk().min(c.n - n0);
            let beta = if chunk == 0 { T::zero() } else { T::one() };
            for g in 0..c.g {
                let cols = c.im2col(&xv, g, n0, nb);
                let dyg = c.dy_matrix(&g_all, g, n0, nb);
                gemm(
                    cg,
                    nb * l,
                    rows,
                    T::one(),
                    Mat::new(&dyg, nb * l, 1),
                    Mat::new(&cols, nb * l, 1).t(),
                    beta,
                    &mut dw[g * cg * rows..],
                    rows,
                );
            }
        }
        Ok(dw)
    })())
}

// ---- pooling --------------------------------------------------------------------------------

/// The first maximum of a pooling window.
trait ArgMax {
    fn argmax<T: Float>(&self, plane: &[T], oh: usize, ow: usize) -> Option<usize>;
}

impl ArgMax for Pool {
    /// Position of the first maximum of a window (NaN counts as the maximum).
    fn argmax<T: Float>(&self, plane: &[T], oh: usize, ow: usize) -> Option<usize> {
        let mut best: Option<usize> = None;
        for at in self.window(oh, ow) {
            match best {
                Some(b) if plane[b].is_nan() || !(plane[at] > plane[b] || plane[at].is_nan()) => {}
                _ => best = Some(at),
            }
        }
        best
    }
}

/// Max pooling ignores the padding; average pooling counts it as zeros (divides by the kernel
/// size, PyTorch's `count_include_pad=True`).
pub(crate) fn pool(
    op: PoolOp,
    x: &Tensor,
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
    shape: &[usize],
) -> KResult<Data> {
    let p = Pool::new(&x.shape, kernel, stride, padding)?;
    let out_shape = p.out_shape();
    check_shape(&out_shape, shape)?;
    let (plane, l) = (p.inp[0] * p.inp[1], p.out[0] * p.out[1]);
    let area = (p.k[0] * p.k[1]) as f64;
    by_float!(&[x], T => (|| {
        let xv = floats::<T>(x, "x")?;
        let mut out = vec![T::zero(); p.planes() * l];
        par_chunks(&mut out, l, l * p.k[0] * p.k[1], |pl, o| {
            let xp = &xv[pl * plane..][..plane];
            for oh in 0..p.out[0] {
                for ow in 0..p.out[1] {
                    o[oh * p.out[1] + ow] = match op {
                        PoolOp::Max => p.argmax(xp, oh, ow).map_or(T::neg_infinity(), |at| xp[at]),
                        PoolOp::Avg => {
                            let sum = p.window(oh, ow).map(|at| xp[at].f64()).sum::<f64>();
                            T::of(sum / area)
                        }
                    };
                }
            }
        });
        Ok(out)
    })())
}

/// `[x, dy]` → dx: max pooling routes each `dy` to its window's first arg-max, average pooling
/// spreads `dy / kernel size` over the window's in-bounds elements.
pub(crate) fn pool_grad(
    op: PoolOp,
    x: &Tensor,
    dy: &Tensor,
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
) -> KResult<Data> {
    let p = Pool::new(&x.shape, kernel, stride, padding)?;
    let out_shape = p.out_shape();
    if dy.shape != out_shape {
        return err(format!(
            "dy has shape {:?}, but pooling {:?} gives {out_shape:?}",
            dy.shape, x.shape
        ));
    }
    let (plane, l) = (p.inp[0] * p.inp[1], p.out[0] * p.out[1]);
    let area = (p.k[0] * p.k[1]) as f64;
    by_float!(&[x, dy], T => (|| {
        let (xv, g) = (floats::<T>(x, "x")?, floats::<T>(dy, "dy")?);
        let mut dx = vec![T::zero(); xv.len()];
        par_chunks(&mut dx, plane, l * p.k[0] * p.k[1], |pl, d| {
            let (xp, gp) = (&xv[pl * plane..][..plane], &g[pl * l..][..l]);
            for oh in 0..p.out[0] {
                for ow in 0..p.out[1] {
                    let gv = gp[oh * p.out[1] + ow];
                    match op {
                        PoolOp::Max => {
                            if let Some(at) = p.argmax(xp, oh, ow) {
                                d[at] += gv;
                            }
                        }
                        PoolOp::Avg => {
                            let share = gv / T::of(area);
                            p.window(oh, ow).for_each(|at| d[at] += share);
                        }
                    }
                }
            }
        });
        Ok(dx)
    })())
}

// ---- nearest upsampling -----------------------------------------------------------------------

/// `out[.., i, j] = x[.., i / scale, j / scale]`.
pub(crate) fn upsample(x: &Tensor, scale: usize, shape: &[usize]) -> KResult<Data> {
    let (planes, [h, w], [sh, sw]) = up_layout(&x.shape, scale)?;
    check_shape(&scaled(&x.shape, scale), shape)?;
    let (oh, ow) = (h * sh, w * sw);
    by_float!(&[x], T => floats::<T>(x, "x").map(|v| {
        let mut out = Vec::with_capacity(planes * oh * ow);
        for pl in 0..planes {
            for i in 0..oh {
                out.extend((0..ow).map(|j| v[(pl * h + i / sh) * w + j / sw]));
            }
        }
        out
    }))
}

/// `[dy]` → dx of the step's shape: each `scale`-sized block of `dy` summed.
pub(crate) fn upsample_grad(dy: &Tensor, scale: usize, shape: &[usize]) -> KResult<Data> {
    let (planes, [h, w], [sh, sw]) = up_layout(shape, scale)?;
    if dy.shape != scaled(shape, scale) {
        return err(format!("dy has shape {:?}, expected {:?}", dy.shape, scaled(shape, scale)));
    }
    let (oh, ow) = (h * sh, w * sw);
    by_float!(&[dy], T => floats::<T>(dy, "dy").map(|g| {
        let mut dx = vec![T::zero(); numel(shape)];
        for pl in 0..planes {
            for i in 0..oh {
                for j in 0..ow {
                    dx[(pl * h + i / sh) * w + j / sw] += g[(pl * oh + i) * ow + j];
                }
            }
        }
        dx
    }))
}
