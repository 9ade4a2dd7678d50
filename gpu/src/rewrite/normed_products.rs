//! Norms computed by the products that read them: a layer norm or RMS norm whose result is the
//! left operand of a matrix product by a weight becomes part of that product
//! (`GpuOp::NormedProduct`), whose kernel finds its rows' statistics and normalises A as it
//! stages it (`kernels/matmul/row_norm.rs`).
//!
//! Every transformer layer runs a norm before its attention's projections and before its
//! feed-forward: one level of its own each, with a dispatch of a few microseconds and a
//! barrier, in front of products that could have started. That is 21 of the 219 levels of
//! the U-Net's B=1 forward, 13 of MiniLM's 69, 61 of SmolLM2's 423. Where the norm has other
//! readers (post-norm BERT adds it to the next residual; training differentiates through it)
//! it stays, but runs beside the products rather than before them; otherwise it goes.
//!
//! Which products take their norm is a rule of shape, not a switch:
//!
//! - A few rows (at most `SKINNY`: one-token decoding) by a linear layer's weight read
//!   transposed always do (`decoding`). The few-columns kernel that runs them reads the whole
//!   activation in every workgroup anyway; it finds those rows' statistics in a pass of its
//!   own first (`kernels/matmul/normed_vector.rs`), a few loads an invocation over ≤ 8 × k
//!   values, against a level of ~5 µs on an H100. SmolLM2's decode plan loses 61 of its 303
//!   levels a token (`tests/plans/decode_levels.txt`).
//! - Tiled products only where `MGN_NORMED_PRODUCTS` says (`NormedProducts`). With `1` every
//!   product takes its norm, and a split one, which sees only part of each row, first finds
//!   its rows' statistics in a pass of its own: on an H100 (strict f32, 2026-12-06), when
//!   every product did so, the forwards of MiniLM, Whisper and SmolLM2 took 1.11–1.21× as long
//!   and the U-Net's B=1 1.02× — that pass, a loop of dependent loads over the tile's rows
//!   before its first panel, cost more than the level it saved (docs/benchmarks/). With
//!   `whole` only the products that walk all of k take their norms, and sum each row as its
//!   panels pass through (`kernels/matmul/panel_stats.rs`): no pass of their own. That one is
//!   untimed (docs/benchmarks/2026-12-07.md gives the A/B that decides it), so it stays an
//!   experiment's switch. Only f32 products (the tiled kernel stages A; the mixed policies'
//!   f16 products read the norm through a cast, and stay as they are) of a 2-D weight, with
//!   more rows and columns than the skinny kernels take.
//!
//! Only static plans.

use super::NormedProducts;
use crate::kernels::SKINNY;
use crate::program::{GpuOp, Program, StepId};
use mgn_ir::op::Op;
use mgn_ir::DType;

/// A product that can take a normed left operand, its layout as stored.
fn takes_normed_rows(op: &GpuOp) -> bool {
    matches!(
        op,
        GpuOp::Plan(Op::MatMul)
            | GpuOp::MatMulT { ta: false, .. }
            | GpuOp::MatMulEpilogue { ta: false, .. }
            | GpuOp::ProductPair { .. }
    )
}

/// A product of a few rows (one-token decoding) that takes its norm whatever the switch says:
/// a whole product by a linear layer's weight read transposed, unpacked, which the
/// few-columns kernel runs swapped (`kernels/matmul/normed_vector.rs`). Its workgroups each
/// find the statistics of at most `SKINNY` rows of k before their loop — a few loads an
/// invocation, where the norm's own dispatch is a level of its own before every product of
/// the layer (SmolLM2's decode: 61 of its levels a token).
fn decoding(op: &GpuOp, weight: DType) -> bool {
    let transposed = matches!(
        op,
        GpuOp::MatMulT { ta: false, tb: true, splits: 1, .. }
            | GpuOp::MatMulEpilogue { ta: false, tb: true, .. }
            | GpuOp::ProductPair { .. }
    );
    transposed && !weight.is_packed()
}

