//! The convolution, pooling and upsampling kernels against the CPU backend, on odd shapes with
//! every geometry attribute away from its default. Runs on the device `mgnc info` would use
//! (lavapipe in CI, where `MGN_REQUIRE_GPU=1`).

use super::test_util::{check_on_both, values};
use mgn_ir::op::{Op, PoolOp};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

/// Seeded floats in [-1, 1) of the given shape.
fn input(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed * 977 + 13))
}

/// Seeded floats from only five levels, so that pooling windows hold tied maxima.
fn tied(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(
        shape.to_vec(),
        values(shape.iter().product(), seed * 977 + 13)
            .into_iter()
            .map(|v| (v * 2.0).round() / 2.0)
            .collect(),
    )
}

/// `t` as a tensor of `dtype`: f16 rounds each value (the host holds halves as f32s).
fn as_type(t: Tensor, dtype: DType) -> Tensor {
    if dtype != DType::F16 {
        return t;
    }
    let v = t.to_f64_vec().iter().map(|&x| half::f16::from_f64(x).to_f32()).collect();
    Tensor { dtype, ..Tensor::f32(t.shape, v) }
}

/// Runs `op` on `given` on the GPU and the CPU and compares (equal values, infinities
/// included, or within `tol` relative to 1 + |cpu|).
fn check(op: Op, given: &[Tensor], out_shape: &[usize], tol: f64) {
    check_on_both(&op, given, DType::F32, out_shape, tol);
}

/// PyTorch's output length of a window along one axis.
fn window_out(len: usize, k: usize, stride: usize, pad: usize, dil: usize) -> usize {
    (len + 2 * pad - dil * (k - 1) - 1) / stride + 1
}

/// One convolution geometry: input `[N, Cin, spatial..]`, weight `[Cout, Cin/G, k..]`.
struct Case {
    x: Vec<usize>,
    w: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    dilation: Vec<usize>,
    groups: usize,
}

impl Case {
    fn y(&self) -> Vec<usize> {
        let sp = self.stride.len();
        let mut s = vec![self.x[0], self.w[0]];
        for a in 0..sp {
            s.push(window_out(
                self.x[2 + a],
                self.w[2 + a],
                self.stride[a],
                self.padding[a],
                self.dilation[a],
            ));
        }
        s
    }

    fn conv(&self, has_bias: bool) -> Op {
        Op::Conv {
            stride: self.stride.clone(),
            padding: self.padding.clone(),
            dilation: self.dilation.clone(),
            groups: self.groups,
            has_bias,
        }
    }

    /// Forward with and without bias, then both derivatives.
    fn check_all(&self) {
        self.check_all_within(1e-5);
    }

    /// `check_all` with a looser tolerance, for long reductions (the GPU sums in another order).
    fn check_all_within(&self, tol: f64) {
        self.check_all_as(DType::F32, tol);
    }

    /// `check_all_within` with the operands of type `dtype` (f16 ones held as halves).
    fn check_all_as(&self, dtype: DType, tol: f64) {
        let make = |shape: &[usize], seed: u32| as_type(input(shape, seed), dtype);
        let (x, w, y) = (make(&self.x, 1), make(&self.w, 2), self.y());
        let bias = input(&[self.w[0]], 3);
        let dy = make(&y, 4);
        check(self.conv(true), &[x.clone(), w.clone(), bias], &y, tol);
        check(self.conv(false), &[x.clone(), w.clone()], &y, tol);
        let (stride, padding, dilation, groups) =
            (self.stride.clone(), self.padding.clone(), self.dilation.clone(), self.groups);
        check(
            Op::ConvGradInput {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups,
            },
            &[dy.clone(), w],
            &self.x,
            tol,
        );
        check(Op::ConvGradWeight { stride, padding, dilation, groups }, &[x, dy], &self.w, tol);
    }
}

