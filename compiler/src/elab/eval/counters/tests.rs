//! `batch_norm`'s `tracked`: std.nn's batch norms count their steps in `num_batches_tracked`
//! (PyTorch's name, dtype and place), every plan lists each counter once (only training steps
//! count it), and no step may read or write one.

use crate::elab::tests::{build, param_names, plan};
use crate::lower::PlanOptions;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::Mode;
use mgn_ir::DType;

const TWICE: &str = "
use std.nn.{BatchNorm2d}
model M {
    input x: f32[2, 3, 4, 4]
    bn = BatchNorm2d(3)
    forward {
        let y = bn(bn(x))
        output y
        loss mean(y)
    }
}";

#[test]
fn std_batch_norms_count_their_steps_once_in_training_plans() {
    let g = build(TWICE, Mode::Train, &[]).expect("elaborates");
    assert_eq!(
        param_names(&g),
        ["bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    );
    let counter = &g.params[4];
    assert_eq!(
        (counter.dtype, counter.shape.as_slice(), counter.kind()),
        (DType::I64, &[][..], "buffer")
    );
    // Called twice, counted once: the session counts steps, not calls.
    assert_eq!(g.counters, [4]);
    let train = plan(TWICE, &PlanOptions::train(&[], OptimizerSpec::default())).expect("lowers");
    assert_eq!(train.counters, [4]);
    // Listed by the inference plan too (it never counts), so that a checkpoint without the
    // counter loads there as it does for training.
    let infer = plan(TWICE, &PlanOptions::infer()).expect("lowers");
    assert_eq!(infer.counters, [4]);
    // No step reads the counter.
    let node =
        |p: &mgn_ir::Plan| p.steps.iter().any(|s| matches!(s.op, mgn_ir::Op::Param { index: 4 }));
    assert!(!node(&train) && !node(&infer));
}

#[test]
fn a_counter_is_neither_read_nor_written_by_the_model() {
    let model = |statement: &str| {
        format!(
            "layer Norm(c: dim) {{
                 running_mean = buffer f32[c] init zeros
                 running_var = buffer f32[c] init ones
                 steps = buffer i64[] init zeros
                 forward(x: f32[N, c]) -> f32[N, c] {{
                     {statement}
                     batch_norm(x, self.running_mean, self.running_var, tracked = self.steps)
                 }}
             }}
             model M {{
                 input x: f32[4, 2]
                 bn = Norm(2)
                 forward {{ output y = bn(x) }}
             }}"
        )
    };
    for (statement, verb) in [
        ("self.steps = self.steps + 1", "read"),
        ("self.steps = full([], 7, dtype = i64)", "write"),
    ] {
        let d = build(&model(statement), Mode::Train, &[]).unwrap_err();
        assert_eq!(d.code, "E0201");
        let want = format!("`bn.steps` counts training steps: no step of the model may {verb} it");
        assert_eq!(d.message, want);
    }
    build(&model(""), Mode::Train, &[]).expect("counted and otherwise left alone");
}
