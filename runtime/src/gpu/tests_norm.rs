//! The GPU norm kernels (and their derivatives) against the CPU backend, with and without
//! weight and bias, on small odd shapes. Runs like `tests.rs`: skipped without a device unless
//! `MGN_REQUIRE_GPU=1`.

use super::session::GpuSession;
use crate::op::{GradPart, Op};
use crate::optim::OptimizerSpec;
use crate::plan::{Mode, ParamSpec, Plan, SourceLoc, Step};
use crate::tensor::Tensor;
use crate::DType;

fn step(op: Op, inputs: Vec<u32>, dtype: DType, shape: &[usize]) -> Step {
    Step { op, inputs, dtype, shape: shape.to_vec(), loc: SourceLoc { file: "t.mgn".into(), line: 1, column: 1 } }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0 - 1.0).collect()
}

/// Runs `op` on float inputs of the given shapes (each with `shift` added) on the GPU and the
/// CPU, and compares.
fn check(op: Op, inputs: &[(&[usize], f32)], out_shape: &[usize], tol: f64) {
    let mut steps = Vec::new();
    let mut names = Vec::new();
    let mut tensors = Vec::new();
    for (k, (s, shift)) in inputs.iter().enumerate() {
        let n: usize = s.iter().product();
        let name = format!("x{k}");
        let t = Tensor::f32(s.to_vec(), values(n, k as u32 * 977 + 5).into_iter().map(|v| v + shift).collect());
        steps.push(step(Op::Input { name: name.clone() }, vec![], DType::F32, s));
        names.push((name.clone(), k as u32));
        tensors.push((name, t));
    }
    steps.push(step(op.clone(), (0..inputs.len() as u32).collect(), DType::F32, out_shape));
    let out = steps.len() as u32 - 1;
    let plan = Plan {
        model: "T".into(),
        mode: Mode::Train,
        config: vec![],
        params: Vec::<ParamSpec>::new(),
        steps,
        inputs: names,
        outputs: vec![("y".into(), out)],
        loss: None,
        grads: vec![],
        optimizer: OptimizerSpec::default(),
    };
    let mut gpu = match GpuSession::new(plan, &[]) {
        Ok(g) => g,
        Err(e) if std::env::var("MGN_REQUIRE_GPU").map_or(true, |v| v != "1") && !e.0.contains("GPU kernel") && !e.0.contains("kernel `") => {
            eprintln!("skipping: {e}");
            return;
        }
        Err(e) => panic!("{}: {e}", op.describe()),
    };
    let given: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let got = gpu.run(&given, 0).unwrap_or_else(|e| panic!("{}: {e}", op.describe())).outputs.remove(0).1;
    let refs: Vec<&Tensor> = tensors.iter().map(|(_, t)| t).collect();
    let want = crate::cpu::eval(&op, &refs, DType::F32, out_shape, &crate::cpu::Ctx { training: true, seed: 0, node: 0 }).expect("cpu runs");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(g.len(), w.len());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{}: element {i}: gpu {a}, cpu {b}", op.describe());
    }
}

/// Every (has_weight, has_bias) combination with the parts it can differentiate.
fn affines() -> Vec<(bool, bool, Vec<GradPart>)> {
    vec![
        (false, false, vec![GradPart::Input]),
        (true, false, vec![GradPart::Input, GradPart::Weight]),
        (false, true, vec![GradPart::Input, GradPart::Bias]),
        (true, true, vec![GradPart::Input, GradPart::Weight, GradPart::Bias]),
    ]
}

/// `x`, then the parameters present (each of shape `[p]`), then `dy` when `grad`.
fn norm_inputs<'a>(x: &'a [usize], p: &'a [usize], has_weight: bool, has_bias: bool, grad: bool) -> Vec<(&'a [usize], f32)> {
    let mut v = vec![(x, 0.0)];
    if has_weight {
        v.push((p, 0.5));
    }
    if has_bias {
        v.push((p, 0.0));
    }
    if grad {
        v.push((x, 0.0));
    }
    v
}

fn out_of<'a>(part: GradPart, x: &'a [usize], p: &'a [usize]) -> &'a [usize] {
    if part == GradPart::Input {
        x
    } else {
        p
    }
}

#[test]
fn layer_norm_and_its_derivatives_match_the_cpu() {
    for x in [&[3usize, 7][..], &[2, 3, 13], &[5]] {
        let p = [*x.last().unwrap()];
        for (w, b, parts) in affines() {
            check(Op::LayerNorm { eps: 1e-5, has_weight: w, has_bias: b }, &norm_inputs(x, &p, w, b, false), x, 1e-4);
            for part in parts {
                check(Op::LayerNormGrad { eps: 1e-5, has_weight: w, has_bias: b, part }, &norm_inputs(x, &p, w, b, true), out_of(part, x, &p), 2e-4);
            }
        }
    }
}

#[test]
fn rms_norm_and_its_derivatives_match_the_cpu() {
    for x in [&[3usize, 7][..], &[2, 3, 13], &[5]] {
        let p = [*x.last().unwrap()];
        for (w, _, parts) in affines().into_iter().filter(|a| !a.1) {
            check(Op::RmsNorm { eps: 1e-6, has_weight: w }, &norm_inputs(x, &p, w, false, false), x, 1e-4);
            for part in parts {
                check(Op::RmsNormGrad { eps: 1e-6, has_weight: w, part }, &norm_inputs(x, &p, w, false, true), out_of(part, x, &p), 2e-4);
            }
        }
    }
}

#[test]
fn group_norm_and_its_derivatives_match_the_cpu() {
    for (x, groups) in [(&[2usize, 6, 5][..], 3), (&[3, 4, 3, 5], 2), (&[2, 5], 5), (&[2, 6, 7], 1)] {
        let p = [x[1]];
        for (w, b, parts) in affines() {
            check(Op::GroupNorm { groups, eps: 1e-5, has_weight: w, has_bias: b }, &norm_inputs(x, &p, w, b, false), x, 1e-4);
            for part in parts {
                check(Op::GroupNormGrad { groups, eps: 1e-5, has_weight: w, has_bias: b, part }, &norm_inputs(x, &p, w, b, true), out_of(part, x, &p), 2e-4);
            }
        }
    }
}

#[test]
fn batch_norm_derivatives_match_the_cpu() {
    for x in [&[4usize, 3, 5][..], &[5, 3], &[2, 3, 2, 3]] {
        let p = [x[1]];
        for training in [true, false] {
            for (w, b, parts) in affines() {
                // x, running mean, running variance (positive), weight?, bias?, dy.
                let mut inputs: Vec<(&[usize], f32)> = vec![(x, 0.0), (&p, 0.0), (&p, 1.5)];
                inputs.extend(norm_inputs(x, &p, w, b, true).into_iter().skip(1));
                for part in parts {
                    check(Op::BatchNormGrad { eps: 1e-5, has_weight: w, has_bias: b, part, training }, &inputs, out_of(part, x, &p), 2e-4);
                }
            }
        }
    }
}

