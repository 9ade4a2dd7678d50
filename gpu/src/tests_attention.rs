//! Attention through its score matrix (`rewrite/attention_matmul.rs`): the products with
//! operands read transposed (`GpuOp::MatMulT`), the probabilities kernel, and whole attentions
//! — forward and every derivative (the mask's too), grouped heads, causal and masked, rows that
//! see no key —
//! rewritten and run on the CPU reference and on the GPU against the plan as compiled.

use crate::program::{Elem, GpuOp, GpuPlan};
use crate::rewrite::{for_gpu_with, AttentionPath, Options};
use crate::session::GpuSession;
use crate::test_util::{
    attention_grad_parts, check_on_both, run_on_cpu_plan, run_reference, step, values,
};
use mgn_ir::op::{BinaryOp, Op};
use mgn_ir::plan::{Mode, Plan};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

fn floats(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed))
}

#[test]
fn products_with_transposed_operands_match_the_cpu() {
    // (a as stored, b as stored, ta, tb, output): partial tiles on every axis, batches,
    // a shared right operand, a skinny side, and a scale.
    type Case = (&'static [usize], &'static [usize], bool, bool, &'static [usize]);
    let cases: [Case; 7] = [
        (&[3, 13, 9], &[3, 13, 11], true, false, &[3, 9, 11]),
        (&[2, 65, 33], &[2, 17, 33], false, true, &[2, 65, 17]),
        (&[2, 70, 130], &[2, 129, 70], true, true, &[2, 130, 129]),
        (&[4, 37, 5], &[37, 7], true, false, &[4, 5, 7]),
        (&[2, 6, 40], &[2, 3, 40], false, true, &[2, 6, 3]),
        (&[2, 40, 6], &[2, 40, 3], true, false, &[2, 6, 3]),
        (&[64, 16], &[64, 16], false, true, &[64, 64]),
    ];
    for (a, b, ta, tb, out) in cases {
        for alpha in [1.0, 0.125] {
            let x = [floats(a, 17), floats(b, 4242)];
            check_on_both(&GpuOp::MatMulT { ta, tb, alpha, splits: 1 }, &x, DType::F32, out, 1e-4);
        }
    }
    // The reference itself: op(a) is the transpose it claims to be.
    let a = floats(&[2, 3], 1);
    let ctx = mgn_cpu::Ctx { training: true, seed: 0, node: 0 };
    let eye = Tensor::f32(vec![2, 2], vec![1.0, 0.0, 0.0, 1.0]);
    let op = GpuOp::MatMulT { ta: true, tb: false, alpha: 2.0, splits: 1 };
    let got = crate::reference::eval(&op, &[&a, &eye], DType::F32, &[3, 2], &ctx).to_f64_vec();
    let a = a.to_f64_vec();
    let want: Vec<f64> = (0..6).map(|e| 2.0 * a[(e % 2) * 3 + e / 2]).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn attention_probabilities_match_the_cpu() {
    let inf = f32::NEG_INFINITY;
    // Row 2 masked entirely: zeros, as a row that sees no key.
    let mask = Tensor::f32(vec![3, 4], [[0.0; 4], [0.0, inf, 0.0, -1e9], [inf; 4]].concat());
    for causal in [false, true] {
        let s = floats(&[2, 2, 3, 4], 9);
        check_on_both(
            &GpuOp::AttentionProbs { causal, has_mask: true },
            &[s.clone(), mask.clone()],
            DType::F32,
            &[2, 2, 3, 4],
            1e-6,
        );
        // More queries than keys, causal: the first rows see nothing. Rows past one workgroup's
        // width.
        let s = floats(&[1, 2, 7, 300], 10);
        check_on_both(
            &GpuOp::AttentionProbs { causal, has_mask: false },
            &[s],
            DType::F32,
            &[1, 2, 7, 300],
            1e-6,
        );
    }
}

#[test]
fn attention_probabilities_at_every_spread() {
    // Rows of 128 keys, eight to a workgroup, with a padding mask per sample broadcast over
    // heads and queries (the encoders' `[B, 1, 1, Tk]`); rows of 130 (a partial last element
    // a lane); 3 × 5 rows (the last workgroup part full); causal with fewer queries than keys.
    let mut mask = vec![0.0; 2 * 128];
    for v in &mut mask[128 + 100..] {
        *v = -1e9;
    }
    let mask = Tensor::f32(vec![2, 1, 1, 128], mask);
    for causal in [false, true] {
        check_on_both(
            &GpuOp::AttentionProbs { causal, has_mask: true },
            &[floats(&[2, 3, 16, 128], 11), mask.clone()],
            DType::F32,
            &[2, 3, 16, 128],
            1e-6,
        );
        for shape in [&[1, 3, 5, 130][..], &[1, 1, 7, 4097]] {
            check_on_both(
                &GpuOp::AttentionProbs { causal, has_mask: false },
                &[floats(shape, 12)],
                DType::F32,
                shape,
                1e-6,
            );
        }
    }
}

/// One attention's forward and its derivatives as a training plan would have them: inputs q,
/// k, v, mask?, dy; results out, dq, dk, dv and (with a mask) dmask.
fn attention_plan(
    b: usize,
    (hq, hkv): (usize, usize),
    (tq, tk): (usize, usize),
    (d, dv): (usize, usize),
    causal: bool,
    mask: Option<&[usize]>,
) -> (Plan, Vec<Tensor>) {
    let scale = 1.0 / (d as f64).sqrt();
    let has_mask = mask.is_some();
    let mut shapes = vec![vec![b, hq, tq, d], vec![b, hkv, tk, d], vec![b, hkv, tk, dv]];
    shapes.extend(mask.map(<[usize]>::to_vec));
    shapes.push(vec![b, hq, tq, dv]);
    let names = ["q", "k", "v", "mask", "dy"];
    let names: Vec<&str> = names.iter().copied().filter(|&n| has_mask || n != "mask").collect();
    let mut steps = Vec::new();
    let mut inputs = Vec::new();
    let mut values = Vec::new();
    for (k, (name, shape)) in names.iter().zip(&shapes).enumerate() {
        steps.push(step(Op::Input { name: name.to_string() }, vec![], DType::F32, shape));
        inputs.push((name.to_string(), k as u32));
        let mut t = floats(shape, 31 + k as u32);
        if *name == "mask" {
            // Some keys hidden outright.
            if let mgn_ir::tensor::Data::F32(v) = &mut t.data {
                for x in v.iter_mut().step_by(5) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        values.push(t);
    }
    let n = names.len() as u32;
    let operands: Vec<u32> = (0..n - 1).collect();
    let all: Vec<u32> = (0..n).collect();
    steps.push(step(
        Op::Attention { causal, scale, has_mask },
        operands,
        DType::F32,
        &[b, hq, tq, dv],
    ));
    let mut outputs = vec![("out".to_string(), n)];
    let parts = attention_grad_parts(b, (hq, hkv), (tq, tk), (d, dv), has_mask);
    for (k, (part, shape)) in parts.into_iter().enumerate() {
        let op = Op::AttentionGrad { causal, scale, has_mask, part };
        steps.push(step(op, all.clone(), DType::F32, &shape));
        outputs.push((format!("d{part:?}").to_lowercase(), n + 1 + k as u32));
    }
    (Plan::of_steps(Mode::Train, steps, inputs, outputs), values)
}

/// The rewritten plan against the plan as compiled: on the CPU reference always, and on the
/// GPU when there is one.
fn check_rewrite(plan: &Plan, values: &[Tensor]) {
    plan.validate().expect("a valid plan");
    let rewritten =
        for_gpu_with(plan, &Options { attention: AttentionPath::Matmul, ..Options::default() });
    rewritten.validate().expect("a valid GPU plan");
    let count =
        |p: &GpuPlan, f: &dyn Fn(&GpuOp) -> bool| p.steps.iter().filter(|s| f(&s.op)).count();
    let attention = |op: &GpuOp| {
        matches!(op, GpuOp::Plan(Op::Attention { .. } | Op::AttentionGrad { .. }))
            || matches!(op, GpuOp::AttentionStats { .. } | GpuOp::AttentionGradWithStats { .. })
    };
    assert_eq!(count(&rewritten, &attention), 0, "every attention step rewritten");
    // One set of probabilities for the forward and the derivatives, one dS for dq, dk and the
    // mask (a view of it), and no product for the mask.
    assert_eq!(count(&rewritten, &|op| matches!(op, GpuOp::AttentionProbs { .. })), 1);
    assert_eq!(count(&rewritten, &|op| matches!(op, GpuOp::Plan(Op::SoftmaxGrad { .. }))), 1);
    assert_eq!(count(&rewritten, &|op| matches!(op, GpuOp::MatMulT { .. })), 6);

    let names = ["q", "k", "v", "mask", "dy"];
    let names: Vec<&str> =
        names.iter().copied().filter(|&n| values.len() == 5 || n != "mask").collect();
    let given: Vec<(&str, &Tensor)> = names.iter().copied().zip(values).collect();
    let want = run_on_cpu_plan(plan, &[], &given);
    let on_cpu = run_reference(&rewritten, &[], &given);
    let close = |got: &[(String, Tensor)], tol: f64, what: &str| {
        for ((name, g), (_, w)) in got.iter().zip(&want.outputs) {
            assert_eq!(g.shape, w.shape, "{name}");
            for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what} {name}[{i}]: {a} vs {b}");
            }
        }
    };
    close(&on_cpu.outputs, 1e-5, "rewritten, on the CPU:");
    let Some(mut gpu) = crate::testing::or_skip(GpuSession::open(rewritten, &[])) else { return };
    let got = gpu.run(&given, 0).expect("the GPU runs the rewritten attention");
    close(&got.outputs, 5e-5, "on the GPU:");
}

#[test]
fn attention_through_the_score_matrix_matches_the_plan_as_compiled() {
    // (batch, (Hq, Hkv), (Tq, Tk), (D, Dv), causal, mask)
    check_rewrite_of(2, (4, 2), (5, 7), (8, 6), false, None);
    check_rewrite_of(2, (4, 2), (5, 7), (8, 6), true, Some(&[5, 7]));
    // More queries than keys, causal: the first four rows see no key.
    check_rewrite_of(1, (2, 2), (7, 3), (8, 8), true, None);
    // A padding mask per batch item, one KV head for all query heads.
    check_rewrite_of(2, (3, 1), (6, 9), (4, 5), false, Some(&[2, 1, 1, 9]));
    check_rewrite_of(1, (2, 2), (33, 70), (16, 16), true, None);
}

fn check_rewrite_of(
    b: usize,
    heads: (usize, usize),
    lengths: (usize, usize),
    dims: (usize, usize),
    causal: bool,
    mask: Option<&[usize]>,
) {
    let (plan, values) = attention_plan(b, heads, lengths, dims, causal, mask);
    check_rewrite(&plan, &values);
}

#[test]
fn only_long_attentions_take_the_score_matrix_by_default() {
    let long = attention_plan(1, (2, 2), (128, 128), (8, 8), false, None).0;
    let short = attention_plan(1, (2, 2), (1, 128), (8, 8), true, None).0;
    let probs = |plan: &Plan, path| {
        let p = for_gpu_with(plan, &Options { attention: path, ..Options::default() });
        p.steps.iter().filter(|s| matches!(s.op, GpuOp::AttentionProbs { .. })).count()
    };
    assert_eq!(probs(&long, AttentionPath::Auto), 1);
    assert_eq!(probs(&short, AttentionPath::Auto), 0);
    assert_eq!(probs(&short, AttentionPath::Matmul), 1);
    assert_eq!(probs(&long, AttentionPath::Tiled), 0);
}

#[test]
fn attentions_whose_scores_the_device_cannot_hold_run_whole() {
    use crate::limits::DeviceLimits;
    use crate::rewrite::for_device;
    // Scores of 2 × 300² f32 (703 KiB), kept with their derivatives for the backward.
    let plan = attention_plan(1, (2, 2), (300, 300), (8, 8), false, None).0;
    let probs = |p: &GpuPlan| {
        p.steps.iter().filter(|s| matches!(s.op, GpuOp::AttentionProbs { .. })).count()
    };
    let auto = Options::default();
    let roomy = DeviceLimits::MIN_SPEC;
    let small = DeviceLimits { max_storage_buffer_range: 1 << 20, ..roomy };
    assert_eq!(probs(&for_device(&plan, &auto, &roomy, None)), 1);
    assert_eq!(probs(&for_device(&plan, &auto, &small, None)), 0);
    assert_eq!(probs(&for_device(&plan, &auto, &roomy, Some(1 << 20))), 0);
    // A path the user chose stays, and so does the score matrix when nothing would fit.
    let matmul = Options { attention: AttentionPath::Matmul, ..Options::default() };
    assert_eq!(probs(&for_device(&plan, &matmul, &small, None)), 1);
    let tiny = DeviceLimits { max_storage_buffer_range: 1 << 10, ..roomy };
    assert_eq!(probs(&for_device(&plan, &auto, &tiny, None)), 1);
}

/// An additive mask of `shape` with every `every`-th position hidden (−inf), the rest small.
fn decode_mask(shape: &[usize], every: usize, seed: u32) -> Tensor {
    let mut t = floats(shape, seed);
    if let mgn_ir::tensor::Data::F32(v) = &mut t.data {
        for x in v.iter_mut().step_by(every) {
            *x = f32::NEG_INFINITY;
        }
    }
    t
}

/// The forward at decoding shapes (few query rows a head: the `decode` kernel) against the CPU:
/// SmolLM2's grouping (9 query heads over 3), one and two rows, one key, a few, a cache of 256
/// and more keys than one chunk holds, head dims 64 and 24, causal without a mask and masked
/// without causality (a `[1, 1, Tq, Tk]` mask as the decode model passes it).
#[test]
fn decoding_attention_matches_the_cpu() {
    for d in [64, 24] {
        for tk in [1, 7, 256, 600] {
            for tq in [1, 2] {
                let x = [
                    floats(&[1, 9, tq, d], 201),
                    floats(&[1, 3, tk, d], 202),
                    floats(&[1, 3, tk, d], 203),
                ];
                let scale = 1.0 / (d as f64).sqrt();
                let op = Op::Attention { causal: true, scale, has_mask: false };
                check_on_both(&op, &x, DType::F32, &[1, 9, tq, d], 1e-5);
                // Every 7th position hidden: with one key, row 0 sees nothing (zeros).
                let mut x = x.to_vec();
                x.push(decode_mask(&[1, 1, tq, tk], 7, 204));
                let op = Op::Attention { causal: false, scale, has_mask: true };
                check_on_both(&op, &x, DType::F32, &[1, 9, tq, d], 1e-5);
            }
        }
    }
}

/// The decode kernel's other cases: batches with a padding mask per item, Dv ≠ D, the most rows
/// it takes, causal rows that see no key (Tq > Tk), a mask of one row for all queries, rows
/// masked to −inf or to a large finite value everywhere.
#[test]
fn decoding_attention_edge_cases_match_the_cpu() {
    let attn = |b: usize,
                (tq, tk): (usize, usize),
                (d, dv): (usize, usize),
                causal,
                mask: Option<Tensor>| {
        let mut x = vec![
            floats(&[b, 6, tq, d], 211),
            floats(&[b, 2, tk, d], 212),
            floats(&[b, 2, tk, dv], 213),
        ];
        let has_mask = mask.is_some();
        x.extend(mask);
        let op = Op::Attention { causal, scale: 0.3, has_mask };
        check_on_both(&op, &x, DType::F32, &[b, 6, tq, dv], 1e-5);
    };
    attn(2, (4, 300), (16, 40), false, Some(decode_mask(&[2, 1, 1, 300], 3, 214)));
    attn(2, (3, 37), (64, 64), true, Some(decode_mask(&[37], 4, 215)));
    attn(1, (4, 2), (8, 8), true, None);
    attn(1, (1, 1), (5, 3), true, None);
    // Row 0 hidden everywhere, row 1 at -1e9 everywhere (uniform, as on the CPU).
    let tk = 19;
    let rows: Vec<f32> =
        (0..2 * tk).map(|i| if i < tk { f32::NEG_INFINITY } else { -1e9 }).collect();
    attn(1, (2, tk), (8, 8), false, Some(Tensor::f32(vec![2, tk], rows)));
}

/// Latency of SmolLM2's decoding attention (9 query heads over 3, head dim 64, a mask) against
/// caches of several lengths, and of a few query rows: not a check, a measurement for a real
/// GPU (`MGN_PROFILE=1 cargo test --release -p mgn-gpu decode_attention_latency -- --ignored
/// --nocapture`). Rows up to `MAX_ROWS` take the decode kernel, more the tiled one.
#[test]
#[ignore]
fn decode_attention_latency() {
    use crate::test_util::time_op;
    for tk in [256, 1024, 4096] {
        for tq in [1, 2, 4, 5, 8] {
            let op = Op::Attention { causal: false, scale: 0.125, has_mask: true };
            let (q, kv, mask) = ([1, 9, tq, 64], [1, 3, tk, 64], [1, 1, tq, tk]);
            if let Some((sec, device)) = time_op(&op, &[&q, &kv, &kv, &mask], &q, 30) {
                println!("attention Tq {tq} Tk {tk}: {:8.2} µs ({device})", sec * 1e6);
            }
        }
    }
}

/// Latency of whole attentions at the workloads' shapes in an inference plan: not a check, a
/// measurement for a real GPU (`MGN_PROFILE=1 cargo test --release -p mgn-gpu
/// long_attention_latency -- --ignored --nocapture`): the path every session takes
/// (`AttentionPath::Auto`; the switches that forced the others are gone).
#[test]
#[ignore]
fn long_attention_latency() {
    use crate::test_util::time_op;
    // (name, batch, Hq, Hkv, T, D, causal, a padding mask)
    let shapes = [
        ("Whisper encoder", 1, 6, 6, 1500, 64, false, false),
        ("SmolLM2 prefill", 1, 9, 3, 128, 64, true, false),
        ("MiniLM", 8, 12, 12, 128, 32, false, true),
        ("long causal", 1, 8, 8, 4096, 64, true, false),
        ("short", 4, 8, 8, 12, 64, true, false),
    ];
    for (name, b, hq, hkv, t, d, causal, padded) in shapes {
        let op = Op::Attention { causal, scale: 1.0 / (d as f64).sqrt(), has_mask: padded };
        let (q, kv, mask) = ([b, hq, t, d], [b, hkv, t, d], [b, 1, 1, t]);
        let mut operands: Vec<&[usize]> = vec![&q, &kv, &kv];
        if padded {
            operands.push(&mask);
        }
        if let Some((sec, device)) = time_op(&op, &operands, &q, 10) {
            let flops = 4.0 * (b * hq * t * t * d) as f64 / if causal { 2.0 } else { 1.0 };
            let (us, tflops) = (sec * 1e6, flops / sec / 1e12);
            let what = format!("attention {name} ({b}×{hq}/{hkv}×{t}, d {d})");
            println!("{what}: {us:9.2} µs, {tflops:5.1} TFLOP/s ({device})");
        }
    }
}

#[test]
fn products_split_along_k_match_the_cpu() {
    // Partial products of each k range (the last one shorter), then their sum through an
    // epilogue that adds a bias.
    for (a, b, ta, tb, splits) in [
        (vec![20, 300], vec![300, 24], false, false, 2),
        (vec![2, 300, 20], vec![2, 24, 300], true, true, 3),
        (vec![37, 1000], vec![1000, 9], false, false, 7),
    ] {
        let x = [floats(&a, 5), floats(&b, 6)];
        let (m, n) = (
            if ta { a[a.len() - 1] } else { a[a.len() - 2] },
            if tb { b[b.len() - 2] } else { b[b.len() - 1] },
        );
        let mut out = vec![splits];
        out.extend(&a[..a.len() - 2]);
        out.extend([m, n]);
        let op = GpuOp::MatMulT { ta, tb, alpha: 0.5, splits };
        check_on_both(&op, &x, DType::F32, &out, 1e-4);
        let ctx = mgn_cpu::Ctx { training: true, seed: 0, node: 0 };
        let refs: Vec<&Tensor> = x.iter().collect();
        let partials = crate::reference::eval(&op, &refs, DType::F32, &out, &ctx);
        let bias = floats(&[n], 7);
        let program = vec![Elem::Input(0), Elem::Input(1), Elem::Binary(BinaryOp::Add, 0, 1)];
        let sum = GpuOp::SplitSum { splits, program };
        check_on_both(&sum, &[partials, bias], DType::F32, &out[1..], 1e-5);
    }
}

/// A layer's forward and weight derivative with few output tiles and a deep k, as the GPU
/// rewrites them (split, an epilogue kept through the sum), against the plan as compiled.
#[test]
fn split_products_in_a_plan_match_the_plan_as_compiled() {
    let f = DType::F32;
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, &[40, 600]),
        step(Op::Input { name: "w".into() }, vec![], f, &[600, 30]),
        step(Op::Input { name: "bias".into() }, vec![], f, &[30]),
        step(Op::MatMul, vec![0, 1], f, &[40, 30]),
        step(Op::Binary(BinaryOp::Add), vec![3, 2], f, &[40, 30]),
        step(Op::Permute { perm: vec![1, 0] }, vec![0], f, &[600, 40]),
        step(Op::MatMul, vec![5, 4], f, &[600, 30]),
    ];
    let inputs = vec![("x".into(), 0), ("w".into(), 1), ("bias".into(), 2)];
    let plan = Plan::of_steps(Mode::Train, steps, inputs, vec![("y".into(), 4), ("g".into(), 6)]);
    plan.validate().expect("valid");
    let gpu_plan = for_gpu_with(&plan, &Options::default());
    gpu_plan.validate().expect("valid GPU plan");
    let sums = gpu_plan.steps.iter().filter(|s| matches!(s.op, GpuOp::SplitSum { .. })).count();
    assert_eq!(sums, 1, "the forward splits (40 × 30 over 600); the derivative fills the GPU");
    let (x, w, bias) = (floats(&[40, 600], 1), floats(&[600, 30], 2), floats(&[30], 3));
    let given = [("x", &x), ("w", &w), ("bias", &bias)];
    let want = run_on_cpu_plan(&plan, &[], &given);
    let check = |got: &[(String, Tensor)], tol: f64| {
        for ((name, g), (_, w)) in got.iter().zip(&want.outputs) {
            for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
                assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{name}: {a} vs {b}");
            }
        }
    };
    // Sums of 600 products in f32, in another order: rounding of order 1e-5.
    check(&run_reference(&gpu_plan, &[], &given).outputs, 1e-4);
    let Some(mut gpu) = crate::testing::or_skip(GpuSession::open(gpu_plan, &[])) else { return };
    check(&gpu.run(&given, 0).expect("runs").outputs, 1e-4);
}

