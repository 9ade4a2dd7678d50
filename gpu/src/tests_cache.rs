//! Decoding with a KV cache on the GPU against the CPU reference: `Narrow` and `SliceScatter`
//! at a run-time start (clamped at both ends, as the CPU clamps it), and `Rope` moved by a
//! run-time start.

use super::test_util::{check_on_both, run_on_gpu, values};
use mgn_ir::op::Op;
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

fn floats(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed))
}

fn ints(shape: &[usize], seed: i32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::i32(shape.to_vec(), (0..n as i32).map(|i| i * 7 - seed).collect())
}

fn start(s: i32) -> Tensor {
    Tensor::i32(vec![], vec![s])
}

/// Starts before, inside and past an axis of `size` for a window of `len`.
fn starts(size: usize, len: usize) -> Vec<i32> {
    let room = (size - len) as i32;
    vec![-5, -1, 0, 1, room / 2, room, room + 1, 1000]
}

#[test]
fn narrow_matches_the_cpu_at_every_start() {
    let cases: &[(&[usize], usize, usize)] =
        &[(&[2, 6, 3], 1, 2), (&[5, 4], 0, 3), (&[3, 2, 7], 2, 7), (&[1, 9, 2, 4], 1, 1)];
    for &(shape, axis, len) in cases {
        let mut out = shape.to_vec();
        out[axis] = len;
        for s in starts(shape[axis], len) {
            let op = Op::Narrow { axis, len };
            check_on_both(&op, &[floats(shape, 3), start(s)], DType::F32, &out, 0.0);
        }
    }
    // Integers (a cached token window) move as words too.
    let op = Op::Narrow { axis: 1, len: 2 };
    check_on_both(&op, &[ints(&[2, 5], 3), start(2)], DType::I32, &[2, 2], 0.0);
}

#[test]
fn slice_scatter_matches_the_cpu_at_every_start() {
    let cases: &[(&[usize], &[usize], usize)] = &[
        (&[1, 6, 2], &[1, 1, 2], 1),
        (&[2, 3, 8], &[2, 3, 3], 2),
        (&[4, 3], &[2, 3], 0),
        (&[2, 4, 5], &[2, 4, 5], 1),
        (&[2, 2, 7, 4], &[2, 2, 2, 4], 2),
    ];
    for &(shape, src, axis) in cases {
        let op = Op::SliceScatter { axis };
        for s in starts(shape[axis], src[axis]) {
            let x = [floats(shape, 5), floats(src, 6), start(s)];
            check_on_both(&op, &x, DType::F32, shape, 0.0);
            let x = [ints(shape, 5), ints(src, 100), start(s)];
            check_on_both(&op, &x, DType::I32, shape, 0.0);
        }
    }
}

#[test]
fn a_clamped_window_stays_inside_the_axis() {
    // Written out, not only compared: the last window for a start past the end, the first
    // for a negative one.
    let x = Tensor::f32(vec![1, 4, 1], vec![0.0, 1.0, 2.0, 3.0]);
    let src = Tensor::f32(vec![1, 2, 1], vec![8.0, 9.0]);
    let scatter = |s: i32| {
        run_on_gpu(
            &Op::SliceScatter { axis: 1 },
            &[x.clone(), src.clone(), start(s)],
            DType::F32,
            &[1, 4, 1],
        )
    };
    let Some(past) = scatter(7) else { return };
    assert_eq!(past.to_f64_vec(), vec![0.0, 1.0, 8.0, 9.0]);
    let before = scatter(-2).expect("the GPU ran once");
    assert_eq!(before.to_f64_vec(), vec![8.0, 9.0, 2.0, 3.0]);
    let narrow =
        run_on_gpu(&Op::Narrow { axis: 1, len: 3 }, &[x, start(9)], DType::F32, &[1, 3, 1]);
    assert_eq!(narrow.expect("the GPU ran").to_f64_vec(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn rope_at_a_run_time_start_matches_the_cpu() {
    let x = floats(&[2, 3, 1, 8], 41);
    for (offset, s) in [(0, 0), (0, 7), (3, 5), (2, -4), (0, 300)] {
        for inverse in [false, true] {
            check_on_both(
                &Op::Rope { theta: 10000.0, offset, inverse },
                &[x.clone(), start(s)],
                DType::F32,
                &[2, 3, 1, 8],
                1e-5,
            );
        }
    }
    // Several positions from the start (a prompt's prefill at a cache offset).
    let op = Op::Rope { theta: 500.0, offset: 1, inverse: false };
    check_on_both(&op, &[floats(&[5, 4], 42), start(6)], DType::F32, &[5, 4], 1e-5);
}
