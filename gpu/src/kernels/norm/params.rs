//! Weight and bias derivatives of the norms, reduced over rows: layer and RMS norm by blocks of
//! columns (`column_grad`) or by chunks of rows (`weight_grad_partial`), group norm's weight
//! per channel.

use super::rows::row_kernel;
use super::{batch_layout, group_rows, kernel, lanes_for, last_axis_rows, lit, seg_reduce};
use super::{square_helper, strided, Mode, Rows, Stats};
use crate::kernels::{load, store, KernelSource, Operand};
use mgn_ir::op::GradPart;

/// Layer and RMS norm derivatives: the input's row by row, the weight's and bias's by column
/// blocks (`column_grad`).
pub(super) fn last_axis_grad(
    inputs: &[Operand],
    out: &Operand,
    eps: f64,
    center: bool,
    has_weight: bool,
    part: GradPart,
    width: usize,
) -> Result<KernelSource, String> {
    let x = &inputs[0];
    let dy = &inputs[inputs.len() - 1];
    let rows = last_axis_rows(x)?;
    if part == GradPart::Input {
        return Ok(row_kernel(
            &rows,
            x,
            Some(dy),
            &Stats::Batch { center },
            eps,
            Mode::Input { w: has_weight.then(|| &inputs[1]) },
            out,
            width,
        ));
    }
    Ok(column_grad(&rows, x, dy, center, eps, part, out, width))
}

/// `Σ_rows dy·x̂` (weight) or `Σ_rows dy` (bias) per column: a workgroup owns up to 32
/// consecutive columns (one 128-byte line per row) and its `width / 32` row lanes stride over
/// the rows. For the weight, each tile of rows first gets its statistics, every row from the 32
/// invocations of its lane; the partial sums of a column then merge across row lanes.
#[allow(clippy::too_many_arguments)]
fn column_grad(
    rows: &Rows,
    x: &Operand,
    dy: &Operand,
    center: bool,
    eps: f64,
    part: GradPart,
    out: &Operand,
    width: usize,
) -> KernelSource {
    let (d, count) = (rows.len, &rows.count);
    let cl = lanes_for(d, width.min(32));
    let rl = width / cl;
    let at = |r: &str, c: &str| format!("({r}) * {d}u + ({c})");
    let mut helpers = String::new();
    let mut body = format!(
        "let lane = tid % {cl}u;
    let rlane = tid / {cl}u;
    let c = wid * {cl}u + lane;
    let cv = c < {d}u;
    "
    );
    if part == GradPart::Bias {
        body += &strided("acc", "rlane", rl, count.clone(), "cv", |r| {
            format!("vec4<f32>({}, 0.0, 0.0, 0.0)", load(dy, &at(r, "c")))
        });
    } else {
        helpers += &square_helper(x);
        let mean = if center {
            format!(
                "{}{}let m = r1.x / f32({d}u);",
                strided("s1", "lane", cl, d, "rv", |t| format!(
                    "vec4<f32>({}, 0.0, 0.0, 0.0)",
                    load(x, &at("r", t))
                )),
                seg_reduce("r1", "s1", "lane", cl, 1)
            )
        } else {
            "let m = 0.0;".into()
        };
        body += &format!(
            "var acc = vec4<f32>(0.0);
    for (var r0 = 0u; r0 < {count}; r0 = r0 + {rl}u) {{
    let r = r0 + rlane;
    let rv = r < {count};
    {mean}
    {var}{red}let rstd = 1.0 / sqrt(r2.x / f32({d}u) + {eps});
    if (rv && cv) {{
        let e = {e};
        acc.x = acc.x + {dye} * ({xe} - m) * rstd;
    }}
    }}
    ",
            var = strided("s2", "lane", cl, d, "rv", |t| format!("sq({}, m)", at("r", t))),
            red = seg_reduce("r2", "s2", "lane", cl, 1),
            eps = lit(eps),
            e = at("r", "c"),
            dye = load(dy, "e"),
            xe = load(x, "e"),
        );
    }
    body += &seg_reduce("tot", "acc", "rlane", rl, cl);
    body += &format!("if (rlane == 0u && cv) {{\n        {}\n    }}", store(out, "c", "tot.x"));
    kernel(width, d.div_ceil(cl), &helpers, &body)
}

