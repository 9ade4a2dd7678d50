//! Normalizations (layer, RMS, group, batch) with their derivatives, and dropout.
//!
//! Same semantics as `cpu/norm.rs`: a norm sees `x` as consecutive blocks of `len` elements,
//! each normalized with its own biased-variance statistics; `x̂ = (x − mean)·rstd`, the output
//! `x̂·w + b`, and with `g = dy·w` the input derivative is `rstd·(g − mean(g) − x̂·mean(g·x̂))`
//! (RMS norm: no mean, no `mean(g)` term). Every invocation recomputes the statistics of its
//! block by looping (in f32, where the CPU uses f64); weight and bias derivatives loop over
//! every element of their parameter.
//!
//! Not here yet, with their reasons (`generate` answers them with "has no GPU kernel yet"):
//! - `BatchNorm` forward: its statistics depend on the plan's mode (batch statistics when
//!   training, running ones otherwise), which `generate` does not receive. The kernel exists
//!   (`batch_norm`, checked against the CPU in both modes) for when the mode reaches it.
//! - `Dropout`/`DropoutGrad`: the mask is `cpu::dropout_keep(seed, node, index, p)` with the
//!   session's per-run seed and, for the forward, the step's own index — neither reaches the
//!   generator nor the kernel's `params` yet. (In inference it is the identity, but the
//!   generator cannot tell the modes apart either.)

use super::{elementwise, load, store, KernelSource, Operand};
use crate::op::{GradPart, Op};
use crate::plan::Step;

