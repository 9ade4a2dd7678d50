//! `mgnc lsp` driven as an editor would: JSON-RPC over the child's stdin/stdout.
//!
//! Run with `cargo test -p mgnc --test lsp -- --nocapture` to see the measured latency from
//! `didChange` to published diagnostics on the largest model in models/.

use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

#[path = "lsp/client.rs"]
mod client;

#[path = "lsp/actions.rs"]
mod actions;

#[path = "lsp/profile.rs"]
mod profile;

use client::{file_uri, temp_dir, Client};

/// (line, character) of the `n`th occurrence of `needle` in `text`, plus `delta` characters.
fn pos(text: &str, needle: &str, n: usize, delta: usize) -> Value {
    let off = text
        .match_indices(needle)
        .nth(n)
        .unwrap_or_else(|| panic!("`{needle}` #{n} not in the text"))
        .0
        + delta;
    let line = text[..off].matches('\n').count();
    let col = text[..off].rsplit('\n').next().unwrap().encode_utf16().count();
    json!({ "line": line, "character": col })
}

fn at(uri: &str, p: Value) -> Value {
    json!({ "textDocument": { "uri": uri }, "position": p })
}

fn hover_text(v: &Value) -> String {
    v["contents"]["value"].as_str().unwrap_or_default().to_string()
}

fn labels(v: &Value) -> Vec<String> {
    let items = if v.is_array() {
        v.as_array().unwrap().clone()
    } else {
        v["items"].as_array().cloned().unwrap_or_default()
    };
    items.iter().map(|i| i["label"].as_str().unwrap().to_string()).collect()
}

const MAIN: &str = "\
use std.nn.{Linear}
use \"./blocks.mgn\".{Scale}

// Doubles its input.
fn twice(x: f32[..B]) -> f32[..B] { x * 2 }

// A two-layer perceptron.
model Mlp(batch: dim = 4, d: dim = 8) {
    input x: f32[batch, d]

    fc = Linear(d, 16)
    out = Linear(16, 3, bias = false)
    scale = Scale(3)

    forward {
        let h = relu(fc(x))
        let y = scale(out(h))
        output y
    }
}
";

const BLOCKS: &str = "\
// Multiplies by a learned vector.
layer Scale(d: dim) {
    w = param f32[d] init ones

    forward(x: f32[..B, d]) -> f32[..B, d] {
        x * self.w
    }
}
";

#[test]
fn editor_session() {
    let dir = temp_dir("session");
    std::fs::write(dir.join("blocks.mgn"), BLOCKS).unwrap();
    std::fs::write(dir.join("main.mgn"), MAIN).unwrap();
    let main = file_uri(&dir.join("main.mgn"));
    let blocks = file_uri(&dir.join("blocks.mgn"));
    let mut c = Client::start(&dir);
    c.open(&main, MAIN);
    assert_eq!(c.diagnostics_for_version(&main, 1), Vec::<Value>::new(), "the model checks clean");
    // Each step below leaves the server in the state the next one starts from.
    hovers(&mut c, &main);
    let stdlib = definitions(&mut c, &main, &blocks, &dir);
    outline(&mut c, &main);
    completions_and_imported_files(&mut c, &main, &blocks, &stdlib);
    incremental_edits(&mut c, &main);
    formatting(&mut c, &main);
    c.shutdown();
}

/// The stdlib's `nn.mgn` as the server wrote it out: its URI and its text.
struct Stdlib {
    uri: String,
    text: String,
}

/// Hover: a let's type, a parameter (shape and checkpoint name), a builtin, a layer's doc.
fn hovers(c: &mut Client, main: &str) {
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(MAIN, "let h", 0, 4))));
    assert!(h.contains("let h: f32[4, 16]"), "{h}");
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(MAIN, "h)", 0, 0))));
    assert!(h.contains("let h: f32[4, 16]"), "a use of a let shows its type: {h}");
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(MAIN, "out(h)", 0, 1))));
    assert!(h.contains("layer `Linear` at `out`"), "{h}");
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(MAIN, "relu", 0, 1))));
    assert!(h.contains("builtin relu(x)") && h.contains("max(x, 0)"), "{h}");
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(MAIN, "Linear(d", 0, 2))));
    assert!(h.contains("layer Linear(\n    in_features: dim"), "the stdlib signature: {h}");
    assert!(h.contains("y = x · Wᵀ + b"), "and its doc comment: {h}");
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(MAIN, "twice", 0, 0))));
    assert!(
        h.contains("fn twice(x: f32[..B]) -> f32[..B]") && h.contains("Doubles its input."),
        "{h}"
    );
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(MAIN, "input x", 0, 6))));
    assert!(h.contains("input x: f32[batch, d]") && h.contains("f32[4, 8]"), "{h}");
    // Beyond the end of the file: an answer, not a crash.
    let r = c.request_raw("textDocument/hover", at(main, json!({ "line": 999, "character": 3 })));
    assert!(r.get("error").is_none(), "{r}");
}

