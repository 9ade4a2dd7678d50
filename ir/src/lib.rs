//! What every stage of mgn shares, and nothing heavy (serde, libm for `erf`, half for the
//! packed types' scales):
//!
//! - `dtype`: element types and packed (quantized) types; `packed`: the packed types' bytes;
//! - `tensor`: host tensors and what a run returns;
//! - `op`: the public op vocabulary; `pointwise`: its point-wise functions and derivatives;
//! - `shape`: the shape rules every stage applies; `infer`: each op's typing rule on them;
//! - `plan`: the plan an app embeds and its file format; `valid`: the plan validator;
//! - `dynamic`: plans over dynamic sizes (polynomial sites, fitting, the plan at given sizes);
//! - `optim`: the optimizer settings and state a training plan carries;
//! - `precision`: the precision policy (f32, mixed f16/bf16) and dynamic loss scaling;
//! - `analysis`: def-use over steps (readers, results, last uses);
//! - `io`: atomic file writes; `hash`: a hash stable across builds; `units`: sizes for people.
//!
//! The compiler produces plans of these types, the backends run them. The crate depends on no
//! GPU crate and on nothing of the compiler (`tests/architecture.rs` checks both).

pub mod analysis;
pub mod dtype;
pub mod dynamic;
pub mod hash;
pub mod infer;
pub mod io;
pub mod op;
pub mod optim;
pub mod packed;
pub mod plan;
pub mod pointwise;
pub mod precision;
pub mod shape;
pub mod tensor;
pub mod units;
pub mod valid;

pub use dtype::DType;
pub use op::Op;
pub use plan::{Mode, Plan, Step};
pub use tensor::{Data, Tensor};