/// (batch, (Hq, Hkv), (Tq, Tk), (D, Dv), causal, mask shape)
type HalfCase = (usize, (usize, usize), (usize, usize), (usize, usize), bool, Option<Vec<usize>>);

/// A plan (of `mode`) of one attention whose q, k and v are cast to f16, as the mixed policy
/// makes it; its inputs' values (the mask's every 7th position −inf) and shapes.
fn half_attention_plan(case: &HalfCase, mode: Mode) -> (Plan, Vec<Tensor>, Vec<Vec<usize>>) {
    let (b, (hq, hkv), (tq, tk), (d, dv), causal, mask) = case.clone();
    let (f, h) = (DType::F32, DType::F16);
    let mut shapes = vec![vec![b, hq, tq, d], vec![b, hkv, tk, d], vec![b, hkv, tk, dv]];
    shapes.extend(mask.clone());
    let names = ["q", "k", "v", "mask"];
    let mut steps = Vec::new();
    let mut values = Vec::new();
    for (k, shape) in shapes.iter().enumerate() {
        steps.push(step(Op::Input { name: names[k].into() }, vec![], f, shape));
        values.push(floats(shape, 61 + k as u32));
    }
    if let Some(mgn_ir::tensor::Data::F32(v)) = values.get_mut(3).map(|m| &mut m.data) {
        // With the causal rows, some rows see no key at all.
        v.iter_mut().step_by(7).for_each(|x| *x = f32::NEG_INFINITY);
    }
    for (k, shape) in shapes.iter().enumerate().take(3) {
        steps.push(step(Op::Cast, vec![k as u32], h, shape));
    }
    let n = shapes.len() as u32;
    let mut operands = vec![n, n + 1, n + 2];
    operands.extend(mask.as_ref().map(|_| 3));
    let scale = 1.0 / (d as f64).sqrt();
    let op = Op::Attention { causal, scale, has_mask: mask.is_some() };
    steps.push(step(op, operands, f, &[b, hq, tq, dv]));
    let inputs = (0..shapes.len()).map(|k| (names[k].to_string(), k as u32)).collect();
    (Plan::of_steps(mode, steps, inputs, vec![("out".into(), n + 3)]), values, shapes)
}

