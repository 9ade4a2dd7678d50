//! docs/TUTORIAL.md runs as written: its `.mgn` blocks are saved under the name the text gives
//! them, its shell blocks' `mgnc` commands run against this build's binary in a scratch folder
//! that sees the repository's `data/` and `tests/`, an output block after a command must be
//! exactly what the command printed, its Rust block is the example it says it is, and its
//! `cargo` commands name what exists. A newcomer copies these commands first, so a drift between
//! the page and the program fails here instead of on their machine.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One fenced block: its info string (`mgn`, `sh`, `text`, …), its text and the prose before it.
struct Block {
    lang: String,
    code: String,
    before: String,
    line: usize,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => {
                let before = std::mem::take(&mut prose);
                let lang = lang.trim().to_string();
                open = Some(Block { lang, code: String::new(), before, line: i + 1 });
            }
            (Some(_), Some("")) => out.push(open.take().expect("an open block")),
            (Some(b), _) => {
                b.code.push_str(line);
                b.code.push('\n');
            }
            (None, None) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    assert!(open.is_none(), "docs/TUTORIAL.md ends inside a block");
    out
}

/// The last `name.mgn` the prose names: where the block after it is saved.
fn file_named(prose: &str) -> String {
    prose
        .split('`')
        .filter(|w| w.ends_with(".mgn") && !w.contains(' '))
        .last()
        .unwrap_or_else(|| panic!("no `NAME.mgn` before the block after:\n{prose}"))
        .to_string()
}

/// Shell lines with their continuations joined, comments and blank lines dropped.
fn commands(sh: &str) -> Vec<String> {
    let joined = sh.replace("\\\n", " ");
    joined
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// A scratch folder where the tutorial's relative paths (`data/…`, `tests/fixtures/…`) resolve
/// to the repository's own.
fn scratch(root: &Path) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mgn-tutorial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    for name in ["data", "tests"] {
        std::os::unix::fs::symlink(root.join(name), dir.join(name)).expect("link into scratch");
    }
    dir
}

/// Runs one `mgnc` command line in `dir`: its exit status and what it printed (stdout, then
/// stderr), with the line endings the terminal would show.
fn mgnc(dir: &Path, line: &str) -> (bool, String) {
    let args: Vec<&str> = line.split_whitespace().skip(1).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args(&args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("mgnc runs");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A `cargo` line of the tutorial names an example that exists (building it is the workspace
/// build's job, which compiles every example).
fn check_cargo(root: &Path, line: &str) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let example = words.iter().position(|w| *w == "--example").map(|i| words[i + 1]);
    if let Some(name) = example {
        let file = root.join("runtime/examples").join(format!("{name}.rs"));
        let dir = root.join("runtime/examples").join(name);
        assert!(file.exists() || dir.exists(), "no example `{name}` for `{line}`");
    }
}

#[test]
fn the_tutorial_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf();
    let text = std::fs::read_to_string(root.join("docs/TUTORIAL.md")).expect("docs/TUTORIAL.md");
    let blocks = blocks(&text);
    let dir = scratch(&root);
    let mut last: Option<(String, bool, String)> = None;
    let mut ran = 0;
    for b in &blocks {
        let at = format!("docs/TUTORIAL.md:{}", b.line);
        match b.lang.as_str() {
            "mgn" | "mgn,error" => {
                std::fs::write(dir.join(file_named(&b.before)), &b.code).expect("writable");
            }
            "sh" => {
                settle(&mut last);
                for line in commands(&b.code) {
                    if line.starts_with("mgnc ") {
                        settle(&mut last);
                        let (ok, out) = mgnc(&dir, &line);
                        last = Some((line, ok, out));
                        ran += 1;
                    } else if line.starts_with("cargo ") {
                        check_cargo(&root, &line);
                    } else {
                        panic!("{at}: the test runs `mgnc` and `cargo` lines only: `{line}`");
                    }
                }
            }
            "text" => {
                let (line, _, out) = last.take().unwrap_or_else(|| panic!("{at}: no command"));
                assert_eq!(lines(&b.code), lines(&out), "{at}: what `{line}` prints");
            }
            "rust" => {
                let example = root.join("runtime/examples/embed.rs");
                let source = std::fs::read_to_string(example).expect("embed.rs");
                let found = source.contains(b.code.trim_end());
                assert!(found, "{at}: not in runtime/examples/embed.rs");
            }
            other => panic!("{at}: a block of `{other}`, which this test cannot run"),
        }
    }
    settle(&mut last);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ran >= 6, "only {ran} mgnc commands ran");
}

/// Text line by line without trailing spaces, which editors strip from Markdown.
fn lines(s: &str) -> Vec<String> {
    s.trim_end().lines().map(|l| l.trim_end().to_string()).collect()
}

/// A command whose output the page does not show must have succeeded.
fn settle(last: &mut Option<(String, bool, String)>) {
    if let Some((line, ok, out)) = last.take() {
        assert!(ok, "`{line}` failed:\n{out}");
    }
}
