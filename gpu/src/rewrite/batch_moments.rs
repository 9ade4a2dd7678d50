//! A training plan's batch norms over chunks of their channels (`kernels/norm/moments.rs`).
//!
//! With batch statistics, a batch norm's kernel (and each derivative's) gives a channel one
//! workgroup, which walks the channel's values two or three times. ResNet-50's first stages
//! have 64–256 channels of 12,544–50,176 values: a few hundred workgroups on 132 SMs, each
//! reading its channel from memory three times. Here every training batch norm over `x`
//! becomes:
//! - `BatchMoments` of x: each chunk's mean and `Σ(x − mean)²`, a workgroup per chunk;
//! - `BatchNormWithMoments`, the norm (with the epilogue `fuse` gave it) reading the moments,
//!   a workgroup per chunk; its running statistics are updated from the moments too.
//!
//! Its derivatives over the same x and dy (input, weight, bias) share one `BatchGradSums` (each
//! chunk's `Σdy` and `Σdy·(x − mean)`), and become `BatchNormGradWithSums` reading the moments
//! and the sums: the weight's and bias's are sums over the chunks, the input's element-wise.
//!
//! A batch norm whose channels take one chunk each keeps the row kernel: its channels alone fill
//! the GPU (ResNet-50's last stages: 1,024 and 2,048 channels of 196–784 values), and one step
//! saves a dispatch and a barrier. Runs after `fuse` (which made the epilogues) and only for
//! static plans: the chunk count does not follow a dynamic plan's sizes as a polynomial.

use crate::program::{moments_shape, GpuOp, Program, Step, StepId};
use mgn_ir::op::Op;
use mgn_ir::plan::Mode;
use mgn_ir::DType;
use std::collections::HashMap;

/// Chunks are whole multiples of this many values, so every workgroup width up to it has the
/// same count of values per invocation.
const QUANTUM: usize = 256;
/// At most this many values per chunk (16 per invocation of a 256-wide workgroup).
const MAX_CHUNK: usize = 16 * QUANTUM;
/// About as many chunks in all as give every SM of a large GPU (an H200: 132) four.
const WORKGROUPS: usize = 528;

/// The chunk for a batch norm over `channels` channels of `len` values each: as many chunks as
/// it takes to reach `WORKGROUPS` in all (at most one per `QUANTUM` values) and keep chunks
/// within `MAX_CHUNK`, then cut evenly.
pub(crate) fn chunk_for(channels: usize, len: usize) -> usize {
    let chunks = WORKGROUPS
        .div_ceil(channels.max(1))
        .min(len.div_ceil(QUANTUM))
        .max(len.div_ceil(MAX_CHUNK))
        .max(1);
    len.div_ceil(chunks).next_multiple_of(QUANTUM)
}

/// The batch norm a step computes with batch statistics, with its epilogue's program.
fn training_norm(op: &GpuOp) -> Option<(&Op, Vec<crate::program::Elem>)> {
    match op {
        GpuOp::Plan(bn @ Op::BatchNorm { .. }) => Some((bn, vec![crate::program::Elem::Input(0)])),
        GpuOp::NormEpilogue { norm: bn @ Op::BatchNorm { .. }, program } => {
            Some((bn, program.clone()))
        }
        _ => None,
    }
}

/// `x`'s values per channel, when a batch norm over it can run in chunks: an f32 result over
/// `[N, C, ...]` with more than one value per channel (else the row kernel reports the shape).
fn values_per_channel(program: &Program, x: StepId, out: DType) -> Option<(usize, usize)> {
    let xs = program.get(x)?;
    let [n, c, space @ ..] = &xs.shape[..] else { return None };
    let len = n * space.iter().product::<usize>();
    (out == DType::F32 && xs.dtype.is_float() && len > 1).then_some((*c, len))
}

