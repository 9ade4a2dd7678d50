//! `mgnc bench` on small shapes: the JSON report has every field and consistent statistics, the
//! table has every row, models without a loss or without batch/sequence arguments are measured
//! as far as they go with a note, unavailable backends are refused, and `--backend vulkan` times
//! the GPU (lavapipe in CI). Timings are never asserted on: only their shape
//! (p25 ≤ median ≤ p75, sample counts).

mod common;

use common::text;
use serde_json::Value;
use std::process::Output;

/// `mgnc bench ARGS…`.
fn mgnc(args: &[&str]) -> Output {
    common::mgnc(&[&["bench"], args].concat())
}

/// Runs `mgnc bench … --json` and parses stdout, which must be exactly one JSON object.
fn bench_json(args: &[&str]) -> (Value, String) {
    let mut all = args.to_vec();
    all.extend(["--json", "--samples", "3", "--warmup", "1"]);
    let out = mgnc(&all);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "mgnc bench {args:?} failed: {stderr}{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    (v, stderr)
}

fn assert_timing(v: &Value, what: &str, samples: u64) {
    let t = &v["measurements"][what];
    let get = |k: &str| {
        t[k].as_f64().unwrap_or_else(|| panic!("{what}.{k} missing or not a number: {t}"))
    };
    let (median, p25, p75) = (get("median_ms"), get("p25_ms"), get("p75_ms"));
    assert!(
        p25 >= 0.0 && p25 <= median && median <= p75,
        "{what}: p25 {p25}, median {median}, p75 {p75}"
    );
    assert_eq!(t["samples"].as_u64(), Some(samples), "{what}: {t}");
}

fn assert_memory(m: &Value, what: &str) {
    for k in [
        "param_bytes",
        "input_bytes",
        "logical_bytes",
        "peak_live_bytes",
        "arena_bytes",
        "arena_values_bytes",
    ] {
        assert!(m[k].as_u64().is_some(), "memory.{what}.{k} missing: {m}");
    }
    let (input, logical, peak) = (
        m["input_bytes"].as_u64().unwrap(),
        m["logical_bytes"].as_u64().unwrap(),
        m["peak_live_bytes"].as_u64().unwrap(),
    );
    assert!(
        input <= peak && peak <= logical,
        "memory.{what}: inputs {input}, peak {peak}, logical {logical}"
    );
    // The planned arena cannot beat the lower bound, and holds the parameters besides.
    let (arena, values, params) = (
        m["arena_bytes"].as_u64().unwrap(),
        m["arena_values_bytes"].as_u64().unwrap(),
        m["param_bytes"].as_u64().unwrap(),
    );
    assert!(
        peak <= values && values + params <= arena,
        "memory.{what}: peak {peak}, arena values {values}, params {params}, arena {arena}"
    );
}

fn notes(v: &Value) -> Vec<String> {
    v["notes"]
        .as_array()
        .expect("notes is a list")
        .iter()
        .map(|n| n.as_str().expect("a note is text").to_string())
        .collect()
}

