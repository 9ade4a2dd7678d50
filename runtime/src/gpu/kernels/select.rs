//! Selection and attention: concat, slice, gather and their derivatives, reduce derivatives, argmax, rope, attention.

#[allow(unused_imports)]
use super::{broadcast_index, elementwise, load, store, strides, KernelSource, Operand};
use crate::plan::Step;

/// Kernels for concat, slice, gather, their derivatives, ReduceGrad, ArgMax, Rope, Attention and AttentionGrad.
pub fn generate(step: &Step, inputs: &[Operand], out: &Operand, width: u32) -> Result<KernelSource, String> {
    let _ = (inputs, out, width);
    Err(format!("`{}` has no GPU kernel yet", step.op.describe()))
}
