//! Renames as data: a text, the cursor, the new name, and the text after the edits or the
//! refusal's words.

use super::*;
use crate::features::tests::analyse;

const MODEL: &str = "\
use std.nn.{Linear as Dense}
use std.nn

// Doubles.
fn twice(x: f32[..B]) -> f32[..B] { x * 2 }

layer Block(width: dim, depth: int = 2) {
    fc = Dense(width, width)
    forward(x: f32[..B, width]) -> f32[..B, width] { relu(self.fc(x)) + twice(x) }
}

model Net(batch: dim = 4, d: dim = 8) {
    input x: f32[batch, d]
    block = Block(d, depth = 3)
    out = nn.Linear(d, 2, bias = false)
    forward {
        let h = block(x)
        let y = out(h) + out(twice(h))
        output y
    }
}
";

/// The text after renaming what is at `needle` (plus `delta` bytes) to `new`, or the error.
fn renamed(needle: &str, delta: usize, new: &str) -> Result<String, String> {
    let a = analyse(MODEL);
    let paths = Paths::without_stdlib();
    let ctx = Ctx { paths: &paths, this: &a, all: &[], facts_from: &[] };
    let offset = MODEL.find(needle).unwrap_or_else(|| panic!("{needle}")) + delta;
    let prepared = prepare_rename(&ctx, offset)?;
    let edit = rename(&ctx, offset, new)?;
    let lsp::PrepareRenameResponse::RangeWithPlaceholder { placeholder, .. } = prepared else {
        panic!("a placeholder")
    };
    let changes = edit.changes.expect("changes");
    assert_eq!(changes.len(), 1, "one file: {changes:?}");
    let mut edits = changes.into_values().next().unwrap();
    edits.sort_by_key(|e| std::cmp::Reverse((e.range.start.line, e.range.start.character)));
    let mut text = MODEL.to_string();
    for e in edits {
        let map = LineMap::new(&text);
        let (s, t) = (map.offset(e.range.start), map.offset(e.range.end));
        assert_eq!(text[s..t], placeholder, "each edit replaces the old name");
        text.replace_range(s..t, &e.new_text);
    }
    Ok(text)
}

#[test]
fn renames_every_use_of_the_definition() {
    // (cursor, delta, new name, the old text → the new one, each replaced everywhere)
    type Case<'a> = (&'a str, usize, &'a str, &'a [(&'a str, &'a str)]);
    let cases: &[Case] = &[
        (
            "h = block",
            0,
            "hidden",
            &[("let h ", "let hidden "), ("out(h)", "out(hidden)"), ("twice(h)", "twice(hidden)")],
        ),
        ("fc(x)", 0, "proj", &[("fc = ", "proj = "), ("self.fc(", "self.proj(")]),
        ("depth: int", 0, "layers", &[("depth: int", "layers: int"), ("depth = 3", "layers = 3")]),
        ("input x", 6, "inp", &[("input x:", "input inp:"), ("block(x)", "block(inp)")]),
        ("batch: dim", 0, "n", &[("batch: dim", "n: dim"), ("f32[batch", "f32[n")]),
        ("Block(d", 0, "Stage", &[("layer Block", "layer Stage"), ("Block(d", "Stage(d")]),
        (
            "twice(x)",
            0,
            "double",
            &[
                ("fn twice", "fn double"),
                ("+ twice(x)", "+ double(x)"),
                ("out(twice(h))", "out(double(h))"),
            ],
        ),
        ("output y", 7, "logits", &[("let y ", "let logits "), ("output y", "output logits")]),
        // An alias of a standard layer is the file's own name.
        (
            "Dense(width",
            0,
            "Lin",
            &[("Linear as Dense", "Linear as Lin"), ("Dense(width", "Lin(width")],
        ),
    ];
    for (needle, delta, new, changes) in cases {
        let got = renamed(needle, *delta, new).unwrap_or_else(|e| panic!("{needle}: {e}"));
        let mut want = MODEL.to_string();
        for (old, new) in *changes {
            assert!(want.contains(old), "{old}");
            want = want.replace(old, new);
        }
        assert_eq!(got, want, "renaming `{needle}` to `{new}`");
    }
}

#[test]
fn refuses_what_would_change_a_meaning_and_what_is_not_the_files() {
    // (cursor, delta, new name, words of the refusal)
    let cases: &[(&str, usize, &str, &str)] = &[
        ("relu", 0, "r", "`relu` is a builtin and cannot be renamed"),
        ("Linear(d", 0, "L", "defined in the standard library (std.nn)"),
        ("Linear as", 0, "L", "defined in the standard library (std.nn)"),
        ("bias =", 0, "b", "defined in the standard library"),
        ("nn.Linear", 0, "net", "names the module `std.nn`"),
        ("h = block", 0, "y", "`y` is already defined here (untitled:test.mgn:18)"),
        ("h = block", 0, "block", "`block` is already defined here"),
        ("h = block", 0, "d", "`d` is already defined here"),
        ("h = block", 0, "twice", "`twice` is already defined here"),
        ("fc(x)", 0, "width", "`width` is already defined here"),
        ("fc(x)", 0, "depth", "`depth` is already defined here"),
        ("twice(x)", 0, "Net", "`Net` is already defined here"),
        ("twice(x)", 0, "nn", "`nn` is already defined here"),
        ("twice(x)", 0, "x", "`x` is already defined here"),
        ("output y", 7, "h", "`h` is already defined here"),
        ("h = block", 0, "relu", "`relu` is a builtin"),
        ("h = block", 0, "let", "`let` is a reserved word"),
        ("h = block", 0, "2x", "`2x` is not a name"),
        ("// Doubles", 3, "x", "there is no name here"),
    ];
    for (needle, delta, new, words) in cases {
        match renamed(needle, *delta, new) {
            Ok(t) => panic!("renaming `{needle}` to `{new}` was allowed:\n{t}"),
            Err(e) => assert!(e.contains(words), "renaming `{needle}` to `{new}`: {e}"),
        }
    }
}

#[test]
fn a_file_with_syntax_errors_is_not_renamed() {
    let text = "fn f(x: int) -> int { x }\nfn g( {\n";
    let a = analyse(text);
    let paths = Paths::without_stdlib();
    let ctx = Ctx { paths: &paths, this: &a, all: &[], facts_from: &[] };
    let e = rename(&ctx, text.find("x }").unwrap(), "y").unwrap_err();
    assert!(e.contains("has syntax errors"), "{e}");
}
