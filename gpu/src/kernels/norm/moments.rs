//! A training batch norm spread over the whole GPU (`rewrite::batch_moments`).
//!
//! The row kernel gives each channel one workgroup. In ResNet-50's first stages that is 64 to
//! 256 workgroups, each walking 12,544–50,176 values three times, on a GPU with 132 SMs. Here
//! each channel's values are cut into chunks (`GpuOp::BatchMoments`), and every kernel runs a
//! workgroup per chunk:
//! - `moments`: the chunk's mean and `Σ(x − mean)²`, over its own values (two passes; the
//!   second reads what the first brought into the cache);
//! - `grad_sums`: the chunk's `Σdy` and `Σdy·(x − mean)`, with the channel's mean;
//! - `forward` and `grad` of the input: each workgroup first combines its channel's chunks
//!   (Chan's formula: `M2 = Σ M2ₖ + nₖ·(meanₖ − mean)²`, so a large mean costs no precision),
//!   then writes its own chunk's results;
//! - `grad` of the weight or bias: a workgroup per channel adds up the sums (weight: `Σdy·x̂`,
//!   bias: `Σdy`).
//!
//! The forward reads x twice (moments, output) instead of three times, and the backward reads x
//! and dy twice each, instead of five and four times over three kernels.

use super::{channel_rows, kernel, lit, seg_reduce, square_helper, strided};
use crate::kernels::{load, store, Ext, KernelSource, Operand};
use mgn_ir::op::GradPart;

/// A batch norm's chunks: `channels`, `len` values per channel (samples × positions), in
/// `count` chunks of `chunk`.
struct Chunks {
    channels: usize,
    len: usize,
    chunk: usize,
    count: usize,
}

impl Chunks {
    fn of(x: &Operand, chunk: usize) -> Result<Chunks, String> {
        let [n, c, space @ ..] = &x.shape[..] else {
            return Err(format!("needs [N, C, ...], found {:?}", x.shape));
        };
        let len = n * space.iter().product::<usize>();
        if len <= 1 || chunk == 0 {
            return Err(format!(
                "training needs more than one value per channel and chunks of at least one, \
                 found input shape {:?} in chunks of {chunk}",
                x.shape
            ));
        }
        Ok(Chunks { channels: *c, len, chunk, count: len.div_ceil(chunk) })
    }

    /// `fn at(c, t)`, the index of value `t` of channel `c` in x.
    fn helpers(&self, x: &Operand) -> Result<String, String> {
        let rows = channel_rows(x)?;
        Ok(format!("fn at(c: u32, t: u32) -> u32 {{\n    return {};\n}}\n", (rows.index)("c", "t")))
    }

    /// WGSL naming the workgroup's channel `c`, its chunk `k` and the chunk's values
    /// `start..end`: a workgroup per chunk.
    fn per_chunk(&self) -> String {
        let Chunks { len, chunk, count, .. } = self;
        format!(
            "let c = wid / {count}u;
    let k = wid % {count}u;
    let start = k * {chunk}u;
    let end = min(start + {chunk}u, {len}u);
    "
        )
    }

    /// WGSL declaring `var {acc}: vec4<f32>` = Σ `term(t)` over the chunk's values this
    /// invocation owns (`strided`).
    fn sum(&self, acc: &str, width: usize, term: impl Fn(&str) -> String) -> String {
        strided(acc, "start + tid", width, Ext::varying(self.chunk, "end"), "true", term)
    }

