//! Reading the protobuf: the message types generated from `proto/onnx.proto` (build.rs), the
//! model file, and the elements of a `TensorProto`, wherever they are stored (typed fields, raw
//! bytes, or an external data file beside the model).

use super::value::{Const, Dt, Elems};
use prost::Message;
use std::path::Path;

#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

pub use pb::{ModelProto, TensorProto};

/// Decodes a model file.
pub fn decode(bytes: &[u8]) -> Result<ModelProto, String> {
    ModelProto::decode(bytes)
        .map_err(|e| format!("not an ONNX model (the protobuf does not decode: {e})"))
}

/// The elements of `t`, read from its typed fields, its raw bytes or its external file (a
/// path relative to the directory of the model, `dir`).
pub fn tensor(t: &TensorProto, dir: &Path) -> Result<Const, String> {
    let dt = Dt::from_onnx(t.data_type.unwrap_or(0)).ok_or_else(|| {
        format!(
            "tensor `{}` has element type {}, which mgn has no type for",
            name(t),
            dt_name(t.data_type.unwrap_or(0))
        )
    })?;
    let shape: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| format!("tensor `{}` has a negative dimension", name(t)))
        })
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let raw = if t.data_location == Some(pb::tensor_proto::DataLocation::External as i32) {
        Some(external(t, dir)?)
    } else if t.raw_data.as_ref().is_some_and(|r| !r.is_empty()) || n == 0 {
        t.raw_data.clone()
    } else {
        None
    };
    let elems = match raw {
        Some(bytes) => from_raw(dt, &bytes, n).ok_or_else(|| {
            format!(
                "tensor `{}` holds {} bytes, not {n} elements of {}",
                name(t),
                bytes.len(),
                dt.onnx_name()
            )
        })?,
        None => from_fields(t, dt),
    };
    if elems.len() != n {
        return Err(format!(
            "tensor `{}` holds {} elements, its shape {:?} needs {n}",
            name(t),
            elems.len(),
            shape
        ));
    }
    Ok(Const { dt, shape, elems })
}

fn name(t: &TensorProto) -> &str {
    t.name.as_deref().unwrap_or("")
}

/// The ONNX name of an element type code, for messages.
pub fn dt_name(code: i32) -> String {
    pb::tensor_proto::DataType::try_from(code)
        .map(|d| d.as_str_name().to_ascii_lowercase())
        .unwrap_or_else(|_| format!("code {code}"))
}

fn external(t: &TensorProto, dir: &Path) -> Result<Vec<u8>, String> {
    let mut location = None;
    let (mut offset, mut length) = (0u64, None);
    for e in &t.external_data {
        let v = e.value.as_deref().unwrap_or("");
        match e.key.as_deref() {
            Some("location") => location = Some(v.to_string()),
            Some("offset") => {
                offset = v.parse().map_err(|_| format!("bad external offset `{v}`"))?
            }
            Some("length") => {
                length = Some(v.parse::<u64>().map_err(|_| format!("bad external length `{v}`"))?)
            }
            _ => {}
        }
    }
    let loc =
        location.ok_or_else(|| format!("tensor `{}` is external but names no file", name(t)))?;
    if Path::new(&loc).is_absolute() || loc.split(['/', '\\']).any(|c| c == "..") {
        return Err(format!(
            "tensor `{}` names the external file `{loc}` outside the model's directory",
            name(t)
        ));
    }
    let path = dir.join(&loc);
    let bytes = std::fs::read(&path)
        .map_err(|e| format!("cannot read `{}` (tensor `{}`): {e}", path.display(), name(t)))?;
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    let end = match length {
        Some(l) => start.saturating_add(usize::try_from(l).unwrap_or(usize::MAX)),
        None => bytes.len(),
    };
    bytes.get(start..end).map(<[u8]>::to_vec).ok_or_else(|| {
        format!(
            "`{}` is {} bytes; tensor `{}` is at {start}..{end}",
            path.display(),
            bytes.len(),
            name(t)
        )
    })
}

fn from_raw(dt: Dt, b: &[u8], n: usize) -> Option<Elems> {
    let w = dt.width();
    if b.len() != n * w {
        return None;
    }
    let chunks = b.chunks_exact(w);
    Some(match dt {
        Dt::F32 => Elems::F(chunks.map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
        Dt::F16 => {
            Elems::F(chunks.map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect())
        }
        Dt::Bf16 => {
            Elems::F(chunks.map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect())
        }
        Dt::F64 => {
            Elems::F(chunks.map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect())
        }
        Dt::I32 => {
            Elems::ints(chunks.map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap()))))
        }
        Dt::I64 => Elems::ints(chunks.map(|c| i64::from_le_bytes(c.try_into().unwrap()))),
        Dt::U8 => Elems::ints(chunks.map(|c| i64::from(c[0]))),
        Dt::I8 => Elems::ints(chunks.map(|c| i64::from(c[0] as i8))),
        Dt::Bool => Elems::B(chunks.map(|c| c[0] != 0).collect()),
    })
}

fn from_fields(t: &TensorProto, dt: Dt) -> Elems {
    match dt {
        Dt::F32 => Elems::F(t.float_data.clone()),
        Dt::F64 => Elems::F(t.double_data.iter().map(|&v| v as f32).collect()),
        // 16-bit floats travel as their bits in int32_data.
        Dt::F16 => Elems::F(
            t.int32_data.iter().map(|&v| half::f16::from_bits(v as u16).to_f32()).collect(),
        ),
        Dt::Bf16 => Elems::F(
            t.int32_data.iter().map(|&v| half::bf16::from_bits(v as u16).to_f32()).collect(),
        ),
        Dt::I64 => Elems::ints(t.int64_data.iter().copied()),
        Dt::I32 | Dt::U8 | Dt::I8 => Elems::ints(t.int32_data.iter().map(|&v| i64::from(v))),
        Dt::Bool => Elems::B(t.int32_data.iter().map(|&v| v != 0).collect()),
    }
}
