//! Products and lookups of packed weights equal decoding the weight and then multiplying or
//! gathering, for every packed type, streamed and tiled, both orientations; and the plan
//! analysis fuses exactly the dequantizes every reader of which can read the bytes.

use super::*;
use crate::fused::{eval_fused, fusions, Fused};
use crate::layout::numel;
use crate::matvec::STREAMED_ROWS;
use mgn_ir::dtype::PACKED;
use mgn_ir::plan::{Mode, Plan, SourceLoc, Step};

fn values(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0).collect()
}

fn run(op: Op, inputs: &[&Tensor], shape: &[usize]) -> Tensor {
    let ctx = Ctx { training: false, seed: 0, node: 0 };
    eval(&op, inputs, DType::F32, shape, &ctx).unwrap()
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape, want.shape, "{what}");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().fold(1f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 1e-5 * scale, "{what}: element {i}: {a} vs {b}");
    }
}

/// x `[lead.., K]` times W (`[N, K]` read transposed, or `[K, N]`), fused and decoded first.
fn check_product(dtype: DType, lead: &[usize], wshape: [usize; 2], transposed: bool) {
    let what = format!("{dtype} x{lead:?} W{wshape:?} transposed {transposed}");
    let mut rng = Rng::new(&what);
    let (k, n) = if transposed { (wshape[1], wshape[0]) } else { (wshape[0], wshape[1]) };
    let mut xshape = lead.to_vec();
    xshape.push(k);
    let x = Tensor::f32(xshape.clone(), values(&mut rng, numel(&xshape)));
    let w = Tensor::quantized(dtype, wshape.to_vec(), &values(&mut rng, wshape[0] * wshape[1]));
    let mut shape = lead.to_vec();
    shape.push(n);
    let fused = Fused::MatMul { x: 0, param: 0, transposed };
    let got = eval_fused(&fused, &[&x, &w], DType::F32, &shape).unwrap();
    let decoded = Tensor::f32(wshape.to_vec(), w.dequantized());
    let rhs = match transposed {
        true => run(Op::Permute { perm: vec![1, 0] }, &[&decoded], &[k, n]),
        false => decoded,
    };
    assert_close(&got, &run(Op::MatMul, &[&x, &rhs], &shape), &what);
}

#[test]
fn packed_products_equal_decoding_then_multiplying() {
    for dtype in PACKED {
        let long = dtype.block().unwrap().0 * 2;
        for lead in [&[][..], &[1], &[3], &[STREAMED_ROWS + 12], &[2, 3], &[2, 7]] {
            check_product(dtype, lead, [24, long], true);
            check_product(dtype, lead, [40, long], false);
        }
    }
    // Several tiles of W (more than 2^18 values), both ways.
    check_product(DType::Q8_0, &[20], [600, 512], true);
    check_product(DType::Q4_K, &[20], [600, 512], false);
    // Many rows in parallel groups, a last group cut short.
    check_product(DType::Q4_0, &[2], [1000, 64], true);
    check_product(DType::Q6_K, &[1], [8, 256 * 5], false);
}

#[test]
fn packed_lookups_decode_only_the_rows_they_gather() {
    for dtype in PACKED {
        let mut rng = Rng::new(dtype.name());
        let row = dtype.block().unwrap().0;
        let e = Tensor::quantized(dtype, vec![10, 2, row], &values(&mut rng, 20 * row));
        let ids = Tensor::i32(vec![2, 3], vec![9, 0, 3, 3, 7, 1]);
        let fused = Fused::Gather { param: 0, ids: 1 };
        let got = eval_fused(&fused, &[&e, &ids], DType::F32, &[2, 3, 2, row]).unwrap();
        let decoded = Tensor::f32(e.shape.clone(), e.dequantized());
        let want = run(Op::Gather { axis: 0 }, &[&decoded, &ids], &[2, 3, 2, row]);
        assert_eq!(got, want, "{dtype}");
        let bad = Tensor::i32(vec![1], vec![10]);
        let e = eval_fused(&fused, &[&e, &bad], DType::F32, &[1, 2, row]).unwrap_err();
        assert!(e.0.contains("index 10 is out of range"), "{e}");
    }
}

#[test]
fn fused_kernels_refuse_what_does_not_fit() {
    let w = Tensor::quantized(DType::Q8_0, vec![4, 32], &[0.5; 128]);
    let x = Tensor::f32(vec![2, 5], vec![1.0; 10]);
    let fused = Fused::MatMul { x: 0, param: 0, transposed: true };
    let e = eval_fused(&fused, &[&x, &w], DType::F32, &[2, 4]).unwrap_err();
    assert!(e.0.contains("inner sizes 5 and 32"), "{e}");
    let x = Tensor::f32(vec![2, 32], vec![1.0; 64]);
    let e = eval_fused(&fused, &[&x, &w], DType::F32, &[2, 5]).unwrap_err();
    assert!(e.0.contains("[2, 4]"), "{e}");
}

fn step(op: Op, inputs: Vec<u32>, dtype: DType, shape: &[usize]) -> Step {
    Step { op, inputs, dtype, shape: shape.to_vec(), loc: SourceLoc::default() }
}

#[test]
fn fusions_skip_dequantizes_whose_readers_all_read_the_packed_bytes() {
    let f = DType::F32;
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[3, 64]),
        step(Op::Param { index: 0 }, vec![], DType::Q4_0, &[32, 64]),
        step(Op::Dequantize, vec![1], f, &[32, 64]),
        step(Op::Permute { perm: vec![1, 0] }, vec![2], f, &[64, 32]),
        step(Op::MatMul, vec![0, 3], f, &[3, 32]), // 4: x @ Wᵀ
        step(Op::MatMul, vec![4, 2], f, &[3, 64]), // 5: (x @ Wᵀ) @ W
        step(Op::Input { name: "ids".into() }, vec![], DType::I32, &[5]),
        step(Op::Param { index: 1 }, vec![], DType::Q8_0, &[10, 64]),
        step(Op::Dequantize, vec![7], f, &[10, 64]),
        step(Op::Gather { axis: 0 }, vec![8, 6], f, &[5, 64]), // 9
        step(Op::Param { index: 2 }, vec![], DType::Q8_0, &[64, 32]),
        step(Op::Dequantize, vec![10], f, &[64, 32]),
        step(Op::MatMul, vec![5, 11], f, &[3, 32]), // 12: fused
        step(Op::Unary(UnaryOp::Neg), vec![11], f, &[64, 32]), // 13: so 11 is computed
    ];
    let outputs = vec![("y".into(), 5), ("e".into(), 9), ("z".into(), 12), ("n".into(), 13)];
    let plan = Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], outputs);
    let fused = fusions(&plan);
    let want = [
        (2, Fused::Skip),
        (3, Fused::Skip),
        (4, Fused::MatMul { x: 0, param: 0, transposed: true }),
        (5, Fused::MatMul { x: 4, param: 0, transposed: false }),
        (8, Fused::Skip),
        (9, Fused::Gather { param: 1, ids: 6 }),
    ];
    for (i, f) in fused.iter().enumerate() {
        let expected = want.iter().find(|(s, _)| *s == i).map_or(Fused::No, |(_, f)| f.clone());
        assert_eq!(f, &expected, "step {i}");
    }
    // A dequantize that is itself a result is computed.
    let mut kept = plan.clone();
    kept.outputs.push(("w".into(), 2));
    assert_eq!(fusions(&kept)[2], Fused::No);
    assert_eq!(fusions(&kept)[4], Fused::No);
}
