//! Robustness: thousands of random and mutated programs go through the whole front end, which
//! must answer each with diagnostics (or a clean check), never a panic or a hang.
//! A panic inside the compiler surfaces as the internal-error diagnostic E0999; every diagnostic
//! must have a place in a file, render to text (with that place in its header) and to JSON, and
//! the formatter must answer every input too.
//!
//! The mutants are seeded and deterministic: a failure names the file and the mutant's number,
//! and writes the mutant to `target/fuzz-failure.mgn`.

use mgn_compiler::render::{render, to_json};
use mgn_compiler::source::{decode, Origin, SourceMap};
use mgn_compiler::{check_text, Models};
use mgn_syntax::Diagnostic;
use mgn_tests::{mgn_files, root};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Checks, elaborates, renders and formats `text`; the first problem found, if any.
fn front_end(text: &str) -> Result<(), String> {
    let outcome =
        check_text("fuzz.mgn".into(), Origin::Memory("fuzz".into()), text.into(), Models::All);
    for d in &outcome.diagnostics {
        if d.code == "E0999" {
            return Err(format!("internal error: {}", d.message));
        }
        rendered(&outcome.program.sources, d)?;
    }
    // The formatter parses as the check did (the root is file 0): when the text does not
    // parse, it answers with the same syntax errors, already rendered above. So it runs on
    // every text that parses, and on one in eight of the others to confirm that.
    let root = outcome.program.module(outcome.program.root).file;
    let syntax: Vec<&Diagnostic> = outcome
        .diagnostics
        .iter()
        .filter(|d| d.primary_span().file == root && d.code < "E0005")
        .collect();
    if !syntax.is_empty() && !text.len().is_multiple_of(8) {
        return Ok(());
    }
    let formatted = catch_unwind(|| mgn_syntax::format::format(text))
        .map_err(|_| "the formatter panicked".to_string())?;
    match formatted {
        Ok(_) if syntax.is_empty() => Ok(()),
        Ok(_) => Err("the formatter formatted a text that does not parse".into()),
        Err(diags) if !syntax.is_empty() => {
            if diags.iter().ne(syntax.iter().copied()) {
                return Err("the formatter and the check disagree on the syntax errors".into());
            }
            Ok(())
        }
        Err(diags) => {
            // A formatter's own error: `mgnc fmt` renders it in a map of this one file.
            let mut sources = SourceMap::new();
            sources.add("fuzz.mgn".into(), Origin::Memory("fuzz".into()), text.into());
            for d in &diags {
                if d.code == "E0999" {
                    return Err(format!("formatter: {}", d.message));
                }
                rendered(&sources, d).map_err(|e| format!("from the formatter: {e}"))?;
            }
            Ok(())
        }
    }
}

/// The diagnostic has a primary label, every label is a span of a file in `sources`, and it
/// renders: as text whose header names the primary span's place, and as JSON with that place.
fn rendered(sources: &SourceMap, d: &Diagnostic) -> Result<(), String> {
    let what = format!("{} `{}`", d.code, d.message.chars().take(200).collect::<String>());
    if !d.labels.iter().any(|l| l.primary) {
        return Err(format!("{what} has no primary label"));
    }
    for l in &d.labels {
        let text = &sources.try_get(l.span.file).ok_or(format!("{what}: a label in no file"))?.text;
        let (start, end) = (l.span.start as usize, l.span.end as usize);
        if start > end || end > text.len() || !text.is_char_boundary(start) {
            return Err(format!("{what}: the label {start}..{end} is not in its file"));
        }
    }
    let json = to_json(sources, d);
    let v: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| format!("{what}: invalid JSON ({e})"))?;
    let place = format!("[{}:{}:{}]", v["file"].as_str().unwrap_or("?"), v["line"], v["column"]);
    if v["line"].as_u64().unwrap_or(0) < 1 {
        return Err(format!("{what}: no line in the JSON"));
    }
    let human = render(sources, d, false);
    if !human.contains(d.code) || !human.contains(&place) {
        return Err(format!("{what}: the rendering does not show {place}:\n{human}"));
    }
    Ok(())
}

fn assert_front_end(text: String) -> Result<(), TestCaseError> {
    front_end(&text).map_err(|e| TestCaseError::fail(format!("{e}\n--- input ---\n{text}")))
}

