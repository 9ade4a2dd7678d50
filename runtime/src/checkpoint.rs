//! Checkpoints: safetensors files of named host tensors plus string metadata.
//!
//! Tensors are written with their declared dtype (`f32`, `f16`, `bf16`, `i32`, `i64`, `u32`,
//! `bool`), converting from the wider host storage (`f16`/`bf16` held as `F32`, integers as
//! `I32`); reading converts back. The file is written atomically, so a crash or a failed write
//! leaves the previous checkpoint intact. Metadata records `mgn.format = "1"` and, by convention,
//! the model name (`mgn.model`) and the training step (`mgn.step`).
//!
//! Loading never trusts the file: every size and offset in the header is checked against the
//! file's length before anything is allocated, and every problem (truncation, corruption, an
//! unsupported dtype, an `i64` that does not fit the host's `i32`) is an error naming the file.
//!
//! Optimizer state is stored beside the parameters under [`OPTIM_PREFIX`]
//! (`optim.<param name>.m`, `optim.<param name>.v`, `optim.step`); [`match_params`] does not
//! count those names as unexpected.

use mgn_ir::plan::ParamSpec;
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;
use safetensors::tensor::{Dtype as StDtype, SafeTensorError};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// Metadata key holding the checkpoint format version.
pub const FORMAT_KEY: &str = "mgn.format";
/// The format version this runtime writes and reads.
pub const FORMAT_VERSION: &str = "1";
/// Metadata key holding the model's name.
pub const MODEL_KEY: &str = "mgn.model";
/// Metadata key holding the number of training steps taken.
pub const STEP_KEY: &str = "mgn.step";
/// Prefix of the optimizer-state tensors.
pub const OPTIM_PREFIX: &str = "optim.";

/// A checkpoint problem, naming the file.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointError {
    pub path: PathBuf,
    pub message: String,
}

impl CheckpointError {
    fn new(path: &Path, message: impl Into<String>) -> CheckpointError {
        CheckpointError { path: path.to_path_buf(), message: message.into() }
    }
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for CheckpointError {}

/// A loaded checkpoint: every tensor (sorted by name) in host storage, and the metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub tensors: Vec<(String, Tensor)>,
    pub metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.tensors[i].1)
    }

    /// The model name recorded at save time, if any.
    pub fn model(&self) -> Option<&str> {
        self.metadata.get(MODEL_KEY).map(String::as_str)
    }

    /// The training step recorded at save time, if any (and if it is a number).
    pub fn step(&self) -> Option<u64> {
        self.metadata.get(STEP_KEY).and_then(|s| s.parse().ok())
    }

    /// The optimizer state stored in this checkpoint for `params` (a fresh state when there is none).
    pub fn optimizer_state(
        &self,
        params: &[ParamSpec],
    ) -> Result<mgn_ir::optim::OptimizerState, CheckpointError> {
        crate::optim::state_from_tensors(&self.tensors, params)
            .map_err(|m| CheckpointError::new(&self.path, m))
    }
}

/// The standard metadata of an mgn checkpoint (the format version is added by [`save`]).
pub fn standard_metadata(model: &str, step: u64) -> Vec<(String, String)> {
    vec![(MODEL_KEY.to_string(), model.to_string()), (STEP_KEY.to_string(), step.to_string())]
}

// ---------------------------------------------------------------------------------------------
// Writing

/// One tensor encoded in its declared dtype, ready for the safetensors writer.
struct Encoded {
    dtype: StDtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::U32 => StDtype::U32,
        DType::Bool => StDtype::BOOL,
    }
}

/// Converts a host tensor to the bytes of its declared dtype.
fn encode(name: &str, t: &Tensor) -> Result<Encoded, String> {
    let numel = t
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("tensor `{name}` has an impossible shape {:?}", t.shape))?;
    if numel != t.data.len() {
        return Err(format!(
            "tensor `{name}` has shape {:?} ({numel} elements) but holds {} values",
            t.shape,
            t.data.len()
        ));
    }
    let n = numel * t.dtype.size_bytes();
    let mut bytes = Vec::with_capacity(n);
    let float_storage =
        |what: &str| format!("tensor `{name}` is declared {} but holds {what} values", t.dtype);
    match (t.dtype, &t.data) {
        (DType::F32, Data::F32(v)) => {
            v.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()))
        }
        (DType::F32, Data::F64(v)) => {
            v.iter().for_each(|&x| bytes.extend_from_slice(&(x as f32).to_le_bytes()))
        }
        (DType::F16, Data::F32(v)) => {
            v.iter().for_each(|&x| bytes.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()))
        }
        (DType::F16, Data::F64(v)) => {
            v.iter().for_each(|&x| bytes.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()))
        }
        (DType::BF16, Data::F32(v)) => {
            v.iter().for_each(|&x| bytes.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()))
        }
        (DType::BF16, Data::F64(v)) => {
            v.iter().for_each(|&x| bytes.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()))
        }
        (DType::F32 | DType::F16 | DType::BF16, Data::I32(_)) => {
            return Err(float_storage("integer"))
        }
        (DType::I32, Data::I32(v)) => {
            v.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()))
        }
        (DType::I64, Data::I32(v)) => {
            v.iter().for_each(|&x| bytes.extend_from_slice(&(x as i64).to_le_bytes()))
        }
        (DType::U32, Data::I32(v)) => {
            if let Some(i) = v.iter().position(|&x| x < 0) {
                return Err(format!("tensor `{name}` is declared u32 but element {i} is {}", v[i]));
            }
            v.iter().for_each(|&x| bytes.extend_from_slice(&(x as u32).to_le_bytes()))
        }
        (DType::Bool, Data::I32(v)) => {
            if let Some(i) = v.iter().position(|&x| x != 0 && x != 1) {
                return Err(format!(
                    "tensor `{name}` is declared bool but element {i} is {}",
                    v[i]
                ));
            }
            bytes.extend(v.iter().map(|&x| x as u8))
        }
        (DType::I32 | DType::I64 | DType::U32 | DType::Bool, _) => {
            return Err(float_storage("floating-point"))
        }
    }
    debug_assert_eq!(bytes.len(), n);
    Ok(Encoded { dtype: st_dtype(t.dtype), shape: t.shape.clone(), bytes })
}