#[test]
fn json_report_has_every_field_for_the_digits_mlp() {
    let (v, stderr) = bench_json(&["models/digits_mlp.mgn"]);
    assert_eq!(v["model"], "DigitsMlp");
    assert_eq!(v["config"]["batch"], 64);
    assert_eq!(v["config"]["hidden"], 128);
    assert_eq!(v["backend"], "cpu");
    assert!(
        v["device"].as_str().is_some_and(|d| d.starts_with("CPU (") && d.ends_with(" threads)")),
        "{}",
        v["device"]
    );
    assert_eq!(v["clock"], "wall");
    assert!(v["setup_ms"].is_null(), "no GPU setup on the CPU: {}", v["setup_ms"]);
    assert!(v["compile_minimal_ms"].as_f64().is_some());
    assert_eq!((v["warmup"].as_u64(), v["samples"].as_u64()), (Some(1), Some(3)));
    for m in
        ["compile", "compile_train", "forward", "forward_minimal", "forward_backward", "train_step"]
    {
        assert_timing(&v, m, 3);
    }
    assert_eq!(v["measurements"]["forward_minimal"]["settings"], serde_json::json!({ "batch": 1 }));
    // 64·128 + 128 + 128·10 + 10 parameters in f32.
    let params = (64 * 128 + 128 + 128 * 10 + 10) * 4;
    assert_eq!(v["param_count"], params / 4);
    assert_eq!(v["buffer_count"], 0, "no running statistics or counters");
    for plan in ["inference", "minimal", "training"] {
        assert_memory(&v["memory"][plan], plan);
        assert_eq!(v["memory"][plan]["param_bytes"], params, "{plan}");
        assert!(v["memory"][plan]["gpu"].is_null(), "no GPU arena on the CPU");
    }
    // Inputs: images f32[64, 64]; the training plan also reads labels i32[64].
    assert_eq!(v["memory"]["inference"]["input_bytes"], 64 * 64 * 4);
    assert_eq!(v["memory"]["minimal"]["input_bytes"], 64 * 4);
    assert_eq!(v["memory"]["training"]["input_bytes"], 64 * 64 * 4 + 64 * 4);
    // Adam keeps two moments of every trained parameter.
    assert_eq!(v["memory"]["training"]["optimizer_state_bytes"], 2 * params);
    // Fewer than 20 samples: allowed, with a warning and a note.
    assert!(stderr.contains("warning: 3 samples per measurement, fewer than 20"), "{stderr}");
    assert!(notes(&v).iter().any(|n| n.contains("fewer than 20")), "{:?}", notes(&v));
}

