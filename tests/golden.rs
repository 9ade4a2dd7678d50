//! Golden tests of diagnostics: every `tests/errors/X.mgn` holds one mistake, and the exact
//! rendered report is kept in `X.out`. `BLESS=1 cargo test -p mgn-tests --test golden`
//! rewrites the expectations; review the diff before committing it.

use mgn_tests::{check, compare_golden, mgn_files, rendered};

#[test]
fn every_error_program_renders_its_expected_diagnostic() {
    let files = mgn_files("tests/errors");
    assert!(files.len() >= 40, "expected at least 40 error programs, found {}", files.len());
    let mut failures = Vec::new();
    for f in &files {
        let outcome = check(f);
        if outcome.diagnostics.is_empty() {
            failures
                .push(format!("{}: expected an error, but the file checked clean", f.display()));
            continue;
        }
        if let Some(d) = outcome.diagnostics.iter().find(|d| d.code == "E0999") {
            failures.push(format!("{}: internal compiler error: {}", f.display(), d.message));
        }
        if let Some(diff) = compare_golden(&f.with_extension("out"), &rendered(&outcome)) {
            failures.push(diff);
        }
        // An error with a trace (raised inside a layer, fn or the stdlib) is kept as JSON
        // too: where each step is, and the primary label moved to the user's call.
        let json = f.with_extension("json");
        if outcome.diagnostics.iter().any(|d| !d.trace().is_empty()) {
            if let Some(diff) = compare_golden(&json, &as_json(&outcome)) {
                failures.push(diff);
            }
        } else if json.exists() {
            failures.push(format!("{}: no diagnostic has a trace any more", json.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} golden tests failed:\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

/// The diagnostics as `--message-format json` writes them, each pretty-printed, without the
/// `rendered` text (the `.out` file holds it).
fn as_json(outcome: &mgn_compiler::Outcome) -> String {
    let mut out = String::new();
    for d in &outcome.diagnostics {
        let line = mgn_compiler::render::to_json(&outcome.program.sources, d);
        let mut v: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
        v.as_object_mut().expect("an object").remove("rendered");
        out.push_str(&serde_json::to_string_pretty(&v).expect("serializable"));
        out.push('\n');
    }
    out
}

#[test]
fn diagnostics_as_json_carry_code_location_and_labels() {
    for f in mgn_files("tests/errors") {
        let outcome = check(&f);
        for d in &outcome.diagnostics {
            let line = mgn_compiler::render::to_json(&outcome.program.sources, d);
            let v: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("{}: invalid JSON {e}: {line}", f.display()));
            assert_eq!(v["code"], d.code);
            assert!(v["line"].as_u64().unwrap_or(0) >= 1, "{}: no line in {line}", f.display());
            assert!(!v["labels"].as_array().expect("labels").is_empty());
            assert!(v["rendered"].as_str().expect("rendered").contains(d.code));
            // Errors inside the stdlib are reported at the user's call that led there.
            let file = v["file"].as_str().expect("file");
            assert!(!file.starts_with("std."), "{}: primary label in {file}", f.display());
            for step in v["trace"].as_array().expect("trace") {
                let omitted = step["kind"] == "omitted";
                assert!(omitted || step["line"].as_u64().unwrap_or(0) >= 1, "{step}");
            }
        }
    }
}
