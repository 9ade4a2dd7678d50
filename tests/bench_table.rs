//! `bench/table.py`, which writes the side-by-side Markdown from the JSON that `mgnc bench` and
//! `bench/torch_bench.py` leave: the roofline section it renders from mgnc's profile, and the
//! memory table.

use mgn_tests::root;
use std::process::Command;

#[test]
fn the_table_sets_each_op_family_against_its_floor() {
    let env = r#"{"workloads": ["tiny"], "torch": "skipped", "peaks": "67 TFLOP/s, 4.3 TB/s"}"#;
    // Two families of one profiled plan: 4 ms of products with a 1 ms floor, 1 ms of copies
    // with a 0.5 ms floor.
    let mgnc = r#"{"model": "tiny", "config": {}, "notes": [],
        "measurements": {"compile": {"median_ms": 1.0, "p25_ms": 1.0, "p75_ms": 1.0}},
        "profile": {"forward": [
            {"op": "matmul", "dispatches": 3, "ms": 4.0, "flops": 4.0e10, "bytes": 1.0e8,
             "floor_ms": 1.0},
            {"op": "add", "dispatches": 2, "ms": 1.0, "flops": 1.0e6, "bytes": 2.15e9,
             "floor_ms": 0.5}]}}"#;
    let text = table("bench_table_test", env, mgnc);
    assert!(text.contains("### Roofline per op family"), "{text}");
    // 4e10 FLOP in 4 ms is 10 TFLOP/s, a quarter of the time at the floor; 2.15 GB in 1 ms
    // is 2,150 GB/s, half.
    assert!(
        text.contains("| tiny | forward | matmul | 3 | 4.000 | 80% | 10.00 | 25 | 1.000 | 25% |"),
        "{text}"
    );
    assert!(text.contains("|  |  | add | 2 | 1.000 | 20% | 0.00 | 2150 | 0.500 | 50% |"), "{text}");
    assert!(
        text.contains("| whole plan (2 families) | 5 | 5.000 | 100% |  |  | 1.500 | 30% |"),
        "{text}"
    );
    assert!(text.contains("(67 TFLOP/s, 4.3 TB/s)"), "{text}");
}

#[test]
fn the_memory_table_takes_the_gpu_sessions_arena_where_the_run_had_one() {
    let env = r#"{"workloads": ["tiny"], "torch": "skipped"}"#;
    // The inference plan ran on the GPU, whose rewritten program took 2 MiB of values where the
    // plan as compiled plans 3; the training plan has no GPU figures (5 MiB as compiled).
    let mib = 1 << 20;
    let mgnc = format!(
        r#"{{"model": "tiny", "config": {{}}, "notes": [],
        "measurements": {{"compile": {{"median_ms": 1.0, "p25_ms": 1.0, "p75_ms": 1.0}}}},
        "memory": {{
            "inference": {{"param_bytes": {mib}, "arena_values_bytes": {}, "logical_bytes": {},
                "peak_live_bytes": {mib}, "gpu": {{"param_bytes": {mib}, "values_bytes": {},
                "total_bytes": {}}}}},
            "training": {{"param_bytes": {mib}, "arena_values_bytes": {}, "logical_bytes": {},
                "peak_live_bytes": {}, "optimizer_state_bytes": {}, "gpu": null}}}}}}"#,
        3 * mib,
        9 * mib,
        2 * mib,
        3 * mib,
        5 * mib,
        20 * mib,
        4 * mib,
        2 * mib,
    );
    let text = table("bench_table_memory_test", env, &mgnc);
    assert!(text.contains("| tiny | 1.0 | 2.0 | 9.0 | 1.0 | 5.0 | 20.0 | 4.0 | 2.0 |"), "{text}");
}

/// `bench/table.py`'s output over a folder `target/NAME` holding `env` as env.json and `mgnc`
/// as tiny.mgnc.json; it must succeed.
fn table(name: &str, env: &str, mgnc: &str) -> String {
    let dir = root().join("target").join(name);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    std::fs::write(dir.join("env.json"), env).expect("env.json");
    std::fs::write(dir.join("tiny.mgnc.json"), mgnc).expect("tiny.mgnc.json");
    python("bench/table.py", &dir)
}

/// What the Python script `script` prints over the folder `dir`; it must succeed.
fn python(script: &str, dir: &std::path::Path) -> String {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .args([script, dir.to_str().expect("a UTF-8 path")])
        .output()
        .unwrap_or_else(|e| panic!("python3 runs {script}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}{text}", String::from_utf8_lossy(&out.stderr));
    text
}

/// `bench/ab_table.py`, the table of `bench/ab.sh`: each round's medians of both binaries and
/// B's median over rounds against A's, for the cells both measured.
#[test]
fn the_ab_table_sets_the_second_binary_against_the_first_round_by_round() {
    let dir = root().join("target").join("bench_ab_table_test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let run = |forward: f64, train: Option<f64>| {
        let train =
            train.map_or(String::new(), |t| format!(r#", "train_step": {{"median_ms": {t}}}"#));
        let forward = format!(r#""forward": {{"median_ms": {forward}}}"#);
        format!(r#"{{"device": "H200", "measurements": {{{forward}{train}}}}}"#)
    };
    // A: 2.0 and 4.0 (median 3.0); B: 1.0 and 2.0 (median 1.5). Only B timed a training step
    // in its first round: that cell is left out.
    for (file, text) in [
        ("tiny.A.1.json", run(2.0, None)),
        ("tiny.A.2.json", run(4.0, None)),
        ("tiny.B.1.json", run(1.0, Some(9.0))),
        ("tiny.B.2.json", run(2.0, None)),
        ("notes.txt", "not a run".into()),
    ] {
        std::fs::write(dir.join(file), text).expect("a run");
    }
    let text = python("bench/ab_table.py", &dir);
    assert!(
        text.contains("| tiny (H200) | forward | 2.000 / 4.000 | 1.000 / 2.000 | 0.500 |"),
        "{text}"
    );
    assert!(!text.contains("training step"), "{text}");
}
