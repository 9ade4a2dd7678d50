//! The VS Code extension's static files (editors/vscode) parse, agree with each other, and
//! name the compiler's builtins and reserved words: the grammar is written by hand, so this is
//! what notices a builtin added to the compiler but not to the highlighting.

use serde_json::Value;
use std::path::{Path, PathBuf};

fn ext_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../editors/vscode")
}

fn read(rel: &str) -> Value {
    let path = ext_dir().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()))
}

#[test]
fn package_json_declares_the_language_and_its_files() {
    let pkg = read("package.json");
    let lang = pkg["contributes"]["languages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == "mgn")
        .expect("language `mgn`");
    assert!(lang["extensions"].as_array().unwrap().iter().any(|e| e == ".mgn"));
    assert!(pkg["activationEvents"].as_array().unwrap().iter().any(|e| e == "onLanguage:mgn"));
    assert_eq!(
        pkg["contributes"]["configuration"]["properties"]["mgn.serverPath"]["default"],
        "mgnc"
    );
    assert!(pkg["dependencies"]["vscode-languageclient"].is_string());
    let grammar = &pkg["contributes"]["grammars"][0];
    for f in [
        pkg["main"].as_str().unwrap(),
        lang["configuration"].as_str().unwrap(),
        grammar["path"].as_str().unwrap(),
    ] {
        assert!(ext_dir().join(f).is_file(), "package.json names {f}, which does not exist");
    }
    let g = read(grammar["path"].as_str().unwrap());
    assert_eq!(g["scopeName"], grammar["scopeName"]);
    let conf = read("language-configuration.json");
    assert_eq!(conf["comments"]["lineComment"], "//");
}

#[test]
fn grammar_knows_every_builtin_and_reserved_word() {
    let g = read("syntaxes/mgn.tmLanguage.json");
    // Builtin functions are highlighted where a call follows; builtin values (`training`)
    // wherever they are written.
    for (rule, values) in [("builtins", false), ("builtin_values", true)] {
        let pattern = g["repository"][rule]["match"].as_str().unwrap();
        let listed = pattern.split_once("\\b(").unwrap().1.split_once(")\\b").unwrap().0;
        let mut got: Vec<&str> = listed.split('|').collect();
        let mut want: Vec<&str> = (mgn_compiler::elab::builtins::all().iter())
            .filter(|b| b.value.is_some() == values)
            .map(|b| b.name)
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "the grammar's `{rule}` differ from the compiler's");
    }
    let text = serde_json::to_string(&g).unwrap();
    for kw in [
        "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
        "false", "self", "as", "f32", "f16", "bf16", "i32", "i64", "u32",
    ] {
        assert!(
            text.contains(&format!("|{kw}|"))
                || text.contains(&format!("({kw}|"))
                || text.contains(&format!("|{kw})"))
                || text.contains(&format!("({kw})")),
            "reserved word `{kw}` is not highlighted"
        );
    }
}

/// What `vsce package` (EDITORS.md's install) refuses to package without, checked without
/// running it (no network here): a repository or the flag that does without one, a licence
/// file, links in the README that still work inside the .vsix (absolute ones; vsce can only
/// rewrite relative ones against a GitHub repository it detects), and a .vscodeignore that
/// leaves the client's dependency in.
#[test]
fn the_extension_has_what_vsce_package_needs() {
    let pkg = read("package.json");
    for field in ["name", "publisher", "version", "license"] {
        assert!(pkg[field].as_str().is_some_and(|s| !s.is_empty()), "package.json: no `{field}`");
    }
    assert!(pkg["engines"]["vscode"].is_string(), "package.json: no engines.vscode");
    // The project publishes no repository URL, so none is invented: EDITORS.md's command says
    // so to vsce, which otherwise stops to ask.
    let editors = std::fs::read_to_string(ext_dir().join("../../docs/EDITORS.md")).unwrap();
    let has_repo = pkg["repository"]["url"].as_str().or(pkg["repository"].as_str()).is_some();
    assert!(
        has_repo || editors.contains("vsce package --allow-missing-repository"),
        "package.json names no repository, and EDITORS.md's vsce command does not allow that"
    );
    let license =
        std::fs::read_to_string(ext_dir().join("LICENSE")).expect("editors/vscode/LICENSE");
    assert!(license.contains("MIT") && license.contains("Apache"), "{license}");
    let readme = std::fs::read_to_string(ext_dir().join("README.md")).unwrap();
    for (i, _) in readme.match_indices("](") {
        let target = &readme[i + 2..];
        assert!(
            ["https://", "http://", "#"].iter().any(|p| target.starts_with(p)),
            "README.md links to `{}`, which vsce cannot resolve",
            target.split(')').next().unwrap_or(target)
        );
    }
    let ignore = std::fs::read_to_string(ext_dir().join(".vscodeignore")).expect(".vscodeignore");
    let rules: Vec<&str> =
        ignore.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).collect();
    assert!(!rules.iter().any(|r| r.starts_with("node_modules")), "the client needs node_modules");
    assert!(rules.contains(&"*.vsix"), "a package must not contain the previous one");
}
