//! Kernel tests: every derivative against central finite differences in f64, and forward values
//! against hand-computed ones or direct formulas.

use super::*;
use mgn_ir::op::{BinaryOp, GradPart, PoolOp, ReduceOp, UnaryOp};

// ---- helpers ----------------------------------------------------------------------------------

/// A small deterministic generator (splitmix64), seeded per test.
struct Rng(u64);

impl Rng {
    fn new(seed: &str) -> Rng {
        Rng(seed
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn tensor(&mut self, shape: &[usize], lo: f64, hi: f64) -> Tensor {
        let n = shape.iter().product();
        Tensor::f64(shape.to_vec(), (0..n).map(|_| self.uniform(lo, hi)).collect())
    }
    fn t(&mut self, shape: &[usize]) -> Tensor {
        self.tensor(shape, -1.0, 1.0)
    }
    fn index(&mut self, shape: &[usize], below: usize) -> Tensor {
        let n = shape.iter().product();
        Tensor::i32(shape.to_vec(), (0..n).map(|_| (self.next() % below as u64) as i32).collect())
    }
}

const TRAIN: Ctx = Ctx { training: true, seed: 7, node: 3 };
const INFER: Ctx = Ctx { training: false, seed: 7, node: 3 };

fn ev_ctx(op: &Op, inputs: &[&Tensor], shape: &[usize], ctx: &Ctx) -> Tensor {
    let dtype = if inputs.iter().any(|t| !matches!(t.data, Data::I32(_))) || inputs.is_empty() {
        DType::F32
    } else {
        DType::I32
    };
    eval(op, inputs, dtype, shape, ctx).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs one op in training mode (float result).
fn ev(op: &Op, inputs: &[&Tensor], shape: &[usize]) -> Tensor {
    ev_ctx(op, inputs, shape, &TRAIN)
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    f64s(a).iter().zip(f64s(b)).map(|(x, y)| x * y).sum()
}

/// Checks `grad(inputs, dy)` against central differences of `⟨dy, f(inputs)⟩` with respect to
/// every element of input `wrt` (f64 storage, random upstream gradient `dy`).
fn check_grad(
    name: &str,
    inputs: &[Tensor],
    wrt: usize,
    f: &dyn Fn(&[Tensor]) -> Tensor,
    grad: &dyn Fn(&[Tensor], &Tensor) -> Tensor,
) {
    let mut rng = Rng::new(name);
    let y = f(inputs);
    let dy = rng.t(&y.shape);
    let dx = grad(inputs, &dy);
    assert_eq!(dx.shape, inputs[wrt].shape, "{name}: gradient shape");
    let analytic = f64s(&dx);
    let h = 1e-5;
    let mut numeric = Vec::new();
    for e in 0..inputs[wrt].numel() {
        let at = |delta: f64| {
            let mut xs = inputs.to_vec();
            let Data::F64(v) = &mut xs[wrt].data else { panic!("{name}: input {wrt} must be f64") };
            v[e] += delta;
            dot(&dy, &f(&xs))
        };
        numeric.push((at(h) - at(-h)) / (2.0 * h));
    }
    assert_close(&analytic, &numeric, 1e-6, &format!("{name} (d input {wrt})"));
}

/// [`check_grad`] of a single op, with the derivative computed by `grad`.
fn check_op(
    name: &str,
    op: &Op,
    inputs: &[Tensor],
    shape: &[usize],
    wrt: usize,
    grad: &dyn Fn(&[Tensor], &Tensor) -> Tensor,
) {
    check_op_ctx(name, op, inputs, shape, wrt, &TRAIN, grad)
}

fn check_op_ctx(
    name: &str,
    op: &Op,
    inputs: &[Tensor],
    shape: &[usize],
    wrt: usize,
    ctx: &Ctx,
    grad: &dyn Fn(&[Tensor], &Tensor) -> Tensor,
) {
    let f = |xs: &[Tensor]| ev_ctx(op, &xs.iter().collect::<Vec<_>>(), shape, ctx);
    check_grad(name, inputs, wrt, &f, grad);
}

/// The derivative op's inputs: the forward inputs, then `dy`.
fn with_dy<'a>(xs: &'a [Tensor], dy: &'a Tensor) -> Vec<&'a Tensor> {
    xs.iter().chain([dy]).collect()
}

// ---- pointwise derivatives ------------------------------------------------------------------

const UNARY: [UnaryOp; 15] = [
    UnaryOp::Neg,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Silu,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Abs,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Square,
];

#[test]
fn unary_grads() {
    for u in UNARY {
        let name = format!("{u:?}");
        let positive = matches!(u, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt);
        let x = Rng::new(&name).tensor(&[3, 5], if positive { 0.2 } else { -2.0 }, 2.0);
        check_op(&name, &Op::Unary(u), &[x], &[3, 5], 0, &|xs, dy| {
            ev(&Op::UnaryGrad(u), &[&xs[0], dy], &[3, 5])
        });
    }
}

#[test]
fn pow_grad() {
    for p in [2.0, 3.0, 0.5, -1.5] {
        let x = Rng::new("pow").tensor(&[2, 3], 0.3, 2.0);
        // d/dx x^p = p·x^(p−1): composed as autodiff would, with an F32 constant.
        check_op(&format!("pow {p}"), &Op::Pow { exponent: p }, &[x], &[2, 3], 0, &|xs, dy| {
            let lower = ev(&Op::Pow { exponent: p - 1.0 }, &[&xs[0]], &[2, 3]);
            let c = ev(&Op::Constant { value: p }, &[], &[]);
            let d = ev(&Op::Binary(BinaryOp::Mul), &[&lower, &c], &[2, 3]);
            ev(&Op::Binary(BinaryOp::Mul), &[dy, &d], &[2, 3])
        });
    }
}

fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    layout::broadcast_shapes(a, b).unwrap()
}

#[test]
fn binary_grads_with_broadcasting() {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[3, 4], &[3, 4]),
        (&[2, 3, 4], &[4]),
        (&[2, 1, 4], &[3, 1]),
        (&[], &[2, 3]),
        (&[2, 3], &[1]),
    ];
    for (sa, sb) in cases {
        let out = broadcast(sa, sb);
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            let mut rng = Rng::new("binary");
            let a = rng.t(sa);
            let b = if op == BinaryOp::Div { rng.tensor(sb, 0.5, 1.5) } else { rng.t(sb) };
            let name = format!("{op:?} {sa:?} {sb:?}");
            let bin = |o, x: &Tensor, y: &Tensor| {
                ev(&Op::Binary(o), &[x, y], &broadcast(&x.shape, &y.shape))
            };
            let sum_to = |t: &Tensor, s: &[usize]| ev(&Op::SumTo, &[t], s);
            let out2 = out.clone();
            check_op(
                &name,
                &Op::Binary(op),
                &[a.clone(), b.clone()],
                &out,
                0,
                &|xs, dy| match op {
                    BinaryOp::Add | BinaryOp::Sub => sum_to(dy, sa),
                    BinaryOp::Mul => sum_to(&bin(BinaryOp::Mul, dy, &xs[1]), sa),
                    BinaryOp::Div => sum_to(&bin(BinaryOp::Div, dy, &xs[1]), sa),
                },
            );
            check_op(&name, &Op::Binary(op), &[a, b], &out2, 1, &|xs, dy| match op {
                BinaryOp::Add => sum_to(dy, sb),
                BinaryOp::Sub => sum_to(&ev(&Op::Unary(UnaryOp::Neg), &[dy], &dy.shape), sb),
                BinaryOp::Mul => sum_to(&bin(BinaryOp::Mul, dy, &xs[0]), sb),
                BinaryOp::Div => {
                    // −dy·a/b²
                    let b2 = bin(BinaryOp::Mul, &xs[1], &xs[1]);
                    let q = bin(BinaryOp::Div, &xs[0], &b2);
                    let g = bin(BinaryOp::Mul, dy, &q);
                    sum_to(&ev(&Op::Unary(UnaryOp::Neg), &[&g], &g.shape), sb)
                }
            });
        }
    }
}

