//! GPU time per model line, from the last `mgnc bench --trace` of a model: the trace sits
//! beside the model as `NAME.trace.json` (`trace_beside`), and its `mgnLines` list the time each
//! plan spent in the dispatches a line made, in the model's file and in every file it imports.
//! Hover shows it, with the model, arguments and device the trace was taken at, so a user sees
//! which line of a model (or of a layer it imports) is slow without leaving the editor.
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

/// One trace: what it was taken at (from `otherData`; absent in traces of older `mgnc`s) and
/// its per-line times.
#[derive(Debug, Default)]
pub struct Trace {
    /// The model's file name, as a user recognises it.
    pub model: Option<String>,
    pub device: Option<String>,
    /// The model's arguments (`batch=4`), in declaration order.
    pub config: Vec<(String, String)>,
    lines: Lines,
}

/// Parses `mgnLines` and `otherData` of a trace document.
fn parse(text: &str) -> Option<Trace> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut lines: Lines = HashMap::new();
    for e in v.get("mgnLines")?.as_array()? {
        let file = PathBuf::from(e.get("file")?.as_str()?);
        let line = e.get("line")?.as_u64()? as u32;
        lines.entry((file, line)).or_default().push(LineTime {
            plan: e.get("plan")?.as_str()?.to_string(),
            ms: e.get("ms")?.as_f64()?,
            dispatches: e.get("dispatches")?.as_u64()? as usize,
        });
    }
    let other = v.get("otherData");
    let text_of = |key: &str| Some(other?.get(key)?.as_str()?.to_string());
    let model = text_of("modelFile")
        .and_then(|f| Some(Path::new(&f).file_name()?.to_string_lossy().into_owned()))
        .or_else(|| text_of("model"));
    let config = (other.and_then(|o| o.get("config")?.as_array()).into_iter().flatten())
        .filter_map(|kv| Some((kv.get(0)?.as_str()?.into(), kv.get(1)?.as_str()?.into())))
        .collect();
    Some(Trace { model, device: text_of("device"), config, lines })
}

/// Traces read so far, by path, with the modification time they were read at.
type Cache = HashMap<PathBuf, (SystemTime, Arc<Trace>)>;
static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn trace_at(path: &Path) -> Option<Arc<Trace>> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some((at, trace)) = cache.get(path) {
        if *at == modified {
            return Some(trace.clone());
        }
    }
    // By the rule for every file mgn reads: a trace that is a FIFO or a device must not block
    // the server.
    let bytes = mgn_ir::io::read_regular(path, 256 << 20).ok()?;
    let trace = Arc::new(parse(&String::from_utf8(bytes).ok()?)?);
    cache.insert(path.to_path_buf(), (modified, trace.clone()));
    Some(trace)
}

