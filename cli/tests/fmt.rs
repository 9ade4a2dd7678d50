//! `mgnc fmt`: exit codes of `--check`, rewriting in place only what changes, refusing files
//! with syntax errors, directories and stdin.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fresh directory for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("mgnc-fmt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("writable");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mgnc(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("mgnc runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn modified(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).and_then(|m| m.modified()).expect("a modification time")
}

const MESSY: &str =
    "model M(n:dim=4) {\n  input x:f32[n,n]\n  forward { output y=x@x^T // square\n  }\n}\n";
const TIDY: &str = "\
model M(n: dim = 4) {
    input x: f32[n, n]
    forward {
        output y = x @ x^T  // square
    }
}
";

#[test]
fn check_exits_one_and_lists_files_that_would_change() {
    let t = TempDir::new("check");
    t.write("messy.mgn", MESSY);
    t.write("tidy.mgn", TIDY);
    let out = mgnc(&t.0, &["fmt", "--check", "messy.mgn", "tidy.mgn"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "messy.mgn\n", "only the file that would change is listed");
    assert_eq!(
        std::fs::read_to_string(t.0.join("messy.mgn")).unwrap(),
        MESSY,
        "--check writes nothing"
    );
}

#[test]
fn check_exits_zero_when_everything_is_formatted() {
    let t = TempDir::new("check-clean");
    t.write("tidy.mgn", TIDY);
    let out = mgnc(&t.0, &["fmt", "--check", "tidy.mgn"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn fmt_rewrites_changed_files_and_leaves_formatted_ones_alone() {
    let t = TempDir::new("rewrite");
    let messy = t.write("messy.mgn", MESSY);
    let tidy = t.write("tidy.mgn", TIDY);
    let before = modified(&tidy);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let out = mgnc(&t.0, &["fmt", "messy.mgn", "tidy.mgn"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&messy).unwrap(), TIDY);
    assert_eq!(modified(&tidy), before, "an unchanged file is not rewritten");
    assert!(text(&out.stderr).contains("formatted messy.mgn"), "{}", text(&out.stderr));
    let leftovers: Vec<_> = std::fs::read_dir(&t.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file is left behind: {leftovers:?}");
    let again = mgnc(&t.0, &["fmt", "--check", "messy.mgn"]);
    assert_eq!(again.status.code(), Some(0), "formatted output passes --check");
}

#[test]
fn files_with_syntax_errors_are_reported_and_left_unchanged() {
    let t = TempDir::new("syntax");
    let broken = "fn f(x: f32[4]) -> f32[4] {  relu(x }\n";
    let bad = t.write("bad.mgn", broken);
    t.write("messy.mgn", MESSY);
    let out = mgnc(&t.0, &["fmt", "bad.mgn", "messy.mgn"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("E0001") && err.contains("bad.mgn:1:"), "{err}");
    assert!(err.contains("not formatted"), "{err}");
    assert_eq!(std::fs::read_to_string(&bad).unwrap(), broken);
    assert_eq!(
        std::fs::read_to_string(t.0.join("messy.mgn")).unwrap(),
        TIDY,
        "the other files are still formatted"
    );
    let check = mgnc(&t.0, &["fmt", "--check", "bad.mgn"]);
    assert_eq!(check.status.code(), Some(1));
}

#[test]
fn unreadable_files_and_missing_arguments_are_errors() {
    let t = TempDir::new("missing");
    let out = mgnc(&t.0, &["fmt", "nowhere.mgn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot read `nowhere.mgn`: no such file"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mgnc(&t.0, &["fmt"]).status.code(), Some(2), "a usage error");
}

#[test]
fn directories_mean_every_mgn_file_under_them() {
    let t = TempDir::new("dirs");
    std::fs::create_dir_all(t.0.join("sub")).unwrap();
    t.write("sub/a.mgn", MESSY);
    t.write("b.mgn", TIDY);
    t.write("notes.txt", "not a model {");
    let out = mgnc(&t.0, &["fmt", "--check", "."]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout).trim().replace('\\', "/"), "./sub/a.mgn");
    assert_eq!(mgnc(&t.0, &["fmt", "."]).status.code(), Some(0));
    assert_eq!(mgnc(&t.0, &["fmt", "--check", "."]).status.code(), Some(0));
}

#[test]
fn dash_formats_stdin_to_stdout() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args(["fmt", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mgnc runs");
    child.stdin.take().unwrap().write_all(MESSY.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), TIDY);
}

#[test]
fn the_repository_models_and_stdlib_are_canonically_formatted() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args(["fmt", "--check", "models", "stdlib"])
        .current_dir(root)
        .output()
        .expect("mgnc runs");
    assert!(
        out.status.success(),
        "run `mgnc fmt models stdlib`; these files are not formatted:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