/// `AttentionPath::Tiles` keeps an f16 attention whole for the cooperative-matrix kernel only
/// where the device has tiles for its heads and nothing differentiates it; by default, and for
/// f32 heads, long attentions go through their score matrix as before.
#[test]
fn only_the_tiles_path_keeps_half_attentions_whole_on_the_tiles() {
    use crate::kernels::{Coop, Target};
    let case: HalfCase = (1, (2, 2), (150, 150), (64, 64), false, None);
    let (plan, _, _) = half_attention_plan(&case, Mode::Infer);
    let coop = Coop { tile: 16, subgroup: 32, everywhere: false };
    let device = Target { width: 256, shared_bytes: 49_152, coop: Some(coop) };
    let on_tiles = |plan: &Plan, attention, target: Option<Target>| {
        let p = for_gpu_with(plan, &Options { attention, target, ..Options::default() });
        let tiles = p.steps.iter().filter(|s| matches!(s.op, GpuOp::AttentionOnTiles { .. }));
        let probs = p.steps.iter().filter(|s| matches!(s.op, GpuOp::AttentionProbs { .. }));
        (tiles.count(), probs.count())
    };
    assert_eq!(on_tiles(&plan, AttentionPath::Tiles, Some(device)), (1, 0));
    // The step's CPU reference is the attention's.
    let (_, values, _) = half_attention_plan(&case, Mode::Infer);
    let given: Vec<(&str, &Tensor)> = ["q", "k", "v"].into_iter().zip(&values).collect();
    let tiles =
        Options { attention: AttentionPath::Tiles, target: Some(device), ..Options::default() };
    let rewritten = run_reference(&for_gpu_with(&plan, &tiles), &[], &given).outputs;
    let want = run_on_cpu_plan(&plan, &[], &given).outputs;
    assert_eq!(rewritten[0].1.to_f64_vec(), want[0].1.to_f64_vec());
    assert_eq!(on_tiles(&plan, AttentionPath::Auto, Some(device)), (0, 1));
    assert_eq!(
        on_tiles(&plan, AttentionPath::Tiles, Some(Target { coop: None, ..device })),
        (0, 1)
    );
    assert_eq!(on_tiles(&plan, AttentionPath::Tiles, None), (0, 1));
    // Heads that are not whole tiles.
    let odd = half_attention_plan(&(1, (2, 2), (150, 150), (40, 40), false, None), Mode::Infer).0;
    assert_eq!(on_tiles(&odd, AttentionPath::Tiles, Some(device)), (0, 1));
    // A training plan's attention, differentiated, keeps the probabilities for its derivatives.
    let (train, _) = attention_plan(1, (2, 2), (150, 150), (64, 64), false, None);
    assert_eq!(on_tiles(&train, AttentionPath::Tiles, Some(device)), (0, 1));
}

