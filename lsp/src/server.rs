//! The main loop: document sync, the diagnostics worker and request dispatch.
//!
//! Requests are answered on the main thread from an analysis of the current buffers (made
//! there if the last one is out of date). Diagnostics are computed on a worker thread, 150 ms
//! after the last change, and published only if no buffer they read has changed meanwhile.

use crate::analysis::{Analysis, Doc, Snapshot};
use crate::features::{self, Ctx};
use crate::paths::Paths;
use crate::text::{apply_change, LineMap};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types as lsp;
use lsp_types::notification::Notification as _;
use lsp_types::Uri;
use mgn_compiler::source::Origin;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long the worker waits after a change before checking.
pub const DEBOUNCE: Duration = Duration::from_millis(150);

#[derive(Default)]
pub struct State {
    pub docs: HashMap<Uri, Doc>,
    /// The latest analysis of each open document.
    pub analyses: HashMap<Uri, Arc<Analysis>>,
    /// For each open document and item name, the latest analysis in which that item parsed
    /// (completion inside an item that does not parse right now uses it).
    pub last_items: HashMap<Uri, HashMap<String, Arc<Analysis>>>,
}

impl State {
    fn store(&mut self, a: Arc<Analysis>) {
        let root = a.program().module(a.program().root);
        let names = self.last_items.entry(a.uri.clone()).or_default();
        for item in &root.ast.items {
            if let Some(n) = item.name() {
                names.insert(n.name.clone(), a.clone());
            }
        }
        self.analyses.insert(a.uri.clone(), a);
    }

    /// Open documents whose latest analysis read `origin`.
    fn dependents(&self, origin: &Origin) -> Vec<Uri> {
        self.analyses.values().filter(|a| a.reads(origin)).map(|a| a.uri.clone()).collect()
    }
}

type Shared = Arc<Mutex<State>>;

/// The analysis of one document, the other current ones, and the out-of-date ones.
type AnalysisSet = (Arc<Analysis>, Vec<Arc<Analysis>>, Vec<Arc<Analysis>>);

/// For each file: what each root's analysis said about it, and the version of the file's
/// buffer that analysis read (`None`: not open then).
type Contributions = HashMap<Uri, HashMap<Uri, (Option<i32>, Vec<lsp::Diagnostic>)>>;

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

enum Job {
    Check(Uri),
    Closed(Uri),
}

pub fn capabilities() -> lsp::ServerCapabilities {
    lsp::ServerCapabilities {
        text_document_sync: Some(lsp::TextDocumentSyncCapability::Options(
            lsp::TextDocumentSyncOptions {
                open_close: Some(true),
                change: Some(lsp::TextDocumentSyncKind::INCREMENTAL),
                ..Default::default()
            },
        )),
        hover_provider: Some(lsp::HoverProviderCapability::Simple(true)),
        definition_provider: Some(lsp::OneOf::Left(true)),
        references_provider: Some(lsp::OneOf::Left(true)),
        completion_provider: Some(lsp::CompletionOptions {
            trigger_characters: Some(vec![".".into(), "(".into(), ",".into()]),
            ..Default::default()
        }),
        document_symbol_provider: Some(lsp::OneOf::Left(true)),
        document_formatting_provider: Some(lsp::OneOf::Left(true)),
        rename_provider: Some(lsp::OneOf::Right(lsp::RenameOptions {
            prepare_provider: Some(true),
            work_done_progress_options: Default::default(),
        })),
        inlay_hint_provider: Some(lsp::OneOf::Left(true)),
        code_action_provider: Some(lsp::CodeActionProviderCapability::Options(
            lsp::CodeActionOptions {
                code_action_kinds: Some(vec![lsp::CodeActionKind::QUICKFIX]),
                ..Default::default()
            },
        )),
        semantic_tokens_provider: Some(
            lsp::SemanticTokensServerCapabilities::SemanticTokensOptions(
                lsp::SemanticTokensOptions {
                    legend: lsp::SemanticTokensLegend {
                        token_types: features::TOKEN_TYPES.to_vec(),
                        token_modifiers: features::TOKEN_MODIFIERS.to_vec(),
                    },
                    full: Some(lsp::SemanticTokensFullOptions::Bool(true)),
                    range: None,
                    ..Default::default()
                },
            ),
        ),
        ..Default::default()
    }
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// How a session ended. The protocol asks for exit code 0 after `shutdown` then `exit`, and 1
/// for an `exit` that no `shutdown` came before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// `exit` after `shutdown`, or the client went away (end of input).
    Cleanly,
    /// `exit` without `shutdown` first.
    ExitWithoutShutdown,
}