    /// WGSL combining channel `c`'s chunks (every invocation gets the results): `mean` and the
    /// biased variance `var_b` from `moments`, and with `sums`, `sdy = Σdy` and
    /// `sdyx = Σdy·(x − mean)`. Without `variance`, only the mean (and the sums).
    fn combine(
        &self,
        moments: &Operand,
        sums: Option<&Operand>,
        variance: bool,
        width: usize,
    ) -> String {
        let Chunks { len, chunk, count, .. } = self;
        let at = |part: usize| format!("(c * {count}u + j) * 2u + {part}u");
        let (dy, dyx) = match sums {
            Some(s) => (load(s, &at(0)), load(s, &at(1))),
            None => ("0.0".into(), "0.0".into()),
        };
        let mut s = format!(
            "var first = vec4<f32>(0.0);
    for (var j = tid; j < {count}u; j = j + {width}u) {{
        let nj = f32(min({chunk}u, {len}u - j * {chunk}u));
        first = first + vec4<f32>(nj * {mean_j}, {dy}, {dyx}, 0.0);
    }}
    {reduce}let mean = r_first.x / f32({len}u);
    let sdy = r_first.y;
    let sdyx = r_first.z;
    ",
            mean_j = load(moments, &at(0)),
            reduce = seg_reduce("r_first", "first", "tid", width, 1),
        );
        if variance {
            s += &format!(
                "var second = vec4<f32>(0.0);
    for (var j = tid; j < {count}u; j = j + {width}u) {{
        let nj = f32(min({chunk}u, {len}u - j * {chunk}u));
        let d = {mean_j} - mean;
        second.x = second.x + {m2_j} + nj * d * d;
    }}
    {reduce}let var_b = r_second.x / f32({len}u);
    ",
                mean_j = load(moments, &at(0)),
                m2_j = load(moments, &at(1)),
                reduce = seg_reduce("r_second", "second", "tid", width, 1),
            );
        }
        s
    }

    /// WGSL storing `value(e)` at every value `e` of the workgroup's chunk this invocation
    /// owns, four at a time: the four values are loaded before any is stored (every operand
    /// lives in the one arena, so a load after a store cannot be moved before it).
    fn each(&self, width: usize, out: &Operand, value: impl Fn(&str) -> String) -> String {
        let (mut lets, mut stores) = (String::new(), String::new());
        for q in 0..4 {
            lets += &format!(
                "let e{q} = at(c, t + {}u);
        ",
                q * width
            );
            lets += &format!(
                "let v{q} = {};
        ",
                value(&format!("e{q}"))
            );
            stores += &format!(
                "{}
        ",
                store(out, &format!("e{q}"), &format!("v{q}"))
            );
        }
        format!(
            "var t = start + tid;
    for (; t + {w3}u < end; t = t + {w4}u) {{
        {lets}{stores}}}
    for (; t < end; t = t + {width}u) {{
        let e = at(c, t);
        {one}
    }}
",
            w3 = 3 * width,
            w4 = 4 * width,
            one = store(out, "e", &value("e")),
        )
    }
}

/// WGSL in which invocation 0 stores the workgroup's chunk's pair `(a, b)` (chunk `wid`).
fn store_pair(out: &Operand, a: &str, b: &str) -> String {
    format!(
        "if (tid == 0u) {{\n        {}\n        {}\n    }}",
        store(out, "wid * 2u", a),
        store(out, "wid * 2u + 1u", b)
    )
}

/// `GpuOp::BatchMoments`: per chunk of each channel, its mean and `Σ(x − mean)²`.
pub(crate) fn moments(
    x: &Operand,
    chunk: usize,
    out: &Operand,
    width: usize,
) -> Result<KernelSource, String> {
    let ch = Chunks::of(x, chunk)?;
    let mut body = ch.per_chunk();
    body += &ch.sum("s", width, |t| {
        format!("vec4<f32>({}, 0.0, 0.0, 0.0)", load(x, &format!("at(c, {t})")))
    });
    body += &seg_reduce("r1", "s", "tid", width, 1);
    body += "let m = r1.x / f32(end - start);\n    ";
    body += &ch.sum("q", width, |t| format!("sq(at(c, {t}), m)"));
    body += &seg_reduce("r2", "q", "tid", width, 1);
    body += &store_pair(out, "m", "r2.x");
    let helpers = ch.helpers(x)? + &square_helper(x);
    Ok(kernel(width, ch.channels * ch.count, &helpers, &body))
}

