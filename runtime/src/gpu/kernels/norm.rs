//! Normalizations (layer, RMS, group, batch) with their derivatives, and dropout.
//!
//! Same semantics as `cpu/norm.rs`: a norm sees `x` as consecutive blocks of `len` elements,
//! each normalized with its own biased-variance statistics; `x̂ = (x − mean)·rstd`, the output
//! `x̂·w + b`, and with `g = dy·w` the input derivative is `rstd·(g − mean(g) − x̂·mean(g·x̂))`
//! (RMS norm: no mean, no `mean(g)` term). Every invocation recomputes the statistics of its
//! block by looping (in f32, where the CPU uses f64); weight and bias derivatives loop over
//! every element of their parameter.
//!
//! `BatchNorm` forward and dropout are dispatched from `kernels/mod.rs`, which knows the plan's
//! mode (`batch_norm`, `dropout` here). Dropout's mask is the CPU's `dropout_keep(seed, node,
//! index, p)`: the per-run part (`dropout_key`) arrives in the parameter block.

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
    Ok(Blocks { x: x.clone(), len: d, center, eps, param: Box::new(move |e| format!("(({e}) % {d}u)")), elem: Box::new(move |r, p| format!("(({r}) * {d}u + ({p}))")), per_param: rows })
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
            let d = if training { format!("{} - sg / f32({count}u) - ({} - st.x) * st.y * sgx / f32({count}u)", load(dy, "i"), load(x, "i")) } else { load(dy, "i") };
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
pub(super) fn dropout(x: &Operand, out: &Operand, p: f64, width: u32) -> Result<KernelSource, String> {
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
    use crate::gpu::device::GpuDevice;
    use crate::limits::fold_grid;
    use crate::tensor::Tensor;
    use crate::DType;

    fn device() -> Option<GpuDevice> {
        match GpuDevice::open() {
            Ok(d) => Some(d),
            Err(why) if std::env::var("MGN_REQUIRE_GPU").is_ok_and(|v| v == "1") => panic!("MGN_REQUIRE_GPU=1 but no GPU device: {why}"),
            Err(why) => {
                eprintln!("skipping: no GPU device ({why})");
                None
            }
        }
    }

    fn values(n: usize, seed: u32, shift: f32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0 - 1.0 + shift).collect()
    }

    /// Lays `inputs` out in an arena followed by the output, runs `make`'s kernel and returns
    /// the output with the inputs as tensors.
    fn run(dev: &mut GpuDevice, inputs: &[(Vec<usize>, f32)], out_shape: &[usize], make: impl Fn(&[Operand], &Operand, u32) -> KernelSource) -> (Vec<f32>, Vec<Tensor>) {
        run_with(dev, inputs, out_shape, [0u32; 32], make)
    }

    fn run_with(dev: &mut GpuDevice, inputs: &[(Vec<usize>, f32)], out_shape: &[usize], params: [u32; 32], make: impl Fn(&[Operand], &Operand, u32) -> KernelSource) -> (Vec<f32>, Vec<Tensor>) {
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
        let width = dev.limits.workgroup_width(256);
        let src = make(&ops, &out, width);
        let kernel = dev.kernel("norm_test", &src.body).expect("valid WGSL");
        let arena = dev.arena(offset + n).expect("fits");
        for (o, t) in ops.iter().zip(&tensors) {
            dev.write(&arena, o.offset, &t.to_f64_vec().iter().map(|&v| (v as f32).to_bits()).collect::<Vec<_>>()).expect("uploads");
        }
        let groups = fold_grid(src.invocations.div_ceil(width as u64), &dev.limits).expect("fits");
        dev.run(&arena, &[(&kernel, params, groups)]).expect("runs");
        (dev.read(&arena, offset, n).expect("reads").into_iter().map(f32::from_bits).collect(), tensors)
    }

    fn close(what: &str, got: &[f32], want: &Tensor, tol: f64) {
        let want = want.to_f64_vec();
        assert_eq!(got.len(), want.len());
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            assert!((a as f64 - b).abs() <= tol * (1.0 + b.abs()), "{what}: element {i}: gpu {a}, cpu {b}");
        }
    }

    #[test]
    fn batch_norm_forward_matches_the_cpu_in_both_modes() {
        let Some(mut dev) = device() else { return };
        for x in [vec![4usize, 3, 5], vec![5, 3], vec![2, 3, 2, 3]] {
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
                    let (got, tensors) = run(&mut dev, &inputs, &x, |ins, out, width| batch_norm(ins, out, 1e-5, w, b, training, width).expect("generates"));
                    let op = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: w, has_bias: b };
                    let refs: Vec<&Tensor> = tensors.iter().collect();
                    let want = crate::cpu::eval(&op, &refs, DType::F32, &x, &crate::cpu::Ctx { training, seed: 0, node: 0 }).expect("cpu runs");
                    close(&format!("batch_norm training={training} w={w} b={b} {x:?}"), &got, &want, 1e-4);
                }
            }
        }
    }

    #[test]
    fn dropout_draws_the_cpu_mask_exactly() {
        let Some(mut dev) = device() else { return };
        let x = vec![7usize, 301];
        for (p, seed, node) in [(0.5, 0u64, 0u32), (0.1, 0xDEAD_BEEF_0123_4567, 17), (0.9, u64::MAX, 3), (0.0, 42, 1), (0.3, 1 << 40, u32::MAX)] {
            let key = dropout_key(seed, node);
            let mut params = [0u32; 32];
            params[0] = key as u32;
            params[1] = (key >> 32) as u32;
            let (got, tensors) = run_with(&mut dev, &[(x.clone(), 0.0)], &x, params, |ins, out, width| dropout(&ins[0], out, p, width).expect("generates"));
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let ctx = crate::cpu::Ctx { training: true, seed, node };
            let want = crate::cpu::eval(&Op::Dropout { p }, &refs, DType::F32, &x, &ctx).expect("cpu runs");
            let what = format!("dropout p={p} seed={seed} node={node}");
            close(&what, &got, &want, 1e-6);
            // The mask itself, exactly (inputs are never 0 here except by construction).
            for (i, (&g, w)) in got.iter().zip(want.to_f64_vec()).enumerate() {
                assert_eq!(g == 0.0, w == 0.0, "{what}: element {i} mask differs");
            }
            // DropoutGrad of the same forward step draws the same mask.
            let grad = crate::cpu::eval(&Op::DropoutGrad { p, forward: node }, &refs, DType::F32, &x, &crate::cpu::Ctx { training: true, seed, node: 0 }).expect("cpu runs");
            close(&format!("{what} (grad)"), &got, &grad, 1e-6);
        }
    }
}
