//! Comparisons, selection, maximum and minimum: values against hand-computed ones, with
//! broadcasting, integer operands and NaN.

use super::*;
use mgn_ir::op::CompareOp;

fn run(op: &Op, inputs: &[&Tensor], dtype: DType, shape: &[usize]) -> Data {
    eval(op, inputs, dtype, shape, &TRAIN).unwrap_or_else(|e| panic!("{e}")).data
}

#[test]
fn comparisons_broadcast_and_give_bools() {
    let a = f32t(&[2, 1], &[1.0, f32::NAN]);
    let b = f32t(&[3], &[0.0, 1.0, 2.0]);
    let cmp = |c| run(&Op::Compare(c), &[&a, &b], DType::Bool, &[2, 3]);
    assert_eq!(cmp(CompareOp::Lt), Data::I32(vec![0, 0, 1, 0, 0, 0]));
    assert_eq!(cmp(CompareOp::Le), Data::I32(vec![0, 1, 1, 0, 0, 0]));
    assert_eq!(cmp(CompareOp::Eq), Data::I32(vec![0, 1, 0, 0, 0, 0]));
    // NaN compares unequal to everything, itself included.
    assert_eq!(cmp(CompareOp::Ne), Data::I32(vec![1, 0, 1, 1, 1, 1]));
    assert_eq!(cmp(CompareOp::Gt), Data::I32(vec![1, 0, 0, 0, 0, 0]));
    assert_eq!(cmp(CompareOp::Ge), Data::I32(vec![1, 1, 0, 0, 0, 0]));
    let labels = Tensor::i32(vec![3, 1], vec![2, 0, 5]);
    let classes = Tensor::i32(vec![3], vec![0, 1, 2]);
    let one_hot = run(&Op::Compare(CompareOp::Eq), &[&labels, &classes], DType::Bool, &[3, 3]);
    assert_eq!(one_hot, Data::I32(vec![0, 0, 1, 1, 0, 0, 0, 0, 0]));
    let e = eval(&Op::Compare(CompareOp::Lt), &[&a, &labels], DType::Bool, &[3, 1], &TRAIN);
    assert!(e.is_err(), "an f32 and an i32 operand are refused");
}

#[test]
fn where_broadcasts_all_three_operands() {
    let c = Tensor { dtype: DType::Bool, shape: vec![2, 1], data: Data::I32(vec![1, 0]) };
    let a = f32t(&[3], &[1.0, 2.0, 3.0]);
    let b = f32t(&[], &[-1.0]);
    assert_eq!(
        run(&Op::Where, &[&c, &a, &b], DType::F32, &[2, 3]),
        Data::F32(vec![1.0, 2.0, 3.0, -1.0, -1.0, -1.0])
    );
    let ai = Tensor::i32(vec![1, 2], vec![7, 8]);
    let bi = Tensor::i32(vec![2, 1], vec![0, 9]);
    assert_eq!(run(&Op::Where, &[&c, &ai, &bi], DType::I32, &[2, 2]), Data::I32(vec![7, 8, 9, 9]));
    // Gradient checks run in f64: a mixed f32/f64 pair computes in f64.
    let a64 = Tensor::f64(vec![3], vec![1.0, 2.0, 3.0]);
    let y = eval(&Op::Where, &[&c, &a64, &b], DType::F32, &[2, 3], &TRAIN).unwrap();
    assert_eq!(y.data, Data::F64(vec![1.0, 2.0, 3.0, -1.0, -1.0, -1.0]));
}

#[test]
fn maximum_and_minimum_propagate_nan_and_work_on_integers() {
    let a = f32t(&[4], &[1.0, -2.0, f32::NAN, 3.0]);
    let b = f32t(&[4], &[0.5, 5.0, 1.0, f32::NAN]);
    let Data::F32(hi) = run(&Op::Binary(BinaryOp::Maximum), &[&a, &b], DType::F32, &[4]) else {
        panic!("f32 storage")
    };
    assert_eq!(&hi[..2], &[1.0, 5.0]);
    assert!(hi[2].is_nan() && hi[3].is_nan(), "{hi:?}");
    let Data::F32(lo) = run(&Op::Binary(BinaryOp::Minimum), &[&a, &b], DType::F32, &[4]) else {
        panic!("f32 storage")
    };
    assert_eq!(&lo[..2], &[0.5, -2.0]);
    assert!(lo[2].is_nan() && lo[3].is_nan(), "{lo:?}");
    let x = Tensor::i32(vec![3], vec![-4, 0, 9]);
    let s = Tensor::i32(vec![], vec![1]);
    let max = run(&Op::Binary(BinaryOp::Maximum), &[&x, &s], DType::I32, &[3]);
    assert_eq!(max, Data::I32(vec![1, 1, 9]));
    let min = run(&Op::Binary(BinaryOp::Minimum), &[&x, &s], DType::I32, &[3]);
    assert_eq!(min, Data::I32(vec![-4, 0, 1]));
}
