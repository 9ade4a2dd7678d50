//! The GPU side of the runtime: finding devices and their limits (`probe`). Kernels, buffers
//! and the dispatch plan come next (issue 4); they will run through blade on Vulkan and Metal.

pub mod device;
pub mod kernels;
pub mod session;
pub mod probe;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_select;
#[cfg(test)]
mod tests_conv;
#[cfg(test)]
mod tests_norm;
