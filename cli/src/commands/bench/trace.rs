//! `mgnc bench --trace`: the profiled runs as a Chrome trace-event file (Perfetto and
//! chrome://tracing open it) — one track per plan, every dispatch a slice with its GPU time, op,
//! shape, dependency level and model line — plus, under `mgnLines`, the GPU time per model line
//! that `mgnc lsp` shows on hover, and under `otherData` the model, its arguments and the device
//! the times were taken at.
//!
//! Each dispatch was timed in a pass of its own (`GpuSession::profile`), so the slices are laid
//! end to end: the sum is the plan's profiled time, slower than a real run where a level's
//! dispatches overlap.

use super::results::Report;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the trace goes: `given`, or (`--trace` without a file) `MODEL.trace.json` beside the
/// model, where `mgnc lsp` looks for it (`mgn_lsp::profile::trace_beside`).
pub(super) fn path_for(given: Option<&Path>, model: &Path) -> PathBuf {
    given.map_or_else(|| mgn_lsp::profile::trace_beside(model), Path::to_path_buf)
}

/// Writes the trace of `r`'s profiles to `path` (through a temporary file, so a reader never
/// sees half of it).
pub(super) fn write(path: &Path, r: &Report, model: &Path) -> Result<(), String> {
    if r.profile.is_empty() {
        return Err(format!(
            "no trace written to {}: profiling needs a GPU backend (--backend vulkan)",
            path.display()
        ));
    }
    let text = serde_json::to_string(&document(r, model)).expect("JSON values serialise");
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write the trace {}: {e}", path.display())
    })
}

/// The trace-event document (see the module header).
fn document(r: &Report, model: &Path) -> Value {
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "pid": 1,
        "args": { "name": format!("mgnc bench {} on {}", model.display(), r.device) },
    })];
    // (file, line) → plan → (ms, dispatches)
    type PerPlan<'r> = BTreeMap<&'r str, (f64, usize)>;
    let mut lines: BTreeMap<(String, u32), PerPlan> = BTreeMap::new();
    for (tid, (plan, p)) in r.profile.iter().enumerate() {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
            "args": { "name": plan },
        }));
        let mut at_us = 0.0;
        for d in &p.dispatches {
            let us = d.time.as_secs_f64() * 1e6;
            let family = super::results::family(&d.op);
            events.push(json!({
                "name": d.op, "cat": family, "ph": "X", "pid": 1, "tid": tid,
                "ts": at_us, "dur": us,
                "args": { "shape": format!("{:?}", d.shape), "source": d.loc.to_string(),
                          "level": d.level, "flops": d.work.flops, "bytes": d.work.bytes },
            }));
            at_us += us;
            let file = canonical(&d.loc.file);
            let e = lines.entry((file, d.loc.line)).or_default().entry(plan).or_default();
            e.0 += us / 1e3;
            e.1 += 1;
        }
    }
    let per_line: Vec<Value> = lines
        .into_iter()
        .flat_map(|((file, line), plans)| {
            plans.into_iter().map(move |(plan, (ms, n))| {
                json!({ "file": file, "line": line, "plan": plan, "ms": ms, "dispatches": n })
            })
        })
        .collect();
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        // `config` (the model's arguments, in declaration order) and `modelFile` say what the
        // times were measured at: the language server's hover quotes them.
        "otherData": {
            "model": r.model, "device": r.device, "backend": r.backend,
            "modelFile": canonical(&model.to_string_lossy()),
            "config": r.config.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        },
        "mgnLines": per_line,
    })
}

/// A model line's file as an absolute path where it exists (the language server compares it
/// with the paths of the documents it has open), else as the plan names it.
fn canonical(file: &str) -> String {
    std::fs::canonicalize(file).map_or_else(|_| file.to_string(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_trace_sits_beside_the_model() {
        let m = Path::new("models/tiny_gpt.mgn");
        assert_eq!(path_for(None, m), Path::new("models/tiny_gpt.trace.json"));
        assert_eq!(path_for(Some(Path::new("t.json")), m), Path::new("t.json"));
    }
}
