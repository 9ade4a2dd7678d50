//! The plan rewrites a GPU session makes before it plans memory and generates kernels, in
//! order: attention statistics computed once (`attention_stats`), then element-wise fusion
//! (`fuse`). The CPU backend runs plans as compiled.

use crate::plan::Plan;

/// The plan the GPU runs, and for each of its steps the index of the step of `plan` it computes
/// (`u32::MAX` for an inserted statistics step). Dropout masks and error messages use those
/// indices, so they match the CPU's.
pub fn for_gpu(plan: &Plan) -> (Plan, Vec<u32>) {
    let (with_stats, original) = super::attention_stats::add_attention_stats(plan);
    let (fused, kept) = super::fuse::fuse_elementwise(&with_stats);
    let composed = kept.iter().map(|&k| original[k as usize]).collect();
    (fused, composed)
}
