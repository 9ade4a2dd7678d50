//! Dynamic plans end to end (`mgnc build --dynamic`): the plan made for a range of sizes is,
//! at every size of the range, the plan a static build at that size makes (and computes what
//! it computes), and models that a dynamic plan cannot carry get a diagnostic at the line that
//! makes them so — kept as data in `tests/dynamic/errors/` (first lines `// error: …`,
//! `// dynamic: NAME=MAX,…` and optionally `// set: NAME=VALUE,…`; `BLESS=1` rewrites the
//! expected `.out` files).

use mgn_compiler::driver::plan_path_dynamic;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::dynamic::SizeVar;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::precision::Precision;
use mgn_ir::{Plan, Tensor};
use mgn_runtime::Session;
use mgn_tests::{compare_golden, mgn_files, rendered, root};
use std::path::Path;

/// The line of `text` that starts with `// key: `, split at commas.
fn header<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("// {key}: ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.split(',').map(str::trim).collect())
        .unwrap_or_default()
}

fn build(
    file: &Path,
    settings: Vec<Setting>,
    sizes: &[SizeVar],
    opts: &PlanOptions,
) -> (mgn_compiler::Outcome, Option<Plan>) {
    plan_path_dynamic(file, None, settings, sizes, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn built(file: &str, settings: &[(&str, usize)], sizes: &[SizeVar], opts: &PlanOptions) -> Plan {
    root();
    let settings = settings.iter().map(|(n, v)| Setting::new(*n, v.to_string())).collect();
    let (outcome, plan) = build(Path::new(file), settings, sizes, opts);
    plan.unwrap_or_else(|| panic!("{file}: {}", rendered(&outcome)))
}

#[test]
fn every_dynamic_error_case_renders_its_expected_diagnostic() {
    let files = mgn_files("tests/dynamic/errors");
    assert!(files.len() >= 8, "expected the error cases, found {}", files.len());
    let mut failures = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("readable");
        let sizes: Vec<SizeVar> =
            header(&text, "dynamic").iter().map(|s| s.parse().expect("a size")).collect();
        let settings = header(&text, "set").iter().map(|s| s.parse().expect("a setting")).collect();
        let (outcome, plan) = build(f, settings, &sizes, &PlanOptions::infer());
        if plan.is_some() || outcome.diagnostics.is_empty() {
            failures.push(format!("{}: expected an error, but it built", f.display()));
            continue;
        }
        if let Some(d) = outcome.diagnostics.iter().find(|d| d.code == "E0999") {
            failures.push(format!("{}: internal compiler error: {}", f.display(), d.message));
        }
        if let Some(diff) = compare_golden(&f.with_extension("out"), &rendered(&outcome)) {
            failures.push(diff);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Each case: a model, its `--set`, its dynamic sizes, and sizes to compare at (all ≥ 2: at
/// size 1 a static build rewrites permutes of that axis into reshapes, a different but equal
/// plan, which `the_smallest_sizes_compute_what_the_static_plan_computes` checks by value).
type Case = (&'static str, Vec<(&'static str, usize)>, Vec<SizeVar>, Vec<Vec<usize>>);

fn cases() -> Vec<Case> {
    let v = |s: &str| s.parse::<SizeVar>().expect("a size");
    vec![
        ("models/tiny_gpt.mgn", vec![], vec![v("B=8"), v("T=64")], vec![vec![3, 17], vec![2, 2]]),
        ("models/tiny_bert.mgn", vec![], vec![v("T=4..16")], vec![vec![5], vec![13]]),
        ("models/tiny_llama.mgn", vec![("B", 2)], vec![v("T=32")], vec![vec![7], vec![30]]),
        ("models/digits_mlp.mgn", vec![], vec![v("batch=64")], vec![vec![5], vec![63]]),
        (
            "models/minilm_l6.mgn",
            vec![("n_layers", 1), ("vocab", 500), ("max_positions", 64)],
            vec![v("B=4"), v("T=40")],
            vec![vec![2, 9], vec![4, 33]],
        ),
        (
            "models/smollm2_135m_decode.mgn",
            vec![("n_layers", 2), ("cache", 32), ("vocab", 500)],
            vec![v("T=16")],
            vec![vec![3], vec![11]],
        ),
    ]
}

#[test]
fn dynamic_plans_are_the_static_plans_at_every_size() {
    let infer = PlanOptions::infer();
    let train = PlanOptions::train(&[], OptimizerSpec::default());
    for (file, set, sizes, points) in cases() {
        for opts in [&infer, &train] {
            if opts.grads && (file.contains("decode") || file.contains("bert")) {
                continue; // models without a loss
            }
            let plan = built(file, &set, &sizes, opts);
            plan.validate().expect("a valid dynamic plan");
            for point in points.iter().chain([&sizes.iter().map(|v| v.max).collect()]) {
                let mut at_set = set.clone();
                at_set.extend(sizes.iter().zip(point).map(|(v, &n)| (v.name.as_str(), n)));
                let want = built(file, &at_set, &[], opts);
                let got = plan.at(point).unwrap_or_else(|e| panic!("{file} at {point:?}: {e}"));
                assert!(got == want, "{file} ({:?}) at {point:?}: not the static plan", opts.mode);
            }
        }
    }
}

/// Inputs of `plan` at its own shapes: ids drawn below their tables, masks of ones, floats.
fn inputs(plan: &Plan) -> Vec<(String, Tensor)> {
    (plan.inputs.iter())
        .map(|(name, v)| {
            let s = &plan.steps[*v as usize];
            let n: usize = s.shape.iter().product();
            let t = if s.dtype.is_float() {
                Tensor::f32(
                    s.shape.clone(),
                    (0..n).map(|k| ((k * 37 % 101) as f32) / 50.0 - 1.0).collect(),
                )
            } else {
                // Ids below their table; anything else (a mask, a position) all ones.
                let ids = |b: i32| (0..n).map(|k| (k as i32 * 7919) % b.max(1)).collect();
                let ones = vec![1; n];
                Tensor::i32(s.shape.clone(), plan.int_input_range(*v).map_or(ones, ids))
            };
            (name.clone(), t)
        })
        .collect()
}

#[test]
fn the_smallest_sizes_compute_what_the_static_plan_computes() {
    let infer = PlanOptions::infer();
    for (file, set, sizes, _) in cases() {
        let plan = built(file, &set, &sizes, &infer);
        let smallest: Vec<usize> = sizes.iter().map(|v| v.min).collect();
        let mut at_set = set.clone();
        at_set.extend(sizes.iter().map(|v| (v.name.as_str(), v.min)));
        let static_plan = built(file, &at_set, &[], &infer);
        let given = inputs(&static_plan);
        let refs: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let want = Session::new(static_plan, 7).run(&refs).expect("static runs");
        let at = plan.at(&smallest).expect("valid at the smallest sizes");
        let got = Session::new(at, 7).run(&refs).expect("runs");
        for ((name, a), (_, b)) in got.outputs.iter().zip(&want.outputs) {
            assert_eq!(a.shape, b.shape, "{file}: {name}");
            assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{file}: {name} at {smallest:?}");
        }
    }
}

#[test]
fn a_session_runs_a_dynamic_plan_at_any_size_in_range() {
    let v = |s: &str| s.parse::<SizeVar>().expect("a size");
    let infer = PlanOptions::infer();
    let plan = built("models/tiny_gpt.mgn", &[], &[v("B=8"), v("T=64")], &infer);
    let mut session = Session::new(plan, 3);
    // Sizes in any order, and again, as an app would call it.
    for (b, t) in [(3, 17), (8, 64), (1, 1), (3, 17), (2, 40)] {
        let want_plan = built("models/tiny_gpt.mgn", &[("B", b), ("T", t)], &[], &infer);
        let given = inputs(&want_plan);
        let refs: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let want = Session::new(want_plan, 3).run(&refs).expect("static runs");
        let got = session.run(&refs).expect("the dynamic plan runs");
        assert_eq!(got.outputs[0].1.shape, want.outputs[0].1.shape);
        let (a, b) = (got.outputs[0].1.to_f64_vec(), want.outputs[0].1.to_f64_vec());
        assert_eq!(a, b, "at B = {b:?}, T = {t}");
    }
    let ids = |shape: Vec<usize>| Tensor::i32(shape.clone(), vec![1; shape.iter().product()]);
    let err = |r: Result<mgn_runtime::RunOutput, mgn_runtime::RuntimeError>| match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };
    let e = err(session.run(&[("tokens", &ids(vec![2, 65]))]));
    assert!(e.contains("its axis 1 is `T`, which this plan takes from 1 to 64"), "{e}");
    let e = err(session.run(&[]));
    assert!(e.contains("missing input"), "{e}");
}

/// The relative L2 error of `a` against `b`; against a floor for a `b` that is roundoff-sized
/// (an attention key bias's gradient is zero in exact arithmetic).
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    num / b.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-4)
}

/// One GPU session of each dynamic plan, run at several sizes in turn (back to one it ran
/// before, too): every output, loss and gradient the CPU's.
#[test]
fn dynamic_plans_on_the_gpu_match_the_cpu_at_every_size() {
    let infer = PlanOptions::infer();
    let train = PlanOptions::train(&[], OptimizerSpec::default());
    // Training plans of the models with a loss and few parameters (the others' kernels are the
    // same families); inference plans of every model but the two whose layers the rest share.
    let trains = |f: &str| f.contains("gpt") || f.contains("digits");
    let skip = |f: &str| f.contains("bert") || f.contains("llama");
    for (file, set, sizes, points) in cases().into_iter().filter(|c| !skip(c.0)) {
        for opts in [&infer, &train] {
            if opts.grads && !trains(file) {
                continue;
            }
            let plan = built(file, &set, &sizes, opts);
            let mut cpu = Session::new(plan.clone(), 5);
            let mut gpu = Session::new(plan.clone(), 5);
            if !mgn_tests::on_gpu(&mut gpu) {
                return;
            }
            let bound: Vec<usize> = sizes.iter().map(|v| v.max).collect();
            let smallest: Vec<usize> = sizes.iter().map(|v| v.min).collect();
            for point in [&points[0], &bound, &smallest, &points[1], &points[0]] {
                let at = plan.at(point).expect("valid");
                let given = inputs(&at);
                let refs: Vec<(&str, &Tensor)> =
                    given.iter().map(|(n, t)| (n.as_str(), t)).collect();
                let want = cpu.run(&refs).expect("the CPU runs");
                let got = gpu.run(&refs).unwrap_or_else(|e| panic!("{file} at {point:?}: {e}"));
                let pairs = (want.outputs.iter().map(|(n, t)| (n.as_str(), t)))
                    .chain(want.loss.iter().map(|t| ("loss", t)))
                    .chain(want.grads.iter().map(|(n, t)| (n.as_str(), t)))
                    .zip(
                        got.outputs
                            .iter()
                            .map(|(_, t)| t)
                            .chain(&got.loss)
                            .chain(got.grads.iter().map(|(_, t)| t)),
                    );
                for ((name, w), g) in pairs {
                    assert_eq!(g.shape, w.shape, "{file} at {point:?}: {name}");
                    let e = rel(g, w);
                    assert!(e < 1e-4, "{file} ({:?}) at {point:?}: {name} off by {e:e}", opts.mode);
                }
            }
        }
    }
}

/// Mixed-precision (f16) inference plans made for a range of sizes, on the GPU at several sizes
/// against the CPU's mixed run: where the device has cooperative matrices their products take
/// them (`limits::CoopUse`), with sizes read at run time, so a tile that mishandled a size
/// below the bound (an edge, a stride) would be far off. Both round the same operands; a value
/// the two compute an ulp apart may round to neighbouring halves, and tensor cores sum in their
/// own order, so the bound is the policy's noise, far below a wrong tile's error.
#[test]
fn mixed_dynamic_plans_on_the_gpu_match_the_cpu_at_every_size() {
    let mixed = PlanOptions { precision: Precision::MixedF16, ..PlanOptions::infer() };
    let wanted = |f: &str| f.contains("gpt") || f.contains("minilm");
    for (file, set, sizes, points) in cases().into_iter().filter(|c| wanted(c.0)) {
        let plan = built(file, &set, &sizes, &mixed);
        let mut cpu = Session::new(plan.clone(), 5);
        let mut gpu = Session::new(plan.clone(), 5);
        if !mgn_tests::on_gpu(&mut gpu) {
            return;
        }
        let bound: Vec<usize> = sizes.iter().map(|v| v.max).collect();
        for point in [&points[0], &bound, &points[1]] {
            let at = plan.at(point).expect("valid");
            let given = inputs(&at);
            let refs: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let want = cpu.run(&refs).expect("the CPU runs");
            let got = gpu.run(&refs).unwrap_or_else(|e| panic!("{file} at {point:?}: {e}"));
            for ((name, w), (_, g)) in want.outputs.iter().zip(&got.outputs) {
                assert_eq!(g.shape, w.shape, "{file} at {point:?}: {name}");
                let e = rel(g, w);
                assert!(e < 1e-2, "{file} (mixed) at {point:?}: {name} off by {e:e}");
            }
        }
    }
}

/// The kernels a dynamic plan's GPU session compiles at two sizes: which are not the same
/// source at both (each costs a pipeline per size).
fn unshared(
    file: &str,
    set: &[(&str, usize)],
    sizes: &[SizeVar],
    opts: &PlanOptions,
    a: &[usize],
    b: &[usize],
) -> Vec<String> {
    let plan = built(file, set, sizes, opts);
    let limits = mgn_gpu::limits::DeviceLimits::MIN_SPEC;
    let ka = mgn_gpu::dynamic::kernel_sources(&plan, a, &limits).expect("kernels");
    let kb = mgn_gpu::dynamic::kernel_sources(&plan, b, &limits).expect("kernels");
    assert_eq!(ka.len(), kb.len());
    let mut out: Vec<String> =
        ka.iter().zip(&kb).filter(|(x, y)| x.1 != y.1).map(|(x, _)| x.0.clone()).collect();
    out.sort();
    out.dedup();
    out
}

/// A dynamic plan's kernels read the sizes from their parameter block, so one pipeline serves
/// every size; the exceptions are kernels that choose by a size that follows the dynamic ones:
/// products of at most `SKINNY` rows (one accumulator per row: MiniLM's pooler, B rows) and
/// reductions whose strategy depends on how many rows they sum (a bias's gradient over B·T).
#[test]
fn kernels_are_shared_across_sizes() {
    let v = |s: &str| s.parse::<SizeVar>().expect("a size");
    let infer = PlanOptions::infer();
    let set = [("n_layers", 1), ("vocab", 500), ("max_positions", 64)];
    let sizes = [v("B=4"), v("T=40")];
    let minilm = unshared("models/minilm_l6.mgn", &set, &sizes, &infer, &[2, 9], &[3, 33]);
    assert_eq!(minilm, ["matmul_epilogue add → tanh → [2, 384]"], "only the pooler's 2 rows");
    let set = [("n_layers", 2), ("cache", 32), ("vocab", 500)];
    let prefill =
        unshared("models/smollm2_135m_decode.mgn", &set, &[v("T=16")], &infer, &[9], &[13]);
    assert!(prefill.is_empty(), "{prefill:?}");
    let train = PlanOptions::train(&[], OptimizerSpec::default());
    let gpt =
        unshared("models/tiny_gpt.mgn", &[], &[v("B=8"), v("T=64")], &train, &[2, 9], &[3, 33]);
    let reductions = gpt.iter().all(|k| k.starts_with("sum_to") || k.starts_with("mean"));
    assert!(reductions && gpt.len() <= 4, "{gpt:?}");
}

/// A dynamic plan whose attention scores at the bound are past what a device holds runs its
/// attention whole there, as a static plan does (`rewrite::for_device`): tiny GPT at up to 256
/// tokens, on a device whose one binding holds its arena only with attention whole.
#[test]
fn a_dynamic_plan_runs_attention_whole_where_the_scores_would_not_fit() {
    use mgn_gpu::program::{GpuOp, GpuPlan};
    use mgn_gpu::rewrite::{AttentionPath, Options};
    let v = |s: &str| s.parse::<SizeVar>().expect("a size");
    let set = [("B", 2), ("block_size", 256)];
    let plan = built("models/tiny_gpt.mgn", &set, &[v("T=256")], &PlanOptions::infer());
    let scores = |p: &GpuPlan| p.steps.iter().any(|s| matches!(s.op, GpuOp::AttentionProbs { .. }));
    // A device between the two: its one binding holds the arena with attention whole, not
    // the one through the scores.
    let arena = |attention| {
        let options = Options { attention, ..Options::default() };
        let (p, _) = mgn_gpu::dynamic::program(&plan, &options).expect("a program");
        mgn_gpu::memory::plan_arena(&p).total_words as u64 * 4
    };
    let (through, whole) = (arena(AttentionPath::Matmul), arena(AttentionPath::Tiled));
    assert!(whole < through, "{whole} bytes whole, {through} through the scores");
    let roomy = mgn_gpu::limits::DeviceLimits::MIN_SPEC;
    let range = (whole + through) / 2;
    let small = mgn_gpu::limits::DeviceLimits { max_storage_buffer_range: range, ..roomy };
    let options = Options::default();
    let for_device = |limits| mgn_gpu::dynamic::program_for_device(&plan, &options, limits, None);
    let (wide, _) = for_device(&roomy).expect("a program");
    assert!(scores(&wide), "through the score matrix where it fits");
    let (whole, d) = for_device(&small).expect("a program");
    assert!(!scores(&whole), "attention whole where the scores do not fit");
    assert!(mgn_gpu::rewrite::fits_the_device(&whole, &small, None));
    assert!(!mgn_gpu::rewrite::fits_the_device(&wide, &small, None));
    // The program still follows the sizes: at 100 tokens it is the bound's, resized.
    d.at(&whole, &[100]).expect("the program at another size");
}
