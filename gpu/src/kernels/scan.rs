//! Scans and selections along an axis: `cumsum`, `topk`, `take_along` and its derivative.
//!
//! A tensor is `[outer, len, inner]` around the axis and each `(outer, inner)` pair is a row.
//! Short rows take one invocation each; long ones one workgroup, which walks the row in chunks
//! of its width, so any length is handled. Out-of-range indices: the CPU refuses them; here, as
//! for `gather`, `take_along` reads 0 and its derivative drops them, never reading outside a
//! tensor.

use super::{base, elementwise, load, store, KernelSource, Operand};

/// `(outer, len, inner)` around `axis`.
fn split(shape: &[usize], axis: usize) -> Result<(usize, usize, usize), String> {
    if axis >= shape.len() {
        return Err(format!("axis {axis} is out of range for shape {shape:?}"));
    }
    Ok((shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product()))
}

use super::rows::workgroup_per_row as row_kernel;

/// Rows up to this long take one invocation each.
const SHORT: usize = 64;

/// Running sums along `axis`. A long row goes chunk by chunk: each chunk is scanned in
/// workgroup memory (Hillis–Steele) and added to the running total of the chunks before it.
pub(super) fn cumsum(
    axis: usize,
    reverse: bool,
    x: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (outer, len, inner) = split(&x.shape, axis)?;
    let ty = if x.dtype.is_float() { "f32" } else { "i32" };
    let rows = outer * inner;
    // Element `j` of the row in scan order.
    let pos = |j: &str| match reverse {
        true => format!("row + ({}u - {j}) * {inner}u", len - 1),
        false => format!("row + {j} * {inner}u"),
    };
    let row = format!("let row = (r / {inner}u) * {}u + r % {inner}u;", len * inner);
    if len <= SHORT || rows >= 4096 {
        let body = format!(
            "let r = i;
    {row}
    var acc = {ty}(0);
    for (var j = 0u; j < {len}u; j = j + 1u) {{
        acc = acc + {};
        {}
    }}",
            load(x, &pos("j")),
            store(out, &pos("j"), "acc")
        );
        return Ok(elementwise(rows, width, &body, ""));
    }
    let body = format!(
        "{row}
    var carry = {ty}(0);
    for (var c = 0u; c < {len}u; c = c + {width}u) {{
        let j = c + lid;
        var v = {ty}(0);
        if (j < {len}u) {{ v = {load}; }}
        part[lid] = v;
        workgroupBarrier();
        for (var s = 1u; s < {width}u; s = s << 1u) {{
            var add = {ty}(0);
            if (lid >= s) {{ add = part[lid - s]; }}
            workgroupBarrier();
            part[lid] = part[lid] + add;
            workgroupBarrier();
        }}
        if (j < {len}u) {{ {store} }}
        carry = carry + part[{last}u];
        workgroupBarrier();
    }}",
        load = load(x, &pos("j")),
        store = store(out, &pos("j"), "carry + part[lid]"),
        last = width - 1,
    );
    Ok(row_kernel(rows, width, &format!("var<workgroup> part: array<{ty}, {width}>;"), &body))
}

/// The order `topk` ranks by, as a u32 key of an element's word: for floats the IEEE total
/// order with every NaN on top and −0 equal to +0, for integers their order. A larger key, or
/// an equal key at a lower position, ranks first.
fn key_fn(float: bool) -> &'static str {
    if float {
        "fn mgn_key(w: u32) -> u32 {
    let m = w & 0x7FFFFFFFu;
    if (m > 0x7F800000u) { return 0xFFFFFFFFu; }
    if (m == 0u) { return 0x80000000u; }
    return select(w | 0x80000000u, ~w, (w >> 31u) == 1u);
}
fn mgn_first(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}
"
    } else {
        "fn mgn_key(w: u32) -> u32 {
    return w ^ 0x80000000u;
}
fn mgn_first(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}
"
    }
}

