//! The CPU reference of GPU plans, for tests: every kernel and every rewrite is checked against
//! it. The compiled plan's ops run on the CPU backend (`mgn_cpu::eval`); the ops only the GPU's
//! rewrites make have small references here, composed from the CPU backend's public ops where
//! they can be (row terms of a loss are one-row losses, a chunk's weight derivative is the
//! norm's own over the chunk, a fused program is its nodes one by one), so each of them is
//! exactly the computation it replaces.

use crate::program::{Elem, GpuOp, GpuPlan};
use mgn_cpu::Ctx;
use mgn_ir::infer::Ty;
use mgn_ir::op::{GradPart, Op};
use mgn_ir::plan::Mode;
use mgn_ir::shape::attention::{dims, Dims};
use mgn_ir::tensor::{RunOutput, Tensor};
use mgn_ir::DType;

/// The CPU backend's result of a public op; a failure is a test failure.
fn cpu(op: &Op, x: &[&Tensor], dtype: DType, shape: &[usize], ctx: &Ctx) -> Tensor {
    mgn_cpu::eval(op, x, dtype, shape, ctx).unwrap_or_else(|e| panic!("on the CPU: {e}"))
}

/// `op` over `x` on the CPU, for a step of `dtype` and `shape`.
pub fn eval(op: &GpuOp, x: &[&Tensor], dtype: DType, shape: &[usize], ctx: &Ctx) -> Tensor {
    let types: Vec<Ty> = x.iter().map(|t| (t.dtype, &t.shape[..])).collect();
    if let Err(e) = op.check(&types, (dtype, shape)) {
        panic!("{e}");
    }
    match op {
        GpuOp::Plan(op) => cpu(op, x, dtype, shape, ctx),
        GpuOp::AttentionStats { causal, scale, has_mask } => {
            attention_stats(x, *causal, *scale, *has_mask, shape)
        }
        GpuOp::AttentionOnTiles { causal, scale, has_mask } => {
            let attention = Op::Attention { causal: *causal, scale: *scale, has_mask: *has_mask };
            cpu(&attention, x, dtype, shape, ctx)
        }
        GpuOp::AttentionGradWithStats { causal, scale, has_mask, part } => {
            // The statistics and the forward output only save the kernel work.
            let grad = Op::AttentionGrad {
                causal: *causal,
                scale: *scale,
                has_mask: *has_mask,
                part: *part,
            };
            cpu(&grad, &x[..5 + *has_mask as usize], dtype, shape, ctx)
        }
        GpuOp::NormWeightGradPartial { eps, center, chunk } => {
            norm_weight_grad_partial(x[0], x[1], *eps, *center, *chunk, shape, ctx)
        }
        GpuOp::CrossEntropyRows => cross_entropy_rows(x[0], x[1], shape, ctx),
        GpuOp::BatchMoments { chunk } => batch_chunks(x[0], None, *chunk, shape),
        GpuOp::BatchGradSums { chunk } => batch_chunks(x[0], Some(x[1]), *chunk, shape),
        GpuOp::BatchNormWithMoments { norm, program, .. } => {
            // The moments only save the kernel its statistics passes.
            let operands = crate::program::norm_operands(norm).expect("a typed step");
            let y = cpu(norm, &x[..operands], dtype, shape, ctx);
            let mut inputs = vec![&y];
            inputs.extend(&x[operands + 1..]);
            run_program(program, &inputs, dtype, shape, ctx)
        }
        GpuOp::BatchNormGradWithSums { grad, .. } => {
            cpu(grad, &x[..x.len() - 2], dtype, shape, ctx)
        }
        GpuOp::ConvSplit { conv, splits } => split_convs(conv, [x[0], x[1]], *splits, shape, ctx),
        GpuOp::Fused { program } => run_program(program, x, dtype, shape, ctx),
        GpuOp::MatMulT { ta, tb, alpha, splits } => {
            split_products(x, (*ta, *tb, *alpha), *splits, shape, ctx)
        }
        GpuOp::SplitSum { splits, program } => {
            let n: usize = shape.iter().product();
            let parts = x[0].to_f64_vec();
            // In the kernel's order: range 0 first.
            let sum: Vec<f32> = (0..n)
                .map(|i| (1..*splits).fold(parts[i] as f32, |acc, s| acc + parts[s * n + i] as f32))
                .collect();
            let sum = Tensor::f32(shape.to_vec(), sum);
            let mut inputs = vec![&sum];
            inputs.extend(&x[1..]);
            run_program(program, &inputs, dtype, shape, ctx)
        }
        GpuOp::AttentionProbs { causal, has_mask } => attention_probs(x, *causal, *has_mask, ctx),
        // The same value; only where the GPU keeps it differs.
        GpuOp::ScatterInPlace { axis, rope: None } => {
            cpu(&Op::SliceScatter { axis: *axis }, x, dtype, shape, ctx)
        }
        GpuOp::ScatterInPlace { rope: Some(_), .. }
        | GpuOp::ProductPair { .. }
        | GpuOp::RotatedAttention { .. } => decoding(op, x, dtype, shape, ctx),
        GpuOp::PermutedStore { op, shape: at, view, perm } => {
            let y = eval(op, x, dtype, at, ctx);
            let y = Tensor { shape: view.clone(), ..y };
            cpu(&Op::Permute { perm: perm.clone() }, &[&y], dtype, shape, ctx)
        }
        GpuOp::NormedProduct { norm, op, rounded } => {
            let operands = crate::program::norm_operands(norm).expect("a typed step");
            let (inner, params) = x.split_at(x.len() + 1 - operands);
            let normed: Vec<&Tensor> = [&inner[..1], params].concat();
            let y = cpu(norm, &normed, inner[0].dtype, &inner[0].shape, ctx);
            let y = match rounded {
                Some(h) => cpu(&Op::Cast, &[&y], *h, &y.shape, ctx),
                None => y,
            };
            let mut inputs = vec![&y];
            inputs.extend(&inner[1..]);
            eval(op, &inputs, dtype, shape, ctx)
        }
        GpuOp::MatMulEpilogue { program, ta, tb } => {
            let product = product(x, (*ta, *tb, 1.0), shape, ctx);
            let mut inputs = vec![&product];
            inputs.extend(&x[2..]);
            run_program(program, &inputs, dtype, shape, ctx)
        }
        GpuOp::ConvEpilogue { conv: head, program }
        | GpuOp::NormEpilogue { norm: head, program } => {
            let operands = match op {
                GpuOp::ConvEpilogue { .. } => crate::program::conv_operands(head),
                _ => crate::program::norm_operands(head),
            };
            let operands = operands.expect("a typed step");
            let y = cpu(head, &x[..operands], dtype, shape, ctx);
            let mut inputs = vec![&y];
            inputs.extend(&x[operands..]);
            run_program(program, &inputs, dtype, shape, ctx)
        }
    }
}

