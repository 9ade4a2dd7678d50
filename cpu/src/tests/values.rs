//! Forward values against hand-computed ones, PyTorch's, or direct formulas.

use super::*;

#[test]
fn softmax_rows_sum_to_one_and_match_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 0.0, f32::NEG_INFINITY, 0.0]);
    let y = f64s(&ev(&Op::Softmax { axis: 1, log: false }, &[&x], &[2, 3]));
    let e = [1f64.exp(), 2f64.exp(), 3f64.exp()];
    let s: f64 = e.iter().sum();
    assert_close(&y, &[e[0] / s, e[1] / s, e[2] / s, 0.5, 0.0, 0.5], 1e-6, "softmax");
    let ls = f64s(&ev(&Op::Softmax { axis: 1, log: true }, &[&x], &[2, 3]));
    assert_close(
        &ls[..3],
        &[(e[0] / s).ln(), (e[1] / s).ln(), (e[2] / s).ln()],
        1e-6,
        "log_softmax",
    );
    let big = Rng::new("rows").tensor(&[4, 6, 5], -20.0, 20.0);
    for axis in 0..3 {
        let y = ev(&Op::Softmax { axis, log: false }, &[&big], &[4, 6, 5]);
        let sums = f64s(&ev(
            &Op::Reduce { op: ReduceOp::Sum, axes: vec![axis], keepdim: false },
            &[&y],
            &reduced(&[4, 6, 5], &[axis], false),
        ));
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-12), "softmax axis {axis}: {sums:?}");
    }
}

#[test]
fn pointwise_values_match_pytorch() {
    let x = f32t(&[4], &[-1.0, 0.0, 1.0, 2.0]);
    let run = |u| f64s(&ev(&Op::Unary(u), &[&x], &[4]));
    assert_close(
        &run(UnaryOp::Gelu),
        &[-0.15865525393145707, 0.0, 0.8413447460685429, 1.9544997361036416],
        1e-6,
        "gelu",
    );
    assert_close(
        &run(UnaryOp::GeluTanh),
        &[-0.15880800939172324, 0.0, 0.8411919906082768, 1.9545976940871754],
        1e-6,
        "gelu_tanh",
    );
    assert_close(
        &run(UnaryOp::Silu),
        &[-0.2689414213699951, 0.0, 0.7310585786300049, 1.7615941559557646],
        1e-6,
        "silu",
    );
    assert_close(&run(UnaryOp::Relu), &[0.0, 0.0, 1.0, 2.0], 0.0, "relu");
    // PyTorch's choice at the kinks: relu'(0) = |x|'(0) = 0.
    let dy = f32t(&[4], &[1.0; 4]);
    assert_eq!(f64s(&ev(&Op::UnaryGrad(UnaryOp::Relu), &[&x, &dy], &[4])), [0.0, 0.0, 1.0, 1.0]);
    assert_eq!(f64s(&ev(&Op::UnaryGrad(UnaryOp::Abs), &[&x, &dy], &[4])), [-1.0, 0.0, 1.0, 1.0]);
    let p = f64s(&ev(&Op::Pow { exponent: 2.0 }, &[&x], &[4]));
    assert_eq!(p, [1.0, 0.0, 1.0, 4.0]);
}

#[test]
fn integer_arithmetic_wraps_and_floors() {
    let a = Tensor::i32(vec![4], vec![-7, 7, i32::MAX, 6]);
    let b = Tensor::i32(vec![4], vec![2, -2, 1, 3]);
    let bin = |op| eval(&Op::Binary(op), &[&a, &b], DType::I32, &[4], &TRAIN).unwrap().data;
    assert_eq!(bin(BinaryOp::Div), Data::I32(vec![-4, -4, i32::MAX, 2]));
    assert_eq!(bin(BinaryOp::Add), Data::I32(vec![-5, 5, i32::MIN, 9]));
    let zero = Tensor::i32(vec![], vec![0]);
    let e = eval(&Op::Binary(BinaryOp::Div), &[&a, &zero], DType::I32, &[4], &TRAIN).unwrap_err();
    assert!(e.0.contains("division by zero"), "{e}");
    let s = eval(
        &Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false },
        &[&b],
        DType::I32,
        &[],
        &TRAIN,
    )
    .unwrap();
    assert_eq!(s.data, Data::I32(vec![4]));
}