/// Runs the server on a connection until `exit` (or until the client goes away). After
/// `shutdown` every request is answered with an error (InvalidRequest), as the protocol asks,
/// until `exit`.
pub fn serve(conn: Connection) -> Result<Ended, Error> {
    let (id, _params) = conn.initialize_start()?;
    let result = serde_json::json!({
        "capabilities": capabilities(),
        "serverInfo": { "name": "mgn-lsp", "version": env!("CARGO_PKG_VERSION") },
    });
    conn.initialize_finish(id, result)?;

    let paths = Arc::new(Paths::new());
    let state: Shared = Arc::new(Mutex::new(State::default()));
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
    let worker = {
        let (state, paths, sender) = (state.clone(), paths.clone(), conn.sender.clone());
        std::thread::Builder::new()
            .name("mgn-lsp-diagnostics".into())
            .spawn(move || worker(jobs_rx, state, paths, sender))?
    };
    let mut server = Server { state, paths, jobs: jobs_tx, sender: conn.sender.clone() };
    let mut shut_down = false;
    let mut ended = Ended::Cleanly;
    for msg in &conn.receiver {
        match msg {
            Message::Request(req) if shut_down => {
                let code = ErrorCode::InvalidRequest as i32;
                let why = format!("`{}` after `shutdown`: the server only exits now", req.method);
                conn.sender.send(Response::new_err(req.id, code, why).into())?;
            }
            Message::Request(req) if req.method == "shutdown" => {
                shut_down = true;
                conn.sender.send(Response::new_ok(req.id, ()).into())?;
            }
            Message::Request(req) => {
                let resp = server.request(req);
                conn.sender.send(resp.into())?;
            }
            Message::Notification(n) if n.method == lsp::notification::Exit::METHOD => {
                if !shut_down {
                    ended = Ended::ExitWithoutShutdown;
                }
                break;
            }
            Message::Notification(n) if shut_down => drop(n),
            Message::Notification(n) => server.notification(n),
            Message::Response(_) => {}
        }
    }
    drop(server);
    let _ = worker.join();
    Ok(ended)
}

struct Server {
    state: Shared,
    paths: Arc<Paths>,
    jobs: Sender<Job>,
    #[allow(dead_code)]
    sender: Sender<Message>,
}

fn params<P: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<P, String> {
    serde_json::from_value(v).map_err(|e| format!("invalid parameters: {e}"))
}

impl Server {
    fn schedule(&self, uri: Uri) {
        let _ = self.jobs.send(Job::Check(uri));
    }

