//! Element-wise fusion on small plans: what fuses, what stays, and that both backends still
//! compute what the plan does.

use super::*;
use crate::test_util::run_reference;
use crate::test_util::step;
use mgn_ir::op::{BinaryOp, UnaryOp};
use mgn_ir::plan::{Mode, Plan};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

fn fused(p: &Plan) -> GpuPlan {
    let mut program = Program::new(p);
    fuse_elementwise(&mut program);
    program.to_gpu_plan()
}

fn ids(g: &GpuPlan) -> Vec<u32> {
    g.ids.iter().map(|id| id.0).collect()
}

/// x → a = relu(x) → b = a · w (w broadcast from [4]) → c = b + b → y = exp(c);
/// z = neg(a) makes a a value with two readers; y and z are the outputs. x is `[rows, 4]`.
fn plan(rows: usize) -> Plan {
    let (f, x) = (DType::F32, [rows, 4]);
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &x), // 0
        step(Op::Input { name: "w".into() }, vec![], f, &[4]), // 1
        step(Op::Unary(UnaryOp::Relu), vec![0], f, &x),      // 2: a
        step(Op::Binary(BinaryOp::Mul), vec![2, 1], f, &x),  // 3: b
        step(Op::Binary(BinaryOp::Add), vec![3, 3], f, &x),  // 4: c
        step(Op::Unary(UnaryOp::Exp), vec![4], f, &x),       // 5: y
        step(Op::Unary(UnaryOp::Neg), vec![2], f, &x),       // 6: z
        step(Op::Pow { exponent: 2.0 }, vec![1], f, &[4]),   // 7: w², other shape
        step(Op::Binary(BinaryOp::Add), vec![6, 7], f, &x),  // 8: z + w² (broadcast)
    ];
    Plan::of_steps(
        Mode::Infer,
        steps,
        vec![("x".into(), 0), ("w".into(), 1)],
        vec![("y".into(), 5), ("u".into(), 8)],
    )
}

#[test]
fn chains_fuse_and_shared_values_stay() {
    // a is larger than `SMALL`: its readers read it.
    let p = plan(SMALL / 4 + 1);
    let f = fused(&p);
    f.validate().expect("a valid plan");
    // b and c fuse into y; z and w² (a smaller shape that broadcasts to its reader's) into
    // u; a stays (two readers).
    assert_eq!(ids(&f), vec![0, 1, 2, 5, 8]);
    let GpuOp::Fused { program } = &f.steps[3].op else { panic!("{:?}", f.steps[3].op) };
    assert_eq!(f.steps[3].inputs, vec![2, 1], "y reads a and w");
    assert_eq!(program.len(), 5, "a, w, b, c (reading b twice), exp: {program:?}");
    assert_eq!(f.outputs, vec![("y".into(), 3), ("u".into(), 4)]);
    let GpuOp::Fused { program } = &f.steps[4].op else { panic!("{:?}", f.steps[4].op) };
    assert_eq!(f.steps[4].inputs, vec![2, 1], "u reads a and w, squaring w itself");
    assert_eq!(program.len(), 5, "a, neg, w, w², the sum: {program:?}");
    // At three rows a is `SMALL`: y and u compute it again and it has no kernel.
    let f = fused(&plan(3));
    assert_eq!(ids(&f), vec![0, 1, 5, 8]);
    assert!(f.steps[2..].iter().all(|s| s.inputs == [0, 1]), "both read x and w");
}

#[test]
fn the_fused_plan_computes_what_the_plan_does_on_the_cpu() {
    let p = plan(3);
    let f = fused(&p);
    let x = Tensor::f32(vec![3, 4], (0..12).map(|i| i as f32 * 0.3 - 1.5).collect());
    let w = Tensor::f32(vec![4], vec![0.5, -1.0, 2.0, 0.25]);
    let given = [("x", &x), ("w", &w)];
    let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
    let got = run_reference(&f, &[], &given);
    for ((n, a), (_, b)) in got.outputs.iter().zip(&want.outputs) {
        assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{n}");
    }
}

