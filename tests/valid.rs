//! Valid programs: every model, stdlib module and test program checks clean, and the IR of
//! the digits MLP is pinned as a golden dump.

use mgn_compiler::graph::dump::dump;
use mgn_compiler::{check_path, Models};
use mgn_tests::{check, compare_golden, mgn_files, rendered, root};
use std::path::Path;

fn assert_clean(dir: &str, min: usize) -> usize {
    let files = mgn_files(dir);
    assert!(files.len() >= min, "expected at least {min} files in {dir}, found {}", files.len());
    let mut graphs = 0;
    for f in &files {
        let outcome = check(f);
        assert!(outcome.ok(), "{} should check clean:\n{}", f.display(), rendered(&outcome));
        graphs += outcome.graphs.len();
    }
    graphs
}

#[test]
fn models_check_clean_and_elaborate() {
    let graphs = assert_clean("models", 4);
    assert!(graphs >= 4);
}

#[test]
fn stdlib_checks_clean() {
    assert_clean("stdlib", 4);
}

#[test]
fn test_programs_check_clean() {
    assert_clean("tests/valid", 10);
}

#[test]
fn digits_mlp_ir_matches_golden_dump() {
    root();
    let outcome = check_path(
        Path::new("models/digits_mlp.mgn"),
        Models::One { name: None, settings: vec![] },
    )
    .expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let text = dump(&outcome.graphs[0], &outcome.program.sources);
    if let Some(diff) = compare_golden(Path::new("tests/ir/digits_mlp.ir"), &text) {
        panic!("{diff}");
    }
}

#[test]
fn set_overrides_model_arguments() {
    root();
    let settings = vec!["T=1".parse().expect("valid setting")];
    let outcome =
        check_path(Path::new("models/tiny_gpt.mgn"), Models::One { name: None, settings })
            .expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let g = &outcome.graphs[0];
    let (_, tokens) =
        g.inputs.iter().find(|(n, _)| n == "tokens").expect("tiny_gpt has a tokens input");
    assert_eq!(g.node(*tokens).shape[1], 1, "--set T=1 gives the one-token graph");
    assert!(g.config.iter().any(|(k, v)| k == "T" && v == "1"));
}

#[test]
fn every_node_points_at_a_user_line() {
    root();
    for f in mgn_files("models") {
        let outcome = check(&f);
        for g in &outcome.graphs {
            for (i, n) in g.nodes.iter().enumerate() {
                let file = outcome.program.sources.get(n.user_span.file);
                assert!(
                    file.name.ends_with(".mgn") && !file.name.starts_with("std."),
                    "{}: node %{i} maps to {}",
                    f.display(),
                    file.name
                );
            }
        }
    }
}

#[test]
fn training_plans_map_every_step_to_the_model_and_respect_freezing() {
    use mgn_compiler::lower::PlanOptions;
    use mgn_ir::optim::OptimizerSpec;
    root();
    let frozen = vec!["fc1".to_string()];
    let (outcome, plan) = mgn_compiler::driver::plan_path(
        Path::new("models/digits_mlp.mgn"),
        None,
        vec![],
        &PlanOptions::train(&frozen, OptimizerSpec::default()),
    )
    .expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let plan = plan.expect("a plan");
    let trained: Vec<&str> =
        plan.grads.iter().map(|(p, _)| plan.params[*p].name.as_str()).collect();
    assert_eq!(trained, ["fc2.weight", "fc2.bias"]);
    assert!(plan.params.iter().filter(|p| p.name.starts_with("fc1.")).all(|p| p.frozen));
    // Backward steps keep the line of the forward expression they differentiate.
    for s in &plan.steps {
        assert_eq!(s.loc.file, "models/digits_mlp.mgn", "{:?}", s.op);
        assert!(s.loc.line >= 8, "{:?} at line {}", s.op, s.loc.line);
    }
    // Nothing of the size vocab × vocab (or classes × classes) appears in a cross-entropy
    // backward.
    assert!(plan.steps.iter().all(|s| s.shape != [10, 10]));
}

