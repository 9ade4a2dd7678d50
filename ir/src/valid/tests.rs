//! Broken plans as data: each row edits a small valid plan one way and names the words the
//! validator's refusal must contain.

use crate::dtype::DType;
use crate::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::plan::{InitSpec, Mode, ParamSpec, Plan, SourceLoc, Step};

/// `y = relu(x + w)`, `loss = sum(y)`, with the gradient of `w` (as autodiff would shape it).
fn plan() -> Plan {
    let f = DType::F32;
    let step = |op, inputs: Vec<u32>, dtype, shape: Vec<usize>| Step {
        op,
        inputs,
        dtype,
        shape,
        loc: SourceLoc { file: "m.mgn".into(), line: 3, column: 5 },
    };
    let w = ParamSpec {
        name: "w".into(),
        dtype: f,
        shape: vec![4],
        init: InitSpec::Constant(1.0),
        trainable: true,
        frozen: false,
        persistent: true,
    };
    Plan {
        params: vec![w],
        loss: Some(4),
        grads: vec![(0, 6)],
        ..Plan::of_steps(
            Mode::Train,
            vec![
                step(Op::Input { name: "x".into() }, vec![], f, vec![2, 4]),
                step(Op::Param { index: 0 }, vec![], f, vec![4]),
                step(Op::Binary(BinaryOp::Add), vec![0, 1], f, vec![2, 4]),
                step(Op::Unary(UnaryOp::Relu), vec![2], f, vec![2, 4]),
                step(
                    Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdim: false },
                    vec![3],
                    f,
                    vec![],
                ),
                step(Op::BroadcastTo, vec![4], f, vec![2, 4]),
                step(Op::SumTo, vec![5], f, vec![4]),
            ],
            vec![("x".into(), 0)],
            vec![("y".into(), 3)],
        )
    }
}

#[test]
fn the_base_plan_is_valid() {
    plan().validate().expect("valid");
}

#[test]
fn broken_plans_are_refused_with_a_reason() {
    type Edit = fn(&mut Plan);
    let rows: &[(Edit, &str)] = &[
        (|p| p.steps[2].inputs = vec![0, 2], "not computed before it"),
        (|p| p.steps[1].op = Op::Param { index: 5 }, "parameter 5"),
        (|p| p.steps[1].shape = vec![5], "parameter `w` is f32[4] but the step says f32[5]"),
        (|p| p.steps[1].dtype = DType::F16, "parameter `w` is f32[4] but the step says f16[4]"),
        (|p| p.outputs[0].1 = 99, "value 99"),
        (|p| p.inputs.clear(), "does not name"),
        (|p| p.inputs.push(("w".into(), 1)), "not an input"),
        (|p| p.inputs.push(("x".into(), 0)), "listed twice"),
        (|p| p.steps[3].shape = vec![1 << 30, 1 << 30], "impossible shape"),
        (|p| p.steps[5].dtype = DType::F16, "the result is f16[2, 4], but it carries f32[]"),
        (|p| p.steps[6].dtype = DType::F16, "the result is f16[4], but it carries f32[2, 4]"),
        (|p| p.params.push(p.params[0].clone()), "two parameters are named `w`"),
        (|p| p.loss = None, "trains parameters without a loss"),
        (
            |p| p.params[0].init = InitSpec::Uniform { low: -1.7e308, high: 1.7e308 },
            "does not draw finite values",
        ),
        (|p| p.params[0].init = InitSpec::Normal { mean: 0.0, std: -1.0 }, "finite values"),
        (|p| p.params[0].init = InitSpec::Constant(f64::INFINITY), "finite values"),
        (|p| p.steps[2].inputs = vec![0], "takes 2 input(s), not 1"),
        // Types: every step by its op's rule, with the step and its model line.
        (|p| p.steps[3].shape = vec![4, 2], "step 3 (`relu`, from m.mgn:3:5)"),
        (|p| p.steps[2].dtype = DType::I32, "the inputs give f32[2, 4]"),
        // A step's dtype edited from f32 to bool (it used to run).
        (|p| p.steps[3].dtype = DType::Bool, "the result is bool[2, 4], but the inputs give f32"),
        (|p| p.steps[0].dtype = DType::I32, "operands of one dtype"),
        (|p| p.steps[6].shape = vec![3], "does not broadcast"),
        (|p| p.steps[4].shape = vec![1], "the inputs give f32[]"),
        // Results.
        (|p| p.loss = Some(3), "not a float scalar"),
        (|p| p.grads = vec![(0, 3)], "the gradient of `w` (step 3) is f32[2, 4]"),
        (|p| p.grads.push((0, 6)), "two gradients"),
        (|p| p.params[0].trainable = false, "not trainable"),
        (
            |p| p.steps[6].op = Op::DropoutGrad { p: 0.5, forward: 3 },
            "derives step 3, not an earlier dropout",
        ),
        // Loss scaling: the scale is an untrained, unsaved f32[] in a plan with gradients.
        (|p| p.loss_scaling = Some(scaling(7)), "names parameter 7, but there are 2"),
        (|p| p.params[1].persistent = true, "neither trained nor saved"),
        (|p| p.params[1].shape = vec![1], "f32[1]"),
        (|p| p.params[1].trainable = true, ", trained"),
        (|p| p.grads.clear(), "no loss or no gradients"),
        (|p| p.loss_scaling.as_mut().unwrap().init = 0.0, "must be positive"),
    ];
    for (k, (edit, words)) in rows.iter().enumerate() {
        let mut p = plan();
        if k >= rows.len() - 6 {
            with_loss_scale(&mut p);
            p.validate().expect("the loss-scaled plan is valid before the edit");
        }
        edit(&mut p);
        let e = p.validate().expect_err(&format!("row {k} must be refused"));
        assert!(e.contains(words), "row {k}: `{e}` lacks `{words}`");
    }
}

