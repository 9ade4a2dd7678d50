//! The matmul kernels (`kernels/matmul.rs`) against the CPU backend: each of the three kernels
//! (tiled, few rows, few columns) on odd sizes that leave partial tiles along m, n and k, with
//! broadcast batches and 1-D operands. Shapes stay small: CI runs them on lavapipe.

use super::test_util::{check_on_both, values};
use mgn_ir::op::Op;
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

/// The output shape torch.matmul gives (1-D operands promoted, then their axis dropped).
fn out_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let a2 = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2 = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let rank = ab.len().max(bb.len());
    let mut out = vec![1; rank];
    for s in [ab, bb] {
        for (j, &d) in s.iter().enumerate() {
            if d != 1 {
                out[j + rank - s.len()] = d;
            }
        }
    }
    if a.len() > 1 {
        out.push(a2[a2.len() - 2]);
    }
    if b.len() > 1 {
        out.push(b2[b2.len() - 1]);
    }
    out
}

fn check(a: &[usize], b: &[usize]) {
    let ta = Tensor::f32(a.to_vec(), values(a.iter().product(), 17));
    let tb = Tensor::f32(b.to_vec(), values(b.iter().product(), 4242));
    // Sums of up to a few hundred products, in another order than the CPU's.
    check_on_both(&Op::MatMul, &[ta, tb], DType::F32, &out_shape(a, b), 1e-4);
}

#[test]
fn tiled_matmul_matches_the_cpu_on_odd_sizes() {
    check(&[9, 13], &[13, 11]);
    check(&[65, 33], &[33, 17]);
    check(&[130, 70], &[70, 129]);
    // Whole tiles along every axis (no edge checks generated) under either workgroup width.
    check(&[64, 16], &[16, 64]);
}

#[test]
fn skinny_matmuls_match_the_cpu() {
    check(&[1, 1], &[1, 1]);
    check(&[3, 5], &[5, 7]);
    // One-token decoding: one row against many columns, k split over lanes.
    check(&[1, 300], &[300, 1000]);
    check(&[300], &[300, 1000]);
    check(&[5, 37], &[37, 700]);
    // Matrix × vector and a dot product: k split over lanes, summed in shared memory.
    check(&[50, 300], &[300, 1]);
    check(&[50, 300], &[300]);
    check(&[300], &[300]);
    check(&[20, 9], &[9, 3]);
}

#[test]
fn batched_matmuls_broadcast_like_torch() {
    // A shared right operand: the batch folds into rows (tiled, and few rows).
    check(&[2, 3, 9, 13], &[13, 10]);
    check(&[3, 1, 7], &[7, 20]);
    // A broadcast left operand, and batch axes broadcast on both sides.
    check(&[1, 9, 13], &[4, 13, 10]);
    check(&[2, 1, 3, 5], &[4, 5, 12]);
    check(&[2, 3, 5, 7], &[2, 1, 7, 2]);
    check(&[7], &[2, 7, 30]);
    check(&[2, 5, 7], &[7]);
    // Enough batch items for the 8×8 register blocks (a few of their tiles each).
    check(&[2, 132, 9, 10], &[132, 10, 9]);
}

