//! The egglog engine (`--rewrites egglog`, the `egglog` cargo feature): the graph becomes an
//! e-graph (`encode`), the rules of `rules.egg` run on it within bounds, and each e-class's
//! cheapest term becomes the new graph (`extract`, `decode`).
//!
//! Bounds: at most [`MAX_ITERATIONS`] rounds of the rules, stopping early when the e-graph has
//! grown past [`MAX_GROWTH`] times its starting size or saturation has taken [`MAX_TIME`].
//! Whatever the e-graph holds when a bound stops it is sound — every merge the rules made is an
//! equality — so extraction proceeds from there. No rule builds a term larger than the one it
//! matched (no associativity or commutativity enumerating orders), so on every model in
//! `models/` the rules saturate in a few rounds, well within the bounds, and repeated blocks
//! (SmolLM2's 30 layers) cost their count times one block: linear in the graph.

mod decode;
mod encode;
mod extract;
mod names;
mod prims;
#[cfg(test)]
mod tests;

use crate::graph::Graph;
use egglog::EGraph;
use std::time::{Duration, Instant};

/// The rules, written once (`rules.egg`).
const RULES: &str = include_str!("../rules.egg");

/// Rounds of the rules at most.
pub const MAX_ITERATIONS: usize = 16;
/// The e-graph may grow to this many times the nodes inserted.
pub const MAX_GROWTH: usize = 4;
/// Saturation stops after this long: a guard no model in `models/` comes near (at most 50 ms
/// in a release build). A debug build runs egglog about ten times slower, and gets ten times
/// the time, so that tests see the plans a release build makes.
pub const MAX_TIME: Duration =
    Duration::from_millis(if cfg!(debug_assertions) { 2500 } else { 250 });

/// What one run of the engine did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Rounds of the rules run.
    pub iterations: usize,
    /// Whether the last round changed nothing (else a bound stopped it).
    pub saturated: bool,
    /// Rows in the e-graph when inserted and at the end.
    pub tuples: (usize, usize),
    /// Nodes before and after.
    pub nodes: (usize, usize),
}

/// Rewrites `g` through the e-graph; an error is an internal one (a rule file egglog refuses,
/// an extraction that cannot be ordered).
pub fn saturate(g: &mut Graph) -> Result<Report, String> {
    let start = Instant::now();
    let err = |e: egglog::Error| e.to_string();
    let mut eg = EGraph::default();
    // One thread: the result must not depend on scheduling, and CI has two cores.
    eg.set_num_threads(1);
    prims::register(&mut eg);
    eg.parse_and_run_program(Some("rules.egg".into()), RULES).map_err(err)?;
    let roots: Vec<u32> = (g.params.iter().map(|p| p.node.0))
        .chain(g.inputs.iter().map(|(_, id)| id.0))
        .chain(mgn_ir::analysis::Dataflow::results(g))
        .collect();
    let live = mgn_ir::analysis::needed(g, roots);
    let keys = encode::insert(&mut eg, g, &live).map_err(err)?;
    let mut report = Report { nodes: (g.nodes.len(), 0), ..Report::default() };
    let inserted = eg.num_tuples();
    while report.iterations < MAX_ITERATIONS {
        report.iterations += 1;
        if !eg.step_rules("rewrites").map_err(err)?.updated {
            report.saturated = true;
            break;
        }
        if eg.num_tuples() > MAX_GROWTH * inserted || start.elapsed() > MAX_TIME {
            break;
        }
    }
    report.tuples = (inserted, eg.num_tuples());
    let view = extract::View::read(&eg, g.nodes.len())?;
    let choice = extract::choose(&view, &keys);
    *g = decode::rebuild(g, &view, &choice, &keys)?;
    report.nodes.1 = g.nodes.len();
    Ok(report)
}
