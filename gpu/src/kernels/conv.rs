//! Convolution, pooling and upsampling, forward and derivatives.
//!
//! The three convolution ops are implicit GEMMs (`implicit_gemm`): per group, a workgroup
//! computes one tile of the product, staging slices of both operands into shared memory straight
//! from the tensors (im2col on the fly, zero in the padding) and accumulating a register block
//! per invocation; long reductions are split among the workgroup's invocations and summed
//! through shared memory, so no kernel needs atomics or a second pass:
//!
//! - `Conv`: weights × im2col(x) (+ bias), M = output channels, N = samples × output positions.
//! - `ConvGradInput`: weightsᵀ × the dy each tap came from (a transposed convolution), M = input
//!   channels, N = samples × input positions. Strided (dilation 1): one GEMM per stride phase of
//!   the input positions, over the taps that reach that phase (`conv_grad_input_phased`).
//! - `ConvGradWeight`: dy × im2col(x)ᵀ, M = output channels, N = input channels × taps, K =
//!   samples × output positions.
//!
//! (Should no tile fit the workgroup width, they fall back to one invocation per output element
//! looping over its contributions.) The other kernels compute one output element per invocation:
//!
//! - `Pool`: the window (max ignores padding, avg counts it as zeros).
//! - `PoolGrad`: the windows containing the element; max pooling recomputes each window's first
//!   arg-max (the CPU's rule, NaN counting as the maximum) to see whether it is this element.
//! - `Upsample` / `UpsampleGrad`: the nearest source element / the block summed.
//!
//! As on the CPU (`cpu/conv.rs`), a 1-D op runs as 2-D with a height of 1 (kernel 1, stride 1,
//! padding 0, dilation 1 on that axis).

#[allow(unused_imports)]
use super::{broadcast_index, elementwise, load, store, strides, KernelSource, Operand};
use mgn_ir::op::{Op, PoolOp};
use mgn_ir::plan::Step;
use mgn_ir::shape::conv::{Conv as ConvDims, Geometry, Pool as PoolDims};

