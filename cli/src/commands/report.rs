//! Printing diagnostics and plain errors in the chosen message format.

use mgn_compiler::render::{render, to_json};
use mgn_compiler::Outcome;
use std::io::IsTerminal;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum MessageFormat {
    /// Rendered diagnostics with source excerpts.
    Human,
    /// One JSON object per diagnostic per line (for editors and CI tools).
    Json,
}

/// Prints the outcome's diagnostics; returns true when there were none.
pub fn diagnostics(outcome: &Outcome, format: MessageFormat) -> bool {
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

/// An error that is not about a source location (unreadable file, bad checkpoint).
pub fn error(message: &str, format: MessageFormat) {
    match format {
        MessageFormat::Human => eprintln!("error: {message}"),
        MessageFormat::Json => println!(
            "{}",
            serde_json::json!({ "severity": "error", "code": "E0000", "message": message })
        ),
    }
}