/// `plan` step by step on the CPU, as a training plan's forward and backward or an inference
/// plan's forward, with dropout seed 0 (each dropout keyed by its step's id, as on the GPU);
/// `params` in plan order.
pub fn run(plan: &GpuPlan, params: &[Tensor], inputs: &[(&str, &Tensor)]) -> RunOutput {
    results(plan, &values(plan, params, inputs))
}

/// `run`, then the plan's state writes: each written parameter of `params` replaced by its
/// value of this run, as a CPU session does once the run is over.
pub fn run_and_write(
    plan: &GpuPlan,
    params: &mut [Tensor],
    inputs: &[(&str, &Tensor)],
) -> RunOutput {
    let values = values(plan, params, inputs);
    for &(p, v) in &plan.state_writes {
        params[p] = values[v as usize].clone();
    }
    results(plan, &values)
}

/// Every step's value of one run of `plan` (see `run`).
fn values(plan: &GpuPlan, params: &[Tensor], inputs: &[(&str, &Tensor)]) -> Vec<Tensor> {
    let mut values: Vec<Option<Tensor>> = vec![None; plan.steps.len()];
    let training = plan.mode == Mode::Train;
    for (i, s) in plan.steps.iter().enumerate() {
        let v = match &s.op {
            GpuOp::Plan(Op::Input { name }) => {
                let (_, t) = inputs.iter().find(|(n, _)| n == name).expect("every input given");
                (*t).clone()
            }
            // A parameter an inference plan holds as halves (`rewrite::halves`) is rounded.
            GpuOp::Plan(Op::Param { index }) if params[*index].dtype != s.dtype => {
                let ctx = Ctx { training, seed: 0, node: plan.ids[i].0 };
                eval(&GpuOp::Plan(Op::Cast), &[&params[*index]], s.dtype, &s.shape, &ctx)
            }
            GpuOp::Plan(Op::Param { index }) => params[*index].clone(),
            op => {
                let args: Vec<&Tensor> = s
                    .inputs
                    .iter()
                    .map(|&x| values[x as usize].as_ref().expect("computed"))
                    .collect();
                let ctx = Ctx { training, seed: 0, node: plan.ids[i].0 };
                eval(op, &args, s.dtype, &s.shape, &ctx)
            }
        };
        values[i] = Some(v);
    }
    values.into_iter().map(|v| v.expect("computed")).collect()
}