#[test]
fn reductions_match_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 5.0, 3.0, -2.0, 4.0, 4.0]);
    let r = |op, axes: Vec<usize>, keepdim, shape: &[usize]| {
        f64s(&ev(&Op::Reduce { op, axes, keepdim }, &[&x], shape))
    };
    assert_eq!(r(ReduceOp::Sum, vec![1], false, &[2]), [9.0, 6.0]);
    assert_eq!(r(ReduceOp::Mean, vec![0], true, &[1, 3]), [-0.5, 4.5, 3.5]);
    assert_eq!(r(ReduceOp::Max, vec![0, 1], false, &[]), [5.0]);
    assert_eq!(r(ReduceOp::Min, vec![1], true, &[2, 1]), [1.0, -2.0]);
    // The max gradient goes to the first of tied maxima only.
    let y = ev(&Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdim: false }, &[&x], &[2]);
    let dy = f32t(&[2], &[1.0, 10.0]);
    let dx = ev(
        &Op::ReduceGrad { op: ReduceOp::Max, axes: vec![1], keepdim: false },
        &[&x, &y, &dy],
        &[2, 3],
    );
    assert_eq!(f64s(&dx), [0.0, 1.0, 0.0, 0.0, 10.0, 0.0]);
    let am = eval(&Op::ArgMax { axis: 1 }, &[&x], DType::I32, &[2], &TRAIN).unwrap();
    assert_eq!(am.data, Data::I32(vec![1, 1]));
    let nan = f32t(&[3], &[1.0, f32::NAN, 2.0]);
    assert_eq!(
        eval(&Op::ArgMax { axis: 0 }, &[&nan], DType::I32, &[], &TRAIN).unwrap().data,
        Data::I32(vec![1])
    );
    assert!(f64s(&ev(
        &Op::Reduce { op: ReduceOp::Max, axes: vec![0], keepdim: false },
        &[&nan],
        &[]
    ))[0]
        .is_nan());
}

#[test]
fn sum_to_and_broadcast_to_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[1, 3])), [5.0, 7.0, 9.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[3])), [5.0, 7.0, 9.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[2, 1])), [6.0, 15.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[])), [21.0]);
    let col = f32t(&[2, 1], &[1.0, 2.0]);
    assert_eq!(f64s(&ev(&Op::BroadcastTo, &[&col], &[2, 2])), [1.0, 1.0, 2.0, 2.0]);
    assert!(eval(&Op::SumTo, &[&x], DType::F32, &[2, 2], &TRAIN).is_err());
}