/// The bytes of a safetensors file holding `tensors` and `metadata` (plus `mgn.format`).
///
/// The layout is the one the `safetensors` crate writes (tensors ordered by decreasing element
/// size, then name, so each is aligned; the header padded with spaces to a multiple of 8), but
/// the header is written here with its metadata keys sorted, so that saving the same tensors
/// always gives the same bytes (the crate's writer orders metadata by a randomized hash map).
pub fn to_bytes(
    tensors: &[(String, &Tensor)],
    metadata: &[(String, String)],
) -> Result<Vec<u8>, String> {
    let mut seen = HashSet::new();
    let mut encoded = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if name.is_empty() || name == "__metadata__" {
            return Err(format!("`{name}` cannot be a tensor name in a checkpoint"));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("tensor `{name}` is listed twice"));
        }
        encoded.push((name.as_str(), encode(name, t)?));
    }
    let mut meta: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, v) in metadata {
        if k == FORMAT_KEY && v != FORMAT_VERSION {
            return Err(format!("metadata `{FORMAT_KEY}` must be \"{FORMAT_VERSION}\" (it is set by the writer), not \"{v}\""));
        }
        if meta.insert(k, v).is_some() {
            return Err(format!("metadata key `{k}` is listed twice"));
        }
    }
    meta.insert(FORMAT_KEY, FORMAT_VERSION);
    encoded.sort_by(|(ln, l), (rn, r)| r.dtype.bitsize().cmp(&l.dtype.bitsize()).then(ln.cmp(rn)));

    let json = |s: &str| serde_json::to_string(s).expect("strings always serialize");
    let mut header = format!(
        "{{\"__metadata__\":{}",
        serde_json::to_string(&meta).expect("a string map always serializes")
    );
    let mut offset = 0usize;
    for (name, e) in &encoded {
        let end = offset + e.bytes.len();
        header.push_str(&format!(
            ",{}:{{\"dtype\":{},\"shape\":{},\"data_offsets\":[{offset},{end}]}}",
            json(name),
            json(&e.dtype.to_string()),
            serde_json::to_string(&e.shape).expect("a shape always serializes")
        ));
        offset = end;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + offset);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for (_, e) in &encoded {
        out.extend_from_slice(&e.bytes);
    }
    Ok(out)
}