/// Every kernel variant in one plan, so one device opening covers them all (some drivers, such
/// as NVIDIA's in a container, refuse after many openings in one process).
#[test]
fn every_variant_in_one_plan_matches_the_cpu() {
    use super::test_util::{assert_close, run_on_cpu, step};
    use mgn_ir::plan::{Mode, Plan};
    let cases: [(&[usize], &[usize]); 10] = [
        (&[130, 70], &[70, 129]),
        (&[65, 33], &[33, 17]),
        (&[64, 16], &[16, 64]),
        (&[1, 300], &[300, 1000]),
        (&[5, 37], &[37, 700]),
        (&[50, 300], &[300]),
        (&[300], &[300]),
        (&[2, 3, 9, 13], &[13, 10]),
        (&[1, 9, 13], &[4, 13, 10]),
        (&[2, 132, 9, 10], &[132, 10, 9]),
    ];
    let mut steps = Vec::new();
    let mut tensors = Vec::new();
    let mut outputs = Vec::new();
    for (c, (a, b)) in cases.iter().enumerate() {
        for (j, s) in [a, b].iter().enumerate() {
            tensors
                .push(Tensor::f32(s.to_vec(), values(s.iter().product(), (c * 2 + j) as u32 * 31)));
            steps.push(step(Op::Input { name: format!("x{}", c * 2 + j) }, vec![], DType::F32, s));
        }
    }
    for (c, (a, b)) in cases.iter().enumerate() {
        outputs.push((format!("y{c}"), steps.len() as u32));
        steps.push(step(
            Op::MatMul,
            vec![c as u32 * 2, c as u32 * 2 + 1],
            DType::F32,
            &out_shape(a, b),
        ));
    }
    let inputs: Vec<(String, u32)> =
        (0..tensors.len()).map(|i| (format!("x{i}"), i as u32)).collect();
    let plan = Plan::of_steps(Mode::Infer, steps, inputs.clone(), outputs);
    let Some(mut gpu) = super::test_util::open(plan, &[]) else { return };
    let given: Vec<(&str, &Tensor)> =
        inputs.iter().map(|(n, i)| (n.as_str(), &tensors[*i as usize])).collect();
    let got = gpu.run(&given, 0).expect("runs").outputs;
    for (c, (a, b)) in cases.iter().enumerate() {
        let want = run_on_cpu(
            &Op::MatMul,
            &[&tensors[c * 2], &tensors[c * 2 + 1]],
            DType::F32,
            &out_shape(a, b),
        );
        assert_close(&Op::MatMul, &got[c].1, &want, 1e-4);
    }
}

/// Throughput of the matmul kernels on the workloads' product shapes and square ones: not a
/// check, a measurement for a real GPU (`cargo test --release -p mgn-gpu matmul_throughput --
/// --ignored --nocapture`; `MGN_PROFILE=1` for each product's own GPU time). Both operands are
/// parameters, so a run moves nothing between host and device; each run is one submission of
/// `repeat` independent products. `wᵀ` is a weight stored `[n, k]` and read in place, as every
/// linear layer does. `MGN_MM_DTYPE=f16` times products of f16 operands held as halves,
/// `rounded` and `rounded-both` the mixed policy's (below): on cooperative matrices where the
/// device has them and `MGN_COOP` gives these products the tiles (`MGN_COOP=1` gives all of
/// them), else the tiled kernel on the same operands. `MGN_MM_ONLY=whisper,square` times only
/// the shapes whose names contain one of the words.
#[test]
#[ignore]
fn matmul_throughput() {
    // `rounded`: f32 operands cast to f16 for the product, as the mixed policy reads them (the
    // left one a rounded view, the right one held as halves: `test_util::time_op_cast`).
    // `rounded-both`: both f32 operands read through rounded views, as a training plan's
    // products read theirs.
    use super::test_util::Cast;
    let (dtype, cast) = match std::env::var("MGN_MM_DTYPE").as_deref() {
        Ok("f16") => (DType::F16, None),
        Ok("rounded") => (DType::F32, Some(Cast::Weights(DType::F16))),
        Ok("rounded-both") => (DType::F32, Some(Cast::All(DType::F16))),
        _ => (DType::F32, None),
    };
    // (name, a, b, b stored transposed)
    let shapes: [(&str, &[usize], &[usize], bool); 16] = [
        ("decode up", &[1, 576], &[576, 1536], true),
        ("decode head", &[1, 576], &[576, 49152], true),
        ("square 1024", &[1024, 1024], &[1024, 1024], false),
        ("square 2048", &[2048, 2048], &[2048, 2048], false),
        ("square 4096", &[4096, 4096], &[4096, 4096], false),
        ("square 4096 wT", &[4096, 4096], &[4096, 4096], true),
        ("whisper qkv", &[1500, 384], &[384, 384], true),
        ("whisper fc1", &[1500, 384], &[384, 1536], true),
        ("whisper fc2", &[1500, 1536], &[1536, 384], true),
        ("whisper scores", &[6, 1500, 64], &[6, 64, 1500], false),
        ("whisper p.v", &[6, 1500, 1500], &[6, 1500, 64], false),
        ("smollm2 up", &[128, 576], &[576, 1536], true),
        ("smollm2 down", &[128, 1536], &[1536, 576], true),
        ("smollm2 head", &[128, 576], &[576, 49152], true),
        ("minilm qkv", &[1024, 384], &[384, 384], true),
        ("minilm fc1", &[1024, 384], &[384, 1536], true),
    ];
    let only = std::env::var("MGN_MM_ONLY").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|w| name.contains(w));
    for (name, a, b, bt) in shapes.into_iter().filter(|s| wanted(s.0)) {
        let out = out_shape(a, b);
        let k = *a.last().unwrap();
        let flops = 2.0 * out.iter().product::<usize>() as f64 * k as f64;
        let repeat = ((4e10 / flops) as usize).clamp(1, 20);
        let Some((s, device)) =
            super::test_util::time_op_cast(&Op::MatMul, &[a, b], &out, (repeat, bt), dtype, cast)
        else {
            continue;
        };
        println!(
            "matmul {name:>15} {a:?} × {b:?}{} {}: {:9.1} µs, {:6.2} TFLOP/s ({device})",
            if bt { " (wT)" } else { "" },
            match cast {
                Some(Cast::Weights(_)) => "f16 (rounded)".to_string(),
                Some(Cast::All(_)) => "f16 (both rounded)".to_string(),
                None => dtype.to_string(),
            },
            s * 1e6,
            flops / s / 1e12,
        );
    }
}