/// The outputs, loss and gradients among a run's `values`.
fn results(plan: &GpuPlan, values: &[Tensor]) -> RunOutput {
    let get = |v: u32| values[v as usize].clone();
    RunOutput {
        outputs: plan.outputs.iter().map(|(n, v)| (n.clone(), get(*v))).collect(),
        loss: plan.loss.map(get),
        grads: plan.grads.iter().map(|(p, v)| (plan.params[*p].name.clone(), get(*v))).collect(),
    }
}

/// `GpuOp::AttentionStats` of `q, k, mask?`: per query row, the maximum `m` of its visible
/// scores `scale·q·k + mask` and `1/Σ e^(s − m)`, or `(−FLT_MAX, 0)` for a row that sees no
/// key. Scores are f32 values, as the CPU backend's attention holds them (so a row masked
/// entirely with −1e9 is uniform there too); products and the sum are taken in f64, the mask
/// broadcast to the scores by the CPU backend.
fn attention_stats(
    x: &[&Tensor],
    causal: bool,
    scale: f64,
    has_mask: bool,
    shape: &[usize],
) -> Tensor {
    let (q, k) = (x[0], x[1]);
    let Dims { batch, hq, hkv, tq, tk, d, scores, .. } =
        dims(&q.shape, &k.shape, &k.shape).expect("attention operands");
    let ctx = Ctx { training: true, seed: 0, node: 0 };
    let mask =
        has_mask.then(|| cpu(&Op::BroadcastTo, &[x[2]], x[2].dtype, &scores, &ctx).to_f64_vec());
    let (q, k) = (q.to_f64_vec(), k.to_f64_vec());
    let mut out = Vec::with_capacity(batch * hq * tq * 2);
    for bh in 0..batch * hq {
        let kv = (bh / hq) * hkv + (bh % hq) / (hq / hkv);
        for i in 0..tq {
            // Causal keys are aligned to the end: key j is visible to query i when
            // j + Tq <= i + Tk.
            let s: Vec<f32> = (0..tk)
                .filter(|&j| !causal || j + tq <= i + tk)
                .map(|j| {
                    let qk: f64 =
                        (0..d).map(|e| q[(bh * tq + i) * d + e] * k[(kv * tk + j) * d + e]).sum();
                    let m = mask.as_ref().map_or(0.0, |m| m[(bh * tq + i) * tk + j]);
                    (scale * qk) as f32 + m as f32
                })
                .collect();
            let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if m == f32::NEG_INFINITY {
                out.extend([-f32::MAX, 0.0]);
                continue;
            }
            let l: f64 = s.iter().map(|v| (v - m).exp() as f64).sum();
            out.extend([m, (1.0 / l) as f32]);
        }
    }
    Tensor::f32(shape.to_vec(), out)
}

