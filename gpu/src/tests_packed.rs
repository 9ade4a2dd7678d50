//! Packed (quantized) parameters on the GPU against the CPU, which decodes them then computes:
//! products reading the weight in place (transposed, plain, batched, mixed precision, the
//! matrix-vector kernel), an embedding lookup of packed rows, the f32 fallback for a reader
//! that cannot read in place, and the arena that keeps the weight packed.

use crate::program::GpuPlan;
use crate::test_util::{open, run_on_cpu_plan, step, values, weight};
use mgn_ir::dtype::PACKED;
use mgn_ir::op::{BinaryOp, Op};
use mgn_ir::plan::{Mode, Plan};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

/// ‖got − want‖ / ‖want‖.
fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape, want.shape);
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let err: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f64 = w.iter().map(|b| b * b).sum();
    (err / norm.max(1e-30)).sqrt()
}

/// A packed parameter `w` of `shape` holding `values` quantized, and its spec.
fn packed_weight(dtype: DType, shape: &[usize], seed: u32) -> (mgn_ir::plan::ParamSpec, Tensor) {
    let n = shape.iter().product();
    let t = Tensor::quantized(dtype, shape.to_vec(), &values(n, seed));
    (mgn_ir::plan::ParamSpec { dtype, trainable: false, ..weight("w", shape) }, t)
}

/// Runs `plan` (input `x`, one packed parameter) on both backends: the GPU's result within
/// `tol` (relative L2) of the CPU's, and the dequantized views the memory plan finds.
fn check(plan: Plan, w: Tensor, given: &[(&str, &Tensor)], tol: f64) -> Vec<bool> {
    let views = crate::memory::dequantized_views(&GpuPlan::of(&plan));
    let params = std::slice::from_ref(&w);
    let want = run_on_cpu_plan(&plan, params, given).outputs.remove(0).1;
    let what = format!("{} {:?}", w.dtype, w.shape);
    if let Some(mut gpu) = open(plan, params) {
        let got = gpu.run(given, 0).unwrap_or_else(|e| panic!("{what}: {e}")).outputs;
        let e = rel_l2(&got[0].1, &want);
        assert!(e < tol, "{what}: relative L2 error {e:e}");
    }
    views
}

/// `x[.., k] @ dequantize(w[n, k])ᵀ`, the weight cast to `half` first where given.
fn transposed_product(dtype: DType, x: &[usize], n: usize, half: Option<DType>) -> Vec<bool> {
    let (f, k) = (DType::F32, *x.last().unwrap());
    let mut y = x.to_vec();
    *y.last_mut().unwrap() = n;
    let mut steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, x),
        step(Op::Param { index: 0 }, vec![], dtype, &[n, k]),
        step(Op::Dequantize, vec![1], f, &[n, k]),
    ];
    let (mut xs, mut ws) = (0, 2);
    if let Some(h) = half {
        steps.push(step(Op::Cast, vec![0], h, x));
        steps.push(step(Op::Cast, vec![2], h, &[n, k]));
        (xs, ws) = (3, 4);
    }
    let t = steps.len() as u32;
    steps.push(step(Op::Permute { perm: vec![1, 0] }, vec![ws], half.unwrap_or(f), &[k, n]));
    steps.push(step(Op::MatMul, vec![xs, t], f, &y));
    let out = steps.len() as u32 - 1;
    let (spec, w) = packed_weight(dtype, &[n, k], 7);
    let p = Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), out)]);
    let xv = Tensor::f32(x.to_vec(), values(x.iter().product(), 3));
    check(Plan { params: vec![spec], ..p }, w, &[("x", &xv)], 1e-6)
}

/// `x @ dequantize(w)ᵀ` for every packed type: one row (the matrix-vector kernel), a few, and
/// 37 (the tiled kernel), k a multiple of 256 and, for the 32-value types, 96; the
/// dequantize is a view, the weight's transpose one of it.
#[test]
fn transposed_products_of_packed_weights_match_the_cpu() {
    for dtype in PACKED {
        let ks: &[usize] = if dtype.block().unwrap().0 == 32 { &[256, 96] } else { &[512] };
        for &k in ks {
            for m in [1, 3, 37] {
                let views = transposed_product(dtype, &[m, k], 40, None);
                assert_eq!(views, [false, false, true, false, false], "{dtype}");
            }
        }
    }
}

/// The mixed policy's product: the weight's cast to f16 a rounded view of its dequantized view
/// (the cooperative-matrix kernel stages its panels from it where the device has them).
#[test]
fn mixed_precision_products_of_packed_weights_match_the_cpu() {
    for dtype in PACKED {
        for m in [2, 37] {
            let views = transposed_product(dtype, &[m, 256], 48, Some(DType::F16));
            assert!(views[2], "{dtype}");
        }
    }
}