#[test]
fn results_and_dropout_references_survive() {
    // a feeds the output directly and a reader: it stays; a dropout derivative still names
    // its forward step by id, past the removed step.
    let f32 = DType::F32;
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f32, &[8]), // 0
        step(Op::Unary(UnaryOp::Tanh), vec![0], f32, &[8]),      // 1: output
        step(Op::Unary(UnaryOp::Neg), vec![1], f32, &[8]),       // 2 → fused into 3
        step(Op::Unary(UnaryOp::Exp), vec![2], f32, &[8]),       // 3
        step(Op::Dropout { p: 0.5 }, vec![3], f32, &[8]),        // 4
        step(Op::DropoutGrad { p: 0.5, forward: 4 }, vec![4], f32, &[8]), // 5
    ];
    let p = Plan::of_steps(
        Mode::Train,
        steps,
        vec![("x".into(), 0)],
        vec![("t".into(), 1), ("y".into(), 5)],
    );
    let f = fused(&p);
    f.validate().expect("a valid plan");
    assert_eq!(ids(&f), vec![0, 1, 3, 4, 5]);
    assert_eq!(f.steps[1].op, GpuOp::Plan(Op::Unary(UnaryOp::Tanh)));
    assert!(matches!(f.steps[2].op, GpuOp::Fused { .. }));
    assert_eq!(f.steps[4].op, GpuOp::Plan(Op::DropoutGrad { p: 0.5, forward: 4 }));
    assert_eq!(f.outputs, [("t".to_string(), 1), ("y".to_string(), 4)]);
}

#[test]
fn fused_kernels_on_the_gpu_match_the_unfused_cpu() {
    // Two chains: the plan above, and gelu → · y → sigmoid derivative → square → − y,
    // with y broadcast from [5].
    let f = DType::F32;
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[7, 5]), // 0
        step(Op::Input { name: "y".into() }, vec![], f, &[5]),    // 1
        step(Op::Unary(UnaryOp::Gelu), vec![0], f, &[7, 5]),      // 2
        step(Op::Binary(BinaryOp::Mul), vec![2, 1], f, &[7, 5]),  // 3
        step(Op::UnaryGrad(UnaryOp::Sigmoid), vec![0, 3], f, &[7, 5]), // 4
        step(Op::Pow { exponent: 2.0 }, vec![4], f, &[7, 5]),     // 5
        step(Op::Binary(BinaryOp::Sub), vec![5, 1], f, &[7, 5]),  // 6
    ];
    let gelu = Plan {
        steps,
        inputs: vec![("x".into(), 0), ("y".into(), 1)],
        outputs: vec![("o".into(), 6)],
        ..plan(3)
    };
    let last = fused(&gelu).steps.pop().expect("steps").op;
    let GpuOp::Fused { program } = last else { panic!("{last:?}") };
    assert_eq!(program.iter().filter(|e| e.op().is_some()).count(), 5, "{program:?}");
    let x = Tensor::f32(vec![7, 5], crate::test_util::values(35, 3));
    let y = Tensor::f32(vec![5], vec![0.5, -1.0, 2.0, 0.25, 1.5]);
    let w = Tensor::f32(vec![4], vec![0.5, -1.0, 2.0, 0.25]);
    let x12 = Tensor::f32(vec![3, 4], crate::test_util::values(12, 9));
    for (p, given) in [(gelu, vec![("x", &x), ("y", &y)]), (plan(3), vec![("x", &x12), ("w", &w)])]
    {
        let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
        let Some(mut gpu) = crate::test_util::open(p, &[]) else { return };
        let got = gpu.run(&given, 0).expect("runs on the GPU");
        for ((n, a), (_, b)) in got.outputs.iter().zip(&want.outputs) {
            crate::test_util::assert_close(&GpuOp::Fused { program: vec![] }, a, b, 1e-5);
            assert_eq!(a.shape, b.shape, "{n}");
        }
    }
}