fn scaling(param: usize) -> crate::precision::LossScaling {
    crate::precision::LossScaling { param, init: 1024.0, growth_interval: 10 }
}

/// The base plan with a loss scale parameter (unread: only its declaration is checked here).
fn with_loss_scale(p: &mut Plan) {
    p.params.push(ParamSpec {
        name: "mgn.loss_scale".into(),
        dtype: DType::F32,
        shape: vec![],
        init: InitSpec::Constant(1024.0),
        trainable: false,
        frozen: false,
        persistent: false,
    });
    p.loss_scaling = Some(scaling(1));
}

#[test]
fn plan_files_with_unknown_ops_or_bad_types_are_refused_when_read() {
    let good = String::from_utf8(plan().to_bytes()[20..].to_vec()).expect("JSON");
    // Edited bodies under a checksum of their own (what a hand-built plan is to the validator).
    let file = |json: &str| {
        let b = crate::plan::file_bytes(json.as_bytes());
        Plan::from_bytes(&b, "edited.mgnplan").map(drop).unwrap_err().to_string()
    };
    // An op that never existed, and one that only the GPU backend makes: neither is in the
    // format.
    for op in ["Teleport", "CrossEntropyRows"] {
        let unknown = good.replacen("{\"Unary\":\"Relu\"}", &format!("\"{op}\""), 1);
        let e = file(&unknown);
        let want = format!("edited.mgnplan: corrupt plan: unknown op or value `{op}`");
        assert!(e.starts_with(&want), "{e}");
    }
    let unknown = good.replacen("\"Unary\":\"Relu\"", "\"Teleport\":\"Relu\"", 1);
    let e = file(&unknown);
    assert!(e.starts_with("edited.mgnplan: corrupt plan: unknown op or value `Teleport`"), "{e}");
    assert!(!e.contains("expected one of"), "no list of every op: {e}");
    let mistyped = good.replacen("\"shape\":[2,4]", "\"shape\":[2,5]", 1);
    let e = file(&mistyped);
    assert!(e.contains("edited.mgnplan: invalid plan: step 0") || e.contains("step 2"), "{e}");
}