#[test]
fn conv2d_and_its_derivatives_match_the_cpu() {
    // Stride 2 and padding 1 on odd sizes.
    Case {
        x: vec![2, 3, 7, 9],
        w: vec![5, 3, 3, 3],
        stride: vec![2, 2],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    }
    .check_all();
    // Dilation 2 and groups 2, every attribute different per axis.
    Case {
        x: vec![2, 4, 9, 7],
        w: vec![6, 2, 3, 2],
        stride: vec![1, 2],
        padding: vec![2, 1],
        dilation: vec![2, 2],
        groups: 2,
    }
    .check_all();
    // Everything at once, with a stride that skips input positions and a 1×1 kernel edge.
    Case {
        x: vec![3, 6, 11, 8],
        w: vec![9, 2, 3, 1],
        stride: vec![3, 2],
        padding: vec![1, 0],
        dilation: vec![2, 1],
        groups: 3,
    }
    .check_all();
    // Depthwise, padding larger than the kernel's reach (outputs made of padding only).
    Case {
        x: vec![1, 4, 5, 5],
        w: vec![4, 1, 2, 2],
        stride: vec![1, 1],
        padding: vec![2, 2],
        dilation: vec![1, 1],
        groups: 4,
    }
    .check_all();
}

#[test]
fn conv1d_and_its_derivatives_match_the_cpu() {
    Case {
        x: vec![3, 4, 11],
        w: vec![6, 2, 3],
        stride: vec![2],
        padding: vec![1],
        dilation: vec![2],
        groups: 2,
    }
    .check_all();
    Case {
        x: vec![2, 3, 10],
        w: vec![4, 3, 5],
        stride: vec![1],
        padding: vec![2],
        dilation: vec![1],
        groups: 1,
    }
    .check_all();
}

/// The shapes the tiled (implicit GEMM) kernels must get right: channel and pixel counts that
/// are not multiples of any tile (and above the 64-row tiles), ResNet's 1×1 projections and 7×7
/// stem, stride 2 with dilation 2, groups and depthwise, 1-D, and a weight gradient whose
/// reduction over samples × positions is long enough to be split inside the workgroup.
#[test]
fn tiled_conv_shapes_match_the_cpu() {
    let case = |x: Vec<usize>, w: Vec<usize>, s: usize, p: usize, d: usize, groups: usize| {
        let sp = x.len() - 2;
        Case { x, w, stride: vec![s; sp], padding: vec![p; sp], dilation: vec![d; sp], groups }
    };
    // 1×1, stride 1: a plain GEMM with 70 × 70 outputs over 67 input channels.
    case(vec![2, 67, 5, 7], vec![70, 67, 1, 1], 1, 0, 1, 1).check_all_within(1e-4);
    // 1×1 stride 2 (a projection shortcut).
    case(vec![2, 9, 7, 7], vec![13, 9, 1, 1], 2, 0, 1, 1).check_all();
    // Stem-like 7×7, stride 2, padding 3.
    case(vec![2, 3, 19, 17], vec![8, 3, 7, 7], 2, 3, 1, 1).check_all_within(1e-4);
    // 3×3, stride 2, padding 2, dilation 2.
    case(vec![1, 5, 11, 10], vec![7, 5, 3, 3], 2, 2, 2, 1).check_all();
    // Groups 2, and depthwise with stride 2.
    case(vec![2, 6, 9, 8], vec![10, 3, 3, 3], 1, 1, 1, 2).check_all();
    case(vec![2, 5, 9, 9], vec![5, 1, 3, 3], 2, 1, 1, 5).check_all();
    // 1-D: stride 2, dilation 2, padding 2; and depthwise 1-D.
    case(vec![3, 5, 37], vec![7, 5, 5], 2, 2, 2, 1).check_all();
    // Strided with dilation 1 (the input gradient by phases): 1-D stride 2; a stride larger than
    // the kernel (phases no tap reaches) with wide padding; and different strides per axis.
    case(vec![2, 5, 23], vec![6, 5, 3], 2, 1, 1, 1).check_all();
    case(vec![2, 4, 13, 11], vec![5, 4, 2, 2], 3, 2, 1, 1).check_all();
    Case {
        x: vec![2, 6, 10, 9],
        w: vec![4, 3, 3, 5],
        stride: vec![3, 2],
        padding: vec![1, 2],
        dilation: vec![1, 1],
        groups: 2,
    }
    .check_all();
    case(vec![2, 4, 21], vec![4, 1, 3], 1, 1, 1, 4).check_all();
    // A long weight-gradient reduction: 4 × 16 × 16 positions per weight.
    case(vec![4, 3, 16, 16], vec![4, 3, 3, 3], 1, 1, 1, 1).check_all_within(1e-4);
}

