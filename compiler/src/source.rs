//! The source map: every file the compiler has read, by `FileId`, including the embedded stdlib.

use mgn_syntax::limits::MAX_SOURCE_BYTES;
use mgn_syntax::{FileId, LineIndex, Span};
use std::io::Read;
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

    /// The file `id`, if the map has it.
    pub fn try_get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
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

/// Reads a source file (a root file or an import) by the rule for every file mgn reads
/// (`mgn_ir::io::read_regular`: a regular file only, never blocking, its size checked — here
/// against `MAX_SOURCE_BYTES` — before reading); and it must be UTF-8. The error is a reason,
/// to follow "cannot read `…`: " or "cannot import `…`: ".
pub fn read_source(path: &Path) -> Result<String, String> {
    decode(mgn_ir::io::read_regular(path, MAX_SOURCE_BYTES as u64)?)
}

/// Reads a source from a stream (stdin) with the same size limit as files.
pub fn read_source_from(stream: impl Read) -> Result<String, String> {
    let mut bytes = Vec::new();
    stream.take(MAX_SOURCE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| io_reason(&e))?;
    if bytes.len() > MAX_SOURCE_BYTES {
        return Err(mgn_ir::io::too_large(None, MAX_SOURCE_BYTES as u64));
    }
    decode(bytes)
}

/// The text of a source's bytes; if they are not UTF-8, where the first bad byte is: its
/// offset, and its 1-based line and column (in bytes, as every column of the compiler).
pub fn decode(bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        let byte = e.as_bytes()[at];
        format!(
            "the file is not valid UTF-8: byte 0x{byte:02X} at offset {at} (line {line}, column \
             {column})"
        )
    })
}

/// A short reason for an I/O error, to follow "cannot read `…`: ".
pub fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::InvalidData => "the file is not valid UTF-8".to_string(),
        _ => mgn_ir::io::reason(e),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mgn-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        path
    }

    #[test]
    fn a_bad_byte_is_located() {
        let e = decode(b"fn f() {\n  1\n    \xff\n}".to_vec()).unwrap_err();
        assert_eq!(
            e, "the file is not valid UTF-8: byte 0xFF at offset 17 (line 3, column 5)",
            "{e}"
        );
        let e = decode("é\n".bytes().take(1).collect()).unwrap_err();
        assert!(e.contains("byte 0xC3 at offset 0 (line 1, column 1)"), "{e}");
        let path = temp("bad.mgn");
        std::fs::write(&path, b"\xfe").unwrap();
        assert!(read_source(&path).unwrap_err().contains("offset 0 (line 1, column 1)"));
    }

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = temp("dir");
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_source(&dir).unwrap_err(), "it is a directory, not a file");
        let big = temp("big.mgn");
        std::fs::File::create(&big).unwrap().set_len(MAX_SOURCE_BYTES as u64 + 1).unwrap();
        let e = read_source(&big).unwrap_err();
        assert_eq!(e, "the file is too large (8388609 bytes; the limit is 8388608 bytes)");
        let e = read_source_from(std::io::repeat(b' ')).unwrap_err();
        assert!(e.starts_with("the file is too large (over 8388608 bytes"), "{e}");
        let ok = temp("ok.mgn");
        std::fs::write(&ok, "fn f() { 1 }\n").unwrap();
        assert_eq!(read_source(&ok).unwrap(), "fn f() { 1 }\n");
    }

    /// A FIFO would block the reader until a writer comes; a device would never end.
    #[cfg(unix)]
    #[test]
    fn fifos_and_devices_are_refused_without_being_opened() {
        let fifo = temp("fifo.mgn");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(read_source(&path)));
        let r = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("no answer: blocked");
        assert_eq!(r.unwrap_err(), "it is a named pipe (FIFO), not a regular file");
        let e = read_source(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e, "it is a character device, not a regular file");
    }
}
