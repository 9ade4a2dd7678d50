//! Getting a plan for `run`, `train` and `eval`: compile a `.mgn` file, or load a `.mgnplan`.

use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_compiler::rewrite::Rewrites;
use mgn_ir::precision::Precision;
use mgn_ir::DType;
use mgn_runtime::Plan;
use std::path::Path;

/// `--rewrites`: the engine that rewrites a model's graph before it is lowered to a plan
/// (`mgn_compiler::rewrite`), for every command that compiles one.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, clap::ValueEnum)]
pub enum RewriteEngine {
    /// No rewrites: the graph as elaborated and differentiated (to measure the others).
    None,
    /// Greedy local rules.
    #[default]
    Greedy,
    /// Equality saturation through egglog; needs an mgnc built with `--features egglog`.
    Egglog,
}

impl From<RewriteEngine> for Rewrites {
    fn from(e: RewriteEngine) -> Rewrites {
        match e {
            RewriteEngine::None => Rewrites::None,
            RewriteEngine::Greedy => Rewrites::Greedy,
            RewriteEngine::Egglog => Rewrites::Egglog,
        }
    }
}

/// `--precision`: the precision policy of the plans a command compiles
/// (`mgn_ir::precision`, `mgn_compiler::precision`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, clap::ValueEnum)]
pub enum PrecisionArg {
    /// Every float in f32 (the default).
    #[default]
    F32,
    /// Matrix products, convolutions and attention read f16 operands and accumulate in f32;
    /// training scales its loss dynamically. The same as mixed-f16.
    Mixed,
    /// The same as mixed.
    MixedF16,
    /// As mixed, with bf16 operands (f32's range: no loss scaling).
    MixedBf16,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Mixed | PrecisionArg::MixedF16 => Precision::MixedF16,
            PrecisionArg::MixedBf16 => Precision::MixedBf16,
        }
    }
}

/// `--quantize TYPE`: a packed type (`mgn_ir::dtype::PACKED`) for the weights a plan does not
/// train (`mgn_compiler::quantize`).
pub fn parse_quantize(s: &str) -> Result<DType, String> {
    let names: Vec<&str> = mgn_ir::dtype::PACKED.iter().map(|d| d.name()).collect();
    DType::from_name(&s.to_ascii_lowercase())
        .filter(|d| d.is_packed())
        .ok_or_else(|| format!("`{s}` is not a packed type; the types are {}", names.join(", ")))
}

/// The line `--quantize` prints once a plan is compiled: how many weights took which type,
/// and the parameters' bytes before and after (human output only, on stderr).
pub fn quantize_note(plan: &Plan, opts: &PlanOptions, format: MessageFormat) {
    if let (Some(asked), MessageFormat::Human) = (opts.quantize, format) {
        eprintln!("{}", mgn_compiler::quantize::Summary::of_plan(plan, asked));
    }
}

