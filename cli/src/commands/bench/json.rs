//! The report as one JSON object (`--json`).

use super::measure::Timing;
use super::results::{timing_basis, Memory, Profiled, Report};
use super::BenchArgs;
use serde_json::{json, Value};

impl Timing {
    fn json(&self) -> Value {
        json!({
            "median_ms": self.median_ms,
            "p25_ms": self.p25_ms,
            "p75_ms": self.p75_ms,
            "samples": self.samples
        })
    }
}

/// A config value as JSON: numbers and booleans as such, anything else as text.
fn config_value(v: &str) -> Value {
    if let Ok(i) = v.parse::<i64>() {
        return json!(i);
    }
    if let Ok(f) = v.parse::<f64>() {
        if f.is_finite() {
            return json!(f);
        }
    }
    match v {
        "true" => json!(true),
        "false" => json!(false),
        _ => json!(v),
    }
}

/// One plan's memory; the training plan's also counts the optimizer state.
fn memory_json(m: &Memory, optimizer: Option<u64>) -> Value {
    let mut v = json!({
        "param_bytes": m.plan.param_bytes,
        "input_bytes": m.plan.input_bytes,
        "logical_bytes": m.plan.logical_bytes,
        "peak_live_bytes": m.plan.peak_live_bytes,
        "arena_bytes": m.arena_bytes,
        "arena_values_bytes": m.arena_values_bytes,
    });
    if let Some(o) = optimizer {
        v["optimizer_state_bytes"] = json!(o);
    }
    v["gpu"] = match m.gpu {
        Some(g) => json!({
            "param_bytes": g.params,
            "values_bytes": g.values,
            "total_bytes": g.total,
        }),
        None => Value::Null,
    };
    v
}

/// `--profile`: an object with one entry per profiled plan.
fn per_profiled_plan(
    r: &Report,
    entries: impl Fn(&Profiled) -> Vec<Value>,
) -> serde_json::Map<String, Value> {
    r.profile.iter().map(|(plan, p)| (plan.to_string(), entries(p).into())).collect()
}

/// The whole report, with the arguments that shaped it.
pub(super) fn to_json(r: &Report, a: &BenchArgs) -> Value {
    let config: serde_json::Map<String, Value> =
        r.config.iter().map(|(k, v)| (k.clone(), config_value(v))).collect();
    let timing = |t: &Option<Timing>| t.as_ref().map_or(Value::Null, Timing::json);
    let minimal = match &r.minimal {
        Some((settings, t, _)) => {
            let mut v = t.json();
            v["settings"] = settings
                .iter()
                .map(|s| (s.name.clone(), config_value(&s.value)))
                .collect::<serde_json::Map<_, _>>()
                .into();
            v
        }
        None => Value::Null,
    };
    let training_memory =
        r.memory_train.as_ref().map_or(Value::Null, |(m, o)| memory_json(m, Some(*o)));
    let setup = r.setup.map_or(
        Value::Null,
        |s| json!({ "inference": s.inference, "minimal": s.minimal, "training": s.training }),
    );
    json!({
        "model": r.model,
        "file": a.file.display().to_string(),
        "config": config,
        // Parameters alone, as PyTorch's `model.parameters()` counts them (bench/reference.py's
        // `count_params`), so the two reports agree; buffers apart.
        "param_count": r.counts.parameters(),
        "buffer_count": r.counts.buffers,
        "backend": r.backend,
        "precision": mgn_ir::precision::Precision::from(a.precision).name(),
        "device": r.device,
        "mgnc_version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "clock": "wall",
        "timing": timing_basis(r.backend),
        "warmup": a.warmup,
        "samples": a.samples,
        "seed": a.seed,
        "optimizer": r.optimizer,
        "measurements": {
            "compile": r.compile.json(),
            "compile_train": timing(&r.compile_train),
            "forward": r.forward.json(),
            "forward_minimal": minimal,
            "forward_backward": timing(&r.forward_backward),
            "train_step": timing(&r.train_step),
        },
        "compile_minimal_ms": r.compile_minimal_ms,
        "setup_ms": setup,
        "memory": {
            "inference": memory_json(&r.memory, None),
            "minimal": r.minimal.as_ref().map_or(Value::Null, |(_, _, m)| memory_json(m, None)),
            "training": training_memory,
        },
        "profile": per_profiled_plan(r, |p| {
            let (work, floors) = (p.work_by_op(), a.peaks().map(|pk| p.floor_ms_by_op(pk)));
            (p.by_op.iter().zip(work).enumerate())
                .map(|(i, ((op, n, ms), w))| {
                    let floor = floors.as_ref().map(|f| f[i]);
                    json!({"op": op, "dispatches": n, "ms": ms, "flops": w.flops, "bytes": w.bytes,
                           "floor_ms": floor})
                })
                .collect()
        }),
        "profile_slowest": per_profiled_plan(r, |p| {
            p.slowest.iter().map(|(step, ms)| json!({"step": step, "ms": ms})).collect()
        }),
        "notes": r.notes,
    })
}