/// Kernels for conv1d/conv2d and their input/weight derivatives, max/avg pooling and its derivative, nearest upsampling and its derivative.
pub fn generate(
    step: &Step,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let what = step.op.describe();
    let need = |k: usize| super::need_inputs(step, inputs, k);
    let src = match &step.op {
        Op::Conv { stride, padding, dilation, groups, has_bias } => {
            need(2 + *has_bias as usize)?;
            let c =
                conv_dims(&inputs[0].shape, &inputs[1].shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &out.shape, &c.out_shape())?;
            let bias = if *has_bias {
                if inputs[2].shape != [c.cout] {
                    return Err(format!(
                        "`{what}`: bias must have shape [{}], found {:?}",
                        c.cout, inputs[2].shape
                    ));
                }
                Some(&inputs[2])
            } else {
                None
            };
            if let Some(k) = conv_tiled(&c, &inputs[0], &inputs[1], bias, out, width) {
                return Ok(k);
            }
            conv(&c, &inputs[0], &inputs[1], bias, out)
        }
        Op::ConvGradInput { stride, padding, dilation, groups } => {
            need(2)?;
            let c = conv_dims(&out.shape, &inputs[1].shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &inputs[0].shape, &c.out_shape())?;
            if let Some(k) = conv_grad_input_phased(&c, &inputs[0], &inputs[1], out, width) {
                return Ok(k);
            }
            if let Some(k) = conv_grad_input_tiled(&c, &inputs[0], &inputs[1], out, width) {
                return Ok(k);
            }
            conv_grad_input(&c, &inputs[0], &inputs[1], out)
        }
        Op::ConvGradWeight { stride, padding, dilation, groups } => {
            need(2)?;
            let c = conv_dims(&inputs[0].shape, &out.shape, stride, padding, dilation, *groups)?;
            expect_shape(&what, &inputs[1].shape, &c.out_shape())?;
            if let Some(k) = conv_grad_weight_tiled(&c, &inputs[0], &inputs[1], out, width) {
                return Ok(k);
            }
            conv_grad_weight(&c, &inputs[0], &inputs[1], out)
        }
        Op::Pool { op, kernel, stride, padding } => {
            need(1)?;
            let p = PoolDims::new(&inputs[0].shape, kernel, stride, padding)
                .map_err(|e| e.to_string())?;
            expect_shape(&what, &out.shape, &p.out_shape())?;
            pool(*op, &p, &inputs[0], out)
        }
        Op::PoolGrad { op, kernel, stride, padding } => {
            need(2)?;
            let p = PoolDims::new(&inputs[0].shape, kernel, stride, padding)
                .map_err(|e| e.to_string())?;
            expect_shape(&what, &inputs[1].shape, &p.out_shape())?;
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

/// The convolution's sizes, checked by the shape rule every stage shares.
fn conv_dims(
    x_shape: &[usize],
    w_shape: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<ConvDims, String> {
    let geo = Geometry::new(stride, padding, dilation, groups).map_err(|e| e.to_string())?;
    ConvDims::new(x_shape, w_shape, &geo).map_err(|e| e.to_string())
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

/// Forward as a GEMM per group: M = output channels, N = samples × output positions,
/// K = input channels × taps; A is the weight (contiguous along K), B the im2col of the input,
/// staged along N so that neighbouring invocations read neighbouring pixels.
fn conv_tiled(
    c: &ConvDims,
    x: &Operand,
    w: &Operand,
    bias: Option<&Operand>,
    out: &Operand,
    width: u32,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let (hw, l, kk) = (h * wd, oh * ow, kh * kw);
    let gm = Gemm { groups: c.g, m: cout_g, n: c.n * l, k: cin_g * kk, k_end: None };
    let a = Loader {
        k_fast: true,
        pre: String::new(),
        body: format!("v = {};", load(w, &format!("(g * {cout_g}u + m0 + r) * {}u + k", gm.k))),
    };
    // A pointwise convolution reads the input plane as it is: no window arithmetic.
    let pointwise = kk == 1 && [sh, sw, ph, pw] == [1, 1, 0, 0];
    let b = Loader {
        k_fast: false,
        pre: format!(
            "let bn = n0 + fb;
    let bp = bn % {l}u;
    let bx = ((bn / {l}u) * {cin}u + g * {cin_g}u) * {hw}u;
    let bih = i32((bp / {ow}u) * {sh}u) - {ph};
    let biw = i32((bp % {ow}u) * {sw}u) - {pw};"
        ),
        body: if pointwise {
            format!("v = {};", load(x, &format!("bx + k * {hw}u + bp")))
        } else {
            format!(
                "let t = k % {kk}u;
                let ih = bih + i32((t / {kw}u) * {dh}u);
                let iw = biw + i32((t % {kw}u) * {dw}u);
                if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) {{
                    v = {xv};
                }}",
                xv = load(x, &format!("bx + (k / {kk}u) * {hw}u + u32(ih) * {wd}u + u32(iw)")),
            )
        },
    };
    let plus =
        bias.map_or(String::new(), |b| format!(" + {}", load(b, &format!("g * {cout_g}u + m"))));
    let epilogue = store(
        out,
        &format!("((n / {l}u) * {cout}u + g * {cout_g}u + m) * {l}u + n % {l}u"),
        &format!("acc{plus}"),
    );
    implicit_gemm(&gm, &a, &b, &epilogue, width)
}

/// The input gradient as a GEMM per group (a transposed convolution): M = input channels,
/// N = samples × input positions, K = output channels × taps. B gathers, for input position
/// (ih, iw) and tap (kh, kw), the dy at the output position that tap came from, when
/// ih + p − kh·d is a whole multiple of the stride inside the output (zero otherwise).
fn conv_grad_input_tiled(
    c: &ConvDims,
    dy: &Operand,
    w: &Operand,
    out: &Operand,
    width: u32,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let (hw, l, kk) = (h * wd, oh * ow, kh * kw);
    let gm = Gemm { groups: c.g, m: cin_g, n: c.n * hw, k: cout_g * kk, k_end: None };
    let a = Loader {
        k_fast: true,
        pre: String::new(),
        body: format!(
            "v = {};",
            load(
                w,
                &format!("((g * {cout_g}u + k / {kk}u) * {cin_g}u + m0 + r) * {kk}u + k % {kk}u")
            )
        ),
    };
    // A stride of 1 needs no divisibility test (and no division).
    let on_grid =
        |t: &str, s: usize| if s == 1 { String::new() } else { format!(" && {t} % {s} == 0") };
    let b = Loader {
        k_fast: false,
        pre: format!(
            "let bn = n0 + fb;
    let bp = bn % {hw}u;
    let bdy = ((bn / {hw}u) * {cout}u + g * {cout_g}u) * {l}u;
    let bih = i32(bp / {wd}u) + {ph};
    let biw = i32(bp % {wd}u) + {pw};"
        ),
        body: format!(
            "let t = k % {kk}u;
                let th = bih - i32((t / {kw}u) * {dh}u);
                let tw = biw - i32((t % {kw}u) * {dw}u);
                if (th >= 0 && tw >= 0{gh}{gw}) {{
                    let y = u32(th) / {sh}u;
                    let x = u32(tw) / {sw}u;
                    if (y < {oh}u && x < {ow}u) {{
                        v = {dyv};
                    }}
                }}",
            gh = on_grid("th", sh),
            gw = on_grid("tw", sw),
            dyv = load(dy, &format!("bdy + (k / {kk}u) * {l}u + y * {ow}u + x")),
        ),
    };
    let epilogue = store(
        out,
        &format!("((n / {hw}u) * {cin}u + g * {cin_g}u + m) * {hw}u + n % {hw}u"),
        "acc",
    );
    implicit_gemm(&gm, &a, &b, &epilogue, width)
}

/// The input gradient of a strided convolution (dilation 1), one GEMM per group and *phase*:
/// input positions `(ih, iw)` with the same `(ih mod s_h, iw mod s_w)` receive dy through the
/// same taps — `kh ≡ ih + p_h (mod s_h)`, likewise for `kw` — so each phase's GEMM runs over
/// those taps alone (at most `⌈k_h/s_h⌉·⌈k_w/s_w⌉` per output channel) instead of testing every
/// tap at every position and discarding the ones off the stride grid (¾ of them at stride 2). A
/// phase that no tap reaches (a 1×1 kernel at stride 2: three phases of four) skips its K loop
/// and stores zeros. M = input channels, N = samples × the phase's positions (the largest phase's
/// count; positions past the image are neither read nor stored), K = output channels × taps.
fn conv_grad_input_phased(
    c: &ConvDims,
    dy: &Operand,
    w: &Operand,
    out: &Operand,
    width: u32,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw]) = (c.stride, c.padding);
    if c.dilation != [1, 1] || sh * sw == 1 {
        return None;
    }
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let (hw, l, kk) = (h * wd, oh * ow, kh * kw);
    let phases = sh * sw;
    let (qh, qw) = (h.div_ceil(sh), wd.div_ceil(sw));
    let (th, tw) = (kh.div_ceil(sh), kw.div_ceil(sw));
    let taps = th * tw;
    let gm = Gemm {
        groups: c.g * phases,
        m: cin_g,
        n: c.n * qh * qw,
        k: cout_g * taps,
        k_end: Some(format!("select(0u, {}u, a_live)", cout_g * taps)),
    };
    // Depth k → output channel `co` and the phase's tap (`kh_`, `kw_`; past the kernel for the
    // phases with fewer taps than the most). A's `pre` decodes the workgroup's group into the
    // conv group `a_g` and the phase (`a_rh`, `a_rw`), its first taps, and whether any tap reaches
    // it — from the group alone, so uniform, as the K loop bound must be; B and the epilogue use them.
    let tap_of = |k: &str| {
        format!("let co = {k} / {taps}u;\n                let tt = {k} % {taps}u;\n                let kh_ = a_kh0 + (tt / {tw}u) * {sh}u;\n                let kw_ = a_kw0 + (tt % {tw}u) * {sw}u;")
    };
    let a = Loader {
        k_fast: true,
        pre: format!(
            "let a_g = g / {phases}u;
    let a_rh = (g % {phases}u) / {sw}u;
    let a_rw = g % {sw}u;
    let a_kh0 = (a_rh + {ph}u) % {sh}u;
    let a_kw0 = (a_rw + {pw}u) % {sw}u;
    let a_live = a_kh0 < {kh}u && a_kw0 < {kw}u;"
        ),
        body: format!(
            "{tap}
                if (kh_ < {kh}u && kw_ < {kw}u) {{
                    v = {wv};
                }}",
            tap = tap_of("k"),
            wv = load(
                w,
                &format!(
                    "((a_g * {cout_g}u + co) * {cin_g}u + m0 + r) * {kk}u + kh_ * {kw}u + kw_"
                )
            ),
        ),
    };
    let b = Loader {
        k_fast: false,
        pre: format!(
            "let bn = n0 + fb;
    let bq = bn % {pq}u;
    let b_ih = (bq / {qw}u) * {sh}u + a_rh;
    let b_iw = (bq % {qw}u) * {sw}u + a_rw;
    let b_in = b_ih < {h}u && b_iw < {wd}u;
    let bdy = ((bn / {pq}u) * {cout}u + a_g * {cout_g}u) * {l}u;",
            pq = qh * qw,
        ),
        body: format!(
            "{tap}
                let ty = i32(b_ih) + {ph} - i32(kh_);
                let tx = i32(b_iw) + {pw} - i32(kw_);
                if (b_in && kh_ < {kh}u && kw_ < {kw}u && ty >= 0 && tx >= 0) {{
                    let y = u32(ty) / {sh}u;
                    let x = u32(tx) / {sw}u;
                    if (y < {oh}u && x < {ow}u) {{
                        v = {dyv};
                    }}
                }}",
            tap = tap_of("k"),
            dyv = load(dy, &format!("bdy + co * {l}u + y * {ow}u + x")),
        ),
    };
    let epilogue = format!(
        "let eq = n % {pq}u;
            let e_ih = (eq / {qw}u) * {sh}u + a_rh;
            let e_iw = (eq % {qw}u) * {sw}u + a_rw;
            if (e_ih < {h}u && e_iw < {wd}u) {{
                {st}
            }}",
        pq = qh * qw,
        st = store(
            out,
            &format!(
                "((n / {}u) * {cin}u + a_g * {cin_g}u + m) * {hw}u + e_ih * {wd}u + e_iw",
                qh * qw
            ),
            "acc"
        ),
    );
    implicit_gemm(&gm, &a, &b, &epilogue, width)
}

/// The weight gradient as a GEMM per group: M = output channels, N = input channels × taps,
/// K = samples × output positions — a long reduction, which the tile chooser splits across
/// the workgroup's invocations when there are few tiles. Both operands are contiguous along K
/// (dy by output position, the im2col of x by pixel), so both stage along K.
fn conv_grad_weight_tiled(
    c: &ConvDims,
    x: &Operand,
    dy: &Operand,
    out: &Operand,
    width: u32,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let (hw, l, kk) = (h * wd, oh * ow, kh * kw);
    let gm = Gemm { groups: c.g, m: cout_g, n: cin_g * kk, k: c.n * l, k_end: None };
    let a = Loader {
        k_fast: true,
        pre: String::new(),
        body: format!(
            "v = {};",
            load(dy, &format!("((k / {l}u) * {cout}u + g * {cout_g}u + m0 + r) * {l}u + k % {l}u"))
        ),
    };
    let b = Loader {
        k_fast: true,
        pre: String::new(),
        body: format!(
            "let p = k % {l}u;
                let col = n0 + r;
                let t = col % {kk}u;
                let ih = i32((p / {ow}u) * {sh}u + (t / {kw}u) * {dh}u) - {ph};
                let iw = i32((p % {ow}u) * {sw}u + (t % {kw}u) * {dw}u) - {pw};
                if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) {{
                    v = {xv};
                }}",
            xv = load(x, &format!("((k / {l}u) * {cin}u + g * {cin_g}u + col / {kk}u) * {hw}u + u32(ih) * {wd}u + u32(iw)")),
        ),
    };
    let epilogue = store(out, &format!("(g * {cout_g}u + m) * {}u + n", gm.n), "acc");
    implicit_gemm(&gm, &a, &b, &epilogue, width)
}

// ---- implicit GEMM ------------------------------------------------------------------------------

/// One convolution as a batch of matrix products, one per group:
/// `C[g][m][n] = Σ_k A[g][m][k] · B[g][k][n]`, where A and B are never materialised: each
/// workgroup stages a `BK`-deep slice of its A and B tiles into shared memory, gathering the
/// elements straight from the tensors (`Loader`), zero where the tile overhangs the matrix or a
/// window reaches into the padding.
struct Gemm {
    groups: usize,
    m: usize,
    n: usize,
    k: usize,
    /// A WGSL expression of the group `g` (and of what the loaders' `pre` statements define from
    /// it alone) bounding the K loop below `k` for that group — 0 skips the loop and stores zeros.
    k_end: Option<String>,
}

/// How one operand's tile is staged.
struct Loader {
    /// Consecutive invocations take consecutive k (true) or consecutive rows m / columns n
    /// (false): whichever is contiguous in memory, so that the staging loads coalesce.
    k_fast: bool,
    /// Statements run once per invocation before the k loop. They may use `g` (the group),
    /// `m0`, `n0` (the tile's first row and column) and `fa` / `fb`, this invocation's index
    /// along the fast axis of A's / B's staging (fixed for the whole loop): when the fast axis is
    /// m or n, everything that depends on the row or column alone is computed here once.
    pre: String,
    /// Statements that set `v` (an `f32` var, 0.0 before) to the element at tile row (A) or
    /// column (B) `r` and depth `k`; only run for `m0 + r < M` (`n0 + r < N`) and `k < K`.
    body: String,
}

/// A tile shape: `tm × tn` outputs per workgroup, `rm × rn` per invocation (rows strided by
/// `tm / rm`, columns by `tn / rn`, so that neighbouring invocations read neighbouring shared
/// words and store neighbouring outputs), `s` invocations splitting each `bk`-deep slice of K
/// (summed through shared memory at the end).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tile {
    tm: usize,
    tn: usize,
    rm: usize,
    rn: usize,
    s: usize,
    bk: usize,
}

