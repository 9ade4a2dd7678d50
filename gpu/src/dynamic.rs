//! Dynamic plans on the GPU (`Plan::dynamic`): one program, one arena and one set of pipelines for
//! every size in the plan's range.
//!
//! The program is the GPU's rewrites of the plan at its bound, and each of its numbers that follows
//! the sizes is fitted as a polynomial from the programs made at the corners of the sizes
//! (`Probes::corners`), where the passes make the bound's choices again (`Choices`). At a run's
//! sizes the program is the bound's with those numbers written (`DynamicProgram::at`) and typed
//! again (`GpuPlan::validate`, with the GPU's own ops' shape rules), so a shape the corners fitted
//! wrongly is refused, never computed. The passes' choices stay the bound's at every size: each op
//! computes the same function at any shape its rule accepts. Memory is planned at the bound, where
//! every value is largest; kernels read the sizes from their parameter block
//! (`kernels::SIZE_WORD`), so most steps keep one pipeline for every size.

use crate::program::Choices;
use crate::program::GpuPlan;
use crate::rewrite::{for_gpu_choosing, Options};
use crate::GpuError;
use mgn_ir::dynamic::{fit, patch_steps, sites_of, size_field, Poly, Probes, Site, SizeVar};
use mgn_ir::plan::Plan;
use serde_json::Value;

/// A dynamic plan's GPU program: the plan it came from (its inputs give a run's sizes) and
/// the program's sites, in step order.
pub struct DynamicProgram {
    pub plan: Plan,
    pub sites: Vec<Site>,
}

/// The numbers of a program step (as JSON) that may follow the sizes: its shape, and a plan
/// op's lengths (`mgn_ir::dynamic::size_field`); never the GPU's own ops' attributes (split
/// counts, chunks), which stay the bound's.
fn program_size_field(at: &str) -> bool {
    match at.strip_prefix("/op/Plan") {
        Some(rest) => size_field(&format!("/op{rest}")),
        None => size_field(at),
    }
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("programs serialize")
}

/// `program` for a device that holds `limits` and has `memory` bytes (when known): as
/// `rewrite::for_device` does for a static plan, attentions whose score matrices would make
/// the bound's arena larger than the device holds run whole, when that fits.
pub fn program_for_device(
    plan: &Plan,
    options: &Options,
    limits: &crate::limits::DeviceLimits,
    memory: Option<u64>,
) -> Result<(GpuPlan, DynamicProgram), GpuError> {
    let made = program(plan, options)?;
    let whole = |o: &Options| program(plan, o).ok();
    use crate::rewrite::whole_where_scores_do_not_fit as fit;
    Ok(fit(made, whole, |m| &m.0, options, limits, memory))
}

/// The program of `plan` at its bound, and how its numbers follow the sizes.
pub fn program(plan: &Plan, options: &Options) -> Result<(GpuPlan, DynamicProgram), GpuError> {
    let d = plan.dynamic.as_ref().expect("a dynamic plan");
    let probes = Probes::corners(&d.sizes);
    let options = Options { dynamic: true, ..*options };
    let failed = |e: String| GpuError::Failed(format!("{}: {e}", plan.model));
    // The bound's choices (split counts, attention paths), made again at the other corners.
    let (first, choices) = for_gpu_choosing(plan, &options, Choices::default());
    let mut programs = vec![first];
    for point in &probes.points[1..] {
        let at = plan.at(point).map_err(failed)?;
        programs.push(for_gpu_choosing(&at, &options, choices.clone().replaying()).0);
    }
    let bound = &programs[0];
    let differ = |what: &str, point: &[usize]| {
        failed(format!(
            "the GPU's program differs at {} from the bound's in {what}: its rewrites decide by \
             size there (build with another bound)",
            describe(&d.sizes, point)
        ))
    };
    for (p, point) in programs.iter().zip(&probes.points).skip(1) {
        if p.steps.len() != bound.steps.len() {
            return Err(differ("its number of steps", point));
        }
        let same = p.ids == bound.ids
            && p.origins == bound.origins
            && p.inputs == bound.inputs
            && p.outputs == bound.outputs
            && p.grads == bound.grads
            && p.state_writes == bound.state_writes;
        if !same {
            return Err(differ("its inputs or results", point));
        }
    }
    let mut sites = Vec::new();
    for i in 0..bound.steps.len() {
        let values: Vec<Value> = programs.iter().map(|p| json(&p.steps[i])).collect();
        let refs: Vec<&Value> = values.iter().collect();
        let found = fit(&probes, &refs, &program_size_field).map_err(|m| {
            failed(format!(
                "{} ({}) does not follow the sizes in one way at the corners of {} (at {})",
                bound.step_name(i),
                bound.steps[i].loc,
                d.sizes.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", "),
                m.at()
            ))
        })?;
        sites.extend(found.into_iter().map(|(at, size)| Site { step: i as u32, at, size }));
    }
    let bound = programs.swap_remove(0);
    Ok((bound, DynamicProgram { plan: plan.clone(), sites }))
}

