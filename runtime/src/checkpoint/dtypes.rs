//! One tensor's elements between the host's storage and the bytes of its declared dtype.
//!
//! The host keeps `f16`/`bf16` in `F32` storage and every integer dtype in `I32`; a file holds
//! each in its own width. Encoding refuses values the declared dtype cannot hold (a negative
//! `u32`, a `bool` other than 0 or 1); decoding refuses dtypes mgn does not support and values
//! the host's 32-bit integers cannot hold, naming the tensor and the element.

use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;
use safetensors::tensor::Dtype as StDtype;

/// One tensor encoded in its declared dtype, ready for the safetensors writer.
pub(super) struct Encoded {
    pub(super) dtype: StDtype,
    pub(super) shape: Vec<usize>,
    pub(super) bytes: Vec<u8>,
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
        // A packed tensor is its blocks' bytes (`packed_shape`).
        _ => StDtype::U8,
    }
}

/// The shape a packed tensor of `shape` has in a file: its bytes, the last axis counted in
/// bytes (`[out, in]` of q4_0 is `[out, in / 32 · 18]`), so a row of the matrix is a row of
/// the file.
pub(super) fn packed_shape(dtype: DType, shape: &[usize]) -> Vec<usize> {
    let (len, bytes) = dtype.block().expect("a packed type");
    let mut s = shape.to_vec();
    if let Some(last) = s.last_mut() {
        *last = *last / len * bytes;
    }
    s
}

/// Metadata key prefix of a packed tensor's type and logical shape: a file stores a packed
/// tensor as U8 bytes (`packed_shape`), which alone cannot say which blocks they are, so
/// `mgn.packed.<name>` = `"q4_0[576, 576]"` (the language's spelling of the type) does.
pub const PACKED_KEY_PREFIX: &str = "mgn.packed.";

/// The metadata value naming a packed tensor's type and logical shape (`q4_0[576, 576]`).
pub(super) fn packed_entry(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", t.dtype, dims.join(", "))
}

/// A U8 tensor's bytes as the packed tensor its metadata entry (`q4_0[576, 576]`) describes,
/// after checking that the entry names a packed type, that the bytes are exactly that many
/// blocks, and that the file's shape is the entry's packed shape.
pub(super) fn packed_from_entry(
    name: &str,
    entry: &str,
    file_shape: &[usize],
    data: &[u8],
) -> Result<Tensor, String> {
    let bad = |why: String| format!("tensor `{name}`: its entry `{entry}` {why}");
    let (ty, dims) = entry
        .strip_suffix(']')
        .and_then(|s| s.split_once('['))
        .ok_or_else(|| bad("is not of the form `q4_0[576, 576]`".into()))?;
    let dtype = DType::from_name(ty.trim()).filter(|d| d.is_packed()).ok_or_else(|| {
        let names: Vec<&str> = mgn_ir::dtype::PACKED.iter().map(|d| d.name()).collect();
        bad(format!("names `{}`, not a packed type ({})", ty.trim(), names.join(", ")))
    })?;
    let shape = if dims.trim().is_empty() {
        Vec::new()
    } else {
        let parsed: Result<Vec<usize>, _> = dims.split(',').map(|d| d.trim().parse()).collect();
        parsed.map_err(|_| bad("has a shape that is not a list of sizes".into()))?
    };
    dtype.packs(&shape).map_err(|e| bad(format!("is not a packed shape: {e}")))?;
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let want = numel.and_then(|n| dtype.bytes_for(n));
    if want != Some(data.len()) {
        let want = want.map_or("an impossible number of".into(), |w| w.to_string());
        return Err(bad(format!("takes {want} bytes, but the file holds {}", data.len())));
    }
    let packed = packed_shape(dtype, &shape);
    if packed != file_shape {
        return Err(bad(format!(
            "is stored with the shape {packed:?}, but the file's tensor has {file_shape:?}"
        )));
    }
    Ok(Tensor::packed(dtype, shape, data.to_vec()))
}

/// Converts a host tensor to the bytes of its declared dtype.
pub(super) fn encode(name: &str, t: &Tensor) -> Result<Encoded, String> {
    let numel = t
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("tensor `{name}` has an impossible shape {:?}", t.shape))?;
    if let Data::Packed(b) = &t.data {
        if t.dtype.bytes_for(numel) != Some(b.len()) {
            return Err(format!(
                "tensor `{name}` has shape {:?} of {} but holds {} bytes",
                t.shape,
                t.dtype,
                b.len()
            ));
        }
        let shape = packed_shape(t.dtype, &t.shape);
        return Ok(Encoded { dtype: StDtype::U8, shape, bytes: b.clone() });
    }
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
        (packed, _) => {
            return Err(format!("tensor `{name}` is declared {packed} but holds no blocks"))
        }
    }
    debug_assert_eq!(bytes.len(), n);
    Ok(Encoded { dtype: st_dtype(t.dtype), shape: t.shape.clone(), bytes })
}

/// Converts one tensor's bytes (already checked by the parser to be exactly
/// `numel × element size` long) into host storage.
pub(super) fn decode(
    name: &str,
    dtype: StDtype,
    shape: &[usize],
    data: &[u8],
) -> Result<Tensor, String> {
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("tensor `{name}` has an impossible shape {shape:?}"))?;
    let size = match dtype {
        StDtype::F32 | StDtype::I32 | StDtype::U32 => 4,
        StDtype::F16 | StDtype::BF16 => 2,
        StDtype::I64 => 8,
        StDtype::BOOL => 1,
        other => {
            return Err(format!(
                "tensor `{name}` has dtype {other}, which mgn does not support \
                 (f32, f16, bf16, i32, i64, u32, bool)"
            ))
        }
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
                v.push(i32::try_from(x).map_err(|_| {
                    format!(
                        "tensor `{name}` (i64): element {i} is {x}, which does not fit the \
                         runtime's 32-bit integers"
                    )
                })?);
            }
            (DType::I64, Data::I32(v))
        }
        StDtype::U32 => {
            let mut v = Vec::with_capacity(numel);
            for (i, b) in chunks::<4>(data).enumerate() {
                let x = u32::from_le_bytes(b);
                v.push(i32::try_from(x).map_err(|_| {
                    format!(
                        "tensor `{name}` (u32): element {i} is {x}, which does not fit the \
                         runtime's 32-bit signed integers"
                    )
                })?);
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

#[cfg(test)]
mod tests {
    use super::super::testing::{parse, sample_bytes, with_header};
    use super::*;
    use safetensors::SafeTensors;

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
}
