//! GPU time per model line, from the last `mgnc bench --trace` of a model: the trace sits
//! beside the model as `NAME.trace.json` (`trace_beside`), and its `mgnLines` list the time each
//! plan spent in the dispatches a line made. Hover shows it, so a user sees which line of a
//! model is slow without leaving the editor.
//!
//! A trace is read again only when its modification time changes; one that cannot be read or
//! parsed shows nothing (it is a report, not an input, and a half-written one cannot exist:
//! `mgnc bench` renames it into place).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// `dir/NAME.trace.json` for the model `dir/NAME.mgn`: where `mgnc bench --trace` writes by
/// default and where hover looks.
pub fn trace_beside(model: &Path) -> PathBuf {
    let stem = model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    model.with_file_name(format!("{stem}.trace.json"))
}

/// One line's time in one plan.
#[derive(Clone, Debug, PartialEq)]
pub struct LineTime {
    pub plan: String,
    pub ms: f64,
    pub dispatches: usize,
}

/// A trace's per-line times, by (absolute file, line).
type Lines = HashMap<(PathBuf, u32), Vec<LineTime>>;

/// Parses `mgnLines` of a trace document.
fn parse(text: &str) -> Option<Lines> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut out: Lines = HashMap::new();
    for e in v.get("mgnLines")?.as_array()? {
        let file = PathBuf::from(e.get("file")?.as_str()?);
        let line = e.get("line")?.as_u64()? as u32;
        out.entry((file, line)).or_default().push(LineTime {
            plan: e.get("plan")?.as_str()?.to_string(),
            ms: e.get("ms")?.as_f64()?,
            dispatches: e.get("dispatches")?.as_u64()? as usize,
        });
    }
    Some(out)
}

/// Traces read so far, by path, with the modification time they were read at.
type Cache = HashMap<PathBuf, (SystemTime, Arc<Lines>)>;
static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn lines_of(trace: &Path) -> Option<Arc<Lines>> {
    let modified = std::fs::metadata(trace).and_then(|m| m.modified()).ok()?;
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some((at, lines)) = cache.get(trace) {
        if *at == modified {
            return Some(lines.clone());
        }
    }
    // By the rule for every file mgn reads: a trace that is a FIFO or a device must not block
    // the server.
    let bytes = mgn_ir::io::read_regular(trace, 256 << 20).ok()?;
    let lines = Arc::new(parse(&String::from_utf8(bytes).ok()?)?);
    cache.insert(trace.to_path_buf(), (modified, lines.clone()));
    Some(lines)
}

/// The times of `line` (1-based) of the model at `path`, from the trace beside it.
pub fn line_times(path: &Path, line: u32) -> Vec<LineTime> {
    let Ok(abs) = std::fs::canonicalize(path) else { return Vec::new() };
    let Some(lines) = lines_of(&trace_beside(&abs)) else { return Vec::new() };
    lines.get(&(abs, line)).cloned().unwrap_or_default()
}

/// Hover's paragraph for a line's times, or None when the trace has none.
pub fn describe(times: &[LineTime]) -> Option<String> {
    if times.is_empty() {
        return None;
    }
    let each: Vec<String> = times
        .iter()
        .map(|t| {
            let s = if t.dispatches == 1 { "" } else { "es" };
            format!("{} {:.3} ms ({} dispatch{s})", t.plan, t.ms, t.dispatches)
        })
        .collect();
    Some(format!("GPU time of this line (last `mgnc bench --trace`): {}", each.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_gives_each_line_its_time_per_plan() {
        let dir = std::env::temp_dir().join(format!("mgn-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("m.mgn");
        std::fs::write(&model, "model M() {}\n").unwrap();
        let abs = std::fs::canonicalize(&model).unwrap();
        let trace = serde_json::json!({
            "traceEvents": [],
            "mgnLines": [
                { "file": abs, "line": 3, "plan": "forward", "ms": 0.25, "dispatches": 1 },
                { "file": abs, "line": 3, "plan": "forward + loss + backward", "ms": 1.5,
                  "dispatches": 4 },
                { "file": "/elsewhere.mgn", "line": 3, "plan": "forward", "ms": 9.0,
                  "dispatches": 1 },
            ],
        });
        std::fs::write(trace_beside(&model), trace.to_string()).unwrap();
        let times = line_times(&model, 3);
        assert_eq!(times.len(), 2, "{times:?}");
        let text = describe(&times).unwrap();
        assert!(text.contains("forward 0.250 ms (1 dispatch)"), "{text}");
        assert!(text.contains("forward + loss + backward 1.500 ms (4 dispatches)"), "{text}");
        assert!(line_times(&model, 4).is_empty());
        // A garbled trace shows nothing (and a rewritten one is read again).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(trace_beside(&model), "{ not json").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        let f = std::fs::File::options().write(true).open(trace_beside(&model)).unwrap();
        f.set_modified(later).unwrap();
        assert!(line_times(&model, 3).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_trace_sits_beside_the_model() {
        assert_eq!(trace_beside(Path::new("a/b.mgn")), Path::new("a/b.trace.json"));
    }
}