/// An inference plan's attention of q, k and v cast to f16 (the mixed policy's, each cast a
/// rounded view), against the plan as compiled on the CPU: with `AttentionPath::Tiles`, on a
/// device with cooperative matrices it stays whole and runs both products on them
/// (`kernels/attention/coop.rs`), with probabilities as exact as the CPU's f32 ones; elsewhere
/// through the score matrix. Several key blocks, query tiles past the rows, causal rows that
/// see no key, grouped heads, Dv ≠ D, masks with hidden keys.
#[test]
fn attention_of_halves_matches_the_cpu() {
    use crate::device::GpuDevice;
    let cases: [HalfCase; 4] = [
        (1, (2, 2), (150, 150), (64, 64), false, None),
        (2, (4, 2), (37, 70), (32, 16), true, Some(vec![2, 1, 37, 70])),
        (1, (3, 1), (90, 40), (16, 32), true, None),
        (2, (2, 2), (20, 130), (16, 16), false, Some(vec![2, 1, 1, 130])),
    ];
    for case in cases {
        let (plan, values, shapes) = half_attention_plan(&case, Mode::Infer);
        let names = ["q", "k", "v", "mask"];
        let given: Vec<(&str, &Tensor)> = names.iter().copied().zip(&values).collect();
        let want = run_on_cpu_plan(&plan, &[], &given).outputs.remove(0).1;
        let Some((_, limits)) = crate::testing::or_skip(GpuDevice::chosen()) else { return };
        let tiles = Options { attention: AttentionPath::Tiles, ..Options::default() };
        let program = crate::rewrite::for_device(&plan, &tiles, &limits, None);
        let dims = mgn_ir::shape::attention::dims(&shapes[0], &shapes[1], &shapes[2]).unwrap();
        let target = crate::kernels::Target::of(&limits);
        let whole = program.steps.iter().any(|s| matches!(s.op, GpuOp::AttentionOnTiles { .. }));
        let what = format!("{:?} causal {} mask {:?}", shapes[0], case.4, case.5);
        assert_eq!(
            whole,
            crate::kernels::runs_on_tensor_cores(&dims, DType::F16, &target),
            "{what}"
        );
        let mut gpu = GpuSession::open(program, &[]).expect("the session opens");
        let got = gpu.run(&given, 0).expect("the GPU runs the attention").outputs.remove(0).1;
        for (i, (a, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            assert!((a - w).abs() <= 2e-5 * (1.0 + w.abs()), "{what}: [{i}] {a} vs {w}");
        }
    }
}

/// An attention run whole whose heads are merged after it (`[B, H, T, Dv]` permuted to
/// `[B, T, H, Dv]` and flattened, as every transformer's output projection reads them): the
/// attention stores them merged (`rewrite/permuted_stores.rs`), in each of its f32 forward
/// kernels, and computes what the plan as compiled does on the CPU reference and on the GPU.
/// An attention that is also a result keeps its permute.
#[test]
fn attentions_run_whole_store_their_heads_merged() {
    // (batch, (Hq, Hkv), (Tq, Tk), (D, Dv), causal, mask, also a result): decoding's kernel
    // (at most four query rows), the register-blocked one (Dv ≤ 256) with a mask, and the
    // scalar-loop one (Dv past it).
    type Case = (usize, (usize, usize), (usize, usize), (usize, usize), bool, bool, bool);
    let cases: [Case; 4] = [
        (2, (4, 2), (1, 9), (8, 8), false, false, false),
        (1, (3, 3), (40, 40), (16, 12), true, true, false),
        (1, (2, 1), (6, 7), (4, 260), false, false, false),
        (2, (2, 2), (5, 5), (8, 8), false, false, true),
    ];
    for (b, (hq, hkv), (tq, tk), (d, dv), causal, masked, kept) in cases {
        let f = DType::F32;
        let mut shapes = vec![vec![b, hq, tq, d], vec![b, hkv, tk, d], vec![b, hkv, tk, dv]];
        if masked {
            shapes.push(vec![tq, tk]);
        }
        let names = ["q", "k", "v", "mask"];
        let mut steps = Vec::new();
        for (name, shape) in names.iter().zip(&shapes) {
            steps.push(step(Op::Input { name: name.to_string() }, vec![], f, shape));
        }
        let n = shapes.len() as u32;
        let attention = Op::Attention { causal, scale: 0.3, has_mask: masked };
        steps.push(step(attention, (0..n).collect(), f, &[b, hq, tq, dv]));
        steps.push(step(Op::Permute { perm: vec![0, 2, 1, 3] }, vec![n], f, &[b, tq, hq, dv]));
        steps.push(step(Op::Reshape, vec![n + 1], f, &[b, tq, hq * dv]));
        let inputs = names.iter().take(shapes.len()).enumerate();
        let inputs = inputs.map(|(k, name)| (name.to_string(), k as u32)).collect();
        let mut outputs = vec![("y".to_string(), n + 2)];
        if kept {
            outputs.push(("heads".to_string(), n));
        }
        let plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
        plan.validate().expect("a valid plan");
        let options = Options { attention: AttentionPath::Tiled, ..Options::default() };
        let gpu = for_gpu_with(&plan, &options);
        gpu.validate().expect("a valid GPU plan");
        let count = |f: &dyn Fn(&GpuOp) -> bool| gpu.steps.iter().filter(|s| f(&s.op)).count();
        let merged = count(&|op| {
            matches!(op, GpuOp::PermutedStore { op, .. }
                if matches!(**op, GpuOp::Plan(Op::Attention { .. })))
        });
        let permutes = count(&|op| matches!(op, GpuOp::Plan(Op::Permute { .. })));
        assert_eq!((merged, permutes), if kept { (0, 1) } else { (1, 0) }, "case {b} {hq} {tq}");
        let values: Vec<Tensor> =
            shapes.iter().enumerate().map(|(k, s)| floats(s, 70 + k as u32)).collect();
        let given: Vec<(&str, &Tensor)> = names.into_iter().zip(&values).collect();
        crate::test_util::assert_rewrite_keeps_results_within(&plan, gpu, &given, (1e-6, 5e-5));
    }
}
