//! Convolution, pooling and upsampling, forward and derivatives.

#[allow(unused_imports)]
use super::{broadcast_index, elementwise, load, store, strides, KernelSource, Operand};
use crate::plan::Step;

/// Kernels for conv1d/conv2d and their input/weight derivatives, max/avg pooling and its derivative, nearest upsampling and its derivative.
pub fn generate(step: &Step, inputs: &[Operand], out: &Operand, width: u32) -> Result<KernelSource, String> {
    let _ = (inputs, out, width);
    Err(format!("`{}` has no GPU kernel yet", step.op.describe()))
}
