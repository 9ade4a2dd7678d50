//! Row kernels: cross-entropy (whole, or per row for the GPU's
//! `CrossEntropyRows`) and its gradient, and reductions. One workgroup owns one row (or one
//! reduced output): its invocations stride over the row — coalesced where the row is
//! contiguous — combine in shared memory, and then the same workgroup writes the row.
//! Computing a row's statistics once per element instead (what these kernels replaced) costs
//! O(row²) per row: 6·10¹¹ operations for SmolLM2's 49,152-way loss gradient.

use super::{load, store, Ext, KernelSource, Operand, FILL};

/// The workgroup skeleton: `red` (one f32 per invocation), `wg_sum` / `wg_max` (every invocation
/// gets the combined value; call them in uniform control flow), and `r`, the row of this
/// workgroup; workgroups past `rows` leave together, before any barrier.
fn row_kernel(rows: impl Into<Ext>, width: u32, body: &str) -> KernelSource {
    let half = width / 2;
    let shared = format!(
        "var<workgroup> red: array<f32, {width}>;
fn wg_sum(lid: u32, v: f32) -> f32 {{
    red[lid] = v;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ red[lid] = red[lid] + red[lid + s]; }}
        workgroupBarrier();
    }}
    let total = red[0];
    workgroupBarrier();
    return total;
}}
fn wg_max(lid: u32, v: f32) -> f32 {{
    red[lid] = v;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if (lid < s) {{ red[lid] = max(red[lid], red[lid + s]); }}
        workgroupBarrier();
    }}
    let best = red[0];
    workgroupBarrier();
    return best;
}}
fn wg_min(lid: u32, v: f32) -> f32 {{
    return -wg_max(lid, -v);
}}"
    );
    workgroup_per_row(rows, width, &shared, body)
}

/// One workgroup per row `r` (of `rows`), with `shared` declared at module scope; workgroups
/// past `rows` leave together, before any barrier.
pub(super) fn workgroup_per_row(
    rows: impl Into<Ext>,
    width: u32,
    shared: &str,
    body: &str,
) -> KernelSource {
    let rows = rows.into();
    KernelSource {
        body: format!(
            "{shared}
@compute @workgroup_size({width})
fn main(@builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) grid: vec3<u32>, \
    @builtin(local_invocation_index) lid: u32) {{
    let r = wg.x + (wg.y + wg.z * grid.y) * grid.x;
    if (r >= {rows}) {{ return; }}
    {body}
}}
"
        ),
        invocations: rows.n as u64 * width as u64,
        dropout_node: None,
        width: None,
    }
}

/// `for t in this invocation's elements of the row { … }` with `e`, the element's index.
fn each(len: &Ext, stride: &Ext, width: u32, body: &str) -> String {
    format!(
        "for (var t = lid; t < {len}; t = t + {width}u) {{\n        \
         let e = base + t * {stride};\n        {body}\n    }}"
    )
}

/// `m`, the row's maximum of `value` (an expression of the element index `e`), and `s`, the
/// sum of `exp(value − m)`: what softmax and cross-entropy need of a row.
fn max_and_sum(len: &Ext, stride: &Ext, width: u32, value: &str) -> String {
    format!(
        "var mi = -3.4028235e38;
    {}
    let m = wg_max(lid, mi);
    var si = 0.0;
    {}
    let s = wg_sum(lid, si);",
        each(len, stride, width, &format!("mi = max(mi, {value});")),
        each(len, stride, width, &format!("si = si + exp({value} - m);")),
    )
}

/// The mean loss over all rows: one workgroup, row after row (the loss is one number and there
/// is no scratch to combine workgroups in); each row's reductions are parallel.
pub(super) fn cross_entropy(
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (logits, targets) = (&inputs[0], &inputs[1]);
    let c = &logits.dim(logits.shape.len().checked_sub(1).ok_or("logits need a class axis")?);
    let rows = targets.numel();
    let body = format!(
        "var total = 0.0;
    for (var row = 0u; row < {rows}; row = row + 1u) {{
        let base = row * {c};
        {stats}
        let tgt = u32({tg});
        total = total + (m + log(s) - {lt});
    }}
    if (lid == 0u) {{ {st} }}",
        stats = max_and_sum(c, &Ext::lit(1), width, &load(logits, "e")),
        tg = load(targets, "row"),
        lt = load(logits, "base + tgt"),
        st = store(out, "0u", &format!("total / f32({rows})")),
    );
    Ok(row_kernel(1, width, &body))
}

