//! The GPU norm kernels (and their derivatives) against the CPU backend, with and without
//! weight and bias, on small odd shapes. Runs like `tests.rs`: skipped without a device unless
//! `MGN_REQUIRE_GPU=1`.

use super::test_util::{check_on_both, values};
use crate::program::GpuOp;
use mgn_ir::op::{GradPart, Op};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

/// Runs `op` on float inputs of the given shapes (each with `shift` added) on the GPU and the
/// CPU, and compares.
fn check(op: impl Into<GpuOp>, inputs: &[(&[usize], f32)], out_shape: &[usize], tol: f64) {
    let tensors: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(k, (s, shift))| {
            Tensor::f32(
                s.to_vec(),
                values(s.iter().product(), k as u32 * 977 + 5)
                    .into_iter()
                    .map(|v| v + shift)
                    .collect(),
            )
        })
        .collect();
    check_on_both(&op.into(), &tensors, DType::F32, out_shape, tol);
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
fn norm_inputs<'a>(
    x: &'a [usize],
    p: &'a [usize],
    has_weight: bool,
    has_bias: bool,
    grad: bool,
) -> Vec<(&'a [usize], f32)> {
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
            check(
                Op::LayerNorm { eps: 1e-5, has_weight: w, has_bias: b },
                &norm_inputs(x, &p, w, b, false),
                x,
                1e-4,
            );
            for part in parts {
                check(
                    Op::LayerNormGrad { eps: 1e-5, has_weight: w, has_bias: b, part },
                    &norm_inputs(x, &p, w, b, true),
                    out_of(part, x, &p),
                    2e-4,
                );
            }
        }
    }
}

#[test]
fn rms_norm_and_its_derivatives_match_the_cpu() {
    for x in [&[3usize, 7][..], &[2, 3, 13], &[5]] {
        let p = [*x.last().unwrap()];
        for (w, _, parts) in affines().into_iter().filter(|a| !a.1) {
            check(
                Op::RmsNorm { eps: 1e-6, has_weight: w },
                &norm_inputs(x, &p, w, false, false),
                x,
                1e-4,
            );
            for part in parts {
                check(
                    Op::RmsNormGrad { eps: 1e-6, has_weight: w, part },
                    &norm_inputs(x, &p, w, false, true),
                    out_of(part, x, &p),
                    2e-4,
                );
            }
        }
    }
}

/// Group norm forward and every derivative its affine parameters allow, on `x` in `groups`.
fn check_group_norm(x: &[usize], groups: usize) {
    let p = [x[1]];
    for (w, b, parts) in affines() {
        check(
            Op::GroupNorm { groups, eps: 1e-5, has_weight: w, has_bias: b },
            &norm_inputs(x, &p, w, b, false),
            x,
            1e-4,
        );
        for part in parts {
            check(
                Op::GroupNormGrad { groups, eps: 1e-5, has_weight: w, has_bias: b, part },
                &norm_inputs(x, &p, w, b, true),
                out_of(part, x, &p),
                2e-4,
            );
        }
    }
}

#[test]
fn group_norm_and_its_derivatives_match_the_cpu() {
    for (x, groups) in [(&[2usize, 6, 5][..], 3), (&[3, 4, 3, 5], 2), (&[2, 5], 5), (&[2, 6, 7], 1)]
    {
        check_group_norm(x, groups);
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
                    check(
                        Op::BatchNormGrad { eps: 1e-5, has_weight: w, has_bias: b, part, training },
                        &inputs,
                        out_of(part, x, &p),
                        2e-4,
                    );
                }
            }
        }
    }
}

// Shapes for the workgroup-per-row kernels: rows longer than the width (and than 16 KiB of
// floats), rows of one element, rows that do not fill a workgroup, more rows than row lanes
// for the column-block parameter derivatives, and columns that do not fill a block.

