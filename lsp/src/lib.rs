//! The mgn language server.
//!
//! `run_stdio` serves LSP over standard input and output (`mgnc lsp`); `serve` runs it over
//! any `lsp_server::Connection` (the tests use an in-memory pair). Every feature works from
//! the compiler's own analysis: diagnostics are exactly `mgnc check`'s, hover shows the facts
//! elaboration recorded (types of expressions and `let`s, parameter shapes and checkpoint
//! names), and names are what the compiler resolved them to (`Program::resolution`). See
//! docs/EDITORS.md.

// `lsp_types::Uri` hashes and compares by its text; clippy sees a cell inside and objects.
#![allow(clippy::mutable_key_type)]

mod analysis;
mod features;
mod format;
mod paths;
pub mod profile;
mod resolve;
mod server;
mod text;
mod transport;

pub use paths::{path_to_uri, uri_to_path};
pub use server::{capabilities, serve, Ended, Error, DEBOUNCE};

/// Serves LSP over stdin/stdout until the client says `exit`, or stdin ends. Malformed input
/// does not end the session (`transport`).
pub fn run_stdio() -> Result<Ended, Error> {
    let (conn, io) = transport::stdio();
    let ended = serve(conn)?;
    io.join()?;
    Ok(ended)
}
