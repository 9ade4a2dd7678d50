//! Completion of what a module offers, found from the text: in `use` lines (`use std.|`,
//! `use std.nn.|`, `use std.nn.{Linear, |`, `use "./blocks.mgn".{|`), and after `name.` where
//! the analysis does not know `name` yet but a `use` line binds it (typed a moment ago, or in a
//! part of the file that does not parse right now).

use super::completion::module_items;
use super::*;
use mgn_compiler::front::load;
use mgn_compiler::source::{normalize, STDLIB};
use std::path::Path;

/// A module named in a `use` line.
enum Source<'t> {
    /// `std.nn`: the stdlib module `nn`.
    Std(&'t str),
    /// `"./blocks.mgn"`: a file, relative to the importing one.
    File(&'t str),
}

/// Completion inside a `use` line, or `None` when the cursor is not in one. `start` is where
/// the word being typed starts.
pub fn use_completion(a: &Analysis, text: &str, start: usize) -> Option<Vec<lsp::CompletionItem>> {
    let rest = use_before(text, start)?;
    if let Some((source, list)) = rest.split_once('{') {
        let source = parse_source(source.trim_end().strip_suffix('.')?.trim())?;
        let listed: Vec<&str> =
            list.split(',').filter_map(|n| n.split_whitespace().next()).collect();
        let typing = list.rsplit(',').next().unwrap_or("");
        if typing.split_whitespace().count() > 0 {
            return Some(Vec::new()); // after a name: `as` and an alias, nothing to offer
        }
        let mut items = module_completions(a, &source)?;
        items.retain(|i| !listed.contains(&i.label.as_str()));
        return Some(items);
    }
    if rest.contains(char::is_whitespace) || rest.starts_with('"') {
        return Some(Vec::new()); // after the path (`as` and an alias), or inside a file path
    }
    let segments: Vec<&str> = rest.split('.').collect();
    Some(match segments.as_slice() {
        [""] => vec![lsp::CompletionItem {
            label: "std".into(),
            kind: Some(lsp::CompletionItemKind::MODULE),
            detail: Some("the standard library".into()),
            ..Default::default()
        }],
        ["std", ""] => std_modules(),
        ["std", m, ""] => module_completions(a, &Source::Std(m)).unwrap_or_default(),
        _ => Vec::new(),
    })
}

/// The items of the module a `use` line binds to `name` (`use std.nn`, `use std.nn as n`,
/// `use "./blocks.mgn" as b`), read from the text.
pub fn guessed_module_items(a: &Analysis, text: &str, name: &str) -> Vec<lsp::CompletionItem> {
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix("use ") else { continue };
        let rest = rest.split("//").next().unwrap_or("").trim().trim_end_matches(';');
        if rest.contains('{') {
            continue;
        }
        let (source, alias) = match rest.split_once(" as ") {
            Some((s, alias)) => (s.trim(), Some(alias.trim())),
            None => (rest, None),
        };
        let bound =
            alias.or_else(|| source.rsplit('.').next().filter(|_| !source.starts_with('"')));
        if bound != Some(name) {
            continue;
        }
        if let Some(items) = parse_source(source).and_then(|s| module_completions(a, &s)) {
            return items;
        }
    }
    Vec::new()
}

/// The `use` statement the cursor is in, from after `use ` to `start`: on the cursor's line, or
/// a list opened on an earlier line (`use std.nn.{` then one name a line).
fn use_before(text: &str, start: usize) -> Option<&str> {
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let statement_start = match text[..start].rfind('{') {
        Some(open) if !text[open..start].contains('}') && open < line_start => {
            text[..open].rfind('\n').map_or(0, |i| i + 1)
        }
        _ => line_start,
    };
    let statement = text[statement_start..start].trim_start();
    statement.strip_prefix("use ").map(str::trim_start)
}

fn parse_source(s: &str) -> Option<Source<'_>> {
    if let Some(path) = s.strip_prefix('"') {
        return Some(Source::File(path.strip_suffix('"')?));
    }
    match s.split('.').collect::<Vec<_>>().as_slice() {
        ["std", m] => Some(Source::Std(m)),
        _ => None,
    }
}

fn std_modules() -> Vec<lsp::CompletionItem> {
    STDLIB
        .iter()
        .map(|(name, text)| lsp::CompletionItem {
            label: name.to_string(),
            kind: Some(lsp::CompletionItemKind::MODULE),
            detail: Some(format!("module std.{name}")),
            documentation: module_doc(text).map(lsp::Documentation::String),
            ..Default::default()
        })
        .collect()
}

