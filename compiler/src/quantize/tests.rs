use super::*;
use crate::driver::{check_text, Models};
use crate::lower::{lower, PlanOptions};
use crate::source::Origin;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::precision::Precision;

/// A small transformer: token embedding tied to the head, a fused q/k/v projection, an MLP
/// with a hidden size that is not whole k-quant blocks, norms and biases.
const TINY: &str = "use std.nn.{Embedding, LayerNorm, Linear}
use std.loss.{cross_entropy}
model Tiny(d: dim = 256, vocab: dim = 512, hidden: dim = 384) {
    embed = Embedding(vocab, d)
    ln = LayerNorm(d)
    qkv = Linear(d, 3 * d)
    up = Linear(d, hidden)
    down = Linear(hidden, d)
    small = Linear(d, 8)
    back = param f32[8, d] init ones
    input ids: i32[2, 4]
    input labels: i32[2, 4]
    forward {
        let x = embed(ids)
        let (q, k, v) = split(qkv(ln(x)), 3, axis = -1)
        let h = x + attention(q, k, v, causal = true)
        let h = h + down(relu(up(h))) + small(h) @ back
        let logits = h @ embed.weight^T
        output logits
        loss cross_entropy(logits, labels)
    }
}";

fn graph_of(text: &str) -> (Graph, crate::source::SourceMap) {
    let mut out =
        check_text("m.mgn".into(), Origin::Memory("m.mgn".into()), text.into(), Models::All);
    assert!(out.ok(), "{:?}", out.diagnostics);
    (out.graphs.pop().expect("a graph"), out.program.sources)
}

fn names(chosen: &[(String, DType)]) -> Vec<(&str, DType)> {
    chosen.iter().map(|(n, d)| (n.as_str(), *d)).collect()
}

#[test]
fn a_small_transformer_packs_its_matrix_weights_and_the_tied_embedding() {
    let (g, _) = graph_of(TINY);
    let chosen = choose(&g, DType::Q4_0);
    // `small.weight` and `back` have 2048 elements; norms and biases stay.
    assert_eq!(
        names(&chosen),
        [
            ("embed.weight", DType::Q4_0),
            ("qkv.weight", DType::Q4_0),
            ("up.weight", DType::Q4_0),
            ("down.weight", DType::Q4_0),
        ]
    );
}

#[test]
fn k_quants_fall_back_where_the_last_axis_is_not_whole_blocks_of_256() {
    let (g, _) = graph_of(TINY);
    let chosen = choose(&g, DType::Q4_K);
    // `down.weight` is [256, 384]: 384 is not a multiple of 256.
    assert_eq!(
        names(&chosen),
        [
            ("embed.weight", DType::Q4_K),
            ("qkv.weight", DType::Q4_K),
            ("up.weight", DType::Q4_K),
            ("down.weight", DType::Q4_1),
        ]
    );
    let (g, _) = graph_of(TINY);
    assert_eq!(choose(&g, DType::Q6_K)[3], ("down.weight".to_string(), DType::Q8_0));
}

#[test]
fn a_weight_read_other_than_by_a_product_or_lookup_stays_f32() {
    let text = "model M {
    w = param f32[64, 128] init ones
    v = param f32[64, 128] init ones
    input x: f32[4, 128]
    forward {
        output y = x @ w^T + sum(v)
        output z = x @ v^T
    }
}";
    let (g, _) = graph_of(text);
    assert_eq!(names(&choose(&g, DType::Q8_0)), [("w", DType::Q8_0)]);
}

#[test]
fn a_training_plan_packs_only_what_it_does_not_train() {
    let (g, sources) = graph_of(TINY);
    let frozen = ["embed".to_string()];
    let opts = PlanOptions {
        quantize: Some(DType::Q8_0),
        ..PlanOptions::train(&frozen, OptimizerSpec::default())
    };
    let plan = lower(g, &sources, &opts).unwrap_or_else(|d| panic!("{}", d.message));
    let packed: Vec<&str> =
        plan.params.iter().filter(|p| p.dtype.is_packed()).map(|p| p.name.as_str()).collect();
    assert_eq!(packed, ["embed.weight"]);
    assert!(plan.grads.iter().all(|(p, _)| plan.params[*p].name != "embed.weight"));
    assert!(!plan.grads.is_empty());
}

#[test]
fn an_inference_plan_reads_each_packed_weight_through_one_dequantize_also_when_mixed() {
    for precision in [Precision::F32, Precision::MixedF16] {
        let (g, sources) = graph_of(TINY);
        let opts = PlanOptions { quantize: Some(DType::Q4_1), precision, ..PlanOptions::infer() };
        let plan = lower(g, &sources, &opts).unwrap_or_else(|d| panic!("{}", d.message));
        let packed = plan.params.iter().filter(|p| p.dtype == DType::Q4_1).count();
        let reads = plan.steps.iter().filter(|s| s.op == Op::Dequantize).count();
        assert_eq!((packed, reads), (4, 4), "{precision}");
        let summary = Summary::of_plan(&plan, DType::Q4_1).to_string();
        assert!(summary.starts_with("quantized 4 weights to q4_1: "), "{summary}");
    }
}

#[test]
fn a_reshape_keeps_the_last_axis_only_when_it_splits_the_axes_before_it() {
    assert_eq!(kept_axis(&[64, 128], &[4, 16, 128], 1), Some(2));
    assert_eq!(kept_axis(&[64, 128], &[64, 2, 64], 1), None);
    assert_eq!(kept_axis(&[64, 128], &[8192], 1), None);
}