/// Rewrites every training batch norm and its derivatives (see the module header).
pub(super) fn use_batch_moments(program: &mut Program) {
    if program.compiled().mode != Mode::Train {
        return;
    }
    // Per x: its moments and their chunk.
    let mut moments: HashMap<StepId, (StepId, usize)> = HashMap::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let Some((norm, epilogue)) = training_norm(&s.op) else { continue };
        let (norm, x) = (norm.clone(), s.inputs[0]);
        let Some((channels, len)) = values_per_channel(program, x, s.dtype) else { continue };
        let Ok(operands) = crate::program::norm_operands(&norm) else { continue };
        let chunk = chunk_for(channels, len);
        if chunk >= len {
            // One chunk a channel: the channels fill the GPU, and the row kernel's one step
            // saves the moments' dispatch and level.
            continue;
        }
        let m = *moments.entry(x).or_insert_with(|| {
            let shape = moments_shape(&program.step(x).shape, chunk).expect("[N, C, ...]");
            let loc = program.step(id).loc.clone();
            let op = GpuOp::BatchMoments { chunk };
            let step = Step { op, inputs: vec![x], dtype: DType::F32, shape, loc };
            (program.insert_before(id, step), chunk)
        });
        let s = program.step_mut(id);
        let (chunk, recomputed) = (m.1, false);
        s.op = GpuOp::BatchNormWithMoments { norm, chunk, program: epilogue, recomputed };
        s.inputs.insert(operands, m.0);
    }
    // Per (x, dy): the sums the derivatives share.
    let mut sums: HashMap<(StepId, StepId), StepId> = HashMap::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let GpuOp::Plan(grad @ Op::BatchNormGrad { training: true, .. }) = &s.op else { continue };
        let grad = grad.clone();
        let (x, dy) = (s.inputs[0], *s.inputs.last().expect("a derivative reads dy"));
        let Some(&(m, chunk)) = moments.get(&x) else { continue };
        if crate::program::batch_grad_operands(&grad) != Ok(s.inputs.len())
            || s.dtype != DType::F32
            || program.get(dy).map(|d| &d.shape) != Some(&program.step(x).shape)
        {
            continue;
        }
        let sum = *sums.entry((x, dy)).or_insert_with(|| {
            let step = Step {
                op: GpuOp::BatchGradSums { chunk },
                inputs: vec![x, dy, m],
                dtype: DType::F32,
                shape: program.step(m).shape.clone(),
                loc: program.step(id).loc.clone(),
            };
            program.insert_before(id, step)
        });
        let s = program.step_mut(id);
        s.op = GpuOp::BatchNormGradWithSums { grad, chunk };
        s.inputs.extend([m, sum]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_rewrite_keeps_results_within, step, tensor};
    use mgn_ir::op::{BinaryOp, GradPart, UnaryOp};
    use mgn_ir::plan::Plan;
    use mgn_ir::tensor::Tensor;

    fn rewritten(p: &Plan) -> crate::program::GpuPlan {
        let mut program = Program::new(p);
        crate::rewrite::fuse::fuse_elementwise(&mut program);
        use_batch_moments(&mut program);
        program.to_gpu_plan()
    }

    /// relu(batch_norm(x) + res), and the norm's three derivatives for a given dy, over
    /// `[2, 3, side, side]`.
    fn plan_of(mode: Mode, side: usize) -> Plan {
        let f = DType::F32;
        let (x, c) = ([2, 3, side, side], [3]);
        let bn = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: true, has_bias: true };
        let grad = |part| Op::BatchNormGrad {
            eps: 1e-5,
            has_weight: true,
            has_bias: true,
            part,
            training: mode == Mode::Train,
        };
        let mut steps = crate::test_util::batch_norm_input_steps(&x);
        steps.push(step(Op::Input { name: "res".into() }, vec![], f, &x)); // 5
        steps.push(step(Op::Input { name: "dy".into() }, vec![], f, &x)); // 6
        steps.push(step(bn, vec![0, 1, 2, 3, 4], f, &x)); // 7
        steps.push(step(Op::Binary(BinaryOp::Add), vec![7, 5], f, &x)); // 8
        steps.push(step(Op::Unary(UnaryOp::Relu), vec![8], f, &x)); // 9
        for (part, shape) in
            [(GradPart::Input, &x[..]), (GradPart::Weight, &c), (GradPart::Bias, &c)]
        {
            steps.push(step(grad(part), vec![0, 1, 2, 3, 4, 6], f, shape)); // 10, 11, 12
        }
        let names = ["x", "rm", "rv", "w", "b", "res", "dy"];
        let inputs = names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect();
        let outputs = ["y", "dx", "dw", "db"].iter().zip([9, 10, 11, 12]);
        let outputs = outputs.map(|(n, i)| (n.to_string(), i)).collect();
        Plan::of_steps(mode, steps, inputs, outputs)
    }

    /// `plan_of` at 800 values per channel: four chunks, the last one short.
    fn plan(mode: Mode) -> Plan {
        plan_of(mode, 20)
    }

    fn count(p: &crate::program::GpuPlan, what: fn(&GpuOp) -> bool) -> usize {
        p.steps.iter().filter(|s| what(&s.op)).count()
    }

    #[test]
    fn a_training_batch_norm_and_its_derivatives_share_moments_and_sums() {
        let q = rewritten(&plan(Mode::Train));
        q.validate().expect("a valid plan");
        assert_eq!(count(&q, |op| *op == GpuOp::BatchMoments { chunk: 256 }), 1);
        assert_eq!(count(&q, |op| *op == GpuOp::BatchGradSums { chunk: 256 }), 1);
        let headed = |op: &GpuOp| match op {
            GpuOp::BatchNormWithMoments { program, .. } => program.len() == 4,
            _ => false,
        };
        assert_eq!(count(&q, headed), 1, "the norm keeps its epilogue");
        let grads = |op: &GpuOp| matches!(op, GpuOp::BatchNormGradWithSums { .. });
        assert_eq!(count(&q, grads), 3);
        let m = q.steps.iter().position(|s| matches!(s.op, GpuOp::BatchMoments { .. })).unwrap();
        assert_eq!(q.steps[m].shape, [3, 4, 2], "800 values in chunks of 256");
        // An inference plan's batch norm uses its running statistics: nothing to chunk.
        let infer = rewritten(&plan(Mode::Infer));
        assert_eq!(count(&infer, |op| matches!(op, GpuOp::BatchMoments { .. })), 0);
        // 50 values per channel make one chunk each: the row kernels stay.
        let short = rewritten(&plan_of(Mode::Train, 5));
        let chunked = |op: &GpuOp| {
            matches!(op, GpuOp::BatchMoments { .. } | GpuOp::BatchNormGradWithSums { .. })
        };
        assert_eq!(count(&short, chunked), 0);
        assert_eq!(count(&short, |op| matches!(op, GpuOp::NormEpilogue { .. })), 1);
    }

    #[test]
    fn the_rewritten_plan_computes_what_the_plan_does() {
        let p = plan(Mode::Train);
        let x = [2, 3, 20, 20];
        // A mean far from zero, as after a convolution with a large bias.
        let shifted = |t: Tensor| {
            Tensor::f32(t.shape.clone(), t.to_f64_vec().iter().map(|v| *v as f32 + 20.0).collect())
        };
        let mut v = crate::test_util::batch_norm_operands(shifted(tensor(&x, 1)));
        v.extend([tensor(&x, 5), tensor(&x, 6)]);
        let names = ["x", "rm", "rv", "w", "b", "res", "dy"];
        let given: Vec<(&str, &Tensor)> = names.into_iter().zip(&v).collect();
        assert_rewrite_keeps_results_within(&p, rewritten(&p), &given, (1e-5, 1e-4));
    }

    #[test]
    fn chunks_fill_the_gpu_and_stay_within_bounds() {
        // ResNet-50 at batch 4: its first batch norm, a middle one and the last stage's.
        assert_eq!(chunk_for(64, 4 * 112 * 112), 4096);
        assert_eq!(chunk_for(256, 4 * 56 * 56), 3328);
        assert_eq!(chunk_for(2048, 4 * 7 * 7), 256);
        // One chunk per quantum at most, one chunk at least.
        assert_eq!(chunk_for(1, 300), 256);
        assert_eq!(chunk_for(1, 257), 256);
        assert_eq!(chunk_for(1, 2), 256);
        assert_eq!(chunk_for(0, 2), 256);
    }
}
