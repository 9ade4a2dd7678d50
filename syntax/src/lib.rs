//! The front of the mgn pipeline: source text to a span-carrying AST.
//!
//! `parse` never panics on any input: a malformed file produces diagnostics (see `diag`), and
//! inputs that would exhaust the stack or run away (deep nesting, huge files) are refused by
//! `limits` before the PEG parser sees them. `visit` walks the AST for every later pass that
//! looks at all of it (name resolution, the names check, the formatter's comparison), and
//! `format` prints it back in the canonical layout.

pub mod ast;
pub mod diag;
pub mod format;
pub mod limits;
pub mod parser;
pub mod span;
pub mod visit;

pub use diag::{Diagnostic, Edit, Fix, Label, Severity, Step, StepKind};
pub use parser::parse;
pub use span::{FileId, LineIndex, Span};
