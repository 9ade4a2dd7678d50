//! Completion in texts as they are while being typed: the item around the cursor does not parse,
//! and maybe never did.

use super::*;
use crate::features::tests::analyse;

/// The labels completion offers at `needle` (plus `delta`) of `text`, with `last` the analysis
/// of an earlier text in which every item parsed (if any).
fn offered(text: &str, needle: &str, delta: usize, earlier: Option<&str>) -> Vec<String> {
    let a = analyse(text);
    let mut last = HashMap::new();
    if let Some(e) = earlier {
        let old = analyse(e);
        let root = old.program().module(old.program().root);
        for item in &root.ast.items {
            if let Some(n) = item.name() {
                last.insert(n.name.clone(), old.clone());
            }
        }
    }
    let offset = text.find(needle).unwrap_or_else(|| panic!("{needle}")) + delta;
    let names_of = |t: String| Some(Arc::try_unwrap(analyse(&t)).ok().expect("one owner"));
    complete(&a, &last, names_of, text, offset).into_iter().map(|i| i.label).collect()
}

const GOOD: &str = "\
use std.nn
model M(d: dim = 4) {
    input x: f32[2, d]
    fc = nn.Linear(d, d)
    forward {
        let hidden = fc(x)
        output y = hidden
    }
}
";

/// The line typed, where it goes in GOOD, the cursor's needle, what is offered and what not.
type Typed<'a> = (&'a str, &'a str, &'a str, &'a [&'a str], &'a [&'a str]);

#[test]
fn the_line_being_typed_does_not_hide_the_scope() {
    let cases: &[Typed] = &[
        // (the line typed, where it goes in GOOD, cursor needle, offered, not offered)
        ("        let z = self.\n", "        output", "self.", &["fc"], &["relu"]),
        ("        let z = \n", "        output", "= \n", &["hidden", "fc", "x", "d"], &[]),
        ("    out = nn.Linear(d, \n", "    forward", "d, \n", &["bias", "d", "x"], &["hidden"]),
        ("    out = nn.\n", "    forward", "nn.\n", &["LayerNorm", "Mlp"], &["hidden"]),
    ];
    for (line, before, needle, want, not) in cases {
        let at = GOOD.find(before).unwrap();
        let text = format!("{}{line}{}", &GOOD[..at], &GOOD[at..]);
        let delta = needle.trim_end().len();
        let got = offered(&text, needle, delta, None);
        for w in *want {
            assert!(got.iter().any(|g| g == w), "{line:?}: `{w}` missing from {got:?}");
        }
        for w in *not {
            assert!(!got.iter().any(|g| g == w), "{line:?}: `{w}` offered: {got:?}");
        }
    }
}

/// A call open over several lines does not parse with one line left out: the item's last
/// version gives the scope, and a field line is offered no name of the forward.
#[test]
fn the_last_version_that_parsed_and_no_forward_names_outside_forward() {
    let at = GOOD.find("    forward").unwrap();
    let text = format!("{}    out = nn.Linear(\n        d, \n{}", &GOOD[..at], &GOOD[at..]);
    let got = offered(&text, "d, \n", 3, Some(GOOD));
    assert!(got.iter().any(|g| g == "bias") && got.iter().any(|g| g == "fc"), "{got:?}");
    assert!(!got.iter().any(|g| g == "hidden"), "a let of forward offered in a field: {got:?}");
    let at = GOOD.find("        output").unwrap();
    let text = format!("{}        let z = relu(\n            \n{}", &GOOD[..at], &GOOD[at..]);
    let got = offered(&text, "relu(\n", 18, Some(GOOD));
    assert!(got.iter().any(|g| g == "hidden"), "in forward, its lets: {got:?}");
}

#[test]
fn a_module_typed_a_moment_ago_is_found_from_the_text() {
    let text = "use std.nn\nmodel M {\n    fc = nn.";
    let got = offered(text, "nn.", 3, None);
    assert!(got.iter().any(|g| g == "GroupNorm"), "{got:?}");
}

#[test]
fn signatures_in_details_carry_no_comments() {
    let text = "model M(\n    d: dim = 4,  // the width\n    n: dim = 2, /* rows */\n) {\n    \
                input x: f32[n, d]\n    forward { output y = x }\n}\nfn f() -> int { 1 }\n";
    let a = analyse(text);
    let offset = text.find("{ 1 }").unwrap() + 2;
    let items = complete(&a, &HashMap::new(), |_| None, text, offset);
    let m = items.iter().find(|i| i.label == "M").expect("M offered");
    assert_eq!(m.detail.as_deref(), Some("model M(d: dim = 4, n: dim = 2)"));
}