    fn notification(&mut self, n: Notification) {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| self.notification_inner(n)));
        if r.is_err() {
            eprintln!("mgn-lsp: a notification handler panicked; the server goes on");
        }
    }

    fn notification_inner(&mut self, n: Notification) {
        match n.method.as_str() {
            lsp::notification::DidOpenTextDocument::METHOD => {
                let Ok(p) = params::<lsp::DidOpenTextDocumentParams>(n.params) else { return };
                let origin = self.paths.origin(&p.text_document.uri);
                let uri = p.text_document.uri;
                let deps = {
                    let mut st = lock(&self.state);
                    st.docs.insert(
                        uri.clone(),
                        Doc {
                            text: p.text_document.text,
                            version: p.text_document.version,
                            origin: origin.clone(),
                        },
                    );
                    st.dependents(&origin)
                };
                self.schedule(uri.clone());
                deps.into_iter().filter(|d| *d != uri).for_each(|d| self.schedule(d));
            }
            lsp::notification::DidChangeTextDocument::METHOD => {
                let Ok(p) = params::<lsp::DidChangeTextDocumentParams>(n.params) else { return };
                let uri = p.text_document.uri;
                let deps = {
                    let mut st = lock(&self.state);
                    let Some(doc) = st.docs.get_mut(&uri) else { return };
                    for c in &p.content_changes {
                        apply_change(&mut doc.text, c);
                    }
                    doc.version = p.text_document.version;
                    let origin = doc.origin.clone();
                    st.dependents(&origin)
                };
                self.schedule(uri.clone());
                deps.into_iter().filter(|d| *d != uri).for_each(|d| self.schedule(d));
            }
            lsp::notification::DidCloseTextDocument::METHOD => {
                let Ok(p) = params::<lsp::DidCloseTextDocumentParams>(n.params) else { return };
                let uri = p.text_document.uri;
                let deps = {
                    let mut st = lock(&self.state);
                    let Some(doc) = st.docs.remove(&uri) else { return };
                    st.analyses.remove(&uri);
                    st.last_items.remove(&uri);
                    st.dependents(&doc.origin)
                };
                let _ = self.jobs.send(Job::Closed(uri));
                deps.into_iter().for_each(|d| self.schedule(d));
            }
            _ => {}
        }
    }

    /// An analysis of the current buffers with `uri` as the root, and every other current one.
    /// Also returns every other cached analysis, current or not (for facts).
    fn analyses(&self, uri: &Uri) -> Result<AnalysisSet, String> {
        let (cached, snap) = {
            let st = lock(&self.state);
            let cached = st.analyses.get(uri).filter(|a| a.is_fresh(&st.docs)).cloned();
            let snap = if cached.is_none() { Snapshot::new(&st.docs, uri) } else { None };
            (cached, snap)
        };
        let this = match (cached, snap) {
            (Some(a), _) => a,
            (None, Some(snap)) => {
                let a = Arc::new(Analysis::run(snap));
                let mut st = lock(&self.state);
                if a.is_fresh(&st.docs) {
                    st.store(a.clone());
                }
                a
            }
            (None, None) => return Err(format!("`{}` is not open", uri.as_str())),
        };
        let st = lock(&self.state);
        let others = st
            .analyses
            .values()
            .filter(|a| a.uri != this.uri && a.is_fresh(&st.docs))
            .cloned()
            .collect();
        let stale = st
            .analyses
            .values()
            .filter(|a| a.uri != this.uri && !a.is_fresh(&st.docs))
            .cloned()
            .collect();
        Ok((this, others, stale))
    }

    fn offset(&self, uri: &Uri, pos: lsp::Position) -> Result<(usize, String), String> {
        let st = lock(&self.state);
        let doc = st.docs.get(uri).ok_or_else(|| format!("`{}` is not open", uri.as_str()))?;
        Ok((LineMap::new(&doc.text).offset(pos), doc.text.clone()))
    }

    /// Answers a request about a position from the analyses of the current buffers.
    fn at<R>(
        &self,
        p: lsp::TextDocumentPositionParams,
        answer: impl FnOnce(&Ctx, usize) -> R,
    ) -> Result<R, String> {
        let uri = p.text_document.uri;
        let (offset, _) = self.offset(&uri, p.position)?;
        let (this, all, stale) = self.analyses(&uri)?;
        let ctx = Ctx { paths: &self.paths, this: &this, all: &all, facts_from: &stale };
        Ok(answer(&ctx, offset))
    }

    /// Quick fixes are the only kind of action: none when the client asks for other kinds.
    fn code_actions(
        &self,
        p: lsp::CodeActionParams,
    ) -> Result<Vec<lsp::CodeActionOrCommand>, String> {
        let quickfix = lsp::CodeActionKind::QUICKFIX;
        let wanted = (p.context.only.as_ref())
            .is_none_or(|k| k.iter().any(|k| quickfix.as_str().starts_with(k.as_str())));
        if !wanted {
            return Ok(Vec::new());
        }
        let uri = p.text_document.uri;
        let (this, all, stale) = self.analyses(&uri)?;
        let ctx = Ctx { paths: &self.paths, this: &this, all: &all, facts_from: &stale };
        Ok(features::code_actions(&ctx, &uri, p.range, &p.context.diagnostics))
    }

    fn request(&mut self, req: Request) -> Response {
        let id = req.id.clone();
        let method = req.method.clone();
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.dispatch(req))) {
            Ok(Ok(v)) => Response::new_ok(id, v),
            Ok(Err((code, msg))) => Response::new_err(id, code as i32, msg),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Response::new_err(
                    id,
                    ErrorCode::InternalError as i32,
                    format!("mgn-lsp: `{method}` failed: {what}"),
                )
            }
        }
    }

    fn dispatch(&mut self, req: Request) -> Result<serde_json::Value, (ErrorCode, String)> {
        use lsp::request::*;
        let bad = |e: String| (ErrorCode::InvalidParams, e);
        let failed = |e: String| (ErrorCode::RequestFailed, e);
        let json = |v: serde_json::Result<serde_json::Value>| {
            v.map_err(|e| (ErrorCode::InternalError, e.to_string()))
        };
        match req.method.as_str() {
            HoverRequest::METHOD => {
                let p: lsp::HoverParams = params(req.params).map_err(bad)?;
                let h = self.at(p.text_document_position_params, features::hover);
                json(serde_json::to_value(h.map_err(failed)?))
            }
            GotoDefinition::METHOD => {
                let p: lsp::GotoDefinitionParams = params(req.params).map_err(bad)?;
                let d = self.at(p.text_document_position_params, features::definition);
                json(serde_json::to_value(
                    d.map_err(failed)?.map(lsp::GotoDefinitionResponse::Scalar),
                ))
            }
            References::METHOD => {
                let p: lsp::ReferenceParams = params(req.params).map_err(bad)?;
                let decl = p.context.include_declaration;
                let r = self.at(p.text_document_position, |c, o| features::references(c, o, decl));
                json(serde_json::to_value(r.map_err(failed)?))
            }
            PrepareRenameRequest::METHOD => {
                let p: lsp::TextDocumentPositionParams = params(req.params).map_err(bad)?;
                let r = self.at(p, features::prepare_rename).map_err(failed)?;
                json(serde_json::to_value(r.map_err(failed)?))
            }
            Rename::METHOD => {
                let p: lsp::RenameParams = params(req.params).map_err(bad)?;
                let new = p.new_name;
                let r = self.at(p.text_document_position, |c, o| features::rename(c, o, &new));
                json(serde_json::to_value(r.map_err(failed)?.map_err(failed)?))
            }
            Completion::METHOD => {
                let p: lsp::CompletionParams = params(req.params).map_err(bad)?;
                let uri = p.text_document_position.text_document.uri;
                let (offset, text) =
                    self.offset(&uri, p.text_document_position.position).map_err(failed)?;
                let (this, ..) = self.analyses(&uri).map_err(failed)?;
                let (last, snap) = {
                    let st = lock(&self.state);
                    (
                        st.last_items.get(&uri).cloned().unwrap_or_default(),
                        Snapshot::new(&st.docs, &uri),
                    )
                };
                let names_of =
                    |text: String| snap.and_then(|s| Analysis::names_only(Snapshot { text, ..s }));
                let items = features::complete(&this, &last, names_of, &text, offset);
                json(serde_json::to_value(lsp::CompletionResponse::Array(items)))
            }
            DocumentSymbolRequest::METHOD => {
                let p: lsp::DocumentSymbolParams = params(req.params).map_err(bad)?;
                let (this, ..) = self.analyses(&p.text_document.uri).map_err(failed)?;
                json(serde_json::to_value(lsp::DocumentSymbolResponse::Nested(
                    features::document_symbols(&this),
                )))
            }
            SemanticTokensFullRequest::METHOD => {
                let p: lsp::SemanticTokensParams = params(req.params).map_err(bad)?;
                let (this, ..) = self.analyses(&p.text_document.uri).map_err(failed)?;
                json(serde_json::to_value(lsp::SemanticTokens {
                    result_id: None,
                    data: features::semantic_tokens(&this),
                }))
            }
            InlayHintRequest::METHOD => {
                let p: lsp::InlayHintParams = params(req.params).map_err(bad)?;
                let (this, all, stale) = self.analyses(&p.text_document.uri).map_err(failed)?;
                let ctx = Ctx { paths: &self.paths, this: &this, all: &all, facts_from: &stale };
                json(serde_json::to_value(features::inlay_hints(&ctx, p.range)))
            }
            CodeActionRequest::METHOD => {
                let p: lsp::CodeActionParams = params(req.params).map_err(bad)?;
                json(serde_json::to_value(self.code_actions(p).map_err(failed)?))
            }
            Formatting::METHOD => {
                let p: lsp::DocumentFormattingParams = params(req.params).map_err(bad)?;
                let text = {
                    let st = lock(&self.state);
                    st.docs
                        .get(&p.text_document.uri)
                        .map(|d| d.text.clone())
                        .ok_or_else(|| failed("not open".into()))?
                };
                let edit = features::formatting(&text).map_err(failed)?;
                json(serde_json::to_value(edit.map(|e| vec![e]).unwrap_or_default()))
            }
            _ => Err((ErrorCode::MethodNotFound, format!("unknown request `{}`", req.method))),
        }
    }
}

