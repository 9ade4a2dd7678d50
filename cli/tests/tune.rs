//! `mgnc tune`: every plan of a small model opened on the GPU (lavapipe in CI), its device's
//! verdicts file written into `--cache DIR`, and the next process's sessions of those plans
//! measure nothing. Counts are asserted, never times.

mod common;

use common::text;
use serde_json::Value;

/// The small mixed model every run here tunes for.
const MODEL: [&str; 7] =
    ["models/digits_mlp.mgn", "--set", "batch=8", "--set", "hidden=16", "--precision", "mixed"];

/// `mgnc tune FILE… --json` with the verdicts in `cache`; stdout parsed as one JSON object.
fn tune(file: &[&str], cache: &std::path::Path) -> Value {
    let cache = cache.to_str().expect("a UTF-8 temp path");
    let args = [&["tune"], file, &["--cache", cache, "--json"]].concat();
    let out = common::mgnc(&args);
    assert!(out.status.success(), "mgnc tune failed: {}{}", text(&out.stderr), text(&out.stdout));
    let stdout = text(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"))
}

fn count(plan: &Value, key: &str) -> u64 {
    plan[key].as_u64().unwrap_or_else(|| panic!("{key} missing: {plan}"))
}

/// The first tune measures what the device chooses by measurement (nothing on a device without
/// two kernels for these steps) and writes the device's file in the given folder; the second
/// open of each plan, and every open of the next process, measures nothing.
#[test]
fn tuned_plans_open_with_nothing_to_measure() {
    if cfg!(any(target_os = "macos", target_os = "ios")) || !mgn_gpu::testing::device_listed() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mgn-tune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = tune(&MODEL, &dir);
    let plans = first["plans"].as_array().expect("plans");
    let names: Vec<&str> = plans.iter().map(|p| p["plan"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 3, "the inference, minimal-shape and training plans: {names:?}");
    assert!(names[0].starts_with("inference (") && names[0].contains("batch=8"), "{names:?}");
    assert!(names[1].contains("batch=1"), "{names:?}");
    assert!(names[2].starts_with("training ("), "{names:?}");
    for p in plans {
        assert_eq!(count(p, "measured_again"), 0, "the second open measures nothing: {p}");
        assert!(count(p, "pipelines") > 0, "{p}");
    }
    let file = first["verdicts"].as_str().expect("the verdicts' file");
    assert!(std::path::Path::new(file).starts_with(dir.join("choices")), "{file}");
    assert!(std::path::Path::new(file).is_file(), "{file} written");
    let again = tune(&MODEL, &dir);
    for (p, q) in plans.iter().zip(again["plans"].as_array().expect("plans")) {
        assert_eq!(count(q, "measured"), 0, "a tuned plan measures nothing: {q}");
        assert!(count(q, "already_kept") >= count(p, "measured"), "{p} then {q}");
    }
    // The plan an app ships, built alone, opens with nothing to measure either.
    let plan = dir.join("digits.mgnplan");
    let built = common::mgnc(&[&["build"], &MODEL[..], &["-o", plan.to_str().unwrap()]].concat());
    assert!(built.status.success(), "{}", text(&built.stderr));
    let shipped = tune(&[plan.to_str().unwrap()], &dir);
    let only = shipped["plans"].as_array().expect("plans");
    assert_eq!(only.len(), 1, "{shipped}");
    assert!(only[0]["plan"].as_str().unwrap().starts_with("inference (batch=8"), "{shipped}");
    assert_eq!(count(&only[0], "measured"), 0, "{shipped}");
    assert!(count(&only[0], "already_kept") >= count(&plans[0], "measured"), "{shipped}");
    std::fs::remove_dir_all(&dir).unwrap();
}