/// `x @ wᵀ` with `w` a parameter, as every linear layer lowers: the transpose is a view and the
/// matmul reads `w` in place, transposed — for each kernel (few columns, the swapped decode
/// product, tiled) against the CPU, which transposes for real.
#[test]
fn a_transposed_weight_is_read_in_place() {
    use super::test_util::{assert_close, step};
    use mgn_ir::plan::{Mode, Plan};
    for (x_shape, n) in [
        (vec![5, 7], 3),
        (vec![1, 70], 300),
        (vec![2, 33], 40),
        (vec![65, 33], 70),
        (vec![2, 3, 19], 21),
        (vec![129, 8], 9),
    ] {
        let k = *x_shape.last().expect("2-D or more");
        let mut y_shape = x_shape.clone();
        *y_shape.last_mut().expect("checked") = n;
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &x_shape),
            step(Op::Param { index: 0 }, vec![], f, &[n, k]),
            step(Op::Permute { perm: vec![1, 0] }, vec![1], f, &[k, n]),
            step(Op::MatMul, vec![0, 2], f, &y_shape),
        ];
        let plan = Plan {
            params: vec![super::test_util::weight("w", &[n, k])],
            ..Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 3)])
        };
        let transposed = crate::memory::transposed_views(&crate::program::GpuPlan::of(&plan));
        assert_eq!(transposed, vec![false, false, true, false]);
        let x = Tensor::f32(x_shape.clone(), values(x_shape.iter().product(), 5));
        let w = Tensor::f32(vec![n, k], values(n * k, 77));
        let params = std::slice::from_ref(&w);
        let want =
            super::test_util::run_on_cpu_plan(&plan, params, &[("x", &x)]).outputs.remove(0).1;
        let Some(mut gpu) = super::test_util::open(plan, std::slice::from_ref(&w)) else { return };
        let got = gpu.run(&[("x", &x)], 0).expect("gpu runs").outputs.remove(0).1;
        assert_close(&Op::MatMul, &got, &want, 1e-4);
    }
}

/// f16 values as the host holds them (f32s, each exactly a half).
fn halves(shape: &[usize], seed: u32) -> Tensor {
    let v = values(shape.iter().product(), seed);
    let data = v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    Tensor { dtype: DType::F16, shape: shape.to_vec(), data: mgn_ir::tensor::Data::F32(data) }
}