/// Definition: a local, a stdlib layer, an imported layer, a named argument. Returns the
/// stdlib file the server pointed to.
fn definitions(c: &mut Client, main: &str, blocks: &str, dir: &Path) -> Stdlib {
    let d = c.request("textDocument/definition", at(main, pos(MAIN, "relu(fc(x))", 0, 8)));
    assert_eq!(d["uri"], main);
    assert_eq!(d["range"]["start"], pos(MAIN, "x: f32[batch", 0, 0), "`x` is the model input");
    let d = c.request("textDocument/definition", at(main, pos(MAIN, "h))", 0, 0)));
    assert_eq!(d["range"]["start"], pos(MAIN, "h = relu", 0, 0));
    let d = c.request("textDocument/definition", at(main, pos(MAIN, "Linear(d", 0, 1)));
    let uri = d["uri"].as_str().unwrap();
    assert!(uri.ends_with("/stdlib-cache/nn.mgn"), "{d}");
    let stdlib = Stdlib {
        uri: uri.to_string(),
        text: std::fs::read_to_string(dir.join("stdlib-cache/nn.mgn")).unwrap(),
    };
    assert_eq!(d["range"]["start"], pos(&stdlib.text, "Linear(\n    in_features", 0, 0), "{d}");
    let d = c.request("textDocument/definition", at(main, pos(MAIN, "Scale(3)", 0, 0)));
    assert_eq!(d["uri"], blocks);
    assert_eq!(d["range"]["start"], pos(BLOCKS, "Scale", 0, 0));
    let d = c.request("textDocument/definition", at(main, pos(MAIN, "bias = false", 0, 1)));
    assert_eq!(
        d["range"]["start"],
        pos(&stdlib.text, "bias: bool", 0, 0),
        "a named argument goes to the parameter: {d}"
    );
    stdlib
}

/// References, symbols, inlay hints, semantic tokens.
fn outline(c: &mut Client, main: &str) {
    // References of the field `fc`: its definition and its use.
    let r = c.request(
        "textDocument/references",
        json!({
            "textDocument": { "uri": main },
            "position": pos(MAIN, "fc = ", 0, 0),
            "context": { "includeDeclaration": true }
        }),
    );
    assert_eq!(r.as_array().unwrap().len(), 2, "{r}");

    let s = c.request("textDocument/documentSymbol", json!({ "textDocument": { "uri": main } }));
    let names: Vec<&str> =
        s.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["twice", "Mlp"]);
    let mlp = &s[1];
    let children: Vec<&str> =
        mlp["children"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(children, ["batch", "d", "x", "fc", "out", "scale", "forward"]);
    let hints = c.request(
        "textDocument/inlayHint",
        json!({
            "textDocument": { "uri": main },
            "range": {
                "start": { "line": 0, "character": 0 },
                "end": { "line": 99, "character": 0 }
            }
        }),
    );
    let hints: Vec<(Value, String)> = hints
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["position"].clone(), h["label"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        hints,
        [
            (pos(MAIN, "h = relu", 0, 1), ": f32[4, 16]".to_string()),
            (pos(MAIN, "y = scale", 0, 1), ": f32[4, 3]".to_string())
        ]
    );
    let t =
        c.request("textDocument/semanticTokens/full", json!({ "textDocument": { "uri": main } }));
    let data = t["data"].as_array().unwrap();
    assert!(data.len().is_multiple_of(5) && data.len() > 100, "{} numbers", data.len());
}

