//! `mgnc build FILE --watch`: rebuilds after changes to the model and to the files it imports
//! (including imports added while watching), keeps going after errors, stops on Ctrl-C.
//!
//! Every step waits for output that only that step can produce (the parameter count changes
//! each time), at most `WAIT` each, so a slow machine only makes the test slower.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("mgnc-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    /// Writes in place (truncate and write), as some editors and tools do.
    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.0.join(name), text).expect("writable");
    }

    /// Writes a new file and renames it over the old one, as most editors save: the file is a
    /// new inode afterwards.
    fn save(&self, name: &str, text: &str) {
        let tmp = self.0.join(format!(".{name}.swp"));
        std::fs::write(&tmp, text).expect("writable");
        std::fs::rename(&tmp, self.0.join(name)).expect("renamable");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The child with both output streams merged into one channel of lines.
struct Watching {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Watching {
    fn start(dir: &Path, file: &str) -> Watching {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mgnc"))
            .args(["build", file, "--watch"])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mgnc runs");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for stream in [Box::new(out) as Box<dyn std::io::Read + Send>, Box::new(err)] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Watching { child, lines, seen: Vec::new() }
    }

    /// Reads lines until one contains `needle`; panics with everything seen after `WAIT`.
    fn expect(&mut self, needle: &str) {
        self.expect_all(&[needle]);
    }

    /// Reads lines until each needle has been in one. Stdout and stderr are read by separate
    /// threads, so lines of the two streams may arrive in either order.
    fn expect_all(&mut self, needles: &[&str]) {
        let deadline = Instant::now() + WAIT;
        let mut missing: Vec<&str> = needles.to_vec();
        while !missing.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    missing.retain(|n| !line.contains(n));
                    self.seen.push(line);
                }
                Err(_) => panic!(
                    "no line with {missing:?} within {WAIT:?}; mgnc printed:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A layer with `tensors` parameters of 4 elements each.
fn scale_layer(name: &str, tensors: usize) -> String {
    let fields: String =
        (0..tensors).map(|i| format!("    p{i} = param f32[4] init ones\n")).collect();
    let uses: String = (0..tensors).map(|i| format!(" * self.p{i}")).collect();
    format!(
        "layer {name} {{\n{fields}    forward(x: f32[4]) -> f32[4] {{\n        x{uses}\n    }}\n\
         }}\n"
    )
}

fn model(imports: &str, fields: &str, output: &str) -> String {
    format!(
        "{imports}\nmodel M {{\n    input x: f32[4]\n{fields}\n    forward {{\n        \
         output y = {output}\n    }}\n}}\n"
    )
}

#[test]
fn watch_rebuilds_after_changes_to_the_model_and_its_imports() {
    let t = TempDir::new("rebuild");
    t.write("blocks.mgn", &scale_layer("Scale", 1));
    let one_import = "use \"./blocks.mgn\".{Scale}\n";
    t.write("model.mgn", &model(one_import, "    s = Scale()", "s(x)"));
    let mut w = Watching::start(&t.0, "model.mgn");
    w.expect_all(&["M: 4 trainable parameters", "watching 2 files"]);

    // An error is reported, and watching goes on.
    t.save("model.mgn", &model(one_import, "    s = Scale()", "s(x) + oops"));
    w.expect_all(&["cannot find `oops`", "watching 2 files"]);

    // Fixed: a successful build again.
    t.save("model.mgn", &model(one_import, "    s = Scale()\n    u = Scale()", "u(s(x))"));
    w.expect("M: 8 trainable parameters");

    // Only the imported file changes (written in place this time).
    t.write("blocks.mgn", &scale_layer("Scale", 2));
    w.expect("M: 16 trainable parameters");

    // A new import of a new file; then a change to that new file alone.
    t.save("extra.mgn", &scale_layer("Shift", 1));
    let two_imports = "use \"./blocks.mgn\".{Scale}\nuse \"./extra.mgn\".{Shift}\n";
    t.save(
        "model.mgn",
        &model(two_imports, "    s = Scale()\n    u = Scale()\n    v = Shift()", "v(u(s(x)))"),
    );
    w.expect_all(&["M: 20 trainable parameters", "watching 3 files"]);
    t.save("extra.mgn", &scale_layer("Shift", 3));
    w.expect("M: 28 trainable parameters");
}

#[test]
fn watch_builds_an_import_once_it_appears() {
    let t = TempDir::new("missing");
    t.write("model.mgn", &model("use \"./later.mgn\".{Later}\n", "    l = Later()", "l(x)"));
    let mut w = Watching::start(&t.0, "model.mgn");
    w.expect_all(&["cannot import", "watching 2 files"]);
    t.save("later.mgn", &scale_layer("Later", 1));
    w.expect("M: 4 trainable parameters");
}

#[cfg(unix)]
#[test]
fn watch_stops_cleanly_on_ctrl_c() {
    let t = TempDir::new("interrupt");
    t.write("model.mgn", &model("", "", "x * 2"));
    let mut w = Watching::start(&t.0, "model.mgn");
    w.expect("watching 1 file");
    let sent =
        Command::new("kill").args(["-INT", &w.child.id().to_string()]).status().expect("kill runs");
    assert!(sent.success());
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = w.child.try_wait().expect("a child status") {
            assert_eq!(status.code(), Some(0), "Ctrl-C ends watching with exit code 0");
            break;
        }
        assert!(Instant::now() < deadline, "mgnc did not stop within {WAIT:?} of Ctrl-C");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn watch_survives_a_diagnostic_past_column_65535() {
    let t = TempDir::new("long-line");
    t.write("model.mgn", &model("", "", "x * 2"));
    let mut w = Watching::start(&t.0, "model.mgn");
    w.expect_all(&["M: 0 trainable parameters", "watching 1 file"]);
    // The error is 70,000 columns to the right: reported with its column, and watching goes on.
    let long = model("", "", &format!("x *{} oops", " ".repeat(70_000)));
    t.save("model.mgn", &long);
    w.expect_all(&["cannot find `oops`", "model.mgn:6:70024", "watching 1 file"]);
    t.save("model.mgn", &model("", "    w = param f32[4] init ones", "x * self.w"));
    w.expect("M: 4 trainable parameters");
}