/// Shared memory every Vulkan device has (maxComputeSharedMemorySize's floor), in `f32` words.
const SHARED_WORDS: usize = 16 * 1024 / 4;

/// Workgroup slots of the target (an H200: 132 SMs, about 512 resident invocations each at
/// these kernels' register use), in invocations: the tile chooser weighs a second wave of
/// workgroups against fewer, larger tiles.
const RESIDENT_INVOCATIONS: usize = 132 * 512;

impl Tile {
    fn tmt(&self) -> usize {
        self.tm / self.rm
    }

    fn tnt(&self) -> usize {
        self.tn / self.rn
    }

    /// Row stride of A's and B's staged slices: one word of padding when the staging writes
    /// along k, so that those stores (a row apart) do not all fall in one bank.
    fn lda(&self, a: &Loader) -> usize {
        self.tm + a.k_fast as usize
    }

    fn ldb(&self, b: &Loader) -> usize {
        self.tn + b.k_fast as usize
    }

    /// Shared words: both staged slices, or the partial sums of the `s − 1` other slices.
    fn shared_words(&self) -> usize {
        (self.bk * (self.tm + 1 + self.tn + 1)).max((self.s - 1) * self.tm * self.tn)
    }

    /// Estimated time of the whole GEMM on the target, in cycles: the waves of workgroups times
    /// one workgroup's instructions per invocation (FMAs, shared reads, staging loads with their
    /// index arithmetic, barriers per slice, the split's sum at the end; an SM issues about a
    /// quarter instruction per cycle to each of its resident invocations), plus the words all
    /// tiles stage from memory at about 1400 words per cycle (L2). Few large tiles waste the
    /// machine; many small ones re-read the operands.
    fn cost(&self, gm: &Gemm, width: usize) -> f64 {
        let tiles = gm.groups * gm.m.div_ceil(self.tm) * gm.n.div_ceil(self.tn);
        let waves = tiles.div_ceil((RESIDENT_INVOCATIONS / width).max(1));
        let steps = gm.k.div_ceil(self.bk) as f64;
        let depth = (self.bk / self.s) as f64;
        let loads = (self.bk * self.tm).div_ceil(width) + (self.bk * self.tn).div_ceil(width);
        let per_step = depth * (self.rm * self.rn) as f64
            + 0.5 * depth * (self.rm + self.rn) as f64
            + 6.0 * loads as f64
            + 20.0;
        let tail = (self.rm * self.rn * if self.s > 1 { 2 * self.s } else { 1 }) as f64;
        let traffic = (tiles * (self.tm + self.tn)) as f64 * steps * self.bk as f64;
        4.0 * waves as f64 * (steps * per_step + tail + 40.0) + traffic / 1400.0
    }
}

