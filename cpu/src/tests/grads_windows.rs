//! The derivatives of convolution, pooling, upsampling, attention and rotary embeddings
//! against central finite differences in f64.

use super::*;

#[test]
fn conv_grads() {
    for c in conv_cases() {
        let mut rng = Rng::new("conv");
        let inputs = [rng.t(&c.x), rng.t(&c.w), rng.t(&[c.w[0]])];
        let (out, name) = (c.out_shape(), format!("conv x={:?} w={:?}", c.x, c.w));
        let op = c.op(true);
        check_op(&name, &op, &inputs, &out, 0, &|xs, dy| ev(&c.grad_input(), &[dy, &xs[1]], &c.x));
        check_op(&name, &op, &inputs, &out, 1, &|xs, dy| ev(&c.grad_weight(), &[&xs[0], dy], &c.w));
        // The bias gradient is a sum of dy over the batch and spatial axes.
        let axes: Vec<usize> = std::iter::once(0).chain(2..out.len()).collect();
        check_op(&name, &op, &inputs, &out, 2, &|_, dy| {
            ev(
                &Op::Reduce { op: ReduceOp::Sum, axes: axes.clone(), keepdim: false },
                &[dy],
                &[c.w[0]],
            )
        });
    }
}

#[test]
fn pool_grads() {
    let mut rng = Rng::new("pool");
    let x = rng.t(&[2, 3, 7, 6]);
    let cases: [(&[usize], &[usize], &[usize]); 4] = [
        (&[3, 2], &[2, 2], &[1, 1]),
        (&[2, 2], &[2, 2], &[0, 0]),
        (&[3, 3], &[1, 1], &[1, 1]),
        (&[2, 3], &[3, 1], &[1, 0]),
    ];
    for (kernel, stride, padding) in cases {
        let out: Vec<usize> = [2, 3]
            .into_iter()
            .chain((0..2).map(|a| (x.shape[2 + a] + 2 * padding[a] - kernel[a]) / stride[a] + 1))
            .collect();
        for op in [PoolOp::Max, PoolOp::Avg] {
            let (kernel, stride, padding) = (kernel.to_vec(), stride.to_vec(), padding.to_vec());
            let fwd = Op::Pool {
                op,
                kernel: kernel.clone(),
                stride: stride.clone(),
                padding: padding.clone(),
            };
            let back = Op::PoolGrad { op, kernel, stride, padding };
            check_op(
                &format!("{op:?} pool"),
                &fwd,
                std::slice::from_ref(&x),
                &out,
                0,
                &|xs, dy| ev(&back, &[&xs[0], dy], &xs[0].shape),
            );
        }
    }
}

#[test]
fn upsample_grads() {
    let mut rng = Rng::new("upsample");
    for (shape, scale, out) in
        [(vec![2, 3, 4], 3, vec![2, 3, 12]), (vec![1, 2, 3, 2], 2, vec![1, 2, 6, 4])]
    {
        let x = rng.t(&shape);
        check_op("upsample", &Op::Upsample { scale }, &[x], &out, 0, &|_, dy| {
            ev(&Op::UpsampleGrad { scale }, &[dy], &shape)
        });
    }
}

#[test]
fn attention_grads_causal_gqa_mask() {
    let mut rng = Rng::new("attention");
    type Case = (Vec<usize>, Vec<usize>, Vec<usize>, Option<Vec<usize>>, bool);
    // (q, k, v, mask, causal)
    let cases: Vec<Case> = vec![
        (vec![2, 4, 3, 4], vec![2, 2, 5, 4], vec![2, 2, 5, 3], Some(vec![2, 1, 1, 5]), true),
        (vec![1, 2, 4, 3], vec![1, 2, 4, 3], vec![1, 2, 4, 2], None, true),
        (vec![3, 2, 2], vec![1, 3, 2], vec![1, 3, 4], Some(vec![2, 3]), false),
        (vec![1, 2, 5, 2], vec![1, 1, 3, 2], vec![1, 1, 3, 2], None, true),
        // A bias of every score (T5's relative positions, a learned table gathered per pair).
        (vec![1, 2, 3, 4], vec![1, 2, 3, 4], vec![1, 2, 3, 2], Some(vec![1, 2, 3, 3]), false),
    ];
    for (sq, sk, sv, mask, causal) in cases {
        let mut inputs = vec![rng.t(&sq), rng.t(&sk), rng.t(&sv)];
        if let Some(m) = &mask {
            inputs.push(rng.tensor(m, -2.0, 0.0));
        }
        let has_mask = mask.is_some();
        let scale = 0.7;
        let mut out = sq.clone();
        *out.last_mut().unwrap() = *sv.last().unwrap();
        let fwd = Op::Attention { causal, scale, has_mask };
        for (wrt, part) in [(0, GradPart::Q), (1, GradPart::K), (2, GradPart::V)] {
            let want = inputs[wrt].shape.clone();
            check_op(
                &format!("attention q={sq:?} k={sk:?} {part:?}"),
                &fwd,
                &inputs,
                &out,
                wrt,
                &|xs, dy| {
                    ev(
                        &Op::AttentionGrad { causal, scale, has_mask, part },
                        &with_dy(xs, dy),
                        &want,
                    )
                },
            );
        }
        // A learned mask (a bias table): its derivative is dS in the scores' shape, summed
        // down to the mask's own (it broadcasts over batch items and heads here).
        if let Some(m) = &mask {
            let mut scores = sq.clone();
            *scores.last_mut().unwrap() = sk[sk.len() - 2];
            check_op(
                &format!("attention q={sq:?} k={sk:?} mask={m:?}"),
                &fwd,
                &inputs,
                &out,
                3,
                &|xs, dy| {
                    let part = GradPart::Mask;
                    let op = Op::AttentionGrad { causal, scale, has_mask, part };
                    let ds = ev(&op, &with_dy(xs, dy), &scores);
                    ev(&Op::SumTo, &[&ds], m)
                },
            );
        }
    }
}

#[test]
fn rope_inverse_is_its_derivative() {
    let x = Rng::new("rope").t(&[2, 5, 6]);
    check_op(
        "rope",
        &Op::Rope { theta: 100.0, offset: 3, inverse: false },
        &[x],
        &[2, 5, 6],
        0,
        &|_, dy| ev(&Op::Rope { theta: 100.0, offset: 3, inverse: true }, &[dy], &[2, 5, 6]),
    );
}
