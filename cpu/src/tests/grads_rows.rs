//! The derivatives of reductions, softmax, the loss and the normalizations against central
//! finite differences in f64.

use super::*;

#[test]
fn reduce_grads() {
    let x = Rng::new("reduce").t(&[3, 4, 5]);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for axes in [vec![1], vec![0, 2], vec![0, 1, 2], vec![]] {
            for keepdim in [false, true] {
                let out = reduced(&x.shape, &axes, keepdim);
                let fwd = Op::Reduce { op, axes: axes.clone(), keepdim };
                let back = Op::ReduceGrad { op, axes: axes.clone(), keepdim };
                check_op(
                    &format!("{op:?} {axes:?} {keepdim}"),
                    &fwd,
                    std::slice::from_ref(&x),
                    &out,
                    0,
                    &|xs, dy| {
                        let y = ev(&fwd, &[&xs[0]], &out);
                        ev(&back, &[&xs[0], &y, dy], &xs[0].shape)
                    },
                );
            }
        }
    }
}

#[test]
fn softmax_grads() {
    let x = Rng::new("softmax").tensor(&[3, 4, 5], -3.0, 3.0);
    for axis in 0..3 {
        for log in [false, true] {
            let op = Op::Softmax { axis, log };
            check_op(
                &format!("softmax {axis} {log}"),
                &op,
                std::slice::from_ref(&x),
                &[3, 4, 5],
                0,
                &|xs, dy| {
                    let y = ev(&op, &[&xs[0]], &[3, 4, 5]);
                    ev(&Op::SoftmaxGrad { axis, log }, &[&y, dy], &[3, 4, 5])
                },
            );
        }
    }
}

#[test]
fn cross_entropy_grad() {
    let mut rng = Rng::new("ce");
    for (logits, targets) in [
        (rng.tensor(&[4, 5], -3.0, 3.0), rng.index(&[4], 5)),
        (rng.t(&[2, 3, 4]), rng.index(&[2, 3], 4)),
        (rng.t(&[3]), Tensor::i32(vec![], vec![2])),
    ] {
        let t = targets.clone();
        let shape = logits.shape.clone();
        check_op(
            "cross_entropy",
            &Op::SoftmaxCrossEntropy,
            &[logits, targets],
            &[],
            0,
            &|xs, dy| ev(&Op::SoftmaxCrossEntropyGrad, &[&xs[0], &t, dy], &shape),
        );
    }
}

#[test]
fn layer_and_rms_norm_grads() {
    let mut rng = Rng::new("norms");
    for x_shape in [vec![3, 7], vec![2, 3, 5]] {
        let d = *x_shape.last().unwrap();
        for (has_weight, has_bias) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut inputs = vec![rng.t(&x_shape)];
            if has_weight {
                inputs.push(rng.tensor(&[d], 0.5, 1.5));
            }
            if has_bias {
                inputs.push(rng.t(&[d]));
            }
            let eps = 1e-5;
            check_norm(
                "layer_norm",
                &Op::LayerNorm { eps, has_weight, has_bias },
                &|part| Op::LayerNormGrad { eps, has_weight, has_bias, part },
                &inputs,
                &parts(has_weight, has_bias),
                &TRAIN,
            );
            if !has_bias {
                check_norm(
                    "rms_norm",
                    &Op::RmsNorm { eps, has_weight },
                    &|part| Op::RmsNormGrad { eps, has_weight, part },
                    &inputs,
                    &parts(has_weight, false),
                    &TRAIN,
                );
            }
        }
    }
}

#[test]
fn group_norm_grads() {
    let mut rng = Rng::new("group_norm");
    for (x_shape, groups) in
        [(vec![2, 6, 5], 3), (vec![2, 6, 5], 1), (vec![2, 4, 3, 3], 2), (vec![3, 4], 4)]
    {
        let c = x_shape[1];
        for (has_weight, has_bias) in [(false, false), (true, true)] {
            let mut inputs = vec![rng.t(&x_shape)];
            if has_weight {
                inputs.push(rng.tensor(&[c], 0.5, 1.5));
                inputs.push(rng.t(&[c]));
            }
            let eps = 1e-5;
            check_norm(
                &format!("group_norm {x_shape:?}/{groups}"),
                &Op::GroupNorm { groups, eps, has_weight, has_bias },
                &|part| Op::GroupNormGrad { groups, eps, has_weight, has_bias, part },
                &inputs,
                &parts(has_weight, has_bias),
                &TRAIN,
            );
        }
    }
}

#[test]
fn batch_norm_grads_in_training_and_inference() {
    let mut rng = Rng::new("batch_norm");
    for x_shape in [vec![4, 3, 5], vec![6, 3], vec![2, 3, 2, 3]] {
        for (has_weight, has_bias) in [(false, false), (true, true), (true, false)] {
            let mut inputs = vec![rng.t(&x_shape), rng.t(&[3]), rng.tensor(&[3], 0.5, 2.0)];
            if has_weight {
                inputs.push(rng.tensor(&[3], 0.5, 1.5));
            }
            if has_bias {
                inputs.push(rng.t(&[3]));
            }
            let eps = 1e-5;
            let fwd = Op::BatchNorm { eps, momentum: 0.1, has_weight, has_bias };
            // Parts in input order, skipping the running statistics (never differentiated).
            let ps = parts(has_weight, has_bias);
            for (ctx, training) in [(&TRAIN, true), (&INFER, false)] {
                let shape = x_shape.clone();
                for (k, &part) in ps.iter().enumerate() {
                    let wrt = if k == 0 { 0 } else { 2 + k };
                    let g = Op::BatchNormGrad { eps, has_weight, has_bias, part, training };
                    let want = inputs[wrt].shape.clone();
                    check_op_ctx(
                        &format!("batch_norm {x_shape:?} {part:?} training={training}"),
                        &fwd,
                        &inputs,
                        &shape,
                        wrt,
                        ctx,
                        &|xs, dy| ev_ctx(&g, &with_dy(xs, dy), &want, ctx),
                    );
                }
            }
        }
    }
}
