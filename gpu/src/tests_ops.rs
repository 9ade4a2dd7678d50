//! Comparisons, selection, maximum and minimum, the added point-wise functions, scans and
//! top-k on the GPU against the CPU reference, with broadcasting, ties and integer operands.

use crate::test_util::{check_on_both, run_on_cpu, run_on_gpu, values};
use mgn_ir::op::{BinaryOp, CompareOp, Op, UnaryOp};
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;

/// Floats in [-1, 1) on a coarse grid (steps of 0.25), so that two operands tie often.
fn coarse(shape: &[usize], seed: u32) -> Tensor {
    let n = shape.iter().product();
    let v = values(n, seed).into_iter().map(|x| (x * 4.0).round() / 4.0).collect();
    Tensor::f32(shape.to_vec(), v)
}

fn ints(shape: &[usize], seed: i32, hi: i32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::i32(shape.to_vec(), (0..n as i32).map(|i| (i * 7 + seed) % hi - hi / 2).collect())
}

fn mask(shape: &[usize], seed: u32) -> Tensor {
    let t = coarse(shape, seed);
    let bits = t.to_f64_vec().iter().map(|&x| (x > 0.0) as i32).collect();
    Tensor { dtype: DType::Bool, shape: shape.to_vec(), data: Data::I32(bits) }
}

#[test]
fn comparisons_match_the_cpu() {
    for c in CompareOp::ALL {
        let op = Op::Compare(c);
        let (a, b) = (coarse(&[2, 3, 5], 1), coarse(&[3, 1], 2));
        check_on_both(&op, &[a, b], DType::Bool, &[2, 3, 5], 0.0);
        let (a, b) = (ints(&[4, 1], 3, 5), ints(&[6], 1, 5));
        check_on_both(&op, &[a, b], DType::Bool, &[4, 6], 0.0);
    }
}

#[test]
fn where_maximum_and_minimum_match_the_cpu() {
    let (c, a, b) = (mask(&[2, 1, 5], 3), coarse(&[3, 5], 4), coarse(&[], 5));
    check_on_both(&Op::Where, &[c, a, b], DType::F32, &[2, 3, 5], 0.0);
    let (c, a, b) = (mask(&[7], 6), ints(&[2, 7], 2, 9), ints(&[2, 1], 5, 9));
    check_on_both(&Op::Where, &[c, a, b], DType::I32, &[2, 7], 0.0);
    for op in [BinaryOp::Maximum, BinaryOp::Minimum] {
        let (a, b) = (coarse(&[4, 6], 7), coarse(&[6], 8));
        check_on_both(&Op::Binary(op), &[a, b], DType::F32, &[4, 6], 0.0);
        let (a, b) = (ints(&[4, 6], 1, 11), ints(&[4, 1], 4, 11));
        check_on_both(&Op::Binary(op), &[a, b], DType::I32, &[4, 6], 0.0);
        // `&&` and `||` are these on masks.
        let (a, b) = (mask(&[3, 4], 9), mask(&[4], 10));
        check_on_both(&Op::Binary(op), &[a, b], DType::Bool, &[3, 4], 0.0);
    }
}

#[test]
fn casts_to_and_from_bool_match_the_cpu() {
    // Zeros and fractions: a float is true when non-zero (not when it truncates to non-zero).
    let x = Tensor::f32(vec![6], vec![0.0, 0.25, -0.5, 2.0, -0.0, 1.0]);
    check_on_both(&Op::Cast, &[x], DType::Bool, &[6], 0.0);
    check_on_both(&Op::Cast, &[ints(&[9], 2, 5)], DType::Bool, &[9], 0.0);
    check_on_both(&Op::Cast, &[mask(&[3, 4], 1)], DType::F32, &[3, 4], 0.0);
    check_on_both(&Op::Cast, &[mask(&[3, 4], 2)], DType::I32, &[3, 4], 0.0);
}

/// `op` on the GPU against the CPU, element by element within `tol` of the CPU's value
/// *relative to it* (plus 1e-30 for exact zeros): tiny arguments must keep their digits.
fn check_relative(op: Op, x: &[f32], tol: f64) {
    let n = x.len();
    let inputs = [Tensor::f32(vec![n], x.to_vec())];
    let Some(got) = run_on_gpu(&op, &inputs, DType::F32, &[n]) else { return };
    let want = run_on_cpu(&op, &[&inputs[0]], DType::F32, &[n]);
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let err = (g - w).abs() / (w.abs() + 1e-30);
        assert!(g == &w || err <= tol, "{}({}): gpu {g}, cpu {w}", op.describe(), x[i]);
    }
}

