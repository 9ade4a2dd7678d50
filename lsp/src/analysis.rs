//! One run of the compiler with an open document as the root, and what the features need from
//! it: the program (ASTs, scopes, resolved names, source map), diagnostics and facts.

use crate::paths::Paths;
use lsp_types::Uri;
use mgn_compiler::front::load::{load_with_overrides, Overrides};
use mgn_compiler::front::{Program, Resolution};
use mgn_compiler::source::Origin;
use mgn_compiler::{check_text_with_overrides, Models, Outcome};
use mgn_syntax::FileId;
use std::collections::HashMap;

/// An open document.
pub struct Doc {
    pub text: String,
    pub version: i32,
    pub origin: Origin,
}

/// What one analysis needs to run: the root document and every other open buffer.
pub struct Snapshot {
    pub uri: Uri,
    pub version: i32,
    pub origin: Origin,
    pub text: String,
    pub open: HashMap<Origin, i32>,
    pub overrides: Overrides,
}

impl Snapshot {
    pub fn new(docs: &HashMap<Uri, Doc>, uri: &Uri) -> Option<Snapshot> {
        let doc = docs.get(uri)?;
        let mut overrides = Overrides::new();
        let mut open = HashMap::new();
        for d in docs.values() {
            open.insert(d.origin.clone(), d.version);
            if let Origin::Path(p) = &d.origin {
                overrides.insert(p.clone(), d.text.clone());
            }
        }
        Some(Snapshot {
            uri: uri.clone(),
            version: doc.version,
            origin: doc.origin.clone(),
            text: doc.text.clone(),
            open,
            overrides,
        })
    }
}

pub struct Analysis {
    pub uri: Uri,
    pub version: i32,
    pub outcome: Outcome,
    /// Every file loaded, with the version of the open buffer it was read from (`None`: from
    /// disk, or the embedded stdlib).
    pub loaded: Vec<(Origin, Option<i32>)>,
}

/// The name diagnostics give a document's file.
fn display_name(origin: &Origin) -> String {
    match origin {
        Origin::Path(p) => p.display().to_string(),
        Origin::Std(m) => format!("std.{m}"),
        Origin::Memory(s) => s.clone(),
    }
}

/// The parser and the resolver recurse as deep as the language limits allow.
const NAMES_STACK_BYTES: usize = 64 << 20;

impl Analysis {
    /// Loads and resolves a snapshot's text, without checking or elaborating it: the names
    /// completion needs from a text that is not the buffer's (the line being typed left out).
    /// `None` if that failed.
    pub fn names_only(snap: Snapshot) -> Option<Analysis> {
        let (uri, version) = (snap.uri.clone(), snap.version);
        let run = move || {
            let name = display_name(&snap.origin);
            let (program, diagnostics) =
                load_with_overrides(name, snap.origin, snap.text, snap.overrides);
            Outcome { program, diagnostics, graphs: Vec::new(), facts: Vec::new() }
        };
        let thread = std::thread::Builder::new().stack_size(NAMES_STACK_BYTES).spawn(run);
        let outcome = thread.ok()?.join().ok()?;
        Some(Analysis { uri, version, outcome, loaded: Vec::new() })
    }

    pub fn run(snap: Snapshot) -> Analysis {
        let name = display_name(&snap.origin);
        let outcome = check_text_with_overrides(
            name,
            snap.origin.clone(),
            snap.text,
            Models::All,
            snap.overrides,
        );
        let loaded = outcome
            .program
            .sources
            .files()
            .map(|(_, f)| {
                let v = if f.origin == snap.origin {
                    Some(snap.version)
                } else if matches!(f.origin, Origin::Path(_)) {
                    snap.open.get(&f.origin).copied()
                } else {
                    None
                };
                (f.origin.clone(), v)
            })
            .collect();
        Analysis { uri: snap.uri, version: snap.version, outcome, loaded }
    }

    pub fn program(&self) -> &Program {
        &self.outcome.program
    }

    /// What every name of the program refers to, as the compiler resolved it.
    pub fn names(&self) -> &Resolution {
        &self.program().resolution
    }

    /// The root file (the document this analysis is for).
    pub fn root_file(&self) -> FileId {
        self.program().module(self.program().root).file
    }

    pub fn file_of(&self, origin: &Origin) -> Option<FileId> {
        self.program().sources.find(origin)
    }

    pub fn uri_of(&self, paths: &Paths, file: FileId) -> Option<Uri> {
        if file == self.root_file() {
            return Some(self.uri.clone());
        }
        paths.uri(&self.program().sources.get(file).origin)
    }

    /// Still describes the current buffers: the root's version and every open buffer it read.
    pub fn is_fresh(&self, docs: &HashMap<Uri, Doc>) -> bool {
        if docs.get(&self.uri).map(|d| d.version) != Some(self.version) {
            return false;
        }
        self.loaded.iter().all(|(origin, v)| {
            if !matches!(origin, Origin::Path(_)) {
                return true;
            }
            let now = docs.values().find(|d| &d.origin == origin).map(|d| d.version);
            if docs.get(&self.uri).is_some_and(|d| &d.origin == origin) {
                return true;
            }
            now == *v
        })
    }

    /// Whether this analysis read the file `origin`.
    pub fn reads(&self, origin: &Origin) -> bool {
        self.loaded.iter().any(|(o, _)| o == origin)
    }
}
