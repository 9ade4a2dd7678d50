//! Bad data is an error naming the op and the problem, never a panic.

use super::*;

#[test]
fn bad_data_is_an_error_not_a_panic() {
    let table = f32t(&[5, 2], &[0.0; 10]);
    let e = eval(
        &Op::Gather { axis: 0 },
        &[&table, &Tensor::i32(vec![2], vec![1, 7])],
        DType::F32,
        &[2, 2],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("index 7") && e.0.contains("size 5"), "{e}");
    let e = eval(
        &Op::Gather { axis: 0 },
        &[&table, &Tensor::i32(vec![1], vec![-1])],
        DType::F32,
        &[1, 2],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("index -1"), "{e}");
    let e = eval(
        &Op::GatherGrad { axis: 0 },
        &[&Tensor::i32(vec![1], vec![5]), &f32t(&[1, 2], &[0.0; 2])],
        DType::F32,
        &[5, 2],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("index 5"), "{e}");
    let e = eval(&Op::Gather { axis: 0 }, &[&table, &table], DType::F32, &[5, 2, 2], &TRAIN)
        .unwrap_err();
    assert!(e.0.contains("integer"), "{e}");
    let e =
        eval(&Op::Unary(UnaryOp::Exp), &[&Tensor::i32(vec![1], vec![1])], DType::F32, &[1], &TRAIN)
            .unwrap_err();
    assert!(e.0.contains("float"), "{e}");
    let e = eval(
        &Op::SoftmaxCrossEntropy,
        &[&table, &Tensor::i32(vec![5], vec![0, 1, 2, 1, 0])],
        DType::F32,
        &[],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("target 2") && e.0.contains("2 classes"), "{e}");
    for op in [Op::Input { name: "x".into() }, Op::Param { index: 0 }] {
        assert!(eval(&op, &[], DType::F32, &[1], &TRAIN).is_err());
    }
    let e = eval(&Op::Unary(UnaryOp::Exp), &[&table], DType::F32, &[2, 5], &TRAIN).unwrap_err();
    assert!(
        e.0.contains("[5, 2]") && e.0.contains("[2, 5]"),
        "a wrong step shape is reported: {e}"
    );
    let e = eval(&Op::MatMul, &[&table], DType::F32, &[5], &TRAIN).unwrap_err();
    assert!(e.0.starts_with("matmul: takes 2 input(s), not 1"), "{e}");
    let empty = f32t(&[2, 0], &[]);
    assert!(eval(
        &Op::LayerNorm { eps: 1e-5, has_weight: false, has_bias: false },
        &[&empty],
        DType::F32,
        &[2, 0],
        &TRAIN
    )
    .unwrap_err()
    .0
    .contains("zero-sized"));
    let broken = Tensor { dtype: DType::F32, shape: vec![3], data: Data::F32(vec![1.0]) };
    assert!(eval(&Op::Unary(UnaryOp::Exp), &[&broken], DType::F32, &[3], &TRAIN).is_err());
}