fn describe(sizes: &[SizeVar], point: &[usize]) -> String {
    let each: Vec<String> =
        sizes.iter().zip(point).map(|(v, n)| format!("{} = {n}", v.name)).collect();
    each.join(", ")
}

impl DynamicProgram {
    /// Every size at its largest.
    pub fn bound(&self) -> Vec<usize> {
        self.plan.dynamic.as_ref().map(|d| d.bound()).unwrap_or_default()
    }

    /// Per axis of step `i`'s shape, its polynomial when it follows the sizes.
    pub fn dims(&self, i: usize, rank: usize) -> Vec<Option<Poly>> {
        let mut dims = vec![None; rank];
        for s in sites_of(&self.sites, i) {
            let axis = s.at.strip_prefix("/shape/").and_then(|a| a.parse::<usize>().ok());
            if let Some(d) = axis.and_then(|a| dims.get_mut(a)) {
                *d = Some(s.size.clone());
            }
        }
        dims
    }

    /// The sizes of a run with these inputs (an error names the input and the range).
    pub fn sizes_of(&self, inputs: &[(&str, &mgn_ir::Tensor)]) -> Result<Vec<usize>, GpuError> {
        let d = self.plan.dynamic.as_ref().expect("a dynamic plan");
        let shapes: Vec<(&str, &[usize])> =
            inputs.iter().map(|(n, t)| (*n, t.shape.as_slice())).collect();
        d.sizes_of(&self.plan, &shapes).map_err(GpuError::Failed)
    }

    /// The program `bound` (made at the bound) at `sizes`, typed again.
    pub fn at(&self, bound: &GpuPlan, sizes: &[usize]) -> Result<GpuPlan, GpuError> {
        let d = self.plan.dynamic.as_ref().expect("a dynamic plan");
        let failed = |e: String| {
            GpuError::Failed(format!(
                "{} cannot run at {}: {e}",
                self.plan.model,
                d.describe_sizes(sizes)
            ))
        };
        let mut plan = bound.clone();
        patch_steps(&mut plan.steps, &self.sites, sizes).map_err(failed)?;
        plan.validate().map_err(failed)?;
        Ok(plan)
    }
}

/// Every kernel a GPU session of the dynamic plan `plan` generates at `sizes`, without a
/// device: (the step's op, its WGSL). What `tests/dynamic.rs` compares across sizes to find
/// the kernels that are not shared.
pub fn kernel_sources(
    plan: &Plan,
    sizes: &[usize],
    limits: &crate::limits::DeviceLimits,
) -> Result<Vec<(String, String)>, GpuError> {
    let options = Options::from_env().unwrap_or_default();
    let (bound, d) = program(plan, &options)?;
    let at = d.at(&bound, sizes)?;
    let layout = crate::memory::plan_arena(&bound);
    let root = crate::memory::view_roots(&at);
    let views = crate::memory::ReadViews::of(&at);
    let follows = |v: usize| d.dims(v, at.steps[v].shape.len());
    let target = crate::kernels::Target::of(limits);
    let training = at.mode == mgn_ir::plan::Mode::Train;
    let mut out = Vec::new();
    for (i, s) in at.steps.iter().enumerate() {
        let io = matches!(s.op, crate::program::GpuOp::Plan(mgn_ir::Op::Input { .. }));
        let param = matches!(s.op, crate::program::GpuOp::Plan(mgn_ir::Op::Param { .. }));
        if io || param || root[i] != i {
            continue;
        }
        let (inputs, output, _) =
            crate::kernels::step_operands(&at, &layout.offsets, &views, i, &follows);
        let src = crate::kernels::generate(&s.op, at.ids[i], &inputs, &output, target, training)
            .map_err(GpuError::Failed)?;
        out.push((format!("{} → {:?}", s.op.describe(), s.shape), src.body));
    }
    Ok(out)
}
