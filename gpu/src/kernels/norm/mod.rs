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
//! GPU's rewrite replaces that weight derivative, past 8 rows, by `NormWeightGradPartial` (one
//! workgroup per chunk of rows computing each row's statistics once, `weight_grad_partial`) and
//! a sum over the chunks (`rewrite/norm_partials.rs`). Group norm's weight: one workgroup per
//! channel, looping over samples with each sample's group statistics computed by the whole
//! workgroup; its bias is a plain per-channel sum.
//!
//! `BatchNorm` forward and dropout are dispatched from `kernels/mod.rs`, which knows the plan's
//! mode (`batch_norm`, `dropout` here). Inference batch norm (forward and input derivative) uses
//! the running statistics and is elementwise. Dropout's mask is the CPU's `dropout_keep(seed,
//! node, index, p)`: the per-run part (`dropout_key`) arrives in the parameter block.
//!
//! Submodules: the row kernel (`rows`), weight and bias derivatives by columns and chunks
//! (`params`), batch norm (`batch`), a training batch norm over chunks of its channels
//! (`moments`) and dropout (`dropout`).

mod batch;
mod dropout;
mod moments;
mod params;
mod rows;
#[cfg(test)]
mod tests;

pub(super) use batch::batch_norm;
pub(crate) use dropout::{dropout, dropout_key};
pub(super) use moments::moments as batch_moments;
pub(super) use moments::{forward as batch_norm_with_moments, grad_sums as batch_grad_sums};
pub(super) use params::weight_grad_partial;

use super::{Ext, KernelSource, Operand};
use batch::batch_norm_grad;
use mgn_ir::op::{GradPart, Op};
use params::{group_weight_grad, last_axis_grad};
use rows::row_kernel;

/// Kernels for the norms and their derivatives (batch norm's forward and dropout come through
/// `batch_norm` and `dropout`, which take the plan's mode).
pub fn generate(
    op: &Op,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    generate_with(op, inputs, out, width, None)
}

/// A layer, RMS or group norm, or a training plan's batch norm, whose kernel applies `post` —
/// the WGSL of `fn mgn_epilogue(i: u32, p: f32) -> f32`, a `GpuOp::NormEpilogue`'s program — to
/// each result as it stores it.
pub fn forward_with_epilogue(
    op: &Op,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
    post: &str,
    training: bool,
) -> Result<KernelSource, String> {
    match op {
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::GroupNorm { .. } => {
            generate_with(op, inputs, out, width, Some(post))
        }
        Op::BatchNorm { eps, has_weight, has_bias, .. } if training => {
            batch::batch_norm_with(inputs, out, *eps, (*has_weight, *has_bias), width, Some(post))
        }
        _ => Err(format!("`{}` takes no epilogue here", op.describe())),
    }
}