/// Completion: builtins and items anywhere, fields after `self.`; hover in an imported file and
/// in the stdlib shows what the importing model made of them.
fn completions_and_imported_files(c: &mut Client, main: &str, blocks: &str, stdlib: &Stdlib) {
    let l = labels(&c.request("textDocument/completion", at(main, pos(MAIN, "relu(fc", 0, 0))));
    for want in ["relu", "softmax", "Linear", "twice", "fc", "x", "batch", "let"] {
        assert!(l.iter().any(|x| x == want), "`{want}` missing from {l:?}");
    }
    let blocks = blocks_open(c, blocks);
    let l = labels(&c.request("textDocument/completion", at(&blocks, pos(BLOCKS, "self.w", 0, 5))));
    assert_eq!(l, ["w"]);
    // Hover in an imported file shows what the importing model made of it.
    let h = hover_text(&c.request("textDocument/hover", at(&blocks, pos(BLOCKS, "self.w", 0, 5))));
    assert!(h.contains("param f32[3] `scale.w`"), "{h}");
    // The stdlib copy opens as a document; hover there shows each instantiation.
    let nn = &stdlib.uri;
    c.open(nn, &stdlib.text);
    let h = hover_text(
        &c.request("textDocument/hover", at(nn, pos(&stdlib.text, "weight = param", 0, 0))),
    );
    assert!(h.contains("`fc.weight`") && h.contains("`out.weight`"), "{h}");
    let ds = c.diagnostics_for_version(nn, 1);
    assert!(ds.is_empty(), "{ds:#?}");
}

/// Incremental edits: type a call with a half-written named argument (a syntax error that
/// leaves the model unparsed), complete it, fix it, break a shape. Leaves main.mgn at version 4.
fn incremental_edits(c: &mut Client, main: &str) {
    let edit_at = pos(MAIN, "scale = Scale(3)", 0, 16);
    let typed = "\n    extra = Linear(64, 10, b";
    c.change(main, 2, json!([{ "range": { "start": edit_at, "end": edit_at }, "text": typed }]));
    let ds = c.diagnostics_for_version(main, 2);
    assert_eq!(ds.len(), 1, "{ds:#?}");
    assert_eq!(ds[0]["code"], "E0001");
    let now = MAIN.replace("scale = Scale(3)", "scale = Scale(3)\n    extra = Linear(64, 10, b");
    let l = labels(&c.request("textDocument/completion", at(main, pos(&now, "10, b", 0, 5))));
    assert_eq!(l.first().map(String::as_str), Some("bias"), "{l:?}");
    assert!(
        !l.contains(&"in_features".to_string())
            || l.iter().position(|x| x == "bias") < l.iter().position(|x| x == "in_features")
    );
    // Hover and definition still answer from what parsed.
    let h = hover_text(&c.request("textDocument/hover", at(main, pos(&now, "twice", 0, 0))));
    assert!(h.contains("fn twice"), "{h}");
    let end = pos(&now, "10, b", 0, 5);
    c.change(main, 3, json!([{ "range": { "start": end, "end": end }, "text": "ias = false)" }]));
    assert_eq!(c.diagnostics_for_version(main, 3), Vec::<Value>::new());
    // A shape error names the shapes and carries the related locations.
    let fixed = now.replace("10, b", "10, bias = false)");
    let bad = pos(&fixed, "scale(out(h))", 0, 0);
    let bad_end = pos(&fixed, "scale(out(h))", 0, 13);
    c.change(main, 4, json!([{ "range": { "start": bad, "end": bad_end }, "text": "fc(h)" }]));
    let ds = c.diagnostics_for_version(main, 4);
    assert_eq!(ds.len(), 1, "{ds:#?}");
    assert!(ds[0]["message"].as_str().unwrap().contains("f32[4, 16]"), "{:#}", ds[0]);
    assert!(ds[0]["relatedInformation"].as_array().is_some_and(|r| !r.is_empty()), "{:#}", ds[0]);
}

/// Formatting answers with `mgnc fmt`'s layout: one whole-document edit (or none if canonical).
fn formatting(c: &mut Client, main: &str) {
    let f = c.request_raw(
        "textDocument/formatting",
        json!({
            "textDocument": { "uri": main },
            "options": { "tabSize": 4, "insertSpaces": true }
        }),
    );
    assert!(f.get("error").is_none() && f.get("result").is_some(), "{f}");
    if let Some(edits) = f["result"].as_array() {
        let new_text = edits[0]["newText"].as_str().expect("an edit");
        assert_eq!(
            mgn_syntax::format::format(new_text).as_deref(),
            Ok(new_text),
            "the result is already canonical"
        );
    }
}

