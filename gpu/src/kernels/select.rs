//! Selection: concat, slice, gather and their derivatives, reduce derivatives, argmax, rope,
//! and the KV-cache ops whose start is read at run time (narrow, slice-scatter, rope's start).
//!
//! Like the rest of the generator, one invocation computes one output element, so nothing here
//! needs atomics: scatter-style derivatives (gather's) loop over every index position and keep
//! the ones that land on their element.
//!
//! Out-of-range gather indices: the CPU refuses them; a kernel cannot report an error, so it
//! must at least never read outside the tensor. `Gather` writes 0 for an index outside the axis,
//! and `GatherGrad` drops the rows whose index is outside it.
//!
//! A run-time start (`Narrow`, `SliceScatter`, `Rope`'s second input) is one i32 word in the
//! arena. The CPU clamps it into the axis; the kernels clamp it the same way, so a decoding
//! position past the cache reads and writes its last window rather than outside the tensor.

#[allow(unused_imports)]
use super::{elementwise, load, store, strides, Ext, KernelSource, Operand};
use mgn_ir::op::{Op, ReduceOp};

/// Kernels for concat, slice, narrow, slice-scatter, gather, their derivatives, ReduceGrad,
/// ArgMax and Rope.
pub fn generate(
    op: &Op,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let need = |k: usize| super::need_inputs(op, inputs, k);
    match op {
        Op::Concat { axis } => {
            need(1)?;
            concat(*axis, inputs, out, width)
        }
        Op::Slice { axis, start, end } => {
            need(1)?;
            slice(*axis, *start, *end, &inputs[0], out, width)
        }
        Op::SliceGrad { axis, start, end } => {
            need(1)?;
            slice_grad(*axis, *start, *end, &inputs[0], out, width)
        }
        Op::Narrow { axis, len } => {
            need(2)?;
            narrow(*axis, *len, &inputs[0], &inputs[1], out, width)
        }
        Op::SliceScatter { axis } => {
            need(3)?;
            slice_scatter(*axis, inputs, out, width)
        }
        Op::Gather { axis } => {
            need(2)?;
            gather(*axis, &inputs[0], &inputs[1], out, width)
        }
        Op::GatherGrad { axis } => {
            need(2)?;
            gather_grad(*axis, &inputs[0], &inputs[1], out, width)
        }
        Op::ReduceGrad { op, axes, .. } => {
            need(3)?;
            reduce_grad(*op, axes, inputs, out, width)
        }
        Op::ArgMax { axis } => {
            need(1)?;
            argmax(*axis, &inputs[0], out, width)
        }
        Op::Rope { theta, offset, inverse } => {
            need(1)?;
            rope(*theta, *offset, *inverse, &inputs[0], inputs.get(1), out, width)
        }
        other => Err(format!("`{}` has no GPU kernel yet", other.describe())),
    }
}

/// `(outer, len, inner)` around `axis` of `x`, as a shared kernel reads them.
fn split(x: &Operand, axis: usize) -> Result<(Ext, Ext, Ext), String> {
    if axis >= x.shape.len() {
        return Err(format!("axis {axis} is out of range for shape {:?}", x.shape));
    }
    let d = x.dims();
    Ok((Ext::product(&d[..axis]), d[axis].clone(), Ext::product(&d[axis + 1..])))
}

/// WGSL lines decomposing `i` into `o` (outer), `a` (along the axis of size `len`) and `r` (inner).
fn decompose(len: &Ext, inner: &Ext) -> String {
    format!(
        "let o = i / {run};
    let a = (i / {inner}) % {len};
    let r = i % {inner};",
        run = len.mul(inner)
    )
}

fn concat(
    axis: usize,
    pieces: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (_, len, inner) = split(out, axis)?;
    let mut body = decompose(&len, &inner);
    let mut start = Ext::lit(0);
    for p in pieces {
        let (_, plen, pinner) = split(p, axis)?;
        if pinner.n != inner.n {
            return Err(format!(
                "concat piece {:?} does not fit output {:?} off axis {axis}",
                p.shape, out.shape
            ));
        }
        if plen.n == 0 {
            continue;
        }
        let end = start.add(&plen);
        body += &format!(
            "
    if (a < {end}) {{
        {}
        return;
    }}",
            store(out, "i", &load(p, &format!("(o * {plen} + (a - {start})) * {inner} + r")))
        );
        start = end;
    }
    if start.n != len.n {
        return Err(format!(
            "concat pieces add up to {} along axis {axis}, the output has {}",
            start.n, len.n
        ));
    }
    Ok(elementwise(out.numel(), width, &body, ""))
}

