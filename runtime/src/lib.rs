//! The mgn runtime: what a compiled model needs at run time, and nothing of the compiler.
//! An app that embeds a plan links this crate alone.

pub mod checkpoint;
pub mod generate;
pub mod gpu;
pub mod init;
pub mod memory;
pub mod optim;
pub mod sample;
pub mod session;

pub use generate::Generator;
pub use gpu::set_cache_dir;
pub use mgn_ir::{DType, Data, Mode, Op, Plan, Step, Tensor};
pub use sample::{greedy, Sampler, SamplerConfig};
pub use session::{Restore, RunOutput, RuntimeError, SaveOptions, Session};