/// `sin(cast(arange(4)))`: a computed init of `w`'s type f32[4].
fn computed() -> Vec<Step> {
    let step = |op, inputs: Vec<u32>, dtype, shape: Vec<usize>| Step {
        op,
        inputs,
        dtype,
        shape,
        loc: SourceLoc { file: "m.mgn".into(), line: 2, column: 9 },
    };
    vec![
        step(Op::Arange, vec![], DType::I32, vec![4]),
        step(Op::Cast, vec![0], DType::F32, vec![4]),
        step(Op::Unary(UnaryOp::Sin), vec![1], DType::F32, vec![4]),
    ]
}

#[test]
fn computed_inits_are_typed_constants_of_the_tensors_type() {
    let mut good = plan();
    good.params[0].init = InitSpec::Computed(computed());
    good.validate().expect("valid");
    type Edit = fn(&mut Vec<Step>);
    let rows: &[(Edit, &str)] = &[
        (|s| s.clear(), "the init of `w`: it has no steps"),
        (|s| s[2].inputs = vec![2], "not computed before it"),
        (|s| s[0].op = Op::Input { name: "x".into() }, "step 0 (`input x`"),
        (|s| s[0].op = Op::Param { index: 0 }, "is not a constant"),
        (|s| s[2].shape = vec![5], "step 2 (`sin`, from m.mgn:2:9)"),
        (|s| s.truncate(1), "it computes i32[4], but the tensor is f32[4]"),
        (|s| s[0].shape = vec![1 << 30, 1 << 30], "impossible shape"),
    ];
    for (k, (edit, words)) in rows.iter().enumerate() {
        let mut steps = computed();
        edit(&mut steps);
        let mut p = plan();
        p.params[0].init = InitSpec::Computed(steps);
        let e = p.validate().expect_err(&format!("row {k} must be refused"));
        assert!(e.contains(words), "row {k}: `{e}` lacks `{words}`");
    }
}

#[test]
fn only_const_tensors_say_they_are_not_persistent() {
    let mut p = plan();
    let json = String::from_utf8(p.to_bytes()[20..].to_vec()).expect("JSON");
    assert!(!json.contains("persistent"), "persistent tensors keep the old format: {json}");
    p.params[0].persistent = false;
    p.params[0].trainable = false;
    p.grads.clear();
    let back = Plan::from_bytes(&p.to_bytes(), "p.mgnplan").expect("reads back");
    assert!(!back.params[0].persistent);
}

#[test]
fn state_writes_replace_untrained_tensors_once_with_their_type() {
    let writable = || {
        let mut p = plan();
        p.params[0].trainable = false;
        p.grads.clear();
        p.loss = None;
        p.mode = Mode::Infer;
        p
    };
    let mut good = writable();
    good.state_writes = vec![(0, 6)];
    good.validate().expect("a [4] value written into a [4] buffer");
    let back = Plan::from_bytes(&good.to_bytes(), "p.mgnplan").expect("reads back");
    assert_eq!(back.state_writes, vec![(0, 6)]);
    type Edit = fn(&mut Plan);
    let rows: &[(Edit, &str)] = &[
        (|p| p.state_writes = vec![(3, 6)], "names parameter 3, but there are 1"),
        (|p| p.state_writes = vec![(0, 60)], "names value 60, but there are 7"),
        (|p| p.state_writes = vec![(0, 3)], "`w` is f32[4], but the step written into it"),
        (|p| p.state_writes = vec![(0, 6), (0, 6)], "`w` is written twice in one run"),
        (|p| p.params[0].trainable = true, "`w` is trained, so a run may not overwrite it"),
    ];
    for (k, (edit, words)) in rows.iter().enumerate() {
        let mut p = writable();
        p.state_writes = vec![(0, 6)];
        edit(&mut p);
        let e = p.validate().expect_err(&format!("row {k} must be refused"));
        assert!(e.contains(words), "row {k}: `{e}` lacks `{words}`");
    }
}