const TOKENS: &[&str] = &[
    "use",
    "std",
    ".",
    "nn",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    "=",
    "==",
    "->",
    "..",
    "^T",
    "@",
    "+",
    "-",
    "*",
    "/",
    "%",
    "!",
    "&&",
    "||",
    "<",
    ">=",
    "fn",
    "layer",
    "model",
    "forward",
    "input",
    "output",
    "loss",
    "param",
    "buffer",
    "init",
    "repeat",
    "let",
    "if",
    "else",
    "self",
    "true",
    "false",
    "f32",
    "i32",
    "dim",
    "int",
    "float",
    "bool",
    "x",
    "y",
    "B",
    "T",
    "d",
    "Linear",
    "relu",
    "softmax",
    "reshape",
    "attention",
    "conv2d",
    "split",
    "0",
    "1",
    "3",
    "-1",
    "64",
    "0.5",
    "1e-5",
    "\"./a.mgn\"",
    "\n",
    " ",
    "//c\n",
    "/*",
    "*/",
    ";",
];

#[test]
fn random_token_soups_never_crash() {
    root();
    let tokens =
        prop::collection::vec(prop::sample::select(TOKENS), 0..120).prop_map(|t| t.join(" "));
    let mut runner =
        TestRunner::new(Config { cases: 1500, failure_persistence: None, ..Config::default() });
    runner.run(&tokens, assert_front_end).unwrap();
}

