//! The mgn runtime: what a compiled model needs at run time, and nothing of the compiler.
//!
//! For now this crate holds the tensor element types shared by the compiler's IR and (next)
//! the plan format; an app that embeds a plan links this crate alone.

pub mod dtype;

pub use dtype::DType;
