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

/// A root file that cannot be read (E0000): as `error`, and in JSON with the file, and the line
/// and column of the first bad byte of a file that is not UTF-8, as source diagnostics carry
/// them, so an editor or a script places it without reading the message.
pub fn file_error(file: &std::path::Path, message: &str, format: MessageFormat) {
    if format == MessageFormat::Human {
        return error(message, format);
    }
    let mut v = serde_json::json!({
        "severity": "error",
        "code": "E0000",
        "message": message,
        "file": file.display().to_string(),
    });
    if let Some((line, column)) = utf8_place(message) {
        v["line"] = line.into();
        v["column"] = column.into();
    }
    println!("{v}");
}

/// The `(line L, column C)` that `mgn_compiler::source::decode` writes into its reason; the
/// reason is the only thing a read error carries.
fn utf8_place(message: &str) -> Option<(u64, u64)> {
    let at = message.rfind("(line ")?;
    let (line, rest) = message[at + 6..].split_once(", column ")?;
    let column = rest.split_once(')')?.0;
    Some((line.parse().ok()?, column.parse().ok()?))
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