/// The comment lines a module file starts with.
fn module_doc(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map_while(|l| l.trim().strip_prefix("//"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The items a module defines, from the analysis when it loaded the module, else read now.
fn module_completions(a: &Analysis, source: &Source) -> Option<Vec<lsp::CompletionItem>> {
    let prog = a.program();
    let origin = match source {
        Source::Std(m) => Origin::Std(STDLIB.iter().find(|(n, _)| n == m)?.0),
        Source::File(path) => {
            let root = &prog.sources.get(a.root_file()).origin;
            let base = match root {
                Origin::Path(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
                _ => std::env::current_dir().ok()?,
            };
            Origin::Path(normalize(&base.join(path)))
        }
    };
    if let Some(m) = prog.modules.iter().position(|m| prog.sources.get(m.file).origin == origin) {
        return Some(module_items(prog, ModId(m)));
    }
    let (loaded, _) = match &origin {
        Origin::Std(m) => {
            load::load("<use>".into(), Origin::Memory("<use>".into()), format!("use std.{m}"))
        }
        Origin::Path(p) => load::load_path(p).ok()?,
        Origin::Memory(_) => return None,
    };
    let m = loaded.modules.iter().position(|m| loaded.sources.get(m.file).origin == origin)?;
    Some(module_items(&loaded, ModId(m)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::tests::analyse;

    fn labels_at(text: &str, needle: &str, delta: usize) -> Option<Vec<String>> {
        let a = analyse(text);
        let mut start = text.find(needle).unwrap() + delta;
        while start > 0 && ident_char(text.as_bytes()[start - 1]) {
            start -= 1;
        }
        use_completion(&a, text, start).map(|v| v.into_iter().map(|i| i.label).collect())
    }

    #[test]
    fn use_lines_offer_modules_and_their_items() {
        let std_nn = ["Linear", "LayerNorm", "GroupNorm", "Mlp", "Conv2d"];
        type Case<'a> = (&'a str, &'a str, usize, &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            // (text, cursor needle, delta, offered, not offered)
            ("use ", "use ", 4, &["std"], &["relu"]),
            ("use std.", "std.", 4, &["nn", "attention", "loss", "init"], &["Linear"]),
            ("use std.nn.", "nn.", 3, &std_nn, &["nn", "relu"]),
            ("use std.nn.{", "{", 1, &std_nn, &["relu", "M"]),
            (
                "use std.nn.{Linear, Lay}\nfn M() -> int { 1 }",
                "Lay",
                3,
                &["LayerNorm"],
                &["Linear", "M"],
            ),
            ("use std.nn.{\n    Linear,\n    \n}", "Linear,\n", 12, &["Mlp"], &["Linear"]),
            ("use std.loss.", "loss.", 5, &["cross_entropy"], &["Linear"]),
        ];
        for (text, needle, delta, offered, not) in cases {
            let got = labels_at(text, needle, *delta).unwrap_or_else(|| panic!("{text}: none"));
            for w in *offered {
                assert!(got.iter().any(|g| g == w), "{text:?}: `{w}` missing from {got:?}");
            }
            for w in *not {
                assert!(!got.iter().any(|g| g == w), "{text:?}: `{w}` offered: {got:?}");
            }
        }
        let text = "use std.nn.{Linear}\nfn f() -> int { 1 }\n";
        assert_eq!(labels_at(text, "1 }", 0), None, "not in a use line");
        assert_eq!(labels_at("use std.nn.{Linear as L", "as L", 4), Some(vec![]), "an alias");
    }

    #[test]
    fn a_file_in_a_use_line_offers_its_items() {
        let dir = std::env::temp_dir().join(format!("mgn-lsp-imports-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let blocks = dir.join("blocks.mgn");
        std::fs::write(&blocks, "layer Scale(d: dim) { forward(x: f32[d]) -> f32[d] { x } }\n")
            .unwrap();
        let text = format!("use \"{}\".{{", blocks.display());
        let got = labels_at(&text, "{", 1);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got, Some(vec!["Scale".to_string()]));
    }

    #[test]
    fn a_module_bound_by_a_use_line_is_found_from_the_text() {
        let a = analyse("");
        for text in ["use std.nn\n", "use std.nn as net // layers\n", "  use std.nn;\n"] {
            let name = if text.contains(" as ") { "net" } else { "nn" };
            let got: Vec<String> =
                guessed_module_items(&a, text, name).into_iter().map(|i| i.label).collect();
            assert!(got.iter().any(|l| l == "LayerNorm"), "{text}: {got:?}");
        }
        assert!(guessed_module_items(&a, "use std.nn\n", "loss").is_empty());
    }
}