fn slice(
    axis: usize,
    start: usize,
    end: usize,
    x: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (_, xlen, inner) = split(x, axis)?;
    if !(start < end && end <= xlen.n && out.shape.get(axis) == Some(&(end - start))) {
        return Err(format!(
            "slice {start}..{end} is out of range for axis {axis} of {:?}",
            x.shape
        ));
    }
    let body = format!(
        "{}
    {}",
        decompose(&out.dim(axis), &inner),
        store(out, "i", &load(x, &format!("(o * {xlen} + a + {start}u) * {inner} + r")))
    );
    Ok(elementwise(out.numel(), width, &body, ""))
}

fn slice_grad(
    axis: usize,
    start: usize,
    end: usize,
    dy: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (_, len, inner) = split(out, axis)?;
    if !(start < end && end <= len.n && dy.shape.get(axis) == Some(&(end - start))) {
        return Err(format!(
            "slice {start}..{end} is out of range for axis {axis} of {:?}",
            out.shape
        ));
    }
    let run = dy.dim(axis);
    let body = format!(
        "{}
    if (a >= {start}u && a < {start}u + {run}) {{
        {}
    }} else {{
        {}
    }}",
        decompose(&len, &inner),
        store(out, "i", &load(dy, &format!("(o * {run} + (a - {start}u)) * {inner} + r"))),
        store(out, "i", "0"),
    );
    Ok(elementwise(out.numel(), width, &body, ""))
}

/// A WGSL expression of the run-time start in `start` (an `i32[]`), clamped into
/// `[0, room]` as `mgn_cpu`'s `clamped_start` does, as a `u32`.
fn clamped_start(start: &Operand, room: &Ext) -> String {
    format!("u32(clamp({}, 0i, i32({room})))", load(start, "0u"))
}

/// `len` elements of `axis` from the clamped run-time start.
fn narrow(
    axis: usize,
    len: usize,
    x: &Operand,
    start: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (_, xlen, inner) = split(x, axis)?;
    if !(1..=xlen.n).contains(&len) || out.shape.get(axis) != Some(&len) {
        return Err(format!("narrow of {len} does not fit axis {axis} of {:?}", x.shape));
    }
    let len = out.dim(axis);
    let body = format!(
        "{}
    let s = {};
    {}",
        decompose(&len, &inner),
        clamped_start(start, &xlen.sub(&len)),
        store(out, "i", &load(x, &format!("(o * {xlen} + a + s) * {inner} + r")))
    );
    Ok(elementwise(out.numel(), width, &body, ""))
}

/// `(len, inner, w)` of a scatter of `src` into `x` along `axis`: x's axis length and the
/// elements past it, and the window's length; an error unless src fits in x.
fn scatter_geometry(axis: usize, x: &Operand, src: &Operand) -> Result<(Ext, Ext, Ext), String> {
    let (_, len, inner) = split(x, axis)?;
    let (_, w, src_inner) = split(src, axis)?;
    if !(1..=len.n).contains(&w.n) || src_inner.n != inner.n {
        return Err(format!(
            "slice_scatter of {:?} does not fit {:?} along axis {axis}",
            src.shape, x.shape
        ));
    }
    Ok((len, inner, w))
}

/// `[x, src, start]` → `x` with `src` over the clamped window of `axis`: each output element
/// reads `src` inside the window and `x` elsewhere (no in-place write, so `x` stays as it was
/// for every other reader).
fn slice_scatter(
    axis: usize,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (x, src, start) = (&inputs[0], &inputs[1], &inputs[2]);
    let (len, inner, w) = scatter_geometry(axis, x, src)?;
    let body = format!(
        "{}
    let s = {};
    if (a >= s && a < s + {w}) {{
        {}
    }} else {{
        {}
    }}",
        decompose(&len, &inner),
        clamped_start(start, &len.sub(&w)),
        store(out, "i", &load(src, &format!("(o * {w} + (a - s)) * {inner} + r"))),
        store(out, "i", &load(x, "i")),
    );
    Ok(elementwise(out.numel(), width, &body, ""))
}