/// The cheapest tile for `gm` on workgroups of `width` invocations that fits in the guaranteed
/// shared memory, or None when `width` is not a power of two we can tile with.
fn choose_tile(gm: &Gemm, width: usize) -> Option<Tile> {
    if !width.is_power_of_two() || width < 16 {
        return None;
    }
    let pows = |max: usize| (0..).map(|e| 1usize << e).take_while(move |&v| v <= max);
    let mut best: Option<(f64, Tile)> = None;
    for s in pows(32.min(width)) {
        for tmt in pows(width / s) {
            let tnt = width / s / tmt;
            for rm in pows(8) {
                for rn in pows(8) {
                    let (tm, tn) = (tmt * rm, tnt * rn);
                    if rm * rn > 32 || tm > 128.min(width) || tn > 128.min(width) {
                        continue;
                    }
                    for bk in [8, 16, 32, 64] {
                        let t = Tile { tm, tn, rm, rn, s, bk };
                        if bk < s || bk > width || t.shared_words() > SHARED_WORDS {
                            continue;
                        }
                        let c = t.cost(gm, width);
                        if best.map_or(true, |(b, _)| c < b) {
                            best = Some((c, t));
                        }
                    }
                }
            }
        }
    }
    best.map(|(_, t)| t)
}

/// The tiled kernel for `gm`: `epilogue` stores `acc` for in-group row `m` and column `n` of
/// group `g`. Returns None when no tile fits (the caller falls back to one invocation per
/// output element).
fn implicit_gemm(
    gm: &Gemm,
    a: &Loader,
    b: &Loader,
    epilogue: &str,
    width: u32,
) -> Option<KernelSource> {
    let w = width as usize;
    #[cfg(test)]
    if let Some(t) =
        tests::FORCED.with(|f| f.borrow().iter().copied().find(|t| t.tmt() * t.tnt() * t.s == w))
    {
        return Some(gemm_kernel(gm, &t, a, b, epilogue, w));
    }
    let t = choose_tile(gm, w)?;
    Some(gemm_kernel(gm, &t, a, b, epilogue, w))
}

