//! Tables computed from constants (`buffer … init <tensor expression>` and `const` fields):
//! their values, that training leaves them alone, what checkpoints hold, and Whisper's
//! sinusoid table, which upstream freezes.

use mgn_compiler::lower::PlanOptions;
use mgn_compiler::{driver::plan_path, elab::Setting};
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::{InitSpec, Plan};
use mgn_ir::tensor::Tensor;
use mgn_runtime::checkpoint::{self, MatchMode};
use mgn_runtime::session::{Restore, Session};
use mgn_tests::{on_gpu, rendered, root};
use std::path::Path;

fn train_plan(model: &str, settings: &[&str]) -> Plan {
    root();
    let settings: Vec<Setting> = settings.iter().map(|s| s.parse().expect("setting")).collect();
    let opts = PlanOptions::train(&[], OptimizerSpec::default());
    let (outcome, plan) = plan_path(Path::new(model), None, settings, &opts).expect("readable");
    assert!(outcome.ok(), "{model}: {}", rendered(&outcome));
    plan.expect("a training plan")
}

/// openai/whisper's `sinusoids`, in f32 as upstream computes it.
fn sinusoids(length: usize, channels: usize) -> Vec<f32> {
    let half = channels / 2;
    let increment = (10000f64.ln() / (half - 1) as f64) as f32;
    let inv: Vec<f32> = (0..half).map(|j| (-increment * j as f32).exp()).collect();
    let mut out = Vec::with_capacity(length * channels);
    for t in 0..length {
        let row: Vec<f32> = inv.iter().map(|r| t as f32 * r).collect();
        out.extend(row.iter().map(|a| a.sin()));
        out.extend(row.iter().map(|a| a.cos()));
    }
    out
}

