//! Normalizations (layer, RMS, group, batch) with their derivatives, and dropout.

#[allow(unused_imports)]
use super::{broadcast_index, elementwise, load, store, strides, KernelSource, Operand};
use crate::plan::Step;

/// Kernels for the norms and their derivatives, and dropout with the CPU backend's mask (`cpu::dropout_keep`).
pub fn generate(step: &Step, inputs: &[Operand], out: &Operand, width: u32) -> Result<KernelSource, String> {
    let _ = (inputs, out, width);
    Err(format!("`{}` has no GPU kernel yet", step.op.describe()))
}
