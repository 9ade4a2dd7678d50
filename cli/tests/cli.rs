//! The `mgnc` binary as a user runs it: exit codes, output formats and flags.

mod common;

use common::{mgnc, mgnc_env, text};

#[test]
fn check_clean_file_exits_zero() {
    let out = mgnc(&["check", "models/digits_mlp.mgn", "stdlib/nn.mgn"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("checked models/digits_mlp.mgn (1 model)"));
}

#[test]
fn check_error_exits_one_with_rendered_diagnostic() {
    let out = mgnc(&["check", "tests/errors/shapes_add_broadcast.mgn"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("E0203") && err.contains("cannot broadcast f32[8, 4] with f32[8, 3]"),
        "{err}"
    );
    assert!(err.contains("tests/errors/shapes_add_broadcast.mgn:10"), "{err}");
    assert!(err.contains("error: 1 error found"));
}

#[test]
fn json_messages_are_one_object_per_line() {
    let out = mgnc(&[
        "check",
        "--message-format",
        "json",
        "tests/errors/imports_cycle.mgn",
        "tests/errors/names_unknown_builtin_typo.mgn",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 2, "{stdout}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).expect("valid JSON line");
        assert!(v["code"].as_str().is_some_and(|c| c.starts_with('E')));
        assert!(v["file"].as_str().is_some_and(|f| f.ends_with(".mgn")));
        assert!(v["line"].as_u64().is_some_and(|n| n >= 1));
    }
    assert!(stdout.contains("did you mean `softmax`?"));
}

#[test]
fn build_emits_ir_with_parameter_table() {
    let out = mgnc(&["build", "models/digits_mlp.mgn", "--emit", "ir"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ir = text(&out.stdout);
    assert!(ir.contains("fc1.weight") && ir.contains("[128, 64]"), "{ir}");
    assert!(ir.contains("total: 9,610 parameters"), "{ir}");
    assert!(ir.contains("softmax_cross_entropy"), "{ir}");
    assert!(ir.contains("models/digits_mlp.mgn:"), "every node names its line: {ir}");
}

/// The summary's first figure is PyTorch's: trainable parameters. Running statistics and
/// counters (buffers), const tables, a KV cache (state) and `--freeze`'s parameters are counted
/// apart, not as parameters.
#[test]
fn build_summary_counts_trainable_parameters_apart_from_buffers_tables_and_state() {
    let summary = |args: &[&str]| {
        let out = mgnc(args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let s = summary(&["build", "models/resnet50.mgn", "--set", "B=1", "--set", "size=64"]);
    // torchvision's resnet50: 25,557,032 parameters, and 53 batch norms' running_mean,
    // running_var and num_batches_tracked.
    assert!(s.starts_with("ResNet50: 25,557,032 trainable parameters, 53,173 in buffers, "), "{s}");
    let s = summary(&["build", "tests/valid/computed_tables.mgn"]);
    assert!(
        s.starts_with("Tables: 8 trainable parameters, 48 in buffers, 6 in const tables, "),
        "{s}"
    );
    let s = summary(&["build", "models/digits_cnn.mgn", "--mode", "train", "--freeze", "stage1"]);
    assert!(
        s.starts_with("DigitsCnn: 5,962 trainable parameters, 176 frozen, 98 in buffers, "),
        "{s}"
    );
    let s = summary(&["build", "models/digits_mlp.mgn"]);
    assert!(s.starts_with("DigitsMlp: 9,610 trainable parameters, 14 operations"), "{s}");
    let dir = std::env::temp_dir().join(format!("mgn-cli-summary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let acc = dir.join("acc.mgn");
    let text_of = "model Acc {\n    input x: f32[4]\n    w = param f32[4] init ones\n    \
                   total = state f32[16]\n    forward {\n        let y = sum(self.total) + x * \
                   self.w\n        self.total = concat([y, y, y, y], axis = 0)\n        \
                   output y\n    }\n}\n";
    std::fs::write(&acc, text_of).expect("written");
    let s = summary(&["build", acc.to_str().expect("utf-8")]);
    assert!(s.starts_with("Acc: 4 trainable parameters, 16 in state, "), "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn set_overrides_and_rejects_unknown_arguments() {
    let out = mgnc(&["build", "models/digits_mlp.mgn", "--emit", "ir", "--set", "batch=3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("f32[3, 64]"));

    let out = mgnc(&["build", "models/digits_mlp.mgn", "--set", "bach=3"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("has no argument `bach`") && err.contains("did you mean `batch`?"),
        "{err}"
    );

    let out = mgnc(&["build", "models/digits_mlp.mgn", "--set", "batch=many"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("expected an integer"));

    let out = mgnc(&["build", "models/digits_mlp.mgn", "--set", "batch"]);
    assert_eq!(out.status.code(), Some(2), "a malformed flag is a usage error");
}

#[test]
fn unreadable_files_are_errors_not_panics() {
    let out = mgnc(&["check", "models/does_not_exist.mgn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read `models/does_not_exist.mgn`: no such file"));
    let out = mgnc(&["check", "models"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read `models`"));
}

#[test]
fn build_without_a_model_says_so() {
    let out = mgnc(&["build", "stdlib/nn.mgn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("this file defines no model to build"));
}

#[test]
fn info_lists_devices_or_says_why_there_are_none() {
    let out = mgnc(&["info"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("GPU backend's device:") || s.contains("no GPU can be used:"), "{s}");
    assert!(s.contains("CPU backend:"), "{s}");

    let no_driver = [
        ("VK_DRIVER_FILES", "/nonexistent/icd.json"),
        ("VK_ICD_FILENAMES", "/nonexistent/icd.json"),
    ];
    let none = mgnc_env(&["info"], &no_driver);
    assert!(none.status.success());
    let s = text(&none.stdout);
    assert!(
        s.contains("no GPU can be used: ") && s.contains("mgnc runs on the CPU backend"),
        "{s}"
    );

    let floor = mgnc_env(&["info", "--json"], &[("MGN_MIN_SPEC", "1")]);
    let v: serde_json::Value =
        serde_json::from_str(text(&floor.stdout).trim()).expect("one JSON object");
    assert_eq!(v["min_spec"], true);
    assert!(v["devices"].is_array());
}

#[test]
fn build_stats_report_memory_and_validated_gpu_kernels() {
    let out = mgnc(&["build", "models/digits_cnn.mgn", "--mode", "train", "--stats"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("memory: parameters") && s.contains("planned") && s.contains("lower bound"),
        "{s}"
    );
    assert!(
        s.contains("gpu: ") && s.contains(" distinct kernels, all generated and validated by naga"),
        "{s}"
    );
    // The arena as the GPU runs the plan, after its own rewrites.
    assert!(s.contains("values planned ") && s.contains(" as the GPU runs the plan"), "{s}");
    // Its dispatches and the dependency levels they run in: at least one, at most one each.
    let gpu = s.split("gpu: ").nth(1).expect("a gpu line");
    let words: Vec<&str> = gpu.split_whitespace().collect();
    let (dispatches, levels): (usize, usize) = match words[..] {
        [d, "dispatches", "in", l, "levels,", ..] => (d.parse().unwrap(), l.parse().unwrap()),
        _ => panic!("{gpu}"),
    };
    assert!(0 < levels && levels <= dispatches, "{gpu}");
}

/// `--rewrites` picks the engine: none keeps autodiff's transposes of transposes, which greedy
/// removes; egglog works in a build with its feature and says how to get one in a build without.
#[test]
fn rewrites_pick_the_engine_and_egglog_says_when_it_is_not_built_in() {
    let steps = |engine: &str| {
        let args = ["build", "models/tiny_gpt.mgn", "--mode", "train", "--rewrites", engine];
        let out = mgnc(&args);
        assert!(out.status.success() || engine == "egglog", "{}", text(&out.stderr));
        let summary = text(&out.stdout);
        let n = summary.split("plan of ").nth(1).and_then(|s| s.split(' ').next());
        (out, n.map(|n| n.replace(',', "").parse::<usize>().expect("a count")))
    };
    let (none, greedy) = (steps("none").1.expect("built"), steps("greedy").1.expect("built"));
    assert!(greedy < none, "greedy {greedy}, none {none}");
    let (out, egglog) = steps("egglog");
    if cfg!(feature = "egglog") {
        assert!(egglog.is_some_and(|e| e <= greedy), "{}", text(&out.stderr));
    } else {
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1));
        assert!(err.contains("E0502") && err.contains("--features egglog"), "{err}");
    }
}

/// Files some editors save with a UTF-8 byte-order mark: checked, built, formatted (keeping
/// the mark) and imported like any other, with columns on the first line counted after it.
#[test]
fn files_with_a_byte_order_mark_are_read_like_any_other() {
    let dir = common::scratch("bom");
    let model = concat!(
        "use \"./lib.mgn\".{double}\n\nmodel M {\n    input x: f32[4]\n\n",
        "    forward {\n        output y = double(x)\n    }\n}\n"
    );
    let lib = "fn double(x: f32[N]) -> f32[N] {\n    x * 2\n}\n";
    std::fs::write(dir.join("m.mgn"), format!("\u{feff}{model}")).unwrap();
    std::fs::write(dir.join("lib.mgn"), format!("\u{feff}{lib}")).unwrap();
    let m = dir.join("m.mgn");
    let m = m.to_str().unwrap();
    common::ok(&mgnc(&["check", m]));
    common::ok(&mgnc(&["build", m]));
    common::ok(&mgnc(&["fmt", "--check", m]));
    std::fs::write(dir.join("bad.mgn"), "\u{feff}modle M {}\n").unwrap();
    let bad = dir.join("bad.mgn");
    let out = mgnc(&["check", "--message-format", "json", bad.to_str().unwrap()]);
    let v: serde_json::Value =
        serde_json::from_str(text(&out.stdout).lines().next().unwrap()).expect("a JSON diagnostic");
    assert_eq!((v["line"].as_u64(), v["column"].as_u64()), (Some(1), Some(1)), "{v}");
}
