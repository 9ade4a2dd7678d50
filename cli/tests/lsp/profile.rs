//! The GPU-time hover on a line of an imported file: the trace sits beside the model that
//! imports it (in another directory), not beside the file, and the hover says what the trace
//! was taken at. The trace is written here as `mgnc bench --trace` writes it (cli/tests/trace.rs
//! checks that on a real device).

use super::client::{file_uri, temp_dir, Client};
use super::pos;
use serde_json::json;

const MODEL: &str = "\
use \"./layers/scale.mgn\".{Scale}

model M() {
    input x: f32[4, 8]
    s = Scale(8)

    forward {
        output y = s(x)
    }
}
";

const SCALE: &str = "\
layer Scale(d: dim) {
    w = param f32[d] init ones

    forward(x: f32[..B, d]) -> f32[..B, d] {
        x * self.w
    }
}
";

#[test]
fn an_imported_files_line_shows_the_gpu_time_from_its_models_trace() {
    let dir = temp_dir("profile");
    std::fs::create_dir_all(dir.join("layers")).unwrap();
    let (model, scale) = (dir.join("m.mgn"), dir.join("layers/scale.mgn"));
    std::fs::write(&model, MODEL).unwrap();
    std::fs::write(&scale, SCALE).unwrap();
    let abs = std::fs::canonicalize(&scale).unwrap();
    let trace = json!({
        "traceEvents": [],
        "otherData": { "model": "M", "device": "llvmpipe", "backend": "vulkan",
                       "modelFile": std::fs::canonicalize(&model).unwrap(),
                       "config": [["batch", "4"]] },
        "mgnLines": [{ "file": abs, "line": 5, "plan": "forward", "ms": 0.125, "dispatches": 1 }],
    });
    std::fs::write(dir.join("m.trace.json"), trace.to_string()).unwrap();
    let (m, s) = (file_uri(&model), file_uri(&scale));
    let mut c = Client::start(&dir);
    c.open(&m, MODEL);
    c.diagnostics_for_version(&m, 1);
    c.open(&s, SCALE);
    let params = json!({ "textDocument": { "uri": s }, "position": pos(SCALE, "x * self", 0, 0) });
    let h = c.request("textDocument/hover", params);
    let text = h["contents"]["value"].as_str().unwrap_or_default();
    assert!(
        text.contains(
            "GPU time of this line (last `mgnc bench --trace` of `m.mgn` at batch=4 on \
                       llvmpipe): forward 0.125 ms (1 dispatch)"
        ),
        "{h}"
    );
    c.shutdown();
}