/// Kernels for the norms and their derivatives, and dropout with the CPU backend's mask (`cpu::dropout_keep`).
pub fn generate(step: &Step, inputs: &[Operand], out: &Operand, width: u32) -> Result<KernelSource, String> {
    let unsupported = |why: &str| Err(format!("`{}` has no GPU kernel yet ({why})", step.op.describe()));
    if !out.dtype.is_float() {
        return unsupported("integer output");
    }
    match &step.op {
        Op::LayerNorm { eps, has_weight, has_bias } => {
            let b = last_axis_blocks(&inputs[0], *eps, true)?;
            Ok(b.forward(inputs, out, *has_weight, *has_bias, width))
        }
        Op::RmsNorm { eps, has_weight } => {
            let b = last_axis_blocks(&inputs[0], *eps, false)?;
            Ok(b.forward(inputs, out, *has_weight, false, width))
        }
        Op::GroupNorm { groups, eps, has_weight, has_bias } => {
            let b = group_blocks(&inputs[0], *groups, *eps)?;
            Ok(b.forward(inputs, out, *has_weight, *has_bias, width))
        }
        Op::LayerNormGrad { eps, has_weight, has_bias, part } => {
            check_part(*part, *has_weight, *has_bias)?;
            let b = last_axis_blocks(&inputs[0], *eps, true)?;
            Ok(b.backward(inputs, out, *has_weight, *part, width))
        }
        Op::RmsNormGrad { eps, has_weight, part } => {
            check_part(*part, *has_weight, false)?;
            let b = last_axis_blocks(&inputs[0], *eps, false)?;
            Ok(b.backward(inputs, out, *has_weight, *part, width))
        }
        Op::GroupNormGrad { groups, eps, has_weight, has_bias, part } => {
            check_part(*part, *has_weight, *has_bias)?;
            let b = group_blocks(&inputs[0], *groups, *eps)?;
            Ok(b.backward(inputs, out, *has_weight, *part, width))
        }
        Op::BatchNormGrad { eps, has_weight, has_bias, part, training } => {
            check_part(*part, *has_weight, *has_bias)?;
            batch_norm_grad(inputs, out, *eps, *has_weight, *part, *training, width)
        }
        Op::BatchNorm { .. } => unsupported("its statistics depend on the plan's mode, which the generator does not receive"),
        Op::Dropout { .. } | Op::DropoutGrad { .. } => unsupported("the mask needs the run's seed, which does not reach the kernel"),
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

/// A WGSL expression built from the expressions of an element (or a parameter and a counter).
type Expr1 = Box<dyn Fn(&str) -> String>;
type Expr2 = Box<dyn Fn(&str, &str) -> String>;

/// How a norm sees `x`: blocks of `len` elements; `param(e)` is the affine parameter of
/// element `e`; the elements of parameter `p` are `elem(r, p)` for `r` in `0..per_param`.
struct Blocks {
    x: Operand,
    len: usize,
    center: bool,
    eps: f64,
    /// Parameter index of element `e` (a WGSL expression of `e`).
    param: Expr1,
    /// Element `r` of parameter `p` (a WGSL expression of both).
    elem: Expr2,
    per_param: usize,
}

/// Layer and RMS norm: blocks are rows of the last axis.
fn last_axis_blocks(x: &Operand, eps: f64, center: bool) -> Result<Blocks, String> {
    let d = *x.shape.last().ok_or("needs at least one axis, found a scalar")?;
    let rows: usize = x.shape[..x.shape.len() - 1].iter().product();
    Ok(Blocks {
        x: x.clone(),
        len: d,
        center,
        eps,
        param: Box::new(move |e| format!("(({e}) % {d}u)")),
        elem: Box::new(move |r, p| format!("(({r}) * {d}u + ({p}))")),
        per_param: rows,
    })
}

/// Group norm: `x: [N, C, S...]`; block `b` is group `b % G` of sample `b / G` (its channels are
/// contiguous); the parameter of an element is its channel.
fn group_blocks(x: &Operand, groups: usize, eps: f64) -> Result<Blocks, String> {
    if x.shape.len() < 2 {
        return Err(format!("needs [N, C, ...], found {:?}", x.shape));
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let s: usize = x.shape[2..].iter().product();
    if groups == 0 || c % groups != 0 {
        return Err(format!("cannot split {c} channels into {groups} groups"));
    }
    Ok(Blocks {
        x: x.clone(),
        len: c / groups * s,
        center: true,
        eps,
        param: Box::new(move |e| format!("((({e}) / {s}u) % {c}u)")),
        elem: Box::new(move |r, p| format!("(((({r}) / {s}u) * {c}u + ({p})) * {s}u + ({r}) % {s}u)")),
        per_param: n * s,
    })
}

impl Blocks {
    /// `fn block_stats(base) -> vec2(mean, rstd)` of the block starting at element `base`.
    fn stats_fn(&self) -> String {
        let (len, x) = (self.len, &self.x);
        let mean = if self.center {
            format!(
                "var s = 0.0;
    for (var t = 0u; t < {len}u; t = t + 1u) {{ s = s + {}; }}
    let mean = s / f32({len}u);",
                load(x, "base + t")
            )
        } else {
            "let mean = 0.0;".into()
        };
        format!(
            "fn block_stats(base: u32) -> vec2<f32> {{
    {mean}
    var v = 0.0;
    for (var t = 0u; t < {len}u; t = t + 1u) {{ let d = {} - mean; v = v + d * d; }}
    return vec2<f32>(mean, 1.0 / sqrt(v / f32({len}u) + {}));
}}
",
            load(x, "base + t"),
            lit(self.eps)
        )
    }

    fn forward(&self, inputs: &[Operand], out: &Operand, has_weight: bool, has_bias: bool, width: u32) -> KernelSource {
        let n: usize = out.shape.iter().product();
        let p = (self.param)("i");
        let mut y = format!("({} - st.x) * st.y", load(&self.x, "i"));
        if has_weight {
            y = format!("{y} * {}", load(&inputs[1], &p));
        }
        if has_bias {
            y = format!("{y} + {}", load(&inputs[1 + has_weight as usize], &p));
        }
        let body = format!(
            "let st = block_stats((i / {len}u) * {len}u);
    {}",
            store(out, "i", &y),
            len = self.len
        );
        elementwise(n, width, &body, &self.stats_fn())
    }

    /// Inputs `x, weight?, bias?, dy`: the derivative of `part`.
    fn backward(&self, inputs: &[Operand], out: &Operand, has_weight: bool, part: GradPart, width: u32) -> KernelSource {
        let n: usize = out.shape.iter().product();
        let (x, dy, len) = (&self.x, &inputs[inputs.len() - 1], self.len);
        let body = match part {
            GradPart::Input => {
                let g = |e: &str| {
                    if has_weight {
                        format!("{} * {}", load(dy, e), load(&inputs[1], &(self.param)(e)))
                    } else {
                        load(dy, e)
                    }
                };
                format!(
                    "let base = (i / {len}u) * {len}u;
    let st = block_stats(base);
    var sg = 0.0;
    var sgx = 0.0;
    for (var t = 0u; t < {len}u; t = t + 1u) {{
        let e = base + t;
        let g = {ge};
        sg = sg + g;
        sgx = sgx + g * ({xe} - st.x) * st.y;
    }}
    let mg = {mg};
    let xh = ({xi} - st.x) * st.y;
    {st}",
                    ge = g("e"),
                    xe = load(x, "e"),
                    mg = if self.center { format!("sg / f32({len}u)") } else { "0.0".into() },
                    xi = load(x, "i"),
                    st = store(out, "i", &format!("st.y * ({} - mg - xh * sgx / f32({len}u))", g("i"))),
                )
            }
            _ => {
                // Σ dy·x̂ (weight) or Σ dy (bias) over the elements of parameter i; the block
                // statistics are recomputed only when the block changes.
                let term = if part == GradPart::Weight {
                    format!(
                        "let blk = e / {len}u;
        if (blk != cur) {{ st = block_stats(blk * {len}u); cur = blk; }}
        acc = acc + {} * ({} - st.x) * st.y;",
                        load(dy, "e"),
                        load(x, "e")
                    )
                } else {
                    format!("acc = acc + {};", load(dy, "e"))
                };
                format!(
                    "var acc = 0.0;
    var cur = 0xffffffffu;
    var st = vec2<f32>(0.0, 0.0);
    for (var r = 0u; r < {count}u; r = r + 1u) {{
        let e = {e};
        {term}
    }}
    {}",
                    store(out, "i", "acc"),
                    count = self.per_param,
                    e = (self.elem)("r", "i"),
                )
            }
        };
        elementwise(n, width, &body, &self.stats_fn())
    }
}

/// `x: [N, C, ...]` as (N, C, spatial size).
fn batch_layout(x: &Operand) -> Result<(usize, usize, usize), String> {
    if x.shape.len() < 2 {
        return Err(format!("needs [N, C, ...], found {:?}", x.shape));
    }
    Ok((x.shape[0], x.shape[1], x.shape[2..].iter().product()))
}

/// `fn chan_stats(c) -> vec2(mean, rstd)`: over the batch (biased variance) when training,
/// else the running statistics (inputs 1 and 2).
fn chan_stats_fn(inputs: &[Operand], eps: f64, training: bool) -> Result<String, String> {
    let x = &inputs[0];
    let (n, c, s) = batch_layout(x)?;
    if inputs[1].shape != [c] || inputs[2].shape != [c] {
        return Err(format!("running statistics must have shape [{c}], found {:?} and {:?}", inputs[1].shape, inputs[2].shape));
    }
    if !training {
        return Ok(format!(
            "fn chan_stats(c: u32) -> vec2<f32> {{
    return vec2<f32>({}, 1.0 / sqrt({} + {}));
}}
",
            load(&inputs[1], "c"),
            load(&inputs[2], "c"),
            lit(eps)
        ));
    }
    if n * s <= 1 {
        return Err(format!("training needs more than one value per channel, found input shape [{n}, {c}, ..] with {s} per sample"));
    }
    let xe = load(x, &format!("(r / {s}u * {c}u + c) * {s}u + r % {s}u"));
    Ok(format!(
        "fn chan_stats(c: u32) -> vec2<f32> {{
    var m = 0.0;
    for (var r = 0u; r < {count}u; r = r + 1u) {{ m = m + {xe}; }}
    m = m / f32({count}u);
    var v = 0.0;
    for (var r = 0u; r < {count}u; r = r + 1u) {{ let d = {xe} - m; v = v + d * d; }}
    return vec2<f32>(m, 1.0 / sqrt(v / f32({count}u) + {}));
}}
",
        lit(eps),
        count = n * s,
    ))
}