/// `GpuOp::NormWeightGradPartial`: one workgroup per chunk of rows, all columns. The chunk goes a
/// tile of rows at a time: each row's statistics from its own lane group (as `column_grad`),
/// kept in shared memory, then every invocation adds `dy·x̂` of the tile's rows for its columns
/// (`tid`, `tid + width`, …) into registers; the chunk's sums are stored once at the end.
/// Compared with `column_grad`'s workgroup per 32 columns (12 workgroups for 384 columns, each
/// recomputing every row's statistics), each row's statistics are computed once and the rows
/// spread over as many workgroups as there are chunks.
pub(crate) fn weight_grad_partial(
    x: &Operand,
    dy: &Operand,
    eps: f64,
    center: bool,
    chunk: usize,
    out: &Operand,
    width: usize,
) -> Result<KernelSource, String> {
    let rows = last_axis_rows(x)?;
    if dy.shape != x.shape {
        return Err(format!("dy {:?} must have x's shape {:?}", dy.shape, x.shape));
    }
    let (d, count) = (rows.len, rows.count.n);
    let chunks = count.div_ceil(chunk.max(1));
    if chunk == 0 || out.shape != [chunks, d] {
        return Err(format!(
            "expected a chunk of at least one row and output [{chunks}, {d}], found chunk \
             {chunk} and {:?}",
            out.shape
        ));
    }
    let cols = d.div_ceil(width).max(1);
    let cl = lanes_for(d, width.min(32));
    let rl = width / cl;
    let at = |r: &str, t: &str| format!("({r}) * {d}u + ({t})");
    let mean = if center {
        format!(
            "{}{}let m = r1.x / f32({d}u);",
            strided("s1", "lane", cl, d, "rv", |t| format!(
                "vec4<f32>({}, 0.0, 0.0, 0.0)",
                load(x, &at("r", t))
            )),
            seg_reduce("r1", "s1", "lane", cl, 1)
        )
    } else {
        "let m = 0.0;".into()
    };
    let helpers = format!(
        "{}var<workgroup> tile_m: array<f32, {rl}>;\nvar<workgroup> tile_r: array<f32, {rl}>;\n",
        square_helper(x)
    );
    let body = format!(
        "var acc: array<f32, {cols}>;
    let lane = tid % {cl}u;
    let rlane = tid / {cl}u;
    let first = wid * {chunk}u;
    let last = min(first + {chunk}u, {count}u);
    for (var r0 = first; r0 < last; r0 = r0 + {rl}u) {{
    let r = r0 + rlane;
    let rv = r < last;
    {mean}
    {s2}{r2}if (lane == 0u) {{
        tile_m[rlane] = m;
        tile_r[rlane] = 1.0 / sqrt(r2.x / f32({d}u) + {eps});
    }}
    workgroupBarrier();
    for (var q = 0u; q < {rl}u; q = q + 1u) {{
        let rq = r0 + q;
        if (rq < last) {{
            let base = rq * {d}u;
            let mq = tile_m[q];
            let sq_ = tile_r[q];
            for (var j = 0u; j < {cols}u; j = j + 1u) {{
                let c = tid + j * {width}u;
                if (c < {d}u) {{
                    acc[j] = acc[j] + {dye} * ({xe} - mq) * sq_;
                }}
            }}
        }}
    }}
    workgroupBarrier();
    }}
    for (var j = 0u; j < {cols}u; j = j + 1u) {{
        let c = tid + j * {width}u;
        if (c < {d}u) {{
            {st}
        }}
    }}",
        s2 = strided("s2", "lane", cl, d, "rv", |t| format!("sq({}, m)", at("r", t))),
        r2 = seg_reduce("r2", "s2", "lane", cl, 1),
        eps = lit(eps),
        dye = load(dy, "base + c"),
        xe = load(x, "base + c"),
        st = store(out, &format!("wid * {d}u + c"), "acc[j]"),
    );
    Ok(kernel(width, chunks, &helpers, &body))
}

/// Group norm's weight derivative `Σ dy·x̂` per channel: one workgroup per channel loops over
/// the samples, computing each sample's group statistics with the whole workgroup (the other
/// channels of the group recompute them), then its channel's share.
pub(super) fn group_weight_grad(
    x: &Operand,
    dy: &Operand,
    groups: usize,
    eps: f64,
    out: &Operand,
    width: usize,
) -> Result<KernelSource, String> {
    let rows = group_rows(x, groups)?;
    let (n, c, s) = batch_layout(x)?;
    let (cpg, blen) = (c / groups, rows.len);
    let helpers = square_helper(x)
        + &format!(
            "fn gx(e: u32, m: f32, rstd: f32) -> vec4<f32> {{
    return vec4<f32>({dy} * ({x} - m) * rstd, 0.0, 0.0, 0.0);
}}
",
            x = load(x, "e"),
            dy = load(dy, "e"),
        );
    let body = format!(
        "let ch = wid;
    let g = ch / {cpg}u;
    var acc = vec4<f32>(0.0);
    for (var smp = 0u; smp < {n}u; smp = smp + 1u) {{
    let base = (smp * {groups}u + g) * {blen}u;
    let own = (smp * {c}u + ch) * {s}u;
    {s1}{r1}let m = r1.x / f32({blen}u);
    {s2}{r2}let rstd = 1.0 / sqrt(r2.x / f32({blen}u) + {eps});
    {s3}acc = acc + s3;
    }}
    {tot}if (tid == 0u) {{
        {st}
    }}",
        s1 = strided("s1", "tid", width, blen, "true", |t| format!(
            "vec4<f32>({}, 0.0, 0.0, 0.0)",
            load(x, &format!("base + {t}"))
        )),
        r1 = seg_reduce("r1", "s1", "tid", width, 1),
        s2 = strided("s2", "tid", width, blen, "true", |t| format!("sq(base + {t}, m)")),
        r2 = seg_reduce("r2", "s2", "tid", width, 1),
        s3 = strided("s3", "tid", width, s, "true", |t| format!("gx(own + {t}, m, rstd)")),
        eps = lit(eps),
        tot = seg_reduce("tot", "acc", "tid", width, 1),
        st = store(out, "ch", "tot.x"),
    );
    Ok(kernel(width, c, &helpers, &body))
}
