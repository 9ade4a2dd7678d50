//! The runtime must stay embeddable: an app that links `mgn-runtime` must not pull in the
//! compiler, the parser or the diagnostics renderer. Checked on the lock file's dependency graph.

use std::collections::{BTreeMap, BTreeSet};

fn lock_graph() -> BTreeMap<String, Vec<String>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).expect("Cargo.lock is committed");
    let mut graph = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let name = block
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .map(|n| n.trim_end_matches('"').to_string())
            .expect("a name");
        let mut deps = Vec::new();
        let mut in_deps = false;
        for l in block.lines() {
            if l.starts_with("dependencies = [") {
                in_deps = true;
            } else if in_deps && l.starts_with(']') {
                in_deps = false;
            } else if in_deps {
                // `"name"` or `"name version"`.
                let d = l.trim().trim_matches(|c| c == '"' || c == ',');
                deps.push(d.split(' ').next().unwrap_or(d).to_string());
            }
        }
        graph.entry(name).or_insert_with(Vec::new).extend(deps);
    }
    graph
}

#[test]
fn the_runtime_does_not_depend_on_the_compiler_pest_or_miette() {
    let graph = lock_graph();
    let mut seen = BTreeSet::new();
    let mut stack = vec!["mgn-runtime".to_string()];
    while let Some(p) = stack.pop() {
        if seen.insert(p.clone()) {
            stack.extend(graph.get(&p).cloned().unwrap_or_default());
        }
    }
    assert!(seen.len() > 5, "the lock file was read: {seen:?}");
    // Positive control: the same walk finds the parser under the compiler.
    let mut compiler = BTreeSet::new();
    let mut stack = vec!["mgn-compiler".to_string()];
    while let Some(p) = stack.pop() {
        if compiler.insert(p.clone()) {
            stack.extend(graph.get(&p).cloned().unwrap_or_default());
        }
    }
    assert!(
        compiler.contains("pest") && compiler.contains("miette") && compiler.contains("mgn-ir")
    );
    for banned in ["mgn-runtime", "blade-graphics", "ash", "naga"] {
        assert!(!compiler.contains(banned), "mgn-compiler depends on {banned}");
    }
    for banned in ["mgn-compiler", "mgn-syntax", "mgn-lsp", "pest", "pest_derive", "miette"] {
        assert!(!seen.contains(banned), "mgn-runtime depends on {banned} (through {:?})", seen);
    }
}