/// The columns of a product whose right operand is `b` (2-D), read transposed when `tb`.
fn columns(op: &GpuOp, b: &[usize]) -> usize {
    let tb = matches!(
        op,
        GpuOp::MatMulT { tb: true, .. }
            | GpuOp::MatMulEpilogue { tb: true, .. }
            | GpuOp::ProductPair { .. }
    );
    if tb {
        b[0]
    } else {
        b[1]
    }
}

/// Whether step `r` is a product that can take the norm of `rows` rows it reads as its left
/// operand, step `id` (the norm, or a cast of it): a few rows' always, a tiled one as `which`
/// says.
fn takes_norm(
    program: &Program,
    r: StepId,
    id: StepId,
    rows: usize,
    which: NormedProducts,
) -> bool {
    let Some(s) = program.get(r) else { return false };
    let b = s.inputs.get(1).and_then(|&b| program.get(b));
    let split = matches!(s.op, GpuOp::MatMulT { splits, .. } if splits > 1);
    let tiled = match which {
        NormedProducts::None => false,
        NormedProducts::Whole => !split,
        NormedProducts::All => true,
    };
    takes_normed_rows(&s.op)
        && s.dtype == DType::F32
        && s.inputs[0] == id
        && s.inputs[1] != id
        && b.is_some_and(|b| {
            b.shape.len() == 2
                && columns(&s.op, &b.shape) > SKINNY
                && if rows > SKINNY {
                    tiled && b.dtype == DType::F32
                } else {
                    decoding(&s.op, b.dtype)
                }
        })
}

/// Makes product `r` compute `norm` of `x` (its weight and bias `params`) itself, rounding it
/// to `rounded` first where it read the norm through that cast.
fn fold(
    program: &mut Program,
    r: StepId,
    norm: &Op,
    x: StepId,
    params: &[StepId],
    rounded: Option<DType>,
) {
    let s = program.step_mut(r);
    s.op = GpuOp::NormedProduct { norm: norm.clone(), op: Box::new(s.op.clone()), rounded };
    s.inputs[0] = x;
    s.inputs.extend(params);
}

/// Folds each row norm into the products that read it (see the module header): a few rows'
/// always, tiled products' as `which` says (split ones only with `NormedProducts::All`). A
/// mixed policy's products of a few rows read the norm through a cast to a half type (a
/// rounded view, no dispatch of its own): they take the cast too, rounding the normed value.
pub(super) fn fold_norms(program: &mut Program, which: NormedProducts) {
    let readers = super::permuted_stores::readers(program);
    let mut gone = Vec::new();
    for id in program.order().to_vec() {
        let n = program.step(id);
        if !matches!(n.op, GpuOp::Plan(Op::LayerNorm { .. } | Op::RmsNorm { .. }))
            || n.dtype != DType::F32
        {
            continue;
        }
        let GpuOp::Plan(norm) = n.op.clone() else { continue };
        let (x, params) = (n.inputs[0], n.inputs[1..].to_vec());
        let k = *n.shape.last().unwrap_or(&0);
        let rows = n.shape.iter().product::<usize>() / k.max(1);
        let shape = n.shape.clone();
        let all = readers.get(&id).cloned().unwrap_or_default();
        let mut folded = 0;
        for &r in &all {
            if takes_norm(program, r, id, rows, which) {
                fold(program, r, &norm, x, &params, None);
                folded += 1;
                continue;
            }
            // A cast to a half type that only products of a few rows read.
            let Some(c) = program.get(r) else { continue };
            let half = c.dtype;
            let cast = c.op == GpuOp::Plan(Op::Cast) && half.is_half() && c.shape == shape;
            if !cast || rows > SKINNY {
                continue;
            }
            let of_cast = readers.get(&r).cloned().unwrap_or_default();
            if !of_cast.is_empty()
                && of_cast.iter().all(|&p| takes_norm(program, p, r, rows, which))
            {
                for &p in &of_cast {
                    fold(program, p, &norm, x, &params, Some(half));
                }
                gone.push(r);
                folded += 1;
            }
        }
        // A reader that is a result (`StepId(u32::MAX)`) or any other step keeps the norm.
        if folded > 0 && folded == all.len() {
            gone.push(id);
        }
    }
    program.remove(&gone);
}

