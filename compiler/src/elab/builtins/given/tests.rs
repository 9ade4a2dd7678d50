//! `given(x)`, and the code it lets std.nn write: `scaled_dot_product_attention` adds a mask
//! only when there is one, and drops probabilities only in a training plan.

use crate::elab::tests::build;
use crate::graph::{Graph, Op};
use mgn_ir::plan::Mode;

fn model(call: &str) -> String {
    format!(
        "fn f(x: f32[4], m?: f32[4]) -> f32[4] {{
             if given(m) {{ x + m }} else {{ x * 2.0 }}
         }}
         model M(flag: bool = false) {{
             input x: f32[4]
             extra = param f32[4] init ones if flag
             forward {{ output y = {call} }}
         }}"
    )
}

fn ops(g: &Graph) -> Vec<String> {
    g.nodes.iter().map(|n| n.op.describe()).collect()
}

#[test]
fn given_tells_a_left_out_optional_from_a_value() {
    let left_out = build(&model("f(x)"), Mode::Infer, &[]).expect("elaborates");
    assert!(ops(&left_out).iter().any(|o| o.starts_with("mul")), "{:?}", ops(&left_out));
    let passed = build(&model("f(x, m = x)"), Mode::Infer, &[]).expect("elaborates");
    assert!(ops(&passed).iter().any(|o| o.starts_with("add")), "{:?}", ops(&passed));
    // An absent conditional field passed on counts as not given.
    let absent = build(&model("f(x, extra)"), Mode::Infer, &[]).expect("elaborates");
    assert!(ops(&absent).iter().any(|o| o.starts_with("mul")));
    let present = build(&model("f(x, extra)"), Mode::Infer, &["flag=true"]).expect("elaborates");
    assert!(ops(&present).iter().any(|o| o.starts_with("add")));
    let d = build(&model("x * float(given())"), Mode::Infer, &[]).unwrap_err();
    assert_eq!((d.code, d.message.as_str()), ("E0401", "`given` takes one argument, found 0"));
}

const MHA: &str = "
use std.nn.{MultiheadAttention}
model M(p: float = 0.1) {
    input x: f32[2, 6, 8]
    mha = MultiheadAttention(8, 2, dropout = p)
    forward {
        let y = mha(x, x, x)
        output y
        loss mean(y)
    }
}";

fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
    g.nodes.iter().filter(|n| f(&n.op)).count()
}

#[test]
fn attention_dropout_is_written_out_only_in_training_plans() {
    let train = build(MHA, Mode::Train, &[]).expect("elaborates");
    assert_eq!(count(&train, |o| matches!(o, Op::Dropout { .. })), 1, "{:?}", ops(&train));
    assert_eq!(count(&train, |o| matches!(o, Op::Attention { .. })), 0);
    let infer = build(MHA, Mode::Infer, &[]).expect("elaborates");
    assert_eq!(count(&infer, |o| matches!(o, Op::Attention { .. })), 1, "{:?}", ops(&infer));
    assert_eq!(count(&infer, |o| matches!(o, Op::Dropout { .. })), 0);
    // Without dropout nothing reads `training`: one graph serves both plans.
    let plain = build(MHA, Mode::Train, &["p=0.0"]).expect("elaborates");
    assert_eq!(plain.training, None);
    assert_eq!(count(&plain, |o| matches!(o, Op::Attention { .. })), 1);
}
