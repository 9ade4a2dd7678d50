//! `training`: a compile-time bool, true while a training plan is built. A graph that reads it
//! is made for one mode; `mgnc check` elaborates such a model in both; a binding shadows it.

use super::tests::build;
use crate::driver::{check_text, Models};
use crate::graph::Op;
use crate::lower::{lower, PlanOptions};
use crate::source::Origin;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::Mode;

const DROPPED: &str = "
model M(p: float = 0.25) {
    input x: f32[2, 4]
    w = param f32[4, 4] init ones
    forward {
        let h = x @ w
        let y = if training { dropout(h, p) * 2.0 } else { h }
        output y
        loss mean(y)
    }
}";

fn ops(g: &crate::graph::Graph) -> Vec<String> {
    g.nodes.iter().map(|n| n.op.describe()).collect()
}

#[test]
fn each_mode_elaborates_its_own_branch_and_the_graph_says_which() {
    let infer = build(DROPPED, Mode::Infer, &[]).expect("elaborates");
    let train = build(DROPPED, Mode::Train, &[]).expect("elaborates");
    assert_eq!(infer.training, Some(false));
    assert_eq!(train.training, Some(true));
    assert!(!infer.nodes.iter().any(|n| matches!(n.op, Op::Dropout { .. })), "{:?}", ops(&infer));
    assert!(train.nodes.iter().any(|n| matches!(n.op, Op::Dropout { .. })), "{:?}", ops(&train));
    // A model that never reads it serves both modes.
    let plain = DROPPED.replace("if training {", "if false {");
    assert_eq!(build(&plain, Mode::Train, &[]).expect("elaborates").training, None);
}

#[test]
fn a_binding_named_training_shadows_the_builtin() {
    let text = "
layer Gate(training: bool) {
    forward(x: f32[4]) -> f32[4] { if training { x * 2.0 } else { x } }
}
model M {
    input x: f32[4]
    gate = Gate(true)
    forward { output y = gate(x) }
}";
    let g = build(text, Mode::Infer, &[]).expect("elaborates");
    assert_eq!(g.training, None, "the config parameter, not the builtin, was read");
    assert!(g.nodes.iter().any(|n| n.op.describe().starts_with("mul")), "{:?}", ops(&g));
}

#[test]
fn a_graph_for_one_mode_is_not_lowered_into_the_other() {
    let infer = build(DROPPED, Mode::Infer, &[]).expect("elaborates");
    let outcome =
        check_text("m.mgn".into(), Origin::Memory("m".into()), DROPPED.into(), Models::All);
    let opts = PlanOptions::train(&[], OptimizerSpec::default());
    let d = lower(infer, &outcome.program.sources, &opts).unwrap_err();
    assert_eq!(d.code, "E0999");
    assert!(d.message.contains("elaborated for an inference plan"), "{}", d.message);
}

#[test]
fn check_elaborates_a_model_that_reads_training_in_both_modes() {
    let broken = DROPPED.replace("dropout(h, p) * 2.0", "dropout(h, p) @ x");
    let outcome = check_text("m.mgn".into(), Origin::Memory("m".into()), broken, Models::All);
    let d = outcome.diagnostics.first().expect("the training branch's error");
    assert_eq!(d.code, "E0204");
    assert!(d.notes.iter().any(|n| n.contains("in the training plan")), "{:?}", d.notes);
    assert_eq!(outcome.graphs.len(), 0);
    let clean = check_text("m.mgn".into(), Origin::Memory("m".into()), DROPPED.into(), Models::All);
    assert!(clean.ok());
    assert_eq!(clean.graphs[0].training, Some(false), "the inference graph is the one kept");
}
