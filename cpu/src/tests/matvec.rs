//! Products by a weight read where it lies equal the plain product: the streamed kernel for few
//! rows (both layouts of W, odd sizes, on one thread and split over the cores), a float weight
//! read through its transpose by the fused step (streamed and by the GEMM), the unfused product
//! by a shared weight; and the plan analysis skips exactly the transposes every reader of which
//! is a product.

use super::*;
use crate::fused::{eval_fused, fusions, Fused};
use crate::layout::numel;
use crate::matvec::{dot, few_rows, STREAMED_ROWS};
use mgn_ir::plan::{Mode, Plan, SourceLoc, Step};

/// `x @ W` in f64, W `[k, n]` row-major (or `[n, k]` with `transposed`): the sums the kernels'
/// results must come within rounding of.
fn naive(x: &[f64], rows: usize, w: &[f64], k: usize, n: usize, transposed: bool) -> Vec<f64> {
    let at = |kk: usize, j: usize| if transposed { w[j * k + kk] } else { w[kk * n + j] };
    let mut out = vec![0.0; rows * n];
    for r in 0..rows {
        for j in 0..n {
            out[r * n + j] = (0..k).map(|kk| x[r * k + kk] * at(kk, j)).sum();
        }
    }
    out
}

fn check_close(got: &[f64], want: &[f64], k: usize, what: &str) {
    // Each sum of k products of values in [-1, 1], in another order: rounding grows with k.
    assert_close(got, want, 1e-6 * k as f64, what);
}

