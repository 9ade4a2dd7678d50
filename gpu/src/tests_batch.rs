//! A training batch norm over chunks of its channels (`kernels/norm/moments.rs`) against the
//! CPU: the moments, the gradient sums, the norm with and without an epilogue, and each
//! derivative, at chunk sizes that cut channels evenly, unevenly, into one chunk and one value
//! each, with a mean far from zero. Runs like `tests.rs`: skipped without a device unless
//! `MGN_REQUIRE_GPU=1`.

use super::test_util::{check_on_both, run_on_cpu, values};
use crate::program::{moments_shape, Elem, GpuOp};
use mgn_ir::op::{BinaryOp, GradPart, Op, UnaryOp};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

const F: DType = DType::F32;

/// A tensor of `shape` with values in [shift − 1, shift + 1).
fn tensor(shape: &[usize], seed: u32, shift: f32) -> Tensor {
    let v = values(shape.iter().product(), seed).into_iter().map(|v| v + shift).collect();
    Tensor::f32(shape.to_vec(), v)
}

/// (x's shape, chunk) pairs: uneven, even, a single chunk, one value per chunk, no spatial
/// axes, and chunks long enough for the kernels' four-way loops at a 256-wide workgroup.
fn cases() -> Vec<(Vec<usize>, usize)> {
    vec![
        (vec![2, 3, 5, 7], 16),
        (vec![2, 3, 5, 7], 7),
        (vec![2, 3, 5, 7], 70),
        (vec![2, 3, 5, 7], 100),
        (vec![3, 2, 2], 1),
        (vec![6, 4], 4),
        (vec![2, 2, 3000], 2048),
    ]
}

/// The moments of `x` and the sums of `x` and `dy`, as the CPU reference makes them.
fn moments_and_sums(x: &Tensor, dy: &Tensor, chunk: usize) -> (Tensor, Tensor) {
    let shape = moments_shape(&x.shape, chunk).expect("[N, C, ...]");
    let m = run_on_cpu(&GpuOp::BatchMoments { chunk }, &[x], F, &shape);
    let s = run_on_cpu(&GpuOp::BatchGradSums { chunk }, &[x, dy, &m], F, &shape);
    (m, s)
}

#[test]
fn moments_and_gradient_sums_match_the_cpu() {
    for (shape, chunk) in cases() {
        let (x, dy) = (tensor(&shape, 1, 30.0), tensor(&shape, 2, 0.0));
        let (m, _) = moments_and_sums(&x, &dy, chunk);
        let out = moments_shape(&shape, chunk).unwrap();
        check_on_both(&GpuOp::BatchMoments { chunk }, std::slice::from_ref(&x), F, &out, 1e-4);
        check_on_both(&GpuOp::BatchGradSums { chunk }, &[x, dy, m], F, &out, 1e-4);
    }
}

/// `[x, rm, rv, weight?, bias?]` for a batch norm over x.
fn norm_operands(x: &Tensor, has_weight: bool, has_bias: bool) -> Vec<Tensor> {
    let c = [x.shape[1]];
    let mut v = vec![x.clone(), tensor(&c, 3, 0.0), tensor(&c, 4, 2.0)];
    if has_weight {
        v.push(tensor(&c, 5, 0.5));
    }
    if has_bias {
        v.push(tensor(&c, 6, 0.0));
    }
    v
}

#[test]
fn the_norm_and_its_epilogue_match_the_cpu() {
    // relu(y + res), as ResNet's blocks end; Input(1) is the step's input past the moments.
    let epilogue = vec![
        Elem::Input(0),
        Elem::Input(1),
        Elem::Binary(BinaryOp::Add, 0, 1),
        Elem::Unary(UnaryOp::Relu, 2),
    ];
    for (shape, chunk) in cases() {
        let x = tensor(&shape, 1, 30.0);
        let (m, _) = moments_and_sums(&x, &x, chunk);
        for (w, b) in [(false, false), (true, false), (false, true), (true, true)] {
            let norm = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: w, has_bias: b };
            let mut inputs = norm_operands(&x, w, b);
            inputs.push(m.clone());
            let plain = vec![Elem::Input(0)];
            let (n, recomputed) = (norm.clone(), false);
            let op = GpuOp::BatchNormWithMoments { norm: n, chunk, program: plain, recomputed };
            check_on_both(&op, &inputs, F, &shape, 1e-4);
            inputs.push(tensor(&shape, 7, 0.0));
            let program = epilogue.clone();
            check_on_both(
                &GpuOp::BatchNormWithMoments { norm, chunk, program, recomputed },
                &inputs,
                F,
                &shape,
                1e-4,
            );
        }
    }
}

#[test]
fn every_derivative_from_the_sums_matches_the_cpu() {
    for (shape, chunk) in cases() {
        let (x, dy) = (tensor(&shape, 1, 30.0), tensor(&shape, 2, 0.0));
        let (m, s) = moments_and_sums(&x, &dy, chunk);
        let parts = |w: bool, b: bool| {
            let mut p = vec![GradPart::Input];
            p.extend(w.then_some(GradPart::Weight));
            p.extend(b.then_some(GradPart::Bias));
            p
        };
        for (w, b) in [(false, false), (true, false), (false, true), (true, true)] {
            for part in parts(w, b) {
                let grad = Op::BatchNormGrad {
                    eps: 1e-5,
                    has_weight: w,
                    has_bias: b,
                    part,
                    training: true,
                };
                let mut inputs = norm_operands(&x, w, b);
                inputs.extend([dy.clone(), m.clone(), s.clone()]);
                let out = if part == GradPart::Input { shape.clone() } else { vec![shape[1]] };
                let op = GpuOp::BatchNormGradWithSums { grad, chunk };
                check_on_both(&op, &inputs, F, &out, 1e-3);
            }
        }
    }
}