fn gemm_kernel(
    gm: &Gemm,
    t: &Tile,
    a: &Loader,
    b: &Loader,
    epilogue: &str,
    w: usize,
) -> KernelSource {
    let (mtiles, ntiles) = (gm.m.div_ceil(t.tm), gm.n.div_ceil(t.tn));
    let nwg = gm.groups * mtiles * ntiles;
    let (tmt, tnt) = (t.tmt(), t.tnt());
    let (lda, ldb) = (t.lda(a), t.ldb(b));
    let boff = t.bk * lda;
    let (mm, nn, kk) = (gm.m, gm.n, gm.k);
    // Staging of one operand: `rows` is its tile extent along m or n, `bound` the matrix's.
    let stage = |ld: &Loader,
                 rows: usize,
                 bound: usize,
                 origin: &str,
                 fast: &str,
                 base: usize,
                 stride: usize|
     -> String {
        let fast_len = if ld.k_fast { t.bk } else { rows };
        let slow_len = if ld.k_fast { rows } else { t.bk };
        let per_pass = w / fast_len;
        let passes = slow_len.div_ceil(per_pass);
        let guard = if passes * per_pass > slow_len {
            format!("if (sl_ >= {slow_len}u) {{ continue; }}")
        } else {
            String::new()
        };
        let (r, k) = if ld.k_fast { ("sl_", fast) } else { (fast, "sl_") };
        format!(
            "for (var j = 0u; j < {passes}u; j = j + 1u) {{
            let sl_ = tid / {fast_len}u + j * {per_pass}u;
            {guard}
            let r = {r};
            let kk = {k};
            let k = k0 + kk;
            var v = 0.0;
            if ({origin} + r < {bound}u && k < {kk_}u) {{
                {body}
            }}
            sm[{base}u + kk * {stride}u + r] = v;
        }}",
            kk_ = kk,
            body = ld.body,
        )
    };
    let fa_len = if a.k_fast { t.bk } else { t.tm };
    let fb_len = if b.k_fast { t.bk } else { t.tn };
    let mut decl = String::new();
    let mut fmas = String::new();
    let mut loads_a = String::new();
    let mut loads_b = String::new();
    let mut spill = String::new();
    let mut gather = String::new();
    let mut store = String::new();
    let slot = |i: usize, j: usize| format!("{}u + tm_ * {tnt}u + tn_", (i * t.rn + j) * tmt * tnt);
    for i in 0..t.rm {
        loads_a
            .push_str(&format!("let a{i} = sm[kk * {lda}u + tm_ + {}u];\n            ", i * tmt));
    }
    for j in 0..t.rn {
        loads_b.push_str(&format!(
            "let b{j} = sm[{boff}u + kk * {ldb}u + tn_ + {}u];\n            ",
            j * tnt
        ));
    }
    for i in 0..t.rm {
        for j in 0..t.rn {
            decl.push_str(&format!("var c{i}_{j} = 0.0;\n    "));
            fmas.push_str(&format!("c{i}_{j} = fma(a{i}, b{j}, c{i}_{j});\n            "));
            spill.push_str(&format!(
                "sm[(sl - 1u) * {} + {}] = c{i}_{j};\n        ",
                t.tm * t.tn,
                slot(i, j)
            ));
            gather.push_str(&format!(
                "c{i}_{j} = c{i}_{j} + sm[q * {} + {}];\n            ",
                t.tm * t.tn,
                slot(i, j)
            ));
            store.push_str(&format!(
                "{{
        let m = m0 + tm_ + {mi}u;
        let n = n0 + tn_ + {nj}u;
        if (m < {mm}u && n < {nn}u) {{
            let acc = c{i}_{j};
            {epilogue}
        }}
    }}
    ",
                mi = i * tmt,
                nj = j * tnt,
            ));
        }
    }
    // With a split K, the other slices leave their sums in shared memory (after the loop's last
    // barrier, so the staged slices are dead) and slice 0 adds them up and stores.
    let finish = if t.s > 1 {
        format!(
            "if (sl > 0u) {{
        {spill}
    }}
    workgroupBarrier();
    if (sl == 0u) {{
        for (var q = 0u; q < {others}u; q = q + 1u) {{
            {gather}
        }}
        {store}
    }}",
            others = t.s - 1,
        )
    } else {
        store
    };
    let depth = t.bk / t.s;
    let body = format!(
        "var<workgroup> sm: array<f32, {words}>;

@compute @workgroup_size({w})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let id = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    if (id >= {nwg}u) {{ return; }}
    let g = id / {mn_tiles}u;
    let m0 = ((id / {ntiles}u) % {mtiles}u) * {tm}u;
    let n0 = (id % {ntiles}u) * {tn}u;
    let fa = tid % {fa_len}u;
    let fb = tid % {fb_len}u;
    {pre_a}
    {pre_b}
    let tn_ = tid % {tnt}u;
    let tm_ = (tid / {tnt}u) % {tmt}u;
    let sl = tid / {tmnt}u;
    {decl}
    let kend = {kend};
    for (var k0 = 0u; k0 < kend; k0 = k0 + {bk}u) {{
        {stage_a}
        {stage_b}
        workgroupBarrier();
        for (var q = 0u; q < {depth}u; q = q + 1u) {{
            let kk = {kk_of_q};
            {loads_a}{loads_b}{fmas}
        }}
        workgroupBarrier();
    }}
    {finish}
}}
",
        words = t.shared_words(),
        // A constant trip count, so that the compiler can unroll the slice.
        kk_of_q = if t.s > 1 { format!("sl * {depth}u + q") } else { "q".to_string() },
        mn_tiles = mtiles * ntiles,
        kend = gm.k_end.clone().unwrap_or(format!("{kk}u")),
        tm = t.tm,
        tn = t.tn,
        bk = t.bk,
        tmnt = tmt * tnt,
        pre_a = a.pre,
        pre_b = b.pre,
        stage_a = stage(a, t.tm, mm, "m0", "fa", 0, lda),
        stage_b = stage(b, t.tn, nn, "n0", "fb", boff, ldb),
    );
    KernelSource { body, invocations: nwg as u64 * w as u64, dropout_node: None }
}