/// Opens blocks.mgn and returns its URI.
fn blocks_open(c: &mut Client, uri: &str) -> String {
    c.open(uri, BLOCKS);
    c.diagnostics_for_version(uri, 1);
    uri.to_string()
}

#[test]
fn unsaved_imports_and_their_own_diagnostics() {
    let dir = temp_dir("imports");
    std::fs::write(dir.join("blocks.mgn"), BLOCKS).unwrap();
    let main = file_uri(&dir.join("main.mgn"));
    let blocks = file_uri(&dir.join("blocks.mgn"));
    let mut c = Client::start(&dir);
    c.open(&blocks, BLOCKS);
    c.open(&main, MAIN);
    assert_eq!(c.diagnostics_for_version(&main, 1), Vec::<Value>::new());
    // Rename the layer in the unsaved buffer: main.mgn's import now fails.
    let p = pos(BLOCKS, "Scale", 0, 0);
    let p_end = pos(BLOCKS, "Scale", 0, 5);
    c.change(&blocks, 2, json!([{ "range": { "start": p, "end": p_end }, "text": "Scaler" }]));
    let ds =
        c.diagnostics_where(&main, |p| p["diagnostics"].as_array().is_some_and(|d| !d.is_empty()));
    let ds = ds["diagnostics"].as_array().unwrap();
    assert_eq!(ds[0]["code"], "E0103", "{ds:#?}");
    assert!(ds[0]["message"].as_str().unwrap().contains("no item named `Scale`"));
    // An error inside the imported file is reported on that file, also from main's analysis.
    c.change(
        &blocks,
        3,
        json!([{ "range": { "start": p, "end": pos(BLOCKS, "Scale", 0, 5) }, "text": "Scale" }]),
    );
    let w = pos(BLOCKS, "x * self.w", 0, 0);
    c.change(
        &blocks,
        4,
        json!([{ "range": { "start": w, "end": pos(BLOCKS, "x * self.w", 0, 1) }, "text": "xx" }]),
    );
    let ds = c.diagnostics_where(&blocks, |p| {
        p["diagnostics"].as_array().is_some_and(|d| d.iter().any(|d| d["code"] == "E0101"))
    });
    assert!(ds["diagnostics"][0]["message"].as_str().unwrap().contains("cannot find `xx`"), "{ds}");
    // Many quick edits: only the newest version is published.
    for v in 5..=9 {
        let text = if v % 2 == 1 { "x" } else { "xx" };
        let len = if v % 2 == 1 { 2 } else { 1 };
        let end = json!({ "line": w["line"], "character": w["character"].as_u64().unwrap() + len });
        c.change(&blocks, v, json!([{ "range": { "start": w, "end": end }, "text": text }]));
    }
    let p = c.diagnostics_where(&blocks, |p| p["version"] == 9);
    assert_eq!(p["diagnostics"], json!([]));
    let stale: Vec<&Value> = c
        .inbox
        .iter()
        .filter(|m| {
            m["params"]["uri"] == blocks.as_str()
                && m["params"]["version"].as_i64().is_some_and(|v| (5..9).contains(&v))
        })
        .collect();
    assert!(stale.is_empty(), "stale versions are not published: {stale:#?}");
    c.shutdown();
}

#[test]
fn latency_on_the_largest_model() {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    let largest = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "mgn"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let text = std::fs::read_to_string(&largest).unwrap();
    let dir = temp_dir("latency");
    let uri = file_uri(&largest.canonicalize().unwrap());
    let mut c = Client::start(&dir);
    c.open(&uri, &text);
    let first = c.diagnostics_for_version(&uri, 1);
    let end = pos(&text, "\n", text.matches('\n').count() - 1, 1);
    let mut times = Vec::new();
    for v in 2..=6i64 {
        let edit = if v % 2 == 0 { "// edited\n" } else { "" };
        let range_end = if v % 2 == 0 {
            end.clone()
        } else {
            json!({ "line": end["line"].as_u64().unwrap() + 1, "character": 0 })
        };
        let start = Instant::now();
        c.change(&uri, v, json!([{ "range": { "start": end, "end": range_end }, "text": edit }]));
        let ds = c.diagnostics_for_version(&uri, v);
        times.push(start.elapsed());
        assert_eq!(ds, first);
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "didChange → publishDiagnostics on {} ({} bytes): median {:.0} ms, min {:.0} ms, \
         max {:.0} ms (includes the {} ms debounce)",
        largest.file_name().unwrap().to_string_lossy(),
        text.len(),
        median.as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        150
    );
    c.shutdown();
}

