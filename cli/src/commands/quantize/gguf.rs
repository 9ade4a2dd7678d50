//! A GGUF (version 3) file of named tensors, as llama.cpp's tools read one: the header, the
//! metadata (`general.name`, `general.alignment`), each tensor's info (dims innermost first,
//! the ggml type id, the offset into the data), then the data, every tensor aligned to 32
//! bytes. Packed tensors are written as their blocks' bytes: mgn's packed types are ggml's.

use mgn_import::gguf::quants;
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;

/// The alignment of the data section and of each tensor in it (GGUF's default).
const ALIGNMENT: usize = 32;

/// GGUF's metadata value types used here.
const GGUF_U32: u32 = 4;
const GGUF_STRING: u32 = 8;

/// ggml's integer type ids (i32 and u32 are both written as I32; bool as I8).
const GGML_I8: u32 = 24;
const GGML_I32: u32 = 26;
const GGML_I64: u32 = 27;

/// The file holding `tensors`, with `name` as `general.name`.
pub(crate) fn to_bytes(tensors: &[(String, Tensor)], name: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&2u64.to_le_bytes());
    put_string(&mut out, "general.name");
    out.extend_from_slice(&GGUF_STRING.to_le_bytes());
    put_string(&mut out, name);
    put_string(&mut out, "general.alignment");
    out.extend_from_slice(&GGUF_U32.to_le_bytes());
    out.extend_from_slice(&(ALIGNMENT as u32).to_le_bytes());
    let mut data = Vec::new();
    for (name, t) in tensors {
        let (ty, bytes) = encode(name, t)?;
        put_string(&mut out, name);
        // ggml has no tensors without axes: a scalar is one element.
        let dims: Vec<u64> = match t.shape.len() {
            0 => vec![1],
            _ => t.shape.iter().rev().map(|&d| d as u64).collect(),
        };
        if dims.len() > 4 {
            return Err(format!("`{name}` has {} axes; GGUF holds at most 4", dims.len()));
        }
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        data.extend_from_slice(&bytes);
        data.resize(data.len().next_multiple_of(ALIGNMENT), 0);
    }
    out.resize(out.len().next_multiple_of(ALIGNMENT), 0);
    out.extend_from_slice(&data);
    Ok(out)
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A tensor's ggml type id and bytes.
fn encode(name: &str, t: &Tensor) -> Result<(u32, Vec<u8>), String> {
    let wrong = || format!("`{name}` is declared {} but holds other values", t.dtype);
    if t.dtype.is_packed() {
        let ty = quants::ggml_type(t.dtype).expect("every packed type is ggml's");
        return Ok((ty, t.as_packed().ok_or_else(wrong)?.to_vec()));
    }
    let floats = || t.dequantized();
    let ints = || match &t.data {
        Data::I32(v) => Ok(v.clone()),
        _ => Err(wrong()),
    };
    Ok(match t.dtype {
        DType::F32 => (quants::F32, floats().iter().flat_map(|x| x.to_le_bytes()).collect()),
        DType::F16 => (
            quants::F16,
            floats().iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        ),
        DType::BF16 => (
            quants::BF16,
            floats().iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
        ),
        DType::I32 | DType::U32 => {
            (GGML_I32, ints()?.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
        DType::I64 => (GGML_I64, ints()?.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect()),
        DType::Bool => (GGML_I8, ints()?.iter().map(|&x| x as u8).collect()),
        packed => unreachable!("`{packed}` is handled above"),
    })
}