/// `slice_scatter` into x's own words (`GpuOp::ScatterInPlace`: the output's region is x's):
/// one invocation per element of src, each writing its element where the window lands; the
/// rest of x is left as it is. With `rope`, src's element rotated (`rope_value`) is written:
/// the keys' rotary embedding and their cache write, one dispatch.
pub(super) fn scatter_in_place(
    axis: usize,
    rope: Option<&Op>,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (x, src, start) = (&inputs[0], &inputs[1], &inputs[2]);
    let (len, inner, w) = scatter_geometry(axis, x, src)?;
    if out.shape != x.shape {
        return Err(format!("slice_scatter in place of {:?} into {:?}", x.shape, out.shape));
    }
    let (value, rotation) = match rope {
        None => (load(src, "i"), String::new()),
        Some(Op::Rope { theta, offset, inverse }) => {
            let r = rope_value(*theta, *offset, *inverse, src, inputs.get(3))?;
            ("rope_v".to_string(), r)
        }
        Some(op) => return Err(format!("`{}` is no rotary embedding", op.describe())),
    };
    let body = format!(
        "{rotation}
    {}
    let s = {};
    {}",
        decompose(&w, &inner),
        clamped_start(start, &len.sub(&w)),
        store(out, &format!("(o * {len} + s + a) * {inner} + r"), &value),
    );
    Ok(elementwise(src.numel(), width, &body, ""))
}

/// `index_select`; an index outside the axis gives 0 (the CPU refuses it).
fn gather(
    axis: usize,
    x: &Operand,
    index: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (_, len, inner) = split(x, axis)?;
    let m = index.numel();
    let body = format!(
        "{}
    let j = i32({});
    if (j < 0 || j >= i32({len})) {{
        {}
    }} else {{
        {}
    }}",
        decompose(&m, &inner),
        load(index, "a"),
        store(out, "i", "0"),
        store(out, "i", &load(x, &format!("(o * {len} + u32(j)) * {inner} + r"))),
    );
    Ok(elementwise(out.numel(), width, &body, ""))
}

/// Scatter-add without atomics: element `(o, a, r)` sums `dy` over every index position equal to
/// `a`, in ascending position order (the CPU's order, and the same on every run). Positions whose
/// index is outside the axis match no element and are dropped.
///
/// Rows wide enough to fill a workgroup (an embedding table's gradient) take `gather_grad_rows`;
/// narrow ones, one invocation per element scanning every position.
fn gather_grad(
    axis: usize,
    index: &Operand,
    dy: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (outer, len, inner) = split(out, axis)?;
    let m = index.numel();
    if inner.n >= (width / 4) as usize && width.is_power_of_two() {
        return Ok(gather_grad_rows(outer.n, len.n, inner.n, &m, index, dy, out, width));
    }
    let body = format!(
        "{}
    var acc = 0.0;
    for (var k = 0u; k < {m}; k = k + 1u) {{
        if (i32({}) == i32(a)) {{
            acc = acc + f32({});
        }}
    }}
    {}",
        decompose(&len, &inner),
        load(index, "k"),
        load(dy, &format!("(o * {m} + k) * {inner} + r")),
        store(out, "i", "acc"),
    );
    Ok(elementwise(out.numel(), width, &body, ""))
}