fn generate_with(
    op: &Op,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
    post: Option<&str>,
) -> Result<KernelSource, String> {
    let unsupported = |why: &str| Err(format!("`{}` has no GPU kernel yet ({why})", op.describe()));
    if !out.dtype.is_float() {
        return unsupported("integer output");
    }
    let w = width as usize;
    let x = inputs.first().ok_or("a norm needs inputs")?;
    // A forward norm over `rows` of x, with its weight and bias.
    let forward = |rows: &Rows, center: bool, eps: f64, (wt, bs): Affine| {
        let mode = Mode::Forward { w: wt, b: bs, post };
        Ok(row_kernel(rows, x, None, &Stats::Batch { center }, eps, mode, out, w))
    };
    match op {
        Op::LayerNorm { eps, has_weight, has_bias } => {
            forward(&last_axis_rows(x)?, true, *eps, affine(inputs, 1, *has_weight, *has_bias))
        }
        Op::RmsNorm { eps, has_weight } => {
            forward(&last_axis_rows(x)?, false, *eps, affine(inputs, 1, *has_weight, false))
        }
        Op::GroupNorm { groups, eps, has_weight, has_bias } => {
            let rows = group_rows(x, *groups)?;
            forward(&rows, true, *eps, affine(inputs, 1, *has_weight, *has_bias))
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
            group_norm_grad(inputs, out, *groups, *eps, *has_weight, *part, w)
        }
        Op::BatchNormGrad { eps, has_weight, has_bias, part, training } => {
            check_part(*part, *has_weight, *has_bias)?;
            batch_norm_grad(inputs, out, *eps, *has_weight, *part, *training, width)
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

/// `GpuOp::BatchNormGradWithSums`: `grad` (a training batch norm's derivative) from the
/// moments and sums its inputs end with.
pub(super) fn batch_grad_with_sums(
    grad: &Op,
    chunk: usize,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    match grad {
        Op::BatchNormGrad { eps, has_weight, has_bias, part, training: true } => {
            check_part(*part, *has_weight, *has_bias)?;
            moments::grad(inputs, (*eps, *has_weight), *part, chunk, out, width as usize)
        }
        other => Err(format!("`{}` takes no batch sums", other.describe())),
    }
}

/// Group norm's derivatives: the input's row (group) by row, the weight's per channel over the
/// samples (`group_weight_grad`), the bias's a plain per-channel sum.
fn group_norm_grad(
    inputs: &[Operand],
    out: &Operand,
    groups: usize,
    eps: f64,
    has_weight: bool,
    part: GradPart,
    w: usize,
) -> Result<KernelSource, String> {
    let (x, dy) = (&inputs[0], inputs.last().expect("norms have inputs"));
    let center = Stats::Batch { center: true };
    match part {
        GradPart::Input => {
            let rows = group_rows(x, groups)?;
            let mode = Mode::Input { w: has_weight.then(|| &inputs[1]) };
            Ok(row_kernel(&rows, x, Some(dy), &center, eps, mode, out, w))
        }
        GradPart::Weight => group_weight_grad(x, dy, groups, eps, out, w),
        _ => {
            group_rows(x, groups)?;
            let mode = Mode::Param(GradPart::Bias);
            Ok(row_kernel(&channel_rows(x)?, x, Some(dy), &center, eps, mode, out, w))
        }
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
    super::f32_lit(v)
}

/// A norm's weight and bias operands, when present.
type Affine<'a> = (Option<&'a Operand>, Option<&'a Operand>);

/// The weight and bias among `inputs` (from `first`), when present.
fn affine(inputs: &[Operand], first: usize, has_weight: bool, has_bias: bool) -> Affine<'_> {
    (has_weight.then(|| &inputs[first]), has_bias.then(|| &inputs[first + has_weight as usize]))
}

/// A WGSL expression of a row and an element of it (both WGSL expressions).
type Expr2 = Box<dyn Fn(&str, &str) -> String>;

/// How a norm sees `x`: `count` rows of `len` elements, each normalized on its own.
struct Rows {
    count: Ext,
    len: usize,
    /// The arena index (relative to `x`) of element `t` of row `b`.
    index: Expr2,
    /// The affine parameter of element `t` of row `b`.
    param: Expr2,
}

/// Layer and RMS norm: rows of the last axis.
fn last_axis_rows(x: &Operand) -> Result<Rows, String> {
    let d = *x.shape.last().ok_or("needs at least one axis, found a scalar")?;
    let count = Ext::product(&x.dims()[..x.shape.len() - 1]);
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
        count: Ext::lit(n * groups),
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
    Ok(Rows { count: Ext::lit(c), len: n * s, index, param: Box::new(|b, _| b.to_string()) })
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
    /// `x̂·w + b` per element, through `post`'s `mgn_epilogue(e, ·)` when given.
    Forward { w: Option<&'a Operand>, b: Option<&'a Operand>, post: Option<&'a str> },
    /// The input derivative per element, with `g = dy·w`.
    Input { w: Option<&'a Operand> },
    /// One value per row: `Σdy·x̂` (weight) or `Σdy` (bias) — batch norm's parameter is its row.
    Param(GradPart),
}

/// Invocations that share a row of `len`: a power of two, at most the width.
fn lanes_for(len: usize, width: usize) -> usize {
    len.max(1).next_power_of_two().min(width)
}

/// WGSL of `sq(e, m)`: `(x[e] − m)²` in the first lane of a vec4 (the variance pass's term,
/// `strided`'s).
pub(super) fn square_helper(x: &Operand) -> String {
    format!(
        "fn sq(e: u32, m: f32) -> vec4<f32> {{\n    let d = {} - m;\n    \
         return vec4<f32>(d * d, 0.0, 0.0, 0.0);\n}}\n",
        super::load(x, "e")
    )
}

/// Declares `var {acc}: vec4<f32>` = Σ `term(t)` over `t = start, start + step, … < len` when
/// `guard` holds (else 0). Four independent partial sums keep four loads in flight per invocation.
fn strided(
    acc: &str,
    start: &str,
    step: usize,
    len: impl Into<Ext>,
    guard: &str,
    term: impl Fn(&str) -> String,
) -> String {
    let len = len.into();
    let mut s =
        format!("var {acc} = vec4<f32>(0.0);\n    if ({guard}) {{\n        var t = {start};\n");
    // A length that follows the dynamic sizes takes the unrolled loop at every size: its
    // remainder loop covers the short ones.
    if !len.is_fixed() || len.n >= 4 * step {
        s += &format!(
            "        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        for (; t + {s3}u < {len}; t = t + {s4}u) {{
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
    s += &format!(
        "        for (; t < {len}; t = t + {step}u) {{\n            \
         {acc} = {acc} + {};\n        }}\n    }}\n    ",
        term("t")
    );
    s
}

/// Sums `value` over the `count` invocations (a power of two) whose ids differ by multiples of
/// `stride` and whose index among them is `member`, by a tree in `red`; every one of them gets
/// the total as `let {name}`. Must run in uniform control flow (it has barriers).
fn seg_reduce(name: &str, value: &str, member: &str, count: usize, stride: usize) -> String {
    let mut s = format!("red[tid] = {value};\n    workgroupBarrier();\n    ");
    let mut half = count / 2;
    while half >= 1 {
        s += &format!(
            "if ({member} < {half}u) {{\n        \
             red[tid] = red[tid] + red[tid + {}u];\n    }}\n    workgroupBarrier();\n    ",
            half * stride
        );
        half /= 2;
    }
    // The barrier after the read: the next reduction overwrites `red`.
    s += &format!("let {name} = red[tid - {member} * {stride}u];\n    workgroupBarrier();\n    ");
    s
}

/// `groups` workgroups of `width` with the reduction array; `wid` the linear workgroup id, and
/// workgroups past the last leave together.
fn kernel(width: usize, groups: usize, helpers: &str, body: &str) -> KernelSource {
    kernel_rows(width, 1, &Ext::lit(groups), helpers, body)
}

/// `kernel` for `count` rows, `per` to a workgroup: workgroups holding none leave together
/// (`wid · per ≥ count`, which needs no division of a size that follows the dynamic sizes).
fn kernel_rows(width: usize, per: usize, count: &Ext, helpers: &str, body: &str) -> KernelSource {
    let groups = count.n.div_ceil(per.max(1));
    KernelSource {
        body: format!(
            "{helpers}var<workgroup> red: array<vec4<f32>, {width}>;

@compute @workgroup_size({width})
fn main(@builtin(local_invocation_index) tid: u32, \
    @builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) groups: vec3<u32>) {{
    let wid = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    if (wid * {per}u >= {count}) {{
        return;
    }}
    {body}
}}
"
        ),
        invocations: groups as u64 * width as u64,
        dropout_node: None,
        width: None,
    }
}
