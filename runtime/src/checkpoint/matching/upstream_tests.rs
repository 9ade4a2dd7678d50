//! What PyTorch's checkpoints hold beyond one tensor per parameter: tied weights under
//! one name or two, counters older checkpoints lack, buffers computed from constants.

use super::*;
use mgn_ir::plan::{Mode, Step};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn spec(name: &str, dtype: DType, shape: &[usize], init: InitSpec, trainable: bool) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        init,
        trainable,
        frozen: false,
        persistent: true,
    }
}

/// A plan of GPT-2's tie (`lm_head.weight` an alias of `wte.weight`), a BatchNorm's
/// counter and a computed position table; no steps, as matching reads only the tables.
fn tied_plan() -> Plan {
    let table = InitSpec::Computed(vec![Step {
        op: mgn_ir::op::Op::Constant { value: 0.5 },
        inputs: vec![],
        dtype: DType::F32,
        shape: vec![2],
        loc: Default::default(),
    }]);
    let mut plan = Plan::of_steps(Mode::Train, vec![], vec![], vec![]);
    plan.params = vec![
        spec("wte.weight", DType::F32, &[3], InitSpec::Constant(0.0), true),
        spec("bn.running_mean", DType::F32, &[1], InitSpec::Constant(0.0), false),
        spec("bn.num_batches_tracked", DType::I64, &[], InitSpec::Constant(0.0), false),
        spec("pos.table", DType::F32, &[2], table, false),
    ];
    plan.aliases = vec![ParamAlias { name: "lm_head.weight".into(), param: 0 }];
    plan.counters = vec![2];
    plan
}

fn ckpt(tensors: Vec<(&str, Tensor)>) -> Checkpoint {
    let mut tensors: Vec<(String, Tensor)> =
        tensors.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Checkpoint { path: PathBuf::from("up.safetensors"), tensors, metadata: BTreeMap::new() }
}

fn wte(v: [f32; 3]) -> Tensor {
    Tensor::f32(vec![3], v.to_vec())
}

fn i64_scalar(n: i32) -> Tensor {
    Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![n]) }
}

/// Everything but the tie, as upstream saves it.
fn rest() -> Vec<(&'static str, Tensor)> {
    vec![
        ("bn.running_mean", Tensor::f32(vec![1], vec![0.25])),
        ("bn.num_batches_tracked", i64_scalar(7)),
        ("pos.table", Tensor::f32(vec![2], vec![3.0, 4.0])),
    ]
}

fn strict(ck: &Checkpoint) -> Result<(Vec<Option<Tensor>>, Report), CheckpointError> {
    match_plan(ck, &tied_plan(), MatchMode::Strict)
}

#[test]
fn a_tie_saved_under_both_names_loads_when_the_two_are_equal() {
    let mut t = rest();
    t.push(("wte.weight", wte([1.0, -0.0, 2.5])));
    t.push(("lm_head.weight", wte([1.0, -0.0, 2.5])));
    let (vals, report) = strict(&ckpt(t)).expect("a state_dict's tie loads strictly");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tied, vec![("lm_head.weight".to_string(), "wte.weight".to_string())]);
    assert!(report.unexpected.is_empty() && report.from_alias.is_empty(), "{report}");
    assert_eq!(vals[0].as_ref().unwrap(), &wte([1.0, -0.0, 2.5]));
    assert!(
        report
            .to_string()
            .contains("aliases equal to their parameter (1):\n  lm_head.weight = wte.weight"),
        "{report}"
    );
}

#[test]
fn a_tie_whose_names_hold_different_values_is_refused_naming_both() {
    // -0.0 and 0.0 compare equal as numbers; one tensor saved twice has the same bits.
    let mut t = rest();
    t.push(("wte.weight", wte([1.0, 0.0, 2.5])));
    t.push(("lm_head.weight", wte([1.0, -0.0, 2.5])));
    let e = strict(&ckpt(t.clone())).expect_err("an untied pair is refused").to_string();
    assert_eq!(
        e.lines().next().unwrap(),
        "up.safetensors: the checkpoint does not match the model's parameters: \
         `lm_head.weight` is tied to `wte.weight` in the model, but the file holds other \
         values under the two names (element 1: -0 in `lm_head.weight`, 0 in `wte.weight`)"
    );
    // Partial loading reports it and loads the parameter's own tensor.
    let (vals, report) =
        match_plan(&ckpt(t), &tied_plan(), MatchMode::Partial).expect("partial loads");
    assert_eq!(vals[0].as_ref().unwrap(), &wte([1.0, 0.0, 2.5]));
    assert_eq!(
        report.untied,
        vec![Untied {
            alias: "lm_head.weight".into(),
            param: "wte.weight".into(),
            note: "element 1: -0 in `lm_head.weight`, 0 in `wte.weight`".into()
        }]
    );
    assert!(!report.is_clean());
    let listed = "tied in the model but not in the checkpoint (1):\n  lm_head.weight differs \
                  from wte.weight";
    assert!(report.to_string().contains(listed), "{report}");
}

