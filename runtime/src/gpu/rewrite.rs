//! The plan rewrites a GPU session makes before it plans memory and generates kernels, in
//! order: attention statistics computed once (`attention_stats`), norm weight derivatives split
//! over chunks of rows (`norm_partials`), then element-wise fusion (`fuse`). The CPU backend runs
//! plans as compiled.

use crate::plan::Plan;

/// The plan the GPU runs, and for each of its steps the index of the step of `plan` it computes
/// (`u32::MAX` for an inserted statistics step). Dropout masks and error messages use those
/// indices, so they match the CPU's.
pub fn for_gpu(plan: &Plan) -> (Plan, Vec<u32>) {
    let (with_stats, original) = super::attention_stats::add_attention_stats(plan);
    let (split, of_stats) = super::norm_partials::split_norm_weight_grads(&with_stats);
    let (fused, kept) = super::fuse::fuse_elementwise(&split);
    // Back through each rewrite to `plan`'s indices; inserted steps map to u32::MAX.
    let back = |map: &[u32], k: u32| map.get(k as usize).copied().unwrap_or(u32::MAX);
    let composed = kept.iter().map(|&k| back(&original, back(&of_stats, k))).collect();
    (fused, composed)
}
