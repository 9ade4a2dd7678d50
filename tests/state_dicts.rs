//! What upstream `state_dict`s hold beyond one tensor per parameter, through sessions on both
//! backends: tied weights (`Plan::aliases`) saved once or under every name, and step counters
//! (`Plan::counters`: BatchNorm's `num_batches_tracked`) that count every training step —
//! skipped ones of a loss-scaled plan included — and survive checkpoints and resumes.
//! The model states both (`TiedLinear`, std.nn's BatchNorm1d), and the tests check the plan
//! the compiler makes lists them.

use mgn_compiler::lower::PlanOptions;
use mgn_compiler::{driver::plan_path, elab::Setting};
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::ParamAlias;
use mgn_ir::precision::Precision;
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;
use mgn_runtime::checkpoint::{self, MatchMode};
use mgn_runtime::session::{Restore, SaveOptions, Session};
use mgn_runtime::Plan;
use mgn_tests::{on_gpu, rendered, root};
use std::path::PathBuf;

/// A linear layer and a batch norm, regressed onto `y`; `scale` multiplies the loss (1000
/// overflows f16 at the initial loss scale, so a mixed plan skips its first steps).
fn model(scale: f64) -> String {
    format!(
        "
use std.nn.{{BatchNorm1d, Linear, TiedLinear}}

model Counted(b: dim = 8) {{
    input x: f32[b, 16]
    input y: f32[b, 4]
    fc = Linear(16, 4)
    head = TiedLinear(fc.weight)
    bn = BatchNorm1d(4)
    forward {{
        let e = bn(fc(x)) - y
        output e
        loss mean(e * e) * {scale:.1}
    }}
}}
"
    )
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mgn-state-dicts-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

const COUNTER: &str = "bn.num_batches_tracked";

/// The training plan of [`model`], with `bn.num_batches_tracked` counting its steps and
/// `head.weight` an alias of `fc.weight`, as the compiler makes them.
fn plan(tag: &str, scale: f64, precision: Precision) -> Plan {
    root();
    let file = dir().join(format!("{tag}.mgn"));
    std::fs::write(&file, model(scale)).expect("writes");
    let opts = PlanOptions { precision, ..PlanOptions::train(&[], OptimizerSpec::default()) };
    let (outcome, plan) = plan_path(&file, None, Vec::<Setting>::new(), &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let plan = plan.expect("a plan");
    let counter = plan.params.iter().position(|p| p.name == COUNTER).expect("the counter");
    assert_eq!(plan.counters, vec![counter], "std.nn's BatchNorm1d counts its batches");
    let fc = plan.params.iter().position(|p| p.name == "fc.weight").expect("fc.weight");
    assert_eq!(plan.aliases, vec![ParamAlias { name: "head.weight".into(), param: fc }]);
    plan
}

fn batch() -> Vec<(&'static str, Tensor)> {
    let x = (0..128).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let y = (0..32).map(|i| ((i * 13 % 7) as f32 / 3.0) - 1.0).collect();
    vec![("x", Tensor::f32(vec![8, 16], x)), ("y", Tensor::f32(vec![8, 4], y))]
}

fn train(s: &mut Session, steps: usize) {
    let data = batch();
    let given: Vec<(&str, &Tensor)> = data.iter().map(|(n, t)| (*n, t)).collect();
    for _ in 0..steps {
        s.train_step(&given).expect("trains");
    }
}

/// The counter as the session's parameters hold it (after bringing them up from a device).
fn count(s: &mut Session) -> i32 {
    s.sync_from_device().expect("syncs");
    let i = s.param_index(COUNTER).expect("the counter");
    assert_eq!((s.params[i].dtype, s.params[i].shape.clone()), (DType::I64, vec![]));
    s.params[i].as_i32().expect("integer storage")[0]
}

/// The counter as a checkpoint holds it: PyTorch's `i64[]`.
fn saved_count(path: &std::path::Path) -> i32 {
    let ck = checkpoint::load(path).expect("loads");
    let t = ck.get(COUNTER).expect("saved");
    assert_eq!((t.dtype, t.shape.clone()), (DType::I64, vec![]), "PyTorch's dtype");
    t.as_i32().unwrap()[0]
}

#[test]
fn counters_count_training_steps_on_either_backend_and_survive_a_resume() {
    let p = plan("count", 1.0, Precision::F32);
    let dir = dir();
    let mut cpu = Session::new(p.clone(), 3);
    let mut gpu = Session::new(p.clone(), 3);
    let mut sessions = vec![(&mut cpu, "cpu")];
    if on_gpu(&mut gpu) {
        sessions.push((&mut gpu, "gpu"));
    }
    let data = batch();
    let given: Vec<(&str, &Tensor)> = data.iter().map(|(n, t)| (*n, t)).collect();
    for (s, on) in sessions {
        assert_eq!(count(s), 0, "{on}: a fresh session");
        train(s, 3);
        assert_eq!(count(s), 3, "{on}: one per step");
        // A run computes, but is no training step: PyTorch counts in train mode only, and
        // the running statistics move only in training steps here.
        s.run(&given).expect("runs");
        assert_eq!(count(s), 3, "{on}: a run does not count");
        let path = dir.join(format!("count-{on}.safetensors"));
        train(s, 2);
        s.save_checkpoint(&path).expect("saves");
        assert_eq!(saved_count(&path), 5, "{on}: saved as counted");
        // Resumed, on the CPU and on the device the run was on: the count goes on.
        let (mut back, report) =
            Session::from_checkpoint(p.clone(), 3, &path, MatchMode::Strict, Restore::Everything)
                .expect("resumes strictly");
        assert!(report.is_clean() && report.counters_started.is_empty(), "{report}");
        assert_eq!(count(&mut back), 5, "{on}: resumed");
        train(&mut back, 1);
        assert_eq!(count(&mut back), 6, "{on}: counting on after a resume");
        s.load_checkpoint(&path, MatchMode::Strict).expect("loads into the running session");
        train(s, 4);
        assert_eq!(count(s), 9, "{on}: loaded 5, then 4 steps");
        // The optimizer state is the parameters': a counter has no moments.
        let ck = checkpoint::load(&path).expect("loads");
        assert!(ck.tensors.iter().all(|(n, _)| !n.contains(COUNTER) || n == COUNTER), "{on}");
    }
}

#[test]
fn a_checkpoint_older_than_its_counter_starts_it_at_zero() {
    let p = plan("older", 1.0, Precision::F32);
    let path = dir().join("older.safetensors");
    let mut s = Session::new(p.clone(), 1);
    train(&mut s, 2);
    s.save_checkpoint(&path).expect("saves");
    // The same file without the counter: what a checkpoint older than the buffer holds.
    let ck = checkpoint::load(&path).expect("loads");
    let meta: Vec<(String, String)> =
        ck.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let kept: Vec<(String, &Tensor)> =
        ck.tensors.iter().filter(|(n, _)| n != COUNTER).map(|(n, t)| (n.clone(), t)).collect();
    checkpoint::save(&path, &kept, &meta).expect("saves");
    let (mut back, report) =
        Session::from_checkpoint(p, 1, &path, MatchMode::Strict, Restore::Everything)
            .expect("an older checkpoint loads strictly");
    assert_eq!(report.counters_started, vec![COUNTER]);
    assert_eq!(count(&mut back), 0);
    // A session that had counted, loading it, starts over too: the file's count is 0.
    train(&mut s, 1);
    assert_eq!(count(&mut s), 3);
    let report = s.load_checkpoint(&path, MatchMode::Strict).expect("loads");
    assert_eq!(report.counters_started, vec![COUNTER]);
    assert_eq!(count(&mut s), 0);
}

#[test]
fn skipped_steps_of_a_loss_scaled_plan_count_as_their_forward_ran() {
    let p = plan("loud", 1000.0, Precision::MixedF16);
    let mut cpu = Session::new(p.clone(), 1);
    let mut gpu = Session::new(p, 1);
    let mut sessions = vec![(&mut cpu, "cpu")];
    if on_gpu(&mut gpu) {
        sessions.push((&mut gpu, "gpu"));
    }
    for (s, on) in sessions {
        train(s, 12);
        assert!(s.skipped_steps() > 0, "{on}: the loud loss overflows f16 at first");
        assert_eq!(count(s), 12, "{on}: every step counts");
        assert_eq!(count(s) as u64, s.step + s.skipped_steps(), "{on}");
    }
}

#[test]
fn ties_are_saved_once_by_default_or_under_every_name_and_load_either_way() {
    let p = plan("tied", 1.0, Precision::F32);
    let dir = dir();
    let mut s = Session::new(p.clone(), 5);
    train(&mut s, 2);
    let fc = s.param_index("fc.weight").expect("fc.weight");
    // By default each tensor once (`save_pretrained`), and no optimizer state of the alias.
    let once = dir.join("once.safetensors");
    s.save_checkpoint(&once).expect("saves");
    let ck = checkpoint::load(&once).expect("loads");
    assert!(ck.get("head.weight").is_none(), "no copy by default");
    // With copies (`model.state_dict()`): the alias holds the parameter's values.
    let copies = dir.join("copies.safetensors");
    s.save_checkpoint_as(&copies, &SaveOptions { aliases: true, ..Default::default() })
        .expect("saves");
    let ck = checkpoint::load(&copies).expect("loads");
    assert_eq!(ck.get("head.weight"), Some(&s.params[fc]));
    assert!(ck.get("optim.fc.weight.m").is_some(), "trained with Adam");
    assert!(ck.tensors.iter().all(|(n, _)| !n.starts_with("optim.head")), "no alias state");
    for path in [&once, &copies] {
        let (back, report) =
            Session::from_checkpoint(p.clone(), 0, path, MatchMode::Strict, Restore::Everything)
                .expect("loads strictly");
        assert!(report.is_clean(), "{report}");
        assert_eq!(back.params, s.params, "{}", path.display());
    }
    // A file whose two names hold different values is refused, naming both.
    let mut tensors = ck.tensors.clone();
    let (_, head) = tensors.iter_mut().find(|(n, _)| n == "head.weight").expect("there");
    let Data::F32(v) = &mut head.data else { panic!("f32") };
    v[5] += 1.0;
    let refs: Vec<(String, &Tensor)> = tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
    checkpoint::save(&copies, &refs, &[]).expect("saves");
    let e = Session::from_checkpoint(p, 0, &copies, MatchMode::Strict, Restore::Weights)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains(
            "`head.weight` is tied to `fc.weight` in the model, but the file holds other values \
             under the two names (element 5:"
        ),
        "{e}"
    );
    assert!(e.starts_with(&copies.display().to_string()), "names the file: {e}");
}
