//! Rewrites of the graph IR, run before autodiff (fewer forward nodes to differentiate) and after
//! (autodiff's own redundancies). Two engines apply them, chosen per plan
//! (`PlanOptions::rewrites`, `mgnc build --rewrites none|greedy|egglog`):
//!
//! - `greedy` (the default, always built): five local rules applied in place to a fixed point;
//! - `egglog` (behind the `egglog` cargo feature): the same rules and more, written once as
//!   egglog rules (`rules.egg`), saturated within bounds and extracted with a cost model of
//!   bytes moved and dispatches (`egglog/`).
//!
//! `none` leaves the graph as elaboration and autodiff made it, to measure what the others do.

#[cfg(feature = "egglog")]
mod egglog;
mod greedy;

use crate::graph::Graph;
pub use greedy::simplify;

/// Which engine rewrites a plan's graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rewrites {
    /// No rewrites: the graph as elaborated and differentiated.
    None,
    /// The greedy local rules (`greedy.rs`).
    #[default]
    Greedy,
    /// Equality saturation through egglog (`egglog/`, `rules.egg`); needs the `egglog` feature.
    Egglog,
}

impl Rewrites {
    /// Whether this build has the engine (`Egglog` needs the `egglog` feature).
    pub const fn available(self) -> bool {
        match self {
            Rewrites::None | Rewrites::Greedy => true,
            Rewrites::Egglog => cfg!(feature = "egglog"),
        }
    }
}

/// Rewrites `g` with `engine`. Only the egglog engine can fail: when this build lacks it
/// (`lower` refuses that first, with E0502), or on an internal error, which names what went
/// wrong.
pub fn rewrite(g: &mut Graph, engine: Rewrites) -> Result<(), String> {
    match engine {
        Rewrites::None => Ok(()),
        Rewrites::Greedy => {
            simplify(g);
            Ok(())
        }
        #[cfg(feature = "egglog")]
        Rewrites::Egglog => egglog::saturate(g).map(drop),
        #[cfg(not(feature = "egglog"))]
        Rewrites::Egglog => Err("this build has no egglog engine (the `egglog` feature)".into()),
    }
}

/// An f32 node of `shape` for the engines' tests.
#[cfg(test)]
pub(crate) fn test_node(
    op: crate::graph::Op,
    inputs: Vec<u32>,
    shape: Vec<usize>,
) -> crate::graph::Node {
    crate::graph::Node {
        op,
        inputs: inputs.into_iter().map(crate::graph::NodeId).collect(),
        dtype: mgn_ir::DType::F32,
        shape,
        span: mgn_syntax::Span::default(),
        user_span: mgn_syntax::Span::default(),
        full_precision: crate::graph::Pin::No,
    }
}