/// y = relu(a @ wᵀ + bias) + res, with w a parameter read transposed in place, for the
/// tiled, few-column and swapped (one-row) matmul kernels: one MatMulEpilogue step.
#[test]
fn a_matmul_heads_its_epilogue_on_both_backends() {
    let f = DType::F32;
    for (m, k, n) in [(70, 33, 66), (1, 40, 300), (9, 20, 5)] {
        let steps = vec![
            step(Op::Input { name: "a".into() }, vec![], f, &[m, k]), // 0
            step(Op::Param { index: 0 }, vec![], f, &[n, k]),         // 1
            step(Op::Permute { perm: vec![1, 0] }, vec![1], f, &[k, n]), // 2
            step(Op::MatMul, vec![0, 2], f, &[m, n]),                 // 3
            step(Op::Input { name: "bias".into() }, vec![], f, &[n]), // 4
            step(Op::Binary(BinaryOp::Add), vec![3, 4], f, &[m, n]),  // 5
            step(Op::Unary(UnaryOp::Relu), vec![5], f, &[m, n]),      // 6
            step(Op::Input { name: "res".into() }, vec![], f, &[m, n]), // 7
            step(Op::Binary(BinaryOp::Add), vec![6, 7], f, &[m, n]),  // 8
        ];
        let p = Plan {
            params: vec![crate::test_util::weight("w", &[n, k])],
            steps,
            inputs: vec![("a".into(), 0), ("bias".into(), 4), ("res".into(), 7)],
            outputs: vec![("y".into(), 8)],
            ..plan(3)
        };
        let fp = fused(&p);
        fp.validate().expect("a valid plan");
        let last = &fp.steps.last().expect("steps").op;
        let GpuOp::MatMulEpilogue { program, .. } = last else { panic!("{last:?}") };
        assert_eq!(program.iter().filter(|e| e.op().is_some()).count(), 3, "{program:?}");
        assert_eq!(fp.steps.len(), 6, "a, w, wᵀ, bias, res and the fused step");
        let a = Tensor::f32(vec![m, k], crate::test_util::values(m * k, 1));
        let w = Tensor::f32(vec![n, k], crate::test_util::values(n * k, 2));
        let bias = Tensor::f32(vec![n], crate::test_util::values(n, 3));
        let res = Tensor::f32(vec![m, n], crate::test_util::values(m * n, 4));
        let given = [("a", &a), ("bias", &bias), ("res", &res)];
        first_output_matches_the_plan(p, &fp, std::slice::from_ref(&w), &given);
    }
}

/// The first output of `fp` (fused from `p`) on the CPU reference, and of `p` on the GPU,
/// against `p` run on the CPU: within 1e-6 and 1e-4.
fn first_output_matches_the_plan(
    p: Plan,
    fp: &GpuPlan,
    params: &[Tensor],
    given: &[(&str, &Tensor)],
) {
    let want = crate::test_util::run_on_cpu_plan(&p, params, given).outputs.remove(0).1;
    let got = run_reference(fp, params, given).outputs.remove(0).1;
    crate::test_util::assert_close(&Op::MatMul, &got, &want, 1e-6);
    let Some(mut gpu) = crate::test_util::open(p, params) else { return };
    let got = gpu.run(given, 0).expect("runs on the GPU").outputs.remove(0).1;
    crate::test_util::assert_close(&Op::MatMul, &got, &want, 1e-4);
}

/// `shortcut + h`, a residual block's sum of a product of the block's input (`x · w1`) and
/// the end of a deeper path (`relu(x · w2) · w3`): whichever order the sum names them in, the
/// deeper product heads it and the shortcut is read as a value, so the shortcut runs beside the
/// deep path's first product, not after its last. Both orders compute the plan's sum on the
/// CPU reference and on the GPU.
#[test]
fn the_deepest_product_heads_a_sum() {
    let (f, (m, k, n)) = (DType::F32, (5, 12, 8));
    for (first, second) in [(4, 7), (7, 4)] {
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[m, k]), // 0
            step(Op::Param { index: 0 }, vec![], f, &[k, n]),         // 1: w1
            step(Op::Param { index: 1 }, vec![], f, &[k, n]),         // 2: w2
            step(Op::Param { index: 2 }, vec![], f, &[n, n]),         // 3: w3
            step(Op::MatMul, vec![0, 1], f, &[m, n]),                 // 4: the shortcut
            step(Op::MatMul, vec![0, 2], f, &[m, n]),                 // 5
            step(Op::Unary(UnaryOp::Relu), vec![5], f, &[m, n]),      // 6
            step(Op::MatMul, vec![6, 3], f, &[m, n]),                 // 7: h
            step(Op::Binary(BinaryOp::Add), vec![first, second], f, &[m, n]), // 8
        ];
        let weight = crate::test_util::weight;
        let p = Plan {
            params: vec![weight("w1", &[k, n]), weight("w2", &[k, n]), weight("w3", &[n, n])],
            steps,
            inputs: vec![("x".into(), 0)],
            outputs: vec![("y".into(), 8)],
            ..plan(3)
        };
        let fp = fused(&p);
        fp.validate().expect("a valid plan");
        assert_eq!(ids(&fp), vec![0, 1, 2, 3, 4, 6, 8], "h is absorbed, the shortcut stays");
        let last = &fp.steps.last().expect("steps").op;
        assert!(matches!(last, GpuOp::MatMulEpilogue { .. }), "{last:?}");
        let at = |id: u32| fp.ids.iter().position(|i| i.0 == id).expect("kept") as u32;
        assert_eq!(
            fp.steps.last().unwrap().inputs,
            vec![at(6), at(3), at(4)],
            "relu, w3, shortcut"
        );
        let x = Tensor::f32(vec![m, k], crate::test_util::values(m * k, 1));
        let params: Vec<Tensor> = [(k, 2), (k, 3), (n, 4)]
            .iter()
            .map(|&(rows, seed)| {
                Tensor::f32(vec![rows, n], crate::test_util::values(rows * n, seed))
            })
            .collect();
        first_output_matches_the_plan(p, &fp, &params, &[("x", &x)]);
    }
}