/// Convolutions of f16 operands, as the mixed policies run them: on cooperative matrices where
/// the device has them (`scripts/coop_tests.sh`), the tiled implicit GEMM elsewhere. Tiles
/// overhanging every axis, groups, strides with dilation, 1-D, and a long weight-gradient
/// reduction.
#[test]
fn convolutions_of_halves_match_the_cpu() {
    let case = |x: Vec<usize>, w: Vec<usize>, s: usize, p: usize, d: usize, groups: usize| {
        let sp = x.len() - 2;
        Case { x, w, stride: vec![s; sp], padding: vec![p; sp], dilation: vec![d; sp], groups }
    };
    case(vec![2, 67, 5, 7], vec![70, 67, 1, 1], 1, 0, 1, 1).check_all_as(DType::F16, 1e-4);
    case(vec![2, 3, 19, 17], vec![8, 3, 7, 7], 2, 3, 1, 1).check_all_as(DType::F16, 1e-4);
    case(vec![1, 5, 11, 10], vec![7, 5, 3, 3], 2, 2, 2, 1).check_all_as(DType::F16, 1e-4);
    case(vec![2, 6, 9, 8], vec![10, 3, 3, 3], 1, 1, 1, 2).check_all_as(DType::F16, 1e-4);
    case(vec![3, 5, 37], vec![7, 5, 5], 2, 2, 2, 1).check_all_as(DType::F16, 1e-4);
    case(vec![4, 3, 16, 16], vec![4, 3, 3, 3], 1, 1, 1, 1).check_all_as(DType::F16, 1e-4);
}

/// The shapes transposed convolutions give the input derivative (`conv_transpose*d` is
/// `ConvGradInput`): 4 × 4 kernels with stride 2 and padding 1 whose result has a row and a
/// column no window reads (output padding 1), grouped and dilated.
#[test]
fn transposed_convolution_shapes_match_the_cpu() {
    Case {
        x: vec![2, 6, 9, 8],
        w: vec![4, 6, 4, 4],
        stride: vec![2, 2],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    }
    .check_all();
    Case {
        x: vec![2, 6, 10, 7],
        w: vec![8, 3, 3, 2],
        stride: vec![2, 1],
        padding: vec![0, 1],
        dilation: vec![1, 2],
        groups: 2,
    }
    .check_all();
    Case {
        x: vec![3, 4, 20],
        w: vec![6, 4, 3],
        stride: vec![2],
        padding: vec![1],
        dilation: vec![1],
        groups: 1,
    }
    .check_all();
}

/// Pool and PoolGrad on `x` (and on a version with tied maxima).
fn check_pool(op: PoolOp, x: &[usize], kernel: &[usize], stride: &[usize], padding: &[usize]) {
    let mut y = x[..2].to_vec();
    for a in 0..kernel.len() {
        y.push(window_out(x[2 + a], kernel[a], stride[a], padding[a], 1));
    }
    let (kernel, stride, padding) = (kernel.to_vec(), stride.to_vec(), padding.to_vec());
    let fwd =
        Op::Pool { op, kernel: kernel.clone(), stride: stride.clone(), padding: padding.clone() };
    let grad = Op::PoolGrad { op, kernel, stride, padding };
    for xs in [input(x, 5), tied(x, 6)] {
        check(fwd.clone(), std::slice::from_ref(&xs), &y, 1e-6);
        check(grad.clone(), &[xs, input(&y, 7)], x, 1e-6);
    }
}

#[test]
fn pooling_and_its_derivative_match_the_cpu() {
    for op in [PoolOp::Max, PoolOp::Avg] {
        // Overlapping windows with padding on odd sizes.
        check_pool(op, &[2, 3, 7, 8], &[3, 3], &[2, 2], &[1, 1]);
        // The usual 2×2 / 2, and a window wider than its stride on one axis only.
        check_pool(op, &[2, 3, 8, 6], &[2, 2], &[2, 2], &[0, 0]);
        check_pool(op, &[1, 2, 5, 9], &[2, 3], &[1, 2], &[1, 1]);
        // 1-D, including windows made of padding only (max gives −∞ there).
        check_pool(op, &[2, 3, 9], &[3], &[2], &[1]);
        check_pool(op, &[1, 2, 3], &[1], &[1], &[1]);
    }
    // A whole window of one value: the gradient goes to its first element only.
    let x = Tensor::f32(vec![1, 1, 4, 4], vec![0.5; 16]);
    let dy = input(&[1, 1, 2, 2], 8);
    let pool = |kernel: Vec<usize>| Op::PoolGrad {
        op: PoolOp::Max,
        kernel,
        stride: vec![2, 2],
        padding: vec![0, 0],
    };
    check(pool(vec![2, 2]), &[x.clone(), dy.clone()], &[1, 1, 4, 4], 0.0);
    check(pool(vec![3, 3]), &[x, input(&[1, 1, 1, 1], 9)], &[1, 1, 4, 4], 0.0);
}

