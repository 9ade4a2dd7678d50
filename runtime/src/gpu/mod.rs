//! The GPU side of the runtime, through blade (Vulkan; Metal untested): devices and their
//! limits (`probe`), the device and its one arena (`device`), generated kernels (`kernels`),
//! the dispatch order (`schedule`), in-place training updates (`update`), the session that
//! runs a plan (`session`) and the plan rewrite it applies first (`attention_stats`).

pub mod attention_stats;
pub mod device;
pub mod fuse;
pub mod kernels;
pub mod loss_rows;
pub mod norm_partials;
pub mod probe;
pub mod rewrite;
pub mod schedule;
pub mod session;
pub mod update;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_conv;
#[cfg(test)]
mod tests_matmul;
#[cfg(test)]
mod tests_norm;
#[cfg(test)]
mod tests_select;