/// Depth counts dispatches: of `(x · w1) · w3 + neg(relu(x · w2)) · w4`, two products deep on
/// both sides — the second's element-wise steps run in its first product's kernel — the product
/// the sum names first heads it, in either order. The head moves only where a level is saved:
/// counted by steps, the backward of SmolLM2's SwiGLU moved 30 heads for no level and grew its
/// training arena 665 → 739 MiB.
#[test]
fn products_as_deep_in_dispatches_keep_the_order_the_sum_names() {
    let (f, (m, k, n)) = (DType::F32, (5, 12, 8));
    for (first, second) in [(6, 10), (10, 6)] {
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[m, k]), // 0
            step(Op::Param { index: 0 }, vec![], f, &[k, n]),         // 1: w1
            step(Op::Param { index: 1 }, vec![], f, &[k, n]),         // 2: w2
            step(Op::Param { index: 2 }, vec![], f, &[n, n]),         // 3: w3
            step(Op::Param { index: 3 }, vec![], f, &[n, n]),         // 4: w4
            step(Op::MatMul, vec![0, 1], f, &[m, n]),                 // 5
            step(Op::MatMul, vec![5, 3], f, &[m, n]),                 // 6
            step(Op::MatMul, vec![0, 2], f, &[m, n]),                 // 7
            step(Op::Unary(UnaryOp::Relu), vec![7], f, &[m, n]),      // 8
            step(Op::Unary(UnaryOp::Neg), vec![8], f, &[m, n]),       // 9
            step(Op::MatMul, vec![9, 4], f, &[m, n]),                 // 10
            step(Op::Binary(BinaryOp::Add), vec![first, second], f, &[m, n]), // 11
        ];
        let weight = crate::test_util::weight;
        let p = Plan {
            params: vec![
                weight("w1", &[k, n]),
                weight("w2", &[k, n]),
                weight("w3", &[n, n]),
                weight("w4", &[n, n]),
            ],
            steps,
            inputs: vec![("x".into(), 0)],
            outputs: vec![("y".into(), 11)],
            ..plan(3)
        };
        let fp = fused(&p);
        fp.validate().expect("a valid plan");
        // relu and neg became x · w2's epilogue (step 9).
        let mut kept = vec![0, 1, 2, 3, 4, 5, 9, second, 11];
        kept.sort();
        assert_eq!(ids(&fp), kept, "the product named second is read as a value");
    }
}

