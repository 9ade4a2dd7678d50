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
use mgn_ir::{Data, Tensor};

/// Upper bound on the elements of one `cols` matrix: the batch is processed in chunks under it.
/// Debug tests use a small bound, so that their small shapes also run in several chunks.
const COLS_LIMIT: usize = if cfg!(all(test, debug_assertions)) { 1 << 8 } else { 1 << 18 };

/// Stride, padding and dilation per axis (height, width), and the group count.
pub(crate) struct Geometry {
    pub(crate) spatial: usize,
    pub(crate) stride: [usize; 2],
    pub(crate) padding: [usize; 2],
    pub(crate) dilation: [usize; 2],
    pub(crate) groups: usize,
}

/// A 1- or 2-element attribute as (height, width); 1-D gets `fill` for the height.
pub(crate) fn per_axis(
    v: &[usize],
    spatial: usize,
    fill: usize,
    what: &str,
) -> KResult<[usize; 2]> {
    match (spatial, v) {
        (1, [a]) => Ok([fill, *a]),
        (2, [a, b]) => Ok([*a, *b]),
        _ => err(format!("{what} {v:?} must have one value per spatial axis ({spatial})")),
    }
}

impl Geometry {
    pub(crate) fn new(
        stride: &[usize],
        padding: &[usize],
        dilation: &[usize],
        groups: usize,
    ) -> KResult<Geometry> {
        let spatial = stride.len();
        if !(1..=2).contains(&spatial) {
            return err(format!("{spatial} spatial axes are not supported (1 or 2)"));
        }
        let g = Geometry {
            spatial,
            stride: per_axis(stride, spatial, 1, "stride")?,
            padding: per_axis(padding, spatial, 0, "padding")?,
            dilation: per_axis(dilation, spatial, 1, "dilation")?,
            groups,
        };
        if g.stride.contains(&0) || g.dilation.contains(&0) || groups == 0 {
            return err("stride, dilation and groups must be at least 1");
        }
        Ok(g)
    }
}

/// `[N, C, L]` or `[N, C, H, W]` as (N, C, [H, W]).
pub(crate) fn planes(
    shape: &[usize],
    spatial: usize,
    what: &str,
) -> KResult<(usize, usize, [usize; 2])> {
    match (spatial, shape) {
        (1, &[n, c, l]) => Ok((n, c, [1, l])),
        (2, &[n, c, h, w]) => Ok((n, c, [h, w])),
        _ => err(format!("{what} {shape:?} must have {} axes", spatial + 2)),
    }
}

/// Output length of a window along one axis (PyTorch's formula), if the window fits.
pub(crate) fn window_out(
    len: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dil: usize,
) -> KResult<usize> {
    let span = dil * (k.max(1) - 1) + 1;
    if k == 0 || len + 2 * pad < span {
        return err(format!(
            "a window of {k} (dilation {dil}) does not fit an axis of {len} with padding {pad}"
        ));
    }
    Ok((len + 2 * pad - span) / stride + 1)
}

/// Every size of one convolution, checked.
pub(crate) struct Conv {
    pub(crate) n: usize,
    pub(crate) cin: usize,
    pub(crate) cout: usize,
    pub(crate) inp: [usize; 2],
    pub(crate) k: [usize; 2],
    pub(crate) out: [usize; 2],
    pub(crate) g: usize,
    pub(crate) stride: [usize; 2],
    pub(crate) padding: [usize; 2],
    pub(crate) dilation: [usize; 2],
}

impl Conv {
    pub(crate) fn new(x_shape: &[usize], w_shape: &[usize], geo: &Geometry) -> KResult<Conv> {
        let (n, cin, inp) = planes(x_shape, geo.spatial, "input")?;
        let (cout, cin_g, k) = planes(w_shape, geo.spatial, "weight")?;
        let g = geo.groups;
        if cin % g != 0 || cout % g != 0 || cin_g * g != cin {
            return err(format!(
                "weight {w_shape:?} with {g} groups does not fit an input with {cin} channels"
            ));
        }
        let mut out = [0; 2];
        for a in 0..2 {
            out[a] = window_out(inp[a], k[a], geo.stride[a], geo.padding[a], geo.dilation[a])?;
        }
        Ok(Conv {
            n,
            cin,
            cout,
            inp,
            k,
            out,
            g,
            stride: geo.stride,
            padding: geo.padding,
            dilation: geo.dilation,
        })
    }

    fn out_shape(&self, spatial: usize) -> Vec<usize> {
        let mut s = vec![self.n, self.cout];
        s.extend_from_slice(&self.out[2 - spatial..]);
        s
    }

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

