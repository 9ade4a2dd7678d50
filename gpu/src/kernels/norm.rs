//! Normalizations (layer, RMS, group, batch) with their derivatives, and dropout.
//!
//! Same semantics as `cpu/norm.rs`: a norm sees `x` as rows, each normalized with its own
//! biased-variance statistics (layer and RMS norm: the last axis; group norm: one group of one
//! sample; batch norm: one channel across batch and space); `x̂ = (x − mean)·rstd`, the output
//! `x̂·w + b`, and with `g = dy·w` the input derivative is `rstd·(g − mean(g) − x̂·mean(g·x̂))`
//! (RMS norm: no mean, no `mean(g)` term; batch norm's is the same with `w` constant per row).
//!
//! Every kernel hands a row to the `L` invocations of one workgroup (`L` the row length rounded
//! up to a power of two, at most the width, so short rows share a workgroup): they stride over
//! the row with four loads in flight (consecutive invocations, consecutive words), tree-reduce
//! their partial sums in shared memory, and then write the row's outputs. Statistics are two
//! passes in f32 — the mean, then `Σ(x − mean)²` — so a large mean costs no precision; the
//! input derivative folds `Σg` and `Σg·(x − mean)` into the variance pass, so it reads the row
//! three times (mean, sums, output) and the forward likewise.
//!
//! Weight and bias derivatives reduce over rows per parameter. Batch norm's parameter is its row,
//! so one workgroup per channel reduces `Σdy` and `Σdy·x̂` as above. Layer and RMS norm: one
//! workgroup per block of up to 32 consecutive columns, its invocations striding over rows; the
//! weight needs every row's statistics, which each column block recomputes per tile of rows. The
//! GPU session replaces that weight derivative, past 8 rows, by `NormWeightGradPartial` (one
//! workgroup per chunk of rows computing each row's statistics once, `weight_grad_partial`) and
//! a sum over the chunks (`gpu/norm_partials.rs`). Group norm's weight: one workgroup
//! per channel, looping over samples with each sample's group statistics computed by the whole
//! workgroup; its bias is a plain per-channel sum.
//!
//! `BatchNorm` forward and dropout are dispatched from `kernels/mod.rs`, which knows the plan's
//! mode (`batch_norm`, `dropout` here). Inference batch norm (forward and input derivative) uses
//! the running statistics and is elementwise. Dropout's mask is the CPU's `dropout_keep(seed,
//! node, index, p)`: the per-run part (`dropout_key`) arrives in the parameter block.

use super::{elementwise, load, store, KernelSource, Operand};
use mgn_ir::op::{GradPart, Op};
use mgn_ir::plan::Step;

/// Kernels for the norms and their derivatives, and dropout with the CPU backend's mask (`cpu::dropout_keep`).
pub fn generate(
    step: &Step,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let unsupported =
        |why: &str| Err(format!("`{}` has no GPU kernel yet ({why})", step.op.describe()));
    if !out.dtype.is_float() {
        return unsupported("integer output");
    }
    let w = width as usize;
    let dy = inputs.last().expect("norms have inputs");
    match &step.op {
        Op::LayerNorm { eps, has_weight, has_bias } => {
            let rows = last_axis_rows(&inputs[0])?;
            let (wt, bs) = affine(inputs, 1, *has_weight, *has_bias);
            Ok(row_kernel(
                &rows,
                &inputs[0],
                None,
                &Stats::Batch { center: true },
                *eps,
                Mode::Forward { w: wt, b: bs },
                out,
                w,
            ))
        }
        Op::RmsNorm { eps, has_weight } => {
            let rows = last_axis_rows(&inputs[0])?;
            let (wt, _) = affine(inputs, 1, *has_weight, false);
            Ok(row_kernel(
                &rows,
                &inputs[0],
                None,
                &Stats::Batch { center: false },
                *eps,
                Mode::Forward { w: wt, b: None },
                out,
                w,
            ))
        }
        Op::GroupNorm { groups, eps, has_weight, has_bias } => {
            let rows = group_rows(&inputs[0], *groups)?;
            let (wt, bs) = affine(inputs, 1, *has_weight, *has_bias);
            Ok(row_kernel(
                &rows,
                &inputs[0],
                None,
                &Stats::Batch { center: true },
                *eps,
                Mode::Forward { w: wt, b: bs },
                out,
                w,
            ))
        }
        Op::LayerNormGrad { eps, has_weight, has_bias, part } => {
            check_part(*part, *has_weight, *has_bias)?;
            last_axis_grad(inputs, out, *eps, true, *has_weight, *part, w)
        }
        Op::RmsNormGrad { eps, has_weight, part } => {
            check_part(*part, *has_weight, false)?;
            last_axis_grad(inputs, out, *eps, false, *has_weight, *part, w)
        }
        Op::GroupNormGrad { groups, eps, has_weight, has_bias, part } => {
            check_part(*part, *has_weight, *has_bias)?;
            let x = &inputs[0];
            match part {
                GradPart::Input => {
                    let rows = group_rows(x, *groups)?;
                    let wt = has_weight.then(|| &inputs[1]);
                    Ok(row_kernel(
                        &rows,
                        x,
                        Some(dy),
                        &Stats::Batch { center: true },
                        *eps,
                        Mode::Input { w: wt },
                        out,
                        w,
                    ))
                }
                GradPart::Weight => group_weight_grad(x, dy, *groups, *eps, out, w),
                _ => {
                    group_rows(x, *groups)?;
                    Ok(row_kernel(
                        &channel_rows(x)?,
                        x,
                        Some(dy),
                        &Stats::Batch { center: true },
                        *eps,
                        Mode::Param(GradPart::Bias),
                        out,
                        w,
                    ))
                }
            }
        }
        Op::BatchNormGrad { eps, has_weight, has_bias, part, training } => {
            check_part(*part, *has_weight, *has_bias)?;
            batch_norm_grad(inputs, out, *eps, *has_weight, *part, *training, width)
        }
        Op::NormWeightGradPartial { eps, center, chunk } => {
            weight_grad_partial(&inputs[0], dy, *eps, *center, *chunk, out, w)
        }
        Op::BatchNorm { .. } => unsupported(
            "its statistics depend on the plan's mode, which the generator does not receive",
        ),
        Op::Dropout { .. } | Op::DropoutGrad { .. } => {
            unsupported("the mask needs the run's seed, which does not reach the kernel")
        }
        _ => unsupported("not a norm"),
    }
}