/// The positions of the `k` largest elements of each row, largest first: `k` rounds, each
/// finding the best element ranked below the previous round's pick (one invocation per short
/// row; for a long one, every invocation of its workgroup over a stride of the row, then a
/// tree over the workgroup).
pub(super) fn topk(
    k: usize,
    axis: usize,
    x: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (outer, len, inner) = split(&x.shape, axis)?;
    let rows = outer * inner;
    let row = format!("let row = (r / {inner}u) * {}u + r % {inner}u;", len * inner);
    let dest = format!("(r / {inner}u) * {}u + r % {inner}u + t * {inner}u", k * inner);
    let scan = |start: &str, step: &str| {
        format!(
            "var ck = 0u;
        var ci = 0xFFFFFFFFu;
        for (var j = {start}; j < {len}u; j = j + {step}) {{
            let kj = mgn_key(arena[{x} + row + j * {inner}u]);
            let below = t == 0u || kj < pk || (kj == pk && j > pi);
            if (below && mgn_first(kj, j, ck, ci)) {{ ck = kj; ci = j; }}
        }}",
            x = base(x)
        )
    };
    if len <= SHORT || rows >= 4096 {
        let body = format!(
            "let r = i;
    {row}
    var pk = 0u;
    var pi = 0u;
    for (var t = 0u; t < {k}u; t = t + 1u) {{
        {}
        pk = ck;
        pi = ci;
        {}
    }}",
            scan("0u", "1u"),
            store(out, &dest, "pi")
        );
        return Ok(elementwise(rows, width, &body, key_fn(x.dtype.is_float())));
    }
    let body = format!(
        "{row}
    var pk = 0u;
    var pi = 0u;
    for (var t = 0u; t < {k}u; t = t + 1u) {{
        {}
        bk[lid] = ck;
        bi[lid] = ci;
        workgroupBarrier();
        for (var s = {half}u; s > 0u; s = s >> 1u) {{
            if (lid < s && mgn_first(bk[lid + s], bi[lid + s], bk[lid], bi[lid])) {{
                bk[lid] = bk[lid + s];
                bi[lid] = bi[lid + s];
            }}
            workgroupBarrier();
        }}
        pk = bk[0];
        pi = bi[0];
        if (lid == 0u) {{ {} }}
        workgroupBarrier();
    }}",
        scan("lid", &format!("{width}u")),
        store(out, &dest, "pi"),
        half = width / 2,
    );
    let shared = format!(
        "var<workgroup> bk: array<u32, {width}>;\nvar<workgroup> bi: array<u32, {width}>;\n{}",
        key_fn(x.dtype.is_float())
    );
    Ok(row_kernel(rows, width, &shared, &body))
}

/// `x` read along `axis` at `index` (one invocation per output element).
pub(super) fn take_along(
    axis: usize,
    x: &Operand,
    index: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (_, len, inner) = split(&x.shape, axis)?;
    let k = index.shape.get(axis).copied().ok_or("the index has too few axes")?;
    let n: usize = out.shape.iter().product();
    let body = format!(
        "let o = i / {run}u;
    let q = i % {inner}u;
    let j = {};
    if (j < 0 || j >= {len}i) {{
        {}
    }} else {{
        {}
    }}",
        load(index, "i"),
        store(out, "i", "0"),
        store(out, "i", &load(x, &format!("(o * {len}u + u32(j)) * {inner}u + q"))),
        run = k * inner,
    );
    Ok(elementwise(n, width, &body, ""))
}

/// `[index, dy]` → dx: element `(o, a, q)` sums `dy` over the positions along the axis whose
/// index is `a`, in ascending order (the CPU's), without atomics.
pub(super) fn take_along_grad(
    axis: usize,
    index: &Operand,
    dy: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (_, len, inner) = split(&out.shape, axis)?;
    let k = index.shape.get(axis).copied().ok_or("the index has too few axes")?;
    let n: usize = out.shape.iter().product();
    let at = format!("o * {}u + t * {inner}u + q", k * inner);
    let body = format!(
        "let o = i / {run}u;
    let a = i32((i / {inner}u) % {len}u);
    let q = i % {inner}u;
    var acc = 0.0;
    for (var t = 0u; t < {k}u; t = t + 1u) {{
        if ({} == a) {{ acc = acc + {}; }}
    }}
    {}",
        load(index, &at),
        load(dy, &at),
        store(out, "i", "acc"),
        run = len * inner,
    );
    Ok(elementwise(n, width, &body, ""))
}