/// `alpha · op(a) · op(b)` of `x[0], x[1]`, an operand transposed (its last two axes) where
/// its flag says, as `GpuOp::MatMulT` and a flagged epilogue's product read them.
/// `eval` of decoding's fused steps: a cache write that rotates what it writes, a pair of
/// products combined by their epilogue, an attention that rotates its queries.
fn decoding(op: &GpuOp, x: &[&Tensor], dtype: DType, shape: &[usize], ctx: &Ctx) -> Tensor {
    match op {
        GpuOp::ScatterInPlace { axis, rope: Some(rope) } => {
            let rope_in: Vec<&Tensor> = [&x[1..2], &x[3..]].concat();
            let src = cpu(rope, &rope_in, x[1].dtype, &x[1].shape, ctx);
            cpu(&Op::SliceScatter { axis: *axis }, &[x[0], &src, x[2]], dtype, shape, ctx)
        }
        GpuOp::ProductPair { program } => {
            let first = product(&x[..2], (false, true, 1.0), shape, ctx);
            let second = product(&[x[0], x[2]], (false, true, 1.0), shape, ctx);
            let mut inputs = vec![&first, &second];
            inputs.extend(&x[3..]);
            run_program(program, &inputs, dtype, shape, ctx)
        }
        GpuOp::RotatedAttention { attention, rope, rounded } => {
            let n = 3 + matches!(attention, Op::Attention { has_mask: true, .. }) as usize;
            let rope_in: Vec<&Tensor> = [&x[..1], &x[n..]].concat();
            let q = cpu(rope, &rope_in, x[0].dtype, &x[0].shape, ctx);
            let q = match rounded {
                Some(h) => cpu(&Op::Cast, &[&q], *h, &q.shape, ctx),
                None => q,
            };
            let operands: Vec<&Tensor> = [&[&q][..], &x[1..n]].concat();
            cpu(attention, &operands, dtype, shape, ctx)
        }
        op => unreachable!("`{}` is not a decoding step", op.describe()),
    }
}

