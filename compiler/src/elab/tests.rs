//! Elaboration at the scale of real files: deep compile-time recursion and long flat
//! expressions, on the 2 MiB stack a test thread (or an embedding app's thread) has; and the
//! trace of an error raised deep inside calls.

use super::*;
use crate::front::{load::load, names};
use crate::source::Origin;

/// Loads `text`, checks its names and elaborates its only model, on a thread with the default
/// 2 MiB test stack: the evaluator must not need the large stack the driver gives it.
fn elaborate_on_small_stack(text: String) -> Result<Graph, Diagnostic> {
    let run = move || {
        let (prog, diags) = load("t.mgn".into(), Origin::Memory("t".into()), text);
        assert!(diags.is_empty(), "{diags:#?}");
        let diags = names::check(&prog);
        assert!(diags.is_empty(), "{diags:#?}");
        let (index, _) = models(&prog, prog.root)[0];
        elaborate(&prog, prog.root, index, &[])
    };
    let thread = std::thread::Builder::new().stack_size(2 << 20).spawn(run).unwrap();
    thread.join().expect("elaboration returns on a 2 MiB stack")
}

/// Loads `text`, checks its names and elaborates its only model for a plan of `mode` with
/// `settings`: what the evaluator's own tests build from.
pub(super) fn build(text: &str, mode: Mode, settings: &[&str]) -> Result<Graph, Diagnostic> {
    build_in(&program(text), mode, settings)
}

/// `text` loaded, its names checked clean.
pub(super) fn program(text: &str) -> Program {
    let (prog, diags) = load("t.mgn".into(), Origin::Memory("t".into()), text.to_string());
    assert!(diags.is_empty(), "{diags:#?}");
    let diags = names::check(&prog);
    assert!(diags.is_empty(), "{diags:#?}");
    prog
}

/// The only model of `prog` elaborated for a plan of `mode` with `settings`.
pub(super) fn build_in(prog: &Program, mode: Mode, settings: &[&str]) -> Result<Graph, Diagnostic> {
    let (index, _) = models(prog, prog.root)[0];
    let settings: Vec<Setting> = settings.iter().map(|s| s.parse().expect("name=value")).collect();
    elaborate_in(prog, prog.root, index, &settings, mode)
}

/// The plan `opts` asks for of the only model of `text`.
pub(super) fn plan(
    text: &str,
    opts: &crate::lower::PlanOptions,
) -> Result<mgn_ir::Plan, Diagnostic> {
    let prog = program(text);
    crate::lower::lower(build_in(&prog, opts.mode, &[])?, &prog.sources, opts)
}

/// The names of a graph's parameter table, in order.
pub(super) fn param_names(g: &Graph) -> Vec<&str> {
    g.params.iter().map(|p| p.name.as_str()).collect()
}

fn scan(steps: usize) -> String {
    format!(
        "fn scan(h: f32[B, d], x: f32[B, d], w: f32[d], n: int) -> f32[B, d] {{
             if n == 0 {{ h }} else {{ scan(tanh(h * w + x), x, w, n - 1) }}
         }}
         model Rnn {{
             input x: f32[2, 8]
             w = param f32[8] init normal(std = 0.1)
             forward {{ output y = scan(x, x, w, {steps}) }}
         }}"
    )
}

#[test]
fn a_recursive_scan_of_thousands_of_steps_elaborates_on_a_small_stack() {
    let g = elaborate_on_small_stack(scan(5_000)).expect("a 5,000-step scan elaborates");
    // Each step adds a product, a sum and a tanh.
    assert!(g.nodes.len() > 3 * 5_000, "{} nodes", g.nodes.len());
}

#[test]
fn recursion_that_never_ends_stops_at_the_limit_saying_how_deep() {
    let d = elaborate_on_small_stack(scan(eval::MAX_CALL_DEPTH + 5)).unwrap_err();
    assert_eq!(d.code, "E0601");
    assert!(d.message.contains("10,001 deep") && d.message.contains("limit is 10,000"), "{d:?}");
    // The trace: the model, then one step for the run of recursive calls.
    let counts: Vec<(StepKind, usize)> = d.trace().iter().map(|s| (s.kind, s.count)).collect();
    assert_eq!(counts, [(StepKind::Model, 1), (StepKind::Fn, eval::MAX_CALL_DEPTH - 1)]);
}

#[test]
fn a_flat_sum_of_thousands_of_terms_checks() {
    let terms = vec!["x"; 5_000].join(" + ");
    let text = format!("model Sum {{ input x: f32[4] forward {{ output y = {terms} }} }}");
    let g = elaborate_on_small_stack(text).expect("a 5,000-term sum elaborates");
    assert!(g.nodes.len() >= 5_000, "{} nodes", g.nodes.len());
}

#[test]
fn a_long_trace_keeps_both_ends_and_counts_what_it_leaves_out() {
    // Two functions calling each other: no run of equal steps to merge.
    let text = "fn ping(n: int) -> int { if n == 0 { 1 / 0 } else { pong(n - 1) } }
                fn pong(n: int) -> int { ping(n) }
                model M { input x: f32[2] forward { output y = x * ping(40) } }";
    let d = elaborate_on_small_stack(text.into()).unwrap_err();
    let kinds: Vec<StepKind> = d.trace().iter().map(|s| s.kind).collect();
    assert_eq!(kinds.len(), 17, "{kinds:?}");
    assert_eq!(kinds[0], StepKind::Model);
    assert_eq!(kinds[8], StepKind::Omitted);
    // The model, 81 calls (41 of ping, 40 of pong): 16 kept, 66 left out.
    assert_eq!(d.trace()[8].count, 82 - 16, "{:?}", d.trace());
    assert_eq!(d.trace().last().unwrap().name, "ping");
}
