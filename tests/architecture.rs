//! The invariants of docs/ARCHITECTURE.md that are about the code's shape, checked:
//!
//! - which crate may link which (the pipeline runs one way; the runtime embeds without the
//!   compiler; a CPU-only app links no GPU crate; the IR links nothing heavy), read from
//!   `cargo tree` with the features each user would build with;
//! - every source file stays small enough to hold in one's head (800 lines, unless its header
//!   says why not) and narrow enough to read side by side (100 columns), and no function is
//!   over 100 lines of logic (lines that are not blank and not only a comment).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Every package `package` links (normal dependencies, itself included), built with `features`.
fn links(package: &str, features: &[&str]) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", package])
        .args(features)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let names: BTreeSet<String> =
        text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect();
    assert!(names.contains(package), "the tree of {package} was read: {names:?}");
    names
}

fn assert_none_of(package: &str, features: &[&str], banned: &[&str]) {
    let got = links(package, features);
    for b in banned {
        assert!(!got.contains(*b), "{package} {features:?} links {b}: {got:?}");
    }
}

const GPU: [&str; 4] = ["mgn-gpu", "blade-graphics", "ash", "naga"];
const FRONT_END: [&str; 6] =
    ["mgn-compiler", "mgn-syntax", "mgn-lsp", "pest", "pest_derive", "miette"];

#[test]
fn the_ir_links_nothing_of_the_compiler_or_the_gpu() {
    assert_none_of(
        "mgn-ir",
        &[],
        &[&FRONT_END[..], &GPU[..], &["mgn-runtime", "mgn-cpu"]].concat(),
    );
}

#[test]
fn the_runtime_embeds_without_the_compiler() {
    assert_none_of("mgn-runtime", &[], &FRONT_END);
    // With its default features it does run on the GPU (positive control for the walk).
    assert!(links("mgn-runtime", &[]).contains("blade-graphics"));
}

#[test]
fn a_cpu_only_app_links_no_gpu_crate() {
    assert_none_of("mgn-runtime", &["--no-default-features"], &GPU);
}

#[test]
fn the_compiler_and_the_language_server_link_no_backend() {
    let backends = [&GPU[..], &["mgn-runtime", "mgn-cpu"]].concat();
    assert_none_of("mgn-compiler", &[], &backends);
    assert_none_of("mgn-lsp", &[], &backends);
}

#[test]
fn egglog_is_linked_only_with_its_feature() {
    // The default build stays small: equality saturation is opt-in (`--features egglog`).
    assert_none_of("mgnc", &[], &["egglog"]);
    assert_none_of("mgn-lsp", &[], &["egglog"]);
    assert!(links("mgnc", &["--features", "egglog"]).contains("egglog"));
    let backends = [&GPU[..], &["mgn-runtime", "mgn-cpu"]].concat();
    assert_none_of("mgn-compiler", &["--features", "egglog"], &backends);
}

#[test]
fn the_backends_depend_on_the_ir_alone() {
    let above = [&FRONT_END[..], &["mgn-runtime"]].concat();
    assert_none_of("mgn-cpu", &[], &[&above[..], &GPU[..]].concat());
    // The GPU backend tests its kernels against the CPU one, as a dev-dependency only.
    assert_none_of("mgn-gpu", &[], &[&above[..], &["mgn-cpu"]].concat());
}

/// The `.rs` files git would hold, outside `target/`.
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("readable").flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() && !name.starts_with('.') && name != "target" {
                walk(&p, out);
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    out.sort();
    out
}

#[test]
fn source_files_stay_small_and_narrow() {
    let files = sources();
    assert!(files.len() > 50, "the tree was read: {} files", files.len());
    let mut problems = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("utf-8 source");
        let name = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        let lines = text.lines().count();
        // A file may be longer when its header says why (a line starting `//! Long:`).
        if lines > 800 && !text.lines().take(40).any(|l| l.starts_with("//! Long:")) {
            problems.push(format!("{name}: {lines} lines (over 800, and no `//! Long:` reason)"));
        }
        for (i, l) in text.lines().enumerate() {
            if l.chars().count() > 100 {
                problems.push(format!("{name}:{}: {} columns", i + 1, l.chars().count()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Lines of logic (not blank, not only a comment) in each function body of `text`, with the
/// function's name and first line.
fn function_lengths(text: &str) -> Result<Vec<(String, usize, usize)>, syn::Error> {
    use syn::spanned::Spanned;
    use syn::visit::Visit;

    struct Lengths<'t> {
        lines: Vec<&'t str>,
        out: Vec<(String, usize, usize)>,
    }
    impl Lengths<'_> {
        fn body(&mut self, name: &syn::Ident, block: &syn::Block) {
            let (first, last) = (block.span().start().line, block.span().end().line);
            let logic = self.lines[first.saturating_sub(1)..last.min(self.lines.len())]
                .iter()
                .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("//"))
                .count();
            self.out.push((name.to_string(), first, logic));
        }
    }
    impl<'ast> Visit<'ast> for Lengths<'_> {
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            self.body(&f.sig.ident, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            self.body(&f.sig.ident, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
        fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
            if let Some(block) = &f.default {
                self.body(&f.sig.ident, block);
            }
            syn::visit::visit_trait_item_fn(self, f);
        }
    }
    let file = syn::parse_file(text)?;
    let mut v = Lengths { lines: text.lines().collect(), out: Vec::new() };
    v.visit_file(&file);
    Ok(v.out)
}

#[test]
fn functions_stay_short() {
    let mut problems = Vec::new();
    let mut measured = 0;
    for f in sources() {
        let text = std::fs::read_to_string(&f).expect("utf-8 source");
        let name = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        match function_lengths(&text) {
            Ok(fns) => {
                measured += fns.len();
                for (func, line, logic) in fns.into_iter().filter(|(_, _, n)| *n > 100) {
                    problems.push(format!("{name}:{line}: `{func}` has {logic} lines of logic"));
                }
            }
            Err(e) => problems.push(format!("{name}: does not parse: {e}")),
        }
    }
    assert!(measured > 1000, "the functions were read: {measured}");
    assert!(problems.is_empty(), "over 100 lines of logic:\n{}", problems.join("\n"));
}
