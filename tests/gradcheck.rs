//! Whole-model gradient checks: each small model is compiled to a training plan and run in
//! float64; the gradient of every parameter is compared, at a few sampled elements, with a
//! central finite difference of the loss. Parameters are perturbed first, so that constant
//! initializations (norm weights 1, biases 0) cannot hide a wrong gradient.

use mgn_compiler::lower::PlanOptions;
use mgn_compiler::{driver::plan_path, elab::Setting};
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::tensor::{Data, Tensor};
use mgn_runtime::session::Session;
use mgn_runtime::Plan;
use mgn_tests::{rendered, root};
use std::path::Path;

/// A small deterministic generator (tests only need reproducible noise).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64) / ((1u64 << 53) as f64)
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.next().max(1e-12), self.next());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

fn compile(model: &str, settings: &[&str]) -> Plan {
    root();
    let settings: Vec<Setting> =
        settings.iter().map(|s| s.parse().expect("valid setting")).collect();
    let (outcome, plan) = plan_path(
        Path::new(model),
        None,
        settings,
        &PlanOptions::train(&[], OptimizerSpec::default()),
    )
    .expect("readable");
    assert!(outcome.ok(), "{model}: {}", rendered(&outcome));
    plan.expect("a training plan")
}

fn to_f64(t: &Tensor) -> Tensor {
    match &t.data {
        Data::F32(v) => Tensor {
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: Data::F64(v.iter().map(|&x| x as f64).collect()),
        },
        _ => t.clone(),
    }
}

/// Runs `session` on `inputs` on the CPU, then (where there is a device) on the GPU, and
/// checks each run's output with `check`, which names the backend in its messages.
fn on_cpu_and_gpu(
    session: &mut Session,
    inputs: &[(&str, &Tensor)],
    check: impl Fn(&mgn_runtime::session::RunOutput, &str),
) {
    check(&session.run(inputs).expect("runs on the CPU"), "CPU");
    match session.use_gpu() {
        Ok(_) => check(&session.run(inputs).expect("runs on the GPU"), "GPU"),
        Err(e) if e.is_no_device() && !mgn_gpu::testing::device_required() => {
            mgn_gpu::testing::record_skip("no Vulkan device for the GPU half");
        }
        Err(e) => panic!("the GPU cannot run it: {e}"),
    }
}

fn loss(session: &mut Session, inputs: &[(String, Tensor)]) -> f64 {
    let given: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    session.run(&given).expect("runs").loss.expect("has a loss").to_f64_vec()[0]
}