fn check_part(part: GradPart, has_weight: bool, has_bias: bool) -> Result<(), String> {
    match part {
        GradPart::Input => Ok(()),
        GradPart::Weight if has_weight => Ok(()),
        GradPart::Bias if has_bias => Ok(()),
        _ => Err(format!("has no {part:?} input to differentiate")),
    }
}

/// An f32 WGSL literal of `v`.
fn lit(v: f64) -> String {
    format!("f32({:e})", v)
}

/// The weight and bias among `inputs` (from `first`), when present.
fn affine(
    inputs: &[Operand],
    first: usize,
    has_weight: bool,
    has_bias: bool,
) -> (Option<&Operand>, Option<&Operand>) {
    (has_weight.then(|| &inputs[first]), has_bias.then(|| &inputs[first + has_weight as usize]))
}

/// A WGSL expression of a row and an element of it (both WGSL expressions).
type Expr2 = Box<dyn Fn(&str, &str) -> String>;

/// How a norm sees `x`: `count` rows of `len` elements, each normalized on its own.
struct Rows {
    count: usize,
    len: usize,
    /// The arena index (relative to `x`) of element `t` of row `b`.
    index: Expr2,
    /// The affine parameter of element `t` of row `b`.
    param: Expr2,
}

/// Layer and RMS norm: rows of the last axis.
fn last_axis_rows(x: &Operand) -> Result<Rows, String> {
    let d = *x.shape.last().ok_or("needs at least one axis, found a scalar")?;
    let count = x.shape[..x.shape.len() - 1].iter().product();
    Ok(Rows {
        count,
        len: d,
        index: Box::new(move |b, t| format!("({b}) * {d}u + ({t})")),
        param: Box::new(|_, t| t.to_string()),
    })
}

/// Group norm: `x: [N, C, S...]`; row `b` is group `b % G` of sample `b / G` (its channels are
/// contiguous); the parameter of an element is its channel.
fn group_rows(x: &Operand, groups: usize) -> Result<Rows, String> {
    let (n, c, s) = batch_layout(x)?;
    if groups == 0 || c % groups != 0 {
        return Err(format!("cannot split {c} channels into {groups} groups"));
    }
    let cpg = c / groups;
    let len = cpg * s;
    Ok(Rows {
        count: n * groups,
        len,
        index: Box::new(move |b, t| format!("({b}) * {len}u + ({t})")),
        param: Box::new(move |b, t| format!("(({b}) % {groups}u) * {cpg}u + ({t}) / {s}u")),
    })
}

/// Batch norm (and group norm's bias): row `b` is channel `b` across batch and space; element
/// `t` is sample `t / S`, position `t % S`.
fn channel_rows(x: &Operand) -> Result<Rows, String> {
    let (n, c, s) = batch_layout(x)?;
    let index: Expr2 = if s == 1 {
        Box::new(move |b, t| format!("({t}) * {c}u + ({b})"))
    } else {
        Box::new(move |b, t| format!("((({t}) / {s}u) * {c}u + ({b})) * {s}u + ({t}) % {s}u"))
    };
    Ok(Rows { count: c, len: n * s, index, param: Box::new(|b, _| b.to_string()) })
}