#[test]
fn upsampling_and_its_derivative_match_the_cpu() {
    for (x, scale) in
        [(vec![2, 3, 5], 2), (vec![2, 3, 4, 5], 2), (vec![1, 2, 3, 3], 3), (vec![2, 1, 7], 3)]
    {
        let y: Vec<usize> =
            x.iter().enumerate().map(|(i, &d)| if i >= 2 { d * scale } else { d }).collect();
        check(Op::Upsample { scale }, &[input(&x, 10)], &y, 0.0);
        check(Op::UpsampleGrad { scale }, &[input(&y, 11)], &x, 1e-6);
    }
}

/// Convolutions split across workgroups along their reduction (`GpuOp::ConvSplit`): each
/// range's partial result against the CPU's convolution of an operand zeroed outside the range
/// — the forward (input channels × taps), the input gradient (output channels × taps, stride 1
/// and a strided dilated one) and the weight gradient (samples × positions), with groups,
/// padding and dilation away from their defaults, ranges with a tail, and more ranges than the
/// reduction fills (the last ones zero).
#[test]
fn split_convolution_ranges_match_the_cpu() {
    use crate::program::GpuOp;
    use mgn_ir::shape::conv::{Conv, Geometry};
    let (x, w) = ([2usize, 8, 9, 8], [16usize, 4, 5, 4]);
    for (stride, padding, dilation) in
        [(vec![1, 1], vec![2, 1], vec![1, 2]), (vec![2, 1], vec![2, 1], vec![2, 1])]
    {
        let geo = Geometry::new(&stride, &padding, &dilation, 2).expect("geometry");
        let y = Conv::new(&x, &w, &geo).expect("fits").out_shape();
        let (xt, wt, yt) = (input(&x, 1), input(&w, 2), input(&y, 3));
        let (s, p, d) = (stride.clone(), padding.clone(), dilation.clone());
        let forward = Op::Conv { stride: s, padding: p, dilation: d, groups: 2, has_bias: false };
        let (s, p, d) = (stride.clone(), padding.clone(), dilation.clone());
        let grad_input = Op::ConvGradInput { stride: s, padding: p, dilation: d, groups: 2 };
        let grad_weight = Op::ConvGradWeight { stride, padding, dilation, groups: 2 };
        let cases = [
            (forward, [xt.clone(), wt.clone()], &y),
            (grad_input, [yt.clone(), wt.clone()], &x.to_vec()),
            (grad_weight, [xt.clone(), yt.clone()], &w.to_vec()),
        ];
        for (conv, given, out) in cases {
            for splits in [2, 3, 5] {
                let op = GpuOp::ConvSplit { conv: conv.clone(), splits };
                let shape: Vec<usize> = [&[splits][..], out].concat();
                check_on_both(&op, &given, DType::F32, &shape, 1e-4);
            }
        }
    }
}