#[test]
fn aliases_name_a_saved_parameter_by_a_free_name() {
    let alias = |name: &str, param| crate::plan::ParamAlias { name: name.into(), param };
    let mut good = plan();
    good.aliases = vec![alias("head.weight", 0)];
    good.validate().expect("one alias of `w`");
    let back = Plan::from_bytes(&good.to_bytes(), "p.mgnplan").expect("reads back");
    assert_eq!(back.aliases, good.aliases);
    type Edit = fn(&mut Plan);
    let rows: &[(Edit, &str)] = &[
        (|p| p.aliases[0].param = 2, "names parameter 2, but there are 1"),
        (|p| p.aliases[0].name = "w".into(), "alias `w` of `w` is a name taken twice"),
        (|p| p.aliases.push(p.aliases[0].clone()), "a name taken twice"),
        (|p| p.params[0].persistent = false, "which is never saved or loaded"),
    ];
    for (k, (edit, words)) in rows.iter().enumerate() {
        let mut p = good.clone();
        edit(&mut p);
        let e = p.validate().expect_err(&format!("row {k} must be refused"));
        assert!(e.contains(words), "row {k}: `{e}` lacks `{words}`");
    }
}

#[test]
fn counters_are_integer_scalar_buffers_counted_once() {
    let mut good = plan();
    good.params.push(ParamSpec {
        name: "bn.num_batches_tracked".into(),
        dtype: DType::I64,
        shape: vec![],
        init: InitSpec::Constant(0.0),
        trainable: false,
        frozen: false,
        persistent: true,
    });
    good.counters = vec![1];
    good.validate().expect("an i64[] buffer counts steps");
    let back = Plan::from_bytes(&good.to_bytes(), "p.mgnplan").expect("reads back");
    assert_eq!(back.counters, vec![1]);
    type Edit = fn(&mut Plan);
    let rows: &[(Edit, &str)] = &[
        (|p| p.counters = vec![4], "names parameter 4, but there are 2"),
        (|p| p.counters = vec![0], "counter `w` is f32[4], trained"),
        (|p| p.params[1].shape = vec![2], "an integer buffer of one element"),
        (|p| p.params[1].dtype = DType::F32, "an integer buffer of one element"),
        (|p| p.counters = vec![1, 1], "is counted twice"),
        (
            |p| {
                let read = Step { op: Op::Param { index: 1 }, ..p.steps[1].clone() };
                p.steps.push(Step { dtype: DType::I64, shape: vec![], ..read });
            },
            "step 7 (from m.mgn:3:5) reads counter `bn.num_batches_tracked`",
        ),
    ];
    for (k, (edit, words)) in rows.iter().enumerate() {
        let mut p = good.clone();
        edit(&mut p);
        let e = p.validate().expect_err(&format!("row {k} must be refused"));
        assert!(e.contains(words), "row {k}: `{e}` lacks `{words}`");
    }
}

/// Any change to a plan file made outside mgnc is refused by its checksum, whatever the change
/// keeps consistent: a rewired step, a swapped parameter, a changed dtype.
#[test]
fn plan_files_changed_after_mgnc_wrote_them_are_refused() {
    let good = plan().to_bytes();
    Plan::from_bytes(&good, "p.mgnplan").expect("reads back");
    let body = String::from_utf8(good[20..].to_vec()).expect("JSON");
    for (from, to) in [("\"inputs\":[0,1]", "\"inputs\":[1,0]"), ("\"f32\"", "\"f16\"")] {
        let edited = body.replacen(from, to, 1);
        assert_ne!(edited, body, "{from} is in the body");
        let mut b = good[..20].to_vec();
        b.extend(edited.as_bytes());
        let e = Plan::from_bytes(&b, "p.mgnplan").unwrap_err().to_string();
        assert!(e.contains("p.mgnplan: the plan is not the one mgnc wrote"), "{e}");
    }
    let e = Plan::from_bytes(&good[..16], "p.mgnplan").unwrap_err().to_string();
    assert!(e.contains("cut short"), "{e}");
}
