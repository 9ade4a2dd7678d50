//! The rewrites a GPU session makes before it plans memory and generates kernels, in order:
//! attention statistics computed once (`attention_stats`), norm weight derivatives and
//! cross-entropy losses split over rows (`norm_partials`, `loss_rows`), then element-wise
//! fusion (`fuse`). Each edits the [`Program`] by step id; positions are assigned once, at the
//! end. The CPU backend runs plans as compiled.

mod attention_stats;
mod fuse;
mod loss_rows;
mod norm_partials;

use crate::program::{GpuPlan, Program};
use mgn_ir::plan::Plan;

/// The program the GPU runs for `plan`. Its steps keep the compiled plan's numbers as ids, so
/// dropout masks and messages match the CPU's.
pub fn for_gpu(plan: &Plan) -> GpuPlan {
    let mut program = Program::new(plan);
    attention_stats::add_attention_stats(&mut program);
    norm_partials::split_norm_weight_grads(&mut program);
    loss_rows::split_cross_entropy(&mut program);
    fuse::fuse_elementwise(&mut program);
    program.to_gpu_plan()
}