#[test]
fn a_tie_saved_under_the_alias_alone_loads_the_parameter_from_it() {
    let mut t = rest();
    t.push(("lm_head.weight", wte([4.0, 5.0, 6.0])));
    let (vals, report) = strict(&ckpt(t)).expect("save_pretrained may keep either name");
    assert!(report.is_clean(), "{report}");
    assert_eq!(vals[0].as_ref().unwrap(), &wte([4.0, 5.0, 6.0]));
    assert_eq!(report.from_alias, vec![("wte.weight".to_string(), "lm_head.weight".to_string())]);
    assert!(report.loaded.contains(&"wte.weight".to_string()), "{report}");
    // Neither name: the parameter is missing, under its own name.
    let e = strict(&ckpt(rest())).expect_err("no tensor for the tie").to_string();
    assert!(e.contains("`wte.weight` (f32[3]) is not in the file"), "{e}");
}

#[test]
fn an_alias_is_converted_and_checked_as_its_parameter() {
    // An f16 parameter: both names' f32 values rounded the same way, then compared.
    let mut plan = tied_plan();
    plan.params[0].dtype = DType::F16;
    let mut t = rest();
    t.push(("wte.weight", wte([0.1, 0.2, 0.3])));
    t.push(("lm_head.weight", Tensor { dtype: DType::F16, ..wte([0.1, 0.2, 0.3]) }));
    let (_, report) = match_plan(&ckpt(t), &plan, MatchMode::Strict).expect("equal once rounded");
    assert_eq!(report.tied.len(), 1, "{report}");
    assert_eq!(report.converted, vec![("wte.weight".to_string(), DType::F32, DType::F16)]);
    // A shape that is not the parameter's is a mismatch naming the alias and its tie.
    let mut t = rest();
    t.push(("wte.weight", wte([0.0; 3])));
    t.push(("lm_head.weight", Tensor::f32(vec![1, 3], vec![0.0; 3])));
    let e = strict(&ckpt(t)).expect_err("wrong shape").to_string();
    assert!(
        e.contains(
            "`lm_head.weight` is f32[1, 3] in the file but f32[3] in the model (tied to \
             `wte.weight`)"
        ),
        "{e}"
    );
}

#[test]
fn a_counter_loads_from_i64_or_i32_and_starts_afresh_when_absent() {
    let mut t = rest();
    t.push(("wte.weight", wte([0.0; 3])));
    let (vals, report) = strict(&ckpt(t.clone())).expect("loads");
    assert_eq!(vals[2].as_ref().unwrap(), &i64_scalar(7));
    assert!(report.counters_started.is_empty() && report.converted.is_empty(), "{report}");
    // An i32 count (another writer's choice) is converted, as PyTorch's copy_ would.
    t[1].1 = Tensor::i32(vec![], vec![9]);
    let (vals, report) = strict(&ckpt(t.clone())).expect("loads");
    assert_eq!(vals[2].as_ref().unwrap(), &i64_scalar(9));
    assert_eq!(
        report.converted,
        vec![("bn.num_batches_tracked".to_string(), DType::I32, DType::I64)]
    );
    // A checkpoint older than the counter: not refused, reported.
    t.remove(1);
    let (vals, report) = strict(&ckpt(t.clone())).expect("an older checkpoint loads");
    assert!(vals[2].is_none(), "the session starts it");
    assert_eq!(report.counters_started, vec!["bn.num_batches_tracked"]);
    assert!(report.is_clean() && report.missing.is_empty(), "{report}");
    assert!(
        report.to_string().contains(
            "counters not in the checkpoint, started at 0 (1):\n  bn.num_batches_tracked"
        ),
        "{report}"
    );
    // A float under its name is a mismatch, not a count.
    t.push(("bn.num_batches_tracked", Tensor::f32(vec![], vec![1.0])));
    let e = strict(&ckpt(t)).expect_err("a float count").to_string();
    assert!(e.contains("`bn.num_batches_tracked` is f32[] in the file but i64[]"), "{e}");
}

#[test]
fn a_computed_buffer_may_be_absent_but_no_other_tensor_may() {
    let mut t = rest();
    t.push(("wte.weight", wte([0.0; 3])));
    t.retain(|(n, _)| *n != "pos.table");
    let (vals, report) = strict(&ckpt(t.clone())).expect("a computed table is optional");
    assert!(vals[3].is_none(), "the session computes it");
    assert_eq!(report.computed, vec!["pos.table"]);
    assert!(report.is_clean() && report.missing.is_empty(), "{report}");
    assert!(
        report.to_string().contains("computed, not in the checkpoint (1):\n  pos.table"),
        "{report}"
    );
    // A buffer that is not computed (running statistics) is still required.
    t.retain(|(n, _)| *n != "bn.running_mean");
    let e = strict(&ckpt(t.clone())).expect_err("a buffer is missing").to_string();
    assert!(e.contains("`bn.running_mean` (f32[1]) is not in the file"), "{e}");
    assert!(e.contains("computed, not in the checkpoint (1):\n  pos.table"), "{e}");
    // As is a trainable parameter.
    t.retain(|(n, _)| *n != "wte.weight");
    t.push(("bn.running_mean", Tensor::f32(vec![1], vec![0.0])));
    let e = strict(&ckpt(t)).expect_err("a parameter is missing").to_string();
    assert!(e.contains("`wte.weight` (f32[3]) is not in the file"), "{e}");
}