#[test]
fn seeded_mutants_of_every_model_and_module_never_crash() {
    root();
    let scale: usize =
        std::env::var("MGN_FUZZ_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut cases: Vec<(String, std::sync::Arc<String>, usize)> = Vec::new();
    for (dir, mutants) in MUTANTS {
        for f in mgn_files(dir) {
            let text = std::sync::Arc::new(std::fs::read_to_string(&f).expect("readable"));
            let name = f.display().to_string();
            cases.extend((0..mutants * scale).map(|i| (name.clone(), text.clone(), i)));
        }
    }
    assert!(cases.len() >= 4000, "{} mutants", cases.len());
    // Two threads, as CI has two cores; the first failure stops both.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failure = std::sync::Mutex::new(None::<String>);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while failure.lock().unwrap().is_none() {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, text, i)) = cases.get(k) else { return };
                    if let Err(e) = one_mutant(name, text, *i) {
                        failure.lock().unwrap().get_or_insert(e);
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap() {
        panic!("{e}");
    }
}

/// Mutant `i` of the file `name` through the front end; on failure, it is kept in a file.
fn one_mutant(name: &str, text: &str, i: usize) -> Result<(), String> {
    let mut rng = Rng::new(name, i);
    let (kind, mutant) = mutate(&mut rng, text);
    let result = catch_unwind(AssertUnwindSafe(|| front_end(&mutant)))
        .unwrap_or_else(|_| Err("a panic".into()));
    result.map_err(|e| {
        let keep = std::path::Path::new("target/fuzz-failure.mgn");
        let _ = std::fs::write(keep, &mutant);
        format!("{name}, mutant {i} ({kind}, kept in {}): {e}", keep.display())
    })
}

/// Random bytes are either UTF-8 or located as not; the text goes through the front end. Half
/// the cases are ASCII (control characters included), which is always UTF-8.
#[test]
fn random_bytes_are_decoded_or_located() {
    root();
    for i in 0..400 {
        let mut rng = Rng::new("bytes", i);
        let mask = if i % 2 == 0 { 0x7f } else { 0xff };
        let bytes: Vec<u8> = (0..rng.below(400)).map(|_| rng.byte() & mask).collect();
        let bad = std::str::from_utf8(&bytes).err().map(|e| e.valid_up_to());
        match decode(bytes) {
            Ok(text) => front_end(&text).unwrap_or_else(|e| panic!("bytes {i}: {e}")),
            Err(e) => {
                let at = format!(" at offset {} (line ", bad.expect("not UTF-8"));
                assert!(e.contains(&at), "{e}");
            }
        }
    }
}

/// How many mutants each file of these folders gets (times `MGN_FUZZ_SCALE`, default 1): about
/// 4,450 in all (2,550 of models/, 770 of stdlib/), some 35 s of a test build on two cores (the
/// parser is optimized even there: the workspace's `profile.dev.package.mgn-syntax`).
const MUTANTS: &[(&str, usize)] =
    &[("models", 170), ("stdlib", 192), ("tests/valid", 16), ("tests/errors", 8)];

/// SplitMix64, seeded by a file's name and a mutant's number.
struct Rng(u64);

impl Rng {
    fn new(name: &str, i: usize) -> Rng {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    /// A char boundary of `text`, anywhere.
    fn position(&mut self, text: &str) -> usize {
        let mut at = self.below(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        at
    }
}

const HUGE_NUMBERS: &[&str] = &[
    "99999999999999999999999999",
    "18446744073709551616",
    "9223372036854775808",
    "-9223372036854775808",
    "4294967296",
    "2147483648",
    "65536",
    "1e999",
    "1e-999",
    "0.000000000000000000000000000001",
    "340282366920938463463374607431768211456.0",
    "0x7fffffff",
];

const ODD_CHARS: &[char] = &[
    '\u{0}',
    '\u{7}',
    '\u{1b}',
    '\r',
    '\t',
    '\u{feff}',
    '\u{202e}',
    '\u{200b}',
    'é',
    '漢',
    '🦀',
    '\u{10ffff}',
    '"',
    '\\',
    '`',
    '$',
];

/// One mutant of `text`, and what kind it is.
fn mutate(rng: &mut Rng, text: &str) -> (&'static str, String) {
    let mut t = text.to_string();
    let kind = rng.below(7);
    let name = match kind {
        0 => {
            token_edits(rng, &mut t);
            "token edits"
        }
        1 => {
            // A token (often an error) pushed past column 65,535, then more edits.
            let at = rng.position(&t);
            let pad = " ".repeat(65_536 + rng.below(20_000));
            t.insert_str(at, &format!("{pad}{}", rng.pick(TOKENS)));
            if rng.below(2) == 0 {
                token_edits(rng, &mut t);
            }
            "a long line"
        }
        2 => {
            // A long name or number, or a line of many tokens.
            let at = rng.position(&t);
            let n = 70_000 + rng.below(10_000);
            let rng_kind = rng.below(3);
            let long = match rng_kind {
                0 => "x".repeat(n),
                1 => "7".repeat(n),
                _ => format!("{}{}", " ".repeat(n), "x + ".repeat(2_000)),
            };
            t.insert_str(at, &long);
            ["a long name", "a long number", "a long expression"][rng_kind]
        }
        3 => {
            for _ in 0..1 + rng.below(4) {
                replace_number(rng, &mut t);
            }
            "huge numbers"
        }
        4 => {
            let depth = *rng.pick(&[100, 127, 128, 129, 255, 256, 257, 300, 1000]);
            let (open, close) = *rng.pick(&[("(", ")"), ("[", "]"), ("{", "}"), ("f(", ")")]);
            let at = rng.position(&t);
            let inner = if rng.below(2) == 0 { "x" } else { "" };
            let nested = format!("{}{inner}{}", open.repeat(depth), close.repeat(depth));
            let nested =
                if rng.below(3) == 0 { nested[..nested.len() / 2].to_string() } else { nested };
            t.insert_str(at, &nested);
            "deep nesting"
        }
        5 => {
            for _ in 0..1 + rng.below(6) {
                let at = rng.position(&t);
                let end = (at + rng.below(8)).min(t.len());
                let end = (end..=t.len()).find(|&e| t.is_char_boundary(e)).unwrap_or(t.len());
                let junk: String = (0..1 + rng.below(6)).map(|_| *rng.pick(ODD_CHARS)).collect();
                t.replace_range(at..end, &junk);
            }
            "random characters"
        }
        _ => {
            let at = rng.position(&t);
            t.truncate(at);
            "truncation"
        }
    };
    (name, t)
}

/// Up to five edits: a stretch deleted and a token inserted in its place.
fn token_edits(rng: &mut Rng, t: &mut String) {
    for _ in 0..1 + rng.below(5) {
        let at = rng.position(t);
        let mut end = (at + rng.below(12)).min(t.len());
        while !t.is_char_boundary(end) {
            end += 1;
        }
        let token = *rng.pick(TOKENS);
        t.replace_range(at..end, token);
    }
}

/// A number literal replaced by a huge one (or one inserted, if there is none).
fn replace_number(rng: &mut Rng, t: &mut String) {
    let digits: Vec<usize> =
        t.match_indices(|c: char| c.is_ascii_digit()).map(|(i, _)| i).collect();
    let huge = rng.pick(HUGE_NUMBERS);
    if digits.is_empty() {
        let at = rng.position(t);
        t.insert_str(at, huge);
        return;
    }
    let start = *rng.pick(&digits);
    let end = t[start..]
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '.')
        .map_or(t.len(), |e| start + e);
    t.replace_range(start..end, huge);
}

#[test]
fn pathological_inputs_are_refused_with_diagnostics() {
    root();
    let cases = [
        "(".repeat(100_000),
        format!("fn f() {{ {} }}", "-".repeat(50_000) + "x"),
        format!("fn f() {{ x{} }}", "^T".repeat(10_000)),
        format!("fn f() {{ x{} }}", "()".repeat(10_000)),
        format!("fn f() {{ {} }}", vec!["1"; 50_000].join(" + ")),
        format!("fn f() {{ if true {{ 1 }}{} else {{ 2 }} }}", " else if true { 1 }".repeat(5_000)),
        "layer L { }\n".repeat(20_000),
        "fn f() -> int { f() }\nmodel M { forward { output y = f() } }".to_string(),
        "const A: int = B\nconst B: int = A\n\
         model M(n: dim = A) { input x: f32[n] forward { output x } }"
            .to_string(),
        "model M { w = param f32[4000000000, 4000000000, 4000000000] \
         forward { output w } }"
            .to_string(),
        "\u{0}\u{feff}\u{202e}".to_string(),
    ];
    for text in cases {
        let outcome =
            check_text("p.mgn".into(), Origin::Memory("p".into()), text.clone(), Models::All);
        assert!(
            !outcome.diagnostics.iter().any(|d| d.code == "E0999"),
            "internal error on {:.80}…",
            text
        );
    }
}

/// Every model in `models/` with each of its integer arguments set to sizes no machine holds
/// (`--set batch=2147483648`, `frames=4294967295`, …), built for inference and training and
/// given to the GPU's kernel generation and the host-memory check: each build is a plan or
/// diagnostics — never a panic (an overflow, a division by zero) or an internal error (E0999)
/// — and the memory check refuses what does not fit. (The `mgnc` binary's `run` and `bench`
/// on such sizes: cli/tests/limits.rs.)
#[test]
fn extreme_sizes_are_plans_or_diagnostics() {
    use mgn_compiler::driver::plan_path;
    use mgn_compiler::elab::{Flag, Setting};
    use mgn_compiler::lower::PlanOptions;
    use mgn_ir::optim::OptimizerSpec;

    let sizes = ["0", "2147483648", "4294967295", "4294967296", "1099511627777"];
    let mut problems = Vec::new();
    let mut built = 0;
    for file in mgn_files("models") {
        let infer = PlanOptions::infer();
        let Ok((_, Some(plan))) = plan_path(&file, None, vec![], &infer) else { continue };
        let ints = plan.config.iter().filter(|(_, v)| v.parse::<u64>().is_ok_and(|n| n > 0));
        for (arg, _) in ints {
            for size in sizes {
                let set = vec![Setting { name: arg.clone(), value: size.into(), flag: Flag::Set }];
                let train = PlanOptions::train(&[], OptimizerSpec::default());
                for opts in [PlanOptions::infer(), train] {
                    let at = format!("{} --set {arg}={size} ({:?})", file.display(), opts.mode);
                    let run = || -> Result<bool, String> {
                        let (outcome, plan) = plan_path(&file, None, set.clone(), &opts)?;
                        if let Some(d) = outcome.diagnostics.iter().find(|d| d.code == "E0999") {
                            return Err(format!("internal error: {}", d.message));
                        }
                        let Some(plan) = plan else { return Ok(false) };
                        let limits = mgn_gpu::limits::DeviceLimits::MIN_SPEC;
                        let _ = mgn_gpu::kernels::check_plan(&plan, &limits);
                        let mut need = mgn_runtime::memory::resident(&plan);
                        need.values = mgn_runtime::memory::peak_values(&plan);
                        let _ = mgn_runtime::memory::check(&plan, need, "a run");
                        Ok(true)
                    };
                    match catch_unwind(AssertUnwindSafe(run)) {
                        Ok(Ok(b)) => built += b as usize,
                        Ok(Err(e)) => problems.push(format!("{at}: {e}")),
                        Err(_) => problems.push(format!("{at}: panicked")),
                    }
                }
            }
        }
    }
    assert!(built > 50, "the sizes reached plans: {built}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
