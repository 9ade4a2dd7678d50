//! The train → checkpoint → fresh inference path, end to end through the `mgnc` binary, and
//! `mgnc run` against an independently computed reference (NumPy, float64).

mod common;

use common::{mgnc, ok, root, scratch};
use mgn_runtime::checkpoint;
use std::path::Path;
use std::process::{Command, Output};

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

// ---- Hardening: non-finite losses, labels, periodic checkpoints, signals, exact resume ----

/// `mgnc train` on the digits MLP on the CPU, quiet, with `extra` arguments.
fn train_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "train",
        "models/digits_mlp.mgn",
        "--data",
        "data/digits_train.safetensors",
        "--quiet",
        "--backend",
        "cpu",
    ];
    args.extend_from_slice(extra);
    args
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn spawn_mgnc(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .args(args)
        .current_dir(root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mgnc starts")
}

/// Every tensor of a checkpoint (parameters and optimizer state) as exact bit patterns.
fn bits(path: &Path) -> Vec<(String, Vec<u64>)> {
    let c = checkpoint::load(path).unwrap_or_else(|e| panic!("{e}"));
    c.tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.to_f64_vec().iter().map(|x| x.to_bits()).collect()))
        .collect()
}

/// The steps of the periodic checkpoints `<stem>.step-N.safetensors` in `dir`, in order.
fn periodic_steps(dir: &Path, stem: &str) -> Vec<u64> {
    let prefix = format!("{stem}.step-");
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .expect("scratch dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix(&prefix)?.strip_suffix(".safetensors")?.parse().ok()
        })
        .collect();
    steps.sort_unstable();
    steps
}

/// A number in `0..n` that differs from run to run (printed by the tests that use it).
fn random_below(n: u64) -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    (t.subsec_nanos() as u64 ^ std::process::id() as u64).wrapping_mul(0x9E37_79B9) % n
}

