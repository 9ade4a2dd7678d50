//! Packed weights in larger plans against the CPU reference, each test one device opening
//! (some drivers refuse after many openings in one process): every packed type's products in
//! every shape at once (the matrix-vector kernel at one row and at eight folded from a batch,
//! tiled, split along k, plain, batched), a tied embedding (a lookup of packed rows and the
//! head's product over the same table), an element-wise reader in place, and the readers that
//! get the `Dequantize` kernel's f32 values (a reduction, top-k), whose values are the IR's
//! bit for bit.

use crate::program::{GpuOp, GpuPlan};
use crate::test_util::{open, run_on_cpu_plan, step, values};
use mgn_ir::dtype::PACKED;
use mgn_ir::op::{BinaryOp, Op, ReduceOp};
use mgn_ir::plan::{InitSpec, Mode, ParamSpec, Plan, Step};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

/// A plan under construction: its steps, inputs with their values, packed parameters with
/// theirs, and outputs.
#[derive(Default)]
struct Builder {
    steps: Vec<Step>,
    inputs: Vec<(String, u32, Tensor)>,
    params: Vec<(ParamSpec, Tensor)>,
    outputs: Vec<(String, u32)>,
}

impl Builder {
    fn push(&mut self, s: Step) -> u32 {
        self.steps.push(s);
        self.steps.len() as u32 - 1
    }

    /// An input of `shape` holding `values`.
    fn given(&mut self, t: Tensor) -> u32 {
        let name = format!("x{}", self.steps.len());
        let at = self.push(step(Op::Input { name: name.clone() }, vec![], t.dtype, &t.shape));
        self.inputs.push((name, at, t));
        at
    }

    /// An f32 input of `shape` with deterministic values.
    fn input(&mut self, shape: &[usize]) -> u32 {
        let v = values(shape.iter().product(), self.steps.len() as u32 * 7 + 1);
        self.given(Tensor::f32(shape.to_vec(), v))
    }

    /// A frozen parameter of packed `dtype` and `shape` (values quantized from a spread of
    /// magnitudes), and its `Dequantize`.
    fn packed(&mut self, dtype: DType, shape: &[usize]) -> u32 {
        let p = self.param(dtype, shape);
        self.push(step(Op::Dequantize, vec![p], DType::F32, shape))
    }

    /// A frozen parameter of packed `dtype` and `shape`.
    fn param(&mut self, dtype: DType, shape: &[usize]) -> u32 {
        let index = self.params.len();
        let n: usize = shape.iter().product();
        let scale = 1.0 + (index % 3) as f32;
        let v: Vec<f32> = values(n, index as u32 * 13 + 5).iter().map(|x| x * scale).collect();
        let spec = ParamSpec {
            name: format!("w{index}"),
            dtype,
            shape: shape.to_vec(),
            init: InitSpec::Constant(0.0),
            trainable: false,
            frozen: true,
            persistent: true,
        };
        self.params.push((spec, Tensor::quantized(dtype, shape.to_vec(), &v)));
        self.push(step(Op::Param { index }, vec![], dtype, shape))
    }

    /// `a` with its last two axes swapped.
    fn transposed(&mut self, a: u32) -> u32 {
        let mut shape = self.steps[a as usize].shape.clone();
        let r = shape.len();
        shape.swap(r - 2, r - 1);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.push(step(Op::Permute { perm }, vec![a], DType::F32, &shape))
    }

    fn output(&mut self, s: Step) -> u32 {
        let at = self.push(s);
        self.outputs.push((format!("y{at}"), at));
        at
    }

    /// `a @ b` as an output.
    fn product(&mut self, a: u32, b: u32) -> u32 {
        let (sa, sb) = (&self.steps[a as usize].shape, &self.steps[b as usize].shape);
        let mut shape = sa[..sa.len() - 1].to_vec();
        shape.push(sb[sb.len() - 1]);
        self.output(step(Op::MatMul, vec![a, b], DType::F32, &shape))
    }

    fn plan(&self) -> (Plan, Vec<Tensor>) {
        let inputs = self.inputs.iter().map(|(n, at, _)| (n.clone(), *at)).collect();
        let plan = Plan::of_steps(Mode::Infer, self.steps.clone(), inputs, self.outputs.clone());
        let params = self.params.iter().map(|(p, _)| p.clone()).collect();
        (Plan { params, ..plan }, self.params.iter().map(|(_, t)| t.clone()).collect())
    }

