//! Checking a plan's kernels without a device: every step's kernel generated as a GPU session
//! would make it and validated by naga (`mgnc build` runs this), and naga's validation of one
//! kernel's source.

use super::{generate, step_operands, Target};
use crate::halves::F16Rounding;
use crate::program::GpuOp;
use mgn_ir::op::Op;

/// What checking a plan's kernels found: how many steps have kernels, the steps without one
/// (with the reason), and kernels naga rejects (a generator bug: with naga's message).
#[derive(Debug, Default)]
pub struct PlanKernels {
    pub with_kernel: usize,
    /// Distinct kernels among them (one pipeline each on a device).
    pub distinct: usize,
    /// Dependency levels the dispatches run in (one barrier between levels: `schedule.rs`).
    pub levels: usize,
    pub missing: Vec<(usize, String)>,
    pub invalid: Vec<(usize, String)>,
    /// Why no GPU could run the plan at all (its arena past 32-bit word offsets), when so; then
    /// no kernel is generated.
    pub too_large: Option<String>,
    /// Bytes of inputs and values in the arena as the GPU runs the plan (after its rewrites,
    /// parameters and optimizer state not counted).
    pub arena_values_bytes: u64,
    /// Bytes of the parameters as the arena holds them (an inference plan holds weights its
    /// products read in half precision as halves: `rewrite::halves`).
    pub arena_param_bytes: u64,
    /// Why the GPU cannot make one program of a dynamic plan (`dynamic::program`), when so;
    /// then no kernel is generated.
    pub no_program: Option<String>,
}

/// Generates every step's kernel as a GPU session would (after its rewrites, with its arena
/// layout, for the given limits) and validates each with naga, without a device — `mgnc build`
/// runs this at build time. Steps are reported by their number in `plan`; a step a rewrite
/// inserted by the step it was made for.
pub fn check_plan(plan: &mgn_ir::plan::Plan, limits: &crate::limits::DeviceLimits) -> PlanKernels {
    let (program, dynamic) = match &plan.dynamic {
        None => (crate::rewrite::for_gpu(plan), None),
        Some(_) => {
            let options = crate::rewrite::Options::from_env().unwrap_or_default();
            match crate::dynamic::program(plan, &options) {
                Ok((p, d)) => (p, Some(d)),
                Err(e) => {
                    return PlanKernels { no_program: Some(e.to_string()), ..Default::default() }
                }
            }
        }
    };
    let plan = &program;
    let follows = |v: usize| match &dynamic {
        Some(d) => d.dims(v, plan.steps[v].shape.len()),
        None => Vec::new(),
    };
    let (layout, levels) = crate::memory::plan_arena_and_levels(plan);
    // Only what every GPU shares bounds a plan here: its word offsets are 32-bit.
    let any_device = crate::limits::DeviceLimits { max_storage_buffer_range: u64::MAX, ..*limits };
    if let Err(why) = crate::memory::check_fits(plan, layout.total_words, &any_device, None) {
        return PlanKernels { too_large: Some(why), ..Default::default() };
    }
    let target = Target::of(limits);
    let training = plan.mode == mgn_ir::plan::Mode::Train;
    let values = (layout.total_words - layout.param_words) as u64 * 4;
    let params = layout.param_words as u64 * 4;
    let mut out = PlanKernels {
        levels: levels.count,
        arena_values_bytes: values,
        arena_param_bytes: params,
        ..PlanKernels::default()
    };
    // The first step of each distinct kernel, and its body.
    let mut distinct: Vec<(usize, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let root = crate::memory::view_roots(plan);
    let views = crate::memory::ReadViews::of(plan);
    for (i, s) in plan.steps.iter().enumerate() {
        // Inputs and parameters are uploaded, views share their root's words: no kernel.
        if matches!(s.op, GpuOp::Plan(Op::Input { .. } | Op::Param { .. })) || root[i] != i {
            continue;
        }
        let given = plan.origins[i].0 as usize;
        let (inputs, output, _) = step_operands(plan, &layout.offsets, &views, i, &follows);
        match generate(&s.op, plan.ids[i], &inputs, &output, target, training) {
            Err(why) => out.missing.push((given, why)),
            Ok(src) => {
                out.with_kernel += 1;
                if seen.insert(src.body.clone()) {
                    distinct.push((given, src.body));
                }
            }
        }
    }
    out.distinct = distinct.len();
    // naga's parsing takes time quadratic in a function's expressions (its typifier skips
    // through every expression typed so far for each new one): a large convolution takes
    // ~20 ms, a training plan's kernels most of a second on one core.
    let check = |(given, body): &(usize, String)| validate_once(body).err().map(|e| (*given, e));
    let all_cores = usize::MAX;
    let (checked, ()) = crate::taking_turns::map_taking_turns(&distinct, all_cores, check, || ());
    for (k, c) in checked.into_iter().enumerate() {
        let lost = || {
            (
                distinct[k].0,
                "naga panicked checking this kernel or another on its thread".to_string(),
            )
        };
        out.invalid.extend(c.unwrap_or_else(|| Some(lost())));
    }
    out
}

/// `validate`, but a body naga accepted earlier in this process is not parsed again:
/// `mgnc build --watch` builds again on every save, and most kernels come out the same.
fn validate_once(body: &str) -> Result<(), String> {
    let key = body_key(body);
    if accepted().lock().is_ok_and(|a| a.contains(&key)) {
        return Ok(());
    }
    validate(body)?;
    if let Ok(mut a) = accepted().lock() {
        a.insert(key);
    }
    Ok(())
}

/// The bodies naga has accepted in this process, by `body_key`.
fn accepted() -> &'static std::sync::Mutex<std::collections::HashSet<u64>> {
    static ACCEPTED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<u64>>> =
        std::sync::OnceLock::new();
    ACCEPTED.get_or_init(Default::default)
}