/// Arguments from 1e-7 up to `hi` in magnitude, both signs, and zero.
fn spread(hi: f32) -> Vec<f32> {
    let mut v = vec![0.0];
    let mut a = 1e-7f32;
    while a < hi {
        v.extend([a, -a, a * 3.7, -a * 3.7]);
        a *= 10.0;
    }
    v.extend([hi, -hi, 0.49, -0.49, 0.51, -0.51]);
    v
}

#[test]
fn erf_log1p_expm1_and_softplus_keep_relative_precision() {
    check_relative(Op::Unary(UnaryOp::Erf), &spread(5.0), 2e-6);
    let log1p: Vec<f32> = spread(1e4).into_iter().filter(|&x| x > -0.99).collect();
    check_relative(Op::Unary(UnaryOp::Log1p), &log1p, 2e-6);
    check_relative(Op::Unary(UnaryOp::Expm1), &spread(20.0), 4e-6);
    // softplus: e^x for very negative x (down to 1e-39, a subnormal result), x for large x.
    let mut soft = spread(80.0);
    soft.extend([-89.0, -100.0, 1e30, -1e30]);
    check_relative(Op::Unary(UnaryOp::Softplus), &soft, 4e-6);
    for u in [UnaryOp::Erf, UnaryOp::Log1p, UnaryOp::Expm1, UnaryOp::Softplus] {
        let x = Tensor::f32(vec![3, 7], values(21, 11));
        let dy = Tensor::f32(vec![3, 7], values(21, 12));
        check_on_both(&Op::UnaryGrad(u), &[x, dy], DType::F32, &[3, 7], 1e-5);
    }
}

/// Sums, maxima and minima of integer tensors (counts of one-hot labels or of cast masks),
/// over short and long axes, leading ones included.
#[test]
fn integer_reductions_match_the_cpu() {
    use mgn_ir::op::ReduceOp;
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let red = |axes: Vec<usize>, keepdim| Op::Reduce { op, axes, keepdim };
        check_on_both(&red(vec![0, 1], false), &[ints(&[50, 61], 3, 1000)], DType::I32, &[], 0.0);
        check_on_both(&red(vec![0], false), &[ints(&[1500, 37], 1, 9)], DType::I32, &[37], 0.0);
        check_on_both(&red(vec![1], true), &[ints(&[3, 700], 5, 77)], DType::I32, &[3, 1], 0.0);
    }
}

#[test]
fn cumsum_matches_the_cpu_on_short_and_long_rows() {
    for reverse in [false, true] {
        let op = |axis| Op::Cumsum { axis, reverse };
        // Short rows (one invocation each) and rows past a workgroup, along the last and an
        // inner axis, floats and integers.
        check_on_both(&op(1), &[coarse(&[3, 7], 1)], DType::F32, &[3, 7], 1e-5);
        check_on_both(&op(1), &[coarse(&[2, 700, 3], 2)], DType::F32, &[2, 700, 3], 1e-4);
        check_on_both(&op(0), &[coarse(&[2100], 3)], DType::F32, &[2100], 1e-4);
        check_on_both(&op(0), &[ints(&[1000, 2], 3, 50)], DType::I32, &[1000, 2], 0.0);
        check_on_both(&op(1), &[ints(&[5, 9], 1, 7)], DType::I32, &[5, 9], 0.0);
    }
}

#[test]
fn topk_and_take_along_match_the_cpu() {
    let top = |k, axis| Op::TopK { k, axis };
    // Coarse values tie often: ties must go to the lower position on both.
    check_on_both(&top(3, 1), &[coarse(&[4, 9], 1)], DType::I32, &[4, 3], 0.0);
    check_on_both(&top(2, 0), &[coarse(&[9, 5], 2)], DType::I32, &[2, 5], 0.0);
    check_on_both(&top(5, 1), &[coarse(&[2, 1000], 3)], DType::I32, &[2, 5], 0.0);
    check_on_both(&top(4, 0), &[ints(&[700, 3], 4, 40)], DType::I32, &[4, 3], 0.0);
    let mut odd = coarse(&[2, 300], 5);
    if let Data::F32(v) = &mut odd.data {
        (v[7], v[400], v[401], v[402]) = (f32::NAN, -0.0, 0.0, f32::NAN);
    }
    check_on_both(&top(6, 1), &[odd], DType::I32, &[2, 6], 0.0);
    let index = Tensor::i32(vec![2, 3, 4], (0..24).map(|i| (i * 5 + 1) % 7).collect());
    let x = coarse(&[2, 7, 4], 6);
    check_on_both(&Op::TakeAlong { axis: 1 }, &[x, index.clone()], DType::F32, &[2, 3, 4], 0.0);
    let dy = coarse(&[2, 3, 4], 7);
    let grad = Op::TakeAlongGrad { axis: 1 };
    check_on_both(&grad, &[index, dy], DType::F32, &[2, 7, 4], 1e-6);
}