/// Batch norm forward, inputs `x, running_mean, running_var, weight?, bias?`, with batch
/// statistics when `training`. Not reachable from `generate` until the plan's mode is.
#[allow(dead_code)]
pub(super) fn batch_norm(inputs: &[Operand], out: &Operand, eps: f64, has_weight: bool, has_bias: bool, training: bool, width: u32) -> Result<KernelSource, String> {
    let (_, c, s) = batch_layout(&inputs[0])?;
    let helpers = chan_stats_fn(inputs, eps, training)?;
    let mut y = format!("({} - st.x) * st.y", load(&inputs[0], "i"));
    if has_weight {
        y = format!("{y} * {}", load(&inputs[3], "c"));
    }
    if has_bias {
        y = format!("{y} + {}", load(&inputs[3 + has_weight as usize], "c"));
    }
    let body = format!(
        "let c = (i / {s}u) % {c}u;
    let st = chan_stats(c);
    {}",
        store(out, "i", &y)
    );
    Ok(elementwise(out.shape.iter().product(), width, &body, &helpers))
}

/// Inputs `x, running_mean, running_var, weight?, bias?, dy`. In training the batch statistics
/// depend on `x` (the full derivative); otherwise `dx = dy·w·rstd`.
fn batch_norm_grad(inputs: &[Operand], out: &Operand, eps: f64, has_weight: bool, part: GradPart, training: bool, width: u32) -> Result<KernelSource, String> {
    let x = &inputs[0];
    let dy = &inputs[inputs.len() - 1];
    let (n, c, s) = batch_layout(x)?;
    let helpers = chan_stats_fn(inputs, eps, training)?;
    let count = n * s;
    let at = format!("(r / {s}u * {c}u + c) * {s}u + r % {s}u");
    // Σ dy and Σ dy·x̂ over channel c.
    let sums = format!(
        "let st = chan_stats(c);
    var sg = 0.0;
    var sgx = 0.0;
    for (var r = 0u; r < {count}u; r = r + 1u) {{
        let e = {at};
        let g = {};
        sg = sg + g;
        sgx = sgx + g * ({} - st.x) * st.y;
    }}",
        load(dy, "e"),
        load(x, "e")
    );
    let body = match part {
        GradPart::Bias => format!("let c = i;\n    {sums}\n    {}", store(out, "i", "sg")),
        GradPart::Weight => format!("let c = i;\n    {sums}\n    {}", store(out, "i", "sgx")),
        _ => {
            let w = if has_weight { load(&inputs[3], "c") } else { "1.0".into() };
            let d = if training {
                format!("{} - sg / f32({count}u) - ({} - st.x) * st.y * sgx / f32({count}u)", load(dy, "i"), load(x, "i"))
            } else {
                load(dy, "i")
            };
            let pre = if training { sums } else { "let st = chan_stats(c);".into() };
            format!(
                "let c = (i / {s}u) % {c}u;
    {pre}
    {}",
                store(out, "i", &format!("st.y * {w} * ({d})"))
            )
        }
    };
    Ok(elementwise(out.shape.iter().product(), width, &body, &helpers))
}
