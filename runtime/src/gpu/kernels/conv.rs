//! Convolution, pooling and upsampling, forward and derivatives.
//!
//! Every kernel computes one output element per invocation by looping over the elements that
//! contribute to it, so no kernel needs atomics or a second pass:
//!
//! - `Conv`: the element's window over its group's input channels (plus the bias).
//! - `ConvGradInput`: the output positions (and the kernel taps) that read this input element.
//! - `ConvGradWeight`: every sample and output position that used this weight.
//! - `Pool`: the window (max ignores padding, avg counts it as zeros).
//! - `PoolGrad`: the windows containing the element; max pooling recomputes each window's first
//!   arg-max (the CPU's rule, NaN counting as the maximum) to see whether it is this element.
//! - `Upsample` / `UpsampleGrad`: the nearest source element / the block summed.
//!
//! As on the CPU (`cpu/conv.rs`), a 1-D op runs as 2-D with a height of 1 (kernel 1, stride 1,
//! padding 0, dilation 1 on that axis).

#[allow(unused_imports)]
use super::{broadcast_index, elementwise, load, store, strides, KernelSource, Operand};
use crate::op::{Op, PoolOp};
use crate::cpu::conv as cpu_conv;
use crate::plan::Step;

/// Kernels for conv1d/conv2d and their input/weight derivatives, max/avg pooling and its derivative, nearest upsampling and its derivative.
pub fn generate(step: &Step, inputs: &[Operand], out: &Operand, width: u32) -> Result<KernelSource, String> {
    let what = step.op.describe();
    let need = |k: usize| -> Result<(), String> {
        if inputs.len() < k {
            Err(format!("`{what}` needs {k} inputs, found {}", inputs.len()))
        } else {
            Ok(())
        }
    };
    let src = match &step.op {
        Op::Conv { stride, padding, dilation, groups, has_bias } => {
            need(2 + *has_bias as usize)?;
            let c = ConvDims::new(&inputs[0].shape, &inputs[1].shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &out.shape, &c.out_shape())?;
            let bias = if *has_bias {
                if inputs[2].shape != [c.cout] {
                    return Err(format!("`{what}`: bias must have shape [{}], found {:?}", c.cout, inputs[2].shape));
                }
                Some(&inputs[2])
            } else {
                None
            };
            conv(&c, &inputs[0], &inputs[1], bias, out)
        }
        Op::ConvGradInput { stride, padding, dilation, groups } => {
            need(2)?;
            let c = ConvDims::new(&out.shape, &inputs[1].shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &inputs[0].shape, &c.out_shape())?;
            conv_grad_input(&c, &inputs[0], &inputs[1], out)
        }
        Op::ConvGradWeight { stride, padding, dilation, groups } => {
            need(2)?;
            let c = ConvDims::new(&inputs[0].shape, &out.shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &inputs[1].shape, &c.out_shape())?;
            conv_grad_weight(&c, &inputs[0], &inputs[1], out)
        }
        Op::Pool { op, kernel, stride, padding } => {
            need(1)?;
            let p = PoolDims::new(&inputs[0].shape, kernel, stride, padding)?;
            expect_shape(&what, &out.shape, &p.out_shape)?;
            pool(*op, &p, &inputs[0], out)
        }
        Op::PoolGrad { op, kernel, stride, padding } => {
            need(2)?;
            let p = PoolDims::new(&inputs[0].shape, kernel, stride, padding)?;
            expect_shape(&what, &inputs[1].shape, &p.out_shape)?;
            expect_shape(&what, &out.shape, &inputs[0].shape)?;
            pool_grad(*op, &p, &inputs[0], &inputs[1], out)
        }
        Op::Upsample { scale } => {
            need(1)?;
            let u = UpDims::new(&inputs[0].shape, *scale)?;
            expect_shape(&what, &out.shape, &u.scaled)?;
            upsample(&u, &inputs[0], out)
        }
        Op::UpsampleGrad { scale } => {
            need(1)?;
            let u = UpDims::new(&out.shape, *scale)?;
            expect_shape(&what, &inputs[0].shape, &u.scaled)?;
            upsample_grad(&u, &inputs[0], out)
        }
        _ => return Err(format!("`{what}` has no GPU kernel yet")),
    };
    let n: usize = out.shape.iter().product();
    Ok(elementwise(n, width, &src, ""))
}