/// A convolution with few output tiles and its derivatives, as the GPU plan splits them
/// (`rewrite::split_k`: the weight gradient 8 × 27 over 4,096, the forward and the input
/// gradient 256 × 36 over 1,152 and 72 × 36 over 2,304), against the plan as compiled.
#[test]
fn split_convolutions_in_a_plan_match_the_plan_as_compiled() {
    use crate::program::GpuOp;
    use crate::rewrite::{for_gpu_with, Options};
    use crate::test_util::{open, run_on_cpu_plan, step};
    use mgn_ir::plan::{Mode, Plan};
    let f = DType::F32;
    let grad = Op::ConvGradWeight {
        stride: vec![1, 1],
        padding: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    };
    let same = |conv: fn(Vec<usize>, Vec<usize>, Vec<usize>) -> Op| {
        conv(vec![1, 1], vec![1, 1], vec![1, 1])
    };
    let forward = same(|stride, padding, dilation| Op::Conv {
        stride,
        padding,
        dilation,
        groups: 1,
        has_bias: false,
    });
    let grad_input = same(|stride, padding, dilation| Op::ConvGradInput {
        stride,
        padding,
        dilation,
        groups: 1,
    });
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[4, 3, 32, 32]),
        step(Op::Input { name: "dy".into() }, vec![], f, &[4, 8, 32, 32]),
        step(grad, vec![0, 1], f, &[8, 3, 3, 3]),
        step(Op::Input { name: "a".into() }, vec![], f, &[1, 128, 6, 6]),
        step(Op::Input { name: "w".into() }, vec![], f, &[256, 128, 3, 3]),
        step(forward, vec![3, 4], f, &[1, 256, 6, 6]),
        step(Op::Input { name: "w2".into() }, vec![], f, &[256, 72, 3, 3]),
        step(grad_input, vec![5, 6], f, &[1, 72, 6, 6]),
    ];
    let names = ["x", "dy", "", "a", "w", "", "w2"];
    let inputs = names.iter().enumerate().filter(|(_, n)| !n.is_empty());
    let inputs = inputs.map(|(k, n)| (n.to_string(), k as u32)).collect();
    let outputs = vec![("dw".into(), 2), ("y".into(), 5), ("dx".into(), 7)];
    let plan = Plan::of_steps(Mode::Train, steps, inputs, outputs);
    let gpu_plan = for_gpu_with(&plan, &Options::default());
    let splits: Vec<String> = gpu_plan
        .steps
        .iter()
        .filter(|s| matches!(s.op, GpuOp::ConvSplit { .. }))
        .map(|s| s.op.describe())
        .collect();
    assert_eq!(splits.len(), 3, "{splits:?}");
    let shapes = [
        &[4, 3, 32, 32][..],
        &[4, 8, 32, 32],
        &[1, 128, 6, 6],
        &[256, 128, 3, 3],
        &[256, 72, 3, 3],
    ];
    let tensors: Vec<Tensor> =
        shapes.iter().enumerate().map(|(k, s)| input(s, 4 + k as u32)).collect();
    let given: Vec<(&str, &Tensor)> =
        ["x", "dy", "a", "w", "w2"].into_iter().zip(&tensors).collect();
    let want = run_on_cpu_plan(&plan, &[], &given).outputs;
    let Some(mut gpu) = open(plan, &[]) else { return };
    let got = gpu.run(&given, 0).expect("runs").outputs;
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            // Sums of up to 4,096 products of numbers in [-1, 1) in f32, in another order:
            // rounding of order K · 2⁻²⁴ · |term|, some 1e-4 here.
            assert!((a - b).abs() <= 5e-4 * (1.0 + b.abs()), "{name}[{i}]: {a} vs {b}");
        }
    }
}

