//! `mgnc`, the mgn command-line compiler.

use clap::{Parser, Subcommand};
use mgn_compiler::cli::build::{BuildArgs, Emit, PlanMode};
use mgn_compiler::cli::report::MessageFormat;
use mgn_compiler::cli::{build, check};
use mgn_compiler::elab::Setting;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "mgnc", version, about = "The mgn model compiler: check, build, run and train .mgn models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check files for errors; every model in each file is elaborated with its default arguments.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
    /// Build a model: print a summary or its graph IR, and write a plan with `-o`.
    Build {
        file: PathBuf,
        /// What to print.
        #[arg(long, value_enum, default_value = "summary")]
        emit: Emit,
        /// Inference plan (outputs only) or training plan (loss, gradients, optimizer update).
        #[arg(long, value_enum, default_value = "infer")]
        mode: PlanMode,
        /// Write the plan to this `.mgnplan` file.
        #[arg(short, long, value_name = "OUT.mgnplan")]
        out: Option<PathBuf>,
        /// Override a model argument, e.g. `--set T=1` (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<Setting>,
        /// Which model to build when the file defines several.
        #[arg(long)]
        model: Option<String>,
        /// Freeze parameters whose name is this or starts with it and a dot (repeatable).
        #[arg(long, value_name = "NAME")]
        freeze: Vec<String>,
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Check { files, message_format } => check::run(&files, message_format),
        Command::Build { file, emit, mode, out, set, model, freeze, message_format } => {
            build::run(BuildArgs { file, emit, settings: set, model, mode, out, freeze, format: message_format })
        }
    };
    ExitCode::from(code)
}
