//! Every GPU kernel family against the CPU backend, on small odd shapes with broadcasting.
//! Runs on the device `mgnc info` would use (lavapipe in CI, where `MGN_REQUIRE_GPU=1`).

use super::test_util::{check_on_both, values};
use mgn_ir::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

/// Runs `op` on inputs of the given shapes (float unless listed in `ints` with a bound) on the
/// GPU and the CPU, and compares.
fn check(op: Op, shapes: &[&[usize]], ints: &[(usize, i32)], out_shape: &[usize], tol: f64) {
    check_shifted(op, shapes, ints, out_shape, tol, 0.0)
}

/// As `check`, with `shift` added to every float input (positive inputs for log, sqrt, rsqrt).
fn check_shifted(
    op: Op,
    shapes: &[&[usize]],
    ints: &[(usize, i32)],
    out_shape: &[usize],
    tol: f64,
    shift: f32,
) {
    let tensors: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n: usize = s.iter().product();
            match ints.iter().find(|(i, _)| *i == k) {
                Some((_, hi)) => {
                    Tensor::i32(s.to_vec(), (0..n).map(|i| (i as i32 * 7 + 3) % hi).collect())
                }
                None => Tensor::f32(
                    s.to_vec(),
                    values(n, k as u32 * 977).into_iter().map(|v| v + shift).collect(),
                ),
            }
        })
        .collect();
    let out_dtype = if matches!(op, Op::Arange) { DType::I32 } else { DType::F32 };
    check_on_both(&op, &tensors, out_dtype, out_shape, tol);
}

#[test]
fn pointwise_ops_match_the_cpu() {
    use UnaryOp::*;
    let all = [Neg, Relu, Gelu, GeluTanh, Silu, Sigmoid, Tanh, Exp, Abs, Sin, Cos, Square];
    for u in all.into_iter().chain([Erf, Log1p, Expm1, Softplus]) {
        check(Op::Unary(u), &[&[3, 7]], &[], &[3, 7], 1e-5);
        check(Op::UnaryGrad(u), &[&[3, 7], &[3, 7]], &[], &[3, 7], 1e-5);
    }
    check(Op::StopGradient, &[&[3, 7]], &[], &[3, 7], 0.0);
    // Sinusoidal embeddings take sin and cos of timesteps and positions in the thousands, past
    // the [−π, π] where WGSL bounds their error.
    let far: Vec<f32> = (0..40).map(|i| (i * i * 97) as f32 * 0.37 - 2000.0).collect();
    for u in [Sin, Cos] {
        check_on_both(
            &Op::Unary(u),
            &[Tensor::f32(vec![40], far.clone())],
            DType::F32,
            &[40],
            1e-6,
        );
    }
    for u in [Log, Sqrt, Rsqrt] {
        check_shifted(Op::Unary(u), &[&[3, 7]], &[], &[3, 7], 1e-5, 2.0);
        check_shifted(Op::UnaryGrad(u), &[&[3, 7], &[3, 7]], &[], &[3, 7], 1e-5, 2.0);
    }
    check_shifted(Op::Pow { exponent: 1.5 }, &[&[3, 7]], &[], &[3, 7], 1e-5, 2.0);
    check_shifted(Op::Binary(BinaryOp::Div), &[&[2, 3, 5], &[3, 1]], &[], &[2, 3, 5], 1e-5, 2.0);
    for b in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul] {
        check(Op::Binary(b), &[&[2, 3, 5], &[3, 1]], &[], &[2, 3, 5], 1e-6);
        check(Op::Binary(b), &[&[5], &[2, 3, 5]], &[], &[2, 3, 5], 1e-6);
    }
    // Constants as the CPU stores them: rounded to f32, past its range infinite (a decimal
    // literal of 1e300 or of infinity would not compile into a shader).
    for value in [0.25, 0.1, 1e300, -1e39, f64::INFINITY, 1e-50] {
        check(Op::Constant { value }, &[], &[], &[], 0.0);
    }
    check_shifted(Op::Pow { exponent: 1e-50 }, &[&[3, 7]], &[], &[3, 7], 1e-6, 2.0);
    // Negative bases (the inputs are centred on 0): whole powers have values on the CPU, and
    // WGSL's `pow` is undefined there; 0⁰ is 1.
    for exponent in [0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 5.0] {
        check(Op::Pow { exponent }, &[&[3, 7]], &[], &[3, 7], 1e-5);
    }
    check(Op::BroadcastTo, &[&[3, 1]], &[], &[2, 3, 4], 0.0);
    check(Op::Arange, &[], &[], &[9], 0.0);
}

#[test]
fn movement_and_reductions_match_the_cpu() {
    check(Op::Permute { perm: vec![2, 0, 1] }, &[&[2, 3, 5]], &[], &[5, 2, 3], 0.0);
    check(Op::Reshape, &[&[2, 3, 5]], &[], &[6, 5], 0.0);
    check(Op::SumTo, &[&[2, 3, 5]], &[], &[3, 1], 1e-5);
    check(Op::SumTo, &[&[4, 3]], &[], &[3], 1e-5);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        check(Op::Reduce { op, axes: vec![1], keepdim: false }, &[&[2, 7, 3]], &[], &[2, 3], 1e-5);
        check(
            Op::Reduce { op, axes: vec![0, 2], keepdim: true },
            &[&[2, 7, 3]],
            &[],
            &[1, 7, 1],
            1e-5,
        );
    }
    for log in [false, true] {
        check(Op::Softmax { axis: 1, log }, &[&[3, 11, 2]], &[], &[3, 11, 2], 1e-5);
        check(
            Op::SoftmaxGrad { axis: 2, log },
            &[&[3, 2, 11], &[3, 2, 11]],
            &[],
            &[3, 2, 11],
            1e-5,
        );
    }
}