/// Products of f16 operands stored as halves, as the mixed policies' inference plans hold their
/// weights: on a device with cooperative matrices and `MGN_COOP=1` they take that kernel
/// (lavapipe from Mesa 25.1 has them, in 8×8 tiles; `scripts/coop_tests.sh` runs these tests
/// there), elsewhere the tiled one.
/// Partial tiles on every axis and whole ones, batches, either operand transposed, a scale,
/// k split into ranges, and the skinny kernels.
#[test]
fn products_of_halves_match_the_cpu() {
    use crate::program::GpuOp;
    type Case = (&'static [usize], &'static [usize], bool, bool, usize, &'static [usize]);
    let cases: [Case; 14] = [
        // Few rows against a weight read in place (one-token decoding, the weight's rows of
        // whole words taken a word at a time: k even), with an odd k, and few columns.
        (&[1, 300], &[40, 300], false, true, 1, &[1, 40]),
        (&[3, 301], &[40, 301], false, true, 1, &[3, 40]),
        (&[70, 64], &[64, 5], false, false, 1, &[70, 5]),
        (&[3, 301], &[301, 40], false, false, 1, &[3, 40]),
        (&[130, 70], &[70, 129], false, false, 1, &[130, 129]),
        (&[64, 64], &[64, 64], false, false, 1, &[64, 64]),
        (&[2, 65, 33], &[2, 17, 33], false, true, 1, &[2, 65, 17]),
        (&[3, 40, 20], &[3, 40, 24], true, false, 1, &[3, 20, 24]),
        (&[40, 300], &[300, 24], false, false, 3, &[3, 40, 24]),
        (&[2, 300, 20], &[2, 24, 300], true, true, 2, &[2, 2, 20, 24]),
        // Rows of whole 16-byte runs (8 halves), which the cooperative-matrix kernel takes, in
        // every layout and split.
        (&[130, 72], &[72, 136], false, false, 1, &[130, 136]),
        (&[130, 72], &[136, 72], false, true, 1, &[130, 136]),
        (&[2, 72, 40], &[2, 72, 48], true, false, 1, &[2, 40, 48]),
        (&[64, 512], &[512, 32], false, false, 2, &[2, 64, 32]),
    ];
    for (a, b, ta, tb, splits, out) in cases {
        let x = [halves(a, 17), halves(b, 4242)];
        let op = GpuOp::MatMulT { ta, tb, alpha: if ta { 0.5 } else { 1.0 }, splits };
        // Sums of up to 300 exact products (a half times a half is exact in f32), in another
        // order than the CPU's.
        check_on_both(&op, &x, DType::F32, out, 1e-5);
    }
    let x = [halves(&[2, 3, 20, 30], 5), halves(&[30, 40], 6)];
    check_on_both(&Op::MatMul, &x, DType::F32, &[2, 3, 20, 40], 1e-5);
}

/// f32 values cast to f16 and read only by a product (how the mixed policies round every
/// operand of a training plan's products) are rounded as the product loads them, with an
/// epilogue fused into its store: the same numbers as the plan as compiled.
#[test]
fn products_of_rounded_values_match_the_plan_as_compiled() {
    use super::test_util::{assert_close, run_on_cpu_plan, step};
    use mgn_ir::op::UnaryOp;
    use mgn_ir::plan::{Mode, Plan};
    let (f, h) = (DType::F32, DType::F16);
    // The tiled kernel, few columns and few rows (the rounded operand every invocation reads
    // staged once a workgroup).
    for (m, k, n) in [(70, 45, 66), (70, 64, 5), (3, 301, 2), (3, 301, 40)] {
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[m, k]),
            step(Op::Input { name: "w".into() }, vec![], f, &[k, n]),
            step(Op::Cast, vec![0], h, &[m, k]),
            step(Op::Cast, vec![1], h, &[k, n]),
            step(Op::MatMul, vec![2, 3], f, &[m, n]),
            step(Op::Unary(UnaryOp::Relu), vec![4], f, &[m, n]),
        ];
        let io = (vec![("x".into(), 0), ("w".into(), 1)], vec![("y".into(), 5)]);
        let plan = Plan::of_steps(Mode::Infer, steps, io.0, io.1);
        let rounded = crate::memory::rounded_views(&crate::program::GpuPlan::of(&plan));
        assert_eq!(rounded, vec![false, false, true, true, false, false]);
        // Values that are not halves, so the rounding matters.
        let x = Tensor::f32(vec![m, k], values(m * k, 3).iter().map(|v| v * 1.001).collect());
        let w = Tensor::f32(vec![k, n], values(k * n, 4).iter().map(|v| v * 0.999).collect());
        let given = [("x", &x), ("w", &w)];
        let want = run_on_cpu_plan(&plan, &[], &given).outputs.remove(0).1;
        let Some(mut gpu) = super::test_util::open(plan, &[]) else { return };
        let got = gpu.run(&given, 0).expect("gpu runs").outputs.remove(0).1;
        assert_close(&Op::MatMul, &got, &want, 1e-5);
    }
    // Rows of whole 16-byte runs (k, m or n a multiple of 4), which the cooperative-matrix
    // kernel loads four words at a time, in every layout: A or B stored transposed (a permute
    // of the cast, read in place), tiles overhanging m and n, and a deep k the plan splits.
    for (m, k, n, ta, tb) in [
        (130, 64, 72, false, false),
        (130, 64, 72, false, true),
        (68, 96, 40, true, false),
        (68, 96, 44, true, true),
        (36, 2048, 40, false, true),
    ] {
        let (xs, ws) = (if ta { [k, m] } else { [m, k] }, if tb { [n, k] } else { [k, n] });
        let swap = Op::Permute { perm: vec![1, 0] };
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &xs),
            step(Op::Input { name: "w".into() }, vec![], f, &ws),
            step(Op::Cast, vec![0], h, &xs),
            step(Op::Cast, vec![1], h, &ws),
            step(if ta { swap.clone() } else { Op::Reshape }, vec![2], h, &[m, k]),
            step(if tb { swap } else { Op::Reshape }, vec![3], h, &[k, n]),
            step(Op::MatMul, vec![4, 5], f, &[m, n]),
        ];
        let io = (vec![("x".into(), 0), ("w".into(), 1)], vec![("y".into(), 6)]);
        let plan = Plan::of_steps(Mode::Infer, steps, io.0, io.1);
        let x = Tensor::f32(xs.to_vec(), values(m * k, 5).iter().map(|v| v * 1.001).collect());
        let w = Tensor::f32(ws.to_vec(), values(k * n, 6).iter().map(|v| v * 0.999).collect());
        let given = [("x", &x), ("w", &w)];
        let want = run_on_cpu_plan(&plan, &[], &given).outputs.remove(0).1;
        let Some(mut gpu) = super::test_util::open(plan, &[]) else { return };
        let got = gpu.run(&given, 0).expect("gpu runs").outputs.remove(0).1;
        assert_close(&Op::MatMul, &got, &want, 1e-5);
    }
}

