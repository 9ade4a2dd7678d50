//! The mgn runtime: what a compiled model needs at run time, and nothing of the compiler.
//! An app that embeds a plan links this crate alone.

pub mod checkpoint;
pub mod cpu;
pub mod dtype;
pub mod gpu;
pub mod init;
pub mod io;
pub mod limits;
pub mod memory;
pub mod op;
pub mod optim;
pub mod plan;
pub mod session;
pub mod tensor;

pub use dtype::DType;
pub use op::Op;
pub use plan::{Mode, Plan, Step};
pub use tensor::{Data, Tensor};
