//! Hostile inputs given to mgnc — sources to `check`, `build` and `fmt`, and special files to
//! every argument that names a file: every one gets an error message and exit code 1, never a
//! panic (exit code 101), a hang or unbounded memory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longer than any of these runs needs; a run past it is a hang.
const LIMIT: Duration = Duration::from_secs(30);

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("mgnc-hostile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    fn write(&self, name: &str, bytes: impl AsRef<[u8]>) {
        std::fs::write(self.0.join(name), bytes).expect("writable");
    }

    #[cfg(unix)]
    fn fifo(&self, name: &str) {
        let path = std::ffi::CString::new(self.0.join(name).to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs mgnc in `dir`, killing it after `LIMIT`.
fn mgnc(dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mgnc runs");
    let start = Instant::now();
    while child.try_wait().expect("a status").is_none() {
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`mgnc {}` did not finish within {LIMIT:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("its output")
}

/// Exit code 1 (errors found), with `needle` in what it printed (where messages may be wrapped:
/// runs of white space and the report's margin `│` count as one space).
fn fails_saying(out: &Output, needle: &str) {
    let all =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    let words = |s: &str| s.split_whitespace().filter(|w| *w != "│").collect::<Vec<_>>().join(" ");
    assert!(words(&all).contains(&words(needle)), "no `{needle}` in:\n{all}");
    assert!(!all.contains("panicked"), "{all}");
}

/// A syntax error at column 65,537 and a name error at column 80,024 of line 5: past what
/// miette's layout can pad to.
fn long_line_model() -> String {
    format!(
        "{})\nmodel M {{\n    input x: f32[4]\n    forward {{\n        output y = x *{} oops\n    \
         }}\n}}\n",
        " ".repeat(65_536),
        " ".repeat(80_000)
    )
}

#[test]
fn diagnostics_past_column_65535_are_rendered_by_every_command() {
    let t = TempDir::new("columns");
    t.write("col.mgn", long_line_model());
    let dir = &t.0;
    fails_saying(&mgnc(dir, &["check", "col.mgn"]), "[col.mgn:1:65537]");
    fails_saying(&mgnc(dir, &["fmt", "col.mgn"]), "[col.mgn:1:65537]");
    fails_saying(&mgnc(dir, &["fmt", "--check", "col.mgn"]), "[col.mgn:1:65537]");
    fails_saying(&mgnc(dir, &["build", "col.mgn"]), "[col.mgn:1:65537]");
    let json = mgnc(dir, &["check", "--message-format", "json", "col.mgn"]);
    fails_saying(&json, "\"column\":65537");
    // Also the name 80,000 columns to the right; each report names its own place.
    fails_saying(&json, "\"line\":5");
    for line in String::from_utf8_lossy(&json.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let at = format!("[col.mgn:{}:{}]", v["line"], v["column"]);
        assert!(v["rendered"].as_str().is_some_and(|r| r.contains(&at)), "{at}: {v}");
    }
}

#[cfg(unix)]
#[test]
fn imports_of_special_or_huge_files_are_refused_at_the_use() {
    let t = TempDir::new("imports");
    t.fifo("fifo.mgn");
    std::fs::File::create(t.0.join("huge.mgn")).unwrap().set_len(9 << 20).unwrap();
    for (import, reason) in [
        ("/dev/zero", "cannot import `/dev/zero`: it is a character device, not a regular file"),
        ("./fifo.mgn", "fifo.mgn`: it is a named pipe (FIFO), not a regular file"),
        ("./huge.mgn", "huge.mgn`: the file is too large (9437184 bytes; the limit is 8388608"),
        ("/", "cannot import `/`: it is a directory, not a file"),
        ("/proc/self/status", "status`: the file holds more than the 0 bytes it reports"),
    ] {
        t.write("main.mgn", format!("use \"{import}\".{{A}}\n"));
        let out = mgnc(&t.0, &["check", "main.mgn"]);
        fails_saying(&out, reason);
        fails_saying(&out, "[main.mgn:1:5]");
        fails_saying(&mgnc(&t.0, &["build", "main.mgn"]), reason);
    }
}

#[cfg(unix)]
#[test]
fn root_files_that_are_special_or_huge_are_refused() {
    let t = TempDir::new("roots");
    t.fifo("fifo.mgn");
    std::fs::File::create(t.0.join("huge.mgn")).unwrap().set_len(9 << 20).unwrap();
    std::os::unix::fs::symlink("self.mgn", t.0.join("self.mgn")).unwrap();
    std::fs::create_dir(t.0.join("dir.mgn")).unwrap();
    for (file, reason) in [
        ("/dev/zero", "cannot read `/dev/zero`: it is a character device, not a regular file"),
        ("fifo.mgn", "cannot read `fifo.mgn`: it is a named pipe (FIFO), not a regular file"),
        ("huge.mgn", "cannot read `huge.mgn`: the file is too large (9437184 bytes"),
        ("/proc/self/status", "status`: the file holds more than the 0 bytes it reports"),
        ("self.mgn", "cannot read `self.mgn`: "),
        ("dir.mgn", "cannot read `dir.mgn`: it is a directory, not a file"),
    ] {
        for command in ["check", "build", "fmt", "bench"] {
            // `fmt DIR` formats the files under it (none here).
            if !(command == "fmt" && file == "dir.mgn") {
                fails_saying(&mgnc(&t.0, &[command, file]), reason);
            }
        }
    }
    // `fmt` on a directory with a link to itself finishes, and reads no special file.
    std::os::unix::fs::symlink(".", t.0.join("loop")).unwrap();
    t.write("ok.mgn", "fn f() -> int { 1 }\n");
    fails_saying(&mgnc(&t.0, &["fmt", "--check", "."]), "fifo.mgn`: it is a named pipe");
}

#[test]
fn text_that_is_not_utf8_is_located() {
    let t = TempDir::new("utf8");
    t.write("bad.mgn", b"fn f() -> int {\n    1 \xe9\n}\n");
    let at = "the file is not valid UTF-8: byte 0xE9 at offset 22 (line 2, column 7)";
    for command in ["check", "build", "fmt"] {
        fails_saying(&mgnc(&t.0, &[command, "bad.mgn"]), &format!("`bad.mgn`: {at}"));
    }
    // The JSON form places it as source diagnostics are placed.
    for command in ["check", "build"] {
        let out = mgnc(&t.0, &[command, "--message-format", "json", "bad.mgn"]);
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert_eq!(
            (v["file"].as_str(), v["line"].as_u64(), v["column"].as_u64()),
            (Some("bad.mgn"), Some(2), Some(7))
        );
    }
    t.write("main.mgn", "fn g() -> int { 2 }\nuse \"./bad.mgn\".{f}\n");
    let out = mgnc(&t.0, &["check", "main.mgn"]);
    fails_saying(&out, &format!("bad.mgn`: {at}"));
    fails_saying(&out, "[main.mgn:2:5]");
}

/// The rule for every file mgnc reads (`mgn_ir::io::read_regular`), through every command and
/// argument that names one: a FIFO without a writer, a device without end, a `/proc` file that
/// reports no size, a directory and a symbolic-link loop are each refused, naming the file,
/// within the time limit — never waited on or read without end.
#[cfg(unix)]
#[test]
fn every_file_argument_refuses_special_files() {
    let t = TempDir::new("arguments");
    t.fifo("fifo");
    std::fs::create_dir(t.0.join("dir")).unwrap();
    std::os::unix::fs::symlink("loop", t.0.join("loop")).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let model = root.join("models/digits_mlp.mgn").display().to_string();
    let data = root.join("data/digits_test.safetensors").display().to_string();
    let tiny = root.join("tests/fixtures/generate/tiny.mgn").display().to_string();
    let tok = root.join("tests/fixtures/generate/tokenizer.json").display().to_string();
    let trained = mgnc(&t.0, &["train", &model, "--data", &data, "--epochs", "1", "--save", "w"]);
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    let specials = [
        ("fifo", "it is a named pipe (FIFO), not a regular file"),
        ("/dev/zero", "it is a character device, not a regular file"),
        ("/proc/self/status", "holds more than the 0 bytes it reports"),
        ("dir", "it is a directory, not a file"),
        ("loop", "symbolic links"),
    ];
    for (file, reason) in specials {
        let plan = format!("{file}.mgnplan");
        let commands: Vec<Vec<&str>> = vec![
            vec!["run", &model, "--weights", file, "--inputs", &data, "--out", "o.safetensors"],
            vec!["run", &model, "--inputs", file, "--out", "o.safetensors"],
            vec!["train", &model, "--data", file, "--epochs", "1"],
            vec!["train", &model, "--data", &data, "--eval-data", file, "--epochs", "1"],
            vec!["train", &model, "--data", &data, "--resume", file, "--epochs", "1"],
            vec!["eval", &model, "--weights", file, "--data", &data],
            vec!["eval", &model, "--weights", "w", "--data", file],
            vec!["import", file],
            vec!["generate", &tiny, "--weights", file, "--tokenizer", &tok, "--prompt", "a"],
            vec!["generate", &tiny, "--tokenizer", file, "--prompt", "a"],
        ];
        for args in &commands {
            // A directory given as the tokenizer is where a tokenizer.json is looked for.
            let tokenizer_dir =
                file == "dir" && args.windows(2).any(|w| w == ["--tokenizer", file]);
            let reason =
                if tokenizer_dir { "no tokenizer at `dir/tokenizer.json`" } else { reason };
            let out = mgnc(&t.0, args);
            fails_saying(&out, file);
            fails_saying(&out, reason);
        }
        // A plan with a special file's name: `ln -s /dev/zero x.mgnplan` and the like.
        if file.starts_with('/') {
            std::os::unix::fs::symlink(
                file,
                t.0.join(plan.trim_start_matches('/').replace('/', "_")),
            )
            .unwrap();
        }
    }
    for (plan, reason) in [
        ("dev_zero.mgnplan", "it is a character device"),
        ("proc_self_status.mgnplan", "holds more than the 0 bytes it reports"),
    ] {
        let args = ["run", plan, "--inputs", &data, "--out", "o.safetensors"];
        fails_saying(&mgnc(&t.0, &args), reason);
    }
}