/// Products of normed rows (`GpuOp::NormedProduct`): each norm (layer norm and RMS norm, with
/// and without their weight and bias) under each product that takes one (a plain product, a
/// scaled one of a transposed weight, one split along k, one with an epilogue), on sizes that
/// leave partial tiles along m, n and k and on whole ones. Whole products take their statistics
/// from the staged panels (`panel_stats`), split ones from a pass of their own; rows far from
/// zero mean (300 ± 1) check the pilot that keeps the first exact.
#[test]
fn normed_products_match_the_cpu() {
    use crate::program::{Elem, GpuOp};
    use mgn_ir::op::BinaryOp;
    let ln = |has_weight, has_bias| Op::LayerNorm { eps: 1e-5, has_weight, has_bias };
    let rms = |has_weight| Op::RmsNorm { eps: 1e-6, has_weight };
    let t = |alpha, splits, tb| GpuOp::MatMulT { ta: false, tb, alpha, splits };
    let bias = vec![Elem::Input(0), Elem::Input(1), Elem::Binary(BinaryOp::Add, 0, 1)];
    let epilogue = GpuOp::MatMulEpilogue { program: bias, ta: false, tb: false };
    let plain = || GpuOp::Plan(Op::MatMul);
    let cases: Vec<NormedCase> = vec![
        (ln(true, true), plain(), &[2, 37, 72], 3.0, &[72, 40], vec![], &[2, 37, 40]),
        (ln(false, false), t(0.5, 1, true), &[50, 96], 3.0, &[33, 96], vec![], &[50, 33]),
        (rms(true), t(1.0, 3, false), &[20, 300], 3.0, &[300, 24], vec![], &[3, 20, 24]),
        (rms(false), epilogue.clone(), &[70, 64], 3.0, &[64, 130], vec![&[130]], &[70, 130]),
        (ln(true, false), plain(), &[130, 256], 3.0, &[256, 129], vec![], &[130, 129]),
        (ln(true, true), t(1.0, 1, true), &[33, 200], 300.0, &[48, 200], vec![], &[33, 48]),
        (ln(true, true), t(1.0, 2, false), &[40, 300], 300.0, &[300, 24], vec![], &[2, 40, 24]),
        (ln(false, true), epilogue, &[90, 70], 300.0, &[70, 66], vec![&[66]], &[90, 66]),
        (rms(true), plain(), &[65, 100], 300.0, &[100, 36], vec![], &[65, 36]),
    ];
    check_normed_products(cases, 101);
}