/// Every output and derivative of layer norm (`center`) or RMS norm on `x`, with the input
/// shifted by `shift` (a large mean tests the two-pass statistics).
fn last_axis_all(x: &[usize], center: bool, shift: f32) {
    let p = [*x.last().unwrap()];
    for (w, b, parts) in affines().into_iter().filter(|a| center || !a.1) {
        let mut inputs = norm_inputs(x, &p, w, b, false);
        inputs[0].1 = shift;
        let fwd = if center {
            Op::LayerNorm { eps: 1e-5, has_weight: w, has_bias: b }
        } else {
            Op::RmsNorm { eps: 1e-6, has_weight: w }
        };
        check(fwd, &inputs, x, 1e-4);
        let mut inputs = norm_inputs(x, &p, w, b, true);
        inputs[0].1 = shift;
        for part in parts {
            let op = if center {
                Op::LayerNormGrad { eps: 1e-5, has_weight: w, has_bias: b, part }
            } else {
                Op::RmsNormGrad { eps: 1e-6, has_weight: w, part }
            };
            check(op, &inputs, out_of(part, x, &p), 2e-4);
        }
    }
}

#[test]
fn layer_norm_on_long_short_and_many_rows() {
    for x in [
        &[2usize, 300][..],
        &[3, 1000],
        &[1, 5000],
        &[4, 1],
        &[1],
        &[300, 7],
        &[40, 70],
        &[3, 17, 33],
        &[257, 1],
    ] {
        last_axis_all(x, true, 0.0);
    }
    last_axis_all(&[5, 300], true, 40.0);
}

#[test]
fn rms_norm_on_long_short_and_many_rows() {
    for x in [
        &[2usize, 300][..],
        &[3, 1000],
        &[1, 5000],
        &[4, 1],
        &[1],
        &[300, 7],
        &[40, 70],
        &[3, 17, 33],
    ] {
        last_axis_all(x, false, 0.0);
    }
}

#[test]
fn group_norm_on_long_and_odd_groups() {
    // (x, groups): blocks longer than the width, 3 and 5 channels per group, blocks of one
    // element, one group, many samples.
    for (x, groups) in [
        (&[2usize, 6, 300][..], 3),
        (&[2, 9, 5, 7], 3),
        (&[3, 10, 7], 2),
        (&[2, 4, 1], 4),
        (&[1, 3, 1000], 1),
        (&[70, 6, 3], 2),
    ] {
        check_group_norm(x, groups);
    }
}

#[test]
fn batch_norm_on_large_channels_and_odd_shapes() {
    // More than 4096 values per channel, an odd spatial size, one channel, spatial size 1, and
    // a large mean for the two-pass statistics.
    for (x, shift) in [
        (&[8usize, 3, 700][..], 0.0),
        (&[4, 2, 33, 35], 0.0),
        (&[7, 1], 0.0),
        (&[3, 5, 1, 1], 0.0),
        (&[300, 4], 0.0),
        (&[5, 3, 301], 30.0),
    ] {
        let p = [x[1]];
        for training in [true, false] {
            for (w, b, parts) in affines() {
                let mut fwd: Vec<(&[usize], f32)> = vec![(x, shift), (&p, 0.0), (&p, 1.5)];
                fwd.extend(norm_inputs(x, &p, w, b, false).into_iter().skip(1));
                if training {
                    // The one-op test plans are training plans: the forward with batch statistics.
                    check(
                        Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: w, has_bias: b },
                        &fwd,
                        x,
                        1e-4,
                    );
                }
                let mut inputs: Vec<(&[usize], f32)> = vec![(x, shift), (&p, 0.0), (&p, 1.5)];
                inputs.extend(norm_inputs(x, &p, w, b, true).into_iter().skip(1));
                for part in parts {
                    check(
                        Op::BatchNormGrad { eps: 1e-5, has_weight: w, has_bias: b, part, training },
                        &inputs,
                        out_of(part, x, &p),
                        2e-4,
                    );
                }
            }
        }
    }
}

/// The chunked weight derivative the GPU session splits layer and RMS norms' into
/// (`rewrite/norm_partials.rs`): rows narrower and wider than a workgroup, a short last chunk, one
/// chunk, and inputs far from zero mean.
#[test]
fn chunked_norm_weight_derivatives_match_the_cpu() {
    for center in [true, false] {
        for (x, chunk) in [
            (&[37usize, 70][..], 8usize),
            (&[3, 5, 300][..], 4),
            (&[6, 33][..], 8),
            (&[2, 9, 1][..], 5),
        ] {
            let rows = x.iter().product::<usize>() / x[x.len() - 1];
            let out = [rows.div_ceil(chunk), x[x.len() - 1]];
            check(
                GpuOp::NormWeightGradPartial { eps: 1e-5, center, chunk },
                &[(x, 2.5), (x, 0.0)],
                &out,
                1e-4,
            );
        }
    }
}