#[test]
fn table_lists_every_measurement_and_the_memory() {
    let out = mgnc(&[
        "models/digits_cnn.mgn",
        "--set",
        "batch=4",
        "--set",
        "c1=4",
        "--set",
        "c2=6",
        "--samples",
        "3",
        "--warmup",
        "1",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    for want in [
        "DigitsCnn (models/digits_cnn.mgn",
        "config: batch=4 c1=4 c2=6",
        "wall-clock ms per call: median and interquartile range (p25–p75) of 3 calls after 1 \
         warm-up calls",
        "median",
        "compile (check, elaborate, lower)",
        "compile, training plan (+ autodiff)",
        "forward at batch=1",
        "forward + loss + backward",
        "training step (Adam, lr 0.001)",
        "peak live (free after last use)",
        "planned arena, inputs and values (reused)",
        "planned arena, total (parameters included)",
        "optimizer state",
    ] {
        assert!(stdout.contains(want), "no `{want}` in:\n{stdout}");
    }
}

/// `--backend auto` (the default) decides where the sessions run when the first one opens, and
/// says so once for the three plans it measures: on a machine with only a software device (CI's
/// lavapipe) or none, one note that it runs on the CPU and a report on the CPU; on one with a
/// hardware GPU, no note and a report on it.
#[test]
fn auto_decides_once_at_the_first_session() {
    let out =
        mgnc(&["models/digits_mlp.mgn", "--set", "batch=4", "--samples", "3", "--warmup", "1"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}{stdout}");
    let cpu_notes = stderr.lines().filter(|l| l.contains("running on the CPU backend")).count();
    if stdout.contains(", backend cpu,") {
        assert_eq!(cpu_notes, 1, "one note for three plans:\n{stderr}");
    } else {
        assert!(stdout.contains(", backend vulkan,") || stdout.contains(", backend metal,"));
        assert_eq!(cpu_notes, 0, "{stderr}");
    }
}

#[test]
fn a_model_without_a_loss_is_measured_forward_only() {
    let (v, _) = bench_json(&[
        "models/tiny_bert.mgn",
        "--set",
        "d=16",
        "--set",
        "ffn=32",
        "--set",
        "n_layers=1",
        "--set",
        "T=8",
    ]);
    assert_timing(&v, "compile", 3);
    assert_timing(&v, "forward", 3);
    assert_timing(&v, "forward_minimal", 3);
    assert_eq!(
        v["measurements"]["forward_minimal"]["settings"],
        serde_json::json!({ "B": 1, "T": 1 })
    );
    for m in ["compile_train", "forward_backward", "train_step"] {
        assert!(v["measurements"][m].is_null(), "{m}: {}", v["measurements"][m]);
    }
    assert!(v["memory"]["training"].is_null());
    assert_memory(&v["memory"]["inference"], "inference");
    let notes = notes(&v);
    assert!(notes.iter().any(|n| n.contains("forward only") && n.contains("no loss")), "{notes:?}");
    // The attention mask indexes nothing, so it is drawn from {0, 1}.
    assert!(notes.iter().any(|n| n.contains("attention_mask")), "{notes:?}");
}

#[test]
fn inference_measures_a_model_with_a_loss_forward_only() {
    let (v, _) = bench_json(&["models/digits_mlp.mgn", "--set", "batch=8", "--inference"]);
    assert_timing(&v, "forward", 3);
    assert_timing(&v, "forward_minimal", 3);
    for m in ["compile_train", "forward_backward", "train_step"] {
        assert!(v["measurements"][m].is_null(), "{m}: {}", v["measurements"][m]);
    }
    assert!(v["memory"]["training"].is_null());
    let notes = notes(&v);
    assert!(notes.iter().any(|n| n.contains("`--inference`")), "{notes:?}");
    // Without the flag the same model has its training cells.
    let (v, _) = bench_json(&["models/digits_mlp.mgn", "--set", "batch=8"]);
    assert_timing(&v, "train_step", 3);
}

/// `bench/ab.sh` passes `BENCH_ARGS` to every `mgnc bench` it runs: with `--inference`, both
/// sides' runs time the forward cells and no training step, and its table says so.
#[test]
fn ab_script_passes_bench_args_to_every_run() {
    let out_dir = common::scratch("ab_bench_args");
    let mgnc = env!("CARGO_BIN_EXE_mgnc");
    let run = std::process::Command::new("bash")
        .args(["bench/ab.sh", "digits_mlp:batch=8"])
        .current_dir(common::root())
        .envs([("A", mgnc), ("B", mgnc), ("BACKEND", "cpu"), ("ROUNDS", "1")])
        .envs([("SAMPLES", "3"), ("WARMUP", "1"), ("BENCH_ARGS", "--inference")])
        .env("OUT", &out_dir)
        .output()
        .expect("bash runs bench/ab.sh");
    let table = text(&run.stdout);
    assert!(run.status.success(), "{}{table}", text(&run.stderr));
    for side in ["A", "B"] {
        let file = out_dir.join(format!("digits_mlp_batch_8.{side}.1.json"));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("a run"))
            .expect("one JSON object");
        assert_timing(&v, "forward", 3);
        assert!(v["measurements"]["train_step"].is_null(), "{side}: {}", v["measurements"]);
    }
    assert!(table.contains("| forward |") && !table.contains("training step"), "{table}");
}

#[test]
fn the_minimal_shape_is_skipped_with_a_note_when_the_model_has_no_batch_or_sequence_argument() {
    let (v, _) = bench_json(&["tests/valid/file_import.mgn"]);
    assert!(v["measurements"]["forward_minimal"].is_null());
    assert!(v["memory"]["minimal"].is_null());
    assert_timing(&v, "train_step", 3);
    assert!(notes(&v).iter().any(|n| n.contains("no minimal-shape latency")), "{:?}", notes(&v));
}

#[test]
fn the_minimal_shape_of_a_language_model_is_one_token() {
    let (v, _) = bench_json(&[
        "models/tiny_llama.mgn",
        "--set",
        "vocab=32",
        "--set",
        "d=16",
        "--set",
        "n_layers=1",
        "--set",
        "hidden=16",
        "--set",
        "T=8",
    ]);
    assert_eq!(v["config"]["T"], 8, "the full forward keeps the user's setting");
    assert_eq!(
        v["measurements"]["forward_minimal"]["settings"],
        serde_json::json!({ "B": 1, "T": 1 })
    );
    let full = v["memory"]["inference"]["input_bytes"].as_u64().unwrap();
    assert_eq!(full, 4 * 8 * 4, "tokens i32[4, 8]");
    assert_eq!(v["memory"]["minimal"]["input_bytes"], 4, "tokens i32[1, 1]");
}

#[test]
fn unavailable_backends_and_bad_arguments_are_refused() {
    if !cfg!(any(target_os = "macos", target_os = "ios")) {
        let out = mgnc(&["models/digits_mlp.mgn", "--backend", "metal"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("Metal exists only on Apple platforms"),
            "{}",
            text(&out.stderr)
        );
    }

    let out = mgnc(&["models/digits_mlp.mgn", "--samples", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("`--samples` must be at least 1"), "{}", text(&out.stderr));

    let out = mgnc(&["tests/errors/shapes_add_broadcast.mgn"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("E0203"), "{}", text(&out.stderr));
}

/// `--backend vulkan` measures the GPU backend, when a Vulkan device exists (lavapipe in CI, where
/// `MGN_REQUIRE_GPU=1` makes its absence a failure; skipped elsewhere).
#[test]
fn vulkan_backend_times_the_gpu_and_says_so() {
    if cfg!(any(target_os = "macos", target_os = "ios")) || !mgn_gpu::testing::device_listed() {
        return;
    }
    let small = [
        "models/digits_mlp.mgn",
        "--set",
        "batch=8",
        "--set",
        "hidden=16",
        "--backend",
        "vulkan",
        "--samples",
        "3",
        "--warmup",
        "1",
    ];
    let out = mgnc(&[&small[..], &["--json"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    assert_eq!(v["backend"], "vulkan");
    let device = v["device"].as_str().expect("the device is named");
    assert!(!device.is_empty() && !device.starts_with("CPU ("), "{device}");
    assert!(
        v["timing"].as_str().is_some_and(|t| t.contains("submission") && t.contains("synchronize")),
        "{}",
        v["timing"]
    );
    for m in
        ["compile", "compile_train", "forward", "forward_minimal", "forward_backward", "train_step"]
    {
        assert_timing(&v, m, 3);
    }
    for s in ["inference", "minimal", "training"] {
        assert!(
            v["setup_ms"][s].as_f64().is_some_and(|ms| ms >= 0.0),
            "setup_ms.{s}: {}",
            v["setup_ms"]
        );
    }
    for plan in ["inference", "minimal", "training"] {
        assert_memory(&v["memory"][plan], plan);
        // What the GPU session allocated: the parameters, the values, and (training) the
        // optimizer state past them.
        let g = &v["memory"][plan]["gpu"];
        let get = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("memory.{plan}.gpu.{k}: {g}"));
        let (params, values, total) = (get("param_bytes"), get("values_bytes"), get("total_bytes"));
        assert!(params > 0 && values > 0 && params + values <= total, "{plan}: {g}");
        if plan == "training" {
            let state = v["memory"][plan]["optimizer_state_bytes"].as_u64().expect("counted");
            assert!(params + values + state <= total, "{plan}: {g}, optimizer state {state}");
        }
    }
    assert!(notes(&v).iter().any(|n| n.contains("Session::train_step")), "{:?}", notes(&v));
    // Where each session's setup went, phase by phase.
    for plan in ["inference", "training"] {
        let note = format!("GPU setup of the {plan} plan");
        assert!(
            notes(&v).iter().any(|n| n.starts_with(&note) && n.contains("pipelines")),
            "{:?}",
            notes(&v)
        );
    }

    // The table names the backend and how GPU times are taken.
    let out = mgnc(&small);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    for want in [
        &format!("on {device}, backend vulkan") as &str,
        "GPU timing: uploading the inputs, one submission and the wait",
        "GPU session setup",
        "training step (Adam, lr 0.001)",
    ] {
        assert!(stdout.contains(want), "no `{want}` in:\n{stdout}");
    }
    check_profiles(&small);
}

/// `--profile` of the `small` run: GPU time and work per op family, the roofline with the
/// device's rates, the slowest dispatches.
fn check_profiles(small: &[&str]) {
    // --profile splits one run's GPU time by op family, from timestamps.
    let peaks = ["--peak-tflops", "67", "--peak-tbps", "4.3"];
    let out = mgnc(&[small, &["--json", "--profile"], &peaks].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
    for plan in ["forward", "forward + loss + backward"] {
        let ops = v["profile"][plan]
            .as_array()
            .unwrap_or_else(|| panic!("no profile of {plan}: {}", v["profile"]));
        let names: Vec<&str> = ops.iter().filter_map(|o| o["op"].as_str()).collect();
        // Products run as `matmul` or, with their bias and activation fused in, `matmul_epilogue`.
        assert!(names.iter().any(|n| n.starts_with("matmul")), "{plan}: {names:?}");
        assert!(
            ops.iter().all(|o| o["ms"].as_f64().is_some_and(|ms| ms >= 0.0)
                && o["dispatches"].as_u64().is_some_and(|n| n >= 1)
                && o["bytes"].as_f64().is_some_and(|b| b > 0.0)
                && o["floor_ms"].as_f64().is_some_and(|f| f > 0.0)),
            "{plan}: {ops:?}"
        );
        // A product's FLOPs are its multiply-adds, many per word it moves.
        let product =
            (ops.iter().find(|o| o["op"].as_str().is_some_and(|n| n.starts_with("matmul"))))
                .expect("a product");
        let (f, b) = (product["flops"].as_f64().unwrap(), product["bytes"].as_f64().unwrap());
        assert!(f > b / 4.0, "{plan}: {product}");
    }
    assert!(v["profile"]["forward + loss + backward"]
        .as_array()
        .expect("checked")
        .iter()
        .any(|o| o["op"] == "softmax_cross_entropy_grad"));
    // Given the device's rates, the table sets each family against its floor.
    let out = mgnc(&[small, &["--profile"], &peaks].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    for want in ["TFLOP/s", "of floor", "the plan's floor"] {
        assert!(stdout.contains(want), "no `{want}` in:\n{stdout}");
    }
    // ... and names its slowest dispatches, slowest first, each with the model line it came from.
    for plan in ["forward", "forward + loss + backward"] {
        let slow = v["profile_slowest"][plan]
            .as_array()
            .unwrap_or_else(|| panic!("no slowest dispatches of {plan}: {}", v["profile_slowest"]));
        assert!(!slow.is_empty(), "{plan}");
        let ms: Vec<f64> = slow.iter().filter_map(|o| o["ms"].as_f64()).collect();
        assert!(ms.len() == slow.len() && ms.windows(2).all(|w| w[0] >= w[1]), "{plan}: {slow:?}");
        assert!(
            slow.iter().all(|o| o["step"].as_str().is_some_and(|s| s.contains(".mgn:"))),
            "{plan}: {slow:?}"
        );
    }
}

/// A training plan past what the device holds (one 128 MiB binding under `MGN_MIN_SPEC=1`) is
/// noted and left out; the inference plans that fit are still measured on the GPU.
#[test]
fn a_training_plan_the_gpu_cannot_hold_is_noted_and_the_rest_measured() {
    if cfg!(any(target_os = "macos", target_os = "ios")) || !mgn_gpu::testing::device_listed() {
        return;
    }
    // 94 MiB of parameters: the inference arena fits, with the gradients the training one not.
    let args = ["models/digits_mlp.mgn", "--set", "batch=8", "--set", "hidden=327680"];
    let run = ["--backend", "vulkan", "--json", "--samples", "1", "--warmup", "0"];
    let out = common::mgnc_env(&[&["bench"], &args[..], &run].concat(), &[("MGN_MIN_SPEC", "1")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(v["backend"], "vulkan");
    assert_timing(&v, "forward", 1);
    assert_timing(&v, "forward_minimal", 1);
    assert!(v["measurements"]["forward_backward"].is_null(), "{}", v["measurements"]);
    assert!(v["measurements"]["train_step"].is_null(), "{}", v["measurements"]);
    let why = notes(&v).into_iter().find(|n| n.starts_with("the training plan was not measured"));
    let why = why.unwrap_or_else(|| panic!("no note on the training plan: {:?}", notes(&v)));
    assert!(why.contains("more than one storage binding on this device holds (128 MiB)"), "{why}");
    assert!(why.contains("models/digits_mlp.mgn:"), "{why}");
}