fn values(s: &Session, name: &str) -> Vec<f64> {
    s.params[s.param_index(name).unwrap_or_else(|| panic!("no `{name}`"))].to_f64_vec()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn computed_buffers_and_consts_have_their_values_and_are_never_trained() {
    let plan = train_plan("tests/valid/computed_tables.mgn", &[]);
    let kinds: Vec<(&str, bool, bool)> =
        plan.params.iter().map(|p| (p.name.as_str(), p.trainable, p.persistent)).collect();
    assert_eq!(kinds, [("w", true, true), ("pos.table", false, true), ("pos.scale", false, false)]);
    assert!(matches!(plan.params[1].init, InitSpec::Computed(_)));
    assert_eq!(plan.grads.len(), 1, "only `w` has a gradient");
    // The init travels inside the plan file.
    let plan = Plan::from_bytes(&plan.to_bytes(), "tables.mgnplan").expect("reads back");

    let table: Vec<f64> = sinusoids(6, 8).iter().map(|&v| v as f64).collect();
    let scale: Vec<f64> = (0..6).map(|i| 1.0 + i as f64 / 6.0).collect();
    let x = Tensor::f32(vec![6, 8], (0..48).map(|i| (i as f32 * 0.37).sin()).collect());
    let want_y = |w: &[f64]| -> Vec<f64> {
        let xv = x.to_f64_vec();
        (0..48).map(|i| (xv[i] * w[i % 8] + table[i]) * scale[i / 8]).collect()
    };
    let mut cpu = Session::new(plan.clone(), 7);
    let mut gpu = Session::new(plan.clone(), 7);
    let on_device = on_gpu(&mut gpu);
    let mut sessions = vec![(&mut cpu, "CPU")];
    if on_device {
        sessions.push((&mut gpu, "GPU"));
    }
    for (s, on) in sessions {
        assert_close(&values(s, "pos.table"), &table, 1e-6, &format!("{on}: pos.table"));
        assert_close(&values(s, "pos.scale"), &scale, 1e-7, &format!("{on}: pos.scale"));
        let out = s.run(&[("x", &x)]).expect("runs");
        let y = out.outputs.iter().find(|(n, _)| n == "y").expect("y").1.to_f64_vec();
        assert_close(&y, &want_y(&values(s, "w")), 1e-5, &format!("{on}: y"));
        for _ in 0..3 {
            s.train_step(&[("x", &x)]).expect("trains");
        }
        s.sync_from_device().expect("syncs");
        assert!(values(s, "w").iter().any(|&v| v != 1.0), "{on}: `w` is trained");
        assert_close(&values(s, "pos.table"), &table, 1e-6, &format!("{on}: trained table"));
        assert_close(&values(s, "pos.scale"), &scale, 1e-7, &format!("{on}: trained scale"));
    }
}

#[test]
fn checkpoints_hold_buffers_but_not_consts() {
    let plan = train_plan("tests/valid/computed_tables.mgn", &[]);
    let dir = std::env::temp_dir().join(format!("mgn-tables-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tables.safetensors");
    let mut s = Session::new(plan.clone(), 1);
    // A loaded buffer replaces the computed table; a const is always recomputed.
    let i = s.param_index("pos.table").expect("table");
    s.params[i] = Tensor::f32(vec![6, 8], vec![0.5; 48]);
    s.save_checkpoint(&path).expect("saves");
    let ck = checkpoint::load(&path).expect("loads");
    let names: Vec<&str> = ck.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"w") && names.contains(&"pos.table"), "{names:?}");
    assert!(!names.contains(&"pos.scale"), "a const is not saved: {names:?}");
    let (back, report) =
        Session::from_checkpoint(plan.clone(), 9, &path, MatchMode::Strict, Restore::Weights)
            .expect("strict load");
    assert!(report.is_clean(), "{report}");
    assert_eq!(values(&back, "pos.table"), vec![0.5; 48]);
    assert_close(
        &values(&back, "pos.scale"),
        &(0..6).map(|i| 1.0 + i as f64 / 6.0).collect::<Vec<_>>(),
        1e-7,
        "scale",
    );
    // A checkpoint that holds a tensor named like the const: not the model's (as PyTorch's
    // strict loading treats a non-persistent buffer).
    let w = Tensor::f32(vec![8], vec![1.0; 8]);
    let stale = Tensor::f32(vec![6, 1], vec![9.0; 6]);
    let table = Tensor::f32(vec![6, 8], vec![0.0; 48]);
    let tensors =
        [("w".to_string(), &w), ("pos.table".into(), &table), ("pos.scale".into(), &stale)];
    checkpoint::save(&path, &tensors, &[]).expect("saves");
    let e = Session::from_checkpoint(plan, 9, &path, MatchMode::Strict, Restore::Weights)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("pos.scale"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A computed buffer is computed unless the checkpoint holds one: a file without it loads
/// strictly (a state_dict of a model whose table upstream does not save, or saves as a
/// non-persistent buffer), reports it, and the table is the computed one — also in a session
/// that held another table before. A missing parameter is still refused.
#[test]
fn a_checkpoint_without_a_computed_buffer_loads_it_computed() {
    let plan = train_plan("tests/valid/computed_tables.mgn", &[]);
    let dir = std::env::temp_dir().join(format!("mgn-tables-absent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("no-table.safetensors");
    let w = Tensor::f32(vec![8], vec![2.0; 8]);
    checkpoint::save(&path, &[("w".to_string(), &w)], &[]).expect("saves");
    let table: Vec<f64> = sinusoids(6, 8).iter().map(|&v| v as f64).collect();
    let (s, report) =
        Session::from_checkpoint(plan.clone(), 1, &path, MatchMode::Strict, Restore::Weights)
            .expect("a computed buffer is optional");
    assert_eq!(report.computed, vec!["pos.table"]);
    assert!(report.is_clean() && report.missing.is_empty(), "{report}");
    assert_eq!(values(&s, "w"), vec![2.0; 8]);
    assert_close(&values(&s, "pos.table"), &table, 1e-6, "computed on load");
    // Loaded into a session that holds another table: the file says nothing of it, so it is
    // the computed table again, not what the session held.
    let mut other = Session::new(plan.clone(), 1);
    let i = other.param_index("pos.table").expect("table");
    other.params[i] = Tensor::f32(vec![6, 8], vec![0.5; 48]);
    let report = other.load_checkpoint(&path, MatchMode::Strict).expect("loads");
    assert_eq!(report.computed, vec!["pos.table"]);
    assert_close(&values(&other, "pos.table"), &table, 1e-6, "computed again");
    // Without `w`, a trained parameter: refused, naming it and the file.
    let t = Tensor::f32(vec![6, 8], vec![0.5; 48]);
    checkpoint::save(&path, &[("pos.table".to_string(), &t)], &[]).expect("saves");
    let e = Session::from_checkpoint(plan, 1, &path, MatchMode::Strict, Restore::Weights)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("no-table.safetensors") && e.contains("`w` (f32[8]) is not in the file"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Upstream freezes Whisper's position table and fills it with openai's sinusoids: the .mgn
/// model declares it a buffer computed by the same formula, so its training plan has
/// gradients for exactly upstream's 66 trainable tensors.
#[test]
fn whisper_position_table_is_upstreams_frozen_sinusoids() {
    let plan = train_plan("models/whisper_tiny_encoder.mgn", &["frames=300"]);
    assert_eq!(plan.grads.len(), 66);
    let names: Vec<&str> = plan.grads.iter().map(|(p, _)| plan.params[*p].name.as_str()).collect();
    assert!(!names.contains(&"embed_positions.weight"), "{names:?}");
    let s = Session::new(plan, 0);
    let want: Vec<f64> = sinusoids(150, 384).iter().map(|&v| v as f64).collect();
    // Within a few f32 ulps of upstream's f32 table (the sines of arguments up to 149).
    assert_close(&values(&s, "embed_positions.weight"), &want, 2e-5, "embed_positions");
}

/// A table that types but cannot be computed (a gather past the end of another) is an error
/// naming the tensor and the model line when a session is set up, never a panic.
#[test]
fn a_table_that_cannot_be_computed_is_an_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("mgn-tables-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = dir.join("m.mgn");
    let text = "model M {\n    input x: f32[4]\n    \
                shifted = buffer f32[4] init gather(cast(arange(4), f32), arange(4) + 2)\n    \
                forward {\n        let y = x + shifted\n        output y = y\n        \
                loss mean(y)\n    }\n}\n";
    std::fs::write(&model, text).expect("written");
    let plan = train_plan(model.to_str().expect("utf-8"), &[]);
    let e = Session::try_new(plan, 0).err().expect("refused");
    let e = e.to_string();
    assert!(e.contains("the init of `shifted` cannot be computed"), "{e}");
    assert!(e.contains("m.mgn:3:") && e.contains("out of range"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