/// One workgroup per output row `(o, a)` and block of `width` columns. The workgroup reads the
/// index positions `width` at a time; when the block holds a match, a prefix sum lists the
/// matches in order in shared memory, and each invocation adds its column of `dy` for the listed
/// positions only. The
/// one-invocation-per-element kernel reads every position for every element: for MiniLM's
/// 30,522 × 384 word-embedding gradient over 1,024 tokens that was 1.2·10¹⁰ reads (7 ms on an
/// H200); this reads each position once per row block (6·10⁷) plus `dy` once per match.
#[allow(clippy::too_many_arguments)]
fn gather_grad_rows(
    outer: usize,
    len: usize,
    inner: usize,
    m: &Ext,
    index: &Operand,
    dy: &Operand,
    out: &Operand,
    width: u32,
) -> KernelSource {
    let blocks = inner.div_ceil(width as usize);
    let rows = outer * len * blocks;
    let body = format!(
        "var<workgroup> count: array<u32, {width}>;
var<workgroup> hits: array<u32, {width}>;
var<workgroup> any: u32;
@compute @workgroup_size({width})
fn main(@builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) grid: vec3<u32>, \
    @builtin(local_invocation_index) lid: u32) {{
    let id = wg.x + (wg.y + wg.z * grid.y) * grid.x;
    if (id >= {rows}u) {{ return; }}
    let row = id / {blocks}u;
    let o = row / {len}u;
    let a = i32(row % {len}u);
    let r = (id % {blocks}u) * {width}u + lid;
    if (lid == 0u) {{ any = 0u; }}
    workgroupBarrier();
    var acc = 0.0;
    for (var k0 = 0u; k0 < {m}; k0 = k0 + {width}u) {{
        let k = k0 + lid;
        var hit = 0u;
        if (k < {m}) {{
            if (i32({idx}) == a) {{
                hit = 1u;
                any = 1u;
            }}
        }}
        // Most blocks match nothing (a vocabulary row is rarely among a batch's tokens): one
        // barrier tells, and the prefix sum below runs only for blocks with a match.
        if (workgroupUniformLoad(&any) == 1u) {{
            // Inclusive prefix sum of the block's matches (Hillis–Steele).
            count[lid] = hit;
            workgroupBarrier();
            for (var step = 1u; step < {width}u; step = step << 1u) {{
                var v = count[lid];
                if (lid >= step) {{ v = v + count[lid - step]; }}
                workgroupBarrier();
                count[lid] = v;
                workgroupBarrier();
            }}
            if (hit == 1u) {{ hits[count[lid] - 1u] = k; }}
            let found = count[{last}u];
            workgroupBarrier();
            if (r < {inner}u) {{
                for (var h = 0u; h < found; h = h + 1u) {{
                    acc = acc + f32({dyv});
                }}
            }}
            // Cleared before the barrier that ends the block: the next block's matches set \
               it after.
            if (lid == 0u) {{ any = 0u; }}
            workgroupBarrier();
        }}
    }}
    if (r < {inner}u) {{
        let i = (o * {len}u + u32(a)) * {inner}u + r;
        {st}
    }}
}}
",
        last = width - 1,
        idx = load(index, "k"),
        dyv = load(dy, &format!("(o * {m} + hits[h]) * {inner}u + r")),
        st = store(out, "i", "acc"),
    );
    KernelSource { body, invocations: rows as u64 * width as u64, dropout_node: None, width: None }
}

/// `[x, y, dy]` → dx; max/min route `dy` to the first (row-major) element of each reduced group
/// equal to the result, found by scanning the group's elements before this one.
fn reduce_grad(
    op: ReduceOp,
    axes: &[usize],
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (x, y, dy) = (&inputs[0], &inputs[1], &inputs[2]);
    let shape = &x.shape;
    if let Some(&a) = axes.iter().find(|&&a| a >= shape.len()) {
        return Err(format!("axis {a} is out of range for shape {shape:?}"));
    }
    let n: usize = shape.iter().product();
    let kept: Vec<usize> =
        shape.iter().enumerate().map(|(a, &d)| if axes.contains(&a) { 1 } else { d }).collect();
    let xs = strides(shape);
    let ks = strides(&kept);
    let coord = |a: usize| format!("((i / {}u) % {}u)", xs[a], shape[a]);
    let oi: Vec<String> = (0..shape.len())
        .filter(|a| !axes.contains(a) && shape[*a] != 1)
        .map(|a| format!("{} * {}u", coord(a), ks[a]))
        .collect();
    let oi = if oi.is_empty() { "0u".to_string() } else { oi.join(" + ") };
    let count: usize = axes.iter().map(|&a| shape[a]).product();
    let body = match op {
        ReduceOp::Sum => format!("let oi = {oi};\n    {}", store(out, "i", &load(dy, "oi"))),
        ReduceOp::Mean => format!(
            "let oi = {oi};\n    {}",
            store(out, "i", &format!("{} / {count}.0", load(dy, "oi")))
        ),
        ReduceOp::Max | ReduceOp::Min => {
            // The group's elements in row-major order: position r over the reduced axes.
            let rshape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
            let mut order: Vec<usize> = (0..axes.len()).collect();
            order.sort_by_key(|&j| axes[j]);
            let sorted: Vec<usize> = order.iter().map(|&j| axes[j]).collect();
            let sshape: Vec<usize> = order.iter().map(|&j| rshape[j]).collect();
            let rs = strides(&sshape);
            let mine: Vec<String> = sorted
                .iter()
                .enumerate()
                .map(|(j, &a)| format!("{} * {}u", coord(a), rs[j]))
                .collect();
            let back: Vec<String> =
                sorted.iter().map(|&a| format!("{} * {}u", coord(a), xs[a])).collect();
            let off: Vec<String> = sorted
                .iter()
                .enumerate()
                .map(|(j, &a)| format!("((r / {}u) % {}u) * {}u", rs[j], sshape[j], xs[a]))
                .collect();
            let join = |v: Vec<String>| if v.is_empty() { "0u".to_string() } else { v.join(" + ") };
            format!(
                "let oi = {oi};
    let yv = {yv};
    let xv = {xi};
    let mine = {mine};
    let base = i - ({back});
    var hit = xv == yv || (xv != xv && yv != yv);
    for (var r = 0u; r < mine && hit; r = r + 1u) {{
        let v = {xr};
        if (v == yv || (v != v && yv != yv)) {{ hit = false; }}
    }}
    if (hit) {{
        {st}
    }} else {{
        {zero}
    }}",
                yv = load(y, "oi"),
                xi = load(x, "i"),
                mine = join(mine),
                back = join(back),
                xr = load(x, &format!("base + {}", join(off))),
                st = store(out, "i", &load(dy, "oi")),
                zero = store(out, "i", "0"),
            )
        }
    };
    Ok(elementwise(n, width, &body, ""))
}