/// `x[m, k] @ dequantize(w[k, n])`, and batched: `x[2, m, k] @ dequantize(w[2, k, n])`.
#[test]
fn plain_and_batched_products_of_packed_weights_match_the_cpu() {
    let f = DType::F32;
    for dtype in PACKED {
        let n = dtype.block().unwrap().0 * 2;
        for (batch, m) in [(vec![], 1), (vec![], 37), (vec![2], 3), (vec![2], 19)] {
            let (k, b) = (24, batch.len());
            let shape = |r: usize, c: usize| [batch.clone(), vec![r, c]].concat();
            let steps = vec![
                step(Op::Input { name: "x".into() }, vec![], f, &shape(m, k)),
                step(Op::Param { index: 0 }, vec![], dtype, &shape(k, n)),
                step(Op::Dequantize, vec![1], f, &shape(k, n)),
                step(Op::MatMul, vec![0, 2], f, &shape(m, n)),
            ];
            let p =
                Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 3)]);
            let (spec, w) = packed_weight(dtype, &shape(k, n), 11 + b as u32);
            let x = Tensor::f32(shape(m, k), values(shape(m, k).iter().product(), 5));
            let views = check(Plan { params: vec![spec], ..p }, w, &[("x", &x)], 1e-6);
            assert_eq!(views, [false, false, true, false], "{dtype}");
        }
    }
}

/// An embedding lookup gathers packed rows in place; a sum of the dequantized table (a reader
/// that does not load elements one by one) gets it as f32 words, decoded by the dequantize's
/// kernel.
#[test]
fn gathers_read_packed_rows_and_other_readers_get_f32_values() {
    let f = DType::F32;
    for dtype in PACKED {
        let d = dtype.block().unwrap().0;
        let (rows, ids) = (10, [3, 0, 9, 3, 7]);
        let mut steps = vec![
            step(Op::Input { name: "ids".into() }, vec![], DType::I32, &[ids.len()]),
            step(Op::Param { index: 0 }, vec![], dtype, &[rows, d]),
            step(Op::Dequantize, vec![1], f, &[rows, d]),
            step(Op::Gather { axis: 0 }, vec![2, 0], f, &[ids.len(), d]),
        ];
        let idx = Tensor::i32(vec![ids.len()], ids.to_vec());
        let (spec, w) = packed_weight(dtype, &[rows, d], 21);
        let p = Plan::of_steps(Mode::Infer, steps.clone(), vec![("ids".into(), 0)], vec![]);
        let p = Plan { params: vec![spec.clone()], outputs: vec![("y".into(), 3)], ..p };
        let views = check(p, w.clone(), &[("ids", &idx)], 1e-7);
        assert_eq!(views, [false, false, true, false], "{dtype}");
        // A sum over the table's rows beside the gather: a reduction loads no packed
        // elements, so the dequantize writes f32 words it reads.
        let sum = Op::Reduce { op: mgn_ir::op::ReduceOp::Sum, axes: vec![0], keepdim: false };
        steps.push(step(sum, vec![2], f, &[d]));
        steps.push(step(Op::Binary(BinaryOp::Add), vec![3, 4], f, &[ids.len(), d]));
        let p = Plan::of_steps(Mode::Infer, steps, vec![("ids".into(), 0)], vec![]);
        let p = Plan { params: vec![spec], outputs: vec![("y".into(), 5)], ..p };
        let views = check(p, w, &[("ids", &idx)], 1e-6);
        assert!(!views[2], "{dtype}: the sum needs f32 words");
    }
}

/// A q4_0 `[256, 256]` weight read by a product stays packed: the arena holds its 36,864
/// bytes, not the 262,144 of its f32 values.
#[test]
fn a_packed_weight_read_by_a_product_stays_packed_in_the_arena() {
    let f = DType::F32;
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[1, 256]),
        step(Op::Param { index: 0 }, vec![], DType::Q4_0, &[256, 256]),
        step(Op::Dequantize, vec![1], f, &[256, 256]),
        step(Op::Permute { perm: vec![1, 0] }, vec![2], f, &[256, 256]),
        step(Op::MatMul, vec![0, 3], f, &[1, 256]),
    ];
    let p = Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 4)]);
    let (spec, _) = packed_weight(DType::Q4_0, &[256, 256], 1);
    let plan = GpuPlan::of(&Plan { params: vec![spec], ..p });
    let arena = crate::memory::plan_arena(&plan);
    let bytes = arena.total_words * 4;
    assert!(bytes < 256 * 256 * 4, "{bytes} bytes");
    assert!(bytes >= 256 * 256 / 32 * 18, "{bytes} bytes");
}
