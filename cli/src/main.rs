//! `mgnc`, the mgn command-line compiler.

mod commands;

use clap::{Parser, Subcommand};
use crate::commands::build::{BuildArgs, Emit, PlanMode};
use crate::commands::report::MessageFormat;
use crate::commands::plan::Backend;
use crate::commands::run::{RunArgs, RunMode};
use crate::commands::train::{EvalArgs, OptimizerName, ScheduleName, TrainArgs};
use crate::commands::{build, check, fmt, run, train};
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
        /// Build again whenever the model or a file it imports changes, until Ctrl-C.
        #[arg(long)]
        watch: bool,
    },
    /// Run a model or plan once and write its outputs, loss and (with --grads) gradients.
    Run {
        /// A .mgn model or a .mgnplan.
        file: PathBuf,
        /// Parameters to load (safetensors, names as in the model); without it, the initializers run.
        #[arg(long)]
        weights: Option<PathBuf>,
        /// Load the parameters that match and report the rest, instead of refusing.
        #[arg(long)]
        partial: bool,
        /// Input tensors, named like the model's inputs (safetensors).
        #[arg(long)]
        inputs: PathBuf,
        /// Where to write `output.<name>`, `loss` and `grad.<param>` (safetensors).
        #[arg(long)]
        out: PathBuf,
        /// Also compute the gradient of the loss for every trainable parameter.
        #[arg(long)]
        grads: bool,
        #[arg(long, value_enum, default_value = "eval")]
        mode: RunMode,
        #[arg(long, value_enum, default_value = "auto")]
        backend: Backend,
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<Setting>,
        #[arg(long)]
        model: Option<String>,
        #[arg(long, value_name = "NAME")]
        freeze: Vec<String>,
        /// Seed for initializers (without --weights) and dropout.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Stop at the first NaN/Inf and name the op and model line (on by default in debug builds).
        #[arg(long)]
        check_numerics: bool,
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
    /// Train a model on a data set (safetensors with one tensor per model input).
    Train {
        file: PathBuf,
        #[arg(long)]
        data: PathBuf,
        /// Held-out data: accuracy after every epoch when the model classifies.
        #[arg(long)]
        eval_data: Option<PathBuf>,
        #[arg(long, default_value_t = 10)]
        epochs: u32,
        /// Batch size (sets the model argument `batch` or `B`).
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long, value_enum, default_value = "adam")]
        optimizer: OptimizerName,
        #[arg(long, default_value_t = 1e-3)]
        lr: f64,
        /// SGD momentum.
        #[arg(long, default_value_t = 0.9)]
        momentum: f64,
        /// AdamW decoupled weight decay.
        #[arg(long, default_value_t = 0.01)]
        weight_decay: f64,
        /// Clip gradients to this global norm.
        #[arg(long)]
        clip_norm: Option<f64>,
        #[arg(long, value_enum, default_value = "constant")]
        schedule: ScheduleName,
        /// Warm-up steps of the cosine schedule.
        #[arg(long, default_value_t = 0)]
        warmup: u64,
        /// Write a checkpoint here when training ends (and on Ctrl-C).
        #[arg(long)]
        save: Option<PathBuf>,
        /// Continue from a checkpoint (parameters, optimizer state and step).
        #[arg(long)]
        resume: Option<PathBuf>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<Setting>,
        #[arg(long)]
        model: Option<String>,
        #[arg(long, value_name = "NAME")]
        freeze: Vec<String>,
        #[arg(long, value_enum, default_value = "auto")]
        backend: Backend,
        #[arg(long)]
        check_numerics: bool,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
    /// Accuracy of a model or inference plan with given weights on a labelled data set.
    Eval {
        file: PathBuf,
        #[arg(long)]
        weights: PathBuf,
        #[arg(long)]
        data: PathBuf,
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<Setting>,
        #[arg(long)]
        model: Option<String>,
        #[arg(long, value_enum, default_value = "auto")]
        backend: Backend,
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
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
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Check { files, message_format } => check::run(&files, message_format),
        Command::Build { file, emit, mode, out, set, model, freeze, message_format, watch } => {
            build::run(BuildArgs { file, emit, settings: set, model, mode, out, freeze, format: message_format, watch })
        }
        Command::Run { file, weights, partial, inputs, out, grads, mode, backend, set, model, freeze, seed, check_numerics, message_format } => run::run(RunArgs {
            file,
            weights,
            partial,
            inputs,
            out,
            grads,
            mode,
            backend,
            settings: set,
            model,
            freeze,
            seed,
            check_numerics: check_numerics || cfg!(debug_assertions),
            format: message_format,
        }),
        Command::Train {
            file,
            data,
            eval_data,
            epochs,
            batch,
            optimizer,
            lr,
            momentum,
            weight_decay,
            clip_norm,
            schedule,
            warmup,
            save,
            resume,
            seed,
            set,
            model,
            freeze,
            backend,
            check_numerics,
            quiet,
            message_format,
        } => train::train(TrainArgs {
            file,
            data,
            eval_data,
            epochs,
            batch,
            optimizer,
            lr,
            momentum,
            weight_decay,
            clip_norm,
            schedule,
            warmup,
            save,
            resume,
            seed,
            settings: set,
            model,
            freeze,
            backend,
            check_numerics: check_numerics || cfg!(debug_assertions),
            quiet,
            format: message_format,
        }),
        Command::Eval { file, weights, data, batch, set, model, backend, message_format } => {
            train::eval(EvalArgs { file, weights, data, batch, settings: set, model, backend, format: message_format })
        }
        Command::Lsp => match mgn_lsp::run_stdio() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("mgnc lsp: {e}");
                1
            }
        },
        Command::Fmt { files, check } => fmt::run(&files, check),
    };
    ExitCode::from(code)
}