/// silu(group_norm(x)) + res (the U-Net's norm and activation, with a residual), gelu of
/// a layer norm without weights, an RMS norm scaled by a broadcast gate, and a group norm
/// also read by a second step (it keeps its own dispatch): the first three become one
/// `NormEpilogue` step each, on the CPU reference and on the GPU (rows shorter and longer
/// than a workgroup).
#[test]
fn norms_head_their_epilogues_on_both_backends() {
    let f = DType::F32;
    let gn = |affine| Op::GroupNorm { groups: 2, eps: 1e-5, has_weight: affine, has_bias: affine };
    let ln = Op::LayerNorm { eps: 1e-5, has_weight: false, has_bias: false };
    let rms = Op::RmsNorm { eps: 1e-6, has_weight: true };
    for len in [6, 300] {
        let x = [2, 4, len];
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &x), // 0
            step(Op::Input { name: "w".into() }, vec![], f, &[4]), // 1
            step(Op::Input { name: "b".into() }, vec![], f, &[4]), // 2
            step(Op::Input { name: "res".into() }, vec![], f, &x), // 3
            step(Op::Input { name: "g".into() }, vec![], f, &[len]), // 4
            step(gn(true), vec![0, 1, 2], f, &x),                // 5
            step(Op::Unary(UnaryOp::Silu), vec![5], f, &x),      // 6
            step(Op::Binary(BinaryOp::Add), vec![6, 3], f, &x),  // 7: y0
            step(ln.clone(), vec![0], f, &x),                    // 8
            step(Op::Unary(UnaryOp::Gelu), vec![8], f, &x),      // 9: y1
            step(rms.clone(), vec![0, 4], f, &x),                // 10
            step(Op::Binary(BinaryOp::Mul), vec![10, 4], f, &x), // 11: y2
            step(gn(false), vec![3], f, &x),                     // 12: also y3
            step(Op::Unary(UnaryOp::Tanh), vec![12], f, &x),     // 13: y4
        ];
        let names = ["x", "w", "b", "res", "g"];
        let p = Plan {
            steps,
            inputs: names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect(),
            outputs: [7, 9, 11, 12, 13].iter().map(|&i| (format!("y{i}"), i)).collect(),
            ..plan(3)
        };
        p.validate().expect("valid");
        let fp = fused(&p);
        fp.validate().expect("a valid plan");
        let heads: Vec<String> = (fp.steps.iter())
            .filter(|s| matches!(s.op, GpuOp::NormEpilogue { .. }))
            .map(|s| s.op.describe())
            .collect();
        assert_eq!(heads.len(), 3, "{heads:?}");
        assert!(heads[0].starts_with("group_norm_epilogue") && heads[0].contains("silu"));
        assert!(fp.steps.iter().any(|s| s.op == GpuOp::Plan(gn(false))), "a result stays");
        let t = crate::test_util::tensor;
        let v = [t(&x, 1), t(&[4], 2), t(&[4], 3), t(&x, 4), t(&[len], 5)];
        let given: Vec<(&str, &Tensor)> = names.into_iter().zip(&v).collect();
        let want = crate::test_util::run_on_cpu_plan(&p, &[], &given).outputs;
        let got = run_reference(&fp, &[], &given).outputs;
        for ((n, a), (_, b)) in got.iter().zip(&want) {
            crate::test_util::assert_close(&GpuOp::Plan(gn(true)), a, b, 1e-6);
            assert_eq!(a.shape, b.shape, "{n}");
        }
        let Some(mut gpu) = crate::test_util::open(p, &[]) else { return };
        let got = gpu.run(&given, 0).expect("runs on the GPU").outputs;
        for ((n, a), (_, b)) in got.iter().zip(&want) {
            crate::test_util::assert_close(&GpuOp::Plan(gn(true)), a, b, 1e-5);
            assert_eq!(a.shape, b.shape, "{n}");
        }
    }
}

