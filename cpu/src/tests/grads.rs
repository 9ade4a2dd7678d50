//! The derivatives of the point-wise, matrix-product and movement ops against central finite
//! differences in f64.

use super::*;

#[test]
fn unary_grads() {
    for u in UnaryOp::ALL {
        let name = format!("{u:?}");
        let positive = matches!(u, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt);
        let lo = match u {
            _ if positive => 0.2,
            UnaryOp::Log1p => -0.8,
            _ => -2.0,
        };
        let x = Rng::new(&name).tensor(&[3, 5], lo, 2.0);
        check_op(&name, &Op::Unary(u), &[x], &[3, 5], 0, &|xs, dy| {
            ev(&Op::UnaryGrad(u), &[&xs[0], dy], &[3, 5])
        });
    }
}

#[test]
fn pow_grad() {
    for p in [2.0, 3.0, 0.5, -1.5] {
        let x = Rng::new("pow").tensor(&[2, 3], 0.3, 2.0);
        // d/dx x^p = p·x^(p−1): composed as autodiff would, with an F32 constant.
        check_op(&format!("pow {p}"), &Op::Pow { exponent: p }, &[x], &[2, 3], 0, &|xs, dy| {
            let lower = ev(&Op::Pow { exponent: p - 1.0 }, &[&xs[0]], &[2, 3]);
            let c = ev(&Op::Constant { value: p }, &[], &[]);
            let d = ev(&Op::Binary(BinaryOp::Mul), &[&lower, &c], &[2, 3]);
            ev(&Op::Binary(BinaryOp::Mul), &[dy, &d], &[2, 3])
        });
    }
}

#[test]
fn binary_grads_with_broadcasting() {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[3, 4], &[3, 4]),
        (&[2, 3, 4], &[4]),
        (&[2, 1, 4], &[3, 1]),
        (&[], &[2, 3]),
        (&[2, 3], &[1]),
    ];
    for (sa, sb) in cases {
        let out = broadcast(sa, sb);
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            let mut rng = Rng::new("binary");
            let a = rng.t(sa);
            let b = if op == BinaryOp::Div { rng.tensor(sb, 0.5, 1.5) } else { rng.t(sb) };
            let name = format!("{op:?} {sa:?} {sb:?}");
            let bin = |o, x: &Tensor, y: &Tensor| {
                ev(&Op::Binary(o), &[x, y], &broadcast(&x.shape, &y.shape))
            };
            let sum_to = |t: &Tensor, s: &[usize]| ev(&Op::SumTo, &[t], s);
            let out2 = out.clone();
            check_op(
                &name,
                &Op::Binary(op),
                &[a.clone(), b.clone()],
                &out,
                0,
                &|xs, dy| match op {
                    BinaryOp::Add | BinaryOp::Sub => sum_to(dy, sa),
                    BinaryOp::Mul => sum_to(&bin(BinaryOp::Mul, dy, &xs[1]), sa),
                    BinaryOp::Div => sum_to(&bin(BinaryOp::Div, dy, &xs[1]), sa),
                    _ => unreachable!("the arithmetic ops only"),
                },
            );
            check_op(&name, &Op::Binary(op), &[a, b], &out2, 1, &|xs, dy| match op {
                BinaryOp::Add => sum_to(dy, sb),
                BinaryOp::Sub => sum_to(&ev(&Op::Unary(UnaryOp::Neg), &[dy], &dy.shape), sb),
                BinaryOp::Mul => sum_to(&bin(BinaryOp::Mul, dy, &xs[0]), sb),
                BinaryOp::Div => {
                    // −dy·a/b²
                    let b2 = bin(BinaryOp::Mul, &xs[1], &xs[1]);
                    let q = bin(BinaryOp::Div, &xs[0], &b2);
                    let g = bin(BinaryOp::Mul, dy, &q);
                    sum_to(&ev(&Op::Unary(UnaryOp::Neg), &[&g], &g.shape), sb)
                }
                _ => unreachable!("the arithmetic ops only"),
            });
        }
    }
}

#[test]
fn cast_grad_is_a_cast_back() {
    let x = Rng::new("cast").t(&[2, 3]);
    check_op("cast", &Op::Cast, &[x], &[2, 3], 0, &|_, dy| ev(&Op::Cast, &[dy], &[2, 3]));
}