#[test]
fn movement_hand_values() {
    let x = f32t(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(
        f64s(&ev(&Op::Permute { perm: vec![1, 0] }, &[&x], &[3, 2])),
        [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(
        f64s(&ev(&Op::Slice { axis: 1, start: 1, end: 3 }, &[&x], &[2, 2])),
        [1.0, 2.0, 4.0, 5.0]
    );
    let idx = Tensor::i32(vec![2, 2], vec![2, 0, 1, 1]);
    assert_eq!(
        f64s(&ev(&Op::Gather { axis: 1 }, &[&x, &idx], &[2, 2, 2])),
        [2.0, 0.0, 1.0, 1.0, 5.0, 3.0, 4.0, 4.0]
    );
    // Mixed storage joins as f64.
    let y = Tensor::f64(vec![1, 3], vec![6.0, 7.0, 8.0]);
    let j = ev(&Op::Concat { axis: 0 }, &[&x, &y], &[3, 3]);
    assert!(matches!(j.data, Data::F64(_)));
    assert_eq!(f64s(&j), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let ints = Tensor::i32(vec![3], vec![1, 2, 3]);
    let ar = eval(&Op::Arange, &[], DType::I32, &[4], &TRAIN).unwrap();
    assert_eq!(ar.data, Data::I32(vec![0, 1, 2, 3]));
    let both = eval(&Op::Concat { axis: 0 }, &[&ints, &ar], DType::I32, &[7], &TRAIN).unwrap();
    assert_eq!(both.data, Data::I32(vec![1, 2, 3, 0, 1, 2, 3]));
}

#[test]
fn casts_truncate_and_round() {
    let x = f32t(&[5], &[-1.7, 2.9, 0.0, 1.0 + 2f32.powi(-9), 1.0 + 3.0 * 2f32.powi(-9)]);
    assert_eq!(
        eval(&Op::Cast, &[&x], DType::I32, &[5], &TRAIN).unwrap().data,
        Data::I32(vec![-1, 2, 0, 1, 1])
    );
    assert_eq!(
        eval(&Op::Cast, &[&x], DType::Bool, &[5], &TRAIN).unwrap().data,
        Data::I32(vec![1, 1, 0, 1, 1])
    );
    // bf16 keeps 8 significant bits, ties to even: 1 + 2^-9 → 1, 1 + 3·2^-9 → 1 + 2^-7.
    let b = f64s(&eval(&Op::Cast, &[&x], DType::BF16, &[5], &TRAIN).unwrap());
    assert_eq!(b[3..], [1.0, 1.0 + 2f64.powi(-7)]);
    let h = f32t(&[3], &[1.0 + 2f32.powi(-12), 70000.0, 1e-8]);
    let hv = f64s(&eval(&Op::Cast, &[&h], DType::F16, &[3], &TRAIN).unwrap());
    assert_eq!(hv, [1.0, f64::INFINITY, 0.0]);
    let i = Tensor::i32(vec![2], vec![3, -4]);
    assert_eq!(f64s(&eval(&Op::Cast, &[&i], DType::F32, &[2], &TRAIN).unwrap()), [3.0, -4.0]);
}

#[test]
fn half_results_are_rounded_and_contractions_may_keep_f32() {
    // Operands exactly representable in f16; their product's sum is not.
    let third = 1.0 + 2f32.powi(-10);
    let a = Tensor { dtype: DType::F16, ..f32t(&[1, 2], &[third, third]) };
    let b = Tensor { dtype: DType::F16, ..f32t(&[2, 1], &[third, 1.0]) };
    let exact = third * third + third;
    let wide = f64s(&eval(&Op::MatMul, &[&a, &b], DType::F32, &[1, 1], &TRAIN).unwrap());
    assert_eq!(wide, [exact as f64], "f32 accumulation, kept");
    let narrow = f64s(&eval(&Op::MatMul, &[&a, &b], DType::F16, &[1, 1], &TRAIN).unwrap());
    let cast = Tensor { dtype: DType::F32, ..f32t(&[1], &[exact]) };
    let rounded = f64s(&eval(&Op::Cast, &[&cast], DType::F16, &[1], &TRAIN).unwrap());
    assert_eq!(narrow, rounded, "an f16 result holds an f16 value");
    assert_ne!(narrow, wide);
    // An element-wise op on bf16 rounds its result too.
    let x = Tensor { dtype: DType::BF16, ..f32t(&[1], &[1.0]) };
    let y = Tensor { dtype: DType::BF16, ..f32t(&[1], &[2f32.powi(-9)]) };
    let sum = eval(&Op::Binary(BinaryOp::Add), &[&x, &y], DType::BF16, &[1], &TRAIN).unwrap();
    assert_eq!(f64s(&sum), [1.0], "1 + 2^-9 rounds to 1 in bf16");
}

#[test]
fn conv_matches_the_direct_formula() {
    let mut cases = conv_cases();
    cases.push(ConvCase {
        x: vec![4, 8, 12, 12],
        w: vec![16, 4, 3, 3],
        stride: vec![1, 1],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        groups: 2,
    });
    for c in cases {
        let mut rng = Rng::new("conv fwd");
        let to32 =
            |t: Tensor| Tensor::f32(t.shape.clone(), f64s(&t).iter().map(|&v| v as f32).collect());
        let (x, w, b) = (to32(rng.t(&c.x)), to32(rng.t(&c.w)), to32(rng.t(&[c.w[0]])));
        let want = conv_reference(&x, &w, &f64s(&b), &c);
        assert_close(
            &f64s(&ev(&c.op(true), &[&x, &w, &b], &c.out_shape())),
            &want,
            1e-5,
            &format!("conv {:?} {:?}", c.x, c.w),
        );
        let no_bias = conv_reference(&x, &w, &vec![0.0; c.w[0]], &c);
        assert_close(
            &f64s(&ev(&c.op(false), &[&x, &w], &c.out_shape())),
            &no_bias,
            1e-5,
            "conv without bias",
        );
    }
}

#[test]
fn pooling_and_upsampling_hand_values() {
    let x = f32t(&[1, 1, 4, 4], &(0..16).map(|v| v as f32).collect::<Vec<_>>());
    let maxp =
        Op::Pool { op: PoolOp::Max, kernel: vec![2, 2], stride: vec![2, 2], padding: vec![0, 0] };
    assert_eq!(f64s(&ev(&maxp, &[&x], &[1, 1, 2, 2])), [5.0, 7.0, 13.0, 15.0]);
    // Average pooling counts the padding as zeros: a corner window holds one real element.
    let ones = f32t(&[1, 1, 2, 2], &[1.0; 4]);
    let avgp =
        Op::Pool { op: PoolOp::Avg, kernel: vec![2, 2], stride: vec![2, 2], padding: vec![1, 1] };
    assert_eq!(f64s(&ev(&avgp, &[&ones], &[1, 1, 2, 2])), [0.25; 4]);
    // Max pooling ignores the padding, even around negative values.
    let neg = f32t(&[1, 1, 2, 2], &[-1.0, -2.0, -3.0, -4.0]);
    let maxpad =
        Op::Pool { op: PoolOp::Max, kernel: vec![2, 2], stride: vec![2, 2], padding: vec![1, 1] };
    assert_eq!(f64s(&ev(&maxpad, &[&neg], &[1, 1, 2, 2])), [-1.0, -2.0, -3.0, -4.0]);
    // The max gradient goes to the first of tied maxima.
    let tied = f32t(&[1, 1, 2, 2], &[3.0, 3.0, 3.0, 1.0]);
    let dx = ev(
        &Op::PoolGrad {
            op: PoolOp::Max,
            kernel: vec![2, 2],
            stride: vec![2, 2],
            padding: vec![0, 0],
        },
        &[&tied, &f32t(&[1, 1, 1, 1], &[2.0])],
        &[1, 1, 2, 2],
    );
    assert_eq!(f64s(&dx), [2.0, 0.0, 0.0, 0.0]);
    let small = f32t(&[1, 1, 2], &[1.0, 2.0]);
    assert_eq!(f64s(&ev(&Op::Upsample { scale: 2 }, &[&small], &[1, 1, 4])), [1.0, 1.0, 2.0, 2.0]);
    let sq = f32t(&[1, 1, 1, 2], &[1.0, 2.0]);
    assert_eq!(
        f64s(&ev(&Op::Upsample { scale: 2 }, &[&sq], &[1, 1, 2, 4])),
        [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]
    );
}

#[test]
fn norms_match_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 0.0, 0.0, 3.0]);
    let ln = f64s(&ev(
        &Op::LayerNorm { eps: 1e-12, has_weight: false, has_bias: false },
        &[&x],
        &[2, 3],
    ));
    let s = 1.5f64.sqrt();
    assert_close(
        &ln,
        &[-s, 0.0, s, -1.0 / 2f64.sqrt(), -1.0 / 2f64.sqrt(), 2.0 / 2f64.sqrt()],
        1e-5,
        "layer_norm",
    );
    let r = f32t(&[2], &[3.0, 4.0]);
    let w = f32t(&[2], &[1.0, 2.0]);
    let rms = f64s(&ev(&Op::RmsNorm { eps: 0.0, has_weight: true }, &[&r, &w], &[2]));
    let root = 12.5f64.sqrt();
    assert_close(&rms, &[3.0 / root, 8.0 / root], 1e-6, "rms_norm");
    // Group norm with one channel per group is instance norm.
    let g = f32t(&[1, 2, 2], &[1.0, 3.0, 5.0, 5.0]);
    let gn = f64s(&ev(
        &Op::GroupNorm { groups: 2, eps: 0.0, has_weight: false, has_bias: false },
        &[&g],
        &[1, 2, 2],
    ));
    assert_eq!(gn[..2], [-1.0, 1.0]);
    assert!(gn[2..].iter().all(|v| v.is_nan()), "0/0 with eps 0 is NaN, as in PyTorch: {gn:?}");
}

#[test]
fn batch_norm_uses_batch_or_running_statistics() {
    // x: [N=2, C=1]; batch mean 2, biased var 1.
    let x = f32t(&[2, 1], &[1.0, 3.0]);
    let (rm, rv) = (f32t(&[1], &[0.0]), f32t(&[1], &[4.0]));
    let op = Op::BatchNorm { eps: 0.0, momentum: 0.1, has_weight: false, has_bias: false };
    assert_eq!(f64s(&ev_ctx(&op, &[&x, &rm, &rv], &[2, 1], &TRAIN)), [-1.0, 1.0]);
    assert_eq!(f64s(&ev_ctx(&op, &[&x, &rm, &rv], &[2, 1], &INFER)), [0.5, 1.5]);
    // Running statistics: the unbiased variance (2) enters the update.
    let (m, v) = batch_norm_update(&x, &rm, &rv, 0.1);
    assert_close(&f64s(&m), &[0.2], 1e-7, "running mean");
    assert_close(&f64s(&v), &[0.9 * 4.0 + 0.1 * 2.0], 1e-7, "running var");
    assert!(matches!(m.data, Data::F32(_)));
    let single = f32t(&[1, 1], &[1.0]);
    assert!(eval(&op, &[&single, &rm, &rv], DType::F32, &[1, 1], &TRAIN)
        .unwrap_err()
        .0
        .contains("more than one value"));
}

#[test]
fn dropout_masks_follow_seed_and_node() {
    let x = f32t(&[1000], &[1.0; 1000]);
    let op = Op::Dropout { p: 0.25 };
    let y = f64s(&ev_ctx(&op, &[&x], &[1000], &TRAIN));
    let dropped = y.iter().filter(|&&v| v == 0.0).count();
    assert!((200..300).contains(&dropped), "dropped {dropped} of 1000 at p = 0.25");
    assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    assert_eq!(y, f64s(&ev_ctx(&op, &[&x], &[1000], &TRAIN)), "same seed and node, same mask");
    assert_ne!(
        y,
        f64s(&ev_ctx(&op, &[&x], &[1000], &Ctx { node: 4, ..TRAIN })),
        "another node, another mask"
    );
    assert_ne!(
        y,
        f64s(&ev_ctx(&op, &[&x], &[1000], &Ctx { seed: 8, ..TRAIN })),
        "another seed, another mask"
    );
    assert_eq!(
        f64s(&ev_ctx(&op, &[&x], &[1000], &INFER)),
        vec![1.0; 1000],
        "identity in inference"
    );
    let g = f64s(&ev_ctx(
        &Op::DropoutGrad { p: 0.25, forward: TRAIN.node },
        &[&x],
        &[1000],
        &Ctx { node: 99, ..TRAIN },
    ));
    assert_eq!(g, y, "the gradient uses the forward step's mask");
}

#[test]
fn cross_entropy_hand_values() {
    let logits = f32t(&[2, 2], &[0.0, 0.0, 2.0, 0.0]);
    let t = Tensor::i32(vec![2], vec![0, 1]);
    let l = f64s(&ev(&Op::SoftmaxCrossEntropy, &[&logits, &t], &[]))[0];
    let want = (2f64.ln() + (1.0 + 2f64.exp()).ln() - 0.0) / 2.0;
    assert!((l - want).abs() < 1e-6, "{l} vs {want}");
    let g = f64s(&ev(&Op::SoftmaxCrossEntropyGrad, &[&logits, &t, &f32t(&[], &[1.0])], &[2, 2]));
    let p = 2f64.exp() / (1.0 + 2f64.exp());
    assert_close(&g, &[-0.25, 0.25, p / 2.0, (1.0 - p - 1.0) / 2.0], 1e-6, "cross-entropy grad");
}

#[test]
fn attention_matches_a_direct_loop() {
    let mut rng = Rng::new("attention fwd");
    let (q, k, v) = (rng.t(&[2, 4, 3, 5]), rng.t(&[2, 2, 6, 5]), rng.t(&[2, 2, 6, 3]));
    let mask = rng.tensor(&[2, 1, 3, 6], -1.0, 0.0);
    for causal in [false, true] {
        let y = ev(
            &Op::Attention { causal, scale: 0.4, has_mask: true },
            &[&q, &k, &v, &mask],
            &[2, 4, 3, 3],
        );
        assert_close(
            &f64s(&y),
            &attention_reference(&q, &k, &v, Some(&mask), causal, 0.4),
            1e-12,
            "attention",
        );
    }
    // One query per head against a long cache, three heads per KV head (decoding: the heads
    // share one pass over the keys), and more queries than that path takes (the GEMM).
    for (tq, tk) in [(1, 40), (2, 9), (5, 9)] {
        let (q, k, v) = (rng.t(&[1, 6, tq, 4]), rng.t(&[1, 2, tk, 4]), rng.t(&[1, 2, tk, 3]));
        let mask = rng.tensor(&[1, 1, tq, tk], -2.0, 0.0);
        for causal in [false, true] {
            let op = Op::Attention { causal, scale: 0.5, has_mask: true };
            let y = ev(&op, &[&q, &k, &v, &mask], &[1, 6, tq, 3]);
            let want = attention_reference(&q, &k, &v, Some(&mask), causal, 0.5);
            assert_close(&f64s(&y), &want, 1e-12, &format!("attention {tq}x{tk} {causal}"));
        }
    }
    // A query that sees no key (causal with Tq > Tk) gets zeros, not NaN.
    let (q2, k2) = (rng.t(&[1, 1, 3, 2]), rng.t(&[1, 1, 1, 2]));
    let v2 = Tensor::f64(vec![1, 1, 1, 2], vec![5.0, 6.0]);
    let y = f64s(&ev(
        &Op::Attention { causal: true, scale: 1.0, has_mask: false },
        &[&q2, &k2, &v2],
        &[1, 1, 3, 2],
    ));
    assert_eq!(y, [0.0, 0.0, 0.0, 0.0, 5.0, 6.0]);
}

#[test]
fn rope_hand_values() {
    let x = Rng::new("rope fwd").t(&[1, 3, 4]);
    let y = f64s(&ev(&Op::Rope { theta: 10000.0, offset: 0, inverse: false }, &[&x], &[1, 3, 4]));
    let xv = f64s(&x);
    assert_eq!(y[..4], xv[..4], "position 0 is not rotated");
    // Position 2, pair (1, 3): angle 2·10000^(−2/4) = 0.02.
    let (c, s) = (0.02f64.cos(), 0.02f64.sin());
    assert_close(
        &[y[9], y[11]],
        &[xv[9] * c - xv[11] * s, xv[11] * c + xv[9] * s],
        1e-12,
        "rope pair",
    );
    // With an offset, position t uses angle (offset + t)·inv_freq; the inverse undoes it.
    let shifted = ev(&Op::Rope { theta: 10000.0, offset: 5, inverse: false }, &[&x], &[1, 3, 4]);
    let back = ev(&Op::Rope { theta: 10000.0, offset: 5, inverse: true }, &[&shifted], &[1, 3, 4]);
    assert_close(&f64s(&back), &xv, 1e-12, "rope inverse");
}

#[test]
fn matmul_matches_a_direct_loop_in_f32() {
    let mut rng = Rng::new("matmul fwd");
    let to32 =
        |t: Tensor| Tensor::f32(t.shape.clone(), f64s(&t).iter().map(|&v| v as f32).collect());
    for (sa, sb) in [
        (vec![3, 5, 7], vec![7, 4]),
        (vec![2, 1, 5, 7], vec![3, 7, 4]),
        (vec![40, 30], vec![30, 20]),
    ] {
        let (a, b) = (to32(rng.t(&sa)), to32(rng.t(&sb)));
        let out = matmul_shape(&sa, &sb);
        let y = f64s(&ev(&Op::MatMul, &[&a, &b], &out));
        assert!(matches!(ev(&Op::MatMul, &[&a, &b], &out).data, Data::F32(_)));
        let (av, bv) = (f64s(&a), f64s(&b));
        let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
        let batch = broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
        let sta = layout::broadcast_strides(&sa[..sa.len() - 2], &batch).unwrap();
        let stb = layout::broadcast_strides(&sb[..sb.len() - 2], &batch).unwrap();
        let mut want = Vec::new();
        layout::walk(&batch, [&sta, &stb], |[ia, ib]| {
            for i in 0..m {
                for j in 0..n {
                    want.push(
                        (0..k)
                            .map(|c| av[ia * m * k + i * k + c] * bv[ib * k * n + c * n + j])
                            .sum::<f64>(),
                    );
                }
            }
        });
        assert_close(&y, &want, 1e-5, &format!("matmul {sa:?} {sb:?}"));
    }
}
