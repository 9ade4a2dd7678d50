//! Element-wise fusion: a float element-wise step (unary, binary, unary derivative, power,
//! `where`, and a comparison of floats feeding a `where`) whose only reader is another
//! element-wise step of the same shape is computed inside that reader's
//! kernel instead of by a dispatch of its own, so the chain runs as one `GpuOp::Fused` step —
//! one dispatch, and its intermediate values never touch memory.
//!
//! Same shape matters: the reader's output element `i` then needs exactly element `i` of the
//! fused step, and the fused step's own inputs broadcast to the reader's shape as they did to
//! its own. A step that is a result (output, loss, gradient) or is read twice by different steps
//! keeps its own dispatch. A matrix product or a convolution whose only reader is such a chain
//! becomes the head of it (`GpuOp::MatMulEpilogue`, `GpuOp::ConvEpilogue`): the chain — a bias,
//! an inference batch norm, a residual, an activation — runs on each result as the product's
//! kernel stores it. So does a layer, RMS or group norm, and a training plan's batch norm
//! (`GpuOp::NormEpilogue`: the U-Net's SiLU after each group norm, ResNet-50's ReLU after
//! each batch norm but those of the residual sums).
//!
//! The decisions need the program's def-use in execution order, so fusion reads a dense
//! snapshot of the program ([`GpuPlan`]); its edits go back to the program by step id.

use crate::program::{Elem, GpuOp, GpuPlan, Program, Step, StepId};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;
use mgn_ir::DType;

/// The node a fusable step contributes, given the nodes of its inputs.
fn node(op: &GpuOp, args: &[u32]) -> Option<Elem> {
    Some(match (op.plan_op()?, args) {
        (Op::Unary(u), [a]) => Elem::Unary(*u, *a),
        (Op::UnaryGrad(u), [a, b]) => Elem::UnaryGrad(*u, *a, *b),
        (Op::Binary(o), [a, b]) => Elem::Binary(*o, *a, *b),
        (Op::Pow { exponent }, [a]) => Elem::Pow(*exponent, *a),
        (Op::Compare(c), [a, b]) => Elem::Compare(*c, *a, *b),
        (Op::Where, [c, a, b]) => Elem::Where(*c, *a, *b),
        _ => return None,
    })
}

/// An f32 element-wise step; or a comparison of floats, which is only ever inlined into the
/// `where` that reads it (its `bool` result is no float chain's value); or an `arange` cast to
/// f32 (`index_cast`). Half-typed steps stay apart: each rounds its own result, as the CPU
/// reference does.
fn fusable(view: &GpuPlan, def_use: &DefUse, i: usize) -> bool {
    let s = &view.steps[i];
    let float = matches!(
        s.op.plan_op(),
        Some(Op::Unary(_) | Op::UnaryGrad(_) | Op::Binary(_) | Op::Pow { .. } | Op::Where)
    );
    let floats = s.inputs.iter().all(|&x| view.steps[x as usize].dtype.is_float());
    (s.dtype == mgn_ir::DType::F32 && float)
        || (matches!(s.op.plan_op(), Some(Op::Compare(_))) && floats)
        || index_cast(view, def_use, i).is_some()
}

/// The `arange` that `s` casts to f32 when `s` is its only reader: the chain computes each
/// element's value from its index (`Elem::Index`), and neither step is dispatched. The
/// sinusoidal embeddings of the U-Net's and SmolVLA's timesteps start so, two levels ahead of
/// their first product.
fn index_cast(view: &GpuPlan, def_use: &DefUse, i: usize) -> Option<u32> {
    let s = &view.steps[i];
    let (GpuOp::Plan(Op::Cast), &[x]) = (&s.op, s.inputs.as_slice()) else { return None };
    let arange = &view.steps[x as usize];
    let counts = arange.op == GpuOp::Plan(Op::Arange) && arange.shape == s.shape;
    let only = def_use.only_reader(x as usize) == Some(i) && !def_use.result[x as usize];
    (s.dtype == DType::F32 && counts && only && s.shape.len() == 1).then_some(x)
}

/// The value of an f32 constant step, which a chain writes into its program (`Elem::Const`)
/// instead of reading it.
fn constant(s: &Step<u32>) -> Option<f64> {
    match s.op.plan_op() {
        Some(Op::Constant { value }) if s.dtype == DType::F32 => Some(*value),
        _ => None,
    }
}

/// Programs longer than this stay split: a kernel's registers and compile time grow with it.
const MAX_NODES: usize = 48;

/// What fusion makes of one element-wise step: the values it reads (`leaves`, positions), its
/// program over them, and the matrix product it absorbed (one of the leaves), if any.
#[derive(Clone, Default)]
struct Chain {
    leaves: Vec<u32>,
    program: Vec<Elem>,
    head: Option<u32>,
}

impl Chain {
    /// The node reading `x` as a leaf (the index of `x` among the leaves, added when new).
    fn leaf(&mut self, x: u32) -> u32 {
        let k = match self.leaves.iter().position(|&l| l == x) {
            Some(k) => k,
            None => {
                self.leaves.push(x);
                self.leaves.len() - 1
            }
        };
        self.push(Elem::Input(k as u32))
    }

