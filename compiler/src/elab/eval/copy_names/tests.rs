//! The names of `repeat`'s copies: numbered, or a pattern's text with the index in its holes;
//! patterns that would give two copies one name, or a name that is not one segment, are errors.

use crate::elab::tests::{build, param_names};
use mgn_ir::plan::Mode;

fn repeat(args: &str) -> String {
    format!(
        "layer Scale {{
             w = param f32[4] init ones
             forward(x: f32[B, 4]) -> f32[B, 4] {{ x * self.w }}
         }}
         model M {{
             input x: f32[2, 4]
             layers = repeat({args}) Scale()
             forward {{ output y = layers(x) }}
         }}"
    )
}

#[test]
fn copies_are_numbered_or_named_by_the_pattern() {
    let g = build(&repeat("2"), Mode::Infer, &[]).expect("elaborates");
    assert_eq!(param_names(&g), ["layers.0.w", "layers.1.w"]);
    let g = build(&repeat("2, k, name = \"block{k}_of_2\""), Mode::Infer, &[]).expect("named");
    assert_eq!(param_names(&g), ["layers.block0_of_2.w", "layers.block1_of_2.w"]);
    // Without a hole one copy is fine: its name is the pattern.
    let g = build(&repeat("1, name = \"only\""), Mode::Infer, &[]).expect("one copy");
    assert_eq!(param_names(&g), ["layers.only.w"]);
}

#[test]
fn bad_patterns_are_refused_saying_why() {
    let cases = [
        ("2, i, name = \"same\"", "E0106", "copies 0 and 1 would both be named `same`"),
        (
            "2, i, name = \"a-{i}\"",
            "E0201",
            "copy 0 would be named `a-0`, which is not a name segment",
        ),
        ("2, i, name = \"\"", "E0201", "copy 0 would be named ``, which is not a name segment"),
        ("2, i, name = \"b{j}\"", "E0101", "`{j}` in the name pattern is not the copy index `i`"),
        ("2, name = \"b{i}\"", "E0101", "`{i}` in the name pattern names no copy index"),
        ("2, i, name = \"b{i\"", "E0201", "the name pattern has a `{` that is never closed"),
        ("2, i, name = \"b}{i}\"", "E0201", "the name pattern has a `}` that closes no `{`"),
        (
            "2, i, name = 3",
            "E0201",
            "the name pattern of `repeat` must be a string, found an integer (3)",
        ),
    ];
    for (args, code, message) in cases {
        let d = build(&repeat(args), Mode::Infer, &[]).unwrap_err();
        assert_eq!((d.code, d.message.as_str()), (code, message), "{args}");
    }
}
