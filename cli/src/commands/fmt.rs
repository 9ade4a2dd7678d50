//! `mgnc fmt [--check] FILE...`: rewrites files in the canonical layout (`mgn_syntax::format`).
//!
//! A directory stands for every `.mgn` file under it; `-` formats stdin to stdout. A file is
//! written only when its text changes, through a temporary file renamed over it, so a crash
//! never leaves half a file. With `--check` nothing is written: the files that would change
//! are listed on stdout and the exit code is 1 if there are any.

use mgn_compiler::render::render;
use mgn_compiler::source::{read_source, read_source_from, Origin, SourceMap};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

pub fn run(paths: &[PathBuf], check: bool) -> u8 {
    let mut failed = false;
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            if let Err(e) = mgn_files(p, &mut files) {
                eprintln!("error: cannot read the directory `{}`: {e}", p.display());
                failed = true;
            }
        } else {
            files.push(p.clone());
        }
    }
    let mut would_change = false;
    for f in &files {
        let stdin = f.as_os_str() == "-";
        let text = if stdin { read_stdin() } else { read(f) };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                failed = true;
                continue;
            }
        };
        let out = match mgn_syntax::format::format(&text) {
            Ok(out) => out,
            Err(diags) => {
                report(f, text, &diags);
                failed = true;
                continue;
            }
        };
        if stdin && !check {
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            continue;
        }
        if out == text {
            continue;
        }
        would_change = true;
        if check {
            println!("{}", f.display());
        } else if let Err(e) = write(f, &out) {
            eprintln!("error: cannot write `{}`: {e}", f.display());
            failed = true;
        } else {
            eprintln!("formatted {}", f.display());
        }
    }
    if failed || (check && would_change) {
        super::EXIT_ERRORS
    } else {
        0
    }
}

/// Every `.mgn` file under `dir`, in name order, skipping hidden directories and `target`.
/// Links to directories are not followed (a link to a parent would never end).
fn mgn_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<(PathBuf, bool)> = std::fs::read_dir(dir)?
        .map(|e| e.and_then(|e| Ok((e.path(), e.file_type()?.is_dir()))))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for (p, is_dir) in entries {
        let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        if is_dir {
            if !name.starts_with('.') && name != "target" {
                mgn_files(&p, out)?;
            }
        } else if p.extension().is_some_and(|e| e == "mgn") {
            out.push(p);
        }
    }
    Ok(())
}

/// A regular file within the size limit, in UTF-8 (`read_source` says why not).
fn read(path: &Path) -> Result<String, String> {
    read_source(path).map_err(|reason| format!("cannot read `{}`: {reason}", path.display()))
}

fn read_stdin() -> Result<String, String> {
    read_source_from(std::io::stdin().lock())
        .map_err(|reason| format!("cannot read stdin: {reason}"))
}

/// Replaces the file's contents atomically, keeping its permissions.
fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let permissions = std::fs::metadata(path)?.permissions();
    mgn_ir::io::write_atomic(path, text.as_bytes())?;
    std::fs::set_permissions(path, permissions)
}

fn report(path: &Path, text: String, diags: &[mgn_syntax::Diagnostic]) {
    // The formatter parses with `FileId(0)`: the only file of this source map.
    let mut sources = SourceMap::new();
    sources.add(path.display().to_string(), Origin::Path(path.to_path_buf()), text);
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    for d in diags {
        eprint!("{}", render(&sources, d, color));
    }
    let n = diags.len();
    eprintln!(
        "error: {n} error{} found in {}; it was not formatted",
        if n == 1 { "" } else { "s" },
        path.display()
    );
}
