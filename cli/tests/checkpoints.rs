//! Checkpoints as users meet them through the `mgnc` binary: never silently wrong (NaN or
//! infinite values, an incomplete optimizer state or another optimizer's, a header that lists a
//! tensor twice, a mismatch whose first line does not say which tensor, a tie whose two names
//! hold different values), never torn or littered with the temporary files of interrupted
//! writes, and loading what upstream `state_dict`s hold (a tie under one name or both, a
//! counter that counts on across resumes or is absent, a computed buffer left out).

mod common;

use common::{mgnc, ok, root, scratch};
use mgn_runtime::checkpoint;
use mgn_runtime::{Data, Tensor};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

const FIXTURE: &str = "tests/fixtures/digits_mlp/weights.safetensors";

/// The error output of a command that must fail with exit code 1 and print no result.
fn refused(out: &Output) -> String {
    let err = common::refused(out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!err.contains("accuracy") && !stdout.contains("accuracy"), "{err}{stdout}");
    assert!(!err.contains("epoch "), "refused before training: {err}");
    err
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Writes `to`: the checkpoint `from` with its tensors edited, and its metadata.
fn edited(from: &Path, to: &Path, edit: impl FnOnce(&mut Vec<(String, Tensor)>)) {
    edited_with(from, to, edit, |_| {});
}

/// Writes `to`: the checkpoint `from` with its tensors and its metadata edited.
fn edited_with(
    from: &Path,
    to: &Path,
    edit: impl FnOnce(&mut Vec<(String, Tensor)>),
    edit_meta: impl FnOnce(&mut Vec<(String, String)>),
) {
    let ck = checkpoint::load(from).expect("a readable checkpoint");
    let mut tensors = ck.tensors.clone();
    edit(&mut tensors);
    let refs: Vec<(String, &Tensor)> = tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
    let mut meta: Vec<(String, String)> = ck
        .metadata
        .iter()
        .filter(|(k, _)| *k != "mgn.format")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    edit_meta(&mut meta);
    checkpoint::save(to, &refs, &meta).expect("written");
}

/// Sets metadata `key` to `value`.
fn set(meta: &mut [(String, String)], key: &str, value: &str) {
    meta.iter_mut().find(|(k, _)| k == key).expect("the key is there").1 = value.to_string();
}

/// Sets the first values of tensor `name` to `values`.
fn poison(tensors: &mut [(String, Tensor)], name: &str, values: &[f32]) {
    let (_, t) = tensors.iter_mut().find(|(n, _)| n == name).expect("the tensor is there");
    let Data::F32(v) = &mut t.data else { panic!("{name} is not f32") };
    v[..values.len()].copy_from_slice(values);
}

fn eval(weights: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["eval", "models/digits_mlp.mgn", "--weights", s(weights)];
    args.extend_from_slice(&["--data", "data/digits_test.safetensors"]);
    args.extend_from_slice(extra);
    mgnc(&args)
}

fn resume(ck: &Path, extra: &[&str]) -> Output {
    let mut args =
        vec!["train", "models/digits_mlp.mgn", "--data", "data/digits_train.safetensors"];
    args.extend_from_slice(&["--epochs", "2", "--quiet", "--resume", s(ck)]);
    args.extend_from_slice(extra);
    mgnc(&args)
}

#[test]
fn weights_with_nan_or_infinity_are_refused_naming_the_tensors() {
    let dir = scratch("nan");
    let bad = dir.join("nan.safetensors");
    let inf = f32::INFINITY;
    edited(&root().join(FIXTURE), &bad, |t| {
        poison(t, "fc1.weight", &[f32::NAN, inf, 0.5, -inf]);
        poison(t, "fc2.bias", &[f32::NAN]);
    });
    let err = refused(&eval(&bad, &[]));
    assert!(
        err.contains(
            "nan.safetensors: the checkpoint holds values that are not finite: \
             `fc1.weight` has 3 of 8192 (1 NaN, 2 infinite), `fc2.bias` has 1 of 10 (1 NaN)"
        ),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_mismatch_names_the_first_tensor_on_its_first_line() {
    let fixture = root().join(FIXTURE);
    let err = refused(&eval(&fixture, &["--set", "hidden=32"]));
    let first = err.lines().find(|l| l.starts_with("error: ")).expect("an error line");
    assert_eq!(
        first,
        format!(
            "error: {}: the checkpoint does not match the model's parameters: `fc1.weight` is \
             f32[128, 64] in the file but f32[32, 64] in the model (and 2 more)",
            fixture.display()
        ),
        "{err}"
    );
    // The full list follows.
    assert!(err.contains("fc2.weight: expected f32[10, 32], found f32[10, 128]"), "{err}");
}

#[test]
fn a_header_listing_a_tensor_twice_is_refused_naming_it() {
    let dir = scratch("dup");
    let bad = dir.join("dup.safetensors");
    let bytes = std::fs::read(root().join(FIXTURE)).expect("fixture");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).expect("utf-8").trim_end();
    // `fc2.bias` listed a second time, with the same offsets: a reader that keeps the last of
    // two entries sees a valid file.
    let start = header.find("\"fc2.bias\":").expect("fc2.bias in the header");
    let end = start + header[start..].find('}').expect("its entry") + 1;
    let mut twice = format!("{},{}}}", &header[..header.len() - 1], &header[start..end]);
    while twice.len() % 8 != 0 {
        twice.push(' ');
    }
    let mut out = (twice.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(twice.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&bad, out).expect("written");
    let err = refused(&eval(&bad, &[]));
    assert!(
        err.contains("dup.safetensors: corrupt header: tensor `fc2.bias` is listed twice"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn resuming_refuses_non_finite_incomplete_or_foreign_optimizer_state() {
    let dir = scratch("resume");
    let adam = dir.join("adam.safetensors");
    let train = ["train", "models/digits_mlp.mgn", "--data", "data/digits_train.safetensors"];
    let mut args = train.to_vec();
    args.extend_from_slice(&["--epochs", "1", "--quiet", "--save", s(&adam)]);
    ok(&mgnc(&args));

    // NaN in a parameter, an infinity in a second moment.
    let bad = dir.join("nan.safetensors");
    edited(&adam, &bad, |t| poison(t, "fc1.bias", &[f32::NAN]));
    let err = refused(&resume(&bad, &[]));
    assert!(err.contains("`fc1.bias` has 1 of 128 (1 NaN)"), "{err}");
    edited(&adam, &bad, |t| poison(t, "optim.fc2.bias.v", &[f32::INFINITY, f32::INFINITY]));
    let err = refused(&resume(&bad, &[]));
    assert!(
        err.contains(
            "nan.safetensors: the optimizer state holds values that are not finite: \
             `optim.fc2.bias.v` has 2 of 10 (2 infinite)"
        ),
        "{err}"
    );

    // One moment gone: not restarted from zero.
    let lost = dir.join("lost.safetensors");
    edited(&adam, &lost, |t| t.retain(|(n, _)| n != "optim.fc1.weight.v"));
    let err = refused(&resume(&lost, &[]));
    assert!(
        err.contains(
            "lost.safetensors: the optimizer state is incomplete: `optim.fc1.weight.v` \
             is missing, though `optim.fc1.weight.m` is there"
        ),
        "{err}"
    );

    // Adam's state resumed by SGD (with and without momentum): both kinds named.
    let err = refused(&resume(&adam, &["--optimizer", "sgd"]));
    assert!(
        err.contains(
            "adam.safetensors: the optimizer state is Adam's or AdamW's (`.m` and `.v` \
             per parameter), but this run trains with SGD with momentum 0.9 (`.m` only)"
        ),
        "{err}"
    );
    let err = refused(&resume(&adam, &["--optimizer", "sgd", "--momentum", "0"]));
    assert!(err.contains("trains with plain SGD (no state)"), "{err}");
    // And SGD's momentum buffers resumed by Adam.
    let sgd = dir.join("sgd.safetensors");
    let mut args = train.to_vec();
    args.extend_from_slice(&["--epochs", "1", "--quiet", "--optimizer", "sgd", "--save", s(&sgd)]);
    ok(&mgnc(&args));
    let err = refused(&resume(&sgd, &[]));
    assert!(
        err.contains("the optimizer state is SGD with momentum's (`.m` only)")
            && err.contains("trains with Adam (`.m` and `.v` per parameter)"),
        "{err}"
    );

    // AdamW keeps Adam's state: it resumes.
    let log = ok(&resume(&adam, &["--optimizer", "adamw"]));
    assert!(log.contains("resumed from") && log.contains("epoch   2/2"), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A training state that contradicts itself or the model is refused by name, not resumed from:
/// state for a parameter the model lacks, a negative second moment (a later update's square
/// root would be NaN), a step in the metadata other than the optimizer's, another model's
/// name. A tensor converted on load (`f16` for an `f32` parameter) is loaded with a note.
#[test]
fn resuming_refuses_state_that_contradicts_itself_or_the_model() {
    let dir = scratch("contradicts");
    let adam = dir.join("adam.safetensors");
    let train = ["train", "models/digits_mlp.mgn", "--data", "data/digits_train.safetensors"];
    let mut args = train.to_vec();
    args.extend_from_slice(&["--epochs", "1", "--quiet", "--save", s(&adam)]);
    ok(&mgnc(&args));
    let bad = dir.join("bad.safetensors");

    edited(&adam, &bad, |t| {
        let stray = t.iter().find(|(n, _)| n == "optim.fc2.bias.m").expect("a moment").1.clone();
        t.push(("optim.fc3.bias.m".into(), stray));
    });
    let err = refused(&resume(&bad, &[]));
    assert!(err.contains("`optim.fc3.bias.m` belongs to no parameter of this model"), "{err}");

    edited(&adam, &bad, |t| poison(t, "optim.fc2.bias.v", &[0.5, -1.0]));
    let err = refused(&resume(&bad, &[]));
    assert!(err.contains("`optim.fc2.bias.v` holds a negative second moment (-1 at element 1)"));

    let no_edit = |_: &mut Vec<(String, Tensor)>| {};
    edited_with(&adam, &bad, no_edit, |m| set(m, "mgn.step", "7"));
    let err = refused(&resume(&bad, &[]));
    assert!(err.contains("the metadata says step 7 but the optimizer state's `optim.step`"));

    edited_with(&adam, &bad, no_edit, |m| set(m, "mgn.model", "TinyGpt"));
    let err = refused(&resume(&bad, &[]));
    assert!(err.contains("saved by model `TinyGpt`, not `DigitsMlp`"), "{err}");

    edited(&adam, &bad, |t| {
        t.iter_mut().find(|(n, _)| n == "fc2.bias").expect("fc2.bias").1.dtype = mgn_ir::DType::F16;
    });
    let all = ok(&eval(&bad, &[]));
    assert!(
        all.contains("converted on load (1):") && all.contains("fc2.bias: f16 -> f32"),
        "{all}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Creates `name` in `dir`, last modified `ago` in the past.
fn touch(dir: &Path, name: &str, ago: Duration) {
    let f = std::fs::File::create(dir.join(name)).expect("created");
    f.set_modified(SystemTime::now() - ago).expect("mtime set");
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("readable")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_save_removes_the_temporary_files_of_interrupted_writes() {
    let dir = scratch("stale");
    let ck = dir.join("c.safetensors");
    // A writer killed mid-write (`kill -9`) leaves `.c.safetensors.tmp<PID>` behind: here, an
    // mgnc that has exited, and one whose PID has since been reused by init.
    let mut gone = Command::new(env!("CARGO_BIN_EXE_mgnc"))
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("ran");
    let gone_pid = gone.id();
    gone.wait().expect("exited");
    touch(&dir, &format!(".c.safetensors.tmp{gone_pid}"), Duration::from_secs(300));
    touch(&dir, ".c.safetensors.tmp1", Duration::from_secs(3 * 3600));
    // A writer still at work (this test's process): its file stays.
    let writing = format!(".c.safetensors.tmp{}", std::process::id());
    touch(&dir, &writing, Duration::ZERO);
    // Temporary files of other targets are not this save's business.
    let other = format!(".d.safetensors.tmp{gone_pid}");
    touch(&dir, &other, Duration::from_secs(3 * 3600));
    for _ in 0..2 {
        ok(&mgnc(&[
            "train",
            "models/digits_mlp.mgn",
            "--data",
            "data/digits_train.safetensors",
            "--epochs",
            "1",
            "--quiet",
            "--save",
            s(&ck),
        ]));
        let mut want = vec![other.clone(), writing.clone(), "c.safetensors".to_string()];
        if !Path::new("/proc/self").exists() {
            // Where the host does not list its processes, only the hour-old file is known to
            // be abandoned.
            want.push(format!(".c.safetensors.tmp{gone_pid}"));
        }
        want.sort();
        assert_eq!(entries(&dir), want);
        assert!(checkpoint::load(&ck).expect("a complete checkpoint").step().unwrap_or(0) > 0);
    }
    let _ = std::fs::remove_dir_all(dir);
}

const COUNTER: &str = "bn.num_batches_tracked";

/// The digits MLP built in `mode` (`train` or `infer`) into `dir`, with what the compiler adds
/// for a tied weight and a batch norm's counter: `head.weight` an alias of `fc2.weight`, and an
/// `i64[]` buffer `bn.num_batches_tracked` that every plan lists and a training plan counts its
/// steps in.
fn upstream_plan(dir: &Path, mode: &str) -> std::path::PathBuf {
    use mgn_ir::plan::{InitSpec, ParamAlias, ParamSpec};
    let path = dir.join(format!("{mode}.mgnplan"));
    ok(&mgnc(&["build", "models/digits_mlp.mgn", "--mode", mode, "-o", s(&path)]));
    let mut plan = mgn_ir::Plan::load(&path).expect("a plan");
    plan.params.push(ParamSpec {
        name: COUNTER.into(),
        dtype: mgn_ir::DType::I64,
        shape: vec![],
        init: InitSpec::Constant(0.0),
        trainable: false,
        frozen: false,
        persistent: true,
    });
    plan.counters = vec![plan.params.len() - 1];
    let fc2 = plan.params.iter().position(|p| p.name == "fc2.weight").expect("fc2.weight");
    plan.aliases = vec![ParamAlias { name: "head.weight".into(), param: fc2 }];
    plan.save(&path).expect("written");
    path
}

/// The count a checkpoint holds, checked to be PyTorch's `i64[]`.
fn count_in(path: &Path) -> i32 {
    let ck = checkpoint::load(path).expect("a checkpoint");
    let t = ck.get(COUNTER).expect("the counter is saved");
    assert_eq!((t.dtype, t.shape.clone()), (mgn_runtime::DType::I64, vec![]));
    t.as_i32().expect("integers")[0]
}

fn train_plan_args<'a>(plan: &'a Path, epochs: &'a str, save: &'a Path) -> Vec<&'a str> {
    let mut args = vec!["train", s(plan), "--data", "data/digits_train.safetensors"];
    args.extend_from_slice(&["--epochs", epochs, "--quiet", "--save", s(save)]);
    args
}

/// 1,437 samples in batches of 64.
const STEPS_PER_EPOCH: i32 = 22;

#[test]
fn a_counter_counts_training_steps_and_survives_save_and_resume() {
    let dir = scratch("counter");
    let train = upstream_plan(&dir, "train");
    let one = dir.join("one.safetensors");
    let mut args = train_plan_args(&train, "1", &one);
    args.push("--save-aliases");
    ok(&mgnc(&args));
    assert_eq!(count_in(&one), STEPS_PER_EPOCH);
    // `--save-aliases`: the tie under both names, as `model.state_dict()` lists it; the
    // optimizer state under the parameter's name only.
    let ck = checkpoint::load(&one).expect("loads");
    assert_eq!(ck.get("head.weight"), ck.get("fc2.weight"));
    assert!(ck.get("head.weight").is_some());
    assert!(ck.tensors.iter().all(|(n, _)| !n.starts_with("optim.head")));

    // Resumed strictly from the file with both names: the count goes on.
    let two = dir.join("two.safetensors");
    let mut args = train_plan_args(&train, "2", &two);
    args.extend_from_slice(&["--resume", s(&one)]);
    let log = ok(&mgnc(&args));
    // Nothing to note: every tensor came from the file under its own name.
    let noted = format!("note: {}", one.display());
    assert!(log.contains("resumed from") && !log.contains(&noted), "{log}");
    assert_eq!(count_in(&two), 2 * STEPS_PER_EPOCH);
    // Without the flag, each tensor once (`save_pretrained`).
    assert!(checkpoint::load(&two).expect("loads").get("head.weight").is_none());

    // A checkpoint older than the counter: resumed with a note, counting from 0.
    let older = dir.join("older.safetensors");
    edited(&two, &older, |t| t.retain(|(n, _)| n != COUNTER));
    let three = dir.join("three.safetensors");
    let mut args = train_plan_args(&train, "3", &three);
    args.extend_from_slice(&["--resume", s(&older)]);
    let log = ok(&mgnc(&args));
    assert!(
        log.contains("counters not in the checkpoint, started at 0 (1):\n  bn.num_batches_tracked"),
        "{log}"
    );
    assert_eq!(count_in(&three), STEPS_PER_EPOCH);

    // Every file evaluates strictly with the inference plan, which keeps the count unchanged:
    // the one without the counter too (PyTorch loads such older checkpoints for inference).
    let infer = upstream_plan(&dir, "infer");
    for w in [&one, &two, &older] {
        let out =
            mgnc(&["eval", s(&infer), "--weights", s(w), "--data", "data/digits_test.safetensors"]);
        assert!(ok(&out).contains("accuracy"), "{}", s(w));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_tie_loads_when_its_names_agree_and_is_refused_naming_both_when_not() {
    let dir = scratch("tie");
    let (train, infer) = (upstream_plan(&dir, "train"), upstream_plan(&dir, "infer"));
    let both = dir.join("both.safetensors");
    let mut args = train_plan_args(&train, "1", &both);
    args.push("--save-aliases");
    ok(&mgnc(&args));
    let eval = |w: &Path| {
        mgnc(&["eval", s(&infer), "--weights", s(w), "--data", "data/digits_test.safetensors"])
    };
    assert!(ok(&eval(&both)).contains("accuracy"));

    // One value changed under the alias: strict loading says which two names disagree.
    let untied = dir.join("untied.safetensors");
    edited(&both, &untied, |t| poison(t, "head.weight", &[0.125]));
    let err = refused(&eval(&untied));
    assert!(
        err.contains(&format!(
            "{}: the checkpoint does not match the model's parameters: `head.weight` is tied to \
             `fc2.weight` in the model, but the file holds other values under the two names \
             (element 0: 0.125 in `head.weight`,",
            untied.display()
        )),
        "{err}"
    );
    let mut args = train_plan_args(&train, "2", &both);
    args.extend_from_slice(&["--resume", s(&untied)]);
    let err = refused(&mgnc(&args));
    assert!(err.contains("`head.weight` is tied to `fc2.weight`"), "{err}");

    // Saved under the alias alone: the parameter is loaded from it, with a note.
    let alias_only = dir.join("alias-only.safetensors");
    edited(&both, &alias_only, |t| t.retain(|(n, _)| n != "fc2.weight"));
    let log = ok(&eval(&alias_only));
    assert!(log.contains("loaded from an alias (1):\n  fc2.weight <- head.weight"), "{log}");
    let accuracy = |log: &str| log.lines().find(|l| l.starts_with("accuracy")).map(String::from);
    assert_eq!(accuracy(&log), accuracy(&ok(&eval(&both))), "the same weights");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_checkpoint_without_a_computed_buffer_loads_it_computed() {
    let dir = scratch("computed");
    let model = "tests/valid/computed_tables.mgn";
    // `w` alone: `pos.table` is computed from its init, as a fresh session computes it.
    let weights = dir.join("w.safetensors");
    let w = Tensor::f32(vec![8], vec![1.0; 8]);
    checkpoint::save(&weights, &[("w".to_string(), &w)], &[]).expect("written");
    let inputs = dir.join("x.safetensors");
    let x = Tensor::f32(vec![6, 8], (0..48).map(|i| (i as f32 * 0.37).sin()).collect());
    checkpoint::save(&inputs, &[("x".to_string(), &x)], &[]).expect("written");
    let (loaded, fresh) = (dir.join("loaded.safetensors"), dir.join("fresh.safetensors"));
    let run = |out: &Path, weights: Option<&Path>| {
        let mut args = vec!["run", model, "--inputs", s(&inputs), "--out", s(out)];
        if let Some(w) = weights {
            args.extend_from_slice(&["--weights", s(w)]);
        }
        ok(&mgnc(&args))
    };
    let log = run(&loaded, Some(&weights));
    assert!(log.contains("computed, not in the checkpoint (1):\n  pos.table"), "{log}");
    assert!(!log.contains("warning"), "a strict load, clean: {log}");
    // The same output as a session that initialized everything (`w` starts at ones).
    run(&fresh, None);
    let y = |p: &Path| checkpoint::load(p).expect("loads").get("output.y").cloned();
    assert!(y(&loaded).is_some());
    assert_eq!(y(&loaded), y(&fresh));
    // A missing parameter is still refused.
    let table = Tensor::f32(vec![6, 8], vec![0.0; 48]);
    checkpoint::save(&weights, &[("pos.table".to_string(), &table)], &[]).expect("written");
    let err = common::refused(&mgnc(&[
        "run",
        model,
        "--inputs",
        s(&inputs),
        "--out",
        s(&loaded),
        "--weights",
        s(&weights),
    ]));
    assert!(err.contains("`w` (f32[8]) is not in the file"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