/// Compiles `file` with `opts`, or loads it when it is a `.mgnplan`. Errors are printed;
/// `Err` carries the exit code.
pub fn obtain(
    file: &Path,
    model: Option<String>,
    settings: Vec<Setting>,
    opts: &PlanOptions,
    format: MessageFormat,
) -> Result<Plan, u8> {
    if file.extension().is_some_and(|e| e == "mgnplan") {
        if !settings.is_empty() || model.is_some() {
            report::error(
                "`--set` and `--model` apply when compiling a .mgn file; a .mgnplan is already \
                 built",
                format,
            );
            return Err(super::EXIT_ERRORS);
        }
        let plan = Plan::load(file).map_err(|e| {
            report::error(&e.to_string(), format);
            super::EXIT_ERRORS
        })?;
        if !opts.precision.is_f32() && plan.precision != opts.precision {
            report::error(
                &format!(
                    "`--precision {}` applies when compiling a .mgn file; {} was built with \
                     precision {}",
                    opts.precision,
                    file.display(),
                    plan.precision
                ),
                format,
            );
            return Err(super::EXIT_ERRORS);
        }
        if opts.quantize.is_some() {
            report::error(
                &format!(
                    "`--quantize` applies when compiling a .mgn file; {} is already built",
                    file.display()
                ),
                format,
            );
            return Err(super::EXIT_ERRORS);
        }
        return Ok(plan);
    }
    match mgn_compiler::driver::plan_path(file, model, settings, opts) {
        Ok((outcome, plan)) => {
            if !report::diagnostics(&outcome, format) {
                return Err(super::EXIT_ERRORS);
            }
            Ok(plan.expect("a clean build lowers to a plan"))
        }
        Err(e) => {
            report::file_error(file, &e, format);
            Err(super::EXIT_ERRORS)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Backend {
    /// A hardware GPU when there is one, else the CPU (with a notice).
    Auto,
    Cpu,
    Vulkan,
    Metal,
}

/// Where a command's sessions run, from `--backend`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Engine {
    Cpu,
    /// The GPU; `forced` when asked for by name (then failing to use it is an error).
    Gpu {
        forced: bool,
    },
    /// `--backend auto` until the first session asks (`settle`): the device list is read
    /// while the model compiles.
    Auto,
}

impl Engine {
    /// The engine a session runs on: `Auto` takes a hardware GPU when the device list has one,
    /// else the CPU with a one-line notice (decided, and noted, once per process).
    pub fn settle(self, format: MessageFormat) -> Engine {
        static AUTO: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
        match self {
            Engine::Auto => *AUTO.get_or_init(|| auto_engine(format)),
            e => e,
        }
    }
}

/// What `auto` runs on, with the notice when it is the CPU.
fn auto_engine(format: MessageFormat) -> Engine {
    let note = |m: &str| {
        if format == MessageFormat::Human {
            eprintln!("note: {m}");
        }
    };
    let devices = mgn_gpu::probe::devices();
    match devices.as_ref().map_err(Clone::clone).and_then(|ds| mgn_gpu::probe::choose(ds).cloned())
    {
        Ok(d) if !d.software => Engine::Gpu { forced: false },
        Ok(d) => {
            note(&format!(
                "no hardware GPU (only {}); running on the CPU backend (`--backend vulkan` uses \
                 it anyway)",
                d.name
            ));
            Engine::Cpu
        }
        Err(why) => {
            note(&format!("no GPU can be used ({why}); running on the CPU backend"));
            Engine::Cpu
        }
    }
}

/// `auto` takes a hardware GPU when there is one, else the CPU with a one-line notice (when the
/// first session opens: `Engine::settle`); `vulkan` and `metal` insist on the GPU. Either way
/// the devices are listed in the background from here on, while the model compiles.
pub fn resolve_backend(b: Backend, format: MessageFormat) -> Result<Engine, u8> {
    match b {
        Backend::Cpu => Ok(Engine::Cpu),
        Backend::Vulkan if cfg!(any(target_os = "macos", target_os = "ios")) => {
            report::error(
                "this build talks to the GPU through Metal on Apple platforms; use \
                 `--backend metal`",
                format,
            );
            Err(super::EXIT_ERRORS)
        }
        Backend::Metal if !cfg!(any(target_os = "macos", target_os = "ios")) => {
            report::error("Metal exists only on Apple platforms; use `--backend vulkan`", format);
            Err(super::EXIT_ERRORS)
        }
        Backend::Vulkan | Backend::Metal => {
            mgn_gpu::probe::list_in_background();
            Ok(Engine::Gpu { forced: true })
        }
        Backend::Auto => {
            mgn_gpu::probe::list_in_background();
            Ok(Engine::Auto)
        }
    }
}

/// Moves a session onto the GPU when the engine says so; the device's name when it is there. A
/// forced GPU that cannot run the plan is an error; otherwise the session stays on the CPU with
/// a notice.
pub fn attach(
    session: &mut mgn_runtime::session::Session,
    engine: Engine,
    format: MessageFormat,
) -> Result<Option<String>, u8> {
    let Engine::Gpu { forced } = engine.settle(format) else { return Ok(None) };
    match session.use_gpu() {
        Ok(name) => {
            if format == MessageFormat::Human {
                eprintln!("running on {name}");
            }
            Ok(Some(name))
        }
        Err(e) if forced => {
            report::error(&e.to_string(), format);
            Err(super::EXIT_ERRORS)
        }
        Err(e) => {
            if format == MessageFormat::Human {
                eprintln!("note: {e}; running on the CPU backend");
            }
            Ok(None)
        }
    }
}