fn product(
    x: &[&Tensor],
    (ta, tb, alpha): (bool, bool, f64),
    shape: &[usize],
    ctx: &Ctx,
) -> Tensor {
    let swap = |t: &Tensor, on: bool| {
        let r = t.shape.len();
        if !on || r < 2 {
            return t.clone();
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let mut shape = t.shape.clone();
        shape.swap(r - 2, r - 1);
        cpu(&Op::Permute { perm }, &[t], t.dtype, &shape, ctx)
    };
    let (a, b) = (swap(x[0], ta), swap(x[1], tb));
    let product = cpu(&Op::MatMul, &[&a, &b], DType::F32, shape, ctx);
    if alpha == 1.0 {
        return product;
    }
    let scaled = product.to_f64_vec().iter().map(|&v| v as f32 * alpha as f32).collect();
    Tensor::f32(shape.to_vec(), scaled)
}

/// A `ConvSplit`'s output: the convolution over each range of its reduction
/// (`kernels::conv::split_depth` deep), one after another — each the whole convolution of an
/// operand zeroed outside the range: the second, the weight for the forward and the input
/// gradient (its elements by input channel × tap, or output channel × tap), dy for the weight
/// gradient (by sample × output position).
fn split_convs(conv: &Op, x: [&Tensor; 2], splits: usize, shape: &[usize], ctx: &Ctx) -> Tensor {
    let (first, w) = (x[0], x[1]);
    // Which operand is cut, and each of its elements' index along the reduction.
    let (k, index): (usize, Box<dyn Fn(usize) -> usize>) = match conv {
        Op::Conv { .. } => {
            let row: usize = w.shape[1..].iter().product();
            (row, Box::new(move |i| i % row))
        }
        Op::ConvGradInput { groups, .. } => {
            let (cout_g, kk) = (w.shape[0] / groups, w.shape[2..].iter().product::<usize>());
            let per_co = w.shape[1] * kk;
            (cout_g * kk, Box::new(move |i| ((i / per_co) % cout_g) * kk + i % kk))
        }
        _ => {
            let (c, l) = (w.shape[1], w.shape[2..].iter().product::<usize>());
            (w.shape[0] * l, Box::new(move |i| (i / (c * l)) * l + i % l))
        }
    };
    let depth = crate::kernels::conv::split_depth(k, splits);
    let values = w.to_f64_vec();
    let mut out = Vec::with_capacity(shape.iter().product());
    for s in 0..splits {
        let range = (s * depth).min(k)..((s + 1) * depth).min(k);
        let masked: Vec<f32> = (0..values.len())
            .map(|i| if range.contains(&index(i)) { values[i] as f32 } else { 0.0 })
            .collect();
        let masked = Tensor::f32(w.shape.clone(), masked);
        let part = cpu(conv, &[first, &masked], DType::F32, &shape[1..], ctx);
        out.extend(part.to_f64_vec().iter().map(|&v| v as f32));
    }
    Tensor::f32(shape.to_vec(), out)
}

/// A `MatMulT`'s output: the whole product, or (`splits > 1`) the products of its k ranges
/// (`kernels::matmul::split_depth` deep) one after another.
fn split_products(
    x: &[&Tensor],
    layout: (bool, bool, f64),
    splits: usize,
    shape: &[usize],
    ctx: &Ctx,
) -> Tensor {
    if splits <= 1 {
        return product(x, layout, shape, ctx);
    }
    let (ta, tb, alpha) = layout;
    let (a, b) = (x[0], x[1]);
    let (ra, rb) = (a.shape.len(), b.shape.len());
    // k's axis in each operand as stored.
    let (ka, kb) = (if ta { ra - 2 } else { ra - 1 }, if tb { rb - 1 } else { rb - 2 });
    let k = a.shape[ka];
    let depth = crate::kernels::split_depth(k, splits);
    let each = &shape[1..];
    let mut out = Vec::with_capacity(shape.iter().product());
    for s in 0..splits {
        let (start, end) = ((s * depth).min(k), ((s + 1) * depth).min(k));
        if start == end {
            out.extend(std::iter::repeat_n(0.0, each.iter().product()));
            continue;
        }
        let slice = |t: &Tensor, axis: usize| {
            let mut sh = t.shape.clone();
            sh[axis] = end - start;
            cpu(&Op::Slice { axis, start, end }, &[t], t.dtype, &sh, ctx)
        };
        let (a, b) = (slice(a, ka), slice(b, kb));
        out.extend(
            product(&[&a, &b], (ta, tb, alpha), each, ctx).to_f64_vec().iter().map(|&v| v as f32),
        );
    }
    Tensor::f32(shape.to_vec(), out)
}

/// `GpuOp::AttentionProbs` of `scores, mask?`: per row, the softmax of the visible
/// `scores + mask` (f32, as the CPU backend's attention holds its scores), zeros where hidden,
/// and a row that sees no key all zeros.
fn attention_probs(x: &[&Tensor], causal: bool, has_mask: bool, ctx: &Ctx) -> Tensor {
    let shape = &x[0].shape;
    let r = shape.len();
    let (tq, tk) = (shape[r - 2], shape[r - 1]);
    let mask =
        has_mask.then(|| cpu(&Op::BroadcastTo, &[x[1]], x[1].dtype, shape, ctx).to_f64_vec());
    let scores = x[0].to_f64_vec();
    let mut out = vec![0f32; scores.len()];
    for (row, probs) in out.chunks_mut(tk.max(1)).enumerate() {
        let i = row % tq;
        let visible = |j: usize| !causal || j + tq <= i + tk;
        let z = |j: usize| {
            let e = row * tk + j;
            scores[e] as f32 + mask.as_ref().map_or(0.0, |m| m[e] as f32)
        };
        let m = (0..tk).filter(|&j| visible(j)).map(z).fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            continue;
        }
        let sum: f64 = (0..tk).filter(|&j| visible(j)).map(|j| (z(j) - m).exp() as f64).sum();
        for (j, p) in probs.iter_mut().enumerate() {
            if visible(j) {
                *p = ((z(j) - m).exp() as f64 / sum) as f32;
            }
        }
    }
    Tensor::f32(shape.clone(), out)
}

/// `GpuOp::NormWeightGradPartial` of `x, dy`: per chunk of `chunk` rows, the norm's own weight
/// derivative over those rows (a layer norm's with `center`, else an RMS norm's).
fn norm_weight_grad_partial(
    x: &Tensor,
    dy: &Tensor,
    eps: f64,
    center: bool,
    chunk: usize,
    shape: &[usize],
    ctx: &Ctx,
) -> Tensor {
    let d = *x.shape.last().expect("x has a last axis");
    let rows = x.shape.iter().product::<usize>() / d;
    let as_rows = |t: &Tensor| cpu(&Op::Reshape, &[t], t.dtype, &[rows, d], ctx);
    let (x, dy) = (as_rows(x), as_rows(dy));
    // The weight's value does not enter its own derivative.
    let ones = Tensor::f32(vec![d], vec![1.0; d]);
    let grad = if center {
        Op::LayerNormGrad { eps, has_weight: true, has_bias: false, part: GradPart::Weight }
    } else {
        Op::RmsNormGrad { eps, has_weight: true, part: GradPart::Weight }
    };
    let mut out = Vec::with_capacity(shape.iter().product());
    for start in (0..rows).step_by(chunk) {
        let end = (start + chunk).min(rows);
        let slice = Op::Slice { axis: 0, start, end };
        let xc = cpu(&slice, &[&x], x.dtype, &[end - start, d], ctx);
        let dyc = cpu(&slice, &[&dy], dy.dtype, &[end - start, d], ctx);
        out.extend(cpu(&grad, &[&xc, &ones, &dyc], DType::F32, &[d], ctx).to_f64_vec());
    }
    Tensor::f32(shape.to_vec(), out.into_iter().map(|v| v as f32).collect())
}

