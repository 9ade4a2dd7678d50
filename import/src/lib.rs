//! Importers: a model file written by another tool (ONNX, GGUF) becomes `.mgn` source a person
//! reads and edits, plus the tensors its parameters hold, under the names the source declares.
//!
//! Each format is one front end (`onnx`, `gguf`) with the same contract: it either returns an
//! [`Imported`] model, complete, or every reason it cannot (an unsupported op, attribute or
//! type, listed all at once) — never an approximation. Formatting, checking and writing the
//! result are the caller's (`mgnc import`), so the front ends stay pure functions of the input.

pub mod gguf;
pub mod onnx;

use mgn_ir::tensor::Tensor;
use std::fmt;
use std::path::{Path, PathBuf};

/// What the caller may choose about the result.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The name of the generated model (default: from the file).
    pub name: Option<String>,
    /// Decode a GGUF file's block-quantized tensors to f32 instead of keeping them packed (the
    /// generated model then declares f32 weights).
    pub dequantize: bool,
}

/// A model imported from another format.
#[derive(Debug)]
pub struct Imported {
    /// The model's `.mgn` source (the caller formats and checks it).
    pub source: String,
    /// The tensors for the checkpoint, under the names the source declares.
    pub weights: Vec<(String, Tensor)>,
    /// Files that go beside the model, as (suffix, bytes): `tokenizer.json` is written as
    /// `<stem>.tokenizer.json`.
    pub extras: Vec<(String, Vec<u8>)>,
    /// What the import found, one line each (ops used, layers recovered, dims), for the user.
    pub summary: Vec<String>,
}

/// Why a file cannot be imported: every problem found, each naming what it is about.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportError {
    pub path: PathBuf,
    pub problems: Vec<String>,
}

impl ImportError {
    pub fn new(path: &Path, problem: impl Into<String>) -> ImportError {
        ImportError { path: path.to_path_buf(), problems: vec![problem.into()] }
    }
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problems.as_slice() {
            [one] => write!(f, "{}: {one}", self.path.display()),
            many => {
                write!(f, "{}: {} problems", self.path.display(), many.len())?;
                for p in many {
                    write!(f, "\n  - {p}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ImportError {}

/// The formats there are importers for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Onnx,
    Gguf,
}

impl Format {
    /// The format of `bytes` read from `path`: GGUF by its magic, ONNX by its extension (a
    /// protobuf message has no magic).
    pub fn detect(path: &Path, bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(b"GGUF") {
            return Some(Format::Gguf);
        }
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("onnx") => Some(Format::Onnx),
            Some("gguf") => Some(Format::Gguf),
            _ => None,
        }
    }
}

/// Imports the model in `path`, whichever format it is.
pub fn import_file(path: &Path, options: &Options) -> Result<Imported, ImportError> {
    let bytes = mgn_ir::io::read_regular(path, u64::MAX)
        .map_err(|e| ImportError::new(path, format!("cannot read the file: {e}")))?;
    match Format::detect(path, &bytes) {
        Some(Format::Onnx) => onnx::import(path, &bytes, options),
        Some(Format::Gguf) => gguf::import(path, &bytes, options),
        None => Err(ImportError::new(
            path,
            "not a model file mgnc can import: ONNX files end in `.onnx`, GGUF files start with \
             the bytes `GGUF`",
        )),
    }
}
