//! Element-wise fusion, a GPU session rewrite: a float element-wise step (unary, binary, unary
//! derivative, power) whose only reader is another element-wise step of the same shape is
//! computed inside that reader's kernel instead of by a dispatch of its own, so the chain runs
//! as one `Op::Fused` step — one dispatch, and its intermediate values never touch memory.
//!
//! Same shape matters: the reader's output element `i` then needs exactly element `i` of the
//! fused step, and the fused step's own inputs broadcast to the reader's shape as they did to
//! its own. A step that is a result (output, loss, gradient) or is read twice by different steps
//! keeps its own dispatch. A matrix product whose only reader is such a chain becomes the head
//! of it (`Op::MatMulEpilogue`): the chain — a bias, a residual, an activation — runs on each
//! result as the matmul kernel stores it. The CPU backend never sees fused plans; its kernels
//! are the reference the fused kernels are tested against.

use mgn_ir::op::{Elem, Op};
use mgn_ir::plan::{Plan, Step};

/// The node a fusable step contributes, given the nodes of its inputs.
fn node(op: &Op, args: &[u32]) -> Option<Elem> {
    Some(match (op, args) {
        (Op::Unary(u), [a]) => Elem::Unary(*u, *a),
        (Op::UnaryGrad(u), [a, b]) => Elem::UnaryGrad(*u, *a, *b),
        (Op::Binary(o), [a, b]) => Elem::Binary(*o, *a, *b),
        (Op::Pow { exponent }, [a]) => Elem::Pow(*exponent, *a),
        _ => return None,
    })
}

fn fusable(s: &Step) -> bool {
    s.dtype.is_float()
        && matches!(s.op, Op::Unary(_) | Op::UnaryGrad(_) | Op::Binary(_) | Op::Pow { .. })
}

/// Programs longer than this stay split: a kernel's registers and compile time grow with it.
const MAX_NODES: usize = 48;

/// `plan` with element-wise chains fused, and for each new step its index in `plan`.
pub fn fuse_elementwise(plan: &Plan) -> (Plan, Vec<u32>) {
    let n = plan.steps.len();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, s) in plan.steps.iter().enumerate() {
        for &x in &s.inputs {
            if readers[x as usize].last() != Some(&i) {
                readers[x as usize].push(i);
            }
        }
    }
    let mut result = vec![false; n];
    for v in plan
        .outputs
        .iter()
        .map(|(_, v)| *v)
        .chain(plan.loss)
        .chain(plan.grads.iter().map(|(_, v)| *v))
    {
        result[v as usize] = true;
    }
    // Per fusable step: its leaves (values it reads), its program over them, and the matrix
    // product it absorbed (one of the leaves), if any.
    let mut programs: Vec<Option<(Vec<u32>, Vec<Elem>, Option<u32>)>> = vec![None; n];
    let mut absorbed = vec![false; n];
    let mut grew = vec![false; n];
    for (i, s) in plan.steps.iter().enumerate() {
        if !fusable(s) {
            continue;
        }
        let mut leaves: Vec<u32> = Vec::new();
        let mut prog: Vec<Elem> = Vec::new();
        let mut head: Option<u32> = None;
        let mut args = Vec::with_capacity(s.inputs.len());
        // An input read twice (x · x) is inlined once and its node reused.
        let mut done: Vec<(u32, u32)> = Vec::new();
        for &x in &s.inputs {
            if let Some(&(_, node)) = done.iter().find(|(v, _)| *v == x) {
                args.push(node);
                continue;
            }
            let xs = &plan.steps[x as usize];
            let only_reader =
                readers[x as usize] == [i] && !result[x as usize] && xs.shape == s.shape;
            if only_reader && head.is_none() && matches!(xs.op, Op::MatMul) && xs.dtype.is_float() {
                head = Some(x);
                absorbed[x as usize] = true;
                grew[i] = true;
                prog.push(Elem::Input(leaf(&mut leaves, x)));
                let at = prog.len() as u32 - 1;
                done.push((x, at));
                args.push(at);
                continue;
            }
            let inline = programs[x as usize].as_ref().filter(|(_, p, h)| {
                only_reader && prog.len() + p.len() < MAX_NODES && !(h.is_some() && head.is_some())
            });
            let at = match inline {
                Some((xl, xp, xh)) => {
                    if xh.is_some() {
                        head = *xh;
                    }
                    let base = prog.len() as u32;
                    for e in xp {
                        prog.push(match e {
                            Elem::Input(k) => Elem::Input(leaf(&mut leaves, xl[*k as usize])),
                            Elem::Unary(u, a) => Elem::Unary(*u, a + base),
                            Elem::UnaryGrad(u, a, b) => Elem::UnaryGrad(*u, a + base, b + base),
                            Elem::Binary(o, a, b) => Elem::Binary(*o, a + base, b + base),
                            Elem::Pow(e, a) => Elem::Pow(*e, a + base),
                        });
                    }
                    absorbed[x as usize] = true;
                    grew[i] = true;
                    prog.len() as u32 - 1
                }
                None => {
                    prog.push(Elem::Input(leaf(&mut leaves, x)));
                    prog.len() as u32 - 1
                }
            };
            done.push((x, at));
            args.push(at);
        }
        prog.push(node(&s.op, &args).expect("fusable steps have a node"));
        programs[i] = Some((leaves, prog, head));
    }

    let mut steps = Vec::with_capacity(n);
    let mut original = Vec::with_capacity(n);
    let mut new_of = vec![u32::MAX; n];
    for (i, s) in plan.steps.iter().enumerate() {
        if absorbed[i] {
            continue;
        }
        let renumber =
            |x: u32| new_of.get(x as usize).copied().filter(|&v| v != u32::MAX).unwrap_or(x);
        let mut step = s.clone();
        match (&programs[i], grew[i]) {
            (Some((leaves, prog, Some(mm))), true) => {
                // The product is input 0 of the epilogue; the other leaves follow a and b.
                let pos = leaves.iter().position(|l| l == mm).expect("the head is a leaf") as u32;
                let order = |k: u32| {
                    if k == pos {
                        0
                    } else if k < pos {
                        k + 1
                    } else {
                        k
                    }
                };
                let program = prog
                    .iter()
                    .map(
                        |e| if let Elem::Input(k) = e { Elem::Input(order(*k)) } else { e.clone() },
                    )
                    .collect();
                step.op = Op::MatMulEpilogue { program };
                step.inputs =
                    plan.steps[*mm as usize].inputs.iter().map(|&x| renumber(x)).collect();
                step.inputs.extend(leaves.iter().filter(|l| *l != mm).map(|&x| renumber(x)));
            }
            (Some((leaves, prog, None)), true) => {
                step.op = Op::Fused { program: prog.clone() };
                step.inputs = leaves.iter().map(|&x| renumber(x)).collect();
            }
            _ => step.inputs = s.inputs.iter().map(|&x| renumber(x)).collect(),
        }
        if let Op::DropoutGrad { forward, .. } = &mut step.op {
            *forward = renumber(*forward);
        }
        new_of[i] = steps.len() as u32;
        steps.push(step);
        original.push(i as u32);
    }
    (plan.with_steps(steps, |v| new_of.get(v as usize).copied().unwrap_or(v)), original)
}

