//! `name = tied(p)`: the field is `p`'s node under a second checkpoint name, recorded as an
//! alias; the training plan has one gradient for the one parameter, summed over both uses.

use crate::elab::tests::{build, param_names, plan};
use crate::graph::Op;
use crate::lower::PlanOptions;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::{Mode, ParamAlias};

const GPT: &str = "
use std.nn.{Embedding, TiedLinear}
model Lm(vocab: dim = 11, d: dim = 4) {
    input ids: i32[2, 3]
    transformer = Embedding(vocab, d)
    lm_head = TiedLinear(transformer.weight)
    forward {
        let logits = lm_head(transformer(ids))
        output logits
        loss mean(square(logits))
    }
}";

#[test]
fn a_tied_field_is_the_parameter_under_a_second_name() {
    let g = build(GPT, Mode::Train, &[]).expect("elaborates");
    assert_eq!(param_names(&g), ["transformer.weight"], "no parameter of its own");
    assert_eq!(g.aliases, [ParamAlias { name: "lm_head.weight".into(), param: 0 }]);
    // The head reads the embedding's own node.
    let param = g.params[0].node;
    let readers = g.nodes.iter().filter(|n| n.inputs.contains(&param)).count();
    assert!(readers >= 2, "the gather and the head's product read the one node");
    let plan = plan(GPT, &PlanOptions::train(&[], OptimizerSpec::default())).expect("lowers");
    assert_eq!(plan.aliases, [ParamAlias { name: "lm_head.weight".into(), param: 0 }]);
    assert_eq!(plan.grads.len(), 1, "one gradient, of the one parameter");
    assert!(plan.steps.iter().filter(|s| matches!(s.op, Op::Param { .. })).count() == 1);
}

#[test]
fn a_binding_named_tied_hides_the_builtin() {
    let text = "
fn tied(x: f32[4]) -> f32[4] { x * 2.0 }
model M {
    input x: f32[4]
    w = param f32[4] init ones
    v = tied(w)
    forward { output y = x * v }
}";
    let g = build(text, Mode::Infer, &[]).expect("elaborates");
    assert!(g.aliases.is_empty());
}

#[test]
fn only_saved_tensors_can_be_tied() {
    let field = |init: &str| {
        format!(
            "model M {{
                 input x: f32[4]
                 w = param f32[4] init ones
                 s = state f32[4]
                 b = buffer f32[4] init zeros
                 t = {init}
                 forward {{ output y = x * t }}
             }}"
        )
    };
    let g = build(&field("tied(b)"), Mode::Infer, &[]).expect("a buffer can be tied");
    assert_eq!(g.aliases, [ParamAlias { name: "t".into(), param: 2 }]);
    for (init, message) in [
        ("tied(s)", "found the state field `s`"),
        ("tied(w + 1.0)", "found a tensor f32[4] computed here"),
        ("tied(3)", "found an integer (3)"),
    ] {
        let d = build(&field(init), Mode::Infer, &[]).unwrap_err();
        assert_eq!(d.code, "E0201", "{init}");
        assert!(d.message.ends_with(message), "{init}: {}", d.message);
    }
}