#[test]
fn elaboration_records_facts_for_the_language_server() {
    use mgn_compiler::elab::eval::FactKind;
    let outcome = check(Path::new("models/digits_mlp.mgn"));
    let src = &outcome.program.sources;
    let fact = |kind: FactKind, text: &str| {
        outcome
            .facts
            .iter()
            .find(|f| f.kind == kind && src.snippet(f.span) == text)
            .map(|f| f.text.clone())
    };
    assert_eq!(fact(FactKind::Let, "logits").as_deref(), Some("f32[64, 10]"));
    let layer = fact(FactKind::Layer, "fc1").expect("a fact for the fc1 field");
    assert!(
        layer.contains("layer `Linear` at `fc1`") && layer.contains("in_features = 64"),
        "{layer}"
    );
    let param = outcome
        .facts
        .iter()
        .find(|f| f.kind == FactKind::Param && f.text.contains("`fc1.weight`"))
        .expect("fc1.weight");
    assert!(param.text.starts_with("param f32[128, 64]"), "{}", param.text);
}

#[test]
fn arena_plans_of_every_model_are_valid_and_reuse_memory() {
    use mgn_compiler::lower::PlanOptions;
    use mgn_gpu::memory::{check_arena, plan_arena, plan_memory};
    use mgn_ir::optim::OptimizerSpec;
    root();
    for f in mgn_files("models") {
        for train in [false, true] {
            let opts = if train {
                PlanOptions::train(&[], OptimizerSpec::default())
            } else {
                PlanOptions::infer()
            };
            let (outcome, plan) =
                mgn_compiler::driver::plan_path(&f, None, vec![], &opts).expect("readable");
            let Some(plan) = plan else {
                assert!(train, "{}: {}", f.display(), rendered(&outcome));
                continue; // a model without a loss has no training plan
            };
            // Compiled plans, and what the GPU session rewrites them into, pass plan validation.
            let mode = if train { "train" } else { "infer" };
            plan.validate().unwrap_or_else(|e| panic!("{} ({mode}): {e}", f.display()));
            let gpu = mgn_gpu::rewrite::for_gpu(&plan);
            gpu.validate().unwrap_or_else(|e| panic!("{} ({mode}, GPU rewrite): {e}", f.display()));
            // The arena of the plan as compiled (`mgnc build --stats`) and as the GPU runs it.
            // Both never plan more than every value apart; the plan as compiled reuses words
            // (the GPU's may not: with its transposes folded, a small MLP's training plan keeps
            // every value alive to the end).
            for (plan, reuses) in [(mgn_gpu::program::GpuPlan::of(&plan), true), (gpu, false)] {
                let a = plan_arena(&plan);
                if let Err(e) = check_arena(&plan, &a) {
                    panic!("{} ({}): {e}", f.display(), if train { "train" } else { "infer" });
                }
                let m = plan_memory(&plan);
                let planned = ((a.total_words - a.param_words) * 4) as u64;
                assert!(
                    planned <= m.logical_bytes.max(1024)
                        && (!reuses || planned < m.logical_bytes.max(1024))
                        || m.logical_bytes < 4096,
                    "{}: planned {planned} vs logical {}",
                    f.display(),
                    m.logical_bytes
                );
            }
        }
    }
}

/// `tests/valid/doc_*.mgn` are examples of docs/LANGUAGE.md, checked clean above: each must
/// still be the doc's text (after its first comment line), so the doc shows code that compiles.
#[test]
fn doc_examples_are_the_docs_text() {
    root();
    let doc = std::fs::read_to_string("docs/LANGUAGE.md").expect("the language reference");
    let mut seen = 0;
    for f in mgn_files("tests/valid") {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !name.starts_with("doc_") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("readable");
        let body = text.split_once("\n\n").map_or(text.as_str(), |(_, b)| b);
        assert!(doc.contains(body), "{}: not in docs/LANGUAGE.md as written", f.display());
        seen += 1;
    }
    assert!(seen >= 1, "no doc examples in tests/valid");
}

/// Nearest `interpolate` by a whole factor is the `upsample` op (its fast kernel) exactly when
/// PyTorch's index math reads `j / factor`; other factors and modes are `interpolate`.
#[test]
fn whole_nearest_factors_are_upsample() {
    root();
    let outcome = check_path(
        Path::new("tests/valid/doc_spatial.mgn"),
        Models::One { name: None, settings: vec![] },
    )
    .expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let g = &outcome.graphs[0];
    let op = |name: &str| {
        let (_, id) = g.outputs.iter().find(|(n, _)| n == name).expect("an output");
        g.node(*id).op.describe()
    };
    assert_eq!(op("doubled"), "upsample scale=2");
    assert!(op("blocky").starts_with("interpolate nearest size=[12, 12]"), "{}", op("blocky"));
    assert!(op("smooth").starts_with("interpolate linear"), "{}", op("smooth"));
}