/// relu(batch_norm(x) + res) in a training plan (batch statistics): one `NormEpilogue`
/// step, on the CPU reference and on the GPU; in an inference plan the batch norm is
/// element-wise and stays out of it.
#[test]
fn a_training_batch_norm_heads_its_epilogue_on_both_backends() {
    let f = DType::F32;
    let bn = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: true, has_bias: true };
    let (x, c) = ([3, 5, 7, 9], [5]);
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &x), // 0
        step(Op::Input { name: "rm".into() }, vec![], f, &c), // 1
        step(Op::Input { name: "rv".into() }, vec![], f, &c), // 2
        step(Op::Input { name: "w".into() }, vec![], f, &c), // 3
        step(Op::Input { name: "b".into() }, vec![], f, &c), // 4
        step(Op::Input { name: "res".into() }, vec![], f, &x), // 5
        step(bn.clone(), vec![0, 1, 2, 3, 4], f, &x),        // 6
        step(Op::Binary(BinaryOp::Add), vec![6, 5], f, &x),  // 7
        step(Op::Unary(UnaryOp::Relu), vec![7], f, &x),      // 8
    ];
    let names = ["x", "rm", "rv", "w", "b", "res"];
    let inputs: Vec<(String, u32)> =
        names.iter().enumerate().map(|(i, n)| (n.to_string(), i as u32)).collect();
    let train = Plan::of_steps(Mode::Train, steps, inputs, vec![("y".into(), 8)]);
    let infer = Plan { mode: Mode::Infer, ..train.clone() };
    let heads = |p: &Plan| {
        let fp = fused(p);
        fp.validate().expect("a valid plan");
        fp.steps.iter().filter(|s| matches!(s.op, GpuOp::NormEpilogue { .. })).count()
    };
    assert_eq!((heads(&train), heads(&infer)), (1, 0));
    let t = crate::test_util::tensor;
    let rv = Tensor::f32(c.to_vec(), vec![1.5; 5]);
    let v = [t(&x, 1), t(&c, 2), rv, t(&c, 3), t(&c, 4), t(&x, 5)];
    let given: Vec<(&str, &Tensor)> = names.into_iter().zip(&v).collect();
    let want = crate::test_util::run_on_cpu_plan(&train, &[], &given).outputs.remove(0).1;
    let got = run_reference(&fused(&train), &[], &given).outputs.remove(0).1;
    crate::test_util::assert_close(&GpuOp::Plan(bn.clone()), &got, &want, 1e-6);
    let Some(mut gpu) = crate::test_util::open(train, &[]) else { return };
    let got = gpu.run(&given, 0).expect("runs on the GPU").outputs.remove(0).1;
    crate::test_util::assert_close(&GpuOp::Plan(bn), &got, &want, 1e-4);
}

/// x · sigmoid(a @ w) with the product [2, 5] broadcast into x [3, 2, 5] (a gate per row,
/// as FiLM-style conditioning writes it): the product heads its sigmoid at its own shape,
/// and the larger multiply stays a step of its own — an epilogue runs once per product
/// element, so it cannot make the larger result.
#[test]
fn a_headed_chain_is_not_inlined_into_a_larger_reader() {
    let f = DType::F32;
    let steps = vec![
        step(Op::Input { name: "a".into() }, vec![], f, &[2, 4]), // 0
        step(Op::Input { name: "w".into() }, vec![], f, &[4, 5]), // 1
        step(Op::MatMul, vec![0, 1], f, &[2, 5]),                 // 2
        step(Op::Unary(UnaryOp::Sigmoid), vec![2], f, &[2, 5]),   // 3
        step(Op::Input { name: "x".into() }, vec![], f, &[3, 2, 5]), // 4
        step(Op::Binary(BinaryOp::Mul), vec![4, 3], f, &[3, 2, 5]), // 5
    ];
    let p = Plan::of_steps(
        Mode::Infer,
        steps,
        vec![("a".into(), 0), ("w".into(), 1), ("x".into(), 4)],
        vec![("y".into(), 5)],
    );
    let g = fused(&p);
    g.validate().expect("a valid plan");
    assert!(g.steps.iter().any(|s| matches!(s.op, GpuOp::MatMulEpilogue { .. })));
    assert!(matches!(g.steps.last().expect("steps").op, GpuOp::Plan(Op::Binary(_))));
    let a = Tensor::f32(vec![2, 4], crate::test_util::values(8, 1));
    let w = Tensor::f32(vec![4, 5], crate::test_util::values(20, 2));
    let x = Tensor::f32(vec![3, 2, 5], crate::test_util::values(30, 3));
    let given = [("a", &a), ("w", &w), ("x", &x)];
    let want = crate::test_util::run_on_cpu_plan(&p, &[], &given).outputs.remove(0).1;
    let got = run_reference(&g, &[], &given).outputs.remove(0).1;
    crate::test_util::assert_close(&Op::MatMul, &got, &want, 1e-6);
    if let Some(mut gpu) = crate::test_util::open(p, &[]) {
        let y = gpu.run(&given, 0).expect("runs").outputs.remove(0).1;
        crate::test_util::assert_close(&Op::MatMul, &y, &want, 1e-5);
    }
}

