//! The models that load an upstream `state_dict` unchanged (ViT-B/16, GPT-2 small,
//! MobileNetV3-Small) declare exactly its checkpoint names: every key of the state_dict, with
//! its dtype and shape, is a saved parameter, buffer or alias of the compiled plan, and the plan
//! saves nothing else. The upstream keys are data (`tests/fixtures/upstream/NAME.txt`, written
//! by `scripts/upstream_keys.py` from torchvision and transformers), so this runs without
//! PyTorch; bench/validate.sh checks the values against PyTorch on a GPU.

use mgn_compiler::driver::plan_path;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::optim::OptimizerSpec;
use mgn_runtime::Plan;
use mgn_tests::{rendered, root};
use std::collections::BTreeMap;
use std::path::Path;

/// name → "dtype [shape]", as the fixture writes it.
type Names = BTreeMap<String, String>;

fn upstream(name: &str) -> Names {
    let path = root().join(format!("tests/fixtures/upstream/{name}.txt"));
    let text = std::fs::read_to_string(&path).expect("the fixture");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (key, rest) = l.split_once(' ').expect("name dtype shape");
            (key.to_string(), rest.replace(", ", ","))
        })
        .collect()
}

fn compile(model: &str, train: bool) -> Plan {
    root();
    let opts = if train {
        PlanOptions::train(&[], OptimizerSpec::default())
    } else {
        PlanOptions::infer()
    };
    let (outcome, plan) = plan_path(Path::new(model), None, vec![], &opts).expect("readable");
    assert!(outcome.ok(), "{model}: {}", rendered(&outcome));
    plan.expect("a plan")
}

/// What a checkpoint of `plan` names: its saved parameters and buffers, and its aliases.
fn declared(plan: &Plan) -> Names {
    let sig = |p: &mgn_ir::plan::ParamSpec| {
        let dims: Vec<String> = p.shape.iter().map(|d| d.to_string()).collect();
        format!("{} [{}]", p.dtype, dims.join(","))
    };
    let mut names: Names =
        plan.params.iter().filter(|p| p.persistent).map(|p| (p.name.clone(), sig(p))).collect();
    for a in &plan.aliases {
        names.insert(a.name.clone(), sig(&plan.params[a.param]));
    }
    names
}

fn check(model: &str, fixture: &str, trainable: usize) {
    for train in [false, true] {
        let plan = compile(model, train);
        let (ours, theirs) = (declared(&plan), upstream(fixture));
        let only = |a: &Names, b: &Names| -> Vec<String> {
            a.iter()
                .filter(|(k, v)| b.get(*k) != Some(v))
                .map(|(k, v)| format!("{k} {v}"))
                .collect()
        };
        let (extra, missing) = (only(&ours, &theirs), only(&theirs, &ours));
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{model}: names differ from upstream's\n  only ours: {extra:?}\n  \
             only upstream's: {missing:?}"
        );
        let count: usize = plan.params.iter().filter(|p| p.trainable).map(|p| p.numel()).sum();
        assert_eq!(count, trainable, "{model}: trainable parameters");
        // Every batch norm's batches are counted (in training; inference plans list the
        // counters too, so that a checkpoint without them loads there).
        let mut counted: Vec<&str> =
            plan.counters.iter().map(|&p| plan.params[p].name.as_str()).collect();
        let tracked: Vec<&str> = theirs
            .keys()
            .filter(|k| k.ends_with("num_batches_tracked"))
            .map(|k| k.as_str())
            .collect();
        counted.sort();
        assert_eq!(counted, tracked, "{model}: counters");
    }
}

#[test]
fn vit_b_16_names_are_torchvisions() {
    check("models/vit_b_16.mgn", "vit_b_16", 86_567_656);
}

#[test]
fn gpt2_names_are_transformers_with_the_tied_head() {
    check("models/gpt2.mgn", "gpt2", 124_439_808);
}

#[test]
fn mobilenet_v3_small_names_are_torchvisions() {
    check("models/mobilenet_v3_small.mgn", "mobilenet_v3_small", 2_542_856);
}