#[test]
fn cast_grad_is_a_cast_back() {
    let x = Rng::new("cast").t(&[2, 3]);
    check_op("cast", &Op::Cast, &[x], &[2, 3], 0, &|_, dy| ev(&Op::Cast, &[dy], &[2, 3]));
}

#[test]
fn broadcast_to_and_sum_to_are_adjoint() {
    let x = Rng::new("bt").t(&[3, 1]);
    check_op("broadcast_to", &Op::BroadcastTo, &[x], &[2, 3, 4], 0, &|_, dy| {
        ev(&Op::SumTo, &[dy], &[3, 1])
    });
    let y = Rng::new("st").t(&[2, 3, 4]);
    check_op("sum_to", &Op::SumTo, &[y], &[3, 1], 0, &|_, dy| {
        ev(&Op::BroadcastTo, &[dy], &[2, 3, 4])
    });
}

#[test]
fn dropout_grad_uses_the_forward_mask() {
    let x = Rng::new("dropout").t(&[4, 9]);
    let op = Op::Dropout { p: 0.3 };
    check_op("dropout", &op, &[x], &[4, 9], 0, &|_, dy| {
        ev(&Op::DropoutGrad { p: 0.3, forward: TRAIN.node }, &[dy], &[4, 9])
    });
}

// ---- matmul and movement ----------------------------------------------------------------------

fn swap_last_two(rank: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(rank - 2, rank - 1);
    p
}

fn transpose(t: &Tensor) -> Tensor {
    let r = t.shape.len();
    let mut s = t.shape.clone();
    s.swap(r - 2, r - 1);
    ev(&Op::Permute { perm: swap_last_two(r) }, &[t], &s)
}

fn matmul_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let a2 = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2 = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let mut out = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    if a.len() > 1 {
        out.push(a2[a2.len() - 2]);
    }
    if b.len() > 1 {
        out.push(b2[b2.len() - 1]);
    }
    out
}

/// The matmul derivative as autodiff composes it: promote 1-D operands, `dA = dy·Bᵀ`,
/// `dB = Aᵀ·dy`, summed down to the operand's (promoted) shape, then reshaped back.
fn matmul_grad(xs: &[Tensor], dy: &Tensor, wrt: usize) -> Tensor {
    let (a, b) = (&xs[0], &xs[1]);
    let promote = |t: &Tensor, s: Vec<usize>| ev(&Op::Reshape, &[t], &s);
    let a2 = if a.shape.len() == 1 { promote(a, vec![1, a.shape[0]]) } else { a.clone() };
    let b2 = if b.shape.len() == 1 { promote(b, vec![b.shape[0], 1]) } else { b.clone() };
    let full = matmul_shape(&a2.shape, &b2.shape);
    let dy2 = promote(dy, full.clone());
    let (target, g) = if wrt == 0 {
        let bt = transpose(&b2);
        (a2.shape.clone(), ev(&Op::MatMul, &[&dy2, &bt], &matmul_shape(&dy2.shape, &bt.shape)))
    } else {
        let at = transpose(&a2);
        (b2.shape.clone(), ev(&Op::MatMul, &[&at, &dy2], &matmul_shape(&at.shape, &dy2.shape)))
    };
    let summed = ev(&Op::SumTo, &[&g], &target);
    promote(&summed, xs[wrt].shape.clone())
}

#[test]
fn matmul_grads_with_broadcasting_and_vectors() {
    let cases: [(&[usize], &[usize]); 9] = [
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[4], &[4, 5]),
        (&[3, 4], &[4]),
        (&[4], &[4]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[4], &[2, 4, 3]),
    ];
    for (sa, sb) in cases {
        let mut rng = Rng::new("matmul");
        let (a, b) = (rng.t(sa), rng.t(sb));
        let out = matmul_shape(sa, sb);
        for wrt in 0..2 {
            check_op(
                &format!("matmul {sa:?} {sb:?}"),
                &Op::MatMul,
                &[a.clone(), b.clone()],
                &out,
                wrt,
                &|xs, dy| matmul_grad(xs, dy, wrt),
            );
        }
    }
}

#[test]
fn movement_grads() {
    let mut rng = Rng::new("movement");
    let x = rng.t(&[2, 3, 4]);
    check_op(
        "permute",
        &Op::Permute { perm: vec![2, 0, 1] },
        std::slice::from_ref(&x),
        &[4, 2, 3],
        0,
        &|_, dy| ev(&Op::Permute { perm: vec![1, 2, 0] }, &[dy], &[2, 3, 4]),
    );
    check_op("reshape", &Op::Reshape, std::slice::from_ref(&x), &[6, 4], 0, &|_, dy| {
        ev(&Op::Reshape, &[dy], &[2, 3, 4])
    });
    check_op(
        "slice",
        &Op::Slice { axis: 1, start: 1, end: 3 },
        std::slice::from_ref(&x),
        &[2, 2, 4],
        0,
        &|_, dy| ev(&Op::SliceGrad { axis: 1, start: 1, end: 3 }, &[dy], &[2, 3, 4]),
    );
    check_op(
        "slice last",
        &Op::Slice { axis: 2, start: 3, end: 4 },
        &[x],
        &[2, 3, 1],
        0,
        &|_, dy| ev(&Op::SliceGrad { axis: 2, start: 3, end: 4 }, &[dy], &[2, 3, 4]),
    );

    let parts = [rng.t(&[2, 3]), rng.t(&[2, 1]), rng.t(&[2, 4])];
    let starts = [0, 3, 4, 8];
    for wrt in 0..3 {
        check_op("concat", &Op::Concat { axis: 1 }, &parts, &[2, 8], wrt, &|_, dy| {
            ev(
                &Op::Slice { axis: 1, start: starts[wrt], end: starts[wrt + 1] },
                &[dy],
                &[2, starts[wrt + 1] - starts[wrt]],
            )
        });
    }
}

#[test]
fn gather_grads_accumulate_repeated_indices() {
    let mut rng = Rng::new("gather");
    let table = rng.t(&[5, 3]);
    let ids = Tensor::i32(vec![2, 3], vec![4, 0, 4, 1, 4, 0]);
    check_op(
        "embedding",
        &Op::Gather { axis: 0 },
        &[table, ids.clone()],
        &[2, 3, 3],
        0,
        &|_, dy| ev(&Op::GatherGrad { axis: 0 }, &[&ids, dy], &[5, 3]),
    );
    let x = rng.t(&[2, 4, 3]);
    let idx = rng.index(&[5], 4);
    check_op(
        "gather axis 1",
        &Op::Gather { axis: 1 },
        &[x, idx.clone()],
        &[2, 5, 3],
        0,
        &|_, dy| ev(&Op::GatherGrad { axis: 1 }, &[&idx, dy], &[2, 4, 3]),
    );
}

