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

#[test]
fn cumsum_runs_forward_and_back_along_any_axis() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let run = |axis, reverse| f64s(&ev(&Op::Cumsum { axis, reverse }, &[&x], &[2, 3]));
    assert_eq!(run(1, false), [1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    assert_eq!(run(1, true), [6.0, 5.0, 3.0, 15.0, 11.0, 6.0]);
    assert_eq!(run(0, false), [1.0, 2.0, 3.0, 5.0, 7.0, 9.0]);
    let i = Tensor::i32(vec![4], vec![i32::MAX, 1, -3, 2]);
    let wraps = run_i32(&Op::Cumsum { axis: 0, reverse: false }, &i, &[4]);
    assert_eq!(wraps, Data::I32(vec![i32::MAX, i32::MIN, i32::MAX - 2, i32::MAX]));
}

fn run_i32(op: &Op, x: &Tensor, shape: &[usize]) -> Data {
    run(op, &[x], DType::I32, shape)
}

#[test]
fn cumsum_grad_is_the_reverse_cumsum() {
    for (axis, reverse) in [(0, false), (1, true), (2, false)] {
        let x = Rng::new("cumsum").t(&[2, 3, 4]);
        let op = Op::Cumsum { axis, reverse };
        check_op("cumsum", &op, &[x], &[2, 3, 4], 0, &|_, dy| {
            ev(&Op::Cumsum { axis, reverse: !reverse }, &[dy], &[2, 3, 4])
        });
    }
}

#[test]
fn topk_ranks_largest_first_ties_low_and_nan_on_top() {
    let x = f32t(&[2, 5], &[1.0, 3.0, 3.0, -0.0, 0.0, 2.0, f32::NAN, -1.0, 5.0, f32::NAN]);
    let top = |k| run(&Op::TopK { k, axis: 1 }, &[&x], DType::I32, &[2, k]);
    assert_eq!(top(3), Data::I32(vec![1, 2, 0, 1, 4, 3]));
    // −0 and +0 tie, so the lower position comes first.
    assert_eq!(top(5), Data::I32(vec![1, 2, 0, 3, 4, 1, 4, 3, 0, 2]));
    let cols = run(&Op::TopK { k: 1, axis: 0 }, &[&x], DType::I32, &[1, 5]);
    assert_eq!(cols, Data::I32(vec![1, 1, 0, 1, 1]));
    let i = Tensor::i32(vec![4], vec![-5, 7, 7, 0]);
    assert_eq!(run(&Op::TopK { k: 2, axis: 0 }, &[&i], DType::I32, &[2]), Data::I32(vec![1, 2]));
}

#[test]
fn take_along_reads_at_indices_and_its_grad_scatters_back() {
    let x = f32t(&[2, 3], &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
    let idx = Tensor::i32(vec![2, 2], vec![2, 0, 1, 1]);
    let y = run(&Op::TakeAlong { axis: 1 }, &[&x, &idx], DType::F32, &[2, 2]);
    assert_eq!(y, Data::F32(vec![30.0, 10.0, 50.0, 50.0]));
    let bad = Tensor::i32(vec![2, 2], vec![3, 0, 1, 1]);
    let e = eval(&Op::TakeAlong { axis: 1 }, &[&x, &bad], DType::F32, &[2, 2], &TRAIN);
    assert!(e.unwrap_err().0.contains("index 3 is out of range"));
    let idx = Rng::new("take").index(&[2, 5, 4], 3);
    let x = Rng::new("take x").t(&[2, 3, 4]);
    let op = Op::TakeAlong { axis: 1 };
    check_op("take_along", &op, &[x, idx.clone()], &[2, 5, 4], 0, &|_, dy| {
        ev(&Op::TakeAlongGrad { axis: 1 }, &[&idx, dy], &[2, 3, 4])
    });
}
