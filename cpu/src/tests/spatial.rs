//! Padding and resampling: hand values (PyTorch's) and the derivatives against central
//! finite differences in f64.

use super::*;
use mgn_ir::op::{InterpMode, PadMode};

fn pad_op(widths: &[[usize; 2]], mode: PadMode, value: f64) -> Op {
    Op::Pad { widths: widths.to_vec(), mode, value }
}

#[test]
fn pad_hand_values() {
    let x = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let w = [[0, 1], [2, 1]];
    let c = ev(&pad_op(&w, PadMode::Constant, -1.0), &[&x], &[3, 6]);
    let m = -1.0;
    let want = [m, m, 1.0, 2.0, 3.0, m, m, m, 4.0, 5.0, 6.0, m, m, m, m, m, m, m];
    assert_close(&f64s(&c), &want, 0.0, "constant");
    let r = ev(&pad_op(&[[0, 0], [2, 2]], PadMode::Reflect, 0.0), &[&x], &[2, 7]);
    let want = [3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0, 6.0, 5.0, 4.0, 5.0, 6.0, 5.0, 4.0];
    assert_close(&f64s(&r), &want, 0.0, "reflect");
    let e = ev(&pad_op(&[[1, 0], [0, 2]], PadMode::Replicate, 0.0), &[&x], &[3, 5]);
    let want = [1.0, 2.0, 3.0, 3.0, 3.0, 1.0, 2.0, 3.0, 3.0, 3.0, 4.0, 5.0, 6.0, 6.0, 6.0];
    assert_close(&f64s(&e), &want, 0.0, "replicate");
}

#[test]
fn pad_grads_in_every_mode() {
    let x = Rng::new("pad").t(&[2, 3, 4]);
    for mode in [PadMode::Constant, PadMode::Reflect, PadMode::Replicate] {
        let widths = [[0, 1], [2, 1], [3, 2]];
        let out = [3, 6, 9];
        check_op(
            &format!("pad {mode:?}"),
            &pad_op(&widths, mode, 0.5),
            std::slice::from_ref(&x),
            &out,
            0,
            &|_, dy| ev(&Op::PadGrad { widths: widths.to_vec(), mode }, &[dy], &[2, 3, 4]),
        );
    }
    // The constant pad's derivative as autodiff makes it: one slice per padded axis.
    let widths = [[0, 0], [2, 1], [0, 3]];
    check_op(
        "pad slices",
        &pad_op(&widths, PadMode::Constant, 0.0),
        &[x],
        &[2, 6, 7],
        0,
        &|_, dy| {
            let s = ev(&Op::Slice { axis: 1, start: 2, end: 5 }, &[dy], &[2, 3, 7]);
            ev(&Op::Slice { axis: 2, start: 0, end: 4 }, &[&s], &[2, 3, 4])
        },
    );
}

fn interp(mode: InterpMode, size: &[usize], scale: Option<Vec<f64>>, align_corners: bool) -> Op {
    Op::Interpolate { mode, size: size.to_vec(), scale, align_corners }
}

fn interp_grad(op: &Op) -> Op {
    let Op::Interpolate { mode, size, scale, align_corners } = op.clone() else { unreachable!() };
    Op::InterpolateGrad { mode, size, scale, align_corners }
}

/// PyTorch 2.x's `F.interpolate` on the same inputs.
#[test]
fn interpolate_hand_values() {
    let x = Tensor::f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
    let y = ev(&interp(InterpMode::Linear, &[3, 3], None, false), &[&x], &[1, 1, 3, 3]);
    assert_close(&f64s(&y), &[1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 3.5, 4.0], 1e-7, "bilinear");
    let y = ev(&interp(InterpMode::Linear, &[3, 4], None, true), &[&x], &[1, 1, 3, 4]);
    let third = 1.0 / 3.0;
    let row = |a: f64| [a, a + third, a + 2.0 * third, a + 1.0];
    let want: Vec<f64> = [row(1.0), row(2.0), row(3.0)].concat();
    assert_close(&f64s(&y), &want, 1e-6, "bilinear, align_corners");
    let s = Tensor::f32(vec![1, 1, 3], vec![1.0, 2.0, 3.0]);
    let y = ev(&interp(InterpMode::Nearest, &[4], Some(vec![1.5]), false), &[&s], &[1, 1, 4]);
    assert_close(&f64s(&y), &[1.0, 1.0, 2.0, 3.0], 0.0, "nearest, scale 1.5");
    let l = Tensor::f32(vec![1, 1, 5], vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    let y = ev(&interp(InterpMode::Nearest, &[2], Some(vec![0.5]), false), &[&l], &[1, 1, 2]);
    assert_close(&f64s(&y), &[1.0, 3.0], 0.0, "nearest, scale 0.5");
    let y = ev(&interp(InterpMode::Linear, &[3], None, false), &[&l], &[1, 1, 3]);
    // ratio 5/3: sources 1/3, 2, 11/3.
    assert_close(&f64s(&y), &[1.0 + third, 3.0, 4.0 + 2.0 * third], 1e-6, "linear 5 -> 3");
}

#[test]
fn interpolate_grads() {
    let mut rng = Rng::new("interpolate");
    let cases: Vec<(Vec<usize>, Op)> = vec![
        (vec![2, 3, 4, 5], interp(InterpMode::Nearest, &[7, 3], None, false)),
        (vec![1, 2, 3, 4], interp(InterpMode::Nearest, &[4, 6], Some(vec![1.5, 1.5]), false)),
        (vec![2, 2, 4, 3], interp(InterpMode::Linear, &[7, 5], None, false)),
        (vec![1, 2, 5, 4], interp(InterpMode::Linear, &[3, 9], None, true)),
        (vec![1, 3, 4, 4], interp(InterpMode::Linear, &[10, 6], Some(vec![2.5, 1.6]), false)),
        (vec![2, 3, 7], interp(InterpMode::Linear, &[4], None, false)),
        (vec![2, 3, 7], interp(InterpMode::Nearest, &[16], None, false)),
    ];
    for (shape, op) in cases {
        let x = rng.t(&shape);
        let Op::Interpolate { size, .. } = &op else { unreachable!() };
        let out: Vec<usize> = shape[..2].iter().chain(size).copied().collect();
        let back = interp_grad(&op);
        check_op(&op.describe(), &op, &[x], &out, 0, &|_, dy| ev(&back, &[dy], &shape));
    }
}

/// `conv_transpose1d` is the convolution's input derivative (`ConvGradInput` over `[x, w]`):
/// PyTorch's `F.conv_transpose1d([1, 2], [1, 1, 1], stride = 2, padding = 1,
/// output_padding = 1)` is `[1, 3, 2, 2]`, the full `[1, 1, 3, 2, 2]` cropped by the padding
/// before and extended by the output padding after.
#[test]
fn transposed_convolution_hand_values() {
    let x = Tensor::f32(vec![1, 1, 2], vec![1.0, 2.0]);
    let w = Tensor::f32(vec![1, 1, 3], vec![1.0, 1.0, 1.0]);
    let op = |padding| Op::ConvGradInput {
        stride: vec![2],
        padding: vec![padding],
        dilation: vec![1],
        groups: 1,
    };
    let full = ev(&op(0), &[&x, &w], &[1, 1, 5]);
    assert_close(&f64s(&full), &[1.0, 1.0, 3.0, 2.0, 2.0], 0.0, "full");
    let cropped = ev(&op(1), &[&x, &w], &[1, 1, 4]);
    assert_close(&f64s(&cropped), &[1.0, 3.0, 2.0, 2.0], 0.0, "padding 1, output_padding 1");
}
