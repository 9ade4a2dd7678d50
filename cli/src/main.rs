//! `mgnc`, the mgn command-line compiler. Each subcommand's arguments and behaviour live in
//! its module under `commands/`.

mod commands;

use crate::commands::bench::BenchArgs;
use crate::commands::build::BuildArgs;
use crate::commands::generate::GenerateArgs;
use crate::commands::import::ImportArgs;
use crate::commands::quantize::QuantizeArgs;
use crate::commands::report::MessageFormat;
use crate::commands::run::RunArgs;
use crate::commands::train::{EvalArgs, TrainArgs};
use crate::commands::tune::TuneArgs;
use crate::commands::{
    bench, build, check, fmt, generate, import, info, quantize, run, train, tune,
};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mgnc",
    version,
    about = "The mgn model compiler: check, build, run and train .mgn models"
)]
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
        #[arg(long = "message-format", value_enum, default_value = "human")]
        format: MessageFormat,
    },
    /// Build a model: print a summary or its graph IR, and write a plan with `-o`.
    Build(BuildArgs),
    /// Run a model or plan once and write its outputs, loss and (with --grads) gradients.
    Run(RunArgs),
    /// Train a model on a data set (safetensors with one tensor per model input).
    Train(TrainArgs),
    /// Accuracy of a model or inference plan with given weights on a labelled data set.
    Eval(EvalArgs),
    /// Measure compile time, forward, minimal-shape, backward and training-step latency, and
    /// memory.
    Bench(BenchArgs),
    /// Measure ahead of time the kernels a GPU chooses by measurement for a model's plans, so
    /// that later sessions (a deployed app's) open without measuring.
    Tune(TuneArgs),
    /// Generate text with a decode model (KV cache): prompt in, tokens streamed out.
    Generate(GenerateArgs),
    /// Turn an ONNX or GGUF model into readable `.mgn` source and a safetensors checkpoint.
    Import(ImportArgs),
    /// Quantize a checkpoint's weight matrices to a packed type (q8_0, q4_0, q4_1, q4_k, q6_k),
    /// written as safetensors or GGUF.
    Quantize(QuantizeArgs),
    /// GPU devices, their limits and features, and which one would be used.
    Info {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run the language server over stdin/stdout (for editors; see docs/EDITORS.md).
    Lsp,
    /// Rewrite files in the canonical layout (directories: every `.mgn` file under them).
    Fmt {
        /// Files or directories; `-` formats stdin to stdout.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write nothing: list the files that would change, and exit with 1 if there are any.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> ExitCode {
    // Behave like other Unix tools when the reader goes away (`mgnc build --emit ir | head`):
    // exit quietly instead of panicking on a broken pipe.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let code = match Cli::parse().command {
        Command::Check { files, format } => check::run(&files, format),
        Command::Build(a) => build::run(a),
        Command::Run(a) => run::run(a),
        Command::Train(a) => train::train(a),
        Command::Eval(a) => train::eval(a),
        Command::Bench(a) => bench::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Import(a) => import::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Info { json } => info::run(json),
        Command::Lsp => match mgn_lsp::run_stdio() {
            Ok(mgn_lsp::Ended::Cleanly) => 0,
            Ok(mgn_lsp::Ended::ExitWithoutShutdown) => 1,
            Err(e) => {
                eprintln!("mgnc lsp: {e}");
                1
            }
        },
        Command::Fmt { files, check } => fmt::run(&files, check),
    };
    // A device listing started in the background (`plan::resolve_backend`) ends before the
    // process does.
    mgn_gpu::probe::finish_listing();
    ExitCode::from(code)
}
