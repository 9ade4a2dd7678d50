//! Padding and resampling, forward and derivative, one output element per invocation. Where
//! each element reads from is `mgn_ir::shape::resample`'s, as on the CPU:
//!
//! - `Pad`: each axis maps its coordinate to the source (constant padding reads nothing).
//! - `PadGrad`: each element of x sums the elements of dy that read it: per axis the one
//!   straight across, plus (reflect) its two mirror images or (replicate, at an edge) the run
//!   of padding beyond it.
//! - `Interpolate`: the taps of PyTorch's index math, computed in f32 with the host's ratio
//!   (its bits, so that no division on the device rounds differently), summed as the CPU sums.
//! - `InterpolateGrad`: each element of x sums, over the outputs whose taps include it, the
//!   tap's weight times dy. Sources never decrease along an axis, so the outputs that reach
//!   input `c` are a run: it starts after `(c − 2) / ratio − 2` and ends at the first output
//!   whose source passes `c`.

use super::{elementwise, load, store, strides, KernelSource, Operand};
use mgn_ir::op::{InterpMode, PadMode};
use mgn_ir::shape::resample::{interpolated, interpolation, padded, Axis};

pub(super) fn pad(
    x: &Operand,
    out: &Operand,
    widths: &[[usize; 2]],
    mode: PadMode,
    value: f64,
    width: u32,
) -> Result<KernelSource, String> {
    let want = padded(&x.shape, widths, mode).map_err(|e| e.0)?;
    if want != out.shape {
        return Err(format!("pad: expected shape {want:?}, found {:?}", out.shape));
    }
    let (os, is) = (strides(&out.shape), strides(&x.shape));
    let mut body = String::from("var src = 0u;\n    var inside = true;\n");
    for (a, (&n, &[b, e])) in x.shape.iter().zip(widths).enumerate() {
        let o = format!("((i / {}u) % {}u)", os[a], out.shape[a]);
        if b + e == 0 {
            body += &format!("    src = src + {o} * {}u;\n", is[a]);
            continue;
        }
        let last = n - 1;
        let j = match mode {
            PadMode::Constant => format!(
                "let j{a} = i32({o}) - {b};
    if (j{a} < 0 || j{a} > {last}) {{ inside = false; }}
    let s{a} = clamp(j{a}, 0, {last});"
            ),
            PadMode::Reflect => format!(
                "let r{a} = abs(i32({o}) - {b});
    let s{a} = select(r{a}, {} - r{a}, r{a} > {last});",
                2 * last
            ),
            PadMode::Replicate => format!("let s{a} = clamp(i32({o}) - {b}, 0, {last});"),
        };
        body += &format!("    {j}\n    src = src + u32(s{a}) * {}u;\n", is[a]);
    }
    let v = load(x, "src");
    // The value as the CPU stores it in f32 (an f64 literal past f32's range would not
    // compile).
    let fill = super::f32_lit(value);
    body += &format!("    {}", store(out, "i", &format!("select({fill}, {v}, inside)")));
    Ok(elementwise(out.shape.iter().product::<usize>(), width, &body, ""))
}