/// Products of a few normed rows by a transposed weight (`GpuOp::NormedProduct` at one-token
/// decoding's shapes): the few-columns kernel, swapped, finds each row's statistics in a pass
/// of its own (`normed_vector`). One row and eight, k below and above the workgroup's width,
/// both norms with and without weight and bias, a scaled product and one with an epilogue;
/// rows far from zero mean (300 ± 1) check that the layer norm's variance keeps its digits.
#[test]
fn normed_products_of_a_few_rows_match_the_cpu() {
    use crate::program::{Elem, GpuOp};
    use mgn_ir::op::BinaryOp;
    let ln = |has_weight, has_bias| Op::LayerNorm { eps: 1e-5, has_weight, has_bias };
    let rms = |has_weight| Op::RmsNorm { eps: 1e-6, has_weight };
    let t = |alpha| GpuOp::MatMulT { ta: false, tb: true, alpha, splits: 1 };
    let bias = vec![Elem::Input(0), Elem::Input(1), Elem::Binary(BinaryOp::Add, 0, 1)];
    let epilogue = GpuOp::MatMulEpilogue { program: bias, ta: false, tb: true };
    let cases: Vec<NormedCase> = vec![
        (rms(true), t(1.0), &[1, 1, 576], 0.0, &[40, 576], vec![], &[1, 1, 40]),
        (rms(false), t(0.5), &[8, 96], 3.0, &[33, 96], vec![], &[8, 33]),
        (rms(true), epilogue.clone(), &[2, 1, 300], 3.0, &[66, 300], vec![&[66]], &[2, 1, 66]),
        (ln(true, true), t(1.0), &[1, 130], 300.0, &[20, 130], vec![], &[1, 20]),
        (ln(false, false), t(1.0), &[5, 1000], 3.0, &[17, 1000], vec![], &[5, 17]),
        (ln(true, false), epilogue, &[3, 64], 300.0, &[9, 64], vec![&[9]], &[3, 9]),
    ];
    check_normed_products(cases, 103);
}