    /// Appends `e`; its node index.
    fn push(&mut self, e: Elem) -> u32 {
        self.program.push(e);
        self.program.len() as u32 - 1
    }

    /// Appends `other`'s program, its leaves mapped to this chain's; the node of its result.
    fn inline(&mut self, other: &Chain) -> u32 {
        let base = self.program.len() as u32;
        for e in &other.program {
            let e = match e {
                Elem::Input(k) => {
                    self.leaf(other.leaves[*k as usize]);
                    continue;
                }
                Elem::Unary(u, a) => Elem::Unary(*u, a + base),
                Elem::UnaryGrad(u, a, b) => Elem::UnaryGrad(*u, a + base, b + base),
                Elem::Binary(o, a, b) => Elem::Binary(*o, a + base, b + base),
                Elem::Pow(e, a) => Elem::Pow(*e, a + base),
                Elem::Compare(c, a, b) => Elem::Compare(*c, a + base, b + base),
                Elem::Where(c, a, b) => Elem::Where(c + base, a + base, b + base),
                Elem::Const(_) | Elem::Index => e.clone(),
            };
            self.push(e);
        }
        self.program.len() as u32 - 1
    }

    /// The fused op and its inputs (positions). With a head, the product (or convolution) is
    /// input 0 of the epilogue, the head's operands come first, and the other leaves follow.
    fn into_step(self, view: &GpuPlan) -> (GpuOp, Vec<u32>) {
        let Some(mm) = self.head else {
            return (GpuOp::Fused { program: self.program }, self.leaves);
        };
        let pos = self.leaves.iter().position(|&l| l == mm).expect("the head is a leaf") as u32;
        let order = |k: u32| match k.cmp(&pos) {
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Less => k + 1,
            std::cmp::Ordering::Greater => k,
        };
        let program = self
            .program
            .into_iter()
            .map(|e| if let Elem::Input(k) = e { Elem::Input(order(k)) } else { e })
            .collect();
        let head = &view.steps[mm as usize];
        let mut inputs = head.inputs.clone();
        inputs.extend(self.leaves.iter().filter(|&&l| l != mm));
        let op = match head.op.plan_op() {
            Some(conv @ Op::Conv { .. }) => GpuOp::ConvEpilogue { conv: conv.clone(), program },
            Some(norm) if crate::program::norm_operands(norm).is_ok() => {
                GpuOp::NormEpilogue { norm: norm.clone(), program }
            }
            _ => GpuOp::MatMulEpilogue { program, ta: false, tb: false },
        };
        (op, inputs)
    }
}

/// Fusion's state over a snapshot of the program, by position.
struct Fusion<'a> {
    view: &'a GpuPlan,
    def_use: DefUse,
    /// Per fusable step: its chain so far.
    chains: Vec<Option<Chain>>,
    /// Steps computed inside their reader's chain (removed from the program).
    absorbed: Vec<bool>,
    /// Steps whose chain absorbed another step (their op becomes the chain).
    grew: Vec<bool>,
}

impl Fusion<'_> {
    /// The chain of the fusable step `i`, over its inputs' chains.
    fn chain(&mut self, i: usize) -> Chain {
        let view = self.view;
        let s = &view.steps[i];
        let mut c = Chain::default();
        if let Some(arange) = index_cast(view, &self.def_use, i) {
            (self.absorbed[arange as usize], self.grew[i]) = (true, true);
            c.push(Elem::Index);
            return c;
        }
        let mut args = Vec::with_capacity(s.inputs.len());
        // An input read twice (x · x) is inlined once and its node reused.
        let mut done: Vec<(u32, u32)> = Vec::new();
        // A comparison's chain absorbs nothing: it is kept only when a `where` inlines it.
        let compare = matches!(s.op.plan_op(), Some(Op::Compare(_)));
        for &x in &s.inputs {
            let at = match done.iter().find(|(v, _)| *v == x) {
                Some(&(_, node)) => node,
                None if compare => c.leaf(x),
                None => self.input_node(i, x, &mut c),
            };
            done.push((x, at));
            args.push(at);
        }
        c.push(node(&s.op, &args).expect("fusable steps have a node"));
        c
    }

    /// The node of `c` holding input `x` of step `i`: when `i` is `x`'s only reader and has its
    /// shape, a matrix product becomes the chain's head and an element-wise chain is inlined;
    /// anything else is a leaf.
    fn input_node(&mut self, i: usize, x: u32, c: &mut Chain) -> u32 {
        let (xi, view) = (x as usize, self.view);
        let xs = &view.steps[xi];
        if let Some(value) = constant(xs) {
            // Written back even if it absorbs nothing else: it no longer reads the constant.
            self.grew[i] = true;
            return c.push(Elem::Const(value));
        }
        let only = self.def_use.only_reader(xi) == Some(i);
        let only_reader = only && xs.shape == view.steps[i].shape;
        // A chain of a smaller shape that broadcasts to its reader's is computed at each of the
        // reader's elements: its leaves broadcast to the reader's shape as they did to its own.
        let broadcast =
            only && mgn_ir::shape::broadcast_strides(&xs.shape, &view.steps[i].shape).is_ok();
        let product = matches!(xs.op, GpuOp::Plan(Op::MatMul | Op::Conv { .. }));
        // A batch norm with batch statistics (a training plan's: an inference plan's are
        // element-wise, `running_norms`) runs the same row kernel.
        let training = view.mode == mgn_ir::plan::Mode::Train;
        let norm = match &xs.op {
            GpuOp::Plan(Op::BatchNorm { .. }) => training,
            GpuOp::Plan(op) => crate::program::norm_operands(op).is_ok(),
            _ => false,
        };
        let head = (product && xs.dtype.is_float()) || (norm && xs.dtype == DType::F32);
        if only_reader && c.head.is_none() && head {
            c.head = Some(x);
            (self.absorbed[xi], self.grew[i]) = (true, true);
            return c.leaf(x);
        }
        // A chain headed by a product stays at the product's shape: its kernel computes one
        // epilogue per product element.
        // An index is its own element's: a chain holding one is inlined only at its shape.
        let inline = self.chains[xi].as_ref().filter(|xc| {
            let indexed = xc.program.contains(&Elem::Index);
            (if xc.head.is_some() || indexed { only_reader } else { broadcast })
                && c.program.len() + xc.program.len() < MAX_NODES
                && !(xc.head.is_some() && c.head.is_some())
        });
        let Some(xc) = inline else { return c.leaf(x) };
        if xc.head.is_some() {
            c.head = xc.head;
        }
        let at = c.inline(xc);
        (self.absorbed[xi], self.grew[i]) = (true, true);
        at
    }
}

