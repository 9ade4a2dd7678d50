//! The GPU norm kernels (and their derivatives) against the CPU backend, with and without
//! weight and bias, on small odd shapes. Runs like `tests.rs`: skipped without a device unless
//! `MGN_REQUIRE_GPU=1`.

use crate::op::{GradPart, Op};
use super::test_util::{check_on_both, values};
use crate::tensor::Tensor;
use crate::DType;



/// Runs `op` on float inputs of the given shapes (each with `shift` added) on the GPU and the
/// CPU, and compares.
fn check(op: Op, inputs: &[(&[usize], f32)], out_shape: &[usize], tol: f64) {
    let tensors: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(k, (s, shift))| Tensor::f32(s.to_vec(), values(s.iter().product(), k as u32 * 977 + 5).into_iter().map(|v| v + shift).collect()))
        .collect();
    check_on_both(&op, &tensors, DType::F32, out_shape, tol);
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