/// A mixed policy's one-token products: an RMS norm (and a layer norm of 8 rows) cast to f16
/// and read by products of f16 weights stored transposed. The products take the norm and the
/// cast (`NormedProduct` with `rounded`: the normed value rounded to f16 before the product),
/// and compute what the plan as compiled computes on the CPU.
#[test]
fn products_of_a_few_rounded_normed_rows_match_the_plan_as_compiled() {
    use super::test_util::{assert_close, run_on_cpu_plan, step};
    use crate::program::GpuOp;
    use mgn_ir::plan::{Mode, Plan};
    let (f, h) = (DType::F32, DType::F16);
    let rms = Op::RmsNorm { eps: 1e-5, has_weight: true };
    let ln = Op::LayerNorm { eps: 1e-5, has_weight: true, has_bias: true };
    for (norm, m, k, n) in [(rms, 1, 576, 40), (ln, 8, 130, 33)] {
        let params = crate::program::norm_operands(&norm).expect("a norm") - 1;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[m, k]), // 0
            step(Op::Input { name: "g".into() }, vec![], f, &[k]),    // 1
            step(Op::Input { name: "w".into() }, vec![], f, &[n, k]), // 2
            step(norm, [0, 1, 1][..1 + params].to_vec(), f, &[m, k]), // 3
            step(Op::Cast, vec![3], h, &[m, k]),                      // 4
            step(Op::Cast, vec![2], h, &[n, k]),                      // 5
            step(Op::Permute { perm: vec![1, 0] }, vec![5], h, &[k, n]), // 6
            step(Op::MatMul, vec![4, 6], f, &[m, n]),                 // 7
        ];
        let inputs = vec![("x".into(), 0), ("g".into(), 1), ("w".into(), 2)];
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, vec![("y".into(), 7)]);
        let gpu_plan = crate::rewrite::for_gpu(&plan);
        let normed = gpu_plan
            .steps
            .iter()
            .any(|s| matches!(s.op, GpuOp::NormedProduct { rounded: Some(DType::F16), .. }));
        assert!(normed, "{:#?}", gpu_plan.steps);
        let x = Tensor::f32(vec![m, k], values(m * k, 7).iter().map(|v| v + 3.0).collect());
        let g = Tensor::f32(vec![k], values(k, 8).iter().map(|v| v + 1.0).collect());
        let w = Tensor::f32(vec![n, k], values(n * k, 9));
        let given = [("x", &x), ("g", &g), ("w", &w)];
        let want = run_on_cpu_plan(&plan, &[], &given).outputs.remove(0).1;
        let Some(mut gpu) = super::test_util::open(plan, &[]) else { return };
        let got = gpu.run(&given, 0).expect("gpu runs").outputs.remove(0).1;
        // Both round the same normed values to f16, but one computed an f32 ulp apart may
        // round to the neighbouring half.
        assert_close(&Op::MatMul, &got, &want, 1e-4);
    }
}

