//! The GPU backend: a plan becomes WGSL kernels run through blade (Vulkan; Metal compiled,
//! never run here).
//!
//! In pipeline order: the GPU program and its private ops (`program`), the rewrites the GPU
//! makes to a compiled plan before anything else (`rewrite`: attention statistics, norm and
//! loss rows, fusion), the memory plan of one arena (`memory`), the dispatch order
//! (`schedule`), the kernels generated per step (`kernels`, with `halves` for f16 and bf16
//! values and `packed` for quantized parameters), the training updates (`update`)
//! and the state a run leaves for the next (`state`), and what each step asks of the
//! device (`work`, for a profile's roofline); then the device (`probe`, `limits`,
//! `device`) and the session that runs a plan on it (`session`); `dynamic` makes one program of a
//! plan over dynamic sizes.

pub mod device;
pub mod dynamic;
pub mod halves;
pub mod kernels;
pub mod limits;
pub mod memory;
pub mod packed;
pub mod probe;
pub mod program;
pub mod rewrite;
pub mod schedule;
pub mod session;
pub mod state;
pub mod taking_turns;
pub mod testing;
pub mod update;
pub mod work;

#[cfg(test)]
mod reference;
#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_attention;
#[cfg(test)]
mod tests_batch;
#[cfg(test)]
mod tests_cache;
#[cfg(test)]
mod tests_conv;
#[cfg(test)]
mod tests_matmul;
#[cfg(test)]
mod tests_norm;
#[cfg(test)]
mod tests_ops;
#[cfg(test)]
mod tests_packed;
#[cfg(test)]
mod tests_packed_plans;
#[cfg(test)]
mod tests_select;
#[cfg(test)]
mod tests_spatial;

pub use session::{ArenaSizes, GpuSession};

use std::fmt;

/// Why the GPU backend could not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuError {
    /// No usable device: no Vulkan loader or driver, no device that computes, `MGN_DEVICE`
    /// naming none, or a device that refused to open. The one error a test may skip on.
    NoDevice(String),
    /// A plan whose arena is past what the device holds (one storage binding, or its memory):
    /// the message names the largest values and what to do. A smaller plan may still run.
    TooLarge(String),
    /// Anything else: a plan the backend cannot run (an op without a kernel), a kernel naga or
    /// the driver rejects, a failure mid-run.
    Failed(String),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoDevice(why) => write!(f, "no usable GPU: {why}"),
            GpuError::TooLarge(why) | GpuError::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for GpuError {}
