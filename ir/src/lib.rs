//! What every stage of mgn shares, and nothing heavy: element types (`dtype`), the public op
//! vocabulary (`op`), def-use over steps (`analysis`), the plan an app embeds and its file format (`plan`), the optimizer settings
//! and state a training plan carries (`optim`), the shape rules every stage applies (`shape`),
//! host tensors (`tensor`) and atomic file writes (`io`).
//!
//! The compiler produces plans of these types, the backends run them. The crate depends on no
//! GPU crate and on nothing of the compiler (a test in `tests/deps.rs` checks both).

pub mod analysis;
pub mod dtype;
pub mod io;
pub mod op;
pub mod optim;
pub mod plan;
pub mod shape;
pub mod tensor;

pub use dtype::DType;
pub use op::Op;
pub use plan::{Mode, Plan, Step};
pub use tensor::{Data, Tensor};
