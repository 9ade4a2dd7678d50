//! The windows of convolutions, pooling and nearest upsampling.
//!
//! Everything is sized for two spatial axes; a 1-D op is 2-D with a height of 1 (kernel 1,
//! stride 1, padding 0, dilation 1 on that axis), which is how both backends run it.

use super::{fail, window_out, ShapeError};

/// Stride, padding and dilation per axis (height, width), and the group count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub spatial: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

/// A 1- or 2-element attribute as (height, width); 1-D gets `fill` for the height.
pub fn per_axis(
    v: &[usize],
    spatial: usize,
    fill: usize,
    what: &str,
) -> Result<[usize; 2], ShapeError> {
    match (spatial, v) {
        (1, [a]) => Ok([fill, *a]),
        (2, [a, b]) => Ok([*a, *b]),
        _ => fail(format!("{what} {v:?} must have one value per spatial axis ({spatial})")),
    }
}

fn spatial_axes(n: usize) -> Result<usize, ShapeError> {
    if !(1..=2).contains(&n) {
        return fail(format!("{n} spatial axes are not supported (1 or 2)"));
    }
    Ok(n)
}

impl Geometry {
    pub fn new(
        stride: &[usize],
        padding: &[usize],
        dilation: &[usize],
        groups: usize,
    ) -> Result<Geometry, ShapeError> {
        let spatial = spatial_axes(stride.len())?;
        let g = Geometry {
            spatial,
            stride: per_axis(stride, spatial, 1, "stride")?,
            padding: per_axis(padding, spatial, 0, "padding")?,
            dilation: per_axis(dilation, spatial, 1, "dilation")?,
            groups,
        };
        if g.stride.contains(&0) || g.dilation.contains(&0) || groups == 0 {
            return fail("stride, dilation and groups must be at least 1");
        }
        Ok(g)
    }
}

/// `[N, C, L]` or `[N, C, H, W]` as (N, C, [H, W]).
pub fn planes(
    shape: &[usize],
    spatial: usize,
    what: &str,
) -> Result<(usize, usize, [usize; 2]), ShapeError> {
    match (spatial, shape) {
        (1, &[n, c, l]) => Ok((n, c, [1, l])),
        (2, &[n, c, h, w]) => Ok((n, c, [h, w])),
        _ => fail(format!("{what} {shape:?} must have {} axes", spatial + 2)),
    }
}

fn window(
    len: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dil: usize,
) -> Result<usize, ShapeError> {
    window_out(len, k, stride, pad, dil).ok_or_else(|| {
        ShapeError(format!(
            "a window of {k} (dilation {dil}) does not fit an axis of {len} with padding {pad}"
        ))
    })
}

/// Every size of one convolution, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conv {
    pub spatial: usize,
    pub n: usize,
    pub cin: usize,
    pub cout: usize,
    pub inp: [usize; 2],
    pub k: [usize; 2],
    pub out: [usize; 2],
    pub g: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Conv {
    pub fn new(x_shape: &[usize], w_shape: &[usize], geo: &Geometry) -> Result<Conv, ShapeError> {
        let (n, cin, inp) = planes(x_shape, geo.spatial, "input")?;
        let (cout, cin_g, k) = planes(w_shape, geo.spatial, "weight")?;
        let g = geo.groups;
        if cin % g != 0 || cout % g != 0 || cin_g * g != cin {
            return fail(format!(
                "weight {w_shape:?} with {g} groups does not fit an input with {cin} channels"
            ));
        }
        let mut out = [0; 2];
        for a in 0..2 {
            out[a] = window(inp[a], k[a], geo.stride[a], geo.padding[a], geo.dilation[a])?;
        }
        let (stride, padding, dilation) = (geo.stride, geo.padding, geo.dilation);
        Ok(Conv { spatial: geo.spatial, n, cin, cout, inp, k, out, g, stride, padding, dilation })
    }

    /// `[N, Cout, ..out]`.
    pub fn out_shape(&self) -> Vec<usize> {
        let mut s = vec![self.n, self.cout];
        s.extend_from_slice(&self.out[2 - self.spatial..]);
        s
    }

    /// Input channels per group.
    pub fn cin_g(&self) -> usize {
        self.cin / self.g
    }

    /// Output channels per group.
    pub fn cout_g(&self) -> usize {
        self.cout / self.g
    }

    /// The input position read by tap `(kh, kw)` at output `(oh, ow)`, if not in the padding.
    pub fn source(&self, (kh, kw): (usize, usize), (oh, ow): (usize, usize)) -> Option<usize> {
        let ih = (oh * self.stride[0] + kh * self.dilation[0]).checked_sub(self.padding[0])?;
        let iw = (ow * self.stride[1] + kw * self.dilation[1]).checked_sub(self.padding[1])?;
        (ih < self.inp[0] && iw < self.inp[1]).then_some(ih * self.inp[1] + iw)
    }
}

