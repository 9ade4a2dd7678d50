//! The plan rewrites a GPU session makes before it plans memory and generates kernels, in
//! order: attention statistics computed once (`attention_stats`), norm weight derivatives and
//! cross-entropy losses split over rows (`norm_partials`, `loss_rows`), then element-wise fusion
//! (`fuse`). The CPU backend runs plans as compiled.

use mgn_ir::op::Op;
use mgn_ir::plan::{Plan, Step};
use mgn_ir::DType;

/// The plan the GPU runs, and for each of its steps the index of the step of `plan` it computes
/// (`u32::MAX` for an inserted statistics step). Dropout masks and error messages use those
/// indices, so they match the CPU's.
pub fn for_gpu(plan: &Plan) -> (Plan, Vec<u32>) {
    let (with_stats, original) = super::attention_stats::add_attention_stats(plan);
    let (split, of_stats) = super::norm_partials::split_norm_weight_grads(&with_stats);
    let (losses, of_split) = super::loss_rows::split_cross_entropy(&split);
    let (fused, kept) = super::fuse::fuse_elementwise(&losses);
    // Back through each rewrite to `plan`'s indices; inserted steps map to u32::MAX.
    let back = |map: &[u32], k: u32| map.get(k as usize).copied().unwrap_or(u32::MAX);
    let composed =
        kept.iter().map(|&k| back(&original, back(&of_stats, back(&of_split, k)))).collect();
    (fused, composed)
}

/// One step split in two: a new step (`op` over `inputs`, numbered as in the plan, of `shape`)
/// inserted just before it, and the step itself turned into `then` reading the new step alone.
pub(super) struct Split {
    pub op: Op,
    pub inputs: Vec<u32>,
    pub shape: Vec<usize>,
    pub then: Op,
}

/// `plan` with `splits[i]` applied to step `i` and every step reference renumbered (step inputs,
/// the plan's inputs, outputs, loss and gradients, `DropoutGrad::forward`), and for each new step
/// the index of the step of `plan` it computes (`u32::MAX` for an inserted one).
pub(super) fn split_steps(plan: &Plan, mut splits: Vec<Option<Split>>) -> (Plan, Vec<u32>) {
    let n = plan.steps.len();
    splits.resize_with(n, || None);
    let mut steps = Vec::with_capacity(n + n / 4);
    let mut original = Vec::with_capacity(n + n / 4);
    let mut new_of = vec![u32::MAX; n];
    for (i, s) in plan.steps.iter().enumerate() {
        // Inputs come before their reader (Plan::validate), so they are renumbered already; a
        // malformed reference is left for validation to report.
        let renumber =
            |x: u32| new_of.get(x as usize).copied().filter(|&v| v != u32::MAX).unwrap_or(x);
        let mut step = s.clone();
        step.inputs = s.inputs.iter().map(|&x| renumber(x)).collect();
        if let Op::DropoutGrad { forward, .. } = &mut step.op {
            *forward = renumber(*forward);
        }
        if let Some(sp) = splits[i].take() {
            let inputs = sp.inputs.iter().map(|&x| renumber(x)).collect();
            steps.push(Step {
                op: sp.op,
                inputs,
                dtype: DType::F32,
                shape: sp.shape,
                loc: s.loc.clone(),
            });
            original.push(u32::MAX);
            step.op = sp.then;
            step.inputs = vec![steps.len() as u32 - 1];
        }
        new_of[i] = steps.len() as u32;
        steps.push(step);
        original.push(i as u32);
    }
    (plan.with_steps(steps, |v| new_of.get(v as usize).copied().unwrap_or(v)), original)
}
