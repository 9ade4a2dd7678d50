//! `mgnc bench --trace` on a Vulkan device (lavapipe in CI; skipped without one, a failure
//! under `MGN_REQUIRE_GPU=1`): the Chrome trace lists every dispatch with its GPU time, op,
//! shape and model line, and `mgnc lsp` shows a line's time on hover from the trace beside the
//! model.

mod common;

use common::{mgnc, ok, root, scratch};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::{Command, Stdio};

/// Frames `messages` as the language server reads them, sends them all, closes its input and
/// returns every message it wrote before exiting.
fn lsp_session(messages: &[Value]) -> Vec<Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .arg("lsp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("mgnc lsp starts");
    let mut stdin = child.stdin.take().expect("stdin");
    for m in messages {
        let body = m.to_string();
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("written");
    }
    drop(stdin);
    let mut out = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read");
    child.wait().expect("exits");
    out.split("Content-Length: ")
        .filter_map(|frame| frame.split_once("\r\n\r\n"))
        .filter_map(|(_, body)| serde_json::from_str(body).ok())
        .collect()
}

#[test]
fn a_trace_lists_every_dispatch_and_hover_shows_a_lines_gpu_time() {
    if !mgn_gpu::testing::device_listed() {
        return; // recorded as a skip (a failure under MGN_REQUIRE_GPU=1)
    }
    let dir = scratch("trace");
    let model = dir.join("mlp.mgn");
    std::fs::copy(root().join("models/digits_mlp.mgn"), &model).expect("copied");
    let m = model.to_str().expect("utf-8");
    let small = ["--set", "batch=8", "--set", "hidden=16", "--backend", "vulkan"];
    let args = [&["bench", m][..], &small, &["--samples", "1", "--warmup", "0", "--trace"]];
    let err = ok(&mgnc(&args.concat()));
    let trace = dir.join("mlp.trace.json");
    assert!(err.contains(&format!("trace written to {}", trace.display())), "{err}");

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&trace).expect("written"))
        .expect("one JSON document");
    let events = v["traceEvents"].as_array().expect("trace events");
    let tracks: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert_eq!(tracks, ["forward", "forward + loss + backward"]);
    let slices: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert!(slices.len() > 5, "{slices:?}");
    for s in &slices {
        assert!(s["dur"].as_f64().is_some_and(|d| d >= 0.0), "{s}");
        assert!(s["args"]["source"].as_str().is_some_and(|l| l.contains("mlp.mgn:")), "{s}");
        assert!(s["args"]["shape"].as_str().is_some_and(|l| l.starts_with('[')), "{s}");
    }
    // Laid end to end per track.
    let ts: Vec<f64> =
        slices.iter().filter(|s| s["tid"] == 0).filter_map(|s| s["ts"].as_f64()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");

    let lines = v["mgnLines"].as_array().expect("per-line times");
    let abs = std::fs::canonicalize(&model).expect("exists");
    // What the times were taken at: the model's arguments, in order, its file and the device.
    let config = v["otherData"]["config"].as_array().expect("the model's arguments");
    assert!(config.contains(&json!(["batch", "8"])) && config.contains(&json!(["hidden", "16"])));
    assert_eq!(v["otherData"]["modelFile"], abs.display().to_string());
    assert!(v["otherData"]["device"].as_str().is_some_and(|d| !d.is_empty()), "{}", v["otherData"]);
    let line = lines
        .iter()
        .find(|l| l["file"] == abs.display().to_string() && l["plan"] == "forward")
        .and_then(|l| l["line"].as_u64())
        .expect("a forward line of the model");

    let uri = format!("file://{}", abs.display());
    let text = std::fs::read_to_string(&model).expect("model");
    let col = text.lines().nth(line as usize - 1).map_or(0, |l| l.len() - l.trim_start().len());
    let replies = lsp_session(&[
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": { "processId": null, "rootUri": null, "capabilities": {} } }),
        json!({ "jsonrpc": "2.0", "method": "initialized", "params": {} }),
        json!({ "jsonrpc": "2.0", "method": "textDocument/didOpen", "params": { "textDocument":
                { "uri": uri, "languageId": "mgn", "version": 1, "text": text } } }),
        json!({ "jsonrpc": "2.0", "id": 2, "method": "textDocument/hover", "params": {
                "textDocument": { "uri": uri },
                "position": { "line": line - 1, "character": col } } }),
        json!({ "jsonrpc": "2.0", "id": 3, "method": "shutdown" }),
        json!({ "jsonrpc": "2.0", "method": "exit" }),
    ]);
    let hover = replies.iter().find(|r| r["id"] == 2).expect("a hover answer");
    let shown = hover["result"]["contents"]["value"].as_str().unwrap_or_default();
    assert!(shown.contains("GPU time of this line") && shown.contains("forward "), "{hover}");
    assert!(shown.contains("of `mlp.mgn` at ") && shown.contains("batch=8"), "{hover}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Without a GPU there is nothing to trace: an error, not an empty file.
#[test]
fn a_trace_on_the_cpu_is_refused() {
    let dir = scratch("trace-cpu");
    let trace = dir.join("t.json");
    let args = ["bench", "models/digits_mlp.mgn", "--set", "batch=8", "--backend", "cpu"];
    let out =
        mgnc(&[&args[..], &["--samples", "1", "--trace", trace.to_str().expect("utf-8")]].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("profiling needs a GPU backend"), "{err}");
    assert!(!trace.exists());
    let _ = std::fs::remove_dir_all(dir);
}