/// `x: [N, C, ...]` as (N, C, spatial size).
fn batch_layout(x: &Operand) -> Result<(usize, usize, usize), String> {
    if x.shape.len() < 2 {
        return Err(format!("needs [N, C, ...], found {:?}", x.shape));
    }
    Ok((x.shape[0], x.shape[1], x.shape[2..].iter().product()))
}

/// Where a row's mean and variance come from.
enum Stats {
    /// The row's own (biased variance); without `center` the mean is 0 (RMS norm).
    Batch { center: bool },
    /// WGSL expressions of the row `bc` (batch norm's running statistics).
    Given { mean: String, var: String },
}

/// What a row kernel writes.
enum Mode<'a> {
    /// `x̂·w + b` per element.
    Forward { w: Option<&'a Operand>, b: Option<&'a Operand> },
    /// The input derivative per element, with `g = dy·w`.
    Input { w: Option<&'a Operand> },
    /// One value per row: `Σdy·x̂` (weight) or `Σdy` (bias) — batch norm's parameter is its row.
    Param(GradPart),
}

/// Invocations that share a row of `len`: a power of two, at most the width.
fn lanes_for(len: usize, width: usize) -> usize {
    len.max(1).next_power_of_two().min(width)
}

/// Declares `var {acc}: vec4<f32>` = Σ `term(t)` over `t = start, start + step, … < len` when
/// `guard` holds (else 0). Four independent partial sums keep four loads in flight per invocation.
fn strided(
    acc: &str,
    start: &str,
    step: usize,
    len: usize,
    guard: &str,
    term: impl Fn(&str) -> String,
) -> String {
    let mut s =
        format!("var {acc} = vec4<f32>(0.0);\n    if ({guard}) {{\n        var t = {start};\n");
    if len >= 4 * step {
        s += &format!(
            "        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        for (; t + {s3}u < {len}u; t = t + {s4}u) {{
            {acc} = {acc} + {t0};
            a1 = a1 + {t1};
            a2 = a2 + {t2};
            a3 = a3 + {t3};
        }}
        {acc} = ({acc} + a1) + (a2 + a3);
",
            s3 = 3 * step,
            s4 = 4 * step,
            t0 = term("t"),
            t1 = term(&format!("t + {step}u")),
            t2 = term(&format!("t + {}u", 2 * step)),
            t3 = term(&format!("t + {}u", 3 * step)),
        );
    }
    s += &format!("        for (; t < {len}u; t = t + {step}u) {{\n            {acc} = {acc} + {};\n        }}\n    }}\n    ", term("t"));
    s
}

/// Sums `value` over the `count` invocations (a power of two) whose ids differ by multiples of
/// `stride` and whose index among them is `member`, by a tree in `red`; every one of them gets
/// the total as `let {name}`. Must run in uniform control flow (it has barriers).
fn seg_reduce(name: &str, value: &str, member: &str, count: usize, stride: usize) -> String {
    let mut s = format!("red[tid] = {value};\n    workgroupBarrier();\n    ");
    let mut half = count / 2;
    while half >= 1 {
        s += &format!("if ({member} < {half}u) {{\n        red[tid] = red[tid] + red[tid + {}u];\n    }}\n    workgroupBarrier();\n    ", half * stride);
        half /= 2;
    }
    // The barrier after the read: the next reduction overwrites `red`.
    s += &format!("let {name} = red[tid - {member} * {stride}u];\n    workgroupBarrier();\n    ");
    s
}

/// `groups` workgroups of `width` with the reduction array; `wid` the linear workgroup id, and
/// workgroups past the last leave together.
fn kernel(width: usize, groups: usize, helpers: &str, body: &str) -> KernelSource {
    KernelSource {
        body: format!(
            "{helpers}var<workgroup> red: array<vec4<f32>, {width}>;

@compute @workgroup_size({width})
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {{
    let wid = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    if (wid >= {groups}u) {{
        return;
    }}
    {body}
}}
"
        ),
        invocations: groups as u64 * width as u64,
        dropout_node: None,
    }
}