/// `GpuOp::CrossEntropyRows`: each row's loss, as the mean cross-entropy of that row alone.
/// Per chunk of each channel of `x: [N, C, ...]` (`GpuOp::BatchMoments`), in f64: its mean
/// and `Σ(x − mean)²`; or with `dy`, `Σdy` and `Σdy·(x − mean)` with the channel's mean
/// (`GpuOp::BatchGradSums`).
fn batch_chunks(x: &Tensor, dy: Option<&Tensor>, chunk: usize, shape: &[usize]) -> Tensor {
    let (n, c) = (x.shape[0], x.shape[1]);
    let space: usize = x.shape[2..].iter().product();
    let (xs, dys) = (x.to_f64_vec(), dy.map(Tensor::to_f64_vec));
    let at = |ch: usize, t: usize| ((t / space) * c + ch) * space + t % space;
    let len = n * space;
    let mut out = Vec::with_capacity(shape.iter().product());
    for ch in 0..c {
        let channel_mean = (0..len).map(|t| xs[at(ch, t)]).sum::<f64>() / len as f64;
        for start in (0..len).step_by(chunk) {
            let ts = start..(start + chunk).min(len);
            let pair = match &dys {
                None => {
                    let m = ts.clone().map(|t| xs[at(ch, t)]).sum::<f64>() / ts.len() as f64;
                    (m, ts.map(|t| (xs[at(ch, t)] - m).powi(2)).sum::<f64>())
                }
                Some(dy) => (
                    ts.clone().map(|t| dy[at(ch, t)]).sum::<f64>(),
                    ts.map(|t| dy[at(ch, t)] * (xs[at(ch, t)] - channel_mean)).sum(),
                ),
            };
            out.extend([pair.0 as f32, pair.1 as f32]);
        }
    }
    Tensor::f32(shape.to_vec(), out)
}

fn cross_entropy_rows(logits: &Tensor, targets: &Tensor, shape: &[usize], ctx: &Ctx) -> Tensor {
    let c = *logits.shape.last().expect("logits have a class axis");
    let rows = targets.shape.iter().product::<usize>();
    let logits = cpu(&Op::Reshape, &[logits], logits.dtype, &[rows, c], ctx);
    let targets = cpu(&Op::Reshape, &[targets], targets.dtype, &[rows], ctx);
    let terms = (0..rows).map(|r| {
        let slice = Op::Slice { axis: 0, start: r, end: r + 1 };
        let l = cpu(&slice, &[&logits], logits.dtype, &[1, c], ctx);
        let t = cpu(&slice, &[&targets], targets.dtype, &[1], ctx);
        cpu(&Op::SoftmaxCrossEntropy, &[&l, &t], DType::F32, &[], ctx).to_f64_vec()[0] as f32
    });
    Tensor::f32(shape.to_vec(), terms.collect())
}

