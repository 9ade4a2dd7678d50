//! The source map: every file the compiler has read, by `FileId`, including the embedded stdlib.

use mgn_syntax::{FileId, LineIndex, Span};
use std::path::{Path, PathBuf};

/// The standard library, compiled into the binary so `mgnc` needs no install step.
pub const STDLIB: &[(&str, &str)] = &[
    ("nn", include_str!("../../stdlib/nn.mgn")),
    ("attention", include_str!("../../stdlib/attention.mgn")),
    ("loss", include_str!("../../stdlib/loss.mgn")),
    ("init", include_str!("../../stdlib/init.mgn")),
];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A user file, by the path used to reach it.
    Path(PathBuf),
    /// A stdlib module such as `nn`.
    Std(&'static str),
    /// Text handed over directly (editor buffers, tests).
    Memory(String),
}

pub struct SourceFile {
    pub name: String,
    pub origin: Origin,
    pub text: String,
    pub lines: LineIndex,
}

#[derive(Default)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> SourceMap {
        SourceMap::default()
    }

    pub fn add(&mut self, name: String, origin: Origin, text: String) -> FileId {
        let lines = LineIndex::new(&text);
        self.files.push(SourceFile { name, origin, text, lines });
        FileId(self.files.len() as u32 - 1)
    }

    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn find(&self, origin: &Origin) -> Option<FileId> {
        self.files.iter().position(|f| &f.origin == origin).map(|i| FileId(i as u32))
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files.iter().enumerate().map(|(i, f)| (FileId(i as u32), f))
    }

    /// `name:line:col` of a span's start, as printed in IR dumps and JSON.
    pub fn location(&self, span: Span) -> (String, usize, usize) {
        let f = self.get(span.file);
        let (l, c) = f.lines.line_col(span.start as usize);
        (f.name.clone(), l, c)
    }

    pub fn snippet(&self, span: Span) -> &str {
        let f = self.get(span.file);
        f.text.get(span.start as usize..span.end as usize).unwrap_or("")
    }
}

pub fn std_source(module: &str) -> Option<(&'static str, &'static str)> {
    STDLIB.iter().find(|(n, _)| *n == module).copied()
}

/// A display name for a path: as given, with `./` and `a/../` folded away.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}
