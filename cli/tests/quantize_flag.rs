//! `--quantize TYPE` on the commands that compile a model: the line saying what it packed, and
//! a type that is not a packed one refused with the list of those that are.

mod common;

use common::{mgnc, ok, scratch, text};
use mgn_runtime::checkpoint;
use mgn_runtime::Tensor;

#[test]
fn run_with_quantize_says_how_many_weights_it_packed() {
    let dir = scratch("quantize-flag");
    let inputs = dir.join("in.safetensors");
    let tokens = Tensor::i32(vec![1, 8], (0..8).collect());
    checkpoint::save(&inputs, &[("tokens".to_string(), &tokens)], &[]).expect("written");
    let out = dir.join("out.safetensors");
    let (inputs, out) = (inputs.to_str().unwrap(), out.to_str().unwrap());
    let args = ["run", "models/tiny_gpt.mgn", "--backend", "cpu", "--inputs", inputs];
    let more = ["--out", out, "--set", "B=1", "--set", "T=8", "--quantize", "q4_0"];
    let printed = ok(&mgnc(&[&args[..], &more[..]].concat()));
    // The tied token table and four products in each of the four blocks.
    assert!(printed.contains("quantized 17 weights to q4_0: "), "{printed}");
    assert!(printed.contains(" MiB of parameters"), "{printed}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn build_with_a_k_quant_says_which_weights_fell_back() {
    let printed = ok(&mgnc(&["build", "models/tiny_gpt.mgn", "--quantize", "q4_k"]));
    // d = 128: only the products whose input is 512 wide (the MLPs' second layer) are whole
    // blocks of 256.
    assert!(
        printed.contains(
            "quantized 4 weights to q4_k, 13 to q4_1 (fell back from q4_k: last axis \
             not a multiple of 256)"
        ),
        "{printed}"
    );
}

#[test]
fn an_unknown_type_is_refused_with_the_list_of_types() {
    let out = mgnc(&["build", "models/tiny_gpt.mgn", "--quantize", "q9"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`q9` is not a packed type; the types are q8_0, q4_0, q4_1, q4_k, q6_k"),
        "{err}"
    );
}