/// A 64-bit hash of a kernel body: two bodies of one process sharing one is a 2^-64 chance a
/// pair, where keeping the bodies themselves would hold megabytes.
fn body_key(body: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

/// What naga says of a kernel body (with the prelude every kernel is compiled with).
pub fn validate(body: &str) -> Result<(), String> {
    checked(body, F16Rounding::SOFTWARE).map(drop)
}

/// A kernel body with the prelude, parsed and validated by naga as a device would: bindings
/// given (blade assigns them when it builds the pipeline), and the capabilities a device grants
/// a kernel that asks (blade validates against the device's own). `rounding` defines the f16
/// rounding functions the body calls (`device::source`).
fn checked(
    body: &str,
    rounding: F16Rounding,
) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let full = crate::device::source(body, rounding);
    let mut m = naga::front::wgsl::parse_str(&full).map_err(|e| e.emit_to_string(&full))?;
    for (k, (_, g)) in m.global_variables.iter_mut().enumerate() {
        let bound =
            matches!(g.space, naga::AddressSpace::Storage { .. } | naga::AddressSpace::Uniform);
        if g.binding.is_none() && bound {
            g.binding = Some(naga::ResourceBinding { group: 0, binding: k as u32 });
        }
    }
    let caps = naga::valid::Capabilities::SHADER_FLOAT16
        | naga::valid::Capabilities::COOPERATIVE_MATRIX
        | naga::valid::Capabilities::SUBGROUP;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&m)
        .map_err(|e| format!("{e:?}"))?;
    Ok((m, info))
}

/// naga's validation of a kernel and its translation to SPIR-V, as blade does on a device: with
/// the f16 rounding in hardware both ways too, as a device whose probe passed compiles it.
#[cfg(test)]
pub fn spirv(body: &str) -> Result<Vec<u32>, String> {
    let hardware = F16Rounding { staged: true, rounded: true };
    checked(body, hardware).map_err(|e| format!("with the f16 rounding in hardware: {e}"))?;
    let (module, info) = checked(body, F16Rounding::SOFTWARE)?;
    let options =
        naga::back::spv::Options { lang_version: (1, 3), ..naga::back::spv::Options::default() };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use crate::test_util::step;
    use mgn_ir::op::{Op, UnaryOp};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::DType;

    fn relu_of(shape: &[usize]) -> Plan {
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], DType::F32, shape),
            step(Op::Unary(UnaryOp::Relu), vec![0], DType::F32, shape),
        ];
        Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 1)])
    }

    #[test]
    fn plans_past_32_bit_offsets_are_refused_in_the_models_terms_before_any_kernel() {
        let limits = crate::limits::DeviceLimits::MIN_SPEC;
        let fine = super::check_plan(&relu_of(&[4, 8]), &limits);
        assert!(fine.too_large.is_none() && fine.with_kernel == 1 && fine.invalid.is_empty());
        // 2^31 × 128 floats: a WGSL literal no 32-bit offset holds (it failed naga before).
        let huge = super::check_plan(&relu_of(&[1 << 31, 128]), &limits);
        let why = huge.too_large.expect("refused");
        assert!(why.contains("`relu` f32[2147483648, 128] at t.mgn:1:1"), "{why}");
        assert_eq!((huge.with_kernel, huge.invalid.len()), (0, 0), "no kernel was generated");
    }

    #[test]
    fn only_bodies_naga_accepted_are_remembered() {
        let fine = "@compute @workgroup_size(1)\nfn main() { let x = 1u + 2u; }\n";
        let wrong = "@compute @workgroup_size(1)\nfn main() { let x = 1u + 2.5; }\n";
        assert!(super::validate_once(fine).is_ok());
        assert!(super::accepted().lock().unwrap().contains(&super::body_key(fine)));
        assert!(super::validate_once(fine).is_ok());
        for _ in 0..2 {
            assert!(super::validate_once(wrong).is_err());
            assert!(!super::accepted().lock().unwrap().contains(&super::body_key(wrong)));
        }
    }
}
