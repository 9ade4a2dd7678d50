//! Element types of tensors, and the packed block types of quantized weights.
//!
//! A packed type (`q8_0`, `q4_0`, `q4_1`, `q4_k`, `q6_k`) stores a tensor's elements in blocks
//! along its last axis, with ggml's (GGUF's) byte layout: a block of 32 or 256 values is a few
//! bytes of scales and the quantized values (`packed`). It has no size per element, only per
//! block, so a packed tensor's last axis must be a whole number of blocks (`DType::packs`). Only
//! parameters are packed: a plan reads one through `Op::Dequantize`, which gives its f32 values.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(non_camel_case_types)] // the names are ggml's, as users know them (`Q4_K`)
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    U32,
    Bool,
    /// 32 values: an f16 scale and 32 signed bytes.
    Q8_0,
    /// 32 values: an f16 scale and 32 nibbles with an offset of 8.
    Q4_0,
    /// 32 values: an f16 scale and minimum, and 32 nibbles.
    Q4_1,
    /// 256 values: f16 super-scales, 6-bit scales and minima of eight sub-blocks, 256 nibbles.
    Q4_K,
    /// 256 values: 6-bit values, 8-bit scales of sixteen sub-blocks, an f16 super-scale.
    Q6_K,
}

/// Every packed type, in the order `mgnc` lists them.
pub const PACKED: [DType; 5] = [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K];

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q4_K => "q4_k",
            DType::Q6_K => "q6_k",
        }
    }

    /// The type a name written in a model, a flag or a file denotes (`"q4_k"` → `Q4_K`).
    pub fn from_name(name: &str) -> Option<DType> {
        use DType::*;
        [F32, F16, BF16, I32, I64, U32, Bool, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K]
            .into_iter()
            .find(|d| d.name() == name)
    }

    /// Bytes per element as stored in buffers and checkpoints (`bool` is stored as one byte).
    /// A packed type has no size per element: this is its block's size divided by the block's
    /// length, rounded up, for estimates only; storage is `bytes_for`.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
            packed => {
                let (len, bytes) = packed.block().expect("a packed type");
                bytes.div_ceil(len)
            }
        }
    }

    /// A packed type's block: (values, bytes). `None` for an element type.
    pub fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            DType::Q8_0 => (32, 34),
            DType::Q4_0 => (32, 18),
            DType::Q4_1 => (32, 20),
            DType::Q4_K => (256, 144),
            DType::Q6_K => (256, 210),
            _ => return None,
        })
    }

    /// Whether values of this type are stored in blocks (`q8_0` … `q6_k`).
    pub fn is_packed(self) -> bool {
        self.block().is_some()
    }

    /// Bytes that `numel` elements of this type take: blocks for a packed type (`numel` must be
    /// a whole number of them; `None` if it is not), elements otherwise.
    pub fn bytes_for(self, numel: usize) -> Option<usize> {
        match self.block() {
            Some((len, bytes)) if numel % len == 0 => (numel / len).checked_mul(bytes),
            Some(_) => None,
            None => numel.checked_mul(self.size_bytes()),
        }
    }

    /// Bytes `numel` elements of this type take where they are stored: a packed type's whole
    /// blocks, or elements (`bytes_for`, saturating; for counts, not allocations).
    pub fn stored_bytes(self, numel: usize) -> usize {
        self.bytes_for(numel).unwrap_or(numel.saturating_mul(self.size_bytes()))
    }

    /// Whether a tensor of `shape` can be stored in this type: always for an element type; for
    /// a packed type, when it has at least one axis and its last axis is a whole number of
    /// blocks (so no block spans two rows). The error says why not.
    pub fn packs(self, shape: &[usize]) -> Result<(), String> {
        let Some((len, _)) = self.block() else { return Ok(()) };
        match shape.last() {
            None => Err(format!(
                "a `{self}` tensor needs an axis: it stores its values in blocks of {len} \
                 along the last"
            )),
            Some(&n) if n % len != 0 => Err(format!(
                "a `{self}` tensor stores blocks of {len} values along its last axis, which \
                 is {n} long: {n} is not a multiple of {len}"
            )),
            Some(_) => Ok(()),
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// A 16-bit float (`f16`, `bf16`): stored two to a 32-bit word on the GPU.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U32)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_storage() {
        assert_eq!(DType::F32.size_bytes(), 4);
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert_eq!(DType::I64.size_bytes(), 8);
        assert!(DType::F16.is_float() && !DType::I32.is_float());
    }

    #[test]
    fn packed_types_store_whole_blocks_of_their_last_axis() {
        assert_eq!(DType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(DType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(DType::Q8_0.bytes_for(33), None);
        assert_eq!(DType::F16.bytes_for(3), Some(6));
        assert!(DType::Q4_1.packs(&[3, 64]).is_ok());
        assert!(DType::Q4_1.packs(&[64, 3]).unwrap_err().contains("3 is not a multiple of 32"));
        assert!(DType::Q6_K.packs(&[]).is_err());
        assert!(!DType::Q8_0.is_float() && DType::Q8_0.is_packed() && !DType::F32.is_packed());
        for d in PACKED {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{}\"", d.name()));
        }
    }
}