/// Writes a checkpoint atomically: the previous file at `path`, if any, stays intact unless the
/// new one is completely written.
pub fn save(
    path: &Path,
    tensors: &[(String, &Tensor)],
    metadata: &[(String, String)],
) -> Result<(), CheckpointError> {
    let bytes = to_bytes(tensors, metadata).map_err(|m| CheckpointError::new(path, m))?;
    mgn_ir::io::write_atomic(path, &bytes)
        .map_err(|e| CheckpointError::new(path, format!("cannot write the checkpoint: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Reads a checkpoint file into host tensors.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let bytes = std::fs::read(path)
        .map_err(|e| CheckpointError::new(path, format!("cannot read the checkpoint: {e}")))?;
    from_bytes(&bytes, path)
}

/// Parses checkpoint bytes; `path` names the source in errors.
pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointError> {
    let err = |m: String| CheckpointError::new(path, m);
    // `read_metadata` checks the header length against the file, parses the header, and checks
    // that the tensors' offsets tile the data exactly and agree with their shapes and dtypes
    // (with overflow checks), all before any tensor-sized allocation.
    let (n, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| err(describe_parse_error(bytes, &e)))?;
    let data = &bytes[8 + n..];
    let metadata: BTreeMap<String, String> =
        header.metadata().clone().unwrap_or_default().into_iter().collect();
    if let Some(v) = metadata.get(FORMAT_KEY) {
        if v != FORMAT_VERSION {
            return Err(err(format!(
                "checkpoint format version {v}, but this runtime reads version {FORMAT_VERSION}"
            )));
        }
    }
    let mut tensors = Vec::new();
    for (name, info) in header.tensors() {
        let (start, end) = info.data_offsets;
        let bytes = data.get(start..end).ok_or_else(|| {
            err(format!("corrupt header: the data offsets of tensor `{name}` are out of range"))
        })?;
        let t = decode(&name, info.dtype, &info.shape, bytes).map_err(err)?;
        tensors.push((name, t));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Checkpoint { path: path.to_path_buf(), tensors, metadata })
}

/// Turns a safetensors parse error into a sentence that says what is wrong with the file.
fn describe_parse_error(bytes: &[u8], e: &SafeTensorError) -> String {
    let declared = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let len = bytes.len();
    match e {
        SafeTensorError::HeaderTooSmall => format!("not a safetensors checkpoint: the file has {len} bytes, fewer than the 8-byte header length"),
        SafeTensorError::HeaderTooLarge => format!(
            "not a safetensors checkpoint, or corrupt: the header length field says {} bytes (the limit is 100 MB)",
            declared.unwrap_or(0)
        ),
        SafeTensorError::InvalidHeaderLength => format!(
            "truncated or corrupt: the header length field says {} bytes but the file has only {} after it",
            declared.unwrap_or(0),
            len.saturating_sub(8)
        ),
        SafeTensorError::InvalidHeader(_) => "corrupt header: it is not UTF-8 text".into(),
        SafeTensorError::InvalidHeaderDeserialization(je) | SafeTensorError::JsonError(je) => format!("corrupt header: {je}"),
        SafeTensorError::MetadataIncompleteBuffer => {
            format!("truncated or corrupt: the tensor data described by the header does not match the {len}-byte file (it is missing or has trailing bytes)")
        }
        SafeTensorError::ValidationOverflow => "corrupt header: a tensor's declared size overflows".into(),
        SafeTensorError::TensorInvalidInfo => "corrupt header: a tensor's shape and dtype do not match the size of its data".into(),
        SafeTensorError::InvalidOffset(name) => format!("corrupt header: the data offsets of tensor `{name}` are out of order, overlapping or out of range"),
        SafeTensorError::MisalignedSlice => "corrupt header: a tensor's size is not a whole number of bytes".into(),
        other => format!("cannot parse the checkpoint: {other}"),
    }
}

/// Converts one tensor's bytes (already checked by the parser to be exactly
/// `numel × element size` long) into host storage.
fn decode(name: &str, dtype: StDtype, shape: &[usize], data: &[u8]) -> Result<Tensor, String> {
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("tensor `{name}` has an impossible shape {shape:?}"))?;
    let size = match dtype {
        StDtype::F32 | StDtype::I32 | StDtype::U32 => 4,
        StDtype::F16 | StDtype::BF16 => 2,
        StDtype::I64 => 8,
        StDtype::BOOL => 1,
        other => return Err(format!("tensor `{name}` has dtype {other}, which mgn does not support (f32, f16, bf16, i32, i64, u32, bool)")),
    };
    if numel.checked_mul(size) != Some(data.len()) {
        return Err(format!(
            "tensor `{name}`: shape {shape:?} of {dtype} does not match its {} bytes of data",
            data.len()
        ));
    }
    fn chunks<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        data.chunks_exact(N).map(|c| c.try_into().expect("exact chunk"))
    }
    let shape = shape.to_vec();
    let (dt, storage) = match dtype {
        StDtype::F32 => {
            (DType::F32, Data::F32(chunks::<4>(data).map(f32::from_le_bytes).collect()))
        }
        StDtype::F16 => (
            DType::F16,
            Data::F32(chunks::<2>(data).map(|b| half::f16::from_le_bytes(b).to_f32()).collect()),
        ),
        StDtype::BF16 => (
            DType::BF16,
            Data::F32(chunks::<2>(data).map(|b| half::bf16::from_le_bytes(b).to_f32()).collect()),
        ),
        StDtype::I32 => {
            (DType::I32, Data::I32(chunks::<4>(data).map(i32::from_le_bytes).collect()))
        }
        StDtype::I64 => {
            let mut v = Vec::with_capacity(numel);
            for (i, b) in chunks::<8>(data).enumerate() {
                let x = i64::from_le_bytes(b);
                v.push(i32::try_from(x).map_err(|_| format!("tensor `{name}` (i64): element {i} is {x}, which does not fit the runtime's 32-bit integers"))?);
            }
            (DType::I64, Data::I32(v))
        }
        StDtype::U32 => {
            let mut v = Vec::with_capacity(numel);
            for (i, b) in chunks::<4>(data).enumerate() {
                let x = u32::from_le_bytes(b);
                v.push(i32::try_from(x).map_err(|_| format!("tensor `{name}` (u32): element {i} is {x}, which does not fit the runtime's 32-bit signed integers"))?);
            }
            (DType::U32, Data::I32(v))
        }
        StDtype::BOOL => {
            if let Some(i) = data.iter().position(|&b| b > 1) {
                return Err(format!(
                    "tensor `{name}` (bool): element {i} is the byte {}, not 0 or 1",
                    data[i]
                ));
            }
            (DType::Bool, Data::I32(data.iter().map(|&b| b as i32).collect()))
        }
        _ => unreachable!("unsupported dtypes are refused above"),
    };
    Ok(Tensor { dtype: dt, shape, data: storage })
}

// ---------------------------------------------------------------------------------------------
// Matching a checkpoint against a plan's parameters

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchMode {
    /// Every parameter must be present with its shape, and nothing else (beyond optimizer
    /// state) may be in the checkpoint.
    Strict,
    /// Load what matches; report the rest.
    Partial,
}

/// A tensor's dtype and shape, printed `f32[128, 64]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "{}[{}]", self.dtype, dims.join(", "))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub name: String,
    pub expected: Signature,
    pub found: Signature,
    /// Why the values cannot be used when the signatures alone do not say (an out-of-range value).
    pub note: Option<String>,
}

/// What matching a checkpoint against a plan's parameters found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Parameters loaded from the checkpoint.
    pub loaded: Vec<String>,
    /// Parameters of the plan that the checkpoint lacks (with the expected signature).
    pub missing: Vec<(String, Signature)>,
    /// Checkpoint tensors that are neither parameters nor optimizer state.
    pub unexpected: Vec<(String, Signature)>,
    /// Tensors whose shape or kind (float / integer / bool) differ from the parameter's.
    pub mismatched: Vec<Mismatch>,
    /// Loaded tensors converted between dtypes of the same kind (`f16` → `f32`, `i64` → `i32`),
    /// as PyTorch's `load_state_dict` does; not an error in either mode.
    pub converted: Vec<(String, DType, DType)>,
}

