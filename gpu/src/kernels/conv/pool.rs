//! Pooling and nearest upsampling, forward and derivative: one output element per invocation.

use crate::kernels::{load, store, Operand};
use mgn_ir::op::PoolOp;
use mgn_ir::shape::conv::Pool as PoolDims;

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

pub(super) fn pool(op: PoolOp, p: &PoolDims, x: &Operand, out: &Operand) -> String {
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
            o = crate::kernels::base(out),
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
pub(super) fn pool_grad(
    op: PoolOp,
    p: &PoolDims,
    x: &Operand,
    dy: &Operand,
    out: &Operand,
) -> String {
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

// Nearest upsampling.

/// `[N, C, L]` (height 1, not scaled) or `[N, C, H, W]`: planes, source (h, w), scale per axis,
/// and the upsampled shape.
pub(super) struct UpDims {
    pub(super) inp: [usize; 2],
    pub(super) scale: [usize; 2],
    pub(super) scaled: Vec<usize>,
}

impl UpDims {
    pub(super) fn new(shape: &[usize], scale: usize) -> Result<UpDims, String> {
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

pub(super) fn upsample(u: &UpDims, x: &Operand, out: &Operand) -> String {
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

pub(super) fn upsample_grad(u: &UpDims, dy: &Operand, out: &Operand) -> String {
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
