//! The memory plan's own tests: live peaks and half weights' casts.

use super::*;
use mgn_ir::op::{BinaryOp, UnaryOp};
use mgn_ir::plan::{InitSpec, Mode, ParamSpec, Plan, SourceLoc, Step};
use mgn_ir::DType;

#[test]
fn peak_counts_what_is_alive_together() {
    let step = |op, inputs: Vec<u32>, shape: Vec<usize>| Step {
        op,
        inputs,
        dtype: DType::F32,
        shape,
        loc: SourceLoc::default(),
    };
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], vec![100]), // 400 B, last read by step 2
        step(Op::Param { index: 0 }, vec![], vec![100]),         // counted as a parameter
        step(Op::Binary(BinaryOp::Add), vec![0, 1], vec![100]),  // 400 B: x + w
        step(Op::Unary(UnaryOp::Relu), vec![2], vec![100]),      // 400 B; step 2 freed after
        step(Op::Unary(UnaryOp::Neg), vec![3], vec![10, 10]),    // 400 B, the output
    ];
    let w = ParamSpec {
        name: "w".into(),
        dtype: DType::F32,
        shape: vec![100],
        init: InitSpec::Constant(1.0),
        trainable: true,
        frozen: false,
        persistent: true,
    };
    let plan = Plan {
        params: vec![w],
        ..Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 4)])
    };
    let m = plan_memory(&GpuPlan::of(&plan));
    assert_eq!(m.param_bytes, 400);
    assert_eq!(m.input_bytes, 400);
    assert_eq!(m.logical_bytes, 1600);
    // Step 2 holds x and x + w (800); then x is freed; step 3 holds x + w and relu (800).
    assert_eq!(m.peak_live_bytes, 800);
}

/// The casts a product reads are rounded views, a training plan's casts of its parameters
/// as much as its activations' and an inference plan's.
#[test]
fn casts_a_product_reads_are_rounded_views() {
    for mode in [Mode::Train, Mode::Infer] {
        let plan = crate::test_util::half_product(DType::F16, mode);
        let rounded = rounded_views(&GpuPlan::of(&plan));
        assert_eq!(rounded, vec![false, false, true, true, false], "{mode:?}");
    }
}
