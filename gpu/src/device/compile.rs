//! Kernels into pipelines: WGSL (the shared prelude and a generated body) through naga and the
//! driver's compiler, many at once.

use super::{Bindings, Kernel};
use crate::halves::F16Rounding;
use blade_graphics as gpu;

/// The WGSL declarations every kernel starts with.
pub const PRELUDE: &str = "struct Params { p: array<vec4<u32>, 8> }
var<storage, read_write> arena: array<u32>;
var<uniform> params: Params;
";

/// A kernel's whole source: the prelude, the half types' conversions (`crate::halves`) and
/// the packed types' element functions (`crate::packed`) when the body calls them — an f32
/// kernel carries none of them, so no driver spends its compile time on functions nothing
/// calls — and the generated body. The f16 rounding functions are
/// defined for the device's `rounding` here, not in the body, so a body is the same on every
/// device (`kernels::generate` needs only the device's limits) and one compiled with hardware
/// rounding gets the `enable f16` it then needs.
pub fn source(body: &str, rounding: F16Rounding) -> String {
    let (conversions, needs_f16) = crate::halves::conversions(body, rounding);
    // A body rounding in hardware alone calls none of them.
    let calls = |text: &str| crate::halves::calls_functions(text);
    // A packed parameter's element functions (`crate::packed`) read its f16 scales.
    let packed = crate::packed::functions(body);
    let halves = if calls(body) || calls(&conversions) || calls(&packed) {
        crate::halves::FUNCTIONS
    } else {
        ""
    };
    let conversions = conversions + &packed;
    let mut enables: Vec<&str> = body.lines().filter(|l| l.starts_with("enable ")).collect();
    if needs_f16 && !enables.contains(&"enable f16;") {
        enables.push("enable f16;");
    }
    // WGSL wants `enable` directives (f16, cooperative matrices) before any declaration, and
    // a kernel's may follow the functions another generator put ahead of it (a product's
    // epilogue), so they go ahead of the prelude.
    if enables.is_empty() {
        return format!("{PRELUDE}{halves}{conversions}{body}");
    }
    let rest: Vec<&str> = body.lines().filter(|l| !l.starts_with("enable ")).collect();
    format!("{}\n{PRELUDE}{halves}{conversions}{}\n", enables.join("\n"), rest.join("\n"))
}

/// One kernel's pipeline. WGSL that naga rejects is an error with its message.
pub(super) fn compile(
    ctx: &gpu::Context,
    name: &str,
    body: &str,
    rounding: F16Rounding,
) -> Result<Kernel, String> {
    let start = std::time::Instant::now();
    let source = source(body, rounding);
    let module = naga::front::wgsl::parse_str(&source)
        .map_err(|e| format!("kernel `{name}`: {}", e.emit_to_string(&source)))?;
    let shader = ctx
        .try_create_shader(gpu::ShaderDesc { source: &source, naga_module: Some(module) })
        .map_err(|e| format!("kernel `{name}`: {e}"))?;
    let layout = <Bindings as gpu::ShaderData>::layout();
    let pipeline = ctx.create_compute_pipeline(gpu::ComputePipelineDesc {
        name,
        data_layouts: &[&layout],
        compute: shader.at("main"),
    });
    if statistics_wanted() {
        report_statistics(ctx, name, &pipeline);
    }
    Ok(Kernel { pipeline, name: name.to_string(), compile_time: start.elapsed() })
}

/// Whether `MGN_PIPELINE_STATS=1` asks for each pipeline's statistics.
pub(super) fn statistics_wanted() -> bool {
    std::env::var("MGN_PIPELINE_STATS").is_ok_and(|v| v == "1")
}

/// One line on stderr per pipeline with the statistics its driver reports
/// (`VK_KHR_pipeline_executable_properties`: register counts and spills on most drivers): a
/// kernel that spills, or whose registers leave the SM room for one workgroup, is found here
/// rather than guessed at from its time. Nothing where the driver reports none.
fn report_statistics(ctx: &gpu::Context, name: &str, pipeline: &gpu::ComputePipeline) {
    for exe in ctx.get_pipeline_statistics(pipeline) {
        let stats: Vec<String> =
            exe.statistics.iter().map(|s| format!("{}={}", s.name, s.value)).collect();
        eprintln!("pipeline `{name}` ({}): {}", exe.name, stats.join(", "));
    }
}

const CRASHED: &str = "the driver crashed while compiling a kernel";

/// Every `(name, body)` compiled on threads up to the machine's cores (at most 16), taking
/// turns (`taking_turns`), while this thread runs `during`. Results in the given order.
pub(super) fn compile_all_while<R>(
    ctx: &gpu::Context,
    sources: &[(String, String)],
    rounding: F16Rounding,
    during: impl FnOnce() -> R,
) -> (Vec<Result<Kernel, String>>, R) {
    let _no_device_opens_or_closes = super::compiling();
    let compiled = |(name, body): &(String, String)| compile(ctx, name, body, rounding);
    let (done, r) = crate::taking_turns::map_taking_turns(sources, 16, compiled, during);
    // A thread that panicked (the driver crashed) lost the kernels it had compiled.
    let out = done.into_iter().map(|k| k.unwrap_or_else(|| Err(CRASHED.to_string()))).collect();
    (out, r)
}