/// relu6 as std.nn writes it, `where(x >= 6, 6, relu(x))`, and a `where` on a mask that
/// is an input: the comparison is computed inside the selection's kernel, so each is one
/// step, and the fused plan computes what the plan does.
#[test]
fn comparisons_fuse_into_the_where_that_reads_them() {
    use mgn_ir::op::CompareOp;
    let (f, b) = (DType::F32, DType::Bool);
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[2, 5]), // 0
        step(Op::Input { name: "m".into() }, vec![], b, &[5]),    // 1
        step(Op::Constant { value: 6.0 }, vec![], f, &[]),        // 2
        step(Op::Compare(CompareOp::Ge), vec![0, 2], b, &[2, 5]), // 3
        step(Op::Unary(UnaryOp::Relu), vec![0], f, &[2, 5]),      // 4
        step(Op::Where, vec![3, 2, 4], f, &[2, 5]),               // 5: relu6
        step(Op::Unary(UnaryOp::Exp), vec![0], f, &[2, 5]),       // 6
        step(Op::Where, vec![1, 6, 5], f, &[2, 5]),               // 7
    ];
    let p = Plan::of_steps(
        Mode::Infer,
        steps,
        vec![("x".into(), 0), ("m".into(), 1)],
        vec![("y".into(), 7)],
    );
    let g = fused(&p);
    g.validate().expect("a valid plan");
    assert_eq!(ids(&g), vec![0, 1, 2, 7], "one step computes both selections");
    let GpuOp::Fused { program } = &g.steps[3].op else { panic!("{:?}", g.steps[3].op) };
    assert!(program.iter().any(|e| matches!(e, Elem::Compare(CompareOp::Ge, ..))));
    let x = Tensor::f32(vec![2, 5], vec![-1.0, 3.0, 6.0, 7.5, 0.5, 9.0, -2.0, 6.5, 2.0, 1.0]);
    let m = Tensor { dtype: b, shape: vec![5], data: mgn_ir::Data::I32(vec![1, 0, 0, 1, 0]) };
    let given = [("x", &x), ("m", &m)];
    let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
    let got = run_reference(&g, &[], &given);
    assert_eq!(got.outputs[0].1.to_f64_vec(), want.outputs[0].1.to_f64_vec());
    if let Some(mut gpu) = crate::test_util::open(p, &[]) {
        let y = gpu.run(&given, 0).expect("runs").outputs.remove(0).1;
        crate::test_util::assert_close(&Op::Where, &y, &want.outputs[0].1, 1e-6);
    }
}

/// A sinusoidal embedding's frequencies, `exp(cast(arange(8)) · c) · t`, then `sin`: the
/// arange, its cast and the constant become nodes of one program (`Elem::Index`,
/// `Elem::Const`), which reads only `t`; both backends compute what the plan does.
#[test]
fn counted_indices_and_constants_are_written_into_the_program() {
    let (f, i32) = (DType::F32, DType::I32);
    let steps = vec![
        step(Op::Input { name: "t".into() }, vec![], f, &[1]), // 0
        step(Op::Arange, vec![], i32, &[8]),                   // 1
        step(Op::Cast, vec![1], f, &[8]),                      // 2
        step(Op::Constant { value: -0.57 }, vec![], f, &[]),   // 3
        step(Op::Binary(BinaryOp::Mul), vec![2, 3], f, &[8]),  // 4
        step(Op::Unary(UnaryOp::Exp), vec![4], f, &[8]),       // 5
        step(Op::Binary(BinaryOp::Mul), vec![5, 0], f, &[8]),  // 6
        step(Op::Unary(UnaryOp::Sin), vec![6], f, &[8]),       // 7
    ];
    let p = Plan::of_steps(Mode::Infer, steps, vec![("t".into(), 0)], vec![("y".into(), 7)]);
    let g = fused(&p);
    g.validate().expect("a valid plan");
    assert_eq!(ids(&g), vec![0, 7], "one kernel from the index on");
    let GpuOp::Fused { program } = &g.steps[1].op else { panic!("{:?}", g.steps[1].op) };
    assert_eq!(g.steps[1].inputs, vec![0], "it reads t alone");
    assert!(program.contains(&Elem::Index) && program.contains(&Elem::Const(-0.57)));
    let t = Tensor::f32(vec![1], vec![3.25]);
    crate::test_util::assert_rewrite_keeps_results(&p, g, &[("t", &t)]);
}

