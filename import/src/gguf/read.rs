//! The GGUF container (versions 2 and 3): the header, the metadata key-value pairs, the tensor
//! infos and where each tensor's bytes lie. Nothing here knows what a tensor means.
//!
//! The reader trusts no count or size in the file: every length is checked against the bytes
//! that are left before anything is allocated for it, so a truncated or corrupt file is an
//! error that names what was being read, never a panic or an allocation the file cannot back.

use std::collections::BTreeMap;

/// A metadata value, as typed in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// One tensor's entry: its name, its ggml type id, its dims as ggml writes them (innermost
/// first: `dims[0]` is the row length) and where its bytes lie in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: u32,
    pub dims: Vec<u64>,
    /// The absolute offset of the tensor's first byte in the file.
    pub start: usize,
}

impl TensorInfo {
    /// The shape in the usual (outermost first) order: a `[rows, cols]` matrix has
    /// `dims = [cols, rows]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file: its metadata and its tensors, in the file's order.
#[derive(Debug)]
pub struct Gguf {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where the tensor data section starts.
    pub data_start: usize,
}

impl Gguf {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
}

/// A cursor over the file's bytes; every read says what it was reading when it fails.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// Nesting arrays of arrays is legal but no real file goes deep; a bound keeps a crafted file
/// from recursing without end.
const MAX_ARRAY_DEPTH: u32 = 4;
/// ggml tensors have at most 4 dims.
const MAX_DIMS: u32 = 4;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(format!(
                "the file ends inside {what} (at byte {}: {n} bytes needed, {left} left)",
                self.at
            ));
        }
        let s = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.u64(what)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("{what}: {b} is not a bool (0 or 1)")),
            },
            8 => Value::Str(self.string(what)?),
            9 => self.array_value(what, depth)?,
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => return Err(format!("{what} has value type {t}, which GGUF does not define")),
        })
    }

    fn array_value(&mut self, what: &str, depth: u32) -> Result<Value, String> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(format!("{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"));
        }
        let ty = self.u32(what)?;
        let n = self.u64(what)?;
        // Every element takes at least one byte (a string its 8-byte length): a count the
        // rest of the file cannot hold is corrupt, found before the vector is allocated.
        let least = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            9 => 12,
            _ => 8,
        };
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(least) > left {
            return Err(format!(
                "{what}: an array of {n} elements cannot fit in the {left} bytes left"
            ));
        }
        let mut items = Vec::with_capacity(n as usize);
        for _ in 0..n {
            items.push(self.value(ty, what, depth + 1)?);
        }
        Ok(Value::Array(items))
    }
}

/// The ggml block size and bytes per block of a type, for the types whose layout is known
/// (the size of a tensor of any other type cannot be checked, so it is refused here).
pub fn block_layout(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        30 => (1, 2),     // BF16
        _ => return None,
    })
}

/// The name ggml gives a type id, for messages.
pub fn type_name(ggml_type: u32) -> String {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    match NAMES.get(ggml_type as usize) {
        Some(n) => n.to_string(),
        None => format!("type {ggml_type}"),
    }
}

/// The bytes a tensor of `dims` takes, or why it cannot be sized.
pub fn byte_size(ggml_type: u32, dims: &[u64]) -> Result<u64, String> {
    let (block, bytes) = block_layout(ggml_type)
        .ok_or_else(|| format!("type {} has no known block layout", type_name(ggml_type)))?;
    let row = dims.first().copied().unwrap_or(1);
    if row % block != 0 {
        return Err(format!(
            "its rows of {row} are not a whole number of {}-element {} blocks",
            block,
            type_name(ggml_type)
        ));
    }
    let numel = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    numel
        .and_then(|n| (n / block).checked_mul(bytes))
        .ok_or_else(|| format!("its dims {dims:?} overflow"))
}

/// Parses the header, metadata and tensor infos of `bytes`, and checks that every tensor's
/// bytes lie inside the file.
pub fn parse(bytes: &[u8]) -> Result<Gguf, String> {
    let mut c = Cursor { bytes, at: 0 };
    if c.take(4, "the magic")? != b"GGUF" {
        return Err("not a GGUF file: it does not start with `GGUF`".into());
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version}: only versions 2 and 3 are read"));
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;
    // A key-value pair takes at least 12 bytes and a tensor info 24: counts no file of this
    // length can hold are corrupt.
    let left = (bytes.len() - c.at) as u64;
    if n_kv.saturating_mul(12).saturating_add(n_tensors.saturating_mul(24)) > left {
        return Err(format!(
            "the header promises {n_kv} metadata entries and {n_tensors} tensors, more than the \
             {left} bytes after it can hold"
        ));
    }
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key {i}"))?;
        let ty = c.u32(&format!("the type of `{key}`"))?;
        let value = c.value(ty, &format!("the value of `{key}`"), 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("metadata key `{key}` appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => return Err(format!("general.alignment {v:?} is not a power of two")),
        },
    };
    let mut infos = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        infos.push(tensor_info(&mut c, i)?);
    }
    let data_start = (c.at as u64).div_ceil(alignment) * alignment;
    let tensors = place(infos, data_start, alignment, bytes.len() as u64)?;
    Ok(Gguf { version, metadata, tensors, alignment, data_start: data_start as usize })
}

fn tensor_info(c: &mut Cursor, i: u64) -> Result<(String, u32, Vec<u64>, u64), String> {
    let name = c.string(&format!("the name of tensor {i}"))?;
    let what = format!("the info of tensor `{name}`");
    let n_dims = c.u32(&what)?;
    if n_dims > MAX_DIMS {
        return Err(format!("tensor `{name}` has {n_dims} dims; ggml allows at most {MAX_DIMS}"));
    }
    let dims = (0..n_dims).map(|_| c.u64(&what)).collect::<Result<Vec<_>, _>>()?;
    let ty = c.u32(&what)?;
    let offset = c.u64(&what)?;
    Ok((name, ty, dims, offset))
}

/// Checks each tensor's offset (aligned, inside the file, its bytes too) and makes it absolute.
fn place(
    infos: Vec<(String, u32, Vec<u64>, u64)>,
    data_start: u64,
    alignment: u64,
    file_len: u64,
) -> Result<Vec<TensorInfo>, String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, ty, dims, offset) in infos {
        if !seen.insert(name.clone()) {
            return Err(format!("tensor `{name}` appears twice"));
        }
        if offset % alignment != 0 {
            return Err(format!(
                "tensor `{name}` starts at offset {offset}, not a multiple of the alignment \
                 {alignment}"
            ));
        }
        // A type of unknown layout cannot be sized; it is never read either (dequantizing it
        // is refused with the tensor's name), so only its offset is checked.
        let size = match block_layout(ty) {
            Some(_) => byte_size(ty, &dims).map_err(|e| format!("tensor `{name}`: {e}"))?,
            None => 0,
        };
        let start = data_start.checked_add(offset);
        match start.and_then(|s| s.checked_add(size)) {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(format!(
                    "tensor `{name}` ({} bytes at offset {offset}) runs past the end of the \
                     file ({file_len} bytes): the file is truncated or corrupt",
                    size
                ))
            }
        }
        let start = start.expect("checked") as usize;
        tensors.push(TensorInfo { name, ggml_type: ty, dims, start });
    }
    Ok(tensors)
}
