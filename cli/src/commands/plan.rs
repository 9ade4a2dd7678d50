//! Getting a plan for `run`, `train` and `eval`: compile a `.mgn` file, or load a `.mgnplan`.

use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_runtime::Plan;
use std::path::Path;

/// Compiles `file` with `opts`, or loads it when it is a `.mgnplan`. Errors are printed;
/// `Err` carries the exit code.
pub fn obtain(file: &Path, model: Option<String>, settings: Vec<Setting>, opts: &PlanOptions, format: MessageFormat) -> Result<Plan, u8> {
    if file.extension().is_some_and(|e| e == "mgnplan") {
        if !settings.is_empty() || model.is_some() {
            report::error("`--set` and `--model` apply when compiling a .mgn file; a .mgnplan is already built", format);
            return Err(super::EXIT_ERRORS);
        }
        return Plan::load(file).map_err(|e| {
            report::error(&e.to_string(), format);
            super::EXIT_ERRORS
        });
    }
    match mgn_compiler::driver::plan_path(file, model, settings, opts) {
        Ok((outcome, plan)) => {
            if !report::diagnostics(&outcome, format) {
                return Err(super::EXIT_ERRORS);
            }
            Ok(plan.expect("a clean build lowers to a plan"))
        }
        Err(e) => {
            report::error(&e, format);
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

/// The CPU backend is the only one built so far: say so plainly instead of pretending.
pub fn check_backend(b: Backend, format: MessageFormat) -> Result<(), u8> {
    match b {
        Backend::Cpu => Ok(()),
        Backend::Auto => {
            if format == MessageFormat::Human {
                eprintln!("note: this build of mgnc has no GPU backend yet; running on the CPU");
            }
            Ok(())
        }
        Backend::Vulkan | Backend::Metal => {
            report::error(&format!("the {} backend is not available in this build of mgnc; use `--backend cpu`", if b == Backend::Vulkan { "Vulkan" } else { "Metal" }), format);
            Err(super::EXIT_ERRORS)
        }
    }
}