/// A gated feed-forward at one-token shapes, `(silu(x·gᵀ) · (x·uᵀ) + r) · 0.5`, of a normed
/// `x` (RMS norm): the gate's product and the up product whose epilogue reads it become one
/// `ProductPair` (inside the norm's `NormedProduct`), in f32 and with the mixed policy's casts
/// to f16, with 1 and 8 rows (3 of them at 300 ± 1 in k = 1000's case); the GPU computes what
/// the plan as compiled computes on the CPU.
#[test]
fn gate_and_up_products_as_one_pair_match_the_plan_as_compiled() {
    use super::test_util::{assert_close, run_on_cpu_plan, step};
    use crate::program::GpuOp;
    use mgn_ir::op::{BinaryOp, UnaryOp};
    use mgn_ir::plan::{Mode, Plan};
    let f = DType::F32;
    for (m, k, n, half) in [(1, 576, 40, None), (8, 96, 33, Some(DType::F16)), (3, 1000, 17, None)]
    {
        let h = half.unwrap_or(f);
        let cast = |x: u32, s: &[usize]| match half {
            Some(h) => step(Op::Cast, vec![x], h, s),
            None => step(Op::Reshape, vec![x], f, s),
        };
        let t = Op::Permute { perm: vec![1, 0] };
        // The products read the norm itself in f32, its cast with the mixed policy.
        let xin = if half.is_some() { 6 } else { 5 };
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[m, k]), // 0
            step(Op::Input { name: "g".into() }, vec![], f, &[k]),    // 1
            step(Op::Input { name: "wg".into() }, vec![], f, &[n, k]), // 2
            step(Op::Input { name: "wu".into() }, vec![], f, &[n, k]), // 3
            step(Op::Input { name: "r".into() }, vec![], f, &[n]),    // 4
            step(Op::RmsNorm { eps: 1e-5, has_weight: true }, vec![0, 1], f, &[m, k]), // 5
            cast(5, &[m, k]),                                         // 6
            cast(2, &[n, k]),                                         // 7
            cast(3, &[n, k]),                                         // 8
            step(t.clone(), vec![7], h, &[k, n]),                     // 9
            step(t, vec![8], h, &[k, n]),                             // 10
            step(Op::MatMul, vec![xin, 9], f, &[m, n]),               // 11: gate
            step(Op::MatMul, vec![xin, 10], f, &[m, n]),              // 12: up
            step(Op::Unary(UnaryOp::Silu), vec![11], f, &[m, n]),     // 13
            step(Op::Binary(BinaryOp::Mul), vec![13, 12], f, &[m, n]), // 14
            step(Op::Binary(BinaryOp::Add), vec![14, 4], f, &[m, n]), // 15
            step(Op::Constant { value: 0.5 }, vec![], f, &[]),        // 16
            step(Op::Binary(BinaryOp::Mul), vec![15, 16], f, &[m, n]), // 17
        ];
        let names = ["x", "g", "wg", "wu", "r"];
        let inputs = names.iter().enumerate().map(|(i, s)| (s.to_string(), i as u32)).collect();
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, vec![("y".into(), 17)]);
        plan.validate().expect("valid");
        let gpu_plan = crate::rewrite::for_gpu(&plan);
        let paired = gpu_plan.steps.iter().any(|s| match &s.op {
            GpuOp::NormedProduct { op, .. } => matches!(**op, GpuOp::ProductPair { .. }),
            _ => false,
        });
        assert!(paired, "{:#?}", gpu_plan.steps);
        assert_eq!(gpu_plan.steps.iter().filter(|s| s.op.is_contraction()).count(), 1);
        let shifted = |s: &[usize], seed, by: f32| {
            let v = values(s.iter().product(), seed).into_iter().map(|v| v + by);
            Tensor::f32(s.to_vec(), v.collect())
        };
        let x = shifted(&[m, k], 11, if k == 1000 { 300.0 } else { 0.0 });
        let (g, wg, wu, r) = (
            shifted(&[k], 12, 1.0),
            shifted(&[n, k], 13, 0.0),
            shifted(&[n, k], 14, 0.0),
            shifted(&[n], 15, 0.0),
        );
        let given = [("x", &x), ("g", &g), ("wg", &wg), ("wu", &wu), ("r", &r)];
        let want = run_on_cpu_plan(&plan, &[], &given).outputs.remove(0).1;
        let Some(mut gpu) = super::test_util::open(plan, &[]) else { return };
        let got = gpu.run(&given, 0).expect("gpu runs").outputs.remove(0).1;
        assert_close(&Op::MatMul, &got, &want, 1e-4);
    }
}

/// (norm, product, x, its rows' offset, b, the product's extra inputs, output)
type NormedCase<'a> =
    (Op, crate::program::GpuOp, &'a [usize], f32, &'a [usize], Vec<&'a [usize]>, &'a [usize]);

/// Each case's `GpuOp::NormedProduct` on the GPU against the CPU, x's rows shifted by the case's
/// offset (rows far from zero mean: a norm that skipped its centring would show), the norm's
/// weight near 1 and its bias near 0.
fn check_normed_products(cases: Vec<NormedCase>, seed_step: u32) {
    for (c, (norm, op, x, shift, b, extra, out)) in cases.into_iter().enumerate() {
        let seed = c as u32 * seed_step;
        let tensor = |s: &[usize], seed: u32, shift: f32| {
            let v = values(s.iter().product(), seed).into_iter().map(|v| v + shift).collect();
            Tensor::f32(s.to_vec(), v)
        };
        let mut inputs = vec![tensor(x, seed, shift), tensor(b, seed + 1, 0.0)];
        inputs.extend(extra.iter().map(|s| tensor(s, seed + 2, 0.0)));
        let k = *x.last().expect("rows");
        let params = crate::program::norm_operands(&norm).expect("a norm") - 1;
        inputs.extend((0..params).map(|p| tensor(&[k], seed + 3 + p as u32, 1.0 - p as f32)));
        let normed = crate::program::GpuOp::NormedProduct { norm, op: Box::new(op), rounded: None };
        check_on_both(&normed, &inputs, DType::F32, out, 1e-4);
    }
}
