//! Host tensors (a dtype, a shape and the elements), and what a run of a plan returns.
//!
//! Storage is wider than or equal to the declared dtype: `f16`/`bf16` live as `F32` on the CPU,
//! integer types and `bool` as `I32`; `F64` exists so gradient checks can run the same kernels
//! in double precision.

use crate::DType;

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I32(v) => v.len(),
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

    /// Zeros in the storage that suits `dtype` (floats as F32).
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        let data = if dtype.is_float() { Data::F32(vec![0.0; n]) } else { Data::I32(vec![0; n]) };
        Tensor { dtype, shape, data }
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