/// The index of `x` among `leaves`, added when new.
fn leaf(leaves: &mut Vec<u32>, x: u32) -> u32 {
    match leaves.iter().position(|&l| l == x) {
        Some(k) => k as u32,
        None => {
            leaves.push(x);
            leaves.len() as u32 - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::step;
    use mgn_ir::op::{BinaryOp, UnaryOp};
    use mgn_ir::plan::Mode;
    use mgn_ir::tensor::Tensor;
    use mgn_ir::DType;

    /// x → a = relu(x) → b = a · w (w broadcast from [4]) → c = b + b → y = exp(c);
    /// z = neg(a) makes a a value with two readers; y and z are the outputs.
    fn plan() -> Plan {
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[3, 4]), // 0
            step(Op::Input { name: "w".into() }, vec![], f, &[4]),    // 1
            step(Op::Unary(UnaryOp::Relu), vec![0], f, &[3, 4]),      // 2: a
            step(Op::Binary(BinaryOp::Mul), vec![2, 1], f, &[3, 4]),  // 3: b
            step(Op::Binary(BinaryOp::Add), vec![3, 3], f, &[3, 4]),  // 4: c
            step(Op::Unary(UnaryOp::Exp), vec![4], f, &[3, 4]),       // 5: y
            step(Op::Unary(UnaryOp::Neg), vec![2], f, &[3, 4]),       // 6: z
            step(Op::Pow { exponent: 2.0 }, vec![1], f, &[4]),        // 7: w², other shape
            step(Op::Binary(BinaryOp::Add), vec![6, 7], f, &[3, 4]),  // 8: z + w² (broadcast)
        ];
        Plan::of_steps(
            Mode::Infer,
            steps,
            vec![("x".into(), 0), ("w".into(), 1)],
            vec![("y".into(), 5), ("u".into(), 8)],
        )
    }

    #[test]
    fn chains_fuse_and_shared_or_reshaped_values_stay() {
        let p = plan();
        let (f, original) = fuse_elementwise(&p);
        f.validate().expect("a valid plan");
        // b and c fuse into y; z fuses into u; a stays (two readers), and so does w² (another
        // shape than its reader).
        assert_eq!(original, vec![0, 1, 2, 5, 7, 8]);
        let Op::Fused { program } = &f.steps[3].op else { panic!("{:?}", f.steps[3].op) };
        assert_eq!(f.steps[3].inputs, vec![2, 1], "y reads a and w");
        assert_eq!(program.len(), 5, "a, w, b, c (reading b twice), exp: {program:?}");
        assert_eq!(f.outputs, vec![("y".into(), 3), ("u".into(), 5)]);
        let Op::Fused { program } = &f.steps[5].op else { panic!("{:?}", f.steps[5].op) };
        assert_eq!(f.steps[5].inputs, vec![2, 4], "u reads a and w²");
        assert_eq!(program.len(), 4, "{program:?}");
        assert!(matches!(f.steps[4].op, Op::Pow { .. }));
    }

    #[test]
    fn the_fused_plan_computes_what_the_plan_does_on_the_cpu() {
        let p = plan();
        let (f, _) = fuse_elementwise(&p);
        let x = Tensor::f32(vec![3, 4], (0..12).map(|i| i as f32 * 0.3 - 1.5).collect());
        let w = Tensor::f32(vec![4], vec![0.5, -1.0, 2.0, 0.25]);
        let given = [("x", &x), ("w", &w)];
        let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
        let got = crate::test_util::run_on_cpu_plan(&f, &[], &given);
        for ((n, a), (_, b)) in got.outputs.iter().zip(&want.outputs) {
            assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{n}");
        }
    }

    #[test]
    fn results_and_dropout_references_survive() {
        // a feeds the output directly and a reader: it stays; a dropout derivative's forward
        // index is renumbered past the removed step.
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
        let (f, original) = fuse_elementwise(&p);
        f.validate().expect("a valid plan");
        assert_eq!(original, vec![0, 1, 3, 4, 5]);
        assert!(matches!(f.steps[1].op, Op::Unary(UnaryOp::Tanh)));
        assert!(matches!(f.steps[2].op, Op::Fused { .. }));
        assert_eq!(f.steps[4].op, Op::DropoutGrad { p: 0.5, forward: 3 });
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
            ..plan()
        };
        assert!(
            matches!(fuse_elementwise(&gelu).0.steps.last().map(|s| &s.op), Some(Op::Fused { program }) if program.iter().filter(|e| e.op().is_some()).count() == 5)
        );
        let x = Tensor::f32(vec![7, 5], crate::test_util::values(35, 3));
        let y = Tensor::f32(vec![5], vec![0.5, -1.0, 2.0, 0.25, 1.5]);
        let w = Tensor::f32(vec![4], vec![0.5, -1.0, 2.0, 0.25]);
        let x12 = Tensor::f32(vec![3, 4], crate::test_util::values(12, 9));
        for (p, given) in
            [(gelu, vec![("x", &x), ("y", &y)]), (plan(), vec![("x", &x12), ("w", &w)])]
        {
            let want = crate::test_util::run_on_cpu_plan(&p, &[], &given);
            let Some(mut gpu) = crate::test_util::open(p, &[]) else { return };
            let got = gpu.run(&given, 0).expect("runs on the GPU");
            for ((n, a), (_, b)) in got.outputs.iter().zip(&want.outputs) {
                crate::test_util::assert_close(&Op::Fused { program: vec![] }, a, b, 1e-5);
                assert_eq!(a.shape, b.shape, "{n}");
            }
        }
    }

    /// y = relu(a @ wᵀ + bias) + res, with w a parameter read transposed in place, for the
    /// tiled, few-column and swapped (one-row) matmul kernels: one MatMulEpilogue step.
    #[test]
    fn a_matmul_heads_its_epilogue_on_both_backends() {
        use mgn_ir::plan::InitSpec;
        use mgn_ir::plan::ParamSpec;
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
                params: vec![ParamSpec {
                    name: "w".into(),
                    dtype: f,
                    shape: vec![n, k],
                    init: InitSpec::Constant(0.0),
                    trainable: true,
                    frozen: false,
                }],
                steps,
                inputs: vec![("a".into(), 0), ("bias".into(), 4), ("res".into(), 7)],
                outputs: vec![("y".into(), 8)],
                ..plan()
            };
            let (fp, _) = fuse_elementwise(&p);
            fp.validate().expect("a valid plan");
            let last = fp.steps.last().expect("steps");
            assert!(
                matches!(&last.op, Op::MatMulEpilogue { program } if program.iter().filter(|e| e.op().is_some()).count() == 3),
                "{:?}",
                last.op
            );
            assert_eq!(fp.steps.len(), 6, "a, w, wᵀ, bias, res and the fused step");
            let a = Tensor::f32(vec![m, k], crate::test_util::values(m * k, 1));
            let w = Tensor::f32(vec![n, k], crate::test_util::values(n * k, 2));
            let bias = Tensor::f32(vec![n], crate::test_util::values(n, 3));
            let res = Tensor::f32(vec![m, n], crate::test_util::values(m * n, 4));
            let given = [("a", &a), ("bias", &bias), ("res", &res)];
            let params = std::slice::from_ref(&w);
            let want = crate::test_util::run_on_cpu_plan(&p, params, &given).outputs.remove(0).1;
            let got = crate::test_util::run_on_cpu_plan(&fp, params, &given).outputs.remove(0).1;
            crate::test_util::assert_close(&Op::MatMul, &got, &want, 1e-6);
            let Some(mut gpu) = crate::test_util::open(p, std::slice::from_ref(&w)) else {
                return;
            };
            let got = gpu.run(&given, 0).expect("runs on the GPU").outputs.remove(0).1;
            crate::test_util::assert_close(&Op::MatMul, &got, &want, 1e-4);
        }
    }
}
