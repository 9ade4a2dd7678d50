//! The documentation's examples compile: every fenced ```mgn block in docs/*.md and the README
//! is checked as a file of its own. A block that shows a mistake on purpose is fenced
//! ```mgn,error instead and must fail to check.

use mgn_tests::{check, rendered, root};
use std::path::PathBuf;

/// `(file, line, code, expect_error)` for every mgn block.
fn blocks() -> Vec<(PathBuf, usize, String, bool)> {
    let root = root();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.push(root.join("README.md"));
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable");
        let mut open: Option<(usize, bool, String)> = None;
        for (i, line) in text.lines().enumerate() {
            match (&mut open, line.trim_start()) {
                (None, l) if l.starts_with("```mgn") => {
                    open = Some((i + 1, l.trim_end() == "```mgn,error", String::new()));
                }
                (Some(_), "```") => {
                    let (at, err, code) = open.take().expect("open block");
                    out.push((f.clone(), at, code, err));
                }
                (Some((_, _, code)), _) => {
                    code.push_str(line);
                    code.push('\n');
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn every_mgn_example_in_the_docs_checks() {
    let dir = std::env::temp_dir().join(format!("mgn-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let blocks = blocks();
    assert!(blocks.len() >= 10, "found only {} examples", blocks.len());
    let mut failures = Vec::new();
    for (k, (file, line, code, expect_error)) in blocks.iter().enumerate() {
        let path = dir.join(format!("example_{k}.mgn"));
        std::fs::write(&path, code).expect("writable");
        let outcome = check(&path);
        let at = format!("{}:{line}", file.display());
        match (outcome.ok(), expect_error) {
            (true, true) => failures.push(format!("{at}: marked `mgn,error` but checks clean")),
            (false, false) => failures.push(format!("{at}:\n{}", rendered(&outcome))),
            _ => {}
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} examples fail:\n\n{}", failures.len(), failures.join("\n\n"));
}