impl Report {
    /// Nothing missing, unexpected or mismatched.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} parameter(s) loaded", self.loaded.len())?;
        if !self.missing.is_empty() {
            writeln!(f, "missing from the checkpoint ({}):", self.missing.len())?;
            for (n, s) in &self.missing {
                writeln!(f, "  {n}: expected {s}")?;
            }
        }
        if !self.unexpected.is_empty() {
            writeln!(f, "in the checkpoint but not in the model ({}):", self.unexpected.len())?;
            for (n, s) in &self.unexpected {
                writeln!(f, "  {n}: found {s}")?;
            }
        }
        if !self.mismatched.is_empty() {
            writeln!(f, "shape or dtype differs ({}):", self.mismatched.len())?;
            for m in &self.mismatched {
                write!(f, "  {}: expected {}, found {}", m.name, m.expected, m.found)?;
                match &m.note {
                    Some(n) => writeln!(f, " ({n})")?,
                    None => writeln!(f)?,
                }
            }
        }
        if !self.converted.is_empty() {
            writeln!(f, "converted on load ({}):", self.converted.len())?;
            for (n, from, to) in &self.converted {
                writeln!(f, "  {n}: {from} -> {to}")?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Float,
    Int,
    Bool,
}

fn kind(d: DType) -> Kind {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => Kind::Float,
        DType::I32 | DType::I64 | DType::U32 => Kind::Int,
        DType::Bool => Kind::Bool,
    }
}

/// Converts a loaded tensor to a parameter's declared dtype of the same kind.
fn convert(t: &Tensor, to: DType) -> Result<Tensor, String> {
    let mut out = t.clone();
    out.dtype = to;
    match (&mut out.data, to) {
        (Data::F32(v), DType::F16) => {
            v.iter_mut().for_each(|x| *x = half::f16::from_f32(*x).to_f32())
        }
        (Data::F32(v), DType::BF16) => {
            v.iter_mut().for_each(|x| *x = half::bf16::from_f32(*x).to_f32())
        }
        (Data::I32(v), DType::U32) => {
            if let Some(i) = v.iter().position(|&x| x < 0) {
                return Err(format!("element {i} is {}, not a u32", v[i]));
            }
        }
        _ => {}
    }
    Ok(out)
}

/// Matches checkpoint tensors to a plan's parameters by name. The result has one entry per
/// parameter, in order: the tensor to load (converted to the parameter's dtype), or `None`.
/// Strict mode fails when anything is missing, unexpected or mismatched; partial mode loads
/// what matches. Either way the report says what was found.
pub fn match_params(
    ckpt: &Checkpoint,
    params: &[ParamSpec],
    mode: MatchMode,
) -> Result<(Vec<Option<Tensor>>, Report), CheckpointError> {
    let mut report = Report::default();
    let mut out = Vec::with_capacity(params.len());
    let mut used = HashSet::new();
    for p in params {
        let expected = Signature { dtype: p.dtype, shape: p.shape.clone() };
        let Some(t) = ckpt.get(&p.name) else {
            report.missing.push((p.name.clone(), expected));
            out.push(None);
            continue;
        };
        used.insert(p.name.as_str());
        let found = Signature { dtype: t.dtype, shape: t.shape.clone() };
        if t.shape != p.shape || kind(t.dtype) != kind(p.dtype) {
            report.mismatched.push(Mismatch { name: p.name.clone(), expected, found, note: None });
            out.push(None);
            continue;
        }
        match convert(t, p.dtype) {
            Ok(c) => {
                if t.dtype != p.dtype {
                    report.converted.push((p.name.clone(), t.dtype, p.dtype));
                }
                report.loaded.push(p.name.clone());
                out.push(Some(c));
            }
            Err(note) => {
                report.mismatched.push(Mismatch {
                    name: p.name.clone(),
                    expected,
                    found,
                    note: Some(note),
                });
                out.push(None);
            }
        }
    }
    for (name, t) in &ckpt.tensors {
        if !used.contains(name.as_str()) && !name.starts_with(OPTIM_PREFIX) {
            report
                .unexpected
                .push((name.clone(), Signature { dtype: t.dtype, shape: t.shape.clone() }));
        }
    }
    if mode == MatchMode::Strict && !report.is_clean() {
        let mut msg = String::from("the checkpoint does not match the model's parameters (strict loading; partial loading would load what matches)\n");
        msg.push_str(report.to_string().trim_end());
        return Err(CheckpointError::new(&ckpt.path, msg));
    }
    Ok((out, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::plan::InitSpec;
    use safetensors::tensor::View;
    use std::borrow::Cow;

    /// Lets the `safetensors` crate's own writer produce files for the interoperability tests.
    impl View for &Encoded {
        fn dtype(&self) -> StDtype {
            self.dtype
        }
        fn shape(&self) -> &[usize] {
            &self.shape
        }
        fn data(&self) -> Cow<'_, [u8]> {
            Cow::Borrowed(&self.bytes)
        }
        fn data_len(&self) -> usize {
            self.bytes.len()
        }
    }

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "mgn-ckpt-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
        fn entries(&self) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
            }
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sample() -> Vec<(String, Tensor)> {
        vec![
            ("fc1.weight".into(), Tensor::f32(vec![2, 3], vec![0.5, -1.25, 3.0, 1e-3, -0.0, 7.75])),
            ("fc1.bias".into(), Tensor::f32(vec![2], vec![0.1, -0.2])),
            (
                "half".into(),
                Tensor {
                    dtype: DType::F16,
                    shape: vec![3],
                    data: Data::F32(vec![1.0, -2.5, 0.333_333]),
                },
            ),
            (
                "brain".into(),
                Tensor { dtype: DType::BF16, shape: vec![2, 1], data: Data::F32(vec![3.0, -0.1]) },
            ),
            ("ids".into(), Tensor::i32(vec![4], vec![1, -2, i32::MAX, i32::MIN])),
            (
                "bn.num_batches_tracked".into(),
                Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![12345]) },
            ),
            ("u".into(), Tensor { dtype: DType::U32, shape: vec![2], data: Data::I32(vec![0, 7]) }),
            (
                "mask".into(),
                Tensor { dtype: DType::Bool, shape: vec![3], data: Data::I32(vec![1, 0, 1]) },
            ),
            ("empty".into(), Tensor::f32(vec![0, 5], vec![])),
            ("wide".into(), Tensor::f64(vec![2], vec![0.25, 1.0 / 3.0])),
        ]
    }

    fn refs(v: &[(String, Tensor)]) -> Vec<(String, &Tensor)> {
        v.iter().map(|(n, t)| (n.clone(), t)).collect()
    }

    fn sample_bytes() -> Vec<u8> {
        to_bytes(&refs(&sample()), &standard_metadata("DigitsMlp", 42)).unwrap()
    }

    #[test]
    fn round_trip_keeps_shapes_dtypes_values_and_metadata() {
        let dir = TempDir::new("rt");
        let path = dir.path("model.safetensors");
        let tensors = sample();
        save(&path, &refs(&tensors), &standard_metadata("DigitsMlp", 42)).unwrap();
        let ck = load(&path).unwrap();
        assert_eq!(ck.model(), Some("DigitsMlp"));
        assert_eq!(ck.step(), Some(42));
        assert_eq!(ck.metadata.get(FORMAT_KEY).map(String::as_str), Some("1"));
        assert_eq!(ck.tensors.len(), tensors.len());
        for (name, t) in &tensors {
            let got = ck.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(got.dtype, t.dtype, "{name}");
            assert_eq!(got.shape, t.shape, "{name}");
            let want: Vec<f64> = match t.dtype {
                DType::F16 => {
                    t.to_f64_vec().iter().map(|&x| half::f16::from_f64(x).to_f64()).collect()
                }
                DType::BF16 => {
                    t.to_f64_vec().iter().map(|&x| half::bf16::from_f64(x).to_f64()).collect()
                }
                DType::F32 => t.to_f64_vec().iter().map(|&x| x as f32 as f64).collect(),
                _ => t.to_f64_vec(),
            };
            assert_eq!(got.to_f64_vec(), want, "{name}");
        }
        // f16/bf16 come back in F32 storage, integers in I32 storage, f64 storage as f32.
        assert!(ck.get("half").unwrap().as_f32().is_some());
        assert!(ck.get("bn.num_batches_tracked").unwrap().as_i32().is_some());
        assert_eq!(ck.get("wide").unwrap().dtype, DType::F32);
        assert!(ck.get("wide").unwrap().as_f32().is_some());
        // Saving what was loaded gives the same bytes.
        let again = to_bytes(&refs(&ck.tensors), &standard_metadata("DigitsMlp", 42)).unwrap();
        assert_eq!(again, std::fs::read(&path).unwrap());
        assert_eq!(dir.entries(), vec!["model.safetensors"]);
    }

    #[test]
    fn file_uses_real_safetensors_dtypes() {
        let bytes = sample_bytes();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let dt = |n: &str| st.tensor(n).unwrap().dtype();
        assert_eq!(dt("half"), StDtype::F16);
        assert_eq!(dt("brain"), StDtype::BF16);
        assert_eq!(dt("bn.num_batches_tracked"), StDtype::I64);
        assert_eq!(dt("u"), StDtype::U32);
        assert_eq!(dt("mask"), StDtype::BOOL);
        assert_eq!(dt("wide"), StDtype::F32);
        assert_eq!(st.tensor("fc1.weight").unwrap().shape(), &[2, 3]);
        assert_eq!(st.tensor("bn.num_batches_tracked").unwrap().shape(), &[] as &[usize]);
    }

    #[test]
    fn save_refuses_inconsistent_tensors() {
        let bad_len = Tensor { dtype: DType::F32, shape: vec![3], data: Data::F32(vec![1.0]) };
        let neg_u32 = Tensor { dtype: DType::U32, shape: vec![1], data: Data::I32(vec![-1]) };
        let bad_bool = Tensor { dtype: DType::Bool, shape: vec![1], data: Data::I32(vec![2]) };
        let float_as_int = Tensor { dtype: DType::I32, shape: vec![1], data: Data::F32(vec![1.0]) };
        let ok = Tensor::f32(vec![1], vec![1.0]);
        for (name, t, want) in [
            ("a", &bad_len, "holds 1 values"),
            ("b", &neg_u32, "u32"),
            ("c", &bad_bool, "bool"),
            ("d", &float_as_int, "floating-point"),
        ] {
            let e = to_bytes(&[(name.to_string(), t)], &[]).unwrap_err();
            assert!(e.contains(&format!("`{name}`")) && e.contains(want), "{e}");
        }
        let e = to_bytes(&[("x".into(), &ok), ("x".into(), &ok)], &[]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = to_bytes(&[("__metadata__".into(), &ok)], &[]).unwrap_err();
        assert!(e.contains("cannot be a tensor name"), "{e}");
        let e = to_bytes(&[], &[(FORMAT_KEY.into(), "2".into())]).unwrap_err();
        assert!(e.contains("mgn.format"), "{e}");
    }

    #[test]
    fn failed_write_leaves_previous_file_and_no_temp_files() {
        let dir = TempDir::new("atomic");
        let path = dir.path("ck.safetensors");
        let old = vec![("w".to_string(), Tensor::f32(vec![2], vec![1.0, 2.0]))];
        save(&path, &refs(&old), &standard_metadata("M", 1)).unwrap();
        let before = std::fs::read(&path).unwrap();
        let new = vec![("w".to_string(), Tensor::f32(vec![2], vec![3.0, 4.0]))];

        // 1. An encoding error: nothing is written.
        let broken = Tensor { dtype: DType::F32, shape: vec![5], data: Data::F32(vec![0.0]) };
        let e = save(&path, &[("w".into(), &broken)], &[]).unwrap_err();
        assert!(e.to_string().contains("ck.safetensors"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(dir.entries(), vec!["ck.safetensors"]);

        // 2. The temporary file cannot be created (simulated: a directory is in its place).
        let blocker = dir.path(&format!(".ck.safetensors.tmp{}", std::process::id()));
        std::fs::create_dir(&blocker).unwrap();
        let e = save(&path, &refs(&new), &standard_metadata("M", 2)).unwrap_err();
        assert!(
            e.to_string().contains("ck.safetensors") && e.message.contains("cannot write"),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
        std::fs::remove_dir(&blocker).unwrap();
        assert_eq!(dir.entries(), vec!["ck.safetensors"]);

        // 3. A read-only directory (only meaningful when not running as root).
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o555)).unwrap();
            let writable = std::fs::File::create(dir.path("probe")).is_ok();
            if writable {
                let _ = std::fs::remove_file(dir.path("probe"));
            } else {
                assert!(save(&path, &refs(&new), &standard_metadata("M", 2)).is_err());
                assert_eq!(std::fs::read(&path).unwrap(), before);
                assert_eq!(dir.entries(), vec!["ck.safetensors"]);
            }
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        }

        // And a successful save replaces it, leaving only the one file.
        save(&path, &refs(&new), &standard_metadata("M", 2)).unwrap();
        assert_eq!(load(&path).unwrap().get("w").unwrap().to_f64_vec(), vec![3.0, 4.0]);
        assert_eq!(dir.entries(), vec!["ck.safetensors"]);
    }

    fn parse(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        from_bytes(bytes, Path::new("bad.safetensors"))
    }

    #[test]
    fn truncated_files_are_errors_at_every_cut() {
        let bytes = sample_bytes();
        for cut in 0..bytes.len() {
            let e = parse(&bytes[..cut]).expect_err("a truncated file must not load");
            assert!(e.to_string().starts_with("bad.safetensors: "), "{e}");
        }
        assert!(parse(&bytes).is_ok());
        let e = parse(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(e.message.contains("truncated"), "{e}");
        let e = parse(&bytes[..20]).unwrap_err();
        assert!(e.message.contains("truncated") && e.message.contains("header length"), "{e}");
        let e = parse(&bytes[..3]).unwrap_err();
        assert!(e.message.contains("fewer than the 8-byte header length"), "{e}");
        // Trailing bytes are refused too.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 4]);
        assert!(parse(&longer).is_err());
    }

    #[test]
    fn garbage_and_flipped_bytes_never_panic() {
        // Deterministic pseudo-random garbage of many lengths.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in (0..2000).step_by(37) {
            let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            assert!(parse(&junk).is_err());
        }
        let e = parse(b"this is not a checkpoint at all, just some text").unwrap_err();
        assert!(e.message.contains("header length"), "{e}");
        // Every single-byte corruption of a valid file either loads or is an error.
        let bytes = sample_bytes();
        for i in 0..bytes.len() {
            for v in [0u8, 0xFF, b'9', b'"'] {
                let mut b = bytes.clone();
                b[i] = v;
                let _ = parse(&b);
            }
        }
    }

    fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn malicious_headers_are_refused_without_allocating() {
        // 10^12 elements, honestly sized offsets far past the end of the file.
        let h =
            r#"{"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,4000000000000]}}"#;
        let e = parse(&with_header(h, &[0; 16])).unwrap_err();
        assert!(e.message.contains("truncated or corrupt"), "{e}");
        // 10^12 elements with offsets that lie about the size.
        let h = r#"{"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,16]}}"#;
        let e = parse(&with_header(h, &[0; 16])).unwrap_err();
        assert!(e.message.contains("do not match the size"), "{e}");
        // A shape whose element count overflows.
        let h = r#"{"w":{"dtype":"F32","shape":[18446744073709551615,18446744073709551615],"data_offsets":[0,16]}}"#;
        let e = parse(&with_header(h, &[0; 16])).unwrap_err();
        assert!(e.message.contains("overflows"), "{e}");
        // Offsets past the end of the data.
        let h = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        assert!(parse(&with_header(h, &[0; 8])).is_err());
        // Offsets backwards.
        let h = r#"{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}"#;
        let e = parse(&with_header(h, &[0; 8])).unwrap_err();
        assert!(e.message.contains("offsets of tensor `w`"), "{e}");
        // Absurd header lengths.
        for n in [u64::MAX, 1 << 40, 100_000_001, 1_000_000] {
            let mut b = n.to_le_bytes().to_vec();
            b.extend_from_slice(b"{}");
            let e = parse(&b).unwrap_err();
            assert!(e.message.contains("header length field says"), "{n}: {e}");
        }
        // Not JSON, not UTF-8, unknown dtype.
        assert!(parse(&with_header("{not json", &[]))
            .unwrap_err()
            .message
            .contains("corrupt header"));
        assert!(parse(&with_header("\u{0}\u{1}", &[])).is_err());
        let mut b = 4u64.to_le_bytes().to_vec();
        b.extend_from_slice(&[0xFF, 0xFE, 0xFD, 0xFC]);
        assert!(parse(&b).unwrap_err().message.contains("UTF-8"));
        let h = r#"{"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(parse(&with_header(h, &[0; 4])).unwrap_err().message.contains("corrupt header"));
    }

    #[test]
    fn values_out_of_host_range_name_the_tensor() {
        let h = r#"{"big":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#;
        let mut data = 5i64.to_le_bytes().to_vec();
        data.extend_from_slice(&(1i64 << 40).to_le_bytes());
        let e = parse(&with_header(h, &data)).unwrap_err();
        assert!(e.message.contains("`big`") && e.message.contains("1099511627776"), "{e}");
        let h = r#"{"u":{"dtype":"U32","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(parse(&with_header(h, &u32::MAX.to_le_bytes()))
            .unwrap_err()
            .message
            .contains("`u`"));
        let h = r#"{"m":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(parse(&with_header(h, &[7])).unwrap_err().message.contains("`m`"));
        let h = r#"{"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#;
        assert!(parse(&with_header(h, &[0; 8])).unwrap_err().message.contains("F64"));
        // In range, i64 loads into I32 storage with the declared dtype kept.
        let h = r#"{"n":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#;
        let mut data = (-3i64).to_le_bytes().to_vec();
        data.extend_from_slice(&(i32::MAX as i64).to_le_bytes());
        let ck = parse(&with_header(h, &data)).unwrap();
        assert_eq!(
            ck.get("n").unwrap(),
            &Tensor { dtype: DType::I64, shape: vec![2], data: Data::I32(vec![-3, i32::MAX]) }
        );
    }

    #[test]
    fn other_format_versions_are_refused_and_foreign_files_load() {
        let mut meta = std::collections::HashMap::new();
        meta.insert(FORMAT_KEY.to_string(), "7".to_string());
        let t = Tensor::f32(vec![1], vec![1.0]);
        let enc = encode("w", &t).unwrap();
        let bytes = safetensors::serialize([("w", &enc)], Some(meta)).unwrap();
        assert!(parse(&bytes).unwrap_err().message.contains("version 7"));
        // A file without metadata (as PyTorch or other tools may write) is fine.
        let bytes = safetensors::serialize([("w", &enc)], None).unwrap();
        let ck = parse(&bytes).unwrap();
        assert!(ck.metadata.is_empty() && ck.model().is_none());
    }

    #[test]
    fn missing_file_names_the_file() {
        let e = load(Path::new("/nonexistent/dir/x.safetensors")).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/dir/x.safetensors: cannot read"), "{e}");
    }

    fn param(name: &str, dtype: DType, shape: &[usize]) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            init: InitSpec::Constant(0.0),
            trainable: true,
            frozen: false,
        }
    }

    fn ckpt(tensors: Vec<(String, Tensor)>) -> Checkpoint {
        let mut tensors = tensors;
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Checkpoint { path: PathBuf::from("ck.safetensors"), tensors, metadata: BTreeMap::new() }
    }

    #[test]
    fn strict_match_of_a_complete_checkpoint() {
        let params = vec![
            param("fc.weight", DType::F32, &[2, 2]),
            param("fc.bias", DType::F32, &[2]),
            param("bn.n", DType::I64, &[]),
        ];
        let ck = ckpt(vec![
            ("fc.weight".into(), Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])),
            ("fc.bias".into(), Tensor::f32(vec![2], vec![5.0, 6.0])),
            ("bn.n".into(), Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![3]) }),
            ("optim.fc.weight.m".into(), Tensor::f32(vec![2, 2], vec![0.0; 4])),
            (
                "optim.step".into(),
                Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![10]) },
            ),
        ]);
        let (vals, report) = match_params(&ck, &params, MatchMode::Strict).unwrap();
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.loaded.len(), 3);
        assert_eq!(vals[1].as_ref().unwrap().to_f64_vec(), vec![5.0, 6.0]);
        assert_eq!(vals[2].as_ref().unwrap().dtype, DType::I64);
    }

    fn messy() -> (Vec<ParamSpec>, Checkpoint) {
        let params = vec![
            param("fc1.weight", DType::F32, &[128, 64]),
            param("fc1.bias", DType::F32, &[128]),
            param("fc2.weight", DType::F32, &[10, 128]),
            param("fc2.bias", DType::F32, &[10]),
            param("emb.weight", DType::F32, &[4, 2]),
        ];
        let ck = ckpt(vec![
            ("fc1.weight".into(), Tensor::f32(vec![64, 128], vec![0.0; 64 * 128])),
            ("fc1.bias".into(), Tensor::f32(vec![128], vec![1.0; 128])),
            (
                "fc2.weight".into(),
                Tensor {
                    dtype: DType::F16,
                    shape: vec![10, 128],
                    data: Data::F32(vec![0.5; 1280]),
                },
            ),
            ("fc2.bias".into(), Tensor::i32(vec![10], vec![0; 10])),
            ("head.weight".into(), Tensor::f32(vec![3], vec![0.0; 3])),
            ("optim.fc1.weight.v".into(), Tensor::f32(vec![64, 128], vec![0.0; 64 * 128])),
        ]);
        (params, ck)
    }

    #[test]
    fn strict_match_lists_every_problem() {
        let (params, ck) = messy();
        let e = match_params(&ck, &params, MatchMode::Strict).unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("ck.safetensors: the checkpoint does not match"), "{m}");
        assert!(
            m.contains("missing from the checkpoint (1):\n  emb.weight: expected f32[4, 2]"),
            "{m}"
        );
        assert!(
            m.contains("in the checkpoint but not in the model (1):\n  head.weight: found f32[3]"),
            "{m}"
        );
        assert!(m.contains("fc1.weight: expected f32[128, 64], found f32[64, 128]"), "{m}");
        assert!(m.contains("fc2.bias: expected f32[10], found i32[10]"), "{m}");
        assert!(!m.contains("optim."), "{m}");
        assert!(m.lines().count() >= 8, "{m}");
    }

    #[test]
    fn partial_match_loads_what_fits() {
        let (params, ck) = messy();
        let (vals, r) = match_params(&ck, &params, MatchMode::Partial).unwrap();
        assert_eq!(r.loaded, vec!["fc1.bias", "fc2.weight"]);
        assert_eq!(r.missing.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), vec!["emb.weight"]);
        assert_eq!(
            r.unexpected.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(),
            vec!["head.weight"]
        );
        assert_eq!(
            r.mismatched.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
            vec!["fc1.weight", "fc2.bias"]
        );
        assert_eq!(r.converted, vec![("fc2.weight".to_string(), DType::F16, DType::F32)]);
        assert!(vals[0].is_none() && vals[3].is_none() && vals[4].is_none());
        assert_eq!(vals[1].as_ref().unwrap().to_f64_vec(), vec![1.0; 128]);
        let w2 = vals[2].as_ref().unwrap();
        assert_eq!((w2.dtype, w2.shape.clone()), (DType::F32, vec![10, 128]));
    }

    #[test]
    fn match_converts_within_a_kind_and_rounds_to_half() {
        let params = vec![
            param("h", DType::F16, &[1]),
            param("u", DType::U32, &[1]),
            param("n", DType::I32, &[]),
        ];
        let ck = ckpt(vec![
            ("h".into(), Tensor::f32(vec![1], vec![0.1])),
            ("u".into(), Tensor::i32(vec![1], vec![-1])),
            ("n".into(), Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![9]) }),
        ]);
        let (vals, r) = match_params(&ck, &params, MatchMode::Partial).unwrap();
        assert_eq!(
            vals[0].as_ref().unwrap().as_f32().unwrap()[0],
            half::f16::from_f32(0.1).to_f32()
        );
        assert!(vals[1].is_none());
        assert!(r.mismatched[0].note.as_ref().unwrap().contains("not a u32"));
        assert_eq!(vals[2].as_ref().unwrap(), &Tensor::i32(vec![], vec![9]));
        assert!(match_params(&ck, &params, MatchMode::Strict).is_err());
    }

    fn repo_file(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
    }

    #[test]
    fn committed_data_files_load_and_match_this_writer_byte_for_byte() {
        for (rel, n) in
            [("data/digits_train.safetensors", 1437), ("data/digits_test.safetensors", 360)]
        {
            let path = repo_file(rel);
            let ck = load(&path).unwrap();
            let images = ck.get("images").unwrap();
            let labels = ck.get("labels").unwrap();
            assert_eq!((images.dtype, images.shape.clone()), (DType::F32, vec![n, 64]), "{rel}");
            assert_eq!((labels.dtype, labels.shape.clone()), (DType::I32, vec![n]), "{rel}");
            assert!(images.as_f32().unwrap().iter().all(|&x| (0.0..=1.0).contains(&x)));
            assert!(labels.as_i32().unwrap().iter().all(|&y| (0..10).contains(&y)));
            assert_eq!(ck.metadata.get("license").map(|s| s.starts_with("CC BY 4.0")), Some(true));
            // The Python writer (scripts/safetensors_io.py) and this one agree on every byte.
            let meta: Vec<(String, String)> =
                ck.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_eq!(
                to_bytes(&refs(&ck.tensors), &meta).unwrap(),
                std::fs::read(&path).unwrap(),
                "{rel}"
            );
        }
    }

    #[test]
    fn digits_mlp_fixture_is_consistent() {
        let dir = "tests/fixtures/digits_mlp";
        let w = load(&repo_file(&format!("{dir}/weights.safetensors"))).unwrap();
        let inp = load(&repo_file(&format!("{dir}/inputs.safetensors"))).unwrap();
        let exp = load(&repo_file(&format!("{dir}/expected.safetensors"))).unwrap();
        let names: Vec<&str> = exp.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "grad.fc1.bias",
                "grad.fc1.weight",
                "grad.fc2.bias",
                "grad.fc2.weight",
                "loss",
                "output.logits"
            ]
        );
        for (name, shape) in [
            ("fc1.weight", vec![128, 64]),
            ("fc1.bias", vec![128]),
            ("fc2.weight", vec![10, 128]),
            ("fc2.bias", vec![10]),
        ] {
            assert_eq!(w.get(name).unwrap().shape, shape);
            assert_eq!(exp.get(&format!("grad.{name}")).unwrap().shape, shape);
        }
        assert_eq!(exp.get("loss").unwrap().shape, Vec::<usize>::new());

        // A second, plain-loop evaluation of the forward pass and of the bias gradients.
        let f = |ck: &Checkpoint, n: &str| ck.get(n).unwrap().to_f64_vec();
        let (w1, b1, w2, b2) =
            (f(&w, "fc1.weight"), f(&w, "fc1.bias"), f(&w, "fc2.weight"), f(&w, "fc2.bias"));
        let x = f(&inp, "images");
        let y = inp.get("labels").unwrap().as_i32().unwrap().to_vec();
        let (logits_want, loss_want) = (f(&exp, "output.logits"), f(&exp, "loss")[0]);
        let (mut loss, mut gb2) = (0.0, [0.0f64; 10]);
        for n in 0..64 {
            let h: Vec<f64> = (0..128)
                .map(|j| {
                    (b1[j] + (0..64).map(|k| x[n * 64 + k] * w1[j * 64 + k]).sum::<f64>()).max(0.0)
                })
                .collect();
            let z: Vec<f64> = (0..10)
                .map(|c| b2[c] + (0..128).map(|j| h[j] * w2[c * 128 + j]).sum::<f64>())
                .collect();
            for c in 0..10 {
                assert!((z[c] - logits_want[n * 10 + c]).abs() < 1e-5, "logit {n},{c}");
            }
            let m = z.iter().cloned().fold(f64::MIN, f64::max);
            let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            loss += (lse - z[y[n] as usize]) / 64.0;
            for c in 0..10 {
                gb2[c] += ((z[c] - lse).exp() - (c as i32 == y[n]) as i32 as f64) / 64.0;
            }
        }
        assert!((loss - loss_want).abs() < 1e-6, "{loss} vs {loss_want}");
        let gb2_want = f(&exp, "grad.fc2.bias");
        for c in 0..10 {
            assert!((gb2[c] - gb2_want[c]).abs() < 1e-7, "grad.fc2.bias[{c}]");
        }
    }
}