/// The test programs docs/LANGUAGE.md shows as its examples.
const SHOWN: &[&str] = &[
    "tests/valid/masks.mgn",
    "tests/valid/activations.mgn",
    "tests/valid/fill.mgn",
    "tests/valid/routing.mgn",
    "tests/valid/weighted_loss.mgn",
    "tests/valid/optional_params.mgn",
    "tests/valid/sequences.mgn",
];

/// docs/LANGUAGE.md shows these test programs verbatim as the examples of their features, so
/// the page's examples are programs that check, run on both backends and are gradient-checked.
#[test]
fn language_examples_are_test_programs() {
    root();
    let doc = std::fs::read_to_string("docs/LANGUAGE.md").expect("docs/LANGUAGE.md");
    for f in SHOWN {
        let text = std::fs::read_to_string(f).expect("a test program");
        let shown = doc.contains(&format!("```mgn\n{text}```"));
        assert!(shown, "docs/LANGUAGE.md does not show {f} verbatim");
    }
}

/// std.loss's `cross_entropy` without its optional arguments lowers to the plan the builtin
/// makes: one `softmax_cross_entropy` step and its derivative, nothing more.
#[test]
fn the_plain_cross_entropy_is_the_one_step_it_was() {
    use mgn_compiler::lower::PlanOptions;
    use mgn_ir::optim::OptimizerSpec;
    root();
    let dir = std::env::temp_dir().join(format!("mgn-plain-ce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let plan = |call: &str| {
        let f = dir.join("m.mgn");
        let text = format!(
            "use std.loss.{{cross_entropy}}\nmodel M {{\n    input x: f32[4, 5]\n    \
             input t: i32[4]\n    w = param f32[5, 5]\n    forward {{\n        \
             loss {call}(x @ w, t)\n    }}\n}}\n"
        );
        std::fs::write(&f, text).expect("written");
        let opts = PlanOptions::train(&[], OptimizerSpec::default());
        let (outcome, plan) = mgn_compiler::driver::plan_path(&f, None, vec![], &opts).unwrap();
        assert!(outcome.ok(), "{}", rendered(&outcome));
        let plan = plan.expect("a plan");
        plan.steps.iter().map(|s| (s.op.clone(), s.dtype, s.shape.clone())).collect::<Vec<_>>()
    };
    assert_eq!(plan("cross_entropy"), plan("softmax_cross_entropy"));
    std::fs::remove_dir_all(&dir).ok();
}

/// An optional parameter left out is not given to the builtin it is passed to, also through a
/// second function: the three calls of tests/valid/optional_params.mgn make layer norms with no
/// affine parameters, both, and the weight only.
#[test]
fn optional_parameters_left_out_are_not_given_downstream() {
    use mgn_ir::Op;
    let outcome = check(Path::new("tests/valid/optional_params.mgn"));
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let g = &outcome.graphs[0];
    let norms: Vec<(bool, bool, usize)> = g
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::LayerNorm { has_weight, has_bias, .. } => {
                Some((has_weight, has_bias, n.inputs.len()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(norms, [(false, false, 1), (true, true, 3), (true, false, 2)]);
}

/// tests/valid/sequences.mgn reproduces torchvision's names: lists nested in lists, a block's
/// layers chosen by `if` (named by their place in the chosen list), and ViT's named copies.
#[test]
fn sequences_take_torchvisions_names() {
    let outcome = check(Path::new("tests/valid/sequences.mgn"));
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let g = &outcome.graphs[0];
    let names: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    for name in [
        "features.0.0.weight",
        "features.0.1.running_var",
        "features.1.block.0.0.weight",
        "features.1.block.1.1.bias",
        "features.2.block.0.0.weight",
        "features.2.block.2.1.running_mean",
        "encoder.layers.encoder_layer_0.weight",
        "encoder.layers.encoder_layer_2.bias",
    ] {
        assert!(names.contains(&name), "no `{name}` in {names:?}");
    }
    // Without expansion the depthwise convolution comes first: 4 channels, one group each.
    let depthwise = g.params.iter().find(|p| p.name == "features.1.block.0.0.weight").unwrap();
    assert_eq!(depthwise.shape, [4, 1, 3, 3]);
    let expansion = g.params.iter().find(|p| p.name == "features.2.block.0.0.weight").unwrap();
    assert_eq!(expansion.shape, [8, 4, 1, 1]);
    assert!(!names.iter().any(|n| n.starts_with("features.1.block.2")), "{names:?}");
}
