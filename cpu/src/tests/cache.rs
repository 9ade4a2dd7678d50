//! Ops whose start is read at run time, the pieces of KV-cache decoding: `Narrow`,
//! `SliceScatter` and `Rope` with a start. Values against direct formulas, the clamp at both
//! ends, and the derivatives autodiff composes for them against finite differences.

use super::*;

fn start(s: i32) -> Tensor {
    Tensor::i32(vec![], vec![s])
}

#[test]
fn narrow_reads_the_window_at_the_clamped_start() {
    let x = Tensor::f64(vec![2, 5], (0..10).map(f64::from).collect());
    let narrow = |s| f64s(&ev(&Op::Narrow { axis: 1, len: 2 }, &[&x, &start(s)], &[2, 2]));
    assert_eq!(narrow(1), [1.0, 2.0, 6.0, 7.0]);
    assert_eq!(narrow(3), [3.0, 4.0, 8.0, 9.0]);
    // Past either end the window stops at the edge: it never reads outside the axis.
    assert_eq!(narrow(9), narrow(3));
    assert_eq!(narrow(-4), narrow(0));
}

#[test]
fn slice_scatter_writes_the_window_and_keeps_the_rest() {
    let cache = Tensor::f64(vec![2, 4, 1], vec![0.0; 8]);
    let new = Tensor::f64(vec![2, 2, 1], vec![1.0, 2.0, 3.0, 4.0]);
    let write =
        |s| f64s(&ev(&Op::SliceScatter { axis: 1 }, &[&cache, &new, &start(s)], &[2, 4, 1]));
    assert_eq!(write(1), [0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 0.0]);
    assert_eq!(write(7), write(2), "clamped to the last window");
    assert_eq!(write(-1), write(0));
    let ids = Tensor::i32(vec![3], vec![7, 8, 9]);
    let one = Tensor::i32(vec![1], vec![5]);
    let got =
        eval(&Op::SliceScatter { axis: 0 }, &[&ids, &one, &start(2)], DType::I32, &[3], &INFER);
    assert_eq!(got.expect("i32 writes").data, Data::I32(vec![7, 8, 5]));
}

#[test]
fn rope_with_a_run_time_start_is_rope_at_that_offset() {
    let x = Rng::new("rope start").t(&[2, 3, 6]);
    for inverse in [false, true] {
        let fixed = Op::Rope { theta: 500.0, offset: 7, inverse };
        let moved = Op::Rope { theta: 500.0, offset: 3, inverse };
        let want = f64s(&ev(&fixed, &[&x], &[2, 3, 6]));
        let got = f64s(&ev(&moved, &[&x, &start(4)], &[2, 3, 6]));
        assert_close(&got, &want, 0.0, "offset 3 + start 4 = offset 7");
    }
}

/// The rules autodiff applies: d/dx zeroes the window, d/dsrc narrows dy to it, d/dx of
/// narrow writes dy into zeros.
#[test]
fn run_time_window_derivatives_match_finite_differences() {
    let mut rng = Rng::new("cache grads");
    let (x, src) = (rng.t(&[2, 5, 3]), rng.t(&[2, 2, 3]));
    for s in [0, 2, 3, 9] {
        let inputs = [x.clone(), src.clone(), start(s)];
        let op = Op::SliceScatter { axis: 1 };
        check_op("slice_scatter dx", &op, &inputs, &[2, 5, 3], 0, &|_, dy| {
            let zeros = ev(&Op::Constant { value: 0.0 }, &[], &[]);
            let window = ev(&Op::BroadcastTo, &[&zeros], &[2, 2, 3]);
            ev(&op, &[dy, &window, &start(s)], &[2, 5, 3])
        });
        check_op("slice_scatter dsrc", &op, &inputs, &[2, 5, 3], 1, &|_, dy| {
            ev(&Op::Narrow { axis: 1, len: 2 }, &[dy, &start(s)], &[2, 2, 3])
        });
        let narrow = Op::Narrow { axis: 1, len: 2 };
        let n_in = [x.clone(), start(s)];
        check_op("narrow dx", &narrow, &n_in, &[2, 2, 3], 0, &|_, dy| {
            let zeros = ev(&Op::Constant { value: 0.0 }, &[], &[]);
            let all = ev(&Op::BroadcastTo, &[&zeros], &[2, 5, 3]);
            ev(&op, &[&all, dy, &start(s)], &[2, 5, 3])
        });
    }
    let rope = Op::Rope { theta: 100.0, offset: 1, inverse: false };
    check_op(
        "rope with a start",
        &rope,
        &[rng.t(&[2, 4, 6]), start(5)],
        &[2, 4, 6],
        0,
        &|_, dy| {
            ev(&Op::Rope { theta: 100.0, offset: 1, inverse: true }, &[dy, &start(5)], &[2, 4, 6])
        },
    );
}

/// A KV cache written in place (`slice_scatter_in_place`) holds what `eval` returns, in every
/// storage and for a half cache (only the written rows rounded); an error leaves it unchanged.
#[test]
fn slice_scatter_in_place_equals_eval_and_fails_without_writing() {
    let mut rng = Rng::new("in place");
    let (cache, new) = (rng.t(&[2, 5, 3]), rng.t(&[2, 2, 3]));
    let as_f32 =
        |t: &Tensor| Tensor::f32(t.shape.clone(), f64s(t).iter().map(|&v| v as f32).collect());
    let halves = |t: &Tensor| eval(&Op::Cast, &[&as_f32(t)], DType::F16, &t.shape, &INFER).unwrap();
    let f16_cache = halves(&cache);
    let ints = |t: &Tensor| {
        Tensor::i32(t.shape.clone(), f64s(t).iter().map(|&v| (v * 9.0) as i32).collect())
    };
    let cases = [
        (cache.clone(), new.clone()),
        (as_f32(&cache), as_f32(&new)),
        (as_f32(&cache), new.clone()),
        (f16_cache, halves(&new)),
        (ints(&cache), ints(&new)),
    ];
    for (x, src) in cases {
        for s in [0, 3, 9, -2] {
            let op = Op::SliceScatter { axis: 1 };
            let want = eval(&op, &[&x, &src, &start(s)], x.dtype, &x.shape, &INFER).unwrap();
            let mut got = x.clone();
            slice_scatter_in_place(&mut got, &src, &start(s), 1).unwrap();
            assert_eq!(got, want, "{} cache, {} rows at {s}", x.dtype, src.dtype);
        }
    }
    let mut x = cache.clone();
    let e = slice_scatter_in_place(&mut x, &new, &Tensor::f32(vec![], vec![1.0]), 1).unwrap_err();
    assert!(e.0.contains("slice_scatter"), "{e}");
    let e = slice_scatter_in_place(&mut x, &rng.t(&[2, 2, 4]), &start(0), 1).unwrap_err();
    assert!(!e.0.is_empty());
    assert_eq!(x, cache, "unchanged after the errors");
}