fn expect_shape(what: &str, found: &[usize], want: &[usize]) -> Result<(), String> {
    if found == want {
        Ok(())
    } else {
        Err(format!("`{what}`: expected shape {want:?}, found {found:?}"))
    }
}




// ---- convolution ------------------------------------------------------------------------------

/// The CPU backend's checked geometry helpers, with their errors as text.
fn per_axis(v: &[usize], spatial: usize, fill: usize, what: &str) -> Result<[usize; 2], String> {
    cpu_conv::per_axis(v, spatial, fill, what).map_err(|e| e.to_string())
}

fn planes(shape: &[usize], spatial: usize, what: &str) -> Result<(usize, usize, [usize; 2]), String> {
    cpu_conv::planes(shape, spatial, what).map_err(|e| e.to_string())
}

fn window_out(len: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Result<usize, String> {
    cpu_conv::window_out(len, k, stride, pad, dil).map_err(|e| e.to_string())
}

/// Every size of one convolution, checked by the CPU backend's `Conv`.
struct ConvDims {
    spatial: usize,
    n: usize,
    cin: usize,
    cout: usize,
    /// Input height and width.
    inp: [usize; 2],
    k: [usize; 2],
    out: [usize; 2],
    g: usize,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

impl ConvDims {
    fn new(x_shape: &[usize], w_shape: &[usize], stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> Result<ConvDims, String> {
        let geo = cpu_conv::Geometry::new(stride, padding, dilation, groups).map_err(|e| e.to_string())?;
        let c = cpu_conv::Conv::new(x_shape, w_shape, &geo).map_err(|e| e.to_string())?;
        Ok(ConvDims { spatial: geo.spatial, n: c.n, cin: c.cin, cout: c.cout, inp: c.inp, k: c.k, out: c.out, g: c.g, stride: c.stride, padding: c.padding, dilation: c.dilation })
    }

    fn out_shape(&self) -> Vec<usize> {
        let mut s = vec![self.n, self.cout];
        s.extend_from_slice(&self.out[2 - self.spatial..]);
        s
    }

    fn cin_g(&self) -> usize {
        self.cin / self.g
    }

    fn cout_g(&self) -> usize {
        self.cout / self.g
    }
}

/// y[n, co, oh, ow] = bias[co] + Σ x[n, g·Cin/G + ci, oh·s + kh·d − p, ow·s + kw·d − p] · w[co, ci, kh, kw].
fn conv(c: &ConvDims, x: &Operand, w: &Operand, bias: Option<&Operand>, out: &Operand) -> String {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let init = bias.map_or("0.0".to_string(), |b| load(b, "co"));
    format!(
        "let n = i / {cl}u;
    let co = (i / {l}u) % {cout}u;
    let oh = (i / {ow}u) % {oh}u;
    let ow = i % {ow}u;
    let ci0 = (co / {cout_g}u) * {cin_g}u;
    var acc = {init};
    for (var ci = 0u; ci < {cin_g}u; ci = ci + 1u) {{
        let xbase = (n * {cin}u + ci0 + ci) * {hw}u;
        let wbase = (co * {cin_g}u + ci) * {kk}u;
        for (var a = 0u; a < {kh}u; a = a + 1u) {{
            let ih = i32(oh * {sh}u + a * {dh}u) - {ph};
            if (ih < 0 || ih >= {h}) {{ continue; }}
            for (var b = 0u; b < {kw}u; b = b + 1u) {{
                let iw = i32(ow * {sw}u + b * {dw}u) - {pw};
                if (iw < 0 || iw >= {wd}) {{ continue; }}
                acc = acc + {xv} * {wv};
            }}
        }}
    }}
    {st}",
        cl = cout * oh * ow,
        l = oh * ow,
        hw = h * wd,
        kk = kh * kw,
        xv = load(x, &format!("(xbase + u32(ih) * {wd}u + u32(iw))")),
        wv = load(w, &format!("(wbase + a * {kw}u + b)")),
        st = store(out, "i", "acc"),
    )
}

/// dx[n, ci, ih, iw] = Σ over taps (kh, kw) and output channels of its group, at the output
/// position (oh, ow) with oh·s + kh·d − p = ih (when that is a whole, in-range oh).
fn conv_grad_input(c: &ConvDims, dy: &Operand, w: &Operand, out: &Operand) -> String {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    format!(
        "let n = i / {chw}u;
    let ci = (i / {hw}u) % {cin}u;
    let ih = i32((i / {wd}u) % {h}u);
    let iw = i32(i % {wd}u);
    let grp = ci / {cin_g}u;
    let cil = ci % {cin_g}u;
    var acc = 0.0;
    for (var a = 0u; a < {kh}u; a = a + 1u) {{
        let th = ih + {ph} - i32(a * {dh}u);
        if (th < 0 || th % {sh} != 0 || th / {sh} >= {oh}) {{ continue; }}
        let y = u32(th / {sh});
        for (var b = 0u; b < {kw}u; b = b + 1u) {{
            let tw = iw + {pw} - i32(b * {dw}u);
            if (tw < 0 || tw % {sw} != 0 || tw / {sw} >= {ow}) {{ continue; }}
            let x = u32(tw / {sw});
            for (var col = 0u; col < {cout_g}u; col = col + 1u) {{
                let co = grp * {cout_g}u + col;
                acc = acc + {dyv} * {wv};
            }}
        }}
    }}
    {st}",
        chw = cin * h * wd,
        hw = h * wd,
        dyv = load(dy, &format!("(((n * {cout}u + co) * {oh}u + y) * {ow}u + x)")),
        wv = load(w, &format!("(((co * {cin_g}u + cil) * {kh}u + a) * {kw}u + b)")),
        st = store(out, "i", "acc"),
    )
}

/// dw[co, ci, kh, kw] = Σ over samples and output positions of dy[n, co, oh, ow] times the input
/// element that tap read.
fn conv_grad_weight(c: &ConvDims, x: &Operand, dy: &Operand, out: &Operand) -> String {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (n, cin, cout, cin_g, cout_g) = (c.n, c.cin, c.cout, c.cin_g(), c.cout_g());
    format!(
        "let co = i / {ck}u;
    let cil = (i / {kk}u) % {cin_g}u;
    let a = (i / {kw}u) % {kh}u;
    let b = i % {kw}u;
    let ci = (co / {cout_g}u) * {cin_g}u + cil;
    var acc = 0.0;
    for (var s = 0u; s < {n}u; s = s + 1u) {{
        let xbase = (s * {cin}u + ci) * {hw}u;
        let dbase = (s * {cout}u + co) * {l}u;
        for (var y = 0u; y < {oh}u; y = y + 1u) {{
            let ih = i32(y * {sh}u + a * {dh}u) - {ph};
            if (ih < 0 || ih >= {h}) {{ continue; }}
            for (var x = 0u; x < {ow}u; x = x + 1u) {{
                let iw = i32(x * {sw}u + b * {dw}u) - {pw};
                if (iw < 0 || iw >= {wd}) {{ continue; }}
                acc = acc + {dyv} * {xv};
            }}
        }}
    }}
    {st}",
        ck = cin_g * kh * kw,
        kk = kh * kw,
        hw = h * wd,
        l = oh * ow,
        dyv = load(dy, &format!("(dbase + y * {ow}u + x)")),
        xv = load(x, &format!("(xbase + u32(ih) * {wd}u + u32(iw))")),
        st = store(out, "i", "acc"),
    )
}

// ---- pooling ----------------------------------------------------------------------------------

/// Sizes of one pooling op, checked (the CPU's `Pool`).
struct PoolDims {
    inp: [usize; 2],
    out: [usize; 2],
    k: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    out_shape: Vec<usize>,
}

impl PoolDims {
    fn new(x_shape: &[usize], kernel: &[usize], stride: &[usize], padding: &[usize]) -> Result<PoolDims, String> {
        let spatial = kernel.len();
        if !(1..=2).contains(&spatial) {
            return Err(format!("{spatial} spatial axes are not supported (1 or 2)"));
        }
        let (n, ch, inp) = planes(x_shape, spatial, "input")?;
        let k = per_axis(kernel, spatial, 1, "kernel")?;
        let stride = per_axis(stride, spatial, 1, "stride")?;
        let padding = per_axis(padding, spatial, 0, "padding")?;
        if stride.contains(&0) {
            return Err("stride must be at least 1".into());
        }
        let mut out = [0; 2];
        for a in 0..2 {
            out[a] = window_out(inp[a], k[a], stride[a], padding[a], 1)?;
        }
        let mut out_shape = vec![n, ch];
        out_shape.extend_from_slice(&out[2 - spatial..]);
        Ok(PoolDims { inp, out, k, stride, padding, out_shape })
    }
}

/// WGSL statements that leave in `best` (an `i32`, −1 when the window is all padding) the
/// in-plane position of the first maximum of window (`oy`, `ox`) of the plane starting at
/// `xbase` — NaN counting as the maximum, exactly the CPU's `Pool::argmax`. Needs `var best: i32`
/// and `var bv: f32` declared by the caller.
fn argmax(p: &PoolDims, x: &Operand, oy: &str, ox: &str) -> String {
    let ([h, wd], [kh, kw], [sh, sw], [ph, pw]) = (p.inp, p.k, p.stride, p.padding);
    format!(
        "best = -1;
        bv = 0.0;
        for (var a = 0u; a < {kh}u; a = a + 1u) {{
            let ih = i32({oy} * {sh}u + a) - {ph};
            if (ih < 0 || ih >= {h}) {{ continue; }}
            for (var b = 0u; b < {kw}u; b = b + 1u) {{
                let iw = i32({ox} * {sw}u + b) - {pw};
                if (iw < 0 || iw >= {wd}) {{ continue; }}
                let at = ih * {wd} + iw;
                let v = {v};
                if (best < 0 || (bv == bv && (v > bv || v != v))) {{
                    best = at;
                    bv = v;
                }}
            }}
        }}",
        v = load(x, "(xbase + u32(at))"),
    )
}

fn pool(op: PoolOp, p: &PoolDims, x: &Operand, out: &Operand) -> String {
    let ([h, wd], [kh, kw], [sh, sw], [ph, pw], [oh, ow]) = (p.inp, p.k, p.stride, p.padding, p.out);
    let head = format!(
        "let pl = i / {l}u;
    let oy = (i / {ow}u) % {oh}u;
    let ox = i % {ow}u;
    let xbase = pl * {hw}u;",
        l = oh * ow,
        hw = h * wd,
    );
    match op {
        PoolOp::Max => format!(
            "{head}
    var best = -1;
    var bv = 0.0;
    {am}
    if (best < 0) {{
        arena[{o}u + i] = 0xff800000u;
    }} else {{
        {st}
    }}",
            am = argmax(p, x, "oy", "ox"),
            o = out.offset,
            st = store(out, "i", "bv"),
        ),
        PoolOp::Avg => format!(
            "{head}
    var acc = 0.0;
    for (var a = 0u; a < {kh}u; a = a + 1u) {{
        let ih = i32(oy * {sh}u + a) - {ph};
        if (ih < 0 || ih >= {h}) {{ continue; }}
        for (var b = 0u; b < {kw}u; b = b + 1u) {{
            let iw = i32(ox * {sw}u + b) - {pw};
            if (iw < 0 || iw >= {wd}) {{ continue; }}
            acc = acc + {v};
        }}
    }}
    {st}",
            v = load(x, &format!("(xbase + u32(ih) * {wd}u + u32(iw))")),
            st = store(out, "i", &format!("acc / {}.0", kh * kw)),
        ),
    }
}

/// dx of element (pl, ih, iw): over the windows (oy, ox) that contain it, in the CPU's order
/// (oy, then ox, ascending), max pooling adds dy where the window's first arg-max is this
/// element, average pooling adds dy / kernel size.
fn pool_grad(op: PoolOp, p: &PoolDims, x: &Operand, dy: &Operand, out: &Operand) -> String {
    let ([h, wd], [kh, kw], [sh, sw], [ph, pw], [oh, ow]) = (p.inp, p.k, p.stride, p.padding, p.out);
    let g = load(dy, &format!("(pl * {}u + oy * {ow}u + ox)", oh * ow));
    let (decl, add) = match op {
        PoolOp::Max => (
            "var best = -1;
    var bv = 0.0;"
                .to_string(),
            format!(
                "{am}
                if (best == me) {{ acc = acc + {g}; }}",
                am = argmax(p, x, "oy", "ox")
            ),
        ),
        PoolOp::Avg => (String::new(), format!("acc = acc + {g} / {}.0;", kh * kw)),
    };
    // Window oy contains ih when oy·s − p ≤ ih < oy·s − p + k, i.e. tap ta = ih + p − oy·s in
    // 0..k; running the tap down runs oy up.
    format!(
        "let pl = i / {hw}u;
    let ih = i32((i / {wd}u) % {h}u);
    let iw = i32(i % {wd}u);
    let me = ih * {wd} + iw;
    let xbase = pl * {hw}u;
    {decl}
    var acc = 0.0;
    for (var ta = {kh}; ta > 0; ta = ta - 1) {{
        let ty = ih + {ph} - (ta - 1);
        if (ty < 0 || ty % {sh} != 0 || ty / {sh} >= {oh}) {{ continue; }}
        let oy = u32(ty / {sh});
        for (var tb = {kw}; tb > 0; tb = tb - 1) {{
            let tx = iw + {pw} - (tb - 1);
            if (tx < 0 || tx % {sw} != 0 || tx / {sw} >= {ow}) {{ continue; }}
            let ox = u32(tx / {sw});
            {add}
        }}
    }}
    {st}",
        hw = h * wd,
        st = store(out, "i", "acc"),
    )
}

// ---- nearest upsampling -------------------------------------------------------------------------

/// `[N, C, L]` (height 1, not scaled) or `[N, C, H, W]`: planes, source (h, w), scale per axis,
/// and the upsampled shape.
struct UpDims {
    inp: [usize; 2],
    scale: [usize; 2],
    scaled: Vec<usize>,
}

impl UpDims {
    fn new(shape: &[usize], scale: usize) -> Result<UpDims, String> {
        if scale == 0 {
            return Err("scale must be at least 1".into());
        }
        let (inp, sc) = match *shape {
            [_, _, l] => ([1, l], [1, scale]),
            [_, _, h, w] => ([h, w], [scale, scale]),
            _ => return Err(format!("upsampling needs [N, C, L] or [N, C, H, W], found {shape:?}")),
        };
        let scaled = shape.iter().enumerate().map(|(i, &d)| if i >= 2 { d * scale } else { d }).collect();
        Ok(UpDims { inp, scale: sc, scaled })
    }
}

fn upsample(u: &UpDims, x: &Operand, out: &Operand) -> String {
    let ([h, w], [sh, sw]) = (u.inp, u.scale);
    let (oh, ow) = (h * sh, w * sw);
    format!(
        "let pl = i / {ol}u;
    let y = (i / {ow}u) % {oh}u;
    let x = i % {ow}u;
    {st}",
        ol = oh * ow,
        st = store(out, "i", &load(x, &format!("((pl * {h}u + y / {sh}u) * {w}u + x / {sw}u)"))),
    )
}

fn upsample_grad(u: &UpDims, dy: &Operand, out: &Operand) -> String {
    let ([h, w], [sh, sw]) = (u.inp, u.scale);
    let (oh, ow) = (h * sh, w * sw);
    format!(
        "let pl = i / {hw}u;
    let y = (i / {w}u) % {h}u;
    let x = i % {w}u;
    var acc = 0.0;
    for (var a = 0u; a < {sh}u; a = a + 1u) {{
        for (var b = 0u; b < {sw}u; b = b + 1u) {{
            acc = acc + {g};
        }}
    }}
    {st}",
        hw = h * w,
        g = load(dy, &format!("((pl * {oh}u + y * {sh}u + a) * {ow}u + x * {sw}u + b)")),
        st = store(out, "i", "acc"),
    )
}