/// One row per `lanes_for(len)` invocations: the mean, then one pass for the variance with (for
/// derivatives) `Σg` and `Σg·(x − mean)`, then the outputs. `dy` is given for derivatives.
#[allow(clippy::too_many_arguments)]
fn row_kernel(
    rows: &Rows,
    x: &Operand,
    dy: Option<&Operand>,
    stats: &Stats,
    eps: f64,
    mode: Mode,
    out: &Operand,
    width: usize,
) -> KernelSource {
    let (len, count) = (rows.len, rows.count);
    let l = lanes_for(len, width);
    let per = width / l;
    let n = format!("f32({len}u)");
    let mut helpers = format!("fn at(b: u32, t: u32) -> u32 {{\n    return {};\n}}\nfn prm(b: u32, t: u32) -> u32 {{\n    return {};\n}}\n", (rows.index)("b", "t"), (rows.param)("b", "t"));
    let mut body = format!(
        "let lane = tid % {l}u;
    let b = wid * {per}u + tid / {l}u;
    let valid = b < {count}u;
    let bc = min(b, {}u);
    ",
        count.max(1) - 1
    );
    let bias = matches!(mode, Mode::Param(GradPart::Bias));
    let center = matches!(stats, Stats::Batch { center: true });
    match stats {
        Stats::Batch { center: true } if !bias => {
            body += &strided("s1", "lane", l, len, "valid", |t| {
                format!("vec4<f32>({}, 0.0, 0.0, 0.0)", load(x, &format!("at(b, {t})")))
            });
            body += &seg_reduce("r1", "s1", "lane", l, 1);
            body += &format!("let m = r1.x / {n};\n    ");
        }
        Stats::Given { mean, .. } => body += &format!("let m = {mean};\n    "),
        _ => body += "let m = 0.0;\n    ",
    }
    // The derivative's `g` of element `e` (in row `b` at `t`).
    let g = |e: &str, t: &str| match &mode {
        Mode::Input { w: Some(w) } => Some(format!(
            "{} * {}",
            load(dy.expect("derivatives have dy"), e),
            load(w, &format!("prm(b, {t})"))
        )),
        Mode::Input { w: None } | Mode::Param(_) => Some(load(dy.expect("derivatives have dy"), e)),
        Mode::Forward { .. } => None,
    };
    let batch = matches!(stats, Stats::Batch { .. });
    if batch || g("e", "t").is_some() {
        let sq = if batch && !bias { "d * d" } else { "0.0" };
        let d = if bias { "0.0".to_string() } else { format!("{} - m", load(x, "e")) };
        let gv = g("e", "t").unwrap_or("0.0".into());
        helpers += &format!(
            "fn p2(b: u32, t: u32, m: f32) -> vec4<f32> {{
    let e = at(b, t);
    let d = {d};
    let g = {gv};
    return vec4<f32>({sq}, g, g * d, 0.0);
}}
"
        );
        body += &strided("s2", "lane", l, len, "valid", |t| format!("p2(b, {t}, m)"));
        body += &seg_reduce("r2", "s2", "lane", l, 1);
    }
    match stats {
        Stats::Batch { .. } => {
            body += &format!("let rstd = 1.0 / sqrt(r2.x / {n} + {});\n    ", lit(eps))
        }
        Stats::Given { var, .. } => {
            body += &format!("let rstd = 1.0 / sqrt({var} + {});\n    ", lit(eps))
        }
    }
    let each = |value: &str| {
        format!("if (valid) {{\n        for (var t = lane; t < {len}u; t = t + {l}u) {{\n            let e = at(b, t);\n            {}\n        }}\n    }}", store(out, "e", value))
    };
    let tail = match &mode {
        Mode::Forward { w, b } => {
            let mut y = format!("({} - m) * rstd", load(x, "e"));
            if let Some(w) = w {
                y = format!("{y} * {}", load(w, "prm(b, t)"));
            }
            if let Some(bias) = b {
                y = format!("{y} + {}", load(bias, "prm(b, t)"));
            }
            each(&y)
        }
        Mode::Input { .. } => {
            let mg = if center { format!("r2.y / {n}") } else { "0.0".into() };
            let gi = g("e", "t").expect("derivatives have dy");
            body += &format!("let mg = {mg};\n    let mgx = r2.z * rstd / {n};\n    ");
            each(&format!("rstd * ({gi} - mg - ({} - m) * rstd * mgx)", load(x, "e")))
        }
        Mode::Param(part) => {
            let v = if *part == GradPart::Bias { "r2.y" } else { "r2.z * rstd" };
            format!("if (valid && lane == 0u) {{\n        {}\n    }}", store(out, "b", v))
        }
    };
    body += &tail;
    kernel(width, count.div_ceil(per), &helpers, &body)
}

