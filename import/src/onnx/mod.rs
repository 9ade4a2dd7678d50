//! The ONNX front end.

use crate::{ImportError, Imported, Options};
use std::path::Path;

pub fn import(path: &Path, _bytes: &[u8], _options: &Options) -> Result<Imported, ImportError> {
    Err(ImportError::new(path, "ONNX import is not written yet"))
}