/// The index stays at its own shape: a chain holding one is not computed inside a reader
/// of a larger shape (its index there would be the reader's element), and an arange read
/// twice, or as a result, keeps its own kernel.
#[test]
fn an_index_is_never_broadcast() {
    let (f, i32) = (DType::F32, DType::I32);
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[3, 4]), // 0
        step(Op::Arange, vec![], i32, &[4]),                      // 1
        step(Op::Cast, vec![1], f, &[4]),                         // 2: [4]
        step(Op::Unary(UnaryOp::Exp), vec![2], f, &[4]),          // 3
        step(Op::Binary(BinaryOp::Add), vec![0, 3], f, &[3, 4]),  // 4: broadcast
        step(Op::Arange, vec![], i32, &[4]),                      // 5: also a result
        step(Op::Cast, vec![5], f, &[4]),                         // 6
    ];
    let outputs = vec![("y".into(), 4), ("n".into(), 5), ("c".into(), 6)];
    let p = Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], outputs);
    let g = fused(&p);
    g.validate().expect("a valid plan");
    assert_eq!(ids(&g), vec![0, 3, 4, 5, 6], "exp(index) is its own kernel; 5 is kept");
    let x = Tensor::f32(vec![3, 4], (0..12).map(|i| i as f32 * 0.25).collect());
    crate::test_util::assert_rewrite_keeps_results(&p, g, &[("x", &x)]);
}

/// `a = t · w` read by `sin` and `cos`: each computes `a` again (it is `SMALL`), so `a` has
/// no kernel and the sum of both is one; `b`, read also by a reduction, keeps its own;
/// `c`, past `SMALL`, is read, not computed again.
#[test]
fn small_chains_are_computed_again_by_each_reader() {
    let f = DType::F32;
    let big = [SMALL + 1];
    let sum = Op::Reduce { op: mgn_ir::op::ReduceOp::Sum, axes: vec![0], keepdim: false };
    let steps = vec![
        step(Op::Input { name: "t".into() }, vec![], f, &[1]), // 0
        step(Op::Input { name: "w".into() }, vec![], f, &[6]), // 1
        step(Op::Binary(BinaryOp::Mul), vec![0, 1], f, &[6]),  // 2: a
        step(Op::Unary(UnaryOp::Sin), vec![2], f, &[6]),       // 3
        step(Op::Unary(UnaryOp::Cos), vec![2], f, &[6]),       // 4
        step(Op::Binary(BinaryOp::Add), vec![3, 4], f, &[6]),  // 5: y
        step(Op::Unary(UnaryOp::Exp), vec![1], f, &[6]),       // 6: b
        step(Op::Unary(UnaryOp::Neg), vec![6], f, &[6]),       // 7: z
        step(sum, vec![6], f, &[]),                            // 8: s
        step(Op::Input { name: "v".into() }, vec![], f, &big), // 9
        step(Op::Unary(UnaryOp::Exp), vec![9], f, &big),       // 10: c
        step(Op::Unary(UnaryOp::Sin), vec![10], f, &big),      // 11
        step(Op::Unary(UnaryOp::Cos), vec![10], f, &big),      // 12
        step(Op::Binary(BinaryOp::Add), vec![11, 12], f, &big), // 13: u
    ];
    let inputs = vec![("t".into(), 0), ("w".into(), 1), ("v".into(), 9)];
    let outputs = ["y", "z", "s", "u"].iter().zip([5, 7, 8, 13]);
    let outputs = outputs.map(|(n, i)| (n.to_string(), i)).collect();
    let p = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
    let g = fused(&p);
    g.validate().expect("a valid plan");
    assert_eq!(ids(&g), vec![0, 1, 5, 6, 7, 8, 9, 10, 13]);
    let t = Tensor::f32(vec![1], vec![0.75]);
    let w = Tensor::f32(vec![6], vec![0.5, -1.0, 2.0, 0.25, 3.0, -2.5]);
    let v = Tensor::f32(big.to_vec(), (0..big[0]).map(|i| (i % 7) as f32 * 0.1).collect());
    let given = [("t", &t), ("w", &w), ("v", &v)];
    crate::test_util::assert_rewrite_keeps_results(&p, g, &given);
}