/// Layer and RMS norm derivatives: the input's row by row, the weight's and bias's by column
/// blocks (`column_grad`).
fn last_axis_grad(
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
    let (d, count) = (rows.len, rows.count);
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
        body += &strided("acc", "rlane", rl, count, "cv", |r| {
            format!("vec4<f32>({}, 0.0, 0.0, 0.0)", load(dy, &at(r, "c")))
        });
    } else {
        helpers += &format!("fn sq(e: u32, m: f32) -> vec4<f32> {{\n    let d = {} - m;\n    return vec4<f32>(d * d, 0.0, 0.0, 0.0);\n}}\n", load(x, "e"));
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
    for (var r0 = 0u; r0 < {count}u; r0 = r0 + {rl}u) {{
    let r = r0 + rlane;
    let rv = r < {count}u;
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

/// `Op::NormWeightGradPartial`: one workgroup per chunk of rows, all columns. The chunk goes a
/// tile of rows at a time: each row's statistics from its own lane group (as `column_grad`),
/// kept in shared memory, then every invocation adds `dy·x̂` of the tile's rows for its columns
/// (`tid`, `tid + width`, …) into registers; the chunk's sums are stored once at the end.
/// Compared with `column_grad`'s workgroup per 32 columns (12 workgroups for 384 columns, each
/// recomputing every row's statistics), each row's statistics are computed once and the rows
/// spread over as many workgroups as there are chunks.
fn weight_grad_partial(
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
    let (d, count) = (rows.len, rows.count);
    let chunks = count.div_ceil(chunk.max(1));
    if chunk == 0 || out.shape != [chunks, d] {
        return Err(format!("expected a chunk of at least one row and output [{chunks}, {d}], found chunk {chunk} and {:?}", out.shape));
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
        "fn sq(e: u32, m: f32) -> vec4<f32> {{\n    let d = {} - m;\n    return vec4<f32>(d * d, 0.0, 0.0, 0.0);\n}}\nvar<workgroup> tile_m: array<f32, {rl}>;\nvar<workgroup> tile_r: array<f32, {rl}>;\n",
        load(x, "e")
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
fn group_weight_grad(
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
    let helpers = format!(
        "fn sq(e: u32, m: f32) -> vec4<f32> {{
    let d = {x} - m;
    return vec4<f32>(d * d, 0.0, 0.0, 0.0);
}}
fn gx(e: u32, m: f32, rstd: f32) -> vec4<f32> {{
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

/// Running statistics must be `[C]`.
fn check_running(inputs: &[Operand], c: usize) -> Result<(), String> {
    if inputs[1].shape != [c] || inputs[2].shape != [c] {
        return Err(format!(
            "running statistics must have shape [{c}], found {:?} and {:?}",
            inputs[1].shape, inputs[2].shape
        ));
    }
    Ok(())
}

/// The statistics of a batch norm: the batch's per channel when training (which needs more
/// than one value per channel), else the running ones (inputs 1 and 2) of row `bc`.
fn batch_stats(inputs: &[Operand], training: bool) -> Result<Stats, String> {
    let (n, c, s) = batch_layout(&inputs[0])?;
    check_running(inputs, c)?;
    if !training {
        return Ok(Stats::Given { mean: load(&inputs[1], "bc"), var: load(&inputs[2], "bc") });
    }
    if n * s <= 1 {
        return Err(format!("training needs more than one value per channel, found input shape [{n}, {c}, ..] with {s} per sample"));
    }
    Ok(Stats::Batch { center: true })
}

/// `1/sqrt(running_var[c] + eps)` and the channel `c` of element `i`, for the elementwise
/// inference kernels.
fn running(inputs: &[Operand], eps: f64) -> Result<(String, String), String> {
    let (_, c, s) = batch_layout(&inputs[0])?;
    Ok((
        format!(
            "let c = (i / {s}u) % {c}u;\n    let rstd = 1.0 / sqrt({} + {});",
            load(&inputs[2], "c"),
            lit(eps)
        ),
        load(&inputs[1], "c"),
    ))
}

/// Batch norm forward, inputs `x, running_mean, running_var, weight?, bias?`: batch statistics
/// (a workgroup per channel) when `training`, else the running ones (elementwise).
pub(super) fn batch_norm(
    inputs: &[Operand],
    out: &Operand,
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    training: bool,
    width: u32,
) -> Result<KernelSource, String> {
    let x = &inputs[0];
    let stats = batch_stats(inputs, training)?;
    let (w, b) = affine(inputs, 3, has_weight, has_bias);
    if training {
        return Ok(row_kernel(
            &channel_rows(x)?,
            x,
            None,
            &stats,
            eps,
            Mode::Forward { w, b },
            out,
            width as usize,
        ));
    }
    let (pre, mean) = running(inputs, eps)?;
    let mut y = format!("({} - {mean}) * rstd", load(x, "i"));
    if let Some(w) = w {
        y = format!("{y} * {}", load(w, "c"));
    }
    if let Some(b) = b {
        y = format!("{y} + {}", load(b, "c"));
    }
    Ok(elementwise(
        out.shape.iter().product(),
        width,
        &format!("{pre}\n    {}", store(out, "i", &y)),
        "",
    ))
}

/// Inputs `x, running_mean, running_var, weight?, bias?, dy`. In training the batch statistics
/// depend on `x` (the full derivative); otherwise `dx = dy·w·rstd`, elementwise.
fn batch_norm_grad(
    inputs: &[Operand],
    out: &Operand,
    eps: f64,
    has_weight: bool,
    part: GradPart,
    training: bool,
    width: u32,
) -> Result<KernelSource, String> {
    let x = &inputs[0];
    let dy = &inputs[inputs.len() - 1];
    let stats = batch_stats(inputs, training)?;
    let w = has_weight.then(|| &inputs[3]);
    let rows = channel_rows(x)?;
    match part {
        GradPart::Input if !training => {
            let (pre, _) = running(inputs, eps)?;
            let scale = w.map_or("rstd".to_string(), |w| format!("rstd * {}", load(w, "c")));
            Ok(elementwise(
                out.shape.iter().product(),
                width,
                &format!("{pre}\n    {}", store(out, "i", &format!("{scale} * {}", load(dy, "i")))),
                "",
            ))
        }
        GradPart::Input => {
            Ok(row_kernel(&rows, x, Some(dy), &stats, eps, Mode::Input { w }, out, width as usize))
        }
        p => Ok(row_kernel(&rows, x, Some(dy), &stats, eps, Mode::Param(p), out, width as usize)),
    }
}

fn splitmix64(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64 on a u64 held as `vec2(lo, hi)` (WGSL has no 64-bit integers).
const SPLITMIX64: &str = "fn u64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn u64_shr(a: vec2<u32>, k: u32) -> vec2<u32> {
    return vec2<u32>((a.x >> k) | (a.y << (32u - k)), a.y >> k);
}
fn u32_mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu; let a1 = a >> 16u;
    let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((mid << 16u) | (p00 & 0xffffu), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
fn u64_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let w = u32_mul_wide(a.x, b.x);
    return vec2<u32>(w.x, w.y + a.x * b.y + a.y * b.x);
}
fn splitmix64(z0: vec2<u32>) -> vec2<u32> {
    var z = u64_add(z0, vec2<u32>(0x7F4A7C15u, 0x9E3779B9u));
    z = u64_mul(z ^ u64_shr(z, 30u), vec2<u32>(0x1CE4E5B9u, 0xBF58476Du));
    z = u64_mul(z ^ u64_shr(z, 27u), vec2<u32>(0x133111EBu, 0x94D049BBu));
    return z ^ u64_shr(z, 31u);
}
";

/// The per-run key of a dropout mask: `splitmix64(splitmix64(seed) ^ node)`, where `seed` is
/// the run's seed and `node` the forward step (the CPU backend's `dropout_keep` recipe). The
/// GPU session puts it in the kernel's parameter block before each run.
pub(crate) fn dropout_key(seed: u64, node: u32) -> u64 {
    splitmix64(splitmix64(seed) ^ node as u64)
}

/// Dropout of `x` (input 0) as the CPU draws it in training (for `DropoutGrad`, applied to `dy`
/// with the forward step's key): element `e` is kept when `(splitmix64(key ^ e) >> 11) / 2^53
/// >= p`, with `key` read from `params.p[0].xy` (see `dropout_key`) and the comparison done
/// exactly in integers: `h >= ceil(p·2^53)·2^11`.
pub(super) fn dropout(
    x: &Operand,
    out: &Operand,
    p: f64,
    width: u32,
) -> Result<KernelSource, String> {
    if !(0.0..1.0).contains(&p) {
        return Err(format!("dropout probability must be in [0, 1), found {p}"));
    }
    let n: usize = out.shape.iter().product();
    if n as u64 > u32::MAX as u64 {
        return Err(format!("{n} elements do not fit a u32 index"));
    }
    let threshold = ((p * (1u64 << 53) as f64).ceil() as u64) << 11;
    let body = format!(
        "let h = splitmix64(vec2<u32>(params.p[0].x ^ i, params.p[0].y));
    let keep = h.y > {thi}u || (h.y == {thi}u && h.x >= {tlo}u);
    {}",
        store(out, "i", &format!("select(0.0, {} * {}, keep)", load(x, "i"), lit(1.0 / (1.0 - p)))),
        tlo = threshold as u32,
        thi = (threshold >> 32) as u32,
    );
    Ok(elementwise(n, width, &body, SPLITMIX64))
}

/// The kernels not yet reachable from `generate` (batch-norm forward, dropout), run directly
/// on the device against the CPU.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GpuDevice;
    use crate::limits::fold_grid;
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;

    fn device() -> Option<GpuDevice> {
        crate::testing::or_skip(GpuDevice::open())
    }

    fn values(n: usize, seed: u32, shift: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32
                    / 1000.0
                    - 1.0
                    + shift
            })
            .collect()
    }

    /// Lays `inputs` out in an arena followed by the output, runs `make`'s kernel and returns
    /// the output with the inputs as tensors.
    fn run(
        dev: &mut GpuDevice,
        inputs: &[(Vec<usize>, f32)],
        out_shape: &[usize],
        make: impl Fn(&[Operand], &Operand, u32) -> KernelSource,
    ) -> (Vec<f32>, Vec<Tensor>) {
        run_with(dev, inputs, out_shape, [0u32; 32], None, make)
    }

    /// `width`: the workgroup width to generate for (the device's preferred when None).
    fn run_with(
        dev: &mut GpuDevice,
        inputs: &[(Vec<usize>, f32)],
        out_shape: &[usize],
        params: [u32; 32],
        width: Option<u32>,
        make: impl Fn(&[Operand], &Operand, u32) -> KernelSource,
    ) -> (Vec<f32>, Vec<Tensor>) {
        let mut offset = 0;
        let (mut ops, mut tensors) = (Vec::new(), Vec::new());
        for (k, (shape, shift)) in inputs.iter().enumerate() {
            let n: usize = shape.iter().product();
            tensors.push(Tensor::f32(shape.clone(), values(n, k as u32 * 977 + 5, *shift)));
            ops.push(Operand::at(offset, shape, DType::F32));
            offset += n;
        }
        let out = Operand::at(offset, out_shape, DType::F32);
        let n: usize = out_shape.iter().product();
        let width = width.unwrap_or(dev.limits.workgroup_width(256));
        let src = make(&ops, &out, width);
        let kernel = dev.kernel("norm_test", &src.body).expect("valid WGSL");
        let arena = dev.arena(offset + n).expect("fits");
        for (o, t) in ops.iter().zip(&tensors) {
            dev.write(
                &arena,
                o.offset,
                &t.to_f64_vec().iter().map(|&v| (v as f32).to_bits()).collect::<Vec<_>>(),
            )
            .expect("uploads");
        }
        let groups = fold_grid(src.invocations.div_ceil(width as u64), &dev.limits).expect("fits");
        dev.run(&arena, &[(&kernel, params, groups)]).expect("runs");
        (
            dev.read(&arena, offset, n).expect("reads").into_iter().map(f32::from_bits).collect(),
            tensors,
        )
    }

    fn close(what: &str, got: &[f32], want: &Tensor, tol: f64) {
        let want = want.to_f64_vec();
        assert_eq!(got.len(), want.len());
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a as f64 - b).abs() <= tol * (1.0 + b.abs()),
                "{what}: element {i}: gpu {a}, cpu {b}"
            );
        }
    }

    #[test]
    fn batch_norm_forward_matches_the_cpu_in_both_modes() {
        let Some(mut dev) = device() else { return };
        for x in [
            vec![4usize, 3, 5],
            vec![5, 3],
            vec![2, 3, 2, 3],
            vec![8, 3, 700],
            vec![300, 4],
            vec![3, 2, 1],
        ] {
            let c = vec![x[1]];
            for training in [true, false] {
                for (w, b) in [(false, false), (true, false), (false, true), (true, true)] {
                    let mut inputs = vec![(x.clone(), 0.0), (c.clone(), 0.0), (c.clone(), 1.5)];
                    if w {
                        inputs.push((c.clone(), 0.5));
                    }
                    if b {
                        inputs.push((c.clone(), 0.0));
                    }
                    let (got, tensors) = run(&mut dev, &inputs, &x, |ins, out, width| {
                        batch_norm(ins, out, 1e-5, w, b, training, width).expect("generates")
                    });
                    let op = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: w, has_bias: b };
                    let refs: Vec<&Tensor> = tensors.iter().collect();
                    let want = mgn_cpu::eval(
                        &op,
                        &refs,
                        DType::F32,
                        &x,
                        &mgn_cpu::Ctx { training, seed: 0, node: 0 },
                    )
                    .expect("cpu runs");
                    close(
                        &format!("batch_norm training={training} w={w} b={b} {x:?}"),
                        &got,
                        &want,
                        1e-4,
                    );
                }
            }
        }
    }

    #[test]
    fn dropout_draws_the_cpu_mask_exactly() {
        let Some(mut dev) = device() else { return };
        let x = vec![7usize, 301];
        for (p, seed, node) in [
            (0.5, 0u64, 0u32),
            (0.1, 0xDEAD_BEEF_0123_4567, 17),
            (0.9, u64::MAX, 3),
            (0.0, 42, 1),
            (0.3, 1 << 40, u32::MAX),
        ] {
            let key = dropout_key(seed, node);
            let mut params = [0u32; 32];
            params[0] = key as u32;
            params[1] = (key >> 32) as u32;
            let (got, tensors) =
                run_with(&mut dev, &[(x.clone(), 0.0)], &x, params, None, |ins, out, width| {
                    dropout(&ins[0], out, p, width).expect("generates")
                });
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let ctx = mgn_cpu::Ctx { training: true, seed, node };
            let want =
                mgn_cpu::eval(&Op::Dropout { p }, &refs, DType::F32, &x, &ctx).expect("cpu runs");
            let what = format!("dropout p={p} seed={seed} node={node}");
            close(&what, &got, &want, 1e-6);
            // The mask itself, exactly (inputs are never 0 here except by construction).
            for (i, (&g, w)) in got.iter().zip(want.to_f64_vec()).enumerate() {
                assert_eq!(g == 0.0, w == 0.0, "{what}: element {i} mask differs");
            }
            // DropoutGrad of the same forward step draws the same mask.
            let grad = mgn_cpu::eval(
                &Op::DropoutGrad { p, forward: node },
                &refs,
                DType::F32,
                &x,
                &mgn_cpu::Ctx { training: true, seed, node: 0 },
            )
            .expect("cpu runs");
            close(&format!("{what} (grad)"), &got, &grad, 1e-6);
        }
    }

    /// The row and column kernels at widths below the device's (down to one invocation): a row
    /// spans several workgroup widths, and a column block is narrower than 32.
    #[test]
    fn norm_kernels_hold_at_narrow_widths() {
        let Some(mut dev) = device() else { return };
        let g = |part| Op::LayerNormGrad { eps: 1e-5, has_weight: true, has_bias: true, part };
        let gn = |part| Op::GroupNormGrad {
            groups: 3,
            eps: 1e-5,
            has_weight: true,
            has_bias: true,
            part,
        };
        let bn = |part| Op::BatchNormGrad {
            eps: 1e-5,
            has_weight: true,
            has_bias: false,
            part,
            training: true,
        };
        let (ln, gx, bx) = (vec![9usize, 70], vec![2usize, 6, 50], vec![4usize, 3, 70]);
        // (op, input shapes, output shape)
        let cases: Vec<(Op, Vec<Vec<usize>>, Vec<usize>)> = vec![
            (g(GradPart::Input), vec![ln.clone(), vec![70], vec![70], ln.clone()], ln.clone()),
            (g(GradPart::Weight), vec![ln.clone(), vec![70], vec![70], ln.clone()], vec![70]),
            (g(GradPart::Bias), vec![ln.clone(), vec![70], vec![70], ln.clone()], vec![70]),
            (
                Op::RmsNorm { eps: 1e-6, has_weight: true },
                vec![vec![3, 300], vec![300]],
                vec![3, 300],
            ),
            (gn(GradPart::Input), vec![gx.clone(), vec![6], vec![6], gx.clone()], gx.clone()),
            (gn(GradPart::Weight), vec![gx.clone(), vec![6], vec![6], gx.clone()], vec![6]),
            (
                bn(GradPart::Input),
                vec![bx.clone(), vec![3], vec![3], vec![3], bx.clone()],
                bx.clone(),
            ),
            (
                bn(GradPart::Weight),
                vec![bx.clone(), vec![3], vec![3], vec![3], bx.clone()],
                vec![3],
            ),
        ];
        for width in [64u32, 32, 16, 4, 1] {
            for (op, shapes, out) in &cases {
                // Positive running variances (input 2 of batch norm); other inputs around 0.
                let inputs: Vec<(Vec<usize>, f32)> = shapes
                    .iter()
                    .enumerate()
                    .map(|(k, s)| {
                        (
                            s.clone(),
                            if k == 2 && matches!(op, Op::BatchNormGrad { .. }) {
                                1.5
                            } else {
                                0.0
                            },
                        )
                    })
                    .collect();
                let step = crate::test_util::step(
                    op.clone(),
                    (0..shapes.len() as u32).collect(),
                    DType::F32,
                    out,
                );
                let (got, tensors) =
                    run_with(&mut dev, &inputs, out, [0u32; 32], Some(width), |ins, o, w| {
                        generate(&step, ins, o, w).expect("generates")
                    });
                let refs: Vec<&Tensor> = tensors.iter().collect();
                let want = mgn_cpu::eval(
                    op,
                    &refs,
                    DType::F32,
                    out,
                    &mgn_cpu::Ctx { training: true, seed: 0, node: 0 },
                )
                .expect("cpu runs");
                close(&format!("{} at width {width}", op.describe()), &got, &want, 2e-4);
            }
        }
    }
}