    /// The input position read by tap `(kh, kw)` at output `(oh, ow)`, if not in the padding.
    fn source(&self, (kh, kw): (usize, usize), (oh, ow): (usize, usize)) -> Option<usize> {
        let ih = (oh * self.stride[0] + kh * self.dilation[0]).checked_sub(self.padding[0])?;
        let iw = (ow * self.stride[1] + kw * self.dilation[1]).checked_sub(self.padding[1])?;
        (ih < self.inp[0] && iw < self.inp[1]).then_some(ih * self.inp[1] + iw)
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
    check_shape(&c.out_shape(geo.spatial), shape)?;
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
                gemm(cg, rows, nb * l, T::one(), Mat::new(&wv[g * cg * rows..], rows, 1), Mat::new(&cols, nb * l, 1), T::zero(), &mut y, nb * l);
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
    if dy.shape != c.out_shape(geo.spatial) {
        return err(format!(
            "dy has shape {:?}, but the convolution of {shape:?} gives {:?}",
            dy.shape,
            c.out_shape(geo.spatial)
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
                gemm(rows, cg, nb * l, T::one(), Mat::new(&wv[g * cg * rows..], rows, 1).t(), Mat::new(&dyg, nb * l, 1), T::zero(), &mut dcols, nb * l);
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
    if dy.shape != c.out_shape(geo.spatial) {
        return err(format!(
            "dy has shape {:?}, but the convolution of {:?} gives {:?}",
            dy.shape,
            x.shape,
            c.out_shape(geo.spatial)
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
                gemm(cg, nb * l, rows, T::one(), Mat::new(&dyg, nb * l, 1), Mat::new(&cols, nb * l, 1).t(), beta, &mut dw[g * cg * rows..], rows);
            }
        }
        Ok(dw)
    })())
}

// ---- pooling --------------------------------------------------------------------------------

/// Sizes of one pooling op, checked.
struct Pool {
    planes: usize,
    inp: [usize; 2],
    out: [usize; 2],
    k: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
}

impl Pool {
    fn new(
        x_shape: &[usize],
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
    ) -> KResult<(Pool, Vec<usize>)> {
        let spatial = kernel.len();
        if !(1..=2).contains(&spatial) {
            return err(format!("{spatial} spatial axes are not supported (1 or 2)"));
        }
        let (n, ch, inp) = planes(x_shape, spatial, "input")?;
        let k = per_axis(kernel, spatial, 1, "kernel")?;
        let stride = per_axis(stride, spatial, 1, "stride")?;
        let padding = per_axis(padding, spatial, 0, "padding")?;
        if stride.contains(&0) {
            return err("stride must be at least 1");
        }
        let mut out = [0; 2];
        for a in 0..2 {
            out[a] = window_out(inp[a], k[a], stride[a], padding[a], 1)?;
        }
        let mut shape = vec![n, ch];
        shape.extend_from_slice(&out[2 - spatial..]);
        Ok((Pool { planes: n * ch, inp, out, k, stride, padding }, shape))
    }

    /// The in-bounds input positions of the window of output `(oh, ow)`, row-major.
    fn window(&self, oh: usize, ow: usize) -> impl Iterator<Item = usize> + '_ {
        let h0 = oh * self.stride[0];
        let w0 = ow * self.stride[1];
        (0..self.k[0]).flat_map(move |a| {
            (0..self.k[1]).filter_map(move |b| {
                let ih = (h0 + a).checked_sub(self.padding[0])?;
                let iw = (w0 + b).checked_sub(self.padding[1])?;
                (ih < self.inp[0] && iw < self.inp[1]).then_some(ih * self.inp[1] + iw)
            })
        })
    }

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
    let (p, out_shape) = Pool::new(&x.shape, kernel, stride, padding)?;
    check_shape(&out_shape, shape)?;
    let (plane, l) = (p.inp[0] * p.inp[1], p.out[0] * p.out[1]);
    let area = (p.k[0] * p.k[1]) as f64;
    by_float!(&[x], T => (|| {
        let xv = floats::<T>(x, "x")?;
        let mut out = vec![T::zero(); p.planes * l];
        par_chunks(&mut out, l, l * p.k[0] * p.k[1], |pl, o| {
            let xp = &xv[pl * plane..][..plane];
            for oh in 0..p.out[0] {
                for ow in 0..p.out[1] {
                    o[oh * p.out[1] + ow] = match op {
                        PoolOp::Max => p.argmax(xp, oh, ow).map_or(T::neg_infinity(), |at| xp[at]),
                        PoolOp::Avg => T::of(p.window(oh, ow).map(|at| xp[at].f64()).sum::<f64>() / area),
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
    let (p, out_shape) = Pool::new(&x.shape, kernel, stride, padding)?;
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

/// Scale per axis (height, width) for `[N, C, L]` (height 1, not scaled) or `[N, C, H, W]`.
fn up_layout(shape: &[usize], scale: usize) -> KResult<(usize, [usize; 2], [usize; 2])> {
    if scale == 0 {
        return err("scale must be at least 1");
    }
    match *shape {
        [n, c, l] => Ok((n * c, [1, l], [1, scale])),
        [n, c, h, w] => Ok((n * c, [h, w], [scale, scale])),
        _ => err(format!("needs [N, C, L] or [N, C, H, W], found {shape:?}")),
    }
}

fn scaled(shape: &[usize], scale: usize) -> Vec<usize> {
    shape.iter().enumerate().map(|(i, &d)| if i >= 2 { d * scale } else { d }).collect()
}

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
