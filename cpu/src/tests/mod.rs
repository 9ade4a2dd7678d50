//! The CPU backend's own tests: every derivative against central finite differences in f64
//! (`grads*.rs`), forward values against hand-computed ones or direct formulas (`values.rs`),
//! and errors for bad data (`errors.rs`). The helpers they share are here.

mod cache;
mod errors;
mod grads;
mod grads_rows;
mod grads_windows;
mod matvec;
mod packed;
mod select;
mod spatial;
mod values;

pub(super) use super::*;
pub(super) use mgn_ir::op::{BinaryOp, GradPart, PoolOp, ReduceOp, UnaryOp};

/// A small deterministic generator (splitmix64), seeded per test.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: &str) -> Rng {
        Rng(seed
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)))
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(super) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(super) fn tensor(&mut self, shape: &[usize], lo: f64, hi: f64) -> Tensor {
        let n = shape.iter().product();
        Tensor::f64(shape.to_vec(), (0..n).map(|_| self.uniform(lo, hi)).collect())
    }
    pub(super) fn t(&mut self, shape: &[usize]) -> Tensor {
        self.tensor(shape, -1.0, 1.0)
    }
    pub(super) fn index(&mut self, shape: &[usize], below: usize) -> Tensor {
        let n = shape.iter().product();
        Tensor::i32(shape.to_vec(), (0..n).map(|_| (self.next() % below as u64) as i32).collect())
    }
}

pub(super) const TRAIN: Ctx = Ctx { training: true, seed: 7, node: 3 };

pub(super) const INFER: Ctx = Ctx { training: false, seed: 7, node: 3 };

pub(super) fn ev_ctx(op: &Op, inputs: &[&Tensor], shape: &[usize], ctx: &Ctx) -> Tensor {
    let dtype = if inputs.iter().any(|t| !matches!(t.data, Data::I32(_))) || inputs.is_empty() {
        DType::F32
    } else {
        DType::I32
    };
    eval(op, inputs, dtype, shape, ctx).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs one op in training mode (float result).
pub(super) fn ev(op: &Op, inputs: &[&Tensor], shape: &[usize]) -> Tensor {
    ev_ctx(op, inputs, shape, &TRAIN)
}

pub(super) fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

pub(super) fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

pub(super) fn dot(a: &Tensor, b: &Tensor) -> f64 {
    f64s(a).iter().zip(f64s(b)).map(|(x, y)| x * y).sum()
}

/// Checks `grad(inputs, dy)` against central differences of `⟨dy, f(inputs)⟩` with respect to
/// every element of input `wrt` (f64 storage, random upstream gradient `dy`).
pub(super) fn check_grad(
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
pub(super) fn check_op(
    name: &str,
    op: &Op,
    inputs: &[Tensor],
    shape: &[usize],
    wrt: usize,
    grad: &dyn Fn(&[Tensor], &Tensor) -> Tensor,
) {
    check_op_ctx(name, op, inputs, shape, wrt, &TRAIN, grad)
}

pub(super) fn check_op_ctx(
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
pub(super) fn with_dy<'a>(xs: &'a [Tensor], dy: &'a Tensor) -> Vec<&'a Tensor> {
    xs.iter().chain([dy]).collect()
}

pub(super) fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    layout::broadcast_shapes(a, b).unwrap()
}

pub(super) fn swap_last_two(rank: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(rank - 2, rank - 1);
    p
}

pub(super) fn transpose(t: &Tensor) -> Tensor {
    let r = t.shape.len();
    let mut s = t.shape.clone();
    s.swap(r - 2, r - 1);
    ev(&Op::Permute { perm: swap_last_two(r) }, &[t], &s)
}

pub(super) fn matmul_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
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
pub(super) fn matmul_grad(xs: &[Tensor], dy: &Tensor, wrt: usize) -> Tensor {
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

pub(super) fn reduced(shape: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    (0..shape.len())
        .filter_map(|i| if axes.contains(&i) { keepdim.then_some(1) } else { Some(shape[i]) })
        .collect()
}

/// Checks every part of a norm: inputs `x` then the present weight and bias.
pub(super) fn check_norm(
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
pub(super) fn parts(has_weight: bool, has_bias: bool) -> Vec<GradPart> {
    let mut p = vec![GradPart::Input];
    if has_weight {
        p.push(GradPart::Weight);
    }
    if has_bias {
        p.push(GradPart::Bias);
    }
    p
}

pub(super) struct ConvCase {
    pub(super) x: Vec<usize>,
    pub(super) w: Vec<usize>,
    pub(super) stride: Vec<usize>,
    pub(super) padding: Vec<usize>,
    pub(super) dilation: Vec<usize>,
    pub(super) groups: usize,
}

pub(super) fn conv_cases() -> Vec<ConvCase> {
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
    pub(super) fn out_shape(&self) -> Vec<usize> {
        let mut s = vec![self.x[0], self.w[0]];
        for a in 0..self.stride.len() {
            let span = self.dilation[a] * (self.w[2 + a] - 1) + 1;
            s.push((self.x[2 + a] + 2 * self.padding[a] - span) / self.stride[a] + 1);
        }
        s
    }
    pub(super) fn op(&self, has_bias: bool) -> Op {
        Op::Conv {
            stride: self.stride.clone(),
            padding: self.padding.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
            has_bias,
        }
    }
    pub(super) fn grad_input(&self) -> Op {
        Op::ConvGradInput {
            stride: self.stride.clone(),
            padding: self.padding.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
        }
    }
    pub(super) fn grad_weight(&self) -> Op {
        Op::ConvGradWeight {
            stride: self.stride.clone(),
            padding: self.padding.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
        }
    }
}

pub(super) fn f32t(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::f32(shape.to_vec(), v.to_vec())
}

/// Direct-formula convolution, for comparison.
pub(super) fn conv_reference(x: &Tensor, w: &Tensor, bias: &[f64], c: &ConvCase) -> Vec<f64> {
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

/// Attention written out loop by loop, for comparison.
pub(super) fn attention_reference(
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