    /// Runs the plan on the GPU (None without a device) and on the CPU reference: every
    /// output within `tol` in relative L2 norm, a `Dequantize` result exactly. The GPU's plan.
    fn check(&self, tol: f64) -> Option<GpuPlan> {
        let (plan, params) = self.plan();
        let given: Vec<(&str, &Tensor)> =
            self.inputs.iter().map(|(n, _, t)| (n.as_str(), t)).collect();
        let want = run_on_cpu_plan(&plan, &params, &given).outputs;
        let mut gpu = open(plan, &params)?;
        let got = gpu.run(&given, 0).expect("runs").outputs;
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            let at: usize = name[1..].parse().unwrap();
            let what = format!("{:?} {:?}", self.steps[at].op, self.steps[at].shape);
            assert_eq!(g.shape, w.shape, "{what}");
            let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
            if self.steps[at].op == Op::Dequantize {
                assert_eq!(g, w, "{what}: decoded as the IR decodes, bit for bit");
            }
            let err: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            let norm: f64 = w.iter().map(|b| b * b).sum::<f64>().sqrt();
            assert!(err <= tol * norm, "{what}: relative L2 error {}", err / norm);
        }
        Some(gpu.plan.clone())
    }
}

/// The block length of `dtype`.
fn block(dtype: DType) -> usize {
    dtype.block().expect("packed").0
}

/// Whether each `Dequantize` of `plan` is read in place (a view of its parameter's blocks).
fn in_place(plan: &GpuPlan) -> Vec<(u32, bool)> {
    let views = crate::memory::ReadViews::of(plan);
    let steps = plan.steps.iter().enumerate();
    steps
        .filter(|(_, s)| s.op == GpuOp::Plan(Op::Dequantize))
        .map(|(i, _)| (plan.ids[i].0, views.packed[i].is_some()))
        .collect()
}

/// `x[m, k] @ dequantize(w[n, k])ᵀ` at m = 1, 37 (tiled; split along k where k is deep) and,
/// for blocks of 32, a batch of 2 × 4 rows folded into 8 (the matrix-vector kernel's most), at
/// k a multiple of 256 and, for blocks of 32, k = 96; then `x @ dequantize(w[k, n])` (blocks
/// along n) and products of batched packed weights read transposed. (The matrix-vector kernel
/// of a 256-value block unrolls the block's values for each row: at 8 rows lavapipe takes
/// about 30 s to compile one, so the k-quants are read by one row here.)
fn products(dtype: DType, b: &mut Builder) {
    let ks: &[usize] = if block(dtype) == 32 { &[256, 96] } else { &[256] };
    for &k in ks {
        let w = b.packed(dtype, &[40, k]);
        let wt = b.transposed(w);
        for m in [1, 37] {
            let x = b.input(&[m, k]);
            b.product(x, wt);
        }
        if block(dtype) == 32 {
            let x = b.input(&[2, 4, k]);
            b.product(x, wt);
        }
    }
    let w = b.packed(dtype, &[24, block(dtype) * 2]);
    for m in [1, 37] {
        let x = b.input(&[m, 24]);
        b.product(x, w);
    }
    let w = b.packed(dtype, &[3, 20, block(dtype)]);
    let wt = b.transposed(w);
    for m in [2, 19] {
        let x = b.input(&[3, m, block(dtype)]);
        b.product(x, wt);
    }
}

#[test]
fn every_product_of_packed_weights_in_one_plan_matches_the_cpu() {
    let mut b = Builder::default();
    for dtype in PACKED {
        products(dtype, &mut b);
    }
    let Some(plan) = b.check(1e-6) else { return };
    for (id, viewed) in in_place(&plan) {
        assert!(viewed, "step {id}: products read packed weights in place");
    }
}

/// A tied embedding (rows gathered, and the head's product over the same table), an add of a
/// dequantized weight (element-wise: in place), a sum and top-k over one (f32 words from the
/// `Dequantize` kernel), and a `Dequantize` that is a result (its own words).
#[test]
fn lookups_and_other_readers_of_packed_weights_match_the_cpu() {
    let mut b = Builder::default();
    let mut computed = Vec::new();
    for dtype in PACKED {
        let d = block(dtype) * 2;
        let table = b.packed(dtype, &[11, d]);
        let ids = b.given(Tensor::i32(vec![5], vec![3, 0, 10, 3, 7]));
        let e = b.output(step(Op::Gather { axis: 0 }, vec![table, ids], DType::F32, &[5, d]));
        let head = b.transposed(table);
        b.product(e, head);
        let w = b.packed(dtype, &[3, d]);
        let x = b.input(&[3, d]);
        b.output(step(Op::Binary(BinaryOp::Add), vec![w, x], DType::F32, &[3, d]));
        let w = b.packed(dtype, &[2, d]);
        computed.push(w);
        let sum = Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdim: false };
        b.output(step(sum, vec![w], DType::F32, &[2]));
        b.output(step(Op::TopK { k: 3, axis: 1 }, vec![w], DType::I32, &[2, 3]));
        let p = b.param(dtype, &[3, d]);
        computed.push(b.output(step(Op::Dequantize, vec![p], DType::F32, &[3, d])));
    }
    let Some(plan) = b.check(1e-6) else { return };
    for (id, viewed) in in_place(&plan) {
        assert_eq!(viewed, !computed.contains(&id), "step {id}");
    }
}