/// Index of the first maximum along `axis` (NaN counts as the maximum, as on the CPU).
fn argmax(axis: usize, x: &Operand, out: &Operand, width: u32) -> Result<KernelSource, String> {
    let (_, len, inner) = split(x, axis)?;
    let body = format!(
        "let base = (i / {inner}) * {run} + i % {inner};
    var best = 0u;
    var bv = {first};
    for (var k = 1u; k < {len}; k = k + 1u) {{
        if (bv != bv) {{ break; }}
        let v = {at};
        if (v > bv || v != v) {{
            best = k;
            bv = v;
        }}
    }}
    {st}",
        run = len.mul(&inner),
        first = load(x, "base"),
        at = load(x, &format!("base + k * {inner}")),
        st = store(out, "i", "i32(best)"),
    );
    Ok(elementwise(out.numel(), width, &body, ""))
}

/// `freq / 2π` turns as a 64-bit binary fraction, high word first: the bits a kernel multiplies
/// by a whole position to get the phase modulo one turn exactly (the fraction's own error, from
/// f64, is below 2⁻⁵⁰ turn).
fn turns_fixed_point(freq: f64) -> (u32, u32) {
    let turns = (freq / std::f64::consts::TAU).fract();
    let scaled = turns * 4294967296.0;
    let hi = scaled.floor();
    ((hi as u64 & 0xffff_ffff) as u32, ((scaled - hi) * 4294967296.0).floor() as u32)
}

/// HF `rotate_half` rope on `[.., T, D]`. With `start` (decoding), every position moves by that
/// run-time word, a negative one counting as 0 as on the CPU.
///
/// The angle is `position · inv_freq`, which an f32 product would get wrong by up to half an
/// ulp of the angle (1.5e-5 at position 300, 1e-4 at 2,048), and GPUs' `sin` and `cos` are
/// accurate only within [−π, π]. So the kernel works in turns, in fixed point: each frequency
/// over 2π is baked in as a 64-bit binary fraction (`inv_freq` in f64 here, two words), and
/// `position × fraction` modulo 1 is integer arithmetic on wrapping u32s — only carries out of
/// the low word's partial products are dropped, at most 2 units of 2⁻³² turn. The angle, within
/// [−π, π), then goes to `sin` and `cos`: about 1e-6 from the CPU's f64 at any position.
fn rope(
    theta: f64,
    offset: usize,
    inverse: bool,
    x: &Operand,
    start: Option<&Operand>,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let n = out.numel();
    if n.n == 0 {
        return Ok(elementwise(n, width, "", ""));
    }
    let body = rope_value(theta, offset, inverse, x, start)?;
    Ok(elementwise(n, width, &format!("{body}\n    {}", store(out, "i", "rope_v")), ""))
}