#[cfg(test)]
mod tests {
    use crate::program::GpuOp;
    use crate::rewrite::{for_gpu_with, NormedProducts, Options};
    use crate::test_util::{
        assert_rewrite_keeps_results, assert_rewrite_keeps_results_within, step, tensor,
    };
    use mgn_ir::op::{BinaryOp, Op};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;

    /// A layer norm read by a product with a bias (an epilogue) and by a plain product of a
    /// transposed weight; an RMS norm read by a product and by an add that is an output (so it
    /// stays); a norm of too few rows; and a product whose weight is the normed value itself.
    fn plan() -> Plan {
        let f = DType::F32;
        let ln = Op::LayerNorm { eps: 1e-5, has_weight: true, has_bias: true };
        let rms = Op::RmsNorm { eps: 1e-6, has_weight: true };
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[2, 20, 24]), // 0
            step(Op::Input { name: "g".into() }, vec![], f, &[24]),        // 1
            step(Op::Input { name: "beta".into() }, vec![], f, &[24]),     // 2
            step(Op::Input { name: "w".into() }, vec![], f, &[24, 40]),    // 3
            step(Op::Input { name: "b".into() }, vec![], f, &[40]),        // 4
            step(Op::Input { name: "v".into() }, vec![], f, &[36, 24]),    // 5
            step(ln, vec![0, 1, 2], f, &[2, 20, 24]),                      // 6
            step(Op::MatMul, vec![6, 3], f, &[2, 20, 40]),                 // 7
            step(Op::Binary(BinaryOp::Add), vec![7, 4], f, &[2, 20, 40]),  // 8: y0
            step(Op::Permute { perm: vec![1, 0] }, vec![5], f, &[24, 36]), // 9
            step(Op::MatMul, vec![6, 9], f, &[2, 20, 36]),                 // 10: y1
            step(rms.clone(), vec![0, 1], f, &[2, 20, 24]),                // 11
            step(Op::MatMul, vec![11, 3], f, &[2, 20, 40]),                // 12: y2
            step(Op::Binary(BinaryOp::Add), vec![11, 0], f, &[2, 20, 24]), // 13: y3
            step(Op::Input { name: "few".into() }, vec![], f, &[4, 24]),   // 14
            step(rms, vec![14, 1], f, &[4, 24]),                           // 15
            step(Op::MatMul, vec![15, 3], f, &[4, 40]),                    // 16: y4
        ];
        let names = ["x", "g", "beta", "w", "b", "v"];
        let mut inputs: Vec<(String, u32)> =
            names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect();
        inputs.push(("few".into(), 14));
        let outputs = [8, 10, 12, 13, 16].iter().enumerate();
        let outputs = outputs.map(|(i, &s)| (format!("y{i}"), s)).collect();
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
        plan.validate().expect("valid");
        plan
    }

    #[test]
    fn norms_are_computed_by_the_products_that_read_them() {
        let plan = plan();
        let all = NormedProducts::All;
        let gpu = for_gpu_with(&plan, &Options { normed_products: all, ..Options::default() });
        gpu.validate().expect("still valid");
        let count = |f: &dyn Fn(&GpuOp) -> bool| gpu.steps.iter().filter(|s| f(&s.op)).count();
        let normed = |op: &GpuOp| matches!(op, GpuOp::NormedProduct { .. });
        assert_eq!(count(&normed), 3, "{:#?}", gpu.steps);
        // The layer norm went; the RMS norm stays for the add, and so does the few rows'.
        let norms =
            |op: &GpuOp| matches!(op, GpuOp::Plan(Op::LayerNorm { .. } | Op::RmsNorm { .. }));
        assert_eq!(count(&norms), 2);
        // The bias joined the product as its epilogue, inside the normed product.
        assert!(gpu.steps.iter().any(|s| matches!(&s.op,
            GpuOp::NormedProduct { op, .. } if matches!(**op, GpuOp::MatMulEpilogue { .. }))));
        let default = for_gpu_with(&plan, &Options::default());
        assert_eq!(default.steps.iter().filter(|s| normed(&s.op)).count(), 0, "off by default");

        let x = [
            tensor(&[2, 20, 24], 1),
            tensor(&[24], 2),
            tensor(&[24], 3),
            tensor(&[24, 40], 4),
            tensor(&[40], 5),
            tensor(&[36, 24], 6),
            tensor(&[4, 24], 7),
        ];
        let names = ["x", "g", "beta", "w", "b", "v", "few"];
        let inputs: Vec<(&str, &Tensor)> = names.iter().copied().zip(x.iter()).collect();
        assert_rewrite_keeps_results(&plan, gpu, &inputs);
    }

    /// `whole` folds a norm only into products that walk all of k: the RMS norm before a
    /// product split along its 512-deep k keeps its dispatch, the layer norm before a 64-deep
    /// one goes; `1` folds both.
    #[test]
    fn whole_folds_norms_only_into_products_that_are_not_split() {
        let f = DType::F32;
        let rms = Op::RmsNorm { eps: 1e-6, has_weight: false };
        let ln = Op::LayerNorm { eps: 1e-5, has_weight: false, has_bias: false };
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[64, 512]), // 0
            step(Op::Input { name: "w".into() }, vec![], f, &[512, 64]), // 1
            step(Op::Input { name: "y".into() }, vec![], f, &[32, 64]),  // 2
            step(Op::Input { name: "u".into() }, vec![], f, &[64, 40]),  // 3
            step(rms, vec![0], f, &[64, 512]),                           // 4
            step(Op::MatMul, vec![4, 1], f, &[64, 64]),                  // 5: split
            step(ln, vec![2], f, &[32, 64]),                             // 6
            step(Op::MatMul, vec![6, 3], f, &[32, 40]),                  // 7: whole
        ];
        let inputs = ["x", "w", "y", "u"].iter().enumerate();
        let inputs = inputs.map(|(i, n)| (n.to_string(), i as u32)).collect();
        let outputs = vec![("a".into(), 5), ("b".into(), 7)];
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
        let normed = |which| {
            let gpu =
                for_gpu_with(&plan, &Options { normed_products: which, ..Options::default() });
            gpu.validate().expect("still valid");
            let split = |op: &GpuOp| matches!(op, GpuOp::MatMulT { splits, .. } if *splits > 1);
            let folded: Vec<bool> = gpu
                .steps
                .iter()
                .filter_map(|s| match &s.op {
                    GpuOp::NormedProduct { op, .. } => Some(split(op)),
                    _ => None,
                })
                .collect();
            (folded, gpu)
        };
        let (whole, gpu) = normed(NormedProducts::Whole);
        assert_eq!(whole, [false], "only the whole product takes its norm");
        let (all, _) = normed(NormedProducts::All);
        assert_eq!(all.len(), 2, "the split product takes its norm too: {all:?}");
        assert!(all.contains(&true), "one of them is split: {all:?}");
        let x = [
            tensor(&[64, 512], 1),
            tensor(&[512, 64], 2),
            tensor(&[32, 64], 3),
            tensor(&[64, 40], 4),
        ];
        let given: Vec<(&str, &Tensor)> = ["x", "w", "y", "u"].into_iter().zip(x.iter()).collect();
        // The split product adds its 512-deep sum in another order than the CPU.
        assert_rewrite_keeps_results_within(&plan, gpu, &given, (1e-5, 1e-4));
    }

    /// One-token decoding: an RMS norm of one row read by three products of transposed
    /// weights (q, k, v) goes into all three whatever the switch says, and so does a layer
    /// norm of 8 rows read by a product with a bias; a norm of 4 rows read by a weight that is
    /// not transposed keeps its dispatch (the few-rows kernel reads no norm).
    #[test]
    fn a_few_rows_take_their_norms_by_default() {
        let f = DType::F32;
        let rms = Op::RmsNorm { eps: 1e-5, has_weight: true };
        let ln = Op::LayerNorm { eps: 1e-5, has_weight: true, has_bias: true };
        let t = Op::Permute { perm: vec![1, 0] };
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[1, 1, 48]), // 0
            step(Op::Input { name: "g".into() }, vec![], f, &[48]),       // 1
            step(Op::Input { name: "wq".into() }, vec![], f, &[40, 48]),  // 2
            step(Op::Input { name: "wk".into() }, vec![], f, &[16, 48]),  // 3
            step(rms, vec![0, 1], f, &[1, 1, 48]),                        // 4
            step(t.clone(), vec![2], f, &[48, 40]),                       // 5
            step(t.clone(), vec![3], f, &[48, 16]),                       // 6
            step(Op::MatMul, vec![4, 5], f, &[1, 1, 40]),                 // 7: q
            step(Op::MatMul, vec![4, 6], f, &[1, 1, 16]),                 // 8: k
            step(Op::MatMul, vec![4, 6], f, &[1, 1, 16]),                 // 9: v
            step(Op::Input { name: "y".into() }, vec![], f, &[8, 48]),    // 10
            step(Op::Input { name: "b".into() }, vec![], f, &[40]),       // 11
            step(ln, vec![10, 1, 1], f, &[8, 48]),                        // 12
            step(Op::MatMul, vec![12, 5], f, &[8, 40]),                   // 13
            step(Op::Binary(BinaryOp::Add), vec![13, 11], f, &[8, 40]),   // 14: y
            step(Op::Input { name: "z".into() }, vec![], f, &[4, 40]),    // 15
            step(Op::RmsNorm { eps: 1e-5, has_weight: false }, vec![15], f, &[4, 40]), // 16
            step(Op::MatMul, vec![16, 5], f, &[4, 48]),                   // 17: plain w
        ];
        // Step 17 multiplies by wq's transpose's transpose: a weight read as stored.
        let mut steps = steps;
        steps[17] = step(Op::MatMul, vec![16, 2], f, &[4, 48]);
        let names = ["x", "g", "wq", "wk"];
        let mut inputs: Vec<(String, u32)> =
            names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect();
        inputs.extend([("y".into(), 10), ("b".into(), 11), ("z".into(), 15)]);
        let outputs = [7, 8, 9, 14, 17].iter().enumerate();
        let outputs = outputs.map(|(i, &s)| (format!("o{i}"), s)).collect();
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
        plan.validate().expect("valid");
        let gpu = for_gpu_with(&plan, &Options::default());
        gpu.validate().expect("still valid");
        let count = |f: &dyn Fn(&GpuOp) -> bool| gpu.steps.iter().filter(|s| f(&s.op)).count();
        let normed = |op: &GpuOp| matches!(op, GpuOp::NormedProduct { .. });
        assert_eq!(count(&normed), 4, "{:#?}", gpu.steps);
        let norms =
            |op: &GpuOp| matches!(op, GpuOp::Plan(Op::LayerNorm { .. } | Op::RmsNorm { .. }));
        assert_eq!(count(&norms), 1, "only the norm of the plain weight stays");
        let x = [
            tensor(&[1, 1, 48], 1),
            tensor(&[48], 2),
            tensor(&[40, 48], 3),
            tensor(&[16, 48], 4),
            tensor(&[8, 48], 5),
            tensor(&[40], 6),
            tensor(&[4, 40], 7),
        ];
        let names = ["x", "g", "wq", "wk", "y", "b", "z"];
        let given: Vec<(&str, &Tensor)> = names.into_iter().zip(x.iter()).collect();
        assert_rewrite_keeps_results(&plan, gpu, &given);
    }

    /// `MGN_NORMED_PRODUCTS`: unset, empty or `0` is none, `whole` the whole products, `1`
    /// all; anything else is an error naming the switch and its values.
    #[test]
    fn the_switch_reads_its_three_values() {
        let read = NormedProducts::from_env;
        for none in [None, Some(""), Some("0")] {
            assert_eq!(read(none), Ok(NormedProducts::None), "{none:?}");
        }
        assert_eq!(read(Some("whole")), Ok(NormedProducts::Whole));
        assert_eq!(read(Some("1")), Ok(NormedProducts::All));
        let e = read(Some("yes")).unwrap_err();
        assert!(e.contains("MGN_NORMED_PRODUCTS") && e.contains("whole"), "{e}");
    }
}