// ---- reductions, softmax, loss ------------------------------------------------------------------

fn reduced(shape: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    (0..shape.len())
        .filter_map(|i| if axes.contains(&i) { keepdim.then_some(1) } else { Some(shape[i]) })
        .collect()
}

#[test]
fn reduce_grads() {
    let x = Rng::new("reduce").t(&[3, 4, 5]);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for axes in [vec![1], vec![0, 2], vec![0, 1, 2], vec![]] {
            for keepdim in [false, true] {
                let out = reduced(&x.shape, &axes, keepdim);
                let fwd = Op::Reduce { op, axes: axes.clone(), keepdim };
                let back = Op::ReduceGrad { op, axes: axes.clone(), keepdim };
                check_op(
                    &format!("{op:?} {axes:?} {keepdim}"),
                    &fwd,
                    std::slice::from_ref(&x),
                    &out,
                    0,
                    &|xs, dy| {
                        let y = ev(&fwd, &[&xs[0]], &out);
                        ev(&back, &[&xs[0], &y, dy], &xs[0].shape)
                    },
                );
            }
        }
    }
}

#[test]
fn softmax_grads() {
    let x = Rng::new("softmax").tensor(&[3, 4, 5], -3.0, 3.0);
    for axis in 0..3 {
        for log in [false, true] {
            let op = Op::Softmax { axis, log };
            check_op(
                &format!("softmax {axis} {log}"),
                &op,
                std::slice::from_ref(&x),
                &[3, 4, 5],
                0,
                &|xs, dy| {
                    let y = ev(&op, &[&xs[0]], &[3, 4, 5]);
                    ev(&Op::SoftmaxGrad { axis, log }, &[&y, dy], &[3, 4, 5])
                },
            );
        }
    }
}

#[test]
fn cross_entropy_grad() {
    let mut rng = Rng::new("ce");
    for (logits, targets) in [
        (rng.tensor(&[4, 5], -3.0, 3.0), rng.index(&[4], 5)),
        (rng.t(&[2, 3, 4]), rng.index(&[2, 3], 4)),
        (rng.t(&[3]), Tensor::i32(vec![], vec![2])),
    ] {
        let t = targets.clone();
        let shape = logits.shape.clone();
        check_op(
            "cross_entropy",
            &Op::SoftmaxCrossEntropy,
            &[logits, targets],
            &[],
            0,
            &|xs, dy| ev(&Op::SoftmaxCrossEntropyGrad, &[&xs[0], &t, dy], &shape),
        );
    }
}

// ---- normalization ----------------------------------------------------------------------------

/// Checks every part of a norm: inputs `x` then the present weight and bias.
fn check_norm(
    name: &str,
    fwd: &Op,
    grad: &dyn Fn(GradPart) -> Op,
    inputs: &[Tensor],
    parts: &[GradPart],
    ctx: &Ctx,
) {
    let shape = inputs[0].shape.clone();
    for (wrt, &part) in parts.iter().enumerate() {
        let g = grad(part);
        let want = inputs[wrt].shape.clone();
        check_op_ctx(&format!("{name} {part:?}"), fwd, inputs, &shape, wrt, ctx, &|xs, dy| {
            ev_ctx(&g, &with_dy(xs, dy), &want, ctx)
        });
    }
}

/// The parts of a norm with these optional inputs, in input order.
fn parts(has_weight: bool, has_bias: bool) -> Vec<GradPart> {
    let mut p = vec![GradPart::Input];
    if has_weight {
        p.push(GradPart::Weight);
    }
    if has_bias {
        p.push(GradPart::Bias);
    }
    p
}

#[test]
fn layer_and_rms_norm_grads() {
    let mut rng = Rng::new("norms");
    for x_shape in [vec![3, 7], vec![2, 3, 5]] {
        let d = *x_shape.last().unwrap();
        for (has_weight, has_bias) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut inputs = vec![rng.t(&x_shape)];
            if has_weight {
                inputs.push(rng.tensor(&[d], 0.5, 1.5));
            }
            if has_bias {
                inputs.push(rng.t(&[d]));
            }
            let eps = 1e-5;
            check_norm(
                "layer_norm",
                &Op::LayerNorm { eps, has_weight, has_bias },
                &|part| Op::LayerNormGrad { eps, has_weight, has_bias, part },
                &inputs,
                &parts(has_weight, has_bias),
                &TRAIN,
            );
            if !has_bias {
                check_norm(
                    "rms_norm",
                    &Op::RmsNorm { eps, has_weight },
                    &|part| Op::RmsNormGrad { eps, has_weight, part },
                    &inputs,
                    &parts(has_weight, false),
                    &TRAIN,
                );
            }
        }
    }
}

#[test]
fn group_norm_grads() {
    let mut rng = Rng::new("group_norm");
    for (x_shape, groups) in
        [(vec![2, 6, 5], 3), (vec![2, 6, 5], 1), (vec![2, 4, 3, 3], 2), (vec![3, 4], 4)]
    {
        let c = x_shape[1];
        for (has_weight, has_bias) in [(false, false), (true, true)] {
            let mut inputs = vec![rng.t(&x_shape)];
            if has_weight {
                inputs.push(rng.tensor(&[c], 0.5, 1.5));
                inputs.push(rng.t(&[c]));
            }
            let eps = 1e-5;
            check_norm(
                &format!("group_norm {x_shape:?}/{groups}"),
                &Op::GroupNorm { groups, eps, has_weight, has_bias },
                &|part| Op::GroupNormGrad { groups, eps, has_weight, has_bias, part },
                &inputs,
                &parts(has_weight, has_bias),
                &TRAIN,
            );
        }
    }
}

#[test]
fn batch_norm_grads_in_training_and_inference() {
    let mut rng = Rng::new("batch_norm");
    for x_shape in [vec![4, 3, 5], vec![6, 3], vec![2, 3, 2, 3]] {
        for (has_weight, has_bias) in [(false, false), (true, true), (true, false)] {
            let mut inputs = vec![rng.t(&x_shape), rng.t(&[3]), rng.tensor(&[3], 0.5, 2.0)];
            if has_weight {
                inputs.push(rng.tensor(&[3], 0.5, 1.5));
            }
            if has_bias {
                inputs.push(rng.t(&[3]));
            }
            let eps = 1e-5;
            let fwd = Op::BatchNorm { eps, momentum: 0.1, has_weight, has_bias };
            // Parts in input order, skipping the running statistics (never differentiated).
            let ps = parts(has_weight, has_bias);
            for (ctx, training) in [(&TRAIN, true), (&INFER, false)] {
                let shape = x_shape.clone();
                for (k, &part) in ps.iter().enumerate() {
                    let wrt = if k == 0 { 0 } else { 2 + k };
                    let g = Op::BatchNormGrad { eps, has_weight, has_bias, part, training };
                    let want = inputs[wrt].shape.clone();
                    check_op_ctx(
                        &format!("batch_norm {x_shape:?} {part:?} training={training}"),
                        &fwd,
                        &inputs,
                        &shape,
                        wrt,
                        ctx,
                        &|xs, dy| ev_ctx(&g, &with_dy(xs, dy), &want, ctx),
                    );
                }
            }
        }
    }
}

