//! The `mgnc` subcommands. `main.rs` parses the command line; each module here runs one
//! subcommand and returns the process exit code.

pub mod bench;
pub mod build;
pub mod check;
pub mod counts;
pub mod data;
pub mod fmt;
pub mod generate;
pub mod import;
pub mod info;
pub mod plan;
pub mod quantize;
pub mod report;
pub mod run;
pub mod train;
pub mod tune;
pub mod watch;

/// Exit codes: 0 success, 1 errors in the input (diagnostics, bad files), 2 usage errors (clap).
pub const EXIT_ERRORS: u8 = 1;
