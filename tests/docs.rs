//! The documentation's examples compile: every fenced ```mgn block in docs/*.md and the README
//! is checked as a file of its own. A block that shows a mistake on purpose is fenced
//! ```mgn,error instead and must fail to check. Every relative link in the Markdown resolves.

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

/// The Markdown files whose links are checked: the README, CHANGELOG and everything under docs/.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces as `-`.
fn anchor(heading: &str) -> String {
    let kept = heading.trim().to_lowercase();
    let kept = kept.chars().filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'));
    kept.map(|c| if c == ' ' { '-' } else { c }).collect()
}

/// Every heading's anchor in a Markdown file, outside code blocks.
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of inline links `[text](target)` outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        // Code spans hold example syntax, not links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let end = tail.find(')').unwrap_or(tail.len());
            if !fenced {
                out.push(tail[..end].to_string());
            }
            rest = &tail[end..];
        }
    }
    out
}

/// Moving a section (the README's to docs/, BENCHMARKS' history to docs/benchmarks/) must not
/// leave a link behind: every relative link names a file that exists and, with `#anchor`, a
/// heading that file has.
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).expect("readable");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let dest = match path {
                "" => file.clone(),
                p => file.parent().expect("a folder").join(p),
            };
            let at = format!("{}: ({target})", file.display());
            if !dest.exists() {
                broken.push(format!("{at}: no such file"));
            } else if !fragment.is_empty() && dest.extension().is_some_and(|x| x == "md") {
                let heads = anchors(&std::fs::read_to_string(&dest).expect("readable"));
                if !heads.iter().any(|h| h == fragment) {
                    broken.push(format!("{at}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{} broken links:\n{}", broken.len(), broken.join("\n"));
}

/// Every fenced block of a Markdown file: `(info string, text, line)`.
fn fenced(text: &str) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new(), i + 1)),
            (Some(_), Some("")) => out.push(open.take().expect("an open block")),
            (Some((_, code, _)), _) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Lines without trailing spaces (editors strip them from Markdown), and without the closing
/// `error: N errors found`, which the pages may leave out.
fn comparable(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.trim_end().lines().map(|l| l.trim_end().into()).collect();
    if lines.last().is_some_and(|l| l.starts_with("error: ") && l.ends_with(" found")) {
        lines.pop();
    }
    lines
}

/// A rendered error shown after a `mgn,error` example (its header names the file, as in
/// `╭─[attn.mgn:6:29]`) is what checking that example prints today: the samples a reader
/// learns the format from went stale once already.
#[test]
fn every_rendered_error_in_the_docs_is_what_check_prints() {
    let root = root();
    let dir = root.join("target").join(format!("docs-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let prefix = format!("{}/", dir.strip_prefix(&root).expect("inside the root").display());
    let (mut compared, mut stale) = (0, Vec::new());
    for file in markdown_files() {
        let blocks = fenced(&std::fs::read_to_string(&file).expect("readable"));
        for pair in blocks.windows(2) {
            let [(info, source, _), (out_info, shown, line)] = pair else { continue };
            let Some(name) = shown.split("╭─[").nth(1).and_then(|s| s.split(':').next()) else {
                continue;
            };
            if info != "mgn,error" || !matches!(out_info.as_str(), "" | "text") {
                continue;
            }
            let path = dir.join(name);
            std::fs::write(&path, source).expect("writable");
            let got = rendered(&check(&path.strip_prefix(&root).expect("inside")));
            compared += 1;
            if comparable(&got.replace(&prefix, "")) != comparable(shown) {
                stale.push(format!("{}:{line}:\n{}", file.display(), got.replace(&prefix, "")));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(compared >= 5, "only {compared} rendered errors found in the docs");
    assert!(stale.is_empty(), "{} stale samples; today's:\n\n{}", stale.len(), stale.join("\n"));
}
