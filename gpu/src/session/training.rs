//! What a training plan's submission adds after the plan's own dispatches: batch norm's
//! running-statistics updates, the optimizer's update of every trained parameter (its state
//! placed past the plan's own words) and gradient clipping, with their kernels and grids.

use super::*;

/// What a training submission adds after the plan's own dispatches.
pub(super) struct Training {
    /// (level, parameter block, grid) of each batch norm's running-statistics update.
    pub(super) bn: Vec<(usize, Params, [u32; 3])>,
    pub(super) bn_kernel: usize,
    /// Per trained parameter (in `plan.grads` order).
    pub(super) params: Vec<TrainedParam>,
    pub(super) update_kernel: usize,
    /// Clipping or loss scaling: the squared-norm kernel, the kernel turning partial sums into
    /// the factor (and the verdict).
    pub(super) norm: Option<(usize, usize)>,
    /// Loss scaling: the word saying whether every gradient was finite (the update applied).
    pub(super) verdict: Option<usize>,
}

pub(super) struct TrainedParam {
    pub(super) index: usize,
    pub(super) offset: usize,
    pub(super) grad: usize,
    pub(super) m: Option<usize>,
    pub(super) v: Option<usize>,
    pub(super) n: usize,
    /// Partial sums of this gradient's squares start here (clipping or loss scaling only).
    pub(super) partials: usize,
    /// Whether the optimizer state holds values (SGD's momentum buffer starts as the gradient).
    pub(super) has_state: bool,
    /// Grids of the update kernel (one invocation per element) and the squared-norm kernel.
    pub(super) update_groups: [u32; 3],
    pub(super) norm_groups: [u32; 3],
}

/// A training plan's updates: optimizer state and clipping scratch placed from word `top` on
/// (moved past them), the optimizer's kernels, and batch norm's running-statistics updates.
pub(super) fn training(
    plan: &GpuPlan,
    offsets: &[usize],
    levels: &Levels,
    limits: &DeviceLimits,
    top: &mut usize,
    sources: &mut Sources,
) -> Result<Option<Training>, GpuError> {
    if plan.mode != Mode::Train || plan.grads.is_empty() {
        return Ok(None);
    }
    let width = limits.workgroup_width(256);
    let spec = &plan.optimizer;
    let (mut params, partials) = trained_params(plan, offsets, limits, top)?;
    // The global norm's scratch: the factor, the verdict, then the partial sums.
    let scratch = *top;
    // A loss-scaled plan's gradients carry the scale its parameter holds.
    let scale_word = loss_scale_word(plan, offsets);
    let verdict = scale_word.map(|_| scratch + 1);
    let norm = (spec.clip_norm.is_some() || scale_word.is_some()).then(|| {
        for t in &mut params {
            t.partials += scratch + 2;
        }
        *top += 2 + partials;
        let at = &"the optimizer's global norm";
        let sq = sources.add("sum_squares", update::sum_squares_kernel(width), at);
        let (clip, first) = (spec.clip_norm, scratch + 2);
        let words =
            update::NormWords { partials: first, factor: scratch, verdict, scale: scale_word };
        let fin = update::clip_scale_kernel(width, partials, clip, &words);
        (sq, sources.add("clip_scale", fin, at))
    });
    let factor = norm.map(|_| scratch);
    let body = update::update_kernel(spec, width, factor, verdict);
    let update_kernel = sources.add("optimizer", body, &"the optimizer");
    let bn_kernel =
        sources.add("running_stats", update::running_stats_kernel(width), &"batch norm");
    let bn = running_stats_updates(plan, offsets, levels, limits)?;
    Ok(Some(Training { bn, bn_kernel, params, update_kernel, norm, verdict }))
}

/// The word holding a loss-scaled plan's scale (its parameter's).
fn loss_scale_word(plan: &GpuPlan, offsets: &[usize]) -> Option<usize> {
    let ls = plan.loss_scaling.as_ref()?;
    let param = GpuOp::Plan(Op::Param { index: ls.param });
    plan.steps.iter().position(|s| s.op == param).map(|p| offsets[p])
}

