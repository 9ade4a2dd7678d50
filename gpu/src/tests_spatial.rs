//! The padding and resampling kernels against the CPU backend: every pad mode with asymmetric
//! widths on several axes, and interpolation up and down by whole and fractional factors, with
//! and without `align_corners`, in 1-D and 2-D. Runs on the device `mgnc info` would use
//! (lavapipe in CI, where `MGN_REQUIRE_GPU=1`).

use super::test_util::{check_on_both, values};
use mgn_ir::op::{InterpMode, Op, PadMode};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

fn input(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed * 977 + 5))
}

fn check(op: Op, given: &[Tensor], out_shape: &[usize], tol: f64) {
    check_on_both(&op, given, DType::F32, out_shape, tol);
}

#[test]
fn padding_and_its_derivative_match_the_cpu() {
    let cases: [(&[usize], &[[usize; 2]]); 4] = [
        (&[2, 3, 7], &[[0, 0], [0, 0], [2, 0]]),
        (&[2, 3, 5, 6], &[[0, 0], [0, 0], [1, 3], [4, 2]]),
        (&[3, 4], &[[2, 1], [0, 3]]),
        (&[1, 2, 4, 4], &[[0, 0], [1, 1], [3, 3], [0, 1]]),
    ];
    for (shape, widths) in cases {
        let out: Vec<usize> = shape.iter().zip(widths).map(|(n, [b, e])| n + b + e).collect();
        for mode in [PadMode::Constant, PadMode::Reflect, PadMode::Replicate] {
            let w = widths.to_vec();
            check(Op::Pad { widths: w.clone(), mode, value: -0.75 }, &[input(shape, 1)], &out, 0.0);
            check(Op::PadGrad { widths: w, mode }, &[input(&out, 2)], shape, 1e-6);
        }
    }
    // A value past f32's range fills with infinity, as the CPU stores it.
    let huge = Op::Pad { widths: vec![[1, 2]], mode: PadMode::Constant, value: 1e39 };
    check(huge, &[input(&[4], 6)], &[7], 0.0);
    // Replicating a size-1 axis: every padded element reads the one element.
    let w = vec![[0, 0], [3, 2]];
    check(Op::PadGrad { widths: w, mode: PadMode::Replicate }, &[input(&[2, 6], 3)], &[2, 1], 1e-6);
}

#[test]
fn interpolation_and_its_derivative_match_the_cpu() {
    type Case = (Vec<usize>, InterpMode, Vec<usize>, Option<Vec<f64>>, bool);
    let cases: Vec<Case> = vec![
        (vec![2, 3, 5, 7], InterpMode::Nearest, vec![3, 11], None, false),
        (vec![1, 2, 4, 3], InterpMode::Nearest, vec![6, 7], Some(vec![1.5, 2.5]), false),
        (vec![1, 2, 3, 3], InterpMode::Nearest, vec![3, 6], Some(vec![1.2, 2.0]), false),
        (vec![2, 3, 13], InterpMode::Nearest, vec![5], None, false),
        (vec![2, 2, 4, 5], InterpMode::Linear, vec![9, 3], None, false),
        (vec![1, 3, 6, 4], InterpMode::Linear, vec![15, 10], Some(vec![2.5, 2.5]), false),
        (vec![1, 2, 5, 4], InterpMode::Linear, vec![9, 7], None, true),
        (vec![1, 2, 3, 4], InterpMode::Linear, vec![1, 4], None, true),
        (vec![2, 3, 7], InterpMode::Linear, vec![16], None, false),
        (vec![2, 3, 16], InterpMode::Linear, vec![5], None, true),
        (vec![1, 1, 40, 3], InterpMode::Linear, vec![7, 3], None, false),
    ];
    for (x, mode, size, scale, align_corners) in cases {
        let out: Vec<usize> = x[..2].iter().chain(&size).copied().collect();
        let fwd = Op::Interpolate { mode, size: size.clone(), scale: scale.clone(), align_corners };
        let back = Op::InterpolateGrad { mode, size, scale, align_corners };
        check(fwd, &[input(&x, 4)], &out, 1e-6);
        check(back, &[input(&out, 5)], &x, 1e-5);
    }
}
