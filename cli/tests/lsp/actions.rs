//! Quick fixes (`textDocument/codeAction`): each diagnostic that carries a suggestion offers the
//! edit that carries it out, and applying it leaves a file that checks clean.

use super::client::{file_uri, temp_dir, Client};
use super::pos;
use serde_json::{json, Value};

const TYPOS: &str = "\
use std.nn.{Linear}

layer Scale(d: dim) {
    w = param f32[d] init ones

    forward(x: f32[..B, d]) -> f32[..B, d] {
        x * self.ww
    }
}

model M() {
    input x: f32[4, 8]

    fc = Linear(8, 8)
    norm = LayerNorm(8)
    s = Scale(8)

    forward {
        let h = detach(fc(x))
        let y = s(norm(rleu(h)))
        output y
    }
}
";

const TWO_TENSORS: &str = "\
model M() {
    input x: f32[4, 8]
    input z: f32[4, 8]

    forward {
        let y = max(x, z)
        output y
    }
}
";

/// The code actions at the diagnostic found at `needle`, with that diagnostic as context.
fn actions_at(c: &mut Client, uri: &str, diags: &[Value], text: &str, needle: &str) -> Vec<Value> {
    let p = pos(text, needle, 0, 0);
    let d: Vec<Value> =
        diags.iter().filter(|d| d["range"]["start"] == p).cloned().collect::<Vec<_>>();
    assert_eq!(d.len(), 1, "one diagnostic at `{needle}`: {diags:?}");
    let params = json!({
        "textDocument": { "uri": uri },
        "range": { "start": p, "end": p },
        "context": { "diagnostics": d },
    });
    let r = c.request("textDocument/codeAction", params);
    let actions = r.as_array().cloned().unwrap_or_default();
    for a in &actions {
        assert_eq!(a["kind"], "quickfix", "{a}");
        assert_eq!(a["diagnostics"][0]["range"]["start"], p, "names what it fixes: {a}");
    }
    actions
}

/// Applies a code action's edits (for `uri`) to `text`, last edit first.
fn apply(text: &str, uri: &str, action: &Value) -> String {
    let mut edits = action["edit"]["changes"][uri].as_array().cloned().unwrap();
    let offset = |p: &Value| {
        let line = p["line"].as_u64().unwrap() as usize;
        let col = p["character"].as_u64().unwrap() as usize;
        text.split_inclusive('\n').take(line).map(str::len).sum::<usize>() + col
    };
    edits.sort_by_key(|e| std::cmp::Reverse(offset(&e["range"]["start"])));
    let mut out = text.to_string();
    for e in edits {
        let (s, t) = (offset(&e["range"]["start"]), offset(&e["range"]["end"]));
        out.replace_range(s..t, e["newText"].as_str().unwrap());
    }
    out
}

fn only_title(actions: &[Value]) -> &str {
    assert_eq!(actions.len(), 1, "{actions:?}");
    actions[0]["title"].as_str().unwrap()
}

#[test]
fn quick_fixes_carry_out_the_suggestions() {
    let dir = temp_dir("actions");
    let path = dir.join("typos.mgn");
    std::fs::write(&path, TYPOS).unwrap();
    let uri = file_uri(&path);
    let mut c = Client::start(&dir);
    c.open(&uri, TYPOS);
    let diags = c.diagnostics_for_version(&uri, 1);
    assert_eq!(diags.len(), 4, "{diags:?}");
    let mut text = TYPOS.to_string();
    let field = actions_at(&mut c, &uri, &diags, TYPOS, "ww");
    assert_eq!(only_title(&field), "replace with `w`");
    text = apply(&text, &uri, &field[0]);
    let import = actions_at(&mut c, &uri, &diags, TYPOS, "LayerNorm");
    assert_eq!(only_title(&import), "add `use std.nn.{LayerNorm}`");
    let detach = actions_at(&mut c, &uri, &diags, TYPOS, "detach");
    assert_eq!(only_title(&detach), "replace with `stop_gradient`");
    let relu = actions_at(&mut c, &uri, &diags, TYPOS, "rleu");
    assert_eq!(only_title(&relu), "replace with `relu`");
    // Each edit is at its own place: applied from the last one up, they compose.
    for a in [&relu[0], &detach[0]] {
        text = apply(&text, &uri, a);
    }
    text = apply(&text, &uri, &import[0]);
    assert!(text.starts_with("use std.nn.{Linear, LayerNorm}\n"), "{text}");
    assert!(text.contains("x * self.w\n") && text.contains("stop_gradient(fc(x))"), "{text}");
    c.change(&uri, 2, json!([{ "text": text }]));
    assert_eq!(c.diagnostics_for_version(&uri, 2), Vec::<Value>::new(), "{text}");
    // A position without a diagnostic has no action.
    let start = json!({ "line": 0, "character": 0 });
    let none = c.request(
        "textDocument/codeAction",
        json!({
            "textDocument": { "uri": uri },
            "range": { "start": start, "end": start },
            "context": { "diagnostics": [] },
        }),
    );
    assert_eq!(none, json!([]));

    // `max(a, b)` of two tensors is `maximum`: an elaboration error with a fix.
    let path = dir.join("two.mgn");
    std::fs::write(&path, TWO_TENSORS).unwrap();
    let two = file_uri(&path);
    c.open(&two, TWO_TENSORS);
    let diags = c.diagnostics_for_version(&two, 1);
    let max = actions_at(&mut c, &two, &diags, TWO_TENSORS, "z)");
    assert_eq!(only_title(&max), "replace with `maximum`");
    let fixed = apply(TWO_TENSORS, &two, &max[0]);
    assert!(fixed.contains("let y = maximum(x, z)"), "{fixed}");
    c.change(&two, 2, json!([{ "text": fixed }]));
    assert_eq!(c.diagnostics_for_version(&two, 2), Vec::<Value>::new());
    c.shutdown();
}
