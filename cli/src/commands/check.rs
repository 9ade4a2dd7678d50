//! `mgnc check FILE...`

use super::report::{self, MessageFormat};
use mgn_compiler::{check_path, Models};
use std::path::PathBuf;
use std::time::Instant;

pub fn run(files: &[PathBuf], format: MessageFormat) -> u8 {
    let mut failed = false;
    for f in files {
        let start = Instant::now();
        match check_path(f, Models::All) {
            Ok(outcome) => {
                failed |= !report::diagnostics(&outcome, format);
                if outcome.ok() && format == MessageFormat::Human {
                    let n = outcome.graphs.len();
                    eprintln!(
                        "checked {} ({n} model{}) in {:.1} ms",
                        f.display(),
                        if n == 1 { "" } else { "s" },
                        start.elapsed().as_secs_f64() * 1e3
                    );
                }
            }
            Err(e) => {
                failed = true;
                report::file_error(f, &e, format);
            }
        }
    }
    if failed {
        super::EXIT_ERRORS
    } else {
        0
    }
}
