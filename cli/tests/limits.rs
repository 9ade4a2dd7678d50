//! Models too large for the machine, through the `mgnc` binary: an error naming the largest
//! tensors and their model lines, before anything that large is allocated or any GPU kernel is
//! generated — never an abort in the allocator or a kernel compiler's message.

mod common;

use common::{mgnc_env as mgnc, refused, scratch, text};

const INPUTS: &str = "tests/fixtures/digits_mlp/inputs.safetensors";
const WEIGHTS: &str = "tests/fixtures/digits_mlp/weights.safetensors";

#[test]
fn a_plan_past_32_bit_gpu_offsets_builds_for_the_cpu_with_a_note_in_the_models_terms() {
    // It failed with naga's `numeric literal not representable … 274877906944u`.
    let o = mgnc(&["build", "models/digits_mlp.mgn", "--set", "batch=2147483648"], &[]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("note: this plan cannot run on a GPU"), "{err}");
    assert!(err.contains("models/digits_mlp.mgn:15:") && err.contains("--set"), "{err}");
    assert!(!err.contains("literal") && !err.contains("WGSL"), "{err}");
}

#[test]
fn parameters_larger_than_the_host_are_refused_by_name_before_they_are_allocated() {
    if mgn_runtime::memory::available().is_none() {
        eprintln!("this platform does not say how much memory is free: nothing to check");
        return;
    }
    // 2^33 × 64 floats in `fc1.weight` alone: 2 TiB.
    let out = scratch("params").join("out.safetensors");
    let args = ["run", "models/digits_mlp.mgn", "--set", "hidden=8589934592", "--inputs", INPUTS];
    let o = mgnc(
        &[&args[..], &["--out", out.to_str().expect("utf-8"), "--backend", "cpu"]].concat(),
        &[],
    );
    let err = refused(&o);
    assert!(err.contains("needs about") && err.contains("of host memory"), "{err}");
    assert!(err.contains("parameter `fc1.weight` f32[8589934592, 64] (2.00 TiB)"), "{err}");

    // The same from a plan file holding one parameter of 2^38 elements.
    let plan = scratch("plan").join("big.mgnplan");
    let p = plan.to_str().expect("utf-8");
    let o = mgnc(&["build", "models/digits_mlp.mgn", "--set", "hidden=4294967296", "-o", p], &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = mgnc(&["run", p, "--inputs", INPUTS, "--out", out.to_str().expect("utf-8")], &[]);
    let err = refused(&o);
    assert!(err.contains("parameter `fc1.weight` f32[4294967296, 64]"), "{err}");
}

#[test]
fn mismatched_weights_are_reported_before_a_large_model_is_allocated() {
    let out = scratch("weights").join("out.safetensors");
    let o = mgnc(
        &[
            "run",
            "models/digits_mlp.mgn",
            "--set",
            "hidden=8589934592",
            "--weights",
            WEIGHTS,
            "--inputs",
            INPUTS,
            "--out",
            out.to_str().expect("utf-8"),
            "--backend",
            "cpu",
        ],
        &[],
    );
    let err = refused(&o);
    let first = err.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(first.contains("does not match") && first.contains("`fc1.weight`"), "{err}");
    assert!(!err.contains("host memory"), "the mismatch comes first: {err}");
}

#[test]
fn an_arena_past_the_devices_binding_is_refused_naming_the_largest_values() {
    if !mgn_gpu::testing::device_listed() {
        return;
    }
    // A batch of 2^20: the input alone is 256 MiB, past the 128 MiB binding of the Vulkan
    // floor (`MGN_MIN_SPEC=1` gives any device that floor); the session opens on the GPU, and
    // is refused, before the inputs are read.
    let out = scratch("gpu").join("out.safetensors");
    let args = ["run", "models/digits_mlp.mgn", "--set", "batch=1048576", "--inputs", INPUTS];
    let o = mgnc(
        &[&args[..], &["--out", out.to_str().expect("utf-8"), "--backend", "vulkan"]].concat(),
        &[("MGN_MIN_SPEC", "1")],
    );
    let err = refused(&o);
    assert!(err.contains("needs a GPU arena of"), "{err}");
    assert!(err.contains("more than one storage binding on this device holds (128 MiB)"), "{err}");
    assert!(err.contains("models/digits_mlp.mgn:"), "the largest values name their lines: {err}");
}

/// `bench` draws random inputs for every input of the model: past the host's memory it refuses
/// by name, as `run` and `train` do, before drawing one (it aborted in the allocator asking for
/// 512 GiB, or drew gigabytes of tokens for a run that could never fit).
#[test]
fn bench_refuses_sizes_past_the_host_before_drawing_inputs() {
    if mgn_runtime::memory::available().is_none() {
        eprintln!("this platform does not say how much memory is free: nothing to check");
        return;
    }
    for (model, set) in [
        ("models/digits_mlp.mgn", "batch=2147483648"),
        ("models/digits_mlp.mgn", "batch=1000000000"),
        ("models/digits_cnn.mgn", "batch=1000000000"),
        ("models/tiny_llama.mgn", "T=1000000000"),
    ] {
        let o = mgnc(&["bench", model, "--set", set, "--backend", "cpu"], &[]);
        let err = refused(&o);
        assert!(err.contains("a benchmark of `") && err.contains("of host memory"), "{err}");
        assert!(err.contains(&format!("{model}:")), "the model's line: {err}");
    }
}

/// A value only the training plan has (a derivative, a fused product) past the 2^40 elements a
/// plan holds is a range error at the model's line, not the plan validator's internal error.
#[test]
fn training_values_past_a_plans_limit_are_located_range_errors() {
    for (model, set) in
        [("models/tiny_gpt.mgn", "vocab=2147483647"), ("models/tiny_llama.mgn", "vocab=4294967296")]
    {
        let o = mgnc(&["build", model, "--mode", "train", "--set", set], &[]);
        let err = refused(&o);
        assert!(err.contains("E0301") && !err.contains("E0999"), "{err}");
        assert!(err.contains("more than the 2^40 a plan can hold"), "{err}");
        assert!(err.contains(&format!("[{model}:")), "{err}");
    }
}