// ---- convolution, pooling, upsampling -----------------------------------------------------------

struct ConvCase {
    x: Vec<usize>,
    w: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    dilation: Vec<usize>,
    groups: usize,
}

fn conv_cases() -> Vec<ConvCase> {
    let case = |x: &[usize],
                w: &[usize],
                stride: &[usize],
                padding: &[usize],
                dilation: &[usize],
                groups| ConvCase {
        x: x.to_vec(),
        w: w.to_vec(),
        stride: stride.to_vec(),
        padding: padding.to_vec(),
        dilation: dilation.to_vec(),
        groups,
    };
    vec![
        case(&[2, 4, 9], &[6, 2, 3], &[2], &[1], &[2], 2),
        case(&[1, 3, 5], &[2, 3, 1], &[1], &[0], &[1], 1),
        case(&[1, 3, 5, 5], &[2, 3, 3, 3], &[1, 1], &[1, 1], &[1, 1], 1),
        case(&[2, 4, 7, 6], &[4, 2, 3, 2], &[2, 1], &[1, 0], &[1, 2], 2),
        case(&[3, 2, 4, 5], &[4, 1, 2, 3], &[1, 2], &[0, 1], &[2, 1], 2),
    ]
}

impl ConvCase {
    fn out_shape(&self) -> Vec<usize> {
        let mut s = vec![self.x[0], self.w[0]];
        for a in 0..self.stride.len() {
            let span = self.dilation[a] * (self.w[2 + a] - 1) + 1;
            s.push((self.x[2 + a] + 2 * self.padding[a] - span) / self.stride[a] + 1);
        }
        s
    }
    fn op(&self, has_bias: bool) -> Op {
        Op::Conv {
            stride: self.stride.clone(),
            padding: self.padding.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
            has_bias,
        }
    }
    fn grad_input(&self) -> Op {
        Op::ConvGradInput {
            stride: self.stride.clone(),
            padding: self.padding.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
        }
    }
    fn grad_weight(&self) -> Op {
        Op::ConvGradWeight {
            stride: self.stride.clone(),
            padding: self.padding.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
        }
    }
}

#[test]
fn conv_grads() {
    for c in conv_cases() {
        let mut rng = Rng::new("conv");
        let inputs = [rng.t(&c.x), rng.t(&c.w), rng.t(&[c.w[0]])];
        let (out, name) = (c.out_shape(), format!("conv x={:?} w={:?}", c.x, c.w));
        let op = c.op(true);
        check_op(&name, &op, &inputs, &out, 0, &|xs, dy| ev(&c.grad_input(), &[dy, &xs[1]], &c.x));
        check_op(&name, &op, &inputs, &out, 1, &|xs, dy| ev(&c.grad_weight(), &[&xs[0], dy], &c.w));
        // The bias gradient is a sum of dy over the batch and spatial axes.
        let axes: Vec<usize> = std::iter::once(0).chain(2..out.len()).collect();
        check_op(&name, &op, &inputs, &out, 2, &|_, dy| {
            ev(
                &Op::Reduce { op: ReduceOp::Sum, axes: axes.clone(), keepdim: false },
                &[dy],
                &[c.w[0]],
            )
        });
    }
}

#[test]
fn pool_grads() {
    let mut rng = Rng::new("pool");
    let x = rng.t(&[2, 3, 7, 6]);
    let cases: [(&[usize], &[usize], &[usize]); 4] = [
        (&[3, 2], &[2, 2], &[1, 1]),
        (&[2, 2], &[2, 2], &[0, 0]),
        (&[3, 3], &[1, 1], &[1, 1]),
        (&[2, 3], &[3, 1], &[1, 0]),
    ];
    for (kernel, stride, padding) in cases {
        let out: Vec<usize> = [2, 3]
            .into_iter()
            .chain((0..2).map(|a| (x.shape[2 + a] + 2 * padding[a] - kernel[a]) / stride[a] + 1))
            .collect();
        for op in [PoolOp::Max, PoolOp::Avg] {
            let (kernel, stride, padding) = (kernel.to_vec(), stride.to_vec(), padding.to_vec());
            let fwd = Op::Pool {
                op,
                kernel: kernel.clone(),
                stride: stride.clone(),
                padding: padding.clone(),
            };
            let back = Op::PoolGrad { op, kernel, stride, padding };
            check_op(
                &format!("{op:?} pool"),
                &fwd,
                std::slice::from_ref(&x),
                &out,
                0,
                &|xs, dy| ev(&back, &[&xs[0], dy], &xs[0].shape),
            );
        }
    }
}

#[test]
fn upsample_grads() {
    let mut rng = Rng::new("upsample");
    for (shape, scale, out) in
        [(vec![2, 3, 4], 3, vec![2, 3, 12]), (vec![1, 2, 3, 2], 2, vec![1, 2, 6, 4])]
    {
        let x = rng.t(&shape);
        check_op("upsample", &Op::Upsample { scale }, &[x], &out, 0, &|_, dy| {
            ev(&Op::UpsampleGrad { scale }, &[dy], &shape)
        });
    }
}

// ---- attention and rope -------------------------------------------------------------------------

#[test]
fn attention_grads_causal_gqa_mask() {
    let mut rng = Rng::new("attention");
    type Case = (Vec<usize>, Vec<usize>, Vec<usize>, Option<Vec<usize>>, bool);
    // (q, k, v, mask, causal)
    let cases: Vec<Case> = vec![
        (vec![2, 4, 3, 4], vec![2, 2, 5, 4], vec![2, 2, 5, 3], Some(vec![2, 1, 1, 5]), true),
        (vec![1, 2, 4, 3], vec![1, 2, 4, 3], vec![1, 2, 4, 2], None, true),
        (vec![3, 2, 2], vec![1, 3, 2], vec![1, 3, 4], Some(vec![2, 3]), false),
        (vec![1, 2, 5, 2], vec![1, 1, 3, 2], vec![1, 1, 3, 2], None, true),
    ];
    for (sq, sk, sv, mask, causal) in cases {
        let mut inputs = vec![rng.t(&sq), rng.t(&sk), rng.t(&sv)];
        if let Some(m) = &mask {
            inputs.push(rng.tensor(m, -2.0, 0.0));
        }
        let has_mask = mask.is_some();
        let scale = 0.7;
        let mut out = sq.clone();
        *out.last_mut().unwrap() = *sv.last().unwrap();
        let fwd = Op::Attention { causal, scale, has_mask };
        for (wrt, part) in [(0, GradPart::Q), (1, GradPart::K), (2, GradPart::V)] {
            let want = inputs[wrt].shape.clone();
            check_op(
                &format!("attention q={sq:?} k={sk:?} {part:?}"),
                &fwd,
                &inputs,
                &out,
                wrt,
                &|xs, dy| {
                    ev(
                        &Op::AttentionGrad { causal, scale, has_mask, part },
                        &with_dy(xs, dy),
                        &want,
                    )
                },
            );
        }
    }
}

#[test]
fn rope_inverse_is_its_derivative() {
    let x = Rng::new("rope").t(&[2, 5, 6]);
    check_op(
        "rope",
        &Op::Rope { theta: 100.0, offset: 3, inverse: false },
        &[x],
        &[2, 5, 6],
        0,
        &|_, dy| ev(&Op::Rope { theta: 100.0, offset: 3, inverse: true }, &[dy], &[2, 5, 6]),
    );
}

