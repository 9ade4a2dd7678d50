//! Robustness: thousands of random and mutated programs go through the whole front end, which
//! must answer each with diagnostics (or a clean check), never a panic or a hang.
//! A panic inside the compiler surfaces as the internal-error diagnostic E0999.

use mgn_compiler::source::Origin;
use mgn_compiler::{check_text, Models};
use mgn_tests::{mgn_files, root};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn assert_no_internal_error(text: String) -> Result<(), TestCaseError> {
    let outcome =
        check_text("fuzz.mgn".into(), Origin::Memory("fuzz".into()), text.clone(), Models::All);
    if let Some(d) = outcome.diagnostics.iter().find(|d| d.code == "E0999") {
        return Err(TestCaseError::fail(format!("{}\n--- input ---\n{text}", d.message)));
    }
    Ok(())
}

/// The corpus to mutate: every model, stdlib module and test program in the repository.
fn corpus() -> Vec<String> {
    root();
    let mut texts = Vec::new();
    for dir in ["models", "stdlib", "tests/valid", "tests/errors"] {
        for f in mgn_files(dir) {
            texts.push(std::fs::read_to_string(f).expect("readable"));
        }
    }
    texts
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
    runner.run(&tokens, assert_no_internal_error).unwrap();
}

#[test]
fn mutated_programs_never_crash() {
    let corpus = corpus();
    assert!(!corpus.is_empty());
    // (which file, then a list of edits: position fraction, delete length, inserted token)
    let edits =
        prop::collection::vec((0.0f64..1.0, 0usize..12, prop::sample::select(TOKENS)), 1..6);
    let strategy = (0..corpus.len(), edits);
    let mut runner =
        TestRunner::new(Config { cases: 2500, failure_persistence: None, ..Config::default() });
    runner
        .run(&strategy, |(which, edits)| {
            let mut text = corpus[which].clone();
            for (at, del, ins) in edits {
                let mut pos = ((text.len() as f64) * at) as usize;
                while !text.is_char_boundary(pos) {
                    pos -= 1;
                }
                let mut end = (pos + del).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                text.replace_range(pos..end, ins);
            }
            assert_no_internal_error(text)
        })
        .unwrap();
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