#[test]
fn a_non_finite_loss_stops_training_at_that_step_and_keeps_the_last_checkpoint() {
    let dir = scratch("nan-loss");
    let ckpt = dir.join("c.safetensors");
    let c = ckpt.to_str().expect("utf-8");
    ok(&mgnc(&train_args(&["--epochs", "1", "--save", c])));
    let good = std::fs::read(&ckpt).expect("saved");
    // With a learning rate of 1e30 the first step sends the weights to ~1e30 and the next
    // forward pass overflows: step 24, the second of epoch 2.
    let out = mgnc(&train_args(&["--epochs", "3", "--lr", "1e30", "--resume", c, "--save", c]));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("training step 24") && err.contains("epoch 2"), "{err}");
    assert!(!err.contains("epoch   2/3") && !err.contains("epoch   3/3"), "{err}");
    assert!(err.contains("not saved") && err.contains("c.safetensors"), "{err}");
    assert_eq!(std::fs::read(&ckpt).expect("still there"), good, "--save was overwritten");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn eval_rejects_labels_outside_the_classes_and_asks_for_an_inference_plan() {
    let dir = scratch("eval-labels");
    let test = checkpoint::load(&root().join("data/digits_test.safetensors")).expect("data");
    let images = test.get("images").expect("images");
    let weights = "tests/fixtures/digits_mlp/weights.safetensors";
    for bad in [10, -1, i32::MAX] {
        let mut labels = test.get("labels").expect("labels").clone();
        if let mgn_runtime::Data::I32(v) = &mut labels.data {
            v[7] = bad;
        }
        let data = dir.join(format!("bad{bad}.safetensors"));
        let tensors = [("images".to_string(), images), ("labels".to_string(), &labels)];
        checkpoint::save(&data, &tensors, &[]).expect("write data");
        let d = data.to_str().expect("utf-8");
        let out = mgnc(&["eval", "models/digits_mlp.mgn", "--weights", weights, "--data", d]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "label {bad}: {err}");
        for want in ["`labels`", "sample 7", &format!(" {bad}"), "10 classes"] {
            assert!(err.contains(want), "label {bad}: no `{want}` in {err}");
        }
        // `train` says the same before it takes a step.
        let out = mgnc(&[
            "train",
            "models/digits_mlp.mgn",
            "--data",
            d,
            "--epochs",
            "1",
            "--quiet",
            "--backend",
            "cpu",
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "label {bad}: {err}");
        assert!(err.contains("sample 7") && err.contains("10 classes"), "{err}");
    }
    let plan = dir.join("train.mgnplan");
    let p = plan.to_str().expect("utf-8");
    ok(&mgnc(&["build", "models/digits_mlp.mgn", "--mode", "train", "-o", p]));
    let data = "data/digits_test.safetensors";
    let out = mgnc(&["eval", p, "--weights", weights, "--data", data]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("training plan") && err.contains("--mode infer"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn periodic_checkpoints_every_n_steps_keep_the_newest_k() {
    let dir = scratch("periodic");
    let save = dir.join("mlp.safetensors");
    let s = save.to_str().expect("utf-8");
    // A newer periodic checkpoint left by another run is not this run's to delete.
    let stale = dir.join("mlp.step-900.safetensors");
    std::fs::write(&stale, b"not ours").expect("write");
    let out =
        ok(&mgnc(&train_args(&["--epochs", "1", "--save", s, "--save-every", "5", "--keep", "2"])));
    assert_eq!(periodic_steps(&dir, "mlp"), vec![15, 20, 900], "{out}");
    assert!(out.contains("step 20") && out.contains("mlp.step-20.safetensors"), "{out}");
    for step in [15, 20] {
        let c = checkpoint::load(&dir.join(format!("mlp.step-{step}.safetensors"))).expect("ok");
        assert_eq!(c.step(), Some(step));
        assert!(c.get("fc1.weight").is_some() && c.get("optim.step").is_some());
        // Where the run is in its data, for `--resume`: 22 steps per epoch.
        let meta = |k: &str| c.metadata.get(k).map(String::as_str);
        assert_eq!(meta("mgn.train.batch"), Some("64"));
        assert_eq!(meta("mgn.train.samples"), Some("1437"));
        assert_eq!(meta("mgn.train.seed"), Some("0"));
        assert_eq!(
            (meta("mgn.train.epoch"), meta("mgn.train.epoch_step")),
            (Some("0"), Some(&*step.to_string()))
        );
    }
    assert_eq!(checkpoint::load(&save).expect("final").step(), Some(22));
    assert_eq!(std::fs::read(&stale).expect("untouched"), b"not ours");

    for (args, want) in [
        (train_args(&["--epochs", "1", "--save-every", "5"]), "--save"),
        (train_args(&["--epochs", "1", "--save", s, "--save-every", "0"]), "--save-every"),
        (train_args(&["--epochs", "1", "--save", s, "--keep", "2"]), "--save-every"),
    ] {
        let out = mgnc(&args);
        let err = stderr(&out);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(unix)]
#[test]
fn sigterm_saves_a_checkpoint_like_ctrl_c() {
    let dir = scratch("sigterm");
    let ckpt = dir.join("c.safetensors");
    let child =
        spawn_mgnc(&train_args(&["--epochs", "100000", "--save", ckpt.to_str().expect("utf-8")]));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let status =
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("exits");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("checkpoint saved to"), "{err}");
    assert!(checkpoint::load(&ckpt).expect("readable").step().unwrap_or(0) > 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// Interrupted mid-epoch and resumed, training ends with the parameters and optimizer state of
/// an uninterrupted run, bit for bit: no step repeated, every epoch in its own order.
#[cfg(unix)]
#[test]
fn resume_continues_at_the_exact_step_in_the_same_data_order() {
    let dir = scratch("resume-exact");
    let (ckpt, resumed, reference) =
        (dir.join("c.safetensors"), dir.join("r.safetensors"), dir.join("ref.safetensors"));
    let c = ckpt.to_str().expect("utf-8");
    let child = spawn_mgnc(&train_args(&["--epochs", "100000", "--seed", "3", "--save", c]));
    let wait = 700 + random_below(600);
    std::thread::sleep(std::time::Duration::from_millis(wait));
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    let out = child.wait_with_output().expect("exits");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let step = checkpoint::load(&ckpt).expect("saved").step().expect("a step");
    assert!(step > 0, "interrupted after {wait} ms");
    // 22 steps per epoch; resume into the epoch after next.
    let epochs = (step / 22 + 2).to_string();
    let r = resumed.to_str().expect("utf-8");
    let log =
        ok(&mgnc(&train_args(&["--epochs", &epochs, "--seed", "3", "--resume", c, "--save", r])));
    let total = (step / 22 + 2) * 22;
    assert!(log.contains(&format!("trained {total} steps")), "from step {step}: {log}");
    let f = reference.to_str().expect("utf-8");
    ok(&mgnc(&train_args(&["--epochs", &epochs, "--seed", "3", "--save", f])));
    assert!(bits(&resumed) == bits(&reference), "resumed at step {step} (after {wait} ms)");

    // The position in the data depends on the batch size: another one is refused.
    let out = mgnc(&train_args(&["--epochs", &epochs, "--resume", c, "--batch", "32"]));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("batch 64") && err.contains("--batch 64"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `kill -9` at a random point of a run with `--save-every 5` loses at most 5 steps, and
/// resuming from the newest periodic checkpoint ends bit for bit where an uninterrupted run
/// does.
#[cfg(unix)]
#[test]
fn a_run_killed_at_a_random_step_resumes_to_the_uninterrupted_result() {
    let dir = scratch("sigkill");
    let (victim, resumed, reference) =
        (dir.join("v.safetensors"), dir.join("r.safetensors"), dir.join("ref.safetensors"));
    let base = ["--epochs", "6", "--seed", "11", "--save-every", "5", "--keep", "2"];
    let f = reference.to_str().expect("utf-8");
    ok(&mgnc(&train_args(&[&base[..], &["--save", f]].concat())));
    assert_eq!(checkpoint::load(&reference).expect("saved").step(), Some(132));

    // Kill once a random periodic checkpoint (5..=60 of the 132 steps) is on disk, plus up to
    // 2 ms. The schedule is constant, so a run of more epochs takes the same steps; the victim
    // gets 1000 so that it cannot end before the kill, even in a release build.
    let target = 5 * (1 + random_below(12));
    let v = victim.to_str().expect("utf-8");
    let long = [&["--epochs", "1000"], &base[2..], &["--save", v]].concat();
    let mut child = spawn_mgnc(&train_args(&long));
    let started = std::time::Instant::now();
    while periodic_steps(&dir, "v").last().is_none_or(|&s| s < target) {
        assert!(child.try_wait().expect("wait").is_none(), "ended before step {target}");
        assert!(started.elapsed().as_secs() < 120, "no checkpoint at step {target}");
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    std::thread::sleep(std::time::Duration::from_micros(random_below(2000)));
    child.kill().expect("SIGKILL");
    let out = child.wait_with_output().expect("exits");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "killed near step {target}: {}", stderr(&out));
    assert!(!victim.exists(), "the final checkpoint is written only at the end");

    // Every 5 steps, the newest two (three when the kill fell between writing one and deleting
    // the oldest): nothing older than 5 steps before the kill is lost.
    let steps = periodic_steps(&dir, "v");
    let newest = *steps.last().expect("a periodic checkpoint");
    assert!(newest >= target && newest.is_multiple_of(5), "{steps:?}");
    let n = steps.len() as u64;
    assert!((1..=3).contains(&n) && n * 5 <= newest, "{steps:?}");
    assert_eq!(steps, (0..n).map(|i| newest - 5 * (n - 1 - i)).collect::<Vec<_>>());
    let last = dir.join(format!("v.step-{newest}.safetensors"));
    let r = resumed.to_str().expect("utf-8");
    let l = last.to_str().expect("utf-8");
    let log = ok(&mgnc(&train_args(&[&base[..], &["--resume", l, "--save", r]].concat())));
    assert!(log.contains(&format!("at step {newest}")) && log.contains("trained 132"), "{log}");
    assert!(bits(&resumed) == bits(&reference), "killed near step {target}, resumed at {newest}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Data that does not fit the model is refused by `eval` as by `train` and `run`: labels for
/// fewer samples than the images (it printed "accuracy 0.00%" and exited 0), and samples with a
/// shape of their own that is not the input's (`[N, 8, 8]` for `f32[batch, 64]`; only flat
/// samples, `[N, 64]`, feed a shaped input).
#[test]
fn eval_and_train_refuse_data_that_does_not_fit() {
    let dir = scratch("eval-fit");
    let test = checkpoint::load(&root().join("data/digits_test.safetensors")).expect("data");
    let images = test.get("images").expect("images");
    let labels = test.get("labels").expect("labels");
    let weights = "tests/fixtures/digits_mlp/weights.safetensors";
    let mut short = labels.clone();
    short.shape[0] -= 1;
    if let mgn_runtime::Data::I32(v) = &mut short.data {
        v.pop();
    }
    let mut square = images.clone();
    square.shape = vec![images.shape[0], 8, 8];
    let cases = [
        ("short", images, &short, "`labels` has 359 samples but the model's inputs have 360"),
        ("square", &square, labels, "`images` has shape [360, 8, 8]"),
    ];
    for (name, images, labels, want) in cases {
        let data = dir.join(format!("{name}.safetensors"));
        let tensors = [("images".to_string(), images), ("labels".to_string(), labels)];
        checkpoint::save(&data, &tensors, &[]).expect("write data");
        let d = data.to_str().expect("utf-8");
        let out = mgnc(&["eval", "models/digits_mlp.mgn", "--weights", weights, "--data", d]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(want), "{name}: no `{want}` in {err}");
        let train = ["train", "models/digits_mlp.mgn", "--data", d, "--epochs", "1", "--quiet"];
        let out = mgnc(&train);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A run that writes `--save NAME` first removes the temporaries a killed run (`kill -9`) left
/// of NAME and its periodic checkpoints; they stayed until a later save of the same name more
/// than a minute later.
#[test]
fn a_run_removes_the_temporaries_a_killed_run_left_of_its_checkpoints() {
    let dir = scratch("stale-temporaries");
    let dead = u32::MAX - 1;
    let left = [
        format!(".ck.safetensors.tmp{dead}"),
        format!(".ck.step-7.safetensors.tmp{dead}"),
        format!(".unrelated.safetensors.tmp{dead}"),
    ];
    for name in &left {
        std::fs::write(dir.join(name), b"half a checkpoint").unwrap();
    }
    let save = dir.join("ck.safetensors");
    ok(&mgnc(&train_args(&["--save", save.to_str().expect("utf-8")])));
    assert!(!dir.join(&left[0]).exists() && !dir.join(&left[1]).exists());
    assert!(dir.join(&left[2]).exists(), "another checkpoint's temporary stays");
    let _ = std::fs::remove_dir_all(dir);
}