#[test]
fn broadcast_to_and_sum_to_are_adjoint() {
    let x = Rng::new("bt").t(&[3, 1]);
    check_op("broadcast_to", &Op::BroadcastTo, &[x], &[2, 3, 4], 0, &|_, dy| {
        ev(&Op::SumTo, &[dy], &[3, 1])
    });
    let y = Rng::new("st").t(&[2, 3, 4]);
    check_op("sum_to", &Op::SumTo, &[y], &[3, 1], 0, &|_, dy| {
        ev(&Op::BroadcastTo, &[dy], &[2, 3, 4])
    });
}

#[test]
fn dropout_grad_uses_the_forward_mask() {
    let x = Rng::new("dropout").t(&[4, 9]);
    let op = Op::Dropout { p: 0.3 };
    check_op("dropout", &op, &[x], &[4, 9], 0, &|_, dy| {
        ev(&Op::DropoutGrad { p: 0.3, forward: TRAIN.node }, &[dy], &[4, 9])
    });
}

#[test]
fn matmul_grads_with_broadcasting_and_vectors() {
    let cases: [(&[usize], &[usize]); 9] = [
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[4], &[4, 5]),
        (&[3, 4], &[4]),
        (&[4], &[4]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[4], &[2, 4, 3]),
    ];
    for (sa, sb) in cases {
        let mut rng = Rng::new("matmul");
        let (a, b) = (rng.t(sa), rng.t(sb));
        let out = matmul_shape(sa, sb);
        for wrt in 0..2 {
            check_op(
                &format!("matmul {sa:?} {sb:?}"),
                &Op::MatMul,
                &[a.clone(), b.clone()],
                &out,
                wrt,
                &|xs, dy| matmul_grad(xs, dy, wrt),
            );
        }
    }
}

#[test]
fn movement_grads() {
    let mut rng = Rng::new("movement");
    let x = rng.t(&[2, 3, 4]);
    check_op(
        "permute",
        &Op::Permute { perm: vec![2, 0, 1] },
        std::slice::from_ref(&x),
        &[4, 2, 3],
        0,
        &|_, dy| ev(&Op::Permute { perm: vec![1, 2, 0] }, &[dy], &[2, 3, 4]),
    );
    check_op("reshape", &Op::Reshape, std::slice::from_ref(&x), &[6, 4], 0, &|_, dy| {
        ev(&Op::Reshape, &[dy], &[2, 3, 4])
    });
    check_op(
        "slice",
        &Op::Slice { axis: 1, start: 1, end: 3 },
        std::slice::from_ref(&x),
        &[2, 2, 4],
        0,
        &|_, dy| ev(&Op::SliceGrad { axis: 1, start: 1, end: 3 }, &[dy], &[2, 3, 4]),
    );
    check_op(
        "slice last",
        &Op::Slice { axis: 2, start: 3, end: 4 },
        &[x],
        &[2, 3, 1],
        0,
        &|_, dy| ev(&Op::SliceGrad { axis: 2, start: 3, end: 4 }, &[dy], &[2, 3, 4]),
    );

    let parts = [rng.t(&[2, 3]), rng.t(&[2, 1]), rng.t(&[2, 4])];
    let starts = [0, 3, 4, 8];
    for wrt in 0..3 {
        check_op("concat", &Op::Concat { axis: 1 }, &parts, &[2, 8], wrt, &|_, dy| {
            ev(
                &Op::Slice { axis: 1, start: starts[wrt], end: starts[wrt + 1] },
                &[dy],
                &[2, starts[wrt + 1] - starts[wrt]],
            )
        });
    }
}

#[test]
fn gather_grads_accumulate_repeated_indices() {
    let mut rng = Rng::new("gather");
    let table = rng.t(&[5, 3]);
    let ids = Tensor::i32(vec![2, 3], vec![4, 0, 4, 1, 4, 0]);
    check_op(
        "embedding",
        &Op::Gather { axis: 0 },
        &[table, ids.clone()],
        &[2, 3, 3],
        0,
        &|_, dy| ev(&Op::GatherGrad { axis: 0 }, &[&ids, dy], &[5, 3]),
    );
    let x = rng.t(&[2, 4, 3]);
    let idx = rng.index(&[5], 4);
    check_op(
        "gather axis 1",
        &Op::Gather { axis: 1 },
        &[x, idx.clone()],
        &[2, 5, 3],
        0,
        &|_, dy| ev(&Op::GatherGrad { axis: 1 }, &[&idx, dy], &[2, 4, 3]),
    );
}
