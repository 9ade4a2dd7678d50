//! Hard limits that keep the parser and every later pass within a bounded stack and time.
//!
//! The PEG parser and the tree walkers recurse once per nesting level, so nesting is checked by
//! a cheap lexical scan before parsing. Expression trees that grow deep without brackets (long
//! postfix chains) are caught while the AST is built (`MAX_EXPR_DEPTH`).

use crate::diag::Diagnostic;
use crate::span::{FileId, Span};

/// Largest source file accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 8 << 20;
/// Deepest nesting of `(`, `[` and `{`.
pub const MAX_NESTING: usize = 128;
/// Longest run of prefix operators (`- - - x`).
pub const MAX_PREFIX_RUN: usize = 32;
/// Deepest expression tree (counts every operator and call level).
pub const MAX_EXPR_DEPTH: usize = 256;

/// Scans `text` for inputs that would overflow the parser's stack; returns the first problem.
pub fn check_source(file: FileId, text: &str) -> Option<Diagnostic> {
    if text.len() > MAX_SOURCE_BYTES {
        return Some(
            Diagnostic::error(
                "E0002",
                format!(
                    "source file is too large ({} bytes; the limit is {} bytes)",
                    text.len(),
                    MAX_SOURCE_BYTES
                ),
                Span::new(file, 0, 0),
                "file starts here",
            )
            .with_help(
                "split the model into several files joined with `use \"./other.mgn\".{...}`",
            ),
        );
    }
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut prefix_run = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 2;
                continue;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += 1;
                }
                prefix_run = 0;
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(
                        Diagnostic::error(
                            "E0003",
                            format!("brackets are nested more than {MAX_NESTING} levels deep"),
                            Span::new(file, i, i + 1),
                            "this bracket is too deep",
                        )
                        .with_help("bind inner expressions to names with `let`"),
                    );
                }
                prefix_run = 0;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                prefix_run = 0;
            }
            b'-' | b'!' => {
                prefix_run += 1;
                if prefix_run > MAX_PREFIX_RUN {
                    return Some(Diagnostic::error(
                        "E0003",
                        format!("more than {MAX_PREFIX_RUN} operators in a row"),
                        Span::new(file, i, i + 1),
                        "too many operators",
                    ));
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => prefix_run = 0,
        }
        i += 1;
    }
    None
}