/// A fused program node by node with the CPU backend's kernels: every node has the step's
/// shape (fusion joins only same-shaped steps), so this is the unfused computation.
fn run_program(
    program: &[Elem],
    x: &[&Tensor],
    dtype: DType,
    shape: &[usize],
    ctx: &Ctx,
) -> Tensor {
    let mut nodes: Vec<Tensor> = Vec::with_capacity(program.len());
    for e in program {
        let t = match (e, e.op()) {
            // Every node at the step's shape, as the kernel computes it element by element
            // (a leaf of a smaller chain inlined into a larger one broadcasts to the latter).
            (Elem::Input(k), _) if x[*k as usize].shape == shape => x[*k as usize].clone(),
            (Elem::Input(k), _) => {
                let leaf = x[*k as usize];
                cpu(&Op::BroadcastTo, &[leaf], leaf.dtype, shape, ctx)
            }
            (Elem::Index, _) => {
                let n = shape.iter().product::<usize>();
                Tensor::f32(shape.to_vec(), (0..n).map(|i| i as f32).collect())
            }
            (_, Some((op, args))) => {
                let args: Vec<&Tensor> = args.iter().map(|&a| &nodes[a as usize]).collect();
                let dtype = if matches!(op, Op::Compare(_)) { DType::Bool } else { dtype };
                cpu(&op, &args, dtype, shape, ctx)
            }
            (_, None) => unreachable!("every node but an input applies an op"),
        };
        nodes.push(t);
    }
    nodes.pop().expect("a fused program has a result")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_statistics_hold_the_row_max_and_reciprocal_sum() {
        // One head, three keys: row 0 sees all (scores 0, 1, 2 with q = 1, k = 0, 1, 2 and
        // scale 1), row 2 is masked to -inf everywhere.
        let q = Tensor::f32(vec![1, 3, 1], vec![1.0, 1.0, 1.0]);
        let k = Tensor::f32(vec![1, 3, 1], vec![0.0, 1.0, 2.0]);
        let inf = f32::NEG_INFINITY;
        let mask = Tensor::f32(vec![3, 3], vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, inf, inf, inf]);
        let got = attention_stats(&[&q, &k, &mask], false, 1.0, true, &[1, 3, 2]).to_f64_vec();
        let l = 1.0 + (-1f64).exp() + (-2f64).exp();
        assert!((got[0] - 2.0).abs() < 1e-6 && (got[1] - 1.0 / l).abs() < 1e-6, "{got:?}");
        assert_eq!(&got[4..], &[-(f32::MAX as f64), 0.0], "a row that sees no key");
        let got = attention_stats(&[&q, &k], true, 1.0, false, &[1, 3, 2]).to_f64_vec();
        assert_eq!(&got[..2], &[0.0, 1.0], "causal row 0 sees key 0 alone");
    }

    #[test]
    fn row_terms_and_chunks_add_up_to_the_ops_they_split() {
        let ctx = Ctx { training: true, seed: 0, node: 0 };
        let values = |n: usize, seed: u32| crate::test_util::values(n, seed);
        let logits =
            Tensor::f32(vec![2, 3, 5], values(30, 1).into_iter().map(|v| 4.0 * v).collect());
        let targets = Tensor::i32(vec![2, 3], vec![0, 4, 2, 1, 3, 3]);
        let terms = cross_entropy_rows(&logits, &targets, &[6], &ctx).to_f64_vec();
        let loss = cpu(&Op::SoftmaxCrossEntropy, &[&logits, &targets], DType::F32, &[], &ctx);
        let mean = terms.iter().sum::<f64>() / 6.0;
        assert!((mean - loss.to_f64_vec()[0]).abs() < 1e-6, "{mean} vs {loss:?}");

        let (x, dy) =
            (Tensor::f32(vec![7, 4], values(28, 2)), Tensor::f32(vec![7, 4], values(28, 3)));
        let w = Tensor::f32(vec![4], values(4, 4));
        for center in [true, false] {
            let chunks =
                norm_weight_grad_partial(&x, &dy, 1e-5, center, 3, &[3, 4], &ctx).to_f64_vec();
            let whole = if center {
                Op::LayerNormGrad {
                    eps: 1e-5,
                    has_weight: true,
                    has_bias: false,
                    part: GradPart::Weight,
                }
            } else {
                Op::RmsNormGrad { eps: 1e-5, has_weight: true, part: GradPart::Weight }
            };
            let want = cpu(&whole, &[&x, &w, &dy], DType::F32, &[4], &ctx).to_f64_vec();
            for (c, want) in want.iter().enumerate() {
                let sum = chunks[c] + chunks[4 + c] + chunks[8 + c];
                assert!((sum - want).abs() < 1e-5, "center {center}, column {c}: {sum} vs {want}");
            }
        }
    }
}