// ---- forward values -----------------------------------------------------------------------------

fn f32t(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::f32(shape.to_vec(), v.to_vec())
}

#[test]
fn softmax_rows_sum_to_one_and_match_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 0.0, f32::NEG_INFINITY, 0.0]);
    let y = f64s(&ev(&Op::Softmax { axis: 1, log: false }, &[&x], &[2, 3]));
    let e = [1f64.exp(), 2f64.exp(), 3f64.exp()];
    let s: f64 = e.iter().sum();
    assert_close(&y, &[e[0] / s, e[1] / s, e[2] / s, 0.5, 0.0, 0.5], 1e-6, "softmax");
    let ls = f64s(&ev(&Op::Softmax { axis: 1, log: true }, &[&x], &[2, 3]));
    assert_close(
        &ls[..3],
        &[(e[0] / s).ln(), (e[1] / s).ln(), (e[2] / s).ln()],
        1e-6,
        "log_softmax",
    );
    let big = Rng::new("rows").tensor(&[4, 6, 5], -20.0, 20.0);
    for axis in 0..3 {
        let y = ev(&Op::Softmax { axis, log: false }, &[&big], &[4, 6, 5]);
        let sums = f64s(&ev(
            &Op::Reduce { op: ReduceOp::Sum, axes: vec![axis], keepdim: false },
            &[&y],
            &reduced(&[4, 6, 5], &[axis], false),
        ));
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-12), "softmax axis {axis}: {sums:?}");
    }
}

#[test]
fn pointwise_values_match_pytorch() {
    let x = f32t(&[4], &[-1.0, 0.0, 1.0, 2.0]);
    let run = |u| f64s(&ev(&Op::Unary(u), &[&x], &[4]));
    assert_close(
        &run(UnaryOp::Gelu),
        &[-0.15865525393145707, 0.0, 0.8413447460685429, 1.9544997361036416],
        1e-6,
        "gelu",
    );
    assert_close(
        &run(UnaryOp::GeluTanh),
        &[-0.15880800939172324, 0.0, 0.8411919906082768, 1.9545976940871754],
        1e-6,
        "gelu_tanh",
    );
    assert_close(
        &run(UnaryOp::Silu),
        &[-0.2689414213699951, 0.0, 0.7310585786300049, 1.7615941559557646],
        1e-6,
        "silu",
    );
    assert_close(&run(UnaryOp::Relu), &[0.0, 0.0, 1.0, 2.0], 0.0, "relu");
    // PyTorch's choice at the kinks: relu'(0) = |x|'(0) = 0.
    let dy = f32t(&[4], &[1.0; 4]);
    assert_eq!(f64s(&ev(&Op::UnaryGrad(UnaryOp::Relu), &[&x, &dy], &[4])), [0.0, 0.0, 1.0, 1.0]);
    assert_eq!(f64s(&ev(&Op::UnaryGrad(UnaryOp::Abs), &[&x, &dy], &[4])), [-1.0, 0.0, 1.0, 1.0]);
    let p = f64s(&ev(&Op::Pow { exponent: 2.0 }, &[&x], &[4]));
    assert_eq!(p, [1.0, 0.0, 1.0, 4.0]);
}

#[test]
fn integer_arithmetic_wraps_and_floors() {
    let a = Tensor::i32(vec![4], vec![-7, 7, i32::MAX, 6]);
    let b = Tensor::i32(vec![4], vec![2, -2, 1, 3]);
    let bin = |op| eval(&Op::Binary(op), &[&a, &b], DType::I32, &[4], &TRAIN).unwrap().data;
    assert_eq!(bin(BinaryOp::Div), Data::I32(vec![-4, -4, i32::MAX, 2]));
    assert_eq!(bin(BinaryOp::Add), Data::I32(vec![-5, 5, i32::MIN, 9]));
    let zero = Tensor::i32(vec![], vec![0]);
    let e = eval(&Op::Binary(BinaryOp::Div), &[&a, &zero], DType::I32, &[4], &TRAIN).unwrap_err();
    assert!(e.0.contains("division by zero"), "{e}");
    let s = eval(
        &Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false },
        &[&b],
        DType::I32,
        &[],
        &TRAIN,
    )
    .unwrap();
    assert_eq!(s.data, Data::I32(vec![4]));
}

#[test]
fn reductions_match_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 5.0, 3.0, -2.0, 4.0, 4.0]);
    let r = |op, axes: Vec<usize>, keepdim, shape: &[usize]| {
        f64s(&ev(&Op::Reduce { op, axes, keepdim }, &[&x], shape))
    };
    assert_eq!(r(ReduceOp::Sum, vec![1], false, &[2]), [9.0, 6.0]);
    assert_eq!(r(ReduceOp::Mean, vec![0], true, &[1, 3]), [-0.5, 4.5, 3.5]);
    assert_eq!(r(ReduceOp::Max, vec![0, 1], false, &[]), [5.0]);
    assert_eq!(r(ReduceOp::Min, vec![1], true, &[2, 1]), [1.0, -2.0]);
    // The max gradient goes to the first of tied maxima only.
    let y = ev(&Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdim: false }, &[&x], &[2]);
    let dy = f32t(&[2], &[1.0, 10.0]);
    let dx = ev(
        &Op::ReduceGrad { op: ReduceOp::Max, axes: vec![1], keepdim: false },
        &[&x, &y, &dy],
        &[2, 3],
    );
    assert_eq!(f64s(&dx), [0.0, 1.0, 0.0, 0.0, 10.0, 0.0]);
    let am = eval(&Op::ArgMax { axis: 1 }, &[&x], DType::I32, &[2], &TRAIN).unwrap();
    assert_eq!(am.data, Data::I32(vec![1, 1]));
    let nan = f32t(&[3], &[1.0, f32::NAN, 2.0]);
    assert_eq!(
        eval(&Op::ArgMax { axis: 0 }, &[&nan], DType::I32, &[], &TRAIN).unwrap().data,
        Data::I32(vec![1])
    );
    assert!(f64s(&ev(
        &Op::Reduce { op: ReduceOp::Max, axes: vec![0], keepdim: false },
        &[&nan],
        &[]
    ))[0]
        .is_nan());
}

#[test]
fn sum_to_and_broadcast_to_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[1, 3])), [5.0, 7.0, 9.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[3])), [5.0, 7.0, 9.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[2, 1])), [6.0, 15.0]);
    assert_eq!(f64s(&ev(&Op::SumTo, &[&x], &[])), [21.0]);
    let col = f32t(&[2, 1], &[1.0, 2.0]);
    assert_eq!(f64s(&ev(&Op::BroadcastTo, &[&col], &[2, 2])), [1.0, 1.0, 2.0, 2.0]);
    assert!(eval(&Op::SumTo, &[&x], DType::F32, &[2, 2], &TRAIN).is_err());
}