/// Imports the server must not read: a FIFO without a writer, a device without end and a kernel
/// file that reports no size (`/proc/kmsg` would wait for the next kernel message). Each is a
/// diagnostic at its `use`, and the server goes on answering.
#[cfg(unix)]
#[test]
fn imports_of_special_files_do_not_stop_the_server() {
    let dir = temp_dir("special");
    let fifo = std::ffi::CString::new(dir.join("fifo.mgn").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    let main = file_uri(&dir.join("main.mgn"));
    let text = "use \"./fifo.mgn\".{A}\nuse \"/dev/zero\".{B}\nuse \"/proc/self/status\".{C}\n\
                fn f() -> int { 1 }\n";
    let mut c = Client::start(&dir);
    c.open(&main, text);
    let ds = c.diagnostics_for_version(&main, 1);
    let got: Vec<(&str, u64)> = ds
        .iter()
        .map(|d| (d["code"].as_str().unwrap(), d["range"]["start"]["line"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, [("E0104", 0), ("E0104", 1), ("E0104", 2)], "{ds:#?}");
    assert!(ds[0]["message"].as_str().unwrap().contains("named pipe"), "{ds:#?}");
    assert!(ds[1]["message"].as_str().unwrap().contains("character device"), "{ds:#?}");
    assert!(ds[2]["message"].as_str().unwrap().contains("reports"), "{ds:#?}");
    let h = hover_text(&c.request("textDocument/hover", at(&main, pos(text, "f()", 0, 0))));
    assert!(h.contains("fn f() -> int"), "{h}");
    c.shutdown();
}

/// Malformed input between valid requests: each malformed request is answered with a JSON-RPC
/// error (or skipped), bad framing is skipped up to the next header, and the session goes on.
#[test]
fn malformed_messages_and_framing_do_not_end_the_session() {
    let dir = temp_dir("malformed");
    let main = file_uri(&dir.join("main.mgn"));
    let text = "fn f() -> int { 1 }\n";
    let mut c = Client::start(&dir);
    c.open(&main, text);
    c.diagnostics_for_version(&main, 1);
    let still_answers = |c: &mut Client| {
        let h = hover_text(&c.request("textDocument/hover", at(&main, pos(text, "f()", 0, 0))));
        assert!(h.contains("fn f() -> int"), "{h}");
    };
    let error_with = |c: &mut Client, code: i64, id: Value| {
        let what = format!("error {code} for id {id}");
        c.next_where(&what, |v| v["error"]["code"] == code && v["id"] == id)
    };
    // A body that is not JSON: a parse error, with no id to give.
    c.send_raw(b"Content-Length: 10\r\n\r\n{not json}");
    error_with(&mut c, -32700, Value::Null);
    still_answers(&mut c);
    // JSON, but not a request: an invalid request, with its id. An id lsp-server cannot hold.
    let bad = br#"{"jsonrpc":"2.0","id":77,"method":5}"#;
    c.send_raw(&[format!("Content-Length: {}\r\n\r\n", bad.len()).as_bytes(), bad].concat());
    error_with(&mut c, -32600, json!(77));
    c.send(json!({ "jsonrpc": "2.0", "id": 1u64 << 40, "method": "textDocument/hover" }));
    error_with(&mut c, -32600, json!(1u64 << 40));
    c.send(json!([1, 2]));
    error_with(&mut c, -32600, Value::Null);
    c.send(json!({ "jsonrpc": "2.0", "method": 7 })); // a broken notification: no answer
    still_answers(&mut c);
    // No header at all, a header line that is not a header, an unreadable length.
    c.send_raw(br#"{"jsonrpc":"2.0","id":500,"method":"shutdown"}"#);
    still_answers(&mut c);
    c.send_raw(b"Content-Type: x\r\nthis is no header\r\n\r\n{}");
    c.send_raw(b"Content-Length: lots\r\n\r\n{}");
    c.send_raw(b"Content-Length: 99999999999999999999999\r\n\r\n{}");
    still_answers(&mut c);
    // Too short: the cut body is a parse error, and the rest is skipped.
    c.send_raw(
        b"Content-Length: 5\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":501,\"method\":\"shutdown\"}",
    );
    error_with(&mut c, -32700, Value::Null);
    still_answers(&mut c);
    // Too long: the body ends where the next header starts.
    let short = br#"{"jsonrpc":"2.0","id":502,"method":"textDocument/documentSymbol","params":{}}"#;
    c.send_raw(&[b"Content-Length: 4000\r\n\r\n".as_slice(), short].concat());
    still_answers(&mut c);
    error_with(&mut c, -32602, json!(502));
    // Bytes that are not UTF-8, and a header without its body before the end of input.
    c.send_raw(b"Content-Length: 4\r\n\r\n\xff\xfe\xfd\xfc");
    error_with(&mut c, -32700, Value::Null);
    still_answers(&mut c);
    c.shutdown();
}

/// Rename across a file and its import, and what it refuses; the answer is at once.
#[test]
fn rename_across_files_and_its_refusals() {
    let dir = temp_dir("rename");
    std::fs::write(dir.join("blocks.mgn"), BLOCKS).unwrap();
    let main = file_uri(&dir.join("main.mgn"));
    let blocks = file_uri(&dir.join("blocks.mgn"));
    let mut c = Client::start(&dir);
    c.open(&main, MAIN);
    let p = c.request("textDocument/prepareRename", at(&main, pos(MAIN, "Scale(3)", 0, 2)));
    assert_eq!(p["placeholder"], "Scale", "{p}");
    assert_eq!(p["range"]["start"], pos(MAIN, "Scale(3)", 0, 0), "{p}");
    let rename = |c: &mut Client, at_: Value, new: &str| {
        let mut params = at_;
        params["newName"] = json!(new);
        c.request_raw("textDocument/rename", params)
    };
    let r = rename(&mut c, at(&main, pos(MAIN, "Scale(3)", 0, 0)), "Gain");
    let changes = &r["result"]["changes"];
    let in_main = changes[&main].as_array().expect("edits in main.mgn");
    let in_blocks = changes[&blocks].as_array().expect("edits in blocks.mgn");
    assert_eq!(in_main.len(), 2, "the import and the use: {r}");
    assert_eq!(in_blocks.len(), 1, "the definition: {r}");
    assert_eq!(in_blocks[0]["range"]["start"], pos(BLOCKS, "Scale", 0, 0));
    assert!(in_main.iter().all(|e| e["newText"] == "Gain"), "{r}");
    // Refusals are errors with a message the editor shows.
    let refusals = [
        (pos(MAIN, "Linear(d", 0, 0), "Dense", "standard library"),
        (pos(MAIN, "relu", 0, 0), "r", "builtin"),
        (pos(MAIN, "let h", 0, 4), "y", "already defined"),
        (pos(MAIN, "let h", 0, 4), "fn", "reserved word"),
    ];
    for (p, new, words) in refusals {
        let r = rename(&mut c, at(&main, p.clone()), new);
        let msg = r["error"]["message"].as_str().unwrap_or_else(|| panic!("refused: {r}"));
        assert!(msg.contains(words), "{msg}");
    }
    let r = c.request_raw("textDocument/prepareRename", at(&main, pos(MAIN, "Linear(d", 0, 0)));
    assert!(r["error"]["message"].as_str().is_some_and(|m| m.contains("standard library")), "{r}");
    c.shutdown();
}

/// Completion in `use` lines, and in a file opened half-typed (no analysis has seen it parse);
/// a half-typed `self.` is reported on its own line.
#[test]
fn completion_in_use_lines_and_right_after_opening() {
    let dir = temp_dir("typing");
    let main = file_uri(&dir.join("main.mgn"));
    let text = "\
use std.nn.{Linear, }
use std.

model M {
    input x: f32[2, 4]
    fc = Linear(4, 4)
    forward {
        let h = fc(x)
        let z = self.

        output y = h
    }
}
";
    let mut c = Client::start(&dir);
    c.open(&main, text);
    let complete =
        |c: &mut Client, p: Value| labels(&c.request("textDocument/completion", at(&main, p)));
    let l = complete(&mut c, pos(text, "self.", 0, 5));
    assert_eq!(l, ["fc"], "fields after `self.` before any analysis saw the model parse");
    let l = complete(&mut c, pos(text, "Linear, }", 0, 8));
    for want in ["LayerNorm", "GroupNorm", "Mlp"] {
        assert!(l.iter().any(|x| x == want), "`{want}` missing from {l:?}");
    }
    assert!(!l.iter().any(|x| x == "Linear" || x == "relu" || x == "M"), "{l:?}");
    let l = complete(&mut c, pos(text, "std.\n", 0, 4));
    assert_eq!(l, ["nn", "attention", "loss", "init"]);
    let ds = c.diagnostics_for_version(&main, 1);
    let lines: Vec<u64> =
        ds.iter().map(|d| d["range"]["start"]["line"].as_u64().unwrap()).collect();
    assert!(lines.contains(&8), "`self.` is reported on its own line: {ds:#?}");
    assert!(!lines.contains(&10), "not at the next statement: {ds:#?}");
    c.shutdown();
}

const ENCODER: &str = "\
use std.attention.{MultiHeadAttention}
layer Block(d: dim, heads: dim) {
    attn = MultiHeadAttention(d, heads)
    forward(x: f32[B, T, d]) -> f32[B, T, d] { x + attn(x) }
}
model Encoder {
    input x: f32[2, 16, 100]
    block = Block(100, 8)
    forward { output y = block(x) }
}
";

/// An error raised inside the stdlib (`MultiHeadAttention`'s `d / heads`) is published in the
/// user's open file at the call that led there, with the place in the stdlib and the trace as
/// related information; fixing the call clears it.
#[test]
fn errors_inside_the_stdlib_are_published_at_the_users_call() {
    let dir = temp_dir("trace");
    let main = file_uri(&dir.join("main.mgn"));
    let mut c = Client::start(&dir);
    c.open(&main, ENCODER);
    let ds = c.diagnostics_for_version(&main, 1);
    let [d] = ds.as_slice() else { panic!("one diagnostic: {ds:#?}") };
    assert_eq!(d["code"], "E0301");
    assert_eq!(d["range"]["start"], pos(ENCODER, "MultiHeadAttention(d, heads)", 0, 0), "{d:#}");
    let message = d["message"].as_str().unwrap();
    assert!(message.starts_with("100 is not divisible by 8"), "{message}");
    assert!(message.contains("in `Block` at ") && message.contains("main.mgn:3:12"), "{message}");
    let related = d["relatedInformation"].as_array().expect("related information");
    let said = |text: &str, file: &str| {
        related.iter().any(|r| {
            r["message"].as_str().unwrap_or_default().contains(text)
                && r["location"]["uri"].as_str().unwrap_or_default().ends_with(file)
        })
    };
    assert!(said("100 / 8 leaves a remainder of 4", "/attention.mgn"), "{d:#}");
    assert!(said("in model `Encoder`", "/main.mgn") && said("in `Block`", "/main.mgn"), "{d:#}");
    assert!(said("in `MultiHeadAttention`", "/attention.mgn"), "{d:#}");
    let (eight, end) = (pos(ENCODER, "100, 8)", 0, 5), pos(ENCODER, "100, 8)", 0, 6));
    c.change(&main, 2, json!([{ "range": { "start": eight, "end": end }, "text": "4" }]));
    assert_eq!(c.diagnostics_for_version(&main, 2), Vec::<Value>::new());
    c.shutdown();
}

/// The protocol's end of a session: after `shutdown`, a request is answered with an error
/// (InvalidRequest), not left unanswered; `exit` then ends the process with 0. An `exit` with
/// no `shutdown` before it ends it with 1.
#[test]
fn requests_after_shutdown_are_refused_and_exit_codes_follow_the_protocol() {
    let dir = temp_dir("shutdown");
    let main = file_uri(&dir.join("main.mgn"));
    let text = "fn f() -> int { 1 }\n";
    let mut c = Client::start(&dir);
    c.open(&main, text);
    c.diagnostics_for_version(&main, 1);
    assert!(c.request("shutdown", Value::Null).is_null());
    let v = c.request_raw("textDocument/hover", at(&main, pos(text, "f()", 0, 0)));
    assert_eq!(v["error"]["code"], -32600, "{v}");
    c.notify("exit", Value::Null);
    assert_eq!(c.exit_code(), Some(0));

    let mut c = Client::start(&dir);
    c.notify("exit", Value::Null);
    assert_eq!(c.exit_code(), Some(1), "exit without shutdown");
}
