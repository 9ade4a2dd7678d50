//! `mgnc`, the mgn command-line compiler.

use clap::{Parser, Subcommand, ValueEnum};
use mgn_compiler::elab::Setting;
use mgn_compiler::ir::dump::{dump, thousands};
use mgn_compiler::render::{render, to_json};
use mgn_compiler::{check_path, Models, Outcome};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "mgnc", version, about = "The mgn model compiler: check and build .mgn models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MessageFormat {
    /// Rendered diagnostics with source excerpts.
    Human,
    /// One JSON object per diagnostic per line (for editors and CI tools).
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// One line per model: parameters, operations and build time.
    Summary,
    /// The graph IR: inputs, parameter table, every node with its shape and source line.
    Ir,
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
    /// Build a model to its graph IR.
    Build {
        file: PathBuf,
        /// What to print.
        #[arg(long, value_enum, default_value = "summary")]
        emit: Emit,
        /// Override a model argument, e.g. `--set T=1` (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<Setting>,
        /// Which model to build when the file defines several.
        #[arg(long)]
        model: Option<String>,
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { files, message_format } => {
            let mut failed = false;
            for f in files {
                let start = Instant::now();
                match check_path(&f, Models::All) {
                    Ok(outcome) => {
                        failed |= !report(&outcome, message_format);
                        if outcome.ok() && message_format == MessageFormat::Human {
                            eprintln!("checked {} ({} model{}) in {:.1} ms", f.display(), outcome.graphs.len(), if outcome.graphs.len() == 1 { "" } else { "s" }, ms(start));
                        }
                    }
                    Err(e) => {
                        failed = true;
                        io_error(&e, message_format);
                    }
                }
            }
            if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Build { file, emit, set, model, message_format } => {
            let start = Instant::now();
            let outcome = match check_path(&file, Models::One { name: model, settings: set }) {
                Ok(o) => o,
                Err(e) => {
                    io_error(&e, message_format);
                    return ExitCode::from(1);
                }
            };
            if !report(&outcome, message_format) {
                return ExitCode::from(1);
            }
            let elapsed = ms(start);
            let mut out = std::io::stdout().lock();
            for g in &outcome.graphs {
                let text = match emit {
                    Emit::Ir => dump(g, &outcome.program.sources),
                    Emit::Summary => format!(
                        "{}: {} parameters ({} trainable), {} operations, {} output{}{}; built in {elapsed:.1} ms\n",
                        g.model,
                        thousands(g.param_count(true) + g.param_count(false)),
                        thousands(g.param_count(true)),
                        thousands(g.nodes.len()),
                        g.outputs.len(),
                        if g.outputs.len() == 1 { "" } else { "s" },
                        if g.loss.is_some() { " and a loss" } else { "" }
                    ),
                };
                // A closed pipe (`| head`) is not an error worth a panic.
                if out.write_all(text.as_bytes()).is_err() {
                    break;
                }
            }
            ExitCode::SUCCESS
        }
    }
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// Prints the outcome's diagnostics; returns true when there were none.
fn report(outcome: &Outcome, format: MessageFormat) -> bool {
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    for d in &outcome.diagnostics {
        match format {
            MessageFormat::Human => eprint!("{}", render(&outcome.program.sources, d, color)),
            MessageFormat::Json => println!("{}", to_json(&outcome.program.sources, d)),
        }
    }
    if format == MessageFormat::Human && !outcome.diagnostics.is_empty() {
        let n = outcome.diagnostics.len();
        eprintln!("error: {n} error{} found", if n == 1 { "" } else { "s" });
    }
    outcome.ok()
}

fn io_error(e: &str, format: MessageFormat) {
    match format {
        MessageFormat::Human => eprintln!("error: {e}"),
        MessageFormat::Json => println!("{}", serde_json::json!({ "severity": "error", "code": "E0000", "message": e })),
    }
}
