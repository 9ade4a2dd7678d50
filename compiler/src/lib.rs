//! The mgn compiler: `.mgn` source to a checked graph, and the graph to a validated plan
//! (`mgn_ir::Plan`).
//!
//! Pipeline (data flows one way, each stage a module):
//! `source` (files, embedded stdlib) → `mgn_syntax::parse` → `front::load` (imports, scopes;
//! every name resolved once by `front::resolve`) → `front::names` (names that refer to
//! nothing, structure rules) → `elab` (values, types, shapes; builds the graph, reading what
//! names denote from the resolution) → `graph` (the graph and its dump). `render` turns
//! diagnostics into text or JSON, and `driver` strings the stages together for the CLI, the
//! tests and the language server. For plans: `autodiff` (the backward pass), `rewrite`
//! (greedy local rules, or egglog's equality saturation with the `egglog` feature) and `lower`
//! (live nodes as numbered steps, validated; last of all `precision`, the mixed precision
//! policy); `dynamic` builds a plan at the probe points of its
//! dynamic sizes and fits them into one plan over those sizes.

pub mod autodiff;
pub mod driver;
pub mod dynamic;
pub mod elab;
pub mod front;
pub mod graph;
pub mod lower;
pub mod precision;
pub mod quantize;
pub mod render;
pub mod rewrite;
pub mod source;

pub use driver::{
    check_path, check_path_as, check_text, check_text_with_overrides, Models, Outcome,
};