#[test]
fn movement_hand_values() {
    let x = f32t(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(
        f64s(&ev(&Op::Permute { perm: vec![1, 0] }, &[&x], &[3, 2])),
        [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(
        f64s(&ev(&Op::Slice { axis: 1, start: 1, end: 3 }, &[&x], &[2, 2])),
        [1.0, 2.0, 4.0, 5.0]
    );
    let idx = Tensor::i32(vec![2, 2], vec![2, 0, 1, 1]);
    assert_eq!(
        f64s(&ev(&Op::Gather { axis: 1 }, &[&x, &idx], &[2, 2, 2])),
        [2.0, 0.0, 1.0, 1.0, 5.0, 3.0, 4.0, 4.0]
    );
    // Mixed storage joins as f64.
    let y = Tensor::f64(vec![1, 3], vec![6.0, 7.0, 8.0]);
    let j = ev(&Op::Concat { axis: 0 }, &[&x, &y], &[3, 3]);
    assert!(matches!(j.data, Data::F64(_)));
    assert_eq!(f64s(&j), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let ints = Tensor::i32(vec![3], vec![1, 2, 3]);
    let ar = eval(&Op::Arange, &[], DType::I32, &[4], &TRAIN).unwrap();
    assert_eq!(ar.data, Data::I32(vec![0, 1, 2, 3]));
    let both = eval(&Op::Concat { axis: 0 }, &[&ints, &ar], DType::I32, &[7], &TRAIN).unwrap();
    assert_eq!(both.data, Data::I32(vec![1, 2, 3, 0, 1, 2, 3]));
}

#[test]
fn casts_truncate_and_round() {
    let x = f32t(&[5], &[-1.7, 2.9, 0.0, 1.0 + 2f32.powi(-9), 1.0 + 3.0 * 2f32.powi(-9)]);
    assert_eq!(
        eval(&Op::Cast, &[&x], DType::I32, &[5], &TRAIN).unwrap().data,
        Data::I32(vec![-1, 2, 0, 1, 1])
    );
    assert_eq!(
        eval(&Op::Cast, &[&x], DType::Bool, &[5], &TRAIN).unwrap().data,
        Data::I32(vec![1, 1, 0, 1, 1])
    );
    // bf16 keeps 8 significant bits, ties to even: 1 + 2^-9 → 1, 1 + 3·2^-9 → 1 + 2^-7.
    let b = f64s(&eval(&Op::Cast, &[&x], DType::BF16, &[5], &TRAIN).unwrap());
    assert_eq!(b[3..], [1.0, 1.0 + 2f64.powi(-7)]);
    let h = f32t(&[3], &[1.0 + 2f32.powi(-12), 70000.0, 1e-8]);
    let hv = f64s(&eval(&Op::Cast, &[&h], DType::F16, &[3], &TRAIN).unwrap());
    assert_eq!(hv, [1.0, f64::INFINITY, 0.0]);
    let i = Tensor::i32(vec![2], vec![3, -4]);
    assert_eq!(f64s(&eval(&Op::Cast, &[&i], DType::F32, &[2], &TRAIN).unwrap()), [3.0, -4.0]);
}

/// Direct-formula convolution, for comparison.
fn conv_reference(x: &Tensor, w: &Tensor, bias: &[f64], c: &ConvCase) -> Vec<f64> {
    let (xv, wv) = (f64s(x), f64s(w));
    let out = c.out_shape();
    let spatial = c.stride.len();
    // As 2-D: height 1 for conv1d.
    let two = |v: &[usize], fill| if spatial == 1 { [fill, v[0]] } else { [v[0], v[1]] };
    let (xs, ws, os) = (two(&c.x[2..], 1), two(&c.w[2..], 1), two(&out[2..], 1));
    let (st, pd, dl) = (two(&c.stride, 1), two(&c.padding, 0), two(&c.dilation, 1));
    let (cin, cout, g) = (c.x[1], c.w[0], c.groups);
    let mut y = Vec::new();
    for n in 0..c.x[0] {
        for (co, &b) in bias.iter().enumerate().take(cout) {
            let grp = co / (cout / g);
            for oh in 0..os[0] {
                for ow in 0..os[1] {
                    let mut s = b;
                    for cl in 0..cin / g {
                        let ci = grp * (cin / g) + cl;
                        for kh in 0..ws[0] {
                            for kw in 0..ws[1] {
                                let ih = (oh * st[0] + kh * dl[0]) as isize - pd[0] as isize;
                                let iw = (ow * st[1] + kw * dl[1]) as isize - pd[1] as isize;
                                if ih >= 0
                                    && iw >= 0
                                    && (ih as usize) < xs[0]
                                    && (iw as usize) < xs[1]
                                {
                                    let xi = ((n * cin + ci) * xs[0] + ih as usize) * xs[1]
                                        + iw as usize;
                                    let wi = ((co * (cin / g) + cl) * ws[0] + kh) * ws[1] + kw;
                                    s += xv[xi] * wv[wi];
                                }
                            }
                        }
                    }
                    y.push(s);
                }
            }
        }
    }
    y
}

#[test]
fn conv_matches_the_direct_formula() {
    let mut cases = conv_cases();
    cases.push(ConvCase {
        x: vec![4, 8, 12, 12],
        w: vec![16, 4, 3, 3],
        stride: vec![1, 1],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        groups: 2,
    });
    for c in cases {
        let mut rng = Rng::new("conv fwd");
        let to32 =
            |t: Tensor| Tensor::f32(t.shape.clone(), f64s(&t).iter().map(|&v| v as f32).collect());
        let (x, w, b) = (to32(rng.t(&c.x)), to32(rng.t(&c.w)), to32(rng.t(&[c.w[0]])));
        let want = conv_reference(&x, &w, &f64s(&b), &c);
        assert_close(
            &f64s(&ev(&c.op(true), &[&x, &w, &b], &c.out_shape())),
            &want,
            1e-5,
            &format!("conv {:?} {:?}", c.x, c.w),
        );
        let no_bias = conv_reference(&x, &w, &vec![0.0; c.w[0]], &c);
        assert_close(
            &f64s(&ev(&c.op(false), &[&x, &w], &c.out_shape())),
            &no_bias,
            1e-5,
            "conv without bias",
        );
    }
}

#[test]
fn pooling_and_upsampling_hand_values() {
    let x = f32t(&[1, 1, 4, 4], &(0..16).map(|v| v as f32).collect::<Vec<_>>());
    let maxp =
        Op::Pool { op: PoolOp::Max, kernel: vec![2, 2], stride: vec![2, 2], padding: vec![0, 0] };
    assert_eq!(f64s(&ev(&maxp, &[&x], &[1, 1, 2, 2])), [5.0, 7.0, 13.0, 15.0]);
    // Average pooling counts the padding as zeros: a corner window holds one real element.
    let ones = f32t(&[1, 1, 2, 2], &[1.0; 4]);
    let avgp =
        Op::Pool { op: PoolOp::Avg, kernel: vec![2, 2], stride: vec![2, 2], padding: vec![1, 1] };
    assert_eq!(f64s(&ev(&avgp, &[&ones], &[1, 1, 2, 2])), [0.25; 4]);
    // Max pooling ignores the padding, even around negative values.
    let neg = f32t(&[1, 1, 2, 2], &[-1.0, -2.0, -3.0, -4.0]);
    let maxpad =
        Op::Pool { op: PoolOp::Max, kernel: vec![2, 2], stride: vec![2, 2], padding: vec![1, 1] };
    assert_eq!(f64s(&ev(&maxpad, &[&neg], &[1, 1, 2, 2])), [-1.0, -2.0, -3.0, -4.0]);
    // The max gradient goes to the first of tied maxima.
    let tied = f32t(&[1, 1, 2, 2], &[3.0, 3.0, 3.0, 1.0]);
    let dx = ev(
        &Op::PoolGrad {
            op: PoolOp::Max,
            kernel: vec![2, 2],
            stride: vec![2, 2],
            padding: vec![0, 0],
        },
        &[&tied, &f32t(&[1, 1, 1, 1], &[2.0])],
        &[1, 1, 2, 2],
    );
    assert_eq!(f64s(&dx), [2.0, 0.0, 0.0, 0.0]);
    let small = f32t(&[1, 1, 2], &[1.0, 2.0]);
    assert_eq!(f64s(&ev(&Op::Upsample { scale: 2 }, &[&small], &[1, 1, 4])), [1.0, 1.0, 2.0, 2.0]);
    let sq = f32t(&[1, 1, 1, 2], &[1.0, 2.0]);
    assert_eq!(
        f64s(&ev(&Op::Upsample { scale: 2 }, &[&sq], &[1, 1, 2, 4])),
        [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]
    );
}

#[test]
fn norms_match_hand_values() {
    let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 0.0, 0.0, 3.0]);
    let ln = f64s(&ev(
        &Op::LayerNorm { eps: 1e-12, has_weight: false, has_bias: false },
        &[&x],
        &[2, 3],
    ));
    let s = 1.5f64.sqrt();
    assert_close(
        &ln,
        &[-s, 0.0, s, -1.0 / 2f64.sqrt(), -1.0 / 2f64.sqrt(), 2.0 / 2f64.sqrt()],
        1e-5,
        "layer_norm",
    );
    let r = f32t(&[2], &[3.0, 4.0]);
    let w = f32t(&[2], &[1.0, 2.0]);
    let rms = f64s(&ev(&Op::RmsNorm { eps: 0.0, has_weight: true }, &[&r, &w], &[2]));
    let root = 12.5f64.sqrt();
    assert_close(&rms, &[3.0 / root, 8.0 / root], 1e-6, "rms_norm");
    // Group norm with one channel per group is instance norm.
    let g = f32t(&[1, 2, 2], &[1.0, 3.0, 5.0, 5.0]);
    let gn = f64s(&ev(
        &Op::GroupNorm { groups: 2, eps: 0.0, has_weight: false, has_bias: false },
        &[&g],
        &[1, 2, 2],
    ));
    assert_eq!(gn[..2], [-1.0, 1.0]);
    assert!(gn[2..].iter().all(|v| v.is_nan()), "0/0 with eps 0 is NaN, as in PyTorch: {gn:?}");
}

#[test]
fn batch_norm_uses_batch_or_running_statistics() {
    // x: [N=2, C=1]; batch mean 2, biased var 1.
    let x = f32t(&[2, 1], &[1.0, 3.0]);
    let (rm, rv) = (f32t(&[1], &[0.0]), f32t(&[1], &[4.0]));
    let op = Op::BatchNorm { eps: 0.0, momentum: 0.1, has_weight: false, has_bias: false };
    assert_eq!(f64s(&ev_ctx(&op, &[&x, &rm, &rv], &[2, 1], &TRAIN)), [-1.0, 1.0]);
    assert_eq!(f64s(&ev_ctx(&op, &[&x, &rm, &rv], &[2, 1], &INFER)), [0.5, 1.5]);
    // Running statistics: the unbiased variance (2) enters the update.
    let (m, v) = batch_norm_update(&x, &rm, &rv, 0.1);
    assert_close(&f64s(&m), &[0.2], 1e-7, "running mean");
    assert_close(&f64s(&v), &[0.9 * 4.0 + 0.1 * 2.0], 1e-7, "running var");
    assert!(matches!(m.data, Data::F32(_)));
    let single = f32t(&[1, 1], &[1.0]);
    assert!(eval(&op, &[&single, &rm, &rv], DType::F32, &[1, 1], &TRAIN)
        .unwrap_err()
        .0
        .contains("more than one value"));
}

#[test]
fn dropout_masks_follow_seed_and_node() {
    let x = f32t(&[1000], &[1.0; 1000]);
    let op = Op::Dropout { p: 0.25 };
    let y = f64s(&ev_ctx(&op, &[&x], &[1000], &TRAIN));
    let dropped = y.iter().filter(|&&v| v == 0.0).count();
    assert!((200..300).contains(&dropped), "dropped {dropped} of 1000 at p = 0.25");
    assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    assert_eq!(y, f64s(&ev_ctx(&op, &[&x], &[1000], &TRAIN)), "same seed and node, same mask");
    assert_ne!(
        y,
        f64s(&ev_ctx(&op, &[&x], &[1000], &Ctx { node: 4, ..TRAIN })),
        "another node, another mask"
    );
    assert_ne!(
        y,
        f64s(&ev_ctx(&op, &[&x], &[1000], &Ctx { seed: 8, ..TRAIN })),
        "another seed, another mask"
    );
    assert_eq!(
        f64s(&ev_ctx(&op, &[&x], &[1000], &INFER)),
        vec![1.0; 1000],
        "identity in inference"
    );
    let g = f64s(&ev_ctx(
        &Op::DropoutGrad { p: 0.25, forward: TRAIN.node },
        &[&x],
        &[1000],
        &Ctx { node: 99, ..TRAIN },
    ));
    assert_eq!(g, y, "the gradient uses the forward step's mask");
}

#[test]
fn cross_entropy_hand_values() {
    let logits = f32t(&[2, 2], &[0.0, 0.0, 2.0, 0.0]);
    let t = Tensor::i32(vec![2], vec![0, 1]);
    let l = f64s(&ev(&Op::SoftmaxCrossEntropy, &[&logits, &t], &[]))[0];
    let want = (2f64.ln() + (1.0 + 2f64.exp()).ln() - 0.0) / 2.0;
    assert!((l - want).abs() < 1e-6, "{l} vs {want}");
    let g = f64s(&ev(&Op::SoftmaxCrossEntropyGrad, &[&logits, &t, &f32t(&[], &[1.0])], &[2, 2]));
    let p = 2f64.exp() / (1.0 + 2f64.exp());
    assert_close(&g, &[-0.25, 0.25, p / 2.0, (1.0 - p - 1.0) / 2.0], 1e-6, "cross-entropy grad");
}

/// Attention written out loop by loop, for comparison.
fn attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
) -> Vec<f64> {
    let (qv, kv, vv) = (f64s(q), f64s(k), f64s(v));
    let [b, hq, tq, d] = q.shape[..] else { panic!() };
    let [_, hkv, tk, _] = k.shape[..] else { panic!() };
    let dv = v.shape[3];
    let mv = mask.map(f64s);
    let mut out = Vec::new();
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            for i in 0..tq {
                let mut s: Vec<f64> = (0..tk)
                    .map(|j| {
                        let dotp: f64 = (0..d)
                            .map(|c| {
                                qv[((bi * hq + h) * tq + i) * d + c]
                                    * kv[((bi * hkv + kh) * tk + j) * d + c]
                            })
                            .sum();
                        // mask [B, 1, Tq, Tk]
                        dotp * scale + mv.as_ref().map_or(0.0, |m| m[(bi * tq + i) * tk + j])
                    })
                    .collect();
                for (j, sj) in s.iter_mut().enumerate() {
                    if causal && j > i + tk - tq {
                        *sj = f64::NEG_INFINITY;
                    }
                }
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..dv {
                    out.push(
                        (0..tk).map(|j| e[j] / z * vv[((bi * hkv + kh) * tk + j) * dv + c]).sum(),
                    );
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_a_direct_loop() {
    let mut rng = Rng::new("attention fwd");
    let (q, k, v) = (rng.t(&[2, 4, 3, 5]), rng.t(&[2, 2, 6, 5]), rng.t(&[2, 2, 6, 3]));
    let mask = rng.tensor(&[2, 1, 3, 6], -1.0, 0.0);
    for causal in [false, true] {
        let y = ev(
            &Op::Attention { causal, scale: 0.4, has_mask: true },
            &[&q, &k, &v, &mask],
            &[2, 4, 3, 3],
        );
        assert_close(
            &f64s(&y),
            &attention_reference(&q, &k, &v, Some(&mask), causal, 0.4),
            1e-12,
            "attention",
        );
    }
    // A query that sees no key (causal with Tq > Tk) gets zeros, not NaN.
    let (q2, k2) = (rng.t(&[1, 1, 3, 2]), rng.t(&[1, 1, 1, 2]));
    let v2 = Tensor::f64(vec![1, 1, 1, 2], vec![5.0, 6.0]);
    let y = f64s(&ev(
        &Op::Attention { causal: true, scale: 1.0, has_mask: false },
        &[&q2, &k2, &v2],
        &[1, 1, 3, 2],
    ));
    assert_eq!(y, [0.0, 0.0, 0.0, 0.0, 5.0, 6.0]);
}

#[test]
fn rope_hand_values() {
    let x = Rng::new("rope fwd").t(&[1, 3, 4]);
    let y = f64s(&ev(&Op::Rope { theta: 10000.0, offset: 0, inverse: false }, &[&x], &[1, 3, 4]));
    let xv = f64s(&x);
    assert_eq!(y[..4], xv[..4], "position 0 is not rotated");
    // Position 2, pair (1, 3): angle 2·10000^(−2/4) = 0.02.
    let (c, s) = (0.02f64.cos(), 0.02f64.sin());
    assert_close(
        &[y[9], y[11]],
        &[xv[9] * c - xv[11] * s, xv[11] * c + xv[9] * s],
        1e-12,
        "rope pair",
    );
    // With an offset, position t uses angle (offset + t)·inv_freq; the inverse undoes it.
    let shifted = ev(&Op::Rope { theta: 10000.0, offset: 5, inverse: false }, &[&x], &[1, 3, 4]);
    let back = ev(&Op::Rope { theta: 10000.0, offset: 5, inverse: true }, &[&shifted], &[1, 3, 4]);
    assert_close(&f64s(&back), &xv, 1e-12, "rope inverse");
}

#[test]
fn matmul_matches_a_direct_loop_in_f32() {
    let mut rng = Rng::new("matmul fwd");
    let to32 =
        |t: Tensor| Tensor::f32(t.shape.clone(), f64s(&t).iter().map(|&v| v as f32).collect());
    for (sa, sb) in [
        (vec![3, 5, 7], vec![7, 4]),
        (vec![2, 1, 5, 7], vec![3, 7, 4]),
        (vec![40, 30], vec![30, 20]),
    ] {
        let (a, b) = (to32(rng.t(&sa)), to32(rng.t(&sb)));
        let out = matmul_shape(&sa, &sb);
        let y = f64s(&ev(&Op::MatMul, &[&a, &b], &out));
        assert!(matches!(ev(&Op::MatMul, &[&a, &b], &out).data, Data::F32(_)));
        let (av, bv) = (f64s(&a), f64s(&b));
        let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
        let batch = broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
        let sta = layout::broadcast_strides(&sa[..sa.len() - 2], &batch).unwrap();
        let stb = layout::broadcast_strides(&sb[..sb.len() - 2], &batch).unwrap();
        let mut want = Vec::new();
        layout::walk(&batch, [&sta, &stb], |[ia, ib]| {
            for i in 0..m {
                for j in 0..n {
                    want.push(
                        (0..k)
                            .map(|c| av[ia * m * k + i * k + c] * bv[ib * k * n + c * n + j])
                            .sum::<f64>(),
                    );
                }
            }
        });
        assert_close(&y, &want, 1e-5, &format!("matmul {sa:?} {sb:?}"));
    }
}

// ---- errors -----------------------------------------------------------------------------------

#[test]
fn bad_data_is_an_error_not_a_panic() {
    let table = f32t(&[5, 2], &[0.0; 10]);
    let e = eval(
        &Op::Gather { axis: 0 },
        &[&table, &Tensor::i32(vec![2], vec![1, 7])],
        DType::F32,
        &[2, 2],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("index 7") && e.0.contains("size 5"), "{e}");
    let e = eval(
        &Op::Gather { axis: 0 },
        &[&table, &Tensor::i32(vec![1], vec![-1])],
        DType::F32,
        &[1, 2],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("index -1"), "{e}");
    let e = eval(
        &Op::GatherGrad { axis: 0 },
        &[&Tensor::i32(vec![1], vec![5]), &f32t(&[1, 2], &[0.0; 2])],
        DType::F32,
        &[5, 2],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("index 5"), "{e}");
    let e = eval(&Op::Gather { axis: 0 }, &[&table, &table], DType::F32, &[5, 2, 2], &TRAIN)
        .unwrap_err();
    assert!(e.0.contains("integer"), "{e}");
    let e =
        eval(&Op::Unary(UnaryOp::Exp), &[&Tensor::i32(vec![1], vec![1])], DType::F32, &[1], &TRAIN)
            .unwrap_err();
    assert!(e.0.contains("float"), "{e}");
    let e = eval(
        &Op::SoftmaxCrossEntropy,
        &[&table, &Tensor::i32(vec![5], vec![0, 1, 2, 1, 0])],
        DType::F32,
        &[],
        &TRAIN,
    )
    .unwrap_err();
    assert!(e.0.contains("target 2") && e.0.contains("2 classes"), "{e}");
    for op in [Op::Input { name: "x".into() }, Op::Param { index: 0 }] {
        assert!(eval(&op, &[], DType::F32, &[1], &TRAIN).is_err());
    }
    let e = eval(&Op::Unary(UnaryOp::Exp), &[&table], DType::F32, &[2, 5], &TRAIN).unwrap_err();
    assert!(
        e.0.contains("[5, 2]") && e.0.contains("[2, 5]"),
        "a wrong step shape is reported: {e}"
    );
    let e = eval(&Op::MatMul, &[&table], DType::F32, &[5], &TRAIN).unwrap_err();
    assert!(e.0.starts_with("matmul: expects 2 inputs"), "{e}");
    let empty = f32t(&[2, 0], &[]);
    assert!(eval(
        &Op::LayerNorm { eps: 1e-5, has_weight: false, has_bias: false },
        &[&empty],
        DType::F32,
        &[2, 0],
        &TRAIN
    )
    .unwrap_err()
    .0
    .contains("zero-sized"));
    let broken = Tensor { dtype: DType::F32, shape: vec![3], data: Data::F32(vec![1.0]) };
    assert!(eval(&Op::Unary(UnaryOp::Exp), &[&broken], DType::F32, &[3], &TRAIN).is_err());
}
