//! ggml's tensor encodings decoded to f32: the plain floats (F32, F16, BF16) and the block
//! quantizations Q8_0, Q4_0, Q4_1 (32 values a block, one or two f16 constants) and the
//! k-quants Q4_K and Q6_K (256 values a block in sub-blocks with quantized scales).
//!
//! The block types are mgn's packed types (`mgn_ir::packed` holds their decoders, shared with
//! the backends); this module maps ggml's type ids to them.

use half::{bf16, f16};
use mgn_ir::DType;

/// The packed type of a ggml block type id.
pub fn packed(ggml_type: u32) -> Option<DType> {
    Some(match ggml_type {
        Q4_0 => DType::Q4_0,
        Q4_1 => DType::Q4_1,
        Q8_0 => DType::Q8_0,
        Q4_K => DType::Q4_K,
        Q6_K => DType::Q6_K,
        _ => return None,
    })
}

/// The ggml type id of a packed type.
pub fn ggml_type(dtype: DType) -> Option<u32> {
    [Q4_0, Q4_1, Q8_0, Q4_K, Q6_K].into_iter().find(|&t| packed(t) == Some(dtype))
}

/// The ggml type ids this module decodes.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;
pub const Q4_K: u32 = 12;
pub const Q6_K: u32 = 14;
pub const BF16: u32 = 30;

/// Values per block and bytes per block of a decodable type.
pub fn layout(ggml_type: u32) -> Option<(usize, usize)> {
    Some(match ggml_type {
        F32 => (1, 4),
        F16 | BF16 => (1, 2),
        Q4_0 => (32, 18),
        Q4_1 => (32, 20),
        Q8_0 => (32, 34),
        Q4_K => (256, 144),
        Q6_K => (256, 210),
        _ => return None,
    })
}

/// Decodes `bytes` (whole blocks of `ggml_type`) to f32; None for a type this module does not
/// decode. The caller has checked that `bytes` is a whole number of blocks.
pub fn dequantize(ggml_type: u32, bytes: &[u8]) -> Option<Vec<f32>> {
    let (n, size) = layout(ggml_type)?;
    if let Some(dtype) = packed(ggml_type) {
        return Some(mgn_ir::packed::dequantize(dtype, &bytes[..bytes.len() / size * size]));
    }
    let decode: fn(&[u8], &mut [f32]) = match ggml_type {
        F32 => |b, out| out[0] = f32::from_le_bytes(b.try_into().expect("4 bytes")),
        F16 => |b, out| out[0] = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        BF16 => |b, out| out[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        _ => return None,
    };
    let blocks = bytes.len() / size;
    let mut out = vec![0f32; blocks * n];
    for (block, values) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(n)) {
        decode(block, values);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_types_map_to_packed_types_and_back() {
        for id in [Q4_0, Q4_1, Q8_0, Q4_K, Q6_K] {
            let dtype = packed(id).expect("a block type");
            assert_eq!(ggml_type(dtype), Some(id));
            assert_eq!(layout(id), dtype.block());
        }
        assert_eq!((packed(F32), packed(F16), ggml_type(DType::F32)), (None, None, None));
    }

    #[test]
    fn unknown_types_are_not_decoded() {
        assert!(dequantize(13, &[0; 176]).is_none());
    }
}