/// WGSL lines that give `rope_v` the value of element `i` of x rotated (`Op::Rope`): its
/// angle from its position along x's `T` axis (plus the offset and the run-time start), its
/// partner the element half a row away. In a block of their own, so that a kernel that writes
/// the value elsewhere (`scatter_in_place`) keeps its own names.
pub(super) fn rope_value(
    theta: f64,
    offset: usize,
    inverse: bool,
    x: &Operand,
    start: Option<&Operand>,
) -> Result<String, String> {
    let r = x.shape.len();
    if r < 2 || !x.shape[r - 1].is_multiple_of(2) || x.shape[r - 1] == 0 {
        return Err(format!("rope needs [.., T, D] with an even D, found {:?}", x.shape));
    }
    let (t_len, d) = (x.dim(r - 2), x.shape[r - 1]);
    let half = d / 2;
    let (mut hi, mut lo) = (Vec::new(), Vec::new());
    for i in 0..half {
        let (h, l) = turns_fixed_point(theta.powf(-2.0 * i as f64 / d as f64));
        hi.push(format!("{h}u"));
        lo.push(format!("{l}u"));
    }
    let sign = if inverse { "-" } else { "" };
    let moved = match start {
        Some(s) => format!(" + u32(max({}, 0i))", load(s, "0u")),
        None => String::new(),
    };
    Ok(format!(
        "var rope_v = 0.0;
    {{
    var turn_hi = array<u32, {half}u>({hi});
    var turn_lo = array<u32, {half}u>({lo});
    let col = i % {d}u;
    let t = (i / {d}u) % {t_len};
    let p = col % {half}u;
    let pos = {offset}u{moved} + t;
    let low = turn_lo[p];
    let carry = (low >> 16u) * (pos >> 16u) + (((low >> 16u) * (pos & 0xffffu)) >> 16u) \
        + (((low & 0xffffu) * (pos >> 16u)) >> 16u);
    let phase = pos * turn_hi[p] + carry;
    let angle = f32(bitcast<i32>(phase)) * 1.4629180792671596e-9;
    let c = cos(angle);
    let s = {sign}sin(angle);
    if (col < {half}u) {{
        rope_v = {} * c - {} * s;
    }} else {{
        rope_v = {} * c + {} * s;
    }}
    }}",
        load(x, "i"),
        load(x, &format!("i + {half}u")),
        load(x, "i"),
        load(x, &format!("i - {half}u")),
        hi = hi.join(", "),
        lo = lo.join(", "),
    ))
}

#[cfg(test)]
mod tests {
    use super::turns_fixed_point;

    /// The rope kernel's phase arithmetic on the host, u32 for u32: the 64-bit fraction is
    /// `freq / 2π` to f64's precision (and the fraction's last bit), and the kernel's product
    /// drops at most a few units of 2⁻³² turn against exact 128-bit integer arithmetic, at any
    /// position.
    #[test]
    fn the_fixed_point_phase_is_exact_at_any_position() {
        let cases = [(10000.0f64, 0, 64), (10000.0, 5, 64), (100000.0, 31, 64), (500.0, 1, 4)];
        for (theta, i, d) in cases {
            let freq = theta.powf(-2.0 * i as f64 / d as f64);
            let (hi, lo) = turns_fixed_point(freq);
            let fraction = ((hi as u64) << 32) | lo as u64;
            let turns = freq / std::f64::consts::TAU;
            let got = fraction as f64 / 2f64.powi(64);
            assert!(
                (got - turns).abs() <= turns * 1e-15 + 2f64.powi(-63),
                "{theta} {i}: {got:e} vs {turns:e}"
            );
            for pos in [0u32, 1, 7, 300, 2047, 65535, 65536, 1_000_003, 4_000_000_000] {
                let carry = (lo >> 16)
                    .wrapping_mul(pos >> 16)
                    .wrapping_add(((lo >> 16) * (pos & 0xffff)) >> 16)
                    .wrapping_add(((lo & 0xffff) * (pos >> 16)) >> 16);
                let phase = pos.wrapping_mul(hi).wrapping_add(carry);
                let exact = ((pos as u128 * fraction as u128) >> 32) as u32;
                assert!(exact.wrapping_sub(phase) <= 2, "theta {theta} i {i} pos {pos}");
            }
        }
    }
}
