//! `--precision` through the `mgnc` binary: training under the f16 policy with its loss scale
//! logged and checkpointed, the checkpoint evaluated in a mixed inference plan, and a plan file
//! that keeps the policy it was built with.

mod common;

use common::{mgnc, ok, refused, scratch};
use mgn_runtime::checkpoint;

#[test]
fn mixed_training_logs_its_loss_scale_and_its_checkpoint_evaluates() {
    let dir = scratch("precision");
    let (ckpt, log) = (dir.join("mlp.safetensors"), dir.join("losses.csv"));
    let path = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
    let out = ok(&mgnc(&[
        "train",
        "models/digits_mlp.mgn",
        "--data",
        "data/digits_train.safetensors",
        "--epochs",
        "2",
        "--lr",
        "0.003",
        "--quiet",
        "--backend",
        "cpu",
        "--precision",
        "mixed",
        "--save",
        &path(&ckpt),
        "--loss-log",
        &path(&log),
    ]));
    assert!(out.contains("0 skipped") && out.contains("the loss scale is now 65536"), "{out}");
    let csv = std::fs::read_to_string(&log).expect("the loss log");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("batch,loss,applied,loss_scale"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // A line for every step of the two epochs (`… N steps per epoch` in the opening line).
    let per_epoch: usize = out
        .split(" steps per epoch")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(rows.len(), 2 * per_epoch, "{csv}");
    for (k, r) in rows.iter().enumerate() {
        assert_eq!(r[0], (k + 1).to_string());
        assert!(r[1].parse::<f64>().is_ok_and(f64::is_finite), "{r:?}");
        assert_eq!((r[2], r[3]), ("1", "65536"));
    }
    let first: f64 = rows[0][1].parse().unwrap();
    let last: f64 = rows[rows.len() - 1][1].parse().unwrap();
    assert!(last < first / 2.0, "the loss falls: {first} → {last}");
    // The scale is optimizer state in the checkpoint; the weights are f32 master copies.
    let c = checkpoint::load(&ckpt).expect("saved");
    assert_eq!(c.get("optim.loss_scale").expect("the scale").to_f64_vec(), [65536.0]);
    assert_eq!(c.get("fc1.weight").expect("a weight").dtype, mgn_ir::DType::F32);
    // Evaluated in a mixed inference plan and in an f32 one, about the same accuracy.
    let eval = |precision: &str| {
        let args = ["eval", "models/digits_mlp.mgn", "--weights", &path(&ckpt)];
        let more = ["--data", "data/digits_test.safetensors", "--backend", "cpu"];
        let text = ok(&mgnc(&[&args[..], &more[..], &["--precision", precision]].concat()));
        let pct = text.split("accuracy ").nth(1).and_then(|s| s.split('%').next());
        pct.and_then(|p| p.parse::<f64>().ok()).unwrap_or_else(|| panic!("{text}"))
    };
    let (mixed, exact) = (eval("mixed"), eval("f32"));
    assert!(mixed > 80.0 && (mixed - exact).abs() <= 1.0, "mixed {mixed}%, f32 {exact}%");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_plan_file_keeps_its_precision() {
    let dir = scratch("precision-plan");
    let plan = dir.join("mlp.mgnplan");
    let plan = plan.to_str().expect("utf-8");
    ok(&mgnc(&["build", "models/digits_mlp.mgn", "--precision", "mixed-bf16", "-o", plan]));
    let bytes = std::fs::read(plan).expect("written");
    assert!(String::from_utf8_lossy(&bytes).contains("\"precision\":\"mixed-bf16\""));
    let args = ["run", plan, "--weights", "tests/fixtures/digits_mlp/weights.safetensors"];
    let more = ["--inputs", "tests/fixtures/digits_mlp/inputs.safetensors", "--out", "x"];
    let err = refused(&mgnc(&[&args[..], &more[..], &["--precision", "mixed"]].concat()));
    assert!(err.contains("was built with precision mixed-bf16"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