/// `CoopUse::Measured` (the default): each convolution and product of halves both kernels run
/// is measured once per shape when the session opens, its verdict kept on disk for the next
/// session, and the results are the CPU's whichever kernel a verdict keeps. On a device without
/// cooperative matrices (CI's lavapipe) nothing is measured; the cooperative-matrix lavapipe
/// measures.
#[test]
fn kernels_measured_on_the_device_keep_their_results() {
    use crate::limits::{CoopUse, FORCED_COOP_USE};
    use crate::session::choices::FORCED_CACHE;
    use crate::test_util::{open, run_on_cpu_plan, step, weight};
    use mgn_ir::plan::{Mode, Plan};
    let dir = std::env::temp_dir().join(format!("mgn-measured-{}", std::process::id()));
    FORCED_COOP_USE.set(Some(CoopUse::Measured));
    FORCED_CACHE.set(Some(dir.clone()));
    let (f, h) = (DType::F32, DType::F16);
    let conv = |padding: usize| Op::Conv {
        stride: vec![1, 1],
        padding: vec![padding; 2],
        dilation: vec![1, 1],
        groups: 1,
        has_bias: false,
    };
    // Two convolutions of one shape (one measurement), one of another, and a product.
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[2, 16, 12, 12]),
        step(Op::Cast, vec![0], h, &[2, 16, 12, 12]),
        step(Op::Param { index: 0 }, vec![], f, &[32, 16, 3, 3]),
        step(Op::Param { index: 1 }, vec![], f, &[32, 16, 3, 3]),
        step(Op::Param { index: 2 }, vec![], f, &[24, 16, 1, 1]),
        step(Op::Cast, vec![2], h, &[32, 16, 3, 3]),
        step(Op::Cast, vec![3], h, &[32, 16, 3, 3]),
        step(Op::Cast, vec![4], h, &[24, 16, 1, 1]),
        step(conv(1), vec![1, 5], f, &[2, 32, 12, 12]),
        step(conv(1), vec![1, 6], f, &[2, 32, 12, 12]),
        step(conv(0), vec![1, 7], f, &[2, 24, 12, 12]),
        step(Op::Input { name: "m".into() }, vec![], f, &[24, 32]),
        step(Op::Cast, vec![11], h, &[24, 32]),
        step(Op::Param { index: 3 }, vec![], f, &[32, 40]),
        step(Op::Cast, vec![13], h, &[32, 40]),
        step(Op::MatMul, vec![12, 14], f, &[24, 40]),
    ];
    let outputs = vec![("a".into(), 8), ("b".into(), 9), ("c".into(), 10), ("d".into(), 15)];
    let inputs = vec![("x".into(), 0), ("m".into(), 11)];
    let plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
    let shapes = [&[32, 16, 3, 3][..], &[32, 16, 3, 3], &[24, 16, 1, 1], &[32, 40]];
    let params: Vec<Tensor> = shapes.iter().enumerate().map(|(k, s)| input(s, k as u32)).collect();
    let names = ["w1", "w2", "w3", "w4"];
    let specs = names.iter().zip(&shapes).map(|(n, s)| weight(n, s)).collect();
    let plan = Plan { params: specs, ..plan };
    let (x, m) = (input(&[2, 16, 12, 12], 9), input(&[24, 32], 10));
    let given = [("x", &x), ("m", &m)];
    let want = run_on_cpu_plan(&plan, &params, &given).outputs;
    let file = || std::fs::read_dir(dir.join("choices")).ok().and_then(|mut d| d.next());
    let tiles_exist =
        || crate::device::GpuDevice::chosen().is_ok_and(|(_, limits)| limits.coop_tile().is_some());
    // Opens a session, checks its results, and returns how many convolutions it measured
    // and how many of its kernels run on the tiles.
    let opened = |why: &str| -> Option<(usize, usize)> {
        let mut gpu = open(plan.clone(), &params)?;
        let got = gpu.run(&given, 0).expect("runs").outputs;
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{why}: {name}[{i}]: {a} vs {b}");
            }
        }
        let tiles = gpu.kernel_bodies().iter().filter(|b| b.contains("coop_mat")).count();
        let (measured, known) = gpu.choices();
        assert_eq!(measured, gpu.measured_kernels().len(), "{why}");
        // Every step with two kernels is settled by a verdict on file or measured: a complete
        // file settles all four, none settles any.
        assert_eq!(known, if measured == 0 && tiles_exist() { 4 } else { 0 }, "{why}");
        Some((measured, tiles))
    };
    let measured = |why: &str| opened(why).map(|(m, _)| m);
    let Some(first) = measured("first session") else { return };
    let (_, limits) = crate::device::GpuDevice::chosen().expect("a device");
    if limits.coop_tile().is_none() {
        assert_eq!(first, 0, "no tiles: nothing to measure");
        assert!(file().is_none(), "nothing measured, nothing written");
        return;
    }
    assert_eq!(first, 3, "one measurement a shape");
    let path = file().expect("the verdicts' file").expect("readable").path();
    assert_eq!(measured("verdicts known"), Some(0), "the next session measures nothing");
    // Each kernel, as a verdict keeps it, gives the CPU's results.
    let text = std::fs::read_to_string(&path).unwrap();
    for (kept, on_tiles) in [("tiles", 3), ("tiled", 0)] {
        let forced = text.replace("\ttiled\t", &format!("\t{kept}\t"));
        std::fs::write(&path, forced.replace("\ttiles\t", &format!("\t{kept}\t"))).unwrap();
        assert_eq!(opened(kept), Some((0, on_tiles)), "kernels of three shapes, {kept}");
    }
    // A damaged file is measured again, and written whole.
    std::fs::write(&path, "not a verdict\n").unwrap();
    assert_eq!(measured("damaged file"), Some(3));
    assert_eq!(measured("rewritten file"), Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}