/// `GpuOp::CrossEntropyRows`: one workgroup per row, storing the row's
/// `m + log(s) − logit[target]`.
pub(super) fn cross_entropy_rows(
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (logits, targets) = (&inputs[0], &inputs[1]);
    let c = &logits.dim(logits.shape.len().checked_sub(1).ok_or("logits need a class axis")?);
    let rows = targets.numel();
    if out.shape.iter().product::<usize>() != rows.n
        || logits.shape.iter().product::<usize>() != rows.n * c.n
    {
        return Err(format!(
            "logits {:?}, targets {:?} and output {:?} disagree on the rows",
            logits.shape, targets.shape, out.shape
        ));
    }
    let body = format!(
        "let base = r * {c};
    {stats}
    let tgt = u32({tg});
    if (lid == 0u) {{ {st} }}",
        stats = max_and_sum(c, &Ext::lit(1), width, &load(logits, "e")),
        tg = load(targets, "r"),
        st = store(out, "r", &format!("m + log(s) - {}", load(logits, "base + tgt"))),
    );
    Ok(row_kernel(rows, width, &body))
}

pub(super) fn cross_entropy_grad(
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (logits, targets, dl) = (&inputs[0], &inputs[1], &inputs[2]);
    let c = &logits.dim(logits.shape.len().checked_sub(1).ok_or("logits need a class axis")?);
    let rows = targets.numel();
    let one = &Ext::lit(1);
    let body = format!(
        "let base = r * {c};
    {stats}
    let tgt = u32({tg});
    let scale = {dl} / f32({rows});
    {write}",
        stats = max_and_sum(c, one, width, &load(logits, "e")),
        tg = load(targets, "r"),
        dl = load(dl, "0u"),
        write = each(
            c,
            one,
            width,
            &store(
                out,
                "e",
                &format!(
                    "(exp({} - m) / s - select(0.0, 1.0, t == tgt)) * scale",
                    load(logits, "e")
                )
            )
        ),
    );
    Ok(row_kernel(rows, width, &body))
}

/// How a reduction combines: its per-invocation step, identity, the workgroup combine and the
/// final expression of the combined `acc`.
pub(super) struct Combine {
    pub step: &'static str,
    pub init: &'static str,
    pub across: &'static str,
    pub result: String,
}

impl Combine {
    /// Two partial results combined, as WGSL.
    fn merge(&self, a: &str, b: &str) -> String {
        match self.across {
            "wg_max" => format!("max({a}, {b})"),
            "wg_min" => format!("min({a}, {b})"),
            _ => format!("{a} + {b}"),
        }
    }
}

/// Whether reducing `reduced` leaves `x` as `[count, n]` in memory: every reduced axis (of
/// size above 1) before every kept one, as a bias's derivative sums over the rows before it.
fn reduces_leading_axes(shape: &[usize], reduced: &[usize]) -> bool {
    let mut kept_seen = false;
    for (a, &d) in shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        if reduced.contains(&a) {
            if kept_seen {
                return false;
            }
        } else {
            kept_seen = true;
        }
    }
    true
}

