//! Helpers shared by the end-to-end tests: the workspace root, "check this file and render
//! every diagnostic" as one string, and moving a session onto the GPU or skipping for want of one.

use mgn_compiler::render::render;
use mgn_compiler::{check_path, Models, Outcome};
use std::path::{Path, PathBuf};
use std::sync::Once;

pub mod gates;

/// Moves a session onto the GPU: true when it is there; false, after recording a skip, when
/// there is no device (a failure under `MGN_REQUIRE_GPU=1`). Any other error fails the test.
pub fn on_gpu(s: &mut mgn_runtime::Session) -> bool {
    match s.use_gpu() {
        Ok(_) => true,
        Err(mgn_runtime::RuntimeError::NoDevice(why)) if !mgn_gpu::testing::device_required() => {
            mgn_gpu::testing::record_skip(&why);
            false
        }
        Err(e) => panic!("{e}"),
    }
}

/// The repository root. Tests run from there so that file names in diagnostics are the
/// same relative paths a user would type (`tests/errors/x.mgn`).
pub fn root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf();
    static CD: Once = Once::new();
    CD.call_once(|| std::env::set_current_dir(&root).expect("can enter the workspace root"));
    root
}

/// `.mgn` files directly inside `dir` (relative to the root), sorted.
pub fn mgn_files(dir: &str) -> Vec<PathBuf> {
    root();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {dir}: {e}"))
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "mgn"))
        .collect();
    files.sort();
    files
}

pub fn check(path: &Path) -> Outcome {
    root();
    check_path(path, Models::All).unwrap_or_else(|e| panic!("{e}"))
}

/// All diagnostics of an outcome, rendered without colour, separated by blank lines.
pub fn rendered(outcome: &Outcome) -> String {
    outcome
        .diagnostics
        .iter()
        .map(|d| render(&outcome.program.sources, d, false))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Compares `actual` with the file at `expected`, or rewrites it when `BLESS=1`.
/// Returns a description of the difference, if any.
pub fn compare_golden(expected: &Path, actual: &str) -> Option<String> {
    if std::env::var_os("BLESS").is_some_and(|v| v == "1") {
        std::fs::write(expected, actual)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", expected.display()));
        return None;
    }
    let want = std::fs::read_to_string(expected).unwrap_or_default();
    if want == actual {
        return None;
    }
    let first = want
        .lines()
        .zip(actual.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(want.lines().count().min(actual.lines().count()));
    Some(format!(
        "{} differs from the output (first at line {}); run with BLESS=1 to accept.\n\
         --- expected\n{want}\n--- actual\n{actual}",
        expected.display(),
        first + 1
    ))
}