fn worker(jobs: Receiver<Job>, state: Shared, paths: Arc<Paths>, sender: Sender<Message>) {
    let mut contributions = Contributions::new();
    // For each root: the files it contributed to.
    let mut touched: HashMap<Uri, Vec<Uri>> = HashMap::new();
    let publish = |contributions: &Contributions, file: &Uri, version: Option<i32>| {
        publish_diagnostics(&state, &sender, contributions, file, version)
    };
    loop {
        let Some(pending) = next_batch(&jobs) else { return };
        let mut order: Vec<Uri> = Vec::new();
        for j in pending {
            match j {
                Job::Check(u) => {
                    if !order.contains(&u) {
                        order.push(u);
                    }
                }
                Job::Closed(u) => {
                    order.retain(|x| *x != u);
                    for f in touched.remove(&u).unwrap_or_default() {
                        if let Some(m) = contributions.get_mut(&f) {
                            m.remove(&u);
                        }
                        publish(&contributions, &f, None);
                    }
                }
            }
        }
        for uri in order {
            let Some((a, diags)) = check(&state, &paths, &uri) else { continue };
            let old =
                touched.insert(uri.clone(), diags.keys().cloned().collect()).unwrap_or_default();
            for f in &old {
                if !diags.contains_key(f) {
                    if let Some(m) = contributions.get_mut(f) {
                        m.remove(&uri);
                    }
                    publish(&contributions, f, None);
                }
            }
            for (f, ds) in diags {
                let read = if f == uri {
                    Some(a.version)
                } else {
                    a.loaded
                        .iter()
                        .find(|(o, _)| paths.uri(o).as_ref() == Some(&f))
                        .and_then(|(_, v)| *v)
                };
                contributions.entry(f.clone()).or_default().insert(uri.clone(), (read, ds));
                let version = (f == uri).then_some(a.version);
                publish(&contributions, &f, version);
            }
        }
    }
}

