//! `--quantize` end to end on the CPU backend (the numerical reference): a packed plan of a
//! model in `models/` computes exactly what the f32 plan computes on the dequantized weights,
//! since reading a packed parameter is its `Dequantize` and nothing else changes.

use mgn_compiler::driver::plan_path;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;
use mgn_runtime::session::Session;
use mgn_runtime::Plan;
use mgn_tests::{rendered, root};

fn plan(quantize: Option<DType>) -> Plan {
    let settings = [("B", "2"), ("T", "16"), ("depth", "2")];
    let settings = settings.iter().map(|(n, v)| Setting::new(*n, v.to_string())).collect();
    let opts = PlanOptions { quantize, ..PlanOptions::infer() };
    let file = root().join("models/tiny_gpt.mgn");
    let (outcome, plan) = plan_path(&file, None, settings, &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    plan.expect("a plan")
}

#[test]
fn a_q8_0_plan_on_the_cpu_equals_the_f32_plan_on_the_dequantized_weights() {
    let packed = plan(Some(DType::Q8_0));
    let f32_plan = plan(None);
    let quantized: Vec<&str> = (packed.params.iter())
        .filter(|p| p.dtype == DType::Q8_0)
        .map(|p| p.name.as_str())
        .collect();
    // The tied token table (a lookup and the head's product) and every block's products; the
    // position table (read by `slice`), norms and biases stay f32.
    assert!(quantized.contains(&"wte.weight"), "{quantized:?}");
    assert!(quantized.contains(&"blocks.0.attn.qkv.weight"), "{quantized:?}");
    assert!(!quantized.iter().any(|n| *n == "wpe" || n.ends_with("bias") || n.contains("ln")));
    let mut q = Session::new(packed, 7);
    // The f32 plan's weights: the packed ones decoded, the others as the packed session drew them.
    let params: Vec<Tensor> = (f32_plan.params.iter())
        .map(|p| {
            let t = &q.params[q.param_index(&p.name).expect("the same parameters")];
            match &t.data {
                Data::Packed(_) => Tensor::f32(t.shape.clone(), t.dequantized()),
                _ => t.clone(),
            }
        })
        .collect();
    let mut exact = Session::new(f32_plan, 7);
    exact.params = params;
    let tokens = Tensor::i32(vec![2, 16], (0..32).map(|i| (i * 37) % 256).collect());
    let a = q.run(&[("tokens", &tokens)]).expect("the packed plan runs");
    let b = exact.run(&[("tokens", &tokens)]).expect("the f32 plan runs");
    let (a, b) = (a.outputs[0].1.to_f64_vec(), b.outputs[0].1.to_f64_vec());
    assert_eq!(a.len(), 2 * 16 * 256);
    assert_eq!(a, b, "the same weights give the same logits");
}
