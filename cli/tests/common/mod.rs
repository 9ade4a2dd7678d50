//! What the binary's tests share: running `mgnc` from the workspace root as a user would, and
//! reading what it printed. Each test file includes this module (`mod common;`) and uses what
//! it needs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root: commands run there, so paths read as a user types them.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// `mgnc ARGS…` from the workspace root.
pub fn mgnc(args: &[&str]) -> Output {
    mgnc_env(args, &[])
}

/// `mgnc ARGS…` from the workspace root with these environment variables.
pub fn mgnc_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mgnc"));
    c.args(args).current_dir(root());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("mgnc runs")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Everything a successful command printed (stderr, then stdout); a failure fails the test.
pub fn ok(out: &Output) -> String {
    let err = text(&out.stderr);
    assert!(out.status.success(), "mgnc failed: {err}");
    err + &text(&out.stdout)
}

/// The error output of a command that must fail with exit code 1: an error, not a crash (a
/// signal, a panic, an allocation failure).
pub fn refused(out: &Output) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "mgnc must refuse with exit 1: {err}");
    assert!(!err.contains("panicked") && !err.contains("memory allocation"), "{err}");
    err
}

/// A fresh scratch directory for one test of this process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mgn-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