/// dx: `out` has x's shape, `dy` the padded one.
pub(super) fn pad_grad(
    dy: &Operand,
    out: &Operand,
    widths: &[[usize; 2]],
    mode: PadMode,
    width: u32,
) -> Result<KernelSource, String> {
    let want = padded(&out.shape, widths, mode).map_err(|e| e.0)?;
    if want != dy.shape {
        return Err(format!("pad_grad: dy should have shape {want:?}, found {:?}", dy.shape));
    }
    let (xs, ds) = (strides(&out.shape), strides(&dy.shape));
    let mut open = String::new();
    let mut close = String::new();
    let mut at = Vec::new();
    for (a, (&n, &[b, e])) in out.shape.iter().zip(widths).enumerate() {
        open += &format!("let c{a} = (i / {}u) % {n}u;\n    ", xs[a]);
        at.push(format!("o{a} * {}u", ds[a]));
        let (head, tail) = match mode {
            _ if b + e == 0 => (format!("{{ let o{a} = c{a};"), "}".to_string()),
            PadMode::Constant => (format!("{{ let o{a} = c{a} + {b}u;"), "}".into()),
            PadMode::Replicate => (
                format!(
                    "let lo{a} = select(c{a} + {b}u, 0u, c{a} == 0u);
    let hi{a} = select(c{a} + {}u, {}u, c{a} == {}u);
    for (var o{a} = lo{a}; o{a} < hi{a}; o{a} = o{a} + 1u) {{",
                    b + 1,
                    n + b + e,
                    n - 1
                ),
                "}".into(),
            ),
            // The element itself, its mirror in the padding before (1 ≤ c ≤ b) and after
            // (n − 1 − e ≤ c ≤ n − 2).
            PadMode::Reflect => (
                format!(
                    "for (var k{a} = 0u; k{a} < 3u; k{a} = k{a} + 1u) {{
        var o{a} = c{a} + {b}u;
        if (k{a} == 1u) {{
            if (c{a} < 1u || c{a} > {b}u) {{ continue; }}
            o{a} = {b}u - c{a};
        }}
        if (k{a} == 2u) {{
            if (c{a} + {}u < {n}u || c{a} + 2u > {n}u) {{ continue; }}
            o{a} = {}u - c{a};
        }}",
                    1 + e,
                    b + 2 * (n - 1)
                ),
                "}".into(),
            ),
        };
        open += &head;
        open += "\n    ";
        close += &tail;
    }
    let body = format!(
        "var acc = 0.0;
    {open}acc = acc + {g};
    {close}
    {st}",
        g = load(dy, &format!("({})", at.join(" + "))),
        st = store(out, "i", "acc"),
    );
    Ok(elementwise(out.shape.iter().product::<usize>(), width, &body, ""))
}

/// `let`s of the taps of output coordinate `j` along an axis: `{p}i0`, `{p}i1` (u32) and their
/// weights `{p}l0`, `{p}l1`, exactly as `Axis::nearest` / `Axis::linear` compute them.
fn taps(a: &Axis, j: &str, p: &str) -> String {
    let last = a.inp - 1;
    let (i0, i1, l0, l1) = match a.mode {
        InterpMode::Nearest => {
            let i = if a.out == a.inp {
                j.to_string()
            } else if a.out == 2 * a.inp {
                format!("({j} >> 1u)")
            } else {
                format!("min(u32(floor(f32({j}) * {})), {last}u)", super::f32_lit(a.ratio as f64))
            };
            (i, format!("{p}i0"), "1.0".to_string(), "0.0".to_string())
        }
        InterpMode::Linear if a.out == a.inp => {
            (j.to_string(), j.to_string(), "1.0".into(), "0.0".into())
        }
        InterpMode::Linear => {
            let src = if a.align_corners {
                format!("{} * f32({j})", super::f32_lit(a.ratio as f64))
            } else {
                format!("max({} * (f32({j}) + 0.5) - 0.5, 0.0)", super::f32_lit(a.ratio as f64))
            };
            return format!(
                "let {p}src = {src};
        let {p}i0 = min(u32(floor({p}src)), {last}u);
        let {p}l1 = clamp({p}src - f32({p}i0), 0.0, 1.0);
        let {p}i1 = select({p}i0, {p}i0 + 1u, {p}i0 < {last}u);
        let {p}l0 = 1.0 - {p}l1;"
            );
        }
    };
    format!(
        "let {p}i0 = {i0};
        let {p}i1 = {i1};
        let {p}l0 = {l0};
        let {p}l1 = {l1};"
    )
}

/// The taps an axis reads (nearest: the first only), as the CPU reads them.
fn used(a: &Axis) -> &'static [usize] {
    match a.mode {
        InterpMode::Nearest => &[0],
        InterpMode::Linear => &[0, 1],
    }
}

/// What `interpolate` and its derivative are given: the op's attributes.
pub(super) struct Resample<'a> {
    pub(super) mode: InterpMode,
    pub(super) size: &'a [usize],
    pub(super) scale: Option<&'a [f64]>,
    pub(super) align_corners: bool,
}

impl Resample<'_> {
    fn axes(&self, x_shape: &[usize]) -> Result<[Axis; 2], String> {
        interpolation(x_shape, self.size, self.scale, self.mode, self.align_corners)
            .map_err(|e| e.0)
    }
}