/// Each trained parameter's regions (its optimizer state placed from word `top` on) and grids,
/// and the words of the clipping partial sums they take together.
fn trained_params(
    plan: &GpuPlan,
    offsets: &[usize],
    limits: &DeviceLimits,
    top: &mut usize,
) -> Result<(Vec<TrainedParam>, usize), GpuError> {
    let width = limits.workgroup_width(256);
    let (has_m, has_v) = update::buffers(&plan.optimizer);
    let param_step: HashMap<usize, usize> = (0..plan.steps.len())
        .filter_map(|i| match plan.steps[i].op {
            GpuOp::Plan(Op::Param { index }) => Some((index, i)),
            _ => None,
        })
        .collect();
    let grid = |g: usize| fold_grid(g as u64, limits).map_err(|e| GpuError::Failed(e.to_string()));
    let mut trained = Vec::new();
    let mut partials = 0usize;
    for &(p, g) in &plan.grads {
        let Some(&ps) = param_step.get(&p) else { continue };
        let spec = &plan.params[p];
        if spec.dtype != mgn_ir::DType::F32 {
            return Err(GpuError::Failed(format!(
                "`{}` is a trained {} parameter; the GPU's optimizer updates f32 parameters \
                 (declare it f32: `--precision mixed` rounds it for the products that read it)",
                spec.name, spec.dtype
            )));
        }
        let n = plan.steps[ps].shape.iter().product::<usize>().max(1);
        let mut take = |on: bool| {
            on.then(|| {
                *top += n;
                *top - n
            })
        };
        let (m, v) = (take(has_m), take(has_v));
        trained.push(TrainedParam {
            index: p,
            offset: offsets[ps],
            grad: offsets[g as usize],
            m,
            v,
            n,
            partials,
            has_state: false,
            update_groups: grid(n.div_ceil(width as usize))?,
            norm_groups: grid(update::norm_groups(n, width))?,
        });
        partials += update::norm_groups(n, width);
    }
    Ok((trained, partials))
}

/// (level, parameter block, grid) of each training batch norm's running-statistics update.
pub(super) fn running_stats_updates(
    plan: &GpuPlan,
    offsets: &[usize],
    levels: &Levels,
    limits: &DeviceLimits,
) -> Result<Vec<(usize, Params, [u32; 3])>, GpuError> {
    let mut bn = Vec::new();
    for (i, s) in plan.steps.iter().enumerate() {
        let (Some(Op::BatchNorm { momentum, .. }), Some(level)) =
            (s.op.updates_running_stats(), levels.bn_update[i])
        else {
            continue;
        };
        let x = &plan.steps[s.inputs[0] as usize].shape;
        let (n, c) = (x[0], x.get(1).copied().unwrap_or(1));
        let sp: usize = x.iter().skip(2).product();
        let [mut xo, rm, rv] = [0, 1, 2].map(|k| offsets[s.inputs[k] as usize] as u32);
        // From the norm's moments when it has them (its last operand), else from x.
        let (mut chunk, mut chunks) = (0, 0);
        if let GpuOp::BatchNormWithMoments { norm, chunk: size, .. } = &s.op {
            let m =
                s.inputs[crate::program::norm_operands(norm).map_err(GpuError::Failed)?] as usize;
            (xo, chunk, chunks) = (offsets[m] as u32, *size as u32, plan.steps[m].shape[1] as u32);
        }
        let q1 = [n as u32, c as u32, sp as u32, chunks];
        let mut p = params_block(&[&[xo, rm, rv, chunk][..], &q1].concat());
        p[8] = (*momentum as f32).to_bits();
        let groups = fold_grid(c as u64, limits).map_err(|e| GpuError::Failed(e.to_string()))?;
        bn.push((level, p, groups));
    }
    Ok(bn)
}