/// `GpuOp::BatchGradSums`: per chunk, `Σdy` and `Σdy·(x − mean)` with the channel's mean.
pub(crate) fn grad_sums(
    inputs: &[Operand],
    chunk: usize,
    out: &Operand,
    width: usize,
) -> Result<KernelSource, String> {
    let (x, dy, moments) = (&inputs[0], &inputs[1], &inputs[2]);
    let ch = Chunks::of(x, chunk)?;
    let mut body = ch.per_chunk();
    body += &ch.combine(moments, None, false, width);
    body += &ch.sum("s", width, |t| format!("term(c, {t}, mean)"));
    body += &seg_reduce("r", "s", "tid", width, 1);
    body += &store_pair(out, "r.x", "r.y");
    let helpers = ch.helpers(x)?
        + &format!(
            "fn term(c: u32, t: u32, m: f32) -> vec4<f32> {{
    let e = at(c, t);
    let g = {};
    return vec4<f32>(g, g * ({} - m), 0.0, 0.0);
}}
",
            load(dy, "e"),
            load(x, "e")
        );
    Ok(kernel(width, ch.channels * ch.count, &helpers, &body))
}

/// `GpuOp::BatchNormWithMoments`'s kernel: `norm_inputs` are `[x, running_mean, running_var,
/// weight?, bias?, moments]`; each result goes through `post`'s `mgn_epilogue(e, y)`.
pub(crate) fn forward(
    norm_inputs: &[Operand],
    (eps, has_weight, has_bias): (f64, bool, bool),
    chunk: usize,
    out: &Operand,
    width: usize,
    post: &str,
) -> Result<KernelSource, String> {
    let x = &norm_inputs[0];
    let moments = norm_inputs.last().ok_or("a batch norm without its moments")?;
    let ch = Chunks::of(x, chunk)?;
    let mut body = ch.per_chunk();
    body += &ch.combine(moments, None, true, width);
    let mut scale = "rstd".to_string();
    if has_weight {
        scale += &format!(" * {}", load(&norm_inputs[3], "c"));
    }
    let shift =
        if has_bias { load(&norm_inputs[3 + has_weight as usize], "c") } else { "0.0".into() };
    body += &format!(
        "let rstd = 1.0 / sqrt(var_b + {});\n    \
         let scale = {scale};\n    let shift = {shift};\n    ",
        lit(eps)
    );
    body += &ch.each(width, out, |e| {
        format!("mgn_epilogue({e}, ({} - mean) * scale + shift)", load(x, e))
    });
    Ok(kernel(width, ch.channels * ch.count, &(ch.helpers(x)? + post), &body))
}

/// `GpuOp::BatchNormGradWithSums`'s kernel for `part`: `inputs` are `[x, running_mean,
/// running_var, weight?, bias?, dy, moments, sums]`.
pub(crate) fn grad(
    inputs: &[Operand],
    (eps, has_weight): (f64, bool),
    part: GradPart,
    chunk: usize,
    out: &Operand,
    width: usize,
) -> Result<KernelSource, String> {
    let [.., dy, moments, sums] = inputs else {
        return Err("a derivative without its sums".into());
    };
    let x = &inputs[0];
    let ch = Chunks::of(x, chunk)?;
    let rstd = format!("let rstd = 1.0 / sqrt(var_b + {});\n    ", lit(eps));
    if part != GradPart::Input {
        // A workgroup per channel: `wid` is the channel.
        let mut body = "let c = wid;\n    ".to_string();
        body += &ch.combine(moments, Some(sums), part == GradPart::Weight, width);
        let value = match part {
            GradPart::Weight => {
                body += &rstd;
                "sdyx * rstd"
            }
            _ => "sdy",
        };
        body += &format!("if (tid == 0u) {{\n        {}\n    }}", store(out, "c", value));
        return Ok(kernel(width, ch.channels, "", &body));
    }
    let mut body = ch.per_chunk();
    body += &ch.combine(moments, Some(sums), true, width);
    body += &rstd;
    let w = if has_weight { load(&inputs[3], "c") } else { "1.0".into() };
    // dx = w·rstd·(dy − Σdy/L − (x − mean)·rstd²·Σdy·(x − mean)/L)
    body += &format!(
        "let wr = {w} * rstd;\n    let mdy = sdy / f32({len}u);\n    \
         let mdyx = sdyx * rstd * rstd / f32({len}u);\n    ",
        len = ch.len
    );
    body += &ch.each(width, out, |e| {
        format!("wr * ({} - mdy - ({} - mean) * mdyx)", load(dy, e), load(x, e))
    });
    Ok(kernel(width, ch.channels * ch.count, &ch.helpers(x)?, &body))
}