/// Fuses every element-wise chain of `program` (see the module header).
pub(super) fn fuse_elementwise(program: &mut Program) {
    let view = program.to_gpu_plan();
    let n = view.steps.len();
    let mut f = Fusion {
        view: &view,
        def_use: DefUse::of(&view),
        chains: vec![None; n],
        absorbed: vec![false; n],
        grew: vec![false; n],
    };
    for i in 0..n {
        if fusable(&view, &f.def_use, i) {
            f.chains[i] = Some(f.chain(i));
        }
    }
    // A constant every reader of which writes it into its program is no longer read.
    let inlined = |i: usize| {
        let (readers, compare) = (&f.def_use.readers[i], |r: &u32| {
            matches!(view.steps[*r as usize].op.plan_op(), Some(Op::Compare(_)))
        });
        constant(&view.steps[i]).is_some()
            && !f.def_use.result[i]
            && readers.iter().all(|r| f.chains[*r as usize].is_some() && !compare(r))
    };
    for i in 0..n {
        if inlined(i) {
            f.absorbed[i] = true;
        }
    }
    let id = |pos: u32| view.ids[pos as usize];
    for (i, chain) in f.chains.into_iter().enumerate() {
        let Some(chain) = chain.filter(|_| f.grew[i] && !f.absorbed[i]) else { continue };
        let (op, inputs) = chain.into_step(&view);
        let step = program.step_mut(view.ids[i]);
        step.op = op;
        step.inputs = inputs.into_iter().map(id).collect();
    }
    let absorbed: Vec<StepId> = (0..n).filter(|&i| f.absorbed[i]).map(|i| view.ids[i]).collect();
    program.remove(&absorbed);
}

#[cfg(test)]
mod tests {
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
    fn chains_fuse_and_shared_values_stay() {
        let p = plan();
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
    }

    #[test]
    fn the_fused_plan_computes_what_the_plan_does_on_the_cpu() {
        let p = plan();
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
            ..plan()
        };
        let last = fused(&gelu).steps.pop().expect("steps").op;
        let GpuOp::Fused { program } = last else { panic!("{last:?}") };
        assert_eq!(program.iter().filter(|e| e.op().is_some()).count(), 5, "{program:?}");
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
                crate::test_util::assert_close(&GpuOp::Fused { program: vec![] }, a, b, 1e-5);
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
                    persistent: true,
                }],
                steps,
                inputs: vec![("a".into(), 0), ("bias".into(), 4), ("res".into(), 7)],
                outputs: vec![("y".into(), 8)],
                ..plan()
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
            let params = std::slice::from_ref(&w);
            let want = crate::test_util::run_on_cpu_plan(&p, params, &given).outputs.remove(0).1;
            let got = run_reference(&fp, params, &given).outputs.remove(0).1;
            crate::test_util::assert_close(&Op::MatMul, &got, &want, 1e-6);
            let Some(mut gpu) = crate::test_util::open(p, std::slice::from_ref(&w)) else {
                return;
            };
            let got = gpu.run(&given, 0).expect("runs on the GPU").outputs.remove(0).1;
            crate::test_util::assert_close(&Op::MatMul, &got, &want, 1e-4);
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
        let gn =
            |affine| Op::GroupNorm { groups: 2, eps: 1e-5, has_weight: affine, has_bias: affine };
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
                ..plan()
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
}