fn check_model(model: &str, settings: &[&str]) {
    let plan = compile(model, settings);
    let mut rng = Lcg(0x5eed ^ model.len() as u64);
    let inputs: Vec<(String, Tensor)> = plan
        .inputs
        .iter()
        .map(|(name, v)| {
            let s = &plan.steps[*v as usize];
            let n: usize = s.shape.iter().product();
            let t = if s.dtype.is_float() {
                Tensor {
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    data: Data::F64((0..n).map(|_| rng.normal()).collect()),
                }
            } else {
                // The bound is `Plan::int_input_range`'s (shared with `mgnc bench`); 100 when
                // nothing bounds it.
                let hi = plan.int_input_range(*v).unwrap_or(100);
                Tensor {
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    data: Data::I32((0..n).map(|_| (rng.next() * hi as f64) as i32).collect()),
                }
            };
            (name.clone(), t)
        })
        .collect();
    let mut session = Session::new(plan, 7);
    session.check_numerics = true;
    for p in session.params.iter_mut() {
        *p = to_f64(p);
        if let Data::F64(v) = &mut p.data {
            for x in v.iter_mut() {
                *x += 0.1 * rng.normal();
            }
        }
    }
    let given: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out = session.run(&given).expect("runs");
    assert!(!out.grads.is_empty(), "{model}: no gradients");
    let grads: Vec<(String, Vec<f64>)> =
        out.grads.iter().map(|(n, g)| (n.clone(), g.to_f64_vec())).collect();
    let h = 1e-5;
    let mut failures = Vec::new();
    for (name, g) in &grads {
        let index = session.param_index(name).expect("a parameter");
        let n = g.len();
        for k in 0..3.min(n) {
            let e = ((rng.next() * n as f64) as usize).min(n - 1);
            let e = if k == 0 { 0 } else { e };
            let orig = match &session.params[index].data {
                Data::F64(v) => v[e],
                _ => unreachable!("converted above"),
            };
            let set = |s: &mut Session, x: f64| {
                if let Data::F64(v) = &mut s.params[index].data {
                    v[e] = x;
                }
            };
            set(&mut session, orig + h);
            let up = loss(&mut session, &inputs);
            set(&mut session, orig - h);
            let down = loss(&mut session, &inputs);
            set(&mut session, orig);
            let fd = (up - down) / (2.0 * h);
            let an = g[e];
            if (fd - an).abs() > 1e-6 + 2e-3 * fd.abs().max(an.abs()) {
                failures
                    .push(format!("{name}[{e}]: autodiff {an:.8e}, finite difference {fd:.8e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} gradient mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn digits_mlp() {
    check_model("models/digits_mlp.mgn", &["batch=4", "hidden=8"]);
}

#[test]
fn digits_cnn_with_batch_norm() {
    check_model("models/digits_cnn.mgn", &["batch=3", "c1=4", "c2=6"]);
}

/// std.nn's MultiheadAttention equals the attention written out from its parameters (self,
/// causal, cross with a mask, causal across lengths), on the CPU and where there is one on the
/// GPU; and its gradients are right.
#[test]
fn multihead_attention_is_the_attention_written_out() {
    let model = "tests/valid/multihead_attention.mgn";
    check_model(model, &[]);
    let plan = compile(model, &[]);
    let mut rng = Lcg(11);
    let mut normal = |shape: Vec<usize>| {
        let n = shape.iter().product();
        Tensor::f32(shape, (0..n).map(|_| rng.normal() as f32).collect())
    };
    let (x, ctx, mask) = (normal(vec![2, 5, 8]), normal(vec![2, 3, 8]), normal(vec![5, 3]));
    let mut session = Session::new(plan, 5);
    let check = |out: &mgn_runtime::session::RunOutput, on: &str| {
        let get = |name: &str| {
            let (_, t) = out.outputs.iter().find(|(n, _)| n == name).expect("an output");
            t.to_f64_vec()
        };
        for name in ["selfish", "ordered", "crossed", "first"] {
            let (layer, hand) = (get(name), get(&format!("{name}_by_hand")));
            let worst = layer.iter().zip(&hand).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-5, "{on}: {name} differs from the hand computation by {worst}");
        }
    };
    on_cpu_and_gpu(&mut session, &[("x", &x), ("ctx", &ctx), ("mask", &mask)], check);
}

/// Nested lists, a list chosen by `if` and named copies, each called in order.
#[test]
fn nested_and_named_sequences() {
    check_model("tests/valid/sequences.mgn", &[]);
}

#[test]
fn tiny_gpt() {
    check_model(
        "models/tiny_gpt.mgn",
        &["vocab=11", "d=8", "depth=2", "heads=2", "block_size=8", "B=2", "T=5"],
    );
}

#[test]
fn tiny_llama_with_gqa_and_rope() {
    check_model(
        "models/tiny_llama.mgn",
        &["vocab=13", "d=16", "n_layers=1", "heads=4", "kv_heads=2", "hidden=12", "B=2", "T=5"],
    );
}

#[test]
fn tiny_resnet() {
    check_model("models/tiny_resnet.mgn", &["B=2", "classes=3", "width=4", "blocks=1", "size=8"]);
}

#[test]
fn tiny_seq2seq_with_cross_attention() {
    check_model(
        "models/tiny_seq2seq.mgn",
        &[
            "src_vocab=9",
            "tgt_vocab=7",
            "d=8",
            "heads=2",
            "enc_layers=1",
            "dec_layers=1",
            "max_len=8",
            "B=2",
            "S=4",
            "T=3",
        ],
    );
}

#[test]
fn tiny_unet() {
    check_model(
        "models/tiny_unet.mgn",
        &[
            "B=2",
            "in_channels=2",
            "size=4",
            "ch=8",
            "groups=2",
            "heads=2",
            "ctx_len=3",
            "ctx_dim=4",
        ],
    );
}

/// Padding in every mode and interpolation in every mode, through convolutions.
#[test]
fn padding_and_interpolation() {
    check_model("tests/valid/pad_interpolate.mgn", &["N=2", "C=2", "L=7", "H=4", "W=5"]);
}

/// Transposed convolutions (grouped, dilated, with output padding and a bias), 1-D and 2-D
/// pooling, a non-square convolution and dropout.
#[test]
fn transposed_convolutions_and_pooling() {
    check_model("tests/valid/transposed_and_pooling.mgn", &["N=2", "C=2", "L=6", "H=6", "W=6"]);
}

/// `einsum`'s forms equal the ops they stand for (every `diff_` output of the model is 0), and
/// its gradients, through the permutes, reshapes, products and sums it elaborates to, are
/// right.
#[test]
fn einsum_is_the_ops_it_stands_for() {
    let model = "tests/valid/einsum.mgn";
    check_model(model, &[]);
    let plan = compile(model, &[]);
    let mut session = Session::new(plan.clone(), 3);
    let inputs: Vec<(String, Tensor)> = plan
        .inputs
        .iter()
        .enumerate()
        .map(|(k, (name, v))| {
            let shape = plan.steps[*v as usize].shape.clone();
            let n: usize = shape.iter().product();
            let data = (0..n).map(|i| ((i * 7 + k * 3) % 11) as f32 / 5.0 - 1.0).collect();
            (name.clone(), Tensor::f32(shape, data))
        })
        .collect();
    let given: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out = session.run(&given).expect("runs");
    let diffs: Vec<_> = out.outputs.iter().filter(|(n, _)| n.starts_with("diff_")).collect();
    assert_eq!(diffs.len(), 12, "every form is compared");
    for (name, t) in diffs {
        let worst = t.to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(worst < 1e-5, "{name}: {worst}");
    }
}

/// `stop_gradient` is the identity forward and blocks the backward: for
/// `loss = Σ w·stop_gradient(w) + Σ x·v` the derivative is `w`, not the `2w` a finite
/// difference sees, and `v`'s is `x` alone (the target built from `stop_gradient(v)` adds
/// nothing). On the CPU and, where there is one, on the GPU.
#[test]
fn stop_gradient_passes_values_and_blocks_gradients() {
    let plan = compile("tests/valid/stop_gradient.mgn", &[]);
    let x = Tensor::f32(vec![5], vec![0.5, -1.0, 2.0, 0.25, -3.0]);
    let mut session = Session::new(plan.clone(), 3);
    let w = session.params[session.param_index("w").expect("w")].to_f64_vec();
    let v = session.params[session.param_index("v").expect("v")].to_f64_vec();
    let check = |out: &mgn_runtime::session::RunOutput, on: &str| {
        let grad = |name: &str| {
            let (_, g) = out.grads.iter().find(|(n, _)| n == name).expect("a gradient");
            g.to_f64_vec()
        };
        let loss = out.loss.as_ref().expect("a loss").to_f64_vec()[0];
        let want: f64 = w.iter().map(|a| a * a).sum::<f64>()
            + v.iter().zip(x.to_f64_vec()).map(|(a, b)| a * b).sum::<f64>();
        assert!((loss - want).abs() < 1e-5, "{on}: loss {loss} vs {want}");
        for (g, a) in grad("w").iter().zip(&w) {
            assert!((g - a).abs() < 1e-6, "{on}: dw {g} vs w {a}");
        }
        for (g, a) in grad("v").iter().zip(x.to_f64_vec()) {
            assert!((g - a).abs() < 1e-6, "{on}: dv {g} vs x {a}");
        }
        let gap = out.outputs.iter().find(|(n, _)| n == "gap").expect("gap").1.to_f64_vec();
        for (g, a) in gap.iter().zip(&v) {
            assert!((g - a).abs() < 1e-6, "{on}: gap {g} vs v {a}");
        }
    };
    on_cpu_and_gpu(&mut session, &[("x", &x)], check);
}

/// A learned attention bias (a relative-position table gathered per pair and ALiBi-style
/// slopes) trains: its gradient is the scores' derivative, with and without causality.
#[test]
fn learned_attention_bias() {
    check_model("tests/valid/learned_bias.mgn", &[]);
    check_model("tests/valid/learned_bias.mgn", &["causal=false", "T=5", "B=1"]);
}

/// Comparisons, masks, `where`, `maximum`, `minimum` and `clamp` (number and tensor bounds),
/// with a cross-entropy on the labels the one-hot mask is built from.
#[test]
fn masks_where_and_clamp() {
    check_model("tests/valid/masks.mgn", &[]);
}

/// At ties `maximum` and `minimum` split the gradient in half and `clamp` passes it whole
/// (PyTorch's conventions), which no finite difference can check: the derivative of
/// `tests/valid/ties.mgn` at w = x = 0.5 is 3 everywhere. On the CPU and, where there is one,
/// on the GPU.
#[test]
fn gradients_at_ties_follow_pytorch() {
    let plan = compile("tests/valid/ties.mgn", &[]);
    let x = Tensor::f32(vec![4], vec![0.5; 4]);
    let mut session = Session::new(plan, 3);
    let check = |out: &mgn_runtime::session::RunOutput, on: &str| {
        let (_, g) = out.grads.iter().find(|(n, _)| n == "w").expect("a gradient");
        assert_eq!(g.to_f64_vec(), vec![3.0; 4], "{on}");
        let loss = out.loss.as_ref().expect("a loss").to_f64_vec()[0];
        assert_eq!(loss, 8.0, "{on}: loss");
    };
    on_cpu_and_gpu(&mut session, &[("x", &x)], check);
}

/// erf, log1p, expm1, softplus (with and without its β and threshold) and std.nn's
/// activations built on them and on `where`, over arguments past every kink.
#[test]
fn activations_and_tail_functions() {
    check_model("tests/valid/activations.mgn", &[]);
}

/// At their kinks the activations take PyTorch's one-sided derivatives (hardtanh's 0 at both
/// ends of relu6, hardswish's (2x + 3) / 6 on the closed interval, leaky_relu's slope at 0),
/// which finite differences cannot check: the values are those of PyTorch's backward.
#[test]
fn activation_derivatives_at_the_kinks_are_pytorchs() {
    let plan = compile("tests/valid/kinks.mgn", &[]);
    let x = Tensor::f32(vec![4], vec![0.0, 6.0, -3.0, 3.0]);
    let mut session = Session::new(plan, 3);
    let want: [(&str, [f64; 4]); 5] = [
        ("a", [0.0, 0.0, 0.0, 1.0]),
        ("b", [1.0 / 6.0, 0.0, 0.0, 0.0]),
        ("c", [0.5, 1.0, -0.5, 1.5]),
        ("d", [0.2, 1.0, 0.2, 1.0]),
        ("e", [1.0, 1.0, (-3f64).exp(), 1.0]),
    ];
    let check = |out: &mgn_runtime::session::RunOutput, on: &str| {
        for (name, want) in want {
            let (_, g) = out.grads.iter().find(|(n, _)| n == name).expect("a gradient");
            for (g, w) in g.to_f64_vec().iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "{on}: d/d{name}: {:?} vs {want:?}", g);
            }
        }
    };
    on_cpu_and_gpu(&mut session, &[("x", &x)], check);
}

/// `full`, `zeros_like`, `ones_like`, `broadcast_to` and `expand` (the gradients of the last
/// two summed back over the broadcast axes) and `one_hot`.
#[test]
fn filled_and_broadcast_tensors() {
    check_model("tests/valid/fill.mgn", &[]);
}

/// The cross-entropy written with `one_hot` is std.loss's, and `one_hot` counts the labels
/// (a label outside the classes is a row of zeros), on the CPU and the GPU.
#[test]
fn one_hot_rows_count_labels_and_rebuild_the_loss() {
    let plan = compile("tests/valid/fill.mgn", &[]);
    let x = Tensor::f32(vec![4, 5], (0..20).map(|i| (i as f32 * 0.37).sin()).collect());
    let labels = Tensor::i32(vec![4], vec![3, 0, 3, 4]);
    let mut session = Session::new(plan, 3);
    let check = |out: &mgn_runtime::session::RunOutput, on: &str| {
        let get = |name: &str| {
            out.outputs.iter().find(|(n, _)| n == name).expect("an output").1.to_f64_vec()
        };
        let (a, b) = (get("by_hand")[0], get("reference")[0]);
        assert!((a - b).abs() < 1e-6 * b.abs(), "{on}: {a} by hand, {b} from std.loss");
        assert_eq!(get("counts"), [1.0, 0.0, 0.0, 2.0, 1.0], "{on}");
        assert_eq!(get("seven"), [7.0; 6], "{on}");
    };
    let given = [("x", &x), ("labels", &labels)];
    on_cpu_and_gpu(&mut session, &given, check);
}

/// Top-k routing of a mixture of experts: the router learns through the top-k values, the
/// experts through `take_along_axis`; `cumsum` forward and reversed.
#[test]
fn top_k_routing_and_running_sums() {
    check_model("tests/valid/routing.mgn", &[]);
    check_model("tests/valid/routing.mgn", &["tokens=9", "experts=7", "k=3"]);
}

/// `cross_entropy` with `weight` and `ignore_index` (gradients through the log-softmax read at
/// the targets, weighted).
#[test]
fn weighted_cross_entropy_with_ignored_targets() {
    check_model("tests/valid/weighted_loss.mgn", &[]);
}

/// The weighted, ignoring cross-entropy is PyTorch's formula, Σ w[t]·(logsumexp − logit[t]) /
/// Σ w[t] over the targets not ignored (labels of -100 included, which a plain cross-entropy
/// would refuse). On the CPU and, where there is one, on the GPU.
#[test]
fn weighted_cross_entropy_is_pytorchs_weighted_mean() {
    let dir = std::env::temp_dir().join(format!("mgn-weighted-ce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = dir.join("ce.mgn");
    std::fs::write(
        &model,
        "use std.loss.{cross_entropy}
model Ce {
    input logits: f32[2, 3, 3]
    input labels: i32[2, 3]
    input class_weight: f32[3]
    forward {
        output ignoring = cross_entropy(logits, labels, ignore_index = -100)
        loss cross_entropy(logits, labels, weight = class_weight, ignore_index = -100)
    }
}
",
    )
    .expect("written");
    let plan = compile(model.to_str().expect("utf-8"), &[]);
    let x: Vec<f64> = (0..18).map(|i| (i as f64 * 0.7).cos() * 3.0).collect();
    let labels = [2, -100, 0, 1, 2, -100];
    let w = [0.5, 2.0, 1.5];
    let (mut num, mut den, mut plain, mut count) = (0.0, 0.0, 0.0, 0.0);
    for (row, &t) in labels.iter().enumerate() {
        let l = &x[row * 3..row * 3 + 3];
        let lse = l.iter().map(|v| v.exp()).sum::<f64>().ln();
        if t >= 0 {
            let nll = lse - l[t as usize];
            (num, den) = (num + w[t as usize] * nll, den + w[t as usize]);
            (plain, count) = (plain + nll, count + 1.0);
        }
    }
    let logits = Tensor::f32(vec![2, 3, 3], x.iter().map(|&v| v as f32).collect());
    let labels = Tensor::i32(vec![2, 3], labels.to_vec());
    let class_weight = Tensor::f32(vec![3], w.iter().map(|&v| v as f32).collect());
    let mut session = Session::new(plan, 3);
    let check = |out: &mgn_runtime::session::RunOutput, on: &str| {
        let loss = out.loss.as_ref().expect("a loss").to_f64_vec()[0];
        assert!((loss - num / den).abs() < 1e-5, "{on}: {loss} vs {}", num / den);
        let ignoring = out.outputs.iter().find(|(n, _)| n == "ignoring").expect("output");
        let ignoring = ignoring.1.to_f64_vec()[0];
        assert!((ignoring - plain / count).abs() < 1e-5, "{on}: {ignoring}");
    };
    let given = [("logits", &logits), ("labels", &labels), ("class_weight", &class_weight)];
    on_cpu_and_gpu(&mut session, &given, check);
    std::fs::remove_dir_all(&dir).ok();
}