#[test]
fn streamed_products_equal_the_plain_product_at_odd_sizes() {
    // Tiny sizes run on the calling thread; the larger ones are split over the cores (tests use
    // a small threshold for that), with a last group of columns cut short.
    for (k, n) in [(1, 1), (3, 5), (17, 63), (33, 65), (577, 130), (64, 1000), (1536, 77)] {
        for rows in [1, 2, 3, STREAMED_ROWS] {
            for transposed in [false, true] {
                let what = format!("{rows}x{k} by {k}x{n} transposed {transposed}");
                let mut rng = Rng::new(&what);
                let x: Vec<f64> = (0..rows * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
                let w: Vec<f64> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
                let want = naive(&x, rows, &w, k, n, transposed);
                let got = few_rows(&x, rows, &w, k, n, transposed);
                check_close(&got, &want, k, &format!("{what} (f64)"));
                let (x32, w32): (Vec<f32>, Vec<f32>) =
                    (x.iter().map(|&v| v as f32).collect(), w.iter().map(|&v| v as f32).collect());
                let got = few_rows(&x32, rows, &w32, k, n, transposed);
                let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
                assert_close(&got, &want, 1e-5 * (k as f64).sqrt(), &format!("{what} (f32)"));
            }
        }
    }
}

#[test]
fn dot_products_sum_every_pair_at_every_length() {
    for len in [1, 15, 16, 17, 31, 32, 33, 100] {
        let a: Vec<f64> = (0..len).map(|i| i as f64 + 1.0).collect();
        let b: Vec<f64> = (0..len).map(|i| if i % 2 == 0 { 1.0 } else { 2.0 }).collect();
        let want: f64 = a.iter().zip(&b).map(|(p, q)| p * q).sum();
        assert_eq!(dot(&a, &b), want, "length {len}");
    }
}

/// x `[lead.., K]` times a float W (`[N, K]` read transposed, or `[K, N]`), fused against a
/// transpose and the plain product.
fn check_weight_product(lead: &[usize], wshape: [usize; 2], transposed: bool, f64_x: bool) {
    let what = format!("x{lead:?} W{wshape:?} transposed {transposed} f64 x {f64_x}");
    let mut rng = Rng::new(&what);
    let (k, n) = if transposed { (wshape[1], wshape[0]) } else { (wshape[0], wshape[1]) };
    let mut xshape = lead.to_vec();
    xshape.push(k);
    let mut x = rng.t(&xshape);
    if !f64_x {
        x = Tensor::f32(xshape.clone(), x.to_f64_vec().iter().map(|&v| v as f32).collect());
    }
    let w = rng.t(&wshape);
    let w = Tensor::f32(wshape.to_vec(), w.to_f64_vec().iter().map(|&v| v as f32).collect());
    let mut shape = lead.to_vec();
    shape.push(n);
    let fused = Fused::MatMul { x: 0, param: 0, transposed };
    let got = eval_fused(&fused, &[&x, &w], DType::F32, &shape).unwrap();
    assert_eq!(got.shape, shape, "{what}");
    let rhs = match transposed {
        true => ev(&Op::Permute { perm: vec![1, 0] }, &[&w], &[k, n]),
        false => w.clone(),
    };
    let rows = numel(&xshape) / k;
    let want = naive(&x.to_f64_vec(), rows, &w.to_f64_vec(), k, n, transposed);
    check_close(&got.to_f64_vec(), &want, k, &what);
    let plain = ev(&Op::MatMul, &[&x, &rhs], &shape);
    check_close(&plain.to_f64_vec(), &want, k, &format!("{what} (unfused)"));
}

#[test]
fn products_by_a_float_weight_read_where_it_lies_equal_the_plain_product() {
    for lead in [&[][..], &[1], &[3], &[1, 1], &[2, 3], &[STREAMED_ROWS + 12], &[3, 7]] {
        for transposed in [true, false] {
            check_weight_product(lead, [24, 40], transposed, false);
            check_weight_product(lead, [130, 577], transposed, false);
        }
    }
    // f64 storage (gradient checks) computes in f64.
    check_weight_product(&[2], [9, 33], true, true);
    check_weight_product(&[20], [9, 33], false, true);
}

#[test]
fn products_by_a_float_weight_refuse_what_does_not_fit() {
    let w = Tensor::f32(vec![4, 32], vec![0.5; 128]);
    let fused = Fused::MatMul { x: 0, param: 0, transposed: true };
    let x = Tensor::f32(vec![2, 5], vec![1.0; 10]);
    let e = eval_fused(&fused, &[&x, &w], DType::F32, &[2, 4]).unwrap_err();
    assert!(e.0.contains("inner sizes 5 and 32"), "{e}");
    let x = Tensor::f32(vec![2, 32], vec![1.0; 64]);
    let e = eval_fused(&fused, &[&x, &w], DType::F32, &[2, 5]).unwrap_err();
    assert!(e.0.contains("[2, 4]"), "{e}");
    let cube = Tensor::f32(vec![2, 2, 32], vec![0.5; 128]);
    let e = eval_fused(&fused, &[&x, &cube], DType::F32, &[2, 4]).unwrap_err();
    assert!(e.0.contains("must be a matrix"), "{e}");
}

fn step(op: Op, inputs: Vec<u32>, dtype: DType, shape: &[usize]) -> Step {
    Step { op, inputs, dtype, shape: shape.to_vec(), loc: SourceLoc::default() }
}

#[test]
fn fusions_skip_transposes_of_float_weights_read_only_by_products() {
    let f = DType::F32;
    // W [32, 64] transposed.
    let t = |w: u32| step(Op::Permute { perm: vec![1, 0] }, vec![w], f, &[64, 32]);
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[3, 64]),
        step(Op::Param { index: 0 }, vec![], f, &[32, 64]),
        t(1),                                                 // 2: Wᵀ, skipped
        step(Op::MatMul, vec![0, 2], f, &[3, 32]),            // 3: x @ Wᵀ
        step(Op::Param { index: 1 }, vec![], f, &[32, 64]),   // 4
        t(4),                                                 // 5: Vᵀ, also negated
        step(Op::MatMul, vec![0, 5], f, &[3, 32]),            // 6: not fused
        step(Op::Unary(UnaryOp::Neg), vec![5], f, &[64, 32]), // 7
        step(Op::Param { index: 2 }, vec![], f, &[32, 64]),   // 8
        t(8),                                                 // 9: Uᵀ, an output
        step(Op::MatMul, vec![0, 9], f, &[3, 32]),            // 10: not fused
        step(Op::MatMul, vec![3, 1], f, &[3, 64]),            // 11: (x @ Wᵀ) @ W, plain
    ];
    let outputs = ["y", "z", "n", "u", "v", "w"].iter().zip([3, 6, 7, 9, 10, 11]);
    let outputs = outputs.map(|(n, s)| (n.to_string(), s)).collect();
    let plan = Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], outputs);
    let fused = fusions(&plan);
    let want = [(2, Fused::Skip), (3, Fused::MatMul { x: 0, param: 0, transposed: true })];
    for (i, f) in fused.iter().enumerate() {
        let expected = want.iter().find(|(s, _)| *s == i).map_or(Fused::No, |(_, f)| f.clone());
        assert_eq!(f, &expected, "step {i}");
    }
}