pub(super) fn interpolate(
    r: &Resample,
    x: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let [ah, aw] = r.axes(&x.shape)?;
    let want = interpolated(&x.shape, r.size);
    if want != out.shape {
        return Err(format!("interpolate: expected shape {want:?}, found {:?}", out.shape));
    }
    let mut sum = Vec::new();
    for &a in used(&ah) {
        let inner: Vec<String> = used(&aw)
            .iter()
            .map(|&b| {
                let v = load(x, &format!("(xb + hi{a} * {}u + wi{b})", aw.inp));
                format!("wl{b} * {v}")
            })
            .collect();
        sum.push(format!("hl{a} * ({})", inner.join(" + ")));
    }
    let body = format!(
        "let pl = i / {l}u;
    let j = (i / {ow}u) % {oh}u;
    let k = i % {ow}u;
    let xb = pl * {plane}u;
    {th}
    {tw}
    {st}",
        l = ah.out * aw.out,
        ow = aw.out,
        oh = ah.out,
        plane = ah.inp * aw.inp,
        th = taps(&ah, "j", "h"),
        tw = taps(&aw, "k", "w"),
        st = store(out, "i", &sum.join(" + ")),
    );
    Ok(elementwise(out.shape.iter().product::<usize>(), width, &body, ""))
}

/// The ratio at which an axis's sources advance per output (the nearest mode's copies and
/// doublings advance at 1 and 1/2 whatever the ratio says), for the start of a run.
fn reach(a: &Axis) -> f32 {
    match a.mode {
        _ if a.out == a.inp => 1.0,
        InterpMode::Nearest if a.out == 2 * a.inp => 0.5,
        _ => a.ratio,
    }
}

/// A loop over the outputs `{v}` of an axis whose taps include input `{c}`, leaving the summed
/// weight of those taps in `{p}w`; closed by the caller.
fn run(a: &Axis, c: &str, v: &str, p: &str) -> String {
    let r = reach(a);
    let start = if r > 0.0 {
        format!("u32(max(0.0, floor(f32(i32({c}) - 2) / {}) - 2.0))", super::f32_lit(r as f64))
    } else {
        "0u".into()
    };
    let second = match a.mode {
        InterpMode::Nearest => String::new(),
        InterpMode::Linear => {
            format!("if ({p}i1 == {c}) {{ {p}w = {p}w + {p}l1; touch{p} = true; }}")
        }
    };
    format!(
        "for (var {v} = {start}; {v} < {out}u; {v} = {v} + 1u) {{
        {taps}
        if ({p}i0 > {c}) {{ break; }}
        var {p}w = 0.0;
        var touch{p} = false;
        if ({p}i0 == {c}) {{ {p}w = {p}w + {p}l0; touch{p} = true; }}
        {second}
        if (!touch{p}) {{ continue; }}",
        out = a.out,
        taps = taps(a, v, p),
    )
}

/// dx: `out` has x's shape, `dy` the interpolated one.
pub(super) fn interpolate_grad(
    r: &Resample,
    dy: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let [ah, aw] = r.axes(&out.shape)?;
    let want = interpolated(&out.shape, r.size);
    if want != dy.shape {
        return Err(format!(
            "interpolate_grad: dy should have shape {want:?}, found {:?}",
            dy.shape
        ));
    }
    let body = format!(
        "let pl = i / {plane}u;
    let ih = (i / {iw}u) % {ihn}u;
    let iw = i % {iw}u;
    let gb = pl * {l}u;
    var acc = 0.0;
    {rh}
        {rw}
            acc = acc + hw * ww * {g};
        }}
    }}
    {st}",
        plane = ah.inp * aw.inp,
        iw = aw.inp,
        ihn = ah.inp,
        l = ah.out * aw.out,
        rh = run(&ah, "ih", "j", "h"),
        rw = run(&aw, "iw", "k", "w"),
        g = load(dy, &format!("(gb + j * {}u + k)", aw.out)),
        st = store(out, "i", "acc"),
    );
    Ok(elementwise(out.shape.iter().product::<usize>(), width, &body, ""))
}
