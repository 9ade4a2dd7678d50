//! The train → checkpoint → fresh inference path, end to end through the `mgnc` binary, and
//! `mgnc run` against an independently computed reference (NumPy, float64).

use mgn_runtime::checkpoint;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn mgnc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("mgnc runs")
}

fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "mgnc failed: {err}");
    err + &String::from_utf8_lossy(&out.stdout)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mgn-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-12);
    num / den
}

#[test]
fn run_matches_the_numpy_reference_for_digits_mlp() {
    let dir = scratch("fixture");
    let out = dir.join("out.safetensors");
    ok(&mgnc(&[
        "run",
        "models/digits_mlp.mgn",
        "--weights",
        "tests/fixtures/digits_mlp/weights.safetensors",
        "--inputs",
        "tests/fixtures/digits_mlp/inputs.safetensors",
        "--out",
        out.to_str().expect("utf-8 path"),
        "--grads",
    ]));
    let got = checkpoint::load(&out).expect("mgnc wrote a checkpoint");
    let want = checkpoint::load(&root().join("tests/fixtures/digits_mlp/expected.safetensors"))
        .expect("fixture");
    for (name, w) in &want.tensors {
        let g = got.get(name).unwrap_or_else(|| panic!("mgnc run did not write `{name}`"));
        assert_eq!(g.shape, w.shape, "{name}");
        let err = rel_l2(&g.to_f64_vec(), &w.to_f64_vec());
        assert!(err < 1e-5, "{name}: relative L2 error {err:e}");
    }
    assert_eq!(got.tensors.len(), want.tensors.len(), "no extra tensors");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn trained_checkpoint_reproduces_accuracy_in_a_fresh_inference_plan() {
    let dir = scratch("train");
    let ckpt = dir.join("mlp.safetensors");
    let plan = dir.join("mlp.mgnplan");
    let log = ok(&mgnc(&[
        "train",
        "models/digits_mlp.mgn",
        "--data",
        "data/digits_train.safetensors",
        "--eval-data",
        "data/digits_test.safetensors",
        "--epochs",
        "3",
        "--lr",
        "0.003",
        "--quiet",
        "--save",
        ckpt.to_str().expect("utf-8"),
    ]));
    let last = log.lines().rfind(|l| l.starts_with("epoch")).expect("an epoch line");
    let trained_acc = last
        .split("eval accuracy ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .expect("accuracy")
        .to_string();
    ok(&mgnc(&["build", "models/digits_mlp.mgn", "-o", plan.to_str().expect("utf-8")]));
    let eval = ok(&mgnc(&[
        "eval",
        plan.to_str().expect("utf-8"),
        "--weights",
        ckpt.to_str().expect("utf-8"),
        "--data",
        "data/digits_test.safetensors",
    ]));
    assert!(
        eval.contains(&format!("accuracy {trained_acc}")),
        "trained: {trained_acc}; fresh plan: {eval}"
    );

    // Resuming continues from the saved step.
    let resumed = ok(&mgnc(&[
        "train",
        "models/digits_mlp.mgn",
        "--data",
        "data/digits_train.safetensors",
        "--epochs",
        "4",
        "--lr",
        "0.003",
        "--quiet",
        "--resume",
        ckpt.to_str().expect("utf-8"),
    ]));
    assert!(resumed.contains("resumed from") && resumed.contains("at step 66"), "{resumed}");
    assert!(resumed.contains("epoch   4/4") && !resumed.contains("epoch   1/4"), "{resumed}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn weights_that_do_not_match_are_refused_with_names() {
    let out = mgnc(&[
        "run",
        "models/digits_cnn.mgn",
        "--weights",
        "tests/fixtures/digits_mlp/weights.safetensors",
        "--inputs",
        "tests/fixtures/digits_mlp/inputs.safetensors",
        "--out",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("weights.safetensors") && err.contains("fc1.weight"), "{err}");
}

#[test]
fn numerics_check_names_the_op_and_line() {
    let dir = scratch("nan");
    let model = dir.join("nan.mgn");
    let source = "\
model N(b: dim = 2) {
    input x: f32[b, 3]
    forward {
        let y = log(x - 10.0)
        output y
    }
}
";
    std::fs::write(&model, source).expect("write");
    let inputs = dir.join("in.safetensors");
    let x = mgn_runtime::Tensor::f32(vec![2, 3], vec![1.0; 6]);
    checkpoint::save(&inputs, &[("x".to_string(), &x)], &[]).expect("write inputs");
    let out = mgnc(&[
        "run",
        model.to_str().expect("utf-8"),
        "--inputs",
        inputs.to_str().expect("utf-8"),
        "--out",
        dir.join("o.safetensors").to_str().expect("utf-8"),
        "--check-numerics",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NaN produced by `log`") && err.contains("nan.mgn:4:"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(unix)]
#[test]
fn ctrl_c_saves_a_checkpoint_before_exiting() {
    let dir = scratch("sigint");
    let ckpt = dir.join("c.safetensors");
    let child = Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args([
            "train",
            "models/digits_mlp.mgn",
            "--data",
            "data/digits_train.safetensors",
            "--epochs",
            "100000",
            "--quiet",
            "--save",
            ckpt.to_str().expect("utf-8"),
        ])
        .current_dir(root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    // Wait until training has started.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let status =
        Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    let out = child.wait_with_output().expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("checkpoint saved to"), "{err}");
    let c = checkpoint::load(&ckpt).expect("a readable checkpoint");
    assert!(c.step().unwrap_or(0) > 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// `mgnc run --backend vulkan` against the same NumPy reference, when a Vulkan device exists
/// (lavapipe in CI, where `MGN_REQUIRE_GPU=1` makes its absence a failure).
#[test]
fn run_on_vulkan_matches_the_numpy_reference_for_digits_mlp() {
    if !mgn_gpu::testing::device_listed() {
        return;
    }
    let dir = scratch("vulkan");
    let out = dir.join("out.safetensors");
    let o = mgnc(&[
        "run",
        "models/digits_mlp.mgn",
        "--weights",
        "tests/fixtures/digits_mlp/weights.safetensors",
        "--inputs",
        "tests/fixtures/digits_mlp/inputs.safetensors",
        "--out",
        out.to_str().expect("utf-8 path"),
        "--grads",
        "--backend",
        "vulkan",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("running on "));
    let got = checkpoint::load(&out).expect("mgnc wrote a checkpoint");
    let want = checkpoint::load(&root().join("tests/fixtures/digits_mlp/expected.safetensors"))
        .expect("fixture");
    for (name, w) in &want.tensors {
        let g = got.get(name).unwrap_or_else(|| panic!("missing `{name}`"));
        let err = rel_l2(&g.to_f64_vec(), &w.to_f64_vec());
        assert!(err < 1e-5, "{name}: relative L2 error {err:e}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
