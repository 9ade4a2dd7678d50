//! Sequences made by field initializers: nested lists, lists chosen by `if`, `repeat` (also of
//! a list), each named by its place, called in order and reached by index or by name.

use crate::elab::tests::{build, param_names};
use mgn_ir::plan::Mode;

const LAYERS: &str = "
layer Scale(d: dim) {
    w = param f32[d] init ones
    forward(x: f32[B, d]) -> f32[B, d] { x * self.w }
}
layer Widen(d: dim, e: dim) {
    w = param f32[d, e] init ones
    forward(x: f32[B, d]) -> f32[B, e] { x @ self.w }
}
";

fn model(fields: &str, outputs: &str) -> String {
    format!(
        "{LAYERS}
model M(wide: bool = false) {{
    input x: f32[2, 4]
    {fields}
    forward {{ {outputs} }}
}}"
    )
}

#[test]
fn a_nested_list_is_a_sequence_inside_the_sequence_named_by_position() {
    let text = model(
        "features = [Scale(4), [Widen(4, 3), [Scale(3)]], Scale(3)]",
        "output y = features(x)
         output inner = features[1][0](x)
         output by_name = features.1.1.0(features.1.0(x))",
    );
    let g = build(&text, Mode::Infer, &[]).expect("elaborates");
    let names = param_names(&g);
    assert_eq!(names, ["features.0.w", "features.1.0.w", "features.1.1.0.w", "features.2.w"]);
    let shape = |name: &str| {
        let (_, id) = g.outputs.iter().find(|(n, _)| n == name).expect("an output");
        g.node(*id).shape.clone()
    };
    // Applied in order through the nested sequences: 4 → 4 → 3 → 3 → 3.
    assert_eq!(shape("y"), [2, 3]);
    assert_eq!(shape("inner"), [2, 3]);
    assert_eq!(shape("by_name"), [2, 3]);
}

#[test]
fn a_list_chosen_by_if_names_its_items_by_their_place_in_it() {
    let text = model(
        "block = if wide { [Widen(4, 8), Widen(8, 4), Scale(4)] } else { [Widen(4, 4), Scale(4)] }",
        "output y = block(x)",
    );
    let narrow = build(&text, Mode::Infer, &[]).expect("elaborates");
    assert_eq!(param_names(&narrow), ["block.0.w", "block.1.w"]);
    let wide = build(&text, Mode::Infer, &["wide=true"]).expect("elaborates");
    assert_eq!(param_names(&wide), ["block.0.w", "block.1.w", "block.2.w"]);
    assert_eq!(wide.params[1].shape, [8, 4]);
}

#[test]
fn repeat_names_its_copies_by_a_pattern_and_repeats_lists() {
    let text = model(
        "layers = repeat(3, i, name = \"encoder_layer_{i}\") Scale(4)
         pairs = repeat(2) [Scale(4), Widen(4, 4)]",
        "output y = pairs(layers(x))
         output last = layers.encoder_layer_2(x) + layers[-1](x)",
    );
    let g = build(&text, Mode::Infer, &[]).expect("elaborates");
    assert_eq!(
        param_names(&g),
        [
            "layers.encoder_layer_0.w",
            "layers.encoder_layer_1.w",
            "layers.encoder_layer_2.w",
            "pairs.0.0.w",
            "pairs.0.1.w",
            "pairs.1.0.w",
            "pairs.1.1.w",
        ]
    );
}

#[test]
fn unknown_items_and_reused_layers_are_errors_at_their_place() {
    let text = model("layers = repeat(2) Scale(4)", "output y = layers.three(x)");
    let d = build(&text, Mode::Infer, &[]).unwrap_err();
    assert_eq!(d.code, "E0101");
    assert!(d.message.contains("has no item `three`"), "{}", d.message);
    let text = model("a = Scale(4)\n    seq = [[a]]", "output y = seq(x)");
    let d = build(&text, Mode::Infer, &[]).unwrap_err();
    assert_eq!(
        (d.code, d.message.as_str()),
        ("E0108", "the list item `seq.0.0` would reuse the existing layer `a`")
    );
    let text = model("seq = repeat(2) [Scale(4), 1]", "output y = seq(x)");
    assert_eq!(build(&text, Mode::Infer, &[]).unwrap_err().code, "E0201");
}
