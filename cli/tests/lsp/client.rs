//! The editor's side of an `mgnc lsp` session for the tests in `lsp.rs`: a child process
//! spoken to in JSON-RPC, its messages read on a thread, requests answered by id.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub const TIMEOUT: Duration = Duration::from_secs(60);

pub struct Client {
    child: Child,
    stdin: ChildStdin,
    rx: Receiver<Value>,
    next_id: i64,
    /// Notifications that arrived while waiting for something else.
    pub inbox: VecDeque<Value>,
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mgn-lsp-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn file_uri(p: &Path) -> String {
    let mut out = String::from("file://");
    for b in p.to_string_lossy().bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    pub fn start(dir: &Path) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mgnc"))
            .arg("lsp")
            .env("MGN_STDLIB_DIR", dir.join("stdlib-cache"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("mgnc lsp starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut len = None;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("Content-Length: ") {
                        len = v.parse::<usize>().ok();
                    }
                }
                let mut body = vec![0; len.expect("Content-Length header")];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                let v: Value = serde_json::from_slice(&body).expect("the server sends JSON");
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let mut c = Client { child, stdin, rx, next_id: 1, inbox: VecDeque::new() };
        let root = file_uri(dir);
        let init = c.request(
            "initialize",
            json!({ "processId": null, "rootUri": root, "capabilities": {} }),
        );
        let caps = &init["capabilities"];
        assert_eq!(caps["textDocumentSync"]["change"], 2, "incremental sync: {caps}");
        assert!(caps["semanticTokensProvider"]["legend"]["tokenTypes"].is_array());
        assert_eq!(caps["renameProvider"]["prepareProvider"], true, "{caps}");
        assert_eq!(caps["codeActionProvider"]["codeActionKinds"], json!(["quickfix"]), "{caps}");
        c.notify("initialized", json!({}));
        c
    }

    pub fn send(&mut self, v: Value) {
        let body = serde_json::to_string(&v).unwrap();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{}", body.len(), body).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Bytes as they are, framed or not.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// The full response (`result` or `error`).
    pub fn request_raw(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let v = self
                .rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            if v.get("id") == Some(&json!(id)) && v.get("method").is_none() {
                return v;
            }
            self.inbox.push_back(v);
        }
    }

    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let v = self.request_raw(method, params);
        assert!(v.get("error").is_none(), "{method} failed: {v}");
        v["result"].clone()
    }

    /// The next message from the server that satisfies `pred`.
    pub fn next_where(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + TIMEOUT;
        if let Some(i) = self.inbox.iter().position(&pred) {
            return self.inbox.remove(i).unwrap();
        }
        loop {
            match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(v) if pred(&v) => return v,
                Ok(v) => self.inbox.push_back(v),
                Err(RecvTimeoutError::Timeout) => panic!("no {what}; saw {:#?}", self.inbox),
                Err(e) => panic!("server went away: {e}"),
            }
        }
    }

    /// The next `publishDiagnostics` for `uri` that satisfies `pred`.
    pub fn diagnostics_where(&mut self, uri: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let matches = |v: &Value| {
            v["method"] == "textDocument/publishDiagnostics"
                && v["params"]["uri"] == uri
                && pred(&v["params"])
        };
        self.next_where(&format!("diagnostics for {uri}"), matches)["params"].clone()
    }

    pub fn diagnostics_for_version(&mut self, uri: &str, version: i64) -> Vec<Value> {
        let p = self.diagnostics_where(uri, |p| p["version"] == version);
        p["diagnostics"].as_array().unwrap().clone()
    }

    pub fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({
                "textDocument": { "uri": uri, "languageId": "mgn", "version": 1, "text": text }
            }),
        );
    }

    pub fn change(&mut self, uri: &str, version: i64, changes: Value) {
        self.notify(
            "textDocument/didChange",
            json!({
                "textDocument": { "uri": uri, "version": version },
                "contentChanges": changes
            }),
        );
    }

    /// The server's exit code, once it has exited (within ten seconds).
    pub fn exit_code(&mut self) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(start.elapsed() < Duration::from_secs(10), "mgnc lsp did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn shutdown(mut self) {
        let r = self.request("shutdown", Value::Null);
        assert!(r.is_null());
        self.notify("exit", Value::Null);
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "mgnc lsp exits cleanly: {status}");
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "mgnc lsp did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