/// Column reductions of `x` as `[count, n]`: a workgroup owns `cols` consecutive outputs, so
/// each of its loads reads consecutive words, and its `width / cols` lanes split the rows
/// (more lanes and fewer columns per workgroup when the columns alone would leave the GPU
/// idle); the lanes combine in shared memory.
fn column_reduce(x: &Operand, out: &Operand, count: &Ext, c: &Combine, width: u32) -> KernelSource {
    let n = out.numel();
    let w = width as usize;
    // Eight consecutive columns still read whole 32-byte sectors; fewer only when there are
    // fewer outputs than that.
    let least = n.n.next_power_of_two().min(8);
    let mut cols = w;
    while cols > least && n.n.div_ceil(cols) < FILL && w / cols < count.n.next_power_of_two() {
        cols /= 2;
    }
    let lanes = w / cols;
    let mut tree = String::new();
    let mut half = lanes / 2;
    while half > 0 {
        tree.push_str(&format!(
            "    if (lane < {half}u) {{ red[lid] = {}; }}\n    workgroupBarrier();\n",
            c.merge("red[lid]", &format!("red[lid + {}u]", half * cols))
        ));
        half /= 2;
    }
    let body = format!(
        "let col = r * {cols}u + lid % {cols}u;
    let lane = lid / {cols}u;
    var acc = {init};
    if (col < {n}) {{
        for (var t = lane; t < {count}; t = t + {lanes}u) {{
            let v = {value};
            {step}
        }}
    }}
    red[lid] = acc;
    workgroupBarrier();
{tree}    if (lane == 0u && col < {n}) {{
        acc = red[lid];
        {store}
    }}",
        init = c.init,
        value = load(x, &format!("t * {n} + col")),
        step = c.step,
        store = store(out, "col", &c.result),
    );
    row_kernel(n.n.div_ceil(cols), width, &body)
}

/// Reduces `x` over the `reduced` axes into `out`; `keep` is `out`'s shape padded to `x`'s
/// rank (1 on reduced axes). Over leading axes: by columns (`column_reduce`). Otherwise short
/// reductions take one invocation per output walking its elements, long ones one workgroup per
/// output.
pub(super) fn reduce(
    x: &Operand,
    out: &Operand,
    keep: &[Ext],
    reduced: &[usize],
    c: &Combine,
    width: u32,
) -> Result<KernelSource, String> {
    let n = out.numel();
    let dims = x.dims();
    let xs = Ext::strides(&dims);
    let ks = Ext::strides(keep);
    let base: Vec<String> = (0..x.shape.len())
        .filter(|a| !reduced.contains(a))
        .map(|a| format!("((o / {}) % {}) * {}", ks[a], keep[a], xs[a]))
        .collect();
    let base = if base.is_empty() { "0u".to_string() } else { base.join(" + ") };
    let rshape: Vec<Ext> = reduced.iter().map(|&a| dims[a].clone()).collect();
    let count = Ext::product(&rshape);
    let rs = Ext::strides(&rshape);
    let offset: Vec<String> = reduced
        .iter()
        .enumerate()
        .map(|(j, &a)| format!("((t / {}) % {}) * {}", rs[j], rshape[j], xs[a]))
        .collect();
    let value = load(
        x,
        &format!(
            "base + {}",
            if offset.is_empty() { "0u".to_string() } else { offset.join(" + ") }
        ),
    );
    let (step, init, result) = (c.step, c.init, &c.result);
    // Integers take one invocation per output: the workgroup paths combine in f32.
    let float = x.dtype.is_float();
    if float && count.n >= 32 && reduces_leading_axes(&x.shape, reduced) {
        return Ok(column_reduce(x, out, &count, c, width));
    }
    // One invocation per output when the outputs alone fill the GPU or each sums only a few
    // elements; else a workgroup per output (a convolution bias's derivative: 128 channels of
    // 512 elements each took 18 µs one invocation a channel, 14 GB/s, on the H200).
    if !float || count.n < 64 || n.n >= 4096 {
        let body = format!(
            "let o = i;
    let base = {base};
    var acc = {init};
    for (var t = 0u; t < {count}; t = t + 1u) {{
        let v = {value};
        {step}
    }}
    {}",
            store(out, "i", result),
        );
        return Ok(super::elementwise(n, width, &body, ""));
    }
    let body = format!(
        "let o = r;
    let base = {base};
    var acc = {init};
    for (var t = lid; t < {count}; t = t + {width}u) {{
        let v = {value};
        {step}
    }}
    acc = {across}(lid, acc);
    if (lid == 0u) {{ {} }}",
        store(out, "o", result),
        across = c.across,
    );
    Ok(row_kernel(n, width, &body))
}