/// The next job and every one that follows it within `DEBOUNCE`; `None` once the server
/// has stopped.
fn next_batch(jobs: &Receiver<Job>) -> Option<Vec<Job>> {
    let first = jobs.recv().ok()?;
    let mut pending = vec![first];
    loop {
        match jobs.recv_timeout(DEBOUNCE) {
            Ok(j) => pending.push(j),
            Err(RecvTimeoutError::Timeout) => return Some(pending),
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Diagnostics by the URI of the file they are in.
type ByFile = HashMap<Uri, Vec<lsp::Diagnostic>>;

/// The current analysis of a document (run now unless a request ran it at these versions)
/// and its diagnostics by file; `None` when the document is gone, the analysis panicked, or
/// a newer version is on its way (its own check will publish).
fn check(state: &Shared, paths: &Paths, uri: &Uri) -> Option<(Arc<Analysis>, ByFile)> {
    let snap = {
        let st = lock(state);
        match st.analyses.get(uri) {
            // Already analysed (by a request) at these versions: publish that.
            Some(a) if a.is_fresh(&st.docs) => Err(a.clone()),
            _ => Ok(Snapshot::new(&st.docs, uri)),
        }
    };
    let a = match snap {
        Err(a) => a,
        Ok(snap) => {
            let snap = snap?;
            Arc::new(std::panic::catch_unwind(AssertUnwindSafe(|| Analysis::run(snap))).ok()?)
        }
    };
    let diags =
        std::panic::catch_unwind(AssertUnwindSafe(|| features::diagnostics(paths, &a))).ok()?;
    let mut st = lock(state);
    if !a.is_fresh(&st.docs) {
        return None;
    }
    st.store(a.clone());
    Some((a, diags))
}

/// Publishes what every root said about the file's current text: an importer that read an
/// older buffer will be checked again (it is scheduled with every change) and say it anew.
fn publish_diagnostics(
    state: &Shared,
    sender: &Sender<Message>,
    contributions: &Contributions,
    file: &Uri,
    version: Option<i32>,
) {
    let now = lock(state).docs.get(file).map(|d| d.version);
    let mut all: Vec<lsp::Diagnostic> = Vec::new();
    if let Some(by_root) = contributions.get(file) {
        let mut roots: Vec<&Uri> = by_root.keys().collect();
        roots.sort();
        for r in roots {
            let (read, ds) = &by_root[r];
            if now.is_some() && *read != now {
                continue;
            }
            for d in ds {
                if !all.contains(d) {
                    all.push(d.clone());
                }
            }
        }
    }
    let params = lsp::PublishDiagnosticsParams { uri: file.clone(), diagnostics: all, version };
    let _ = sender.send(
        Notification::new(lsp::notification::PublishDiagnostics::METHOD.into(), params).into(),
    );
}
