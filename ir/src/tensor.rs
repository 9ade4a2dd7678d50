//! Host tensors (a dtype, a shape and the elements), and what a run of a plan returns.
//!
//! Storage is wider than or equal to the declared dtype: `f16`/`bf16` live as `F32` on the CPU,
//! integer types and `bool` as `I32`; `F64` exists so gradient checks can run the same kernels
//! in double precision. A packed type (`q4_0` …) lives as its blocks' bytes (`Data::Packed`)
//! everywhere: that is the point of it.

use crate::DType;

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    /// The bytes of a packed type's blocks (`crate::packed`).
    Packed(Vec<u8>),
}

impl Data {
    /// The number of stored items: elements, or bytes of a packed tensor.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::Packed(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Tensor {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { dtype: DType::F32, shape, data: Data::F32(data) }
    }

    pub fn f64(shape: Vec<usize>, data: Vec<f64>) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { dtype: DType::F32, shape, data: Data::F64(data) }
    }

    pub fn i32(shape: Vec<usize>, data: Vec<i32>) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { dtype: DType::I32, shape, data: Data::I32(data) }
    }

    /// A packed tensor of `shape` from its blocks' bytes (`bytes` must be
    /// `dtype.bytes_for(numel)` long).
    pub fn packed(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Tensor {
        debug_assert_eq!(dtype.bytes_for(shape.iter().product()), Some(bytes.len()));
        Tensor { dtype, shape, data: Data::Packed(bytes) }
    }

    /// `values` (f32, of `shape`) quantized to the packed `dtype`; `shape`'s last axis must be
    /// whole blocks (`DType::packs`).
    pub fn quantized(dtype: DType, shape: Vec<usize>, values: &[f32]) -> Tensor {
        Tensor::packed(dtype, shape, crate::packed::quantize(dtype, values))
    }

    /// Zeros in the storage that suits `dtype` (floats as F32; a packed type as blocks of
    /// zeros, whose every scale is 0).
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        let data = if let Some(bytes) = dtype.bytes_for(n).filter(|_| dtype.is_packed()) {
            Data::Packed(vec![0; bytes])
        } else if dtype.is_float() {
            Data::F32(vec![0.0; n])
        } else {
            Data::I32(vec![0; n])
        };
        Tensor { dtype, shape, data }
    }

    /// A packed tensor's bytes.
    pub fn as_packed(&self) -> Option<&[u8]> {
        match &self.data {
            Data::Packed(v) => Some(v),
            _ => None,
        }
    }

    /// The tensor's values as f32: a packed one decoded, others as `to_f64_vec` narrowed.
    pub fn dequantized(&self) -> Vec<f32> {
        match &self.data {
            Data::Packed(b) => crate::packed::dequantize(self.dtype, b),
            Data::F32(v) => v.clone(),
            _ => self.to_f64_vec().into_iter().map(|x| x as f32).collect(),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_i32(&self) -> Option<&[i32]> {
        match &self.data {
            Data::I32(v) => Some(v),
            _ => None,
        }
    }

    /// Every element as f64 (for tests, reports and checks).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Packed(b) => {
                crate::packed::dequantize(self.dtype, b).into_iter().map(|x| x as f64).collect()
            }
        }
    }
}

/// What one run produced.
pub struct RunOutput {
    pub outputs: Vec<(String, Tensor)>,
    pub loss: Option<Tensor>,
    /// (parameter name, gradient) for each trained parameter, in plan order.
    pub grads: Vec<(String, Tensor)>,
}