#[test]
fn softmax_rows_at_every_spread() {
    // Rows that share a workgroup (5, 128, 130 elements: 2 and 32 lanes, several rows a
    // workgroup, the last workgroup part full), rows held in registers up to 16 a lane (4,096)
    // and walked past it (4,097), along the last axis and an inner one.
    for log in [false, true] {
        for shape in [&[13, 5][..], &[13, 128], &[3, 130], &[2, 4096], &[2, 4097]] {
            check(Op::Softmax { axis: 1, log }, &[shape], &[], shape, 1e-5);
            check(Op::SoftmaxGrad { axis: 1, log }, &[shape, shape], &[], shape, 1e-5);
        }
        check(Op::Softmax { axis: 1, log }, &[&[3, 130, 5]], &[], &[3, 130, 5], 1e-5);
        check(
            Op::SoftmaxGrad { axis: 1, log },
            &[&[3, 130, 5], &[3, 130, 5]],
            &[],
            &[3, 130, 5],
            1e-5,
        );
    }
}

#[test]
fn rows_longer_than_a_workgroup_reduce_across_it() {
    // Rows of 1 and of 700–2,500 elements (past 256 invocations, not multiples of them), along
    // the last and an inner axis; reductions long enough to take one workgroup per output.
    for log in [false, true] {
        check(Op::Softmax { axis: 1, log }, &[&[2, 700]], &[], &[2, 700], 1e-5);
        check(Op::Softmax { axis: 0, log }, &[&[701, 3]], &[], &[701, 3], 1e-5);
        check(Op::Softmax { axis: 1, log }, &[&[3, 1]], &[], &[3, 1], 1e-5);
        check(Op::SoftmaxGrad { axis: 1, log }, &[&[2, 700], &[2, 700]], &[], &[2, 700], 1e-5);
        check(Op::SoftmaxGrad { axis: 0, log }, &[&[333, 2], &[333, 2]], &[], &[333, 2], 1e-5);
    }
    check(Op::SoftmaxCrossEntropy, &[&[3, 1030], &[3]], &[(1, 1030)], &[], 1e-5);
    check(Op::SoftmaxCrossEntropyGrad, &[&[3, 1030], &[3], &[]], &[(1, 1030)], &[3, 1030], 1e-5);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        check(Op::Reduce { op, axes: vec![0, 1], keepdim: false }, &[&[50, 61]], &[], &[], 1e-5);
        check(
            Op::Reduce { op, axes: vec![0, 2], keepdim: false },
            &[&[40, 3, 70]],
            &[],
            &[3],
            1e-5,
        );
        // A convolution bias's derivative: a workgroup per channel (84 elements each), or one
        // invocation per channel (32 each).
        let axes = vec![0, 2, 3];
        check(
            Op::Reduce { op, axes: axes.clone(), keepdim: false },
            &[&[2, 5, 6, 7]],
            &[],
            &[5],
            1e-5,
        );
        check(Op::Reduce { op, axes, keepdim: false }, &[&[2, 5, 4, 4]], &[], &[5], 1e-5);
    }
    check(Op::SumTo, &[&[2100, 3]], &[], &[3], 1e-5);
    check(Op::SumTo, &[&[4, 600, 5]], &[], &[1, 1, 5], 1e-5);
    // Column reductions (a bias's derivative): lanes split the rows of each column group.
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        check(Op::Reduce { op, axes: vec![0], keepdim: false }, &[&[1500, 37]], &[], &[37], 1e-5);
        let axes = vec![0, 1];
        check(Op::Reduce { op, axes, keepdim: true }, &[&[3, 70, 300]], &[], &[1, 1, 300], 1e-5);
    }
    check(Op::SumTo, &[&[1, 900, 1, 20]], &[], &[1, 20], 1e-5);
}

#[test]
fn matmul_and_cross_entropy_match_the_cpu() {
    check(Op::MatMul, &[&[5, 7], &[7, 3]], &[], &[5, 3], 1e-5);
    // 1-D operands (matrix-vector and vector-matrix products, with batches).
    check(Op::MatMul, &[&[5, 7], &[7]], &[], &[5], 1e-5);
    check(Op::MatMul, &[&[7], &[7, 3]], &[], &[3], 1e-5);
    check(Op::MatMul, &[&[2, 5, 7], &[7]], &[], &[2, 5], 1e-5);
    check(Op::MatMul, &[&[7], &[2, 7, 3]], &[], &[2, 3], 1e-5);
    check(Op::MatMul, &[&[2, 1, 5, 7], &[3, 7, 4]], &[], &[2, 3, 5, 4], 1e-5);
    check(Op::SoftmaxCrossEntropy, &[&[6, 10], &[6]], &[(1, 10)], &[], 1e-5);
    check(Op::SoftmaxCrossEntropyGrad, &[&[6, 10], &[6], &[]], &[(1, 10)], &[6, 10], 1e-5);
}
