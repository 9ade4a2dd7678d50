//! The convolutions with one invocation per output element, looping over its contributions:
//! what runs when no GEMM tile fits the workgroup width.

use super::ConvDims;
use crate::kernels::{load, store, Operand};

/// y[n, co, oh, ow] = bias[co] + Σ x[n, g·Cin/G + ci, oh·s + kh·d − p, ow·s + kw·d − p] ·
/// w[co, ci, kh, kw].
pub(super) fn conv(
    c: &ConvDims,
    x: &Operand,
    w: &Operand,
    bias: Option<&Operand>,
    out: &Operand,
    post: bool,
) -> String {
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
        st = if post { "mgn_epilogue(i, acc);".to_string() } else { store(out, "i", "acc") },
    )
}

/// dx[n, ci, ih, iw] = Σ over taps (kh, kw) and output channels of its group, at the output
/// position (oh, ow) with oh·s + kh·d − p = ih (when that is a whole, in-range oh).
pub(super) fn conv_grad_input(c: &ConvDims, dy: &Operand, w: &Operand, out: &Operand) -> String {
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
pub(super) fn conv_grad_weight(c: &ConvDims, x: &Operand, dy: &Operand, out: &Operand) -> String {
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
