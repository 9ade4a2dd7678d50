//! `mgnc import` of ONNX files, end to end: every fixture in tests/fixtures/onnx (op graphs
//! built with onnx.helper, a small CNN and a small transformer exported by torch.onnx; written
//! by scripts/onnx_fixtures.py with onnxruntime's outputs beside them) is imported, its source
//! is left as it is by the formatter, and it runs on the CPU and on the GPU (skipped without a
//! device) within 1e-5 of onnxruntime. Imported models train: with a target input and one
//! `loss` line added, a few Adam steps lower the loss.

use mgn_compiler::driver::plan_path;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::optim::OptimizerSpec;
use mgn_runtime::checkpoint::{self, MatchMode};
use mgn_runtime::{Plan, Restore, Session, Tensor};
use mgn_tests::{on_gpu, rendered, root};
use std::path::{Path, PathBuf};

const FIXTURES: &str = "tests/fixtures/onnx";

fn fixtures() -> Vec<String> {
    root();
    let mut names: Vec<String> = std::fs::read_dir(FIXTURES)
        .expect("the fixtures")
        .filter_map(|e| {
            e.ok()?.file_name().into_string().ok()?.strip_suffix(".onnx").map(String::from)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 6, "the fixtures are missing: run scripts/onnx_fixtures.py");
    names
}

/// Imports a fixture into a directory of its own: (the model's path, the weights' path).
fn import(name: &str, dir: &Path, edit: impl Fn(&str) -> String) -> (PathBuf, PathBuf) {
    let onnx = root().join(FIXTURES).join(format!("{name}.onnx"));
    let imported = mgn_import::import_file(&onnx, &mgn_import::Options::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let source = mgn_syntax::format::format(&imported.source).expect("the source parses");
    let again = mgn_syntax::format::format(&source).expect("the formatted source parses");
    assert_eq!(source, again, "{name}: `mgnc fmt` would change the imported source");
    std::fs::create_dir_all(dir).expect("a scratch directory");
    let model = dir.join("model.mgn");
    std::fs::write(&model, edit(&source)).expect("writable");
    let weights = dir.join("model.safetensors");
    let tensors: Vec<(String, &Tensor)> =
        imported.weights.iter().map(|(n, t)| (n.clone(), t)).collect();
    checkpoint::save(&weights, &tensors, &[]).expect("the weights save");
    (model, weights)
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("mgn-onnx-{}-{name}", std::process::id()))
}

/// The fixture's inputs and the sizes of its dynamic axes (`batch=2,sequence=6`).
fn inputs(name: &str) -> (Vec<(String, Tensor)>, Vec<Setting>) {
    let ck = checkpoint::load(&root().join(FIXTURES).join(format!("{name}.inputs.safetensors")))
        .expect("the inputs");
    let sets = ck.metadata.get("mgn.sets").map(String::as_str).unwrap_or("");
    let settings =
        sets.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().expect("a setting")).collect();
    (ck.tensors, settings)
}

fn plan(model: &Path, settings: Vec<Setting>, opts: &PlanOptions) -> Plan {
    let (outcome, plan) = plan_path(model, None, settings, opts).expect("readable");
    assert!(outcome.ok(), "{}: {}", model.display(), rendered(&outcome));
    plan.expect("a plan")
}

fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let diff: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f64 = w.iter().map(|b| b * b).sum();
    (diff / norm.max(1e-60)).sqrt()
}

fn compare(name: &str, backend: &str, outputs: &[(String, Tensor)]) {
    let ort = checkpoint::load(&root().join(FIXTURES).join(format!("{name}.ort.safetensors")))
        .expect("onnxruntime's outputs");
    assert_eq!(outputs.len(), ort.tensors.len(), "{name}: outputs");
    for (key, want) in &ort.tensors {
        let out = key.strip_prefix("output.").expect("output.<name>");
        let got = outputs.iter().find(|(n, _)| n == out).map(|(_, t)| t);
        let got = got.unwrap_or_else(|| panic!("{name}: no output `{out}`"));
        assert_eq!(got.shape, want.shape, "{name} ({backend}): the shape of `{out}`");
        let err = rel_l2(got, want);
        assert!(err < 1e-5, "{name} ({backend}): `{out}` is {err:.2e} from onnxruntime's");
    }
}

#[test]
fn fixtures_import_and_match_onnxruntime_on_cpu_and_gpu() {
    for name in fixtures() {
        let dir = scratch(&name);
        let (model, weights) = import(&name, &dir, str::to_string);
        let (feeds, settings) = inputs(&name);
        let feeds: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut gpu_done = false;
        for backend in ["cpu", "gpu"] {
            let p = plan(&model, settings.clone(), &PlanOptions::infer());
            let (mut s, _) =
                Session::from_checkpoint(p, 0, &weights, MatchMode::Strict, Restore::Weights)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            if backend == "gpu" && !on_gpu(&mut s) {
                continue;
            }
            let out = s.run(&feeds).unwrap_or_else(|e| panic!("{name} ({backend}): {e}"));
            compare(&name, backend, &out.outputs);
            gpu_done |= backend == "gpu";
        }
        eprintln!("{name}: matches onnxruntime (gpu: {gpu_done})");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Adds what training needs to an imported model: the target input and a loss, one line each
/// (plus the `use` of the loss), as the generated header tells a user to.
fn with_loss(source: &str, target: &str) -> String {
    let mut s = format!("use std.loss.{{cross_entropy}}\n{source}");
    let model = s.find("\nmodel ").expect("the model");
    let last_input = s[model..].rfind("\n    input ").expect("an input") + model + 1;
    let at = last_input + s[last_input..].find('\n').expect("a line");
    s.insert_str(at, &format!("\n    input labels: {target}"));
    let end = s.rfind("    }\n}").expect("the forward's end");
    s.insert_str(end, "        loss cross_entropy(logits, labels)\n");
    s
}

fn train(name: &str, target: &str, labels: Tensor) {
    let dir = scratch(&format!("{name}-train"));
    let (model, weights) = import(name, &dir, |s| with_loss(s, target));
    let (feeds, settings) = inputs(name);
    let opts = PlanOptions::train(&[], OptimizerSpec::default());
    let p = plan(&model, settings, &opts);
    let (mut s, _) = Session::from_checkpoint(p, 0, &weights, MatchMode::Strict, Restore::Weights)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut all: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    all.push(("labels", &labels));
    let losses: Vec<f64> = (0..8).map(|_| s.train_step(&all).expect("a training step")).collect();
    eprintln!("{name}: losses {losses:?}");
    assert!(losses.iter().all(|l| l.is_finite()), "{name}: {losses:?}");
    assert!(losses[7] < 0.9 * losses[0], "{name}: the loss does not go down: {losses:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn imported_cnn_trains_with_one_loss_line() {
    train("tiny_cnn", "i32[4]", Tensor::i32(vec![4], vec![1, 7, 3, 3]));
}

#[test]
fn imported_transformer_trains_with_one_loss_line() {
    let labels: Vec<i32> = (0..12).map(|i| (i * 7 + 3) % 50).collect();
    train("tiny_transformer", "i32[batch, sequence]", Tensor::i32(vec![2, 6], labels));
}