/// Where the traces that may time a file's lines are: beside each model that loads the file
/// (`models`: the open documents whose analysis read it, the file itself among them when it is
/// a model), and every `*.trace.json` in the file's own directory (a model there that no open
/// document is).
fn candidates(file: &Path, models: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = models.iter().map(|m| trace_beside(m)).collect();
    out.push(trace_beside(file));
    if let Some(Ok(entries)) = file.parent().map(std::fs::read_dir) {
        let mut beside: Vec<PathBuf> = (entries.flatten().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".trace.json"))
            .collect();
        beside.sort();
        out.extend(beside);
    }
    let mut seen = Vec::new();
    out.retain(|p| {
        let key = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    out
}

/// The times of `line` (1-based) of the file at `path`, from every trace that has them (see
/// `candidates`), each with the trace it came from.
pub fn line_times(path: &Path, line: u32, models: &[PathBuf]) -> Vec<(Arc<Trace>, Vec<LineTime>)> {
    let Ok(abs) = std::fs::canonicalize(path) else { return Vec::new() };
    let key = (abs.clone(), line);
    candidates(&abs, models)
        .iter()
        .filter_map(|t| trace_at(t))
        .filter_map(|t| {
            let times = t.lines.get(&key)?.clone();
            Some((t, times))
        })
        .collect()
}

/// Hover's paragraph for a line's times, or None when no trace has any.
pub fn describe(found: &[(Arc<Trace>, Vec<LineTime>)]) -> Option<String> {
    let paragraphs: Vec<String> = found
        .iter()
        .filter(|(_, times)| !times.is_empty())
        .map(|(trace, times)| {
            let each: Vec<String> = times
                .iter()
                .map(|t| {
                    let s = if t.dispatches == 1 { "" } else { "es" };
                    format!("{} {:.3} ms ({} dispatch{s})", t.plan, t.ms, t.dispatches)
                })
                .collect();
            format!("GPU time of this line ({}): {}", taken_at(trace), each.join("; "))
        })
        .collect();
    (!paragraphs.is_empty()).then(|| paragraphs.join("\n\n"))
}

/// "last `mgnc bench --trace` of `m.mgn` at batch=4, seq=64 on NVIDIA H100": a time means
/// little without the shapes and the device it was measured at.
fn taken_at(t: &Trace) -> String {
    let mut s = String::from("last `mgnc bench --trace`");
    if let Some(m) = &t.model {
        s += &format!(" of `{m}`");
    }
    if !t.config.is_empty() {
        let args: Vec<String> = t.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
        s += &format!(" at {}", args.join(", "));
    }
    if let Some(d) = &t.device {
        s += &format!(" on {d}");
    }
    s
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
        // A trace of an older `mgnc`: no `otherData.config` nor `modelFile`.
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
        let found = line_times(&model, 3, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].1.len(), 2, "{found:?}");
        let text = describe(&found).unwrap();
        assert!(text.contains("forward 0.250 ms (1 dispatch)"), "{text}");
        assert!(text.contains("forward + loss + backward 1.500 ms (4 dispatches)"), "{text}");
        assert!(line_times(&model, 4, &[]).is_empty());
        // A garbled trace shows nothing (and a rewritten one is read again).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(trace_beside(&model), "{ not json").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        let f = std::fs::File::options().write(true).open(trace_beside(&model)).unwrap();
        f.set_modified(later).unwrap();
        assert!(line_times(&model, 3, &[]).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A layer in another directory is timed by the trace of the model that imports it, and
    /// the hover says what that trace was taken at.
    #[test]
    fn an_imported_file_is_timed_by_its_models_trace() {
        let dir = std::env::temp_dir().join(format!("mgn-profile-imp-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("layers")).unwrap();
        let (model, layer) = (dir.join("m.mgn"), dir.join("layers/block.mgn"));
        std::fs::write(&model, "").unwrap();
        std::fs::write(&layer, "").unwrap();
        let abs = std::fs::canonicalize(&layer).unwrap();
        let trace = serde_json::json!({
            "traceEvents": [],
            "otherData": { "model": "M", "device": "NVIDIA H100", "backend": "vulkan",
                           "modelFile": std::fs::canonicalize(&model).unwrap(),
                           "config": [["batch", "4"], ["seq", "64"]] },
            "mgnLines": [
                { "file": abs, "line": 5, "plan": "forward", "ms": 0.5, "dispatches": 2 },
            ],
        });
        std::fs::write(trace_beside(&model), trace.to_string()).unwrap();
        assert!(line_times(&layer, 5, &[]).is_empty(), "no trace beside the layer");
        let found = line_times(&layer, 5, std::slice::from_ref(&model));
        let text = describe(&found).unwrap();
        assert!(
            text.contains("`mgnc bench --trace` of `m.mgn` at batch=4, seq=64 on NVIDIA H100")
                && text.contains("forward 0.500 ms (2 dispatches)"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_trace_sits_beside_the_model() {
        assert_eq!(trace_beside(Path::new("a/b.mgn")), Path::new("a/b.trace.json"));
    }
}