// ---- pooling ----------------------------------------------------------------------------------

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
    let ([h, wd], [kh, kw], [sh, sw], [ph, pw], [oh, ow]) =
        (p.inp, p.k, p.stride, p.padding, p.out);
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
        arena[{o} + i] = 0xff800000u;
    }} else {{
        {st}
    }}",
            am = argmax(p, x, "oy", "ox"),
            o = super::base(out),
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
    let ([h, wd], [kh, kw], [sh, sw], [ph, pw], [oh, ow]) =
        (p.inp, p.k, p.stride, p.padding, p.out);
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
            _ => {
                return Err(format!("upsampling needs [N, C, L] or [N, C, H, W], found {shape:?}"))
            }
        };
        let scaled =
            shape.iter().enumerate().map(|(i, &d)| if i >= 2 { d * scale } else { d }).collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{check_on_both, values};
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;
    use std::cell::RefCell;

    thread_local! {
        /// Tiles the GEMM kernels take instead of the chooser's (the first whose invocations
        /// match the workgroup width), so that small test shapes run every tile variant.
        pub(super) static FORCED: RefCell<Vec<Tile>> = const { RefCell::new(Vec::new()) };
    }

    fn tile(tm: usize, tn: usize, rm: usize, rn: usize, s: usize, bk: usize) -> Tile {
        Tile { tm, tn, rm, rn, s, bk }
    }

    /// Each variant for 256- and 128-wide workgroups: the big square tile, a split K with a
    /// small tile, a one-row tile (depthwise), a tile smaller than a staging pass (guarded
    /// staging), and a tall one.
    fn variants() -> Vec<Vec<Tile>> {
        vec![
            vec![tile(64, 64, 4, 4, 1, 16), tile(64, 32, 4, 4, 1, 16)],
            vec![tile(16, 16, 2, 2, 4, 32), tile(16, 16, 2, 2, 2, 32)],
            vec![tile(1, 128, 1, 1, 2, 16), tile(1, 128, 1, 1, 1, 16)],
            vec![tile(8, 8, 1, 1, 4, 8), tile(8, 8, 1, 1, 2, 8)],
            vec![tile(128, 16, 8, 2, 2, 16), tile(128, 16, 8, 2, 1, 16)],
        ]
    }

    #[test]
    fn every_tile_variant_matches_the_cpu() {
        // Odd sizes that overhang every tile, groups, stride, padding and dilation.
        let (x, w) = (vec![2, 6, 9, 8], vec![10, 3, 3, 2]);
        let (stride, padding, dilation, groups) = (vec![2, 1], vec![1, 2], vec![2, 1], 2);
        let y = vec![2, 10, 4, 11];
        let (xt, wt, bt, dyt) = (
            Tensor::f32(x.clone(), values(2 * 6 * 9 * 8, 1)),
            Tensor::f32(w.clone(), values(10 * 3 * 3 * 2, 2)),
            Tensor::f32(vec![10], values(10, 3)),
            Tensor::f32(y.clone(), values(2 * 10 * 4 * 11, 4)),
        );
        for v in variants() {
            FORCED.with(|f| *f.borrow_mut() = v.clone());
            let conv = Op::Conv {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups,
                has_bias: true,
            };
            check_on_both(&conv, &[xt.clone(), wt.clone(), bt.clone()], DType::F32, &y, 1e-5);
            let gi = Op::ConvGradInput {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups,
            };
            check_on_both(&gi, &[dyt.clone(), wt.clone()], DType::F32, &x, 1e-5);
            let gw = Op::ConvGradWeight {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups,
            };
            check_on_both(&gw, &[xt.clone(), dyt.clone()], DType::F32, &w, 1e-5);
            // The phased input gradient (strided, dilation 1) with every tile too.
            let (s2, p2, d2) = (vec![2, 3], vec![1, 0], vec![1, 1]);
            let y2 = vec![2, 10, 5, 3];
            let gi = Op::ConvGradInput { stride: s2, padding: p2, dilation: d2, groups };
            check_on_both(
                &gi,
                &[Tensor::f32(y2.clone(), values(2 * 10 * 5 * 3, 5)), wt.clone()],
                DType::F32,
                &x,
                1e-5,
            );
        }
        FORCED.with(|f| f.borrow_mut().clear());
    }

    /// Throughput of the three convolution GEMMs on ResNet-50's layers at batch 4, with the
    /// chooser's tile and with fixed alternatives: not a check, a measurement for a real GPU
    /// (`cargo test --release -p mgn-runtime conv_throughput -- --ignored --nocapture`), the
    /// data for tuning `Tile::cost`. One line per layer, derivative and tile.
    #[test]
    #[ignore]
    fn conv_throughput() {
        use crate::test_util::time_op;
        let b = 4;
        // (cout, cin, kernel, stride, input size): one layer of each kind per stage.
        let layers = [
            (64, 3, 7, 2, 224),
            (64, 64, 3, 1, 56),
            (256, 64, 1, 1, 56),
            (64, 256, 1, 1, 56),
            (128, 128, 3, 2, 56),
            (512, 128, 1, 1, 28),
            (256, 256, 3, 1, 14),
            (1024, 256, 1, 1, 14),
            (512, 512, 3, 1, 7),
            (2048, 512, 1, 1, 7),
            (512, 2048, 1, 1, 7),
        ];
        let alternatives = [
            None,
            Some(tile(128, 128, 8, 8, 1, 8)),
            Some(tile(128, 64, 8, 4, 1, 8)),
            Some(tile(64, 64, 4, 4, 1, 16)),
            Some(tile(64, 64, 8, 4, 2, 16)),
            Some(tile(32, 32, 4, 4, 4, 32)),
        ];
        for (co, ci, k, st, size) in layers {
            let pad = k / 2;
            let o = (size + 2 * pad - k) / st + 1;
            let (x, w, y) = (vec![b, ci, size, size], vec![co, ci, k, k], vec![b, co, o, o]);
            let flops = 2.0 * (b * co * o * o * ci * k * k) as f64;
            let geo = (vec![st, st], vec![pad, pad], vec![1, 1]);
            let ops = [
                (
                    "forward",
                    Op::Conv {
                        stride: geo.0.clone(),
                        padding: geo.1.clone(),
                        dilation: geo.2.clone(),
                        groups: 1,
                        has_bias: false,
                    },
                    [&x[..], &w[..]],
                    &y,
                ),
                (
                    "grad input",
                    Op::ConvGradInput {
                        stride: geo.0.clone(),
                        padding: geo.1.clone(),
                        dilation: geo.2.clone(),
                        groups: 1,
                    },
                    [&y[..], &w[..]],
                    &x,
                ),
                (
                    "grad weight",
                    Op::ConvGradWeight {
                        stride: geo.0.clone(),
                        padding: geo.1.clone(),
                        dilation: geo.2.clone(),
                        groups: 1,
                    },
                    [&x[..], &y[..]],
                    &w,
                ),
            ];
            for (what, op, operands, out) in &ops {
                for alt in alternatives {
                    FORCED.with(|f| *f.borrow_mut() = alt.into_iter().collect());
                    let label = alt.map_or("chosen".to_string(), |t| {
                        format!("{}x{} r{}x{} s{} bk{}", t.tm, t.tn, t.rm, t.rn, t.s, t.bk)
                    });
                    // About 2·10¹⁰ FLOP per submission, within 64 MiB of outputs.
                    let out_bytes = 4 * out.iter().product::<usize>();
                    let repeat = ((2e10 / flops) as usize).min((64 << 20) / out_bytes).clamp(1, 20);
                    if let Some((sec, device)) = time_op(op, operands, out, repeat) {
                        println!("conv {co}x{ci}x{k}x{k} /{st} {size}² {what:<11} {label:<22} {:8.1} µs {:8.1} GFLOP/s ({device})", sec * 1e6, flops / sec / 1e9);
                    }
                }
            }
        }
        FORCED.with(|f| f.borrow_mut().clear());
    }

    /// The chooser's tiles keep the kernel's invariants for ResNet-50- and U-Net-sized GEMMs
    /// (and tiny ones), at both widths.
    #[test]
    fn chosen_tiles_fit_the_floor() {
        let shapes = [
            (1, 64, 4 * 112 * 112, 147),
            (1, 64, 4 * 56 * 56, 576),
            (1, 2048, 4 * 49, 512),
            (1, 64, 64, 4 * 3136),
            (1, 64, 147, 4 * 12544),
            (32, 1, 9, 4096),
            (1, 3, 50, 9),
            (1, 1, 1, 1),
        ];
        for width in [128usize, 256] {
            for (groups, m, n, k) in shapes {
                let t = choose_tile(&Gemm { groups, m, n, k, k_end: None }, width).expect("a tile");
                assert_eq!(t.tmt() * t.tnt() * t.s, width, "{t:?}");
                assert!(
                    t.shared_words() <= SHARED_WORDS
                        && t.bk % t.s == 0
                        && t.bk <= width
                        && t.tm <= width
                        && t.tn <= width,
                    "{t:?}"
                );
                eprintln!("width {width} gemm {groups}x{m}x{n}x{k}: {t:?}");
            }
        }
    }
}