/// Sizes of one pooling op, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub spatial: usize,
    pub n: usize,
    pub channels: usize,
    pub inp: [usize; 2],
    pub out: [usize; 2],
    pub k: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl Pool {
    pub fn new(
        x_shape: &[usize],
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
    ) -> Result<Pool, ShapeError> {
        let spatial = spatial_axes(kernel.len())?;
        let (n, channels, inp) = planes(x_shape, spatial, "input")?;
        let k = per_axis(kernel, spatial, 1, "kernel")?;
        let stride = per_axis(stride, spatial, 1, "stride")?;
        let padding = per_axis(padding, spatial, 0, "padding")?;
        if stride.contains(&0) {
            return fail("stride must be at least 1");
        }
        let mut out = [0; 2];
        for a in 0..2 {
            out[a] = window(inp[a], k[a], stride[a], padding[a], 1)?;
        }
        Ok(Pool { spatial, n, channels, inp, out, k, stride, padding })
    }

    /// Planes pooled independently, `N·C`.
    pub fn planes(&self) -> usize {
        self.n * self.channels
    }

    /// `[N, C, ..out]`.
    pub fn out_shape(&self) -> Vec<usize> {
        let mut s = vec![self.n, self.channels];
        s.extend_from_slice(&self.out[2 - self.spatial..]);
        s
    }

    /// The in-bounds input positions of the window of output `(oh, ow)`, row-major.
    pub fn window(&self, oh: usize, ow: usize) -> impl Iterator<Item = usize> + '_ {
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
}

/// Nearest upsampling of `[N, C, L]` (height 1, not scaled) or `[N, C, H, W]` by `scale`:
/// (planes, input [H, W], scale per axis).
pub fn upsample(
    shape: &[usize],
    scale: usize,
) -> Result<(usize, [usize; 2], [usize; 2]), ShapeError> {
    if scale == 0 {
        return fail("scale must be at least 1");
    }
    match *shape {
        [n, c, l] => Ok((n * c, [1, l], [1, scale])),
        [n, c, h, w] => Ok((n * c, [h, w], [scale, scale])),
        _ => fail(format!("needs [N, C, L] or [N, C, H, W], found {shape:?}")),
    }
}

/// The upsampled shape: every axis after the first two times `scale`.
pub fn upsampled(shape: &[usize], scale: usize) -> Vec<usize> {
    shape.iter().enumerate().map(|(i, &d)| if i >= 2 { d * scale } else { d }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet_stem_and_grouped_convolutions() {
        let geo = Geometry::new(&[2, 2], &[3, 3], &[1, 1], 1).unwrap();
        let c = Conv::new(&[4, 3, 224, 224], &[64, 3, 7, 7], &geo).unwrap();
        assert_eq!(c.out_shape(), vec![4, 64, 112, 112]);
        let geo = Geometry::new(&[1], &[1], &[1], 2).unwrap();
        let c = Conv::new(&[1, 4, 10], &[6, 2, 3], &geo).unwrap();
        assert_eq!((c.inp, c.k, c.out_shape()), ([1, 10], [1, 3], vec![1, 6, 10]));
        assert!(Conv::new(&[1, 4, 10], &[6, 4, 3], &geo).is_err(), "4 channels per group");
        assert!(Geometry::new(&[1, 1, 1], &[0, 0, 0], &[1, 1, 1], 1).is_err());
        assert!(Geometry::new(&[0], &[0], &[1], 1).is_err());
    }

    #[test]
    fn pooling_windows_skip_the_padding() {
        let p = Pool::new(&[1, 2, 4, 4], &[3, 3], &[2, 2], &[1, 1]).unwrap();
        assert_eq!(p.out_shape(), vec![1, 2, 2, 2]);
        assert_eq!(p.window(0, 0).collect::<Vec<_>>(), vec![0, 1, 4, 5]);
        assert!(Pool::new(&[1, 2, 2, 2], &[5, 5], &[1, 1], &[0, 0]).is_err());
        assert_eq!(upsample(&[1, 2, 3], 2).unwrap(), (2, [1, 3], [1, 2]));
        assert_eq!(upsampled(&[1, 2, 3, 4], 2), vec![1, 2, 6, 8]);
    }
}
