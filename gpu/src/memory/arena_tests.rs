//! The arena plan: lifetimes, views, results written over their operands, levels, and the
//! plans refused for their size.

use super::*;
use mgn_ir::op::{BinaryOp, UnaryOp};
use mgn_ir::plan::{Mode, Plan};
use mgn_ir::DType;

/// A chain x → a → b → c → … → y: only neighbours are alive together.
fn chain(len: usize) -> GpuPlan {
    let step = |op, inputs| crate::test_util::step(op, inputs, DType::F32, &[64]);
    let mut steps = vec![step(Op::Input { name: "x".into() }, vec![])];
    for i in 0..len {
        steps.push(step(
            if i % 2 == 0 { Op::Unary(UnaryOp::Relu) } else { Op::Binary(BinaryOp::Add) },
            if i % 2 == 0 { vec![i as u32] } else { vec![i as u32, i as u32] },
        ));
    }
    let last = steps.len() as u32 - 1;
    GpuPlan::of(&Plan::of_steps(
        Mode::Infer,
        steps,
        vec![("x".into(), 0)],
        vec![("y".into(), last)],
    ))
}

/// No two values alive at the same time share a word, but for an element-wise step
/// written over an operand that dies there.
fn assert_valid(plan: &GpuPlan, a: &ArenaPlan) {
    let last_use = DefUse::of(plan).last_uses();
    let root = view_roots(plan);
    let over = element_in_place(plan, &root, &root_last_uses(plan, &root));
    let n = plan.steps.len();
    let end = |i: usize| {
        if last_use[i] == usize::MAX || pinned(plan, i) {
            usize::MAX
        } else {
            last_use[i].max(i)
        }
    };
    for i in 0..n {
        for (j, over_j) in over.iter().enumerate().skip(i + 1) {
            // j is defined after i; they coexist if i is still alive when j is written.
            let written_over = *over_j == Some(i) && a.offsets[i] == a.offsets[j];
            if end(i) >= j && !written_over {
                let (ai, bi) = (a.offsets[i], a.offsets[i] + words(plan, i));
                let (aj, bj) = (a.offsets[j], a.offsets[j] + words(plan, j));
                assert!(
                    bi <= aj || bj <= ai,
                    "steps {i} and {j} overlap: [{ai}, {bi}) and [{aj}, {bj})"
                );
            }
        }
    }
    assert!(a.offsets.iter().zip(0..n).all(|(&o, i)| o + words(plan, i) <= a.total_words));
}

#[test]
fn a_chain_needs_only_two_transient_regions() {
    let plan = chain(20);
    let a = plan_arena(&plan);
    assert_valid(&plan, &a);
    assert_eq!(check_arena(&plan, &a), Ok(()));
    // Pinned: the input; then two regions ping-pong, the output taking one of the slots.
    assert_eq!(a.pinned_words, 64);
    assert!(a.total_words <= a.pinned_words + 3 * 64, "{}", a.total_words);
}

/// x → a = relu(x) → b = softmax(a); c = exp(x) and d = tanh(x) read only x; y = b + c + d.
/// After b, a's words are free, but c and d could run at level 0, before b reads a at
/// level 1: taking a's words would make one of them wait a level. (A softmax, not an
/// element-wise step, which could be written over a instead.)
fn independent_steps(shape: &[usize]) -> GpuPlan {
    independent_steps_beside(shape, 0)
}

/// `independent_steps`, with a parameter of `held` words beside them that no step reads: words
/// the session holds anyway.
fn independent_steps_beside(shape: &[usize], held: usize) -> GpuPlan {
    let step = |op, inputs| crate::test_util::step(op, inputs, DType::F32, shape);
    let mut steps = vec![
        step(Op::Input { name: "x".into() }, vec![]),
        step(Op::Unary(UnaryOp::Relu), vec![0]),
        step(Op::Softmax { axis: 0, log: false }, vec![1]),
        step(Op::Unary(UnaryOp::Exp), vec![0]),
        step(Op::Unary(UnaryOp::Tanh), vec![0]),
        step(Op::Binary(BinaryOp::Add), vec![2, 3]),
        step(Op::Binary(BinaryOp::Add), vec![5, 4]),
    ];
    let mut params = Vec::new();
    if held > 0 {
        steps.push(crate::test_util::step(Op::Param { index: 0 }, vec![], DType::F32, &[held]));
        params.push(mgn_ir::plan::ParamSpec {
            name: "w".into(),
            dtype: DType::F32,
            shape: vec![held],
            init: mgn_ir::plan::InitSpec::Constant(0.0),
            trainable: false,
            frozen: true,
            persistent: true,
        });
    }
    let inputs = vec![("x".into(), 0)];
    let plan = Plan::of_steps(Mode::Infer, steps, inputs, vec![("y".into(), 6)]);
    GpuPlan::of(&Plan { params, ..plan })
}

fn levels_of(plan: &GpuPlan, a: &ArenaPlan) -> crate::schedule::Levels {
    let words: Vec<usize> = plan.steps.iter().map(|s| s.shape.iter().product()).collect();
    let l = crate::schedule::levels(plan, &a.offsets, &words);
    crate::schedule::check(plan, &a.offsets, &words, &l).expect("ordered");
    l
}

#[test]
fn small_values_take_fresh_words_rather_than_wait_for_reused_ones() {
    let plan = independent_steps(&[64]);
    let a = plan_arena(&plan);
    assert_valid(&plan, &a);
    assert_eq!(check_arena(&plan, &a), Ok(()));
    let l = levels_of(&plan, &a);
    assert_eq!((l.step[3], l.step[4]), (Some(0), Some(0)), "exp and tanh run with relu");
    assert_eq!(l.count, 4, "relu, exp, tanh | softmax | add | add");
}

#[test]
fn large_values_wait_where_fresh_words_would_grow_the_arena_past_its_room() {
    // Past `SMALL` words a value takes fresh words only from a budget; the layout where
    // both exp and tanh take fresh words has a level fewer, but is a third larger than the
    // smallest: past `ROOM`, so one of them waits.
    let plan = independent_steps(&[SMALL * 2]);
    let a = plan_arena(&plan);
    assert_valid(&plan, &a);
    assert_eq!(check_arena(&plan, &a), Ok(()));
    let peak = plan_memory(&plan).peak_live_bytes as usize / 4;
    let transient = a.total_words - a.pinned_words;
    assert!(2 * transient <= 3 * peak, "{transient} words for a peak of {peak}");
    // The spare holds one of exp and tanh; the other waits for relu's words.
    let l = levels_of(&plan, &a);
    let (exp, tanh) = (l.step[3].expect("computed"), l.step[4].expect("computed"));
    assert_eq!((exp.min(tanh), exp.max(tanh) > 0, l.count), (0, true, 5));
}

#[test]
fn large_values_take_fresh_words_where_the_arena_has_room_for_them() {
    // The same steps beside 200 values' worth of words held anyway: a value more in fresh
    // words is within `ROOM` of the whole, and saves the level.
    let plan = independent_steps_beside(&[SMALL * 2], SMALL * 2 * 200);
    let a = plan_arena(&plan);
    assert_valid(&plan, &a);
    assert_eq!(check_arena(&plan, &a), Ok(()));
    let l = levels_of(&plan, &a);
    assert_eq!((l.step[3], l.step[4], l.count), (Some(0), Some(0), 4), "exp and tanh with relu");
    let smallest = independent_steps(&[SMALL * 2]);
    let tight = plan_arena(&smallest);
    let extra = (a.total_words - a.pinned_words) - (tight.total_words - tight.pinned_words);
    assert!(extra <= a.total_words / ROOM, "{extra} words more");
}

/// x → a = exp(x), b = neg(x), c = a + b, d = c · s (s a [1] input, broadcast),
/// e = relu(d) + a2 where a2 = tanh(x) is also an output, y = e: c can be written over a
/// (or b), d over c, e over d — not over a2 (a result), s (an input, and broadcast).
fn over_plan(n: usize) -> Plan {
    let step = |op, inputs: Vec<u32>, shape: &[usize]| {
        crate::test_util::step(op, inputs, DType::F32, shape)
    };
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], &[n]), // 0
        step(Op::Input { name: "s".into() }, vec![], &[1]), // 1
        step(Op::Unary(UnaryOp::Exp), vec![0], &[n]),       // 2: a
        step(Op::Unary(UnaryOp::Neg), vec![0], &[n]),       // 3: b
        step(Op::Binary(BinaryOp::Add), vec![2, 3], &[n]),  // 4: c
        step(Op::Binary(BinaryOp::Mul), vec![4, 1], &[n]),  // 5: d
        step(Op::Unary(UnaryOp::Tanh), vec![0], &[n]),      // 6: a2, an output
        step(Op::Unary(UnaryOp::Relu), vec![5], &[n]),      // 7
        step(Op::Binary(BinaryOp::Add), vec![7, 6], &[n]),  // 8: e, the output y
    ];
    let inputs = vec![("x".into(), 0), ("s".into(), 1)];
    Plan::of_steps(Mode::Infer, steps, inputs, vec![("y".into(), 8), ("t".into(), 6)])
}

#[test]
fn an_element_wise_step_is_written_over_an_operand_that_dies_there() {
    let plan = GpuPlan::of(&over_plan(4096));
    let root = view_roots(&plan);
    let over = element_in_place(&plan, &root, &root_last_uses(&plan, &root));
    // exp and neg read an input; the sum goes over a; the product over c (not s); relu
    // over d; the last sum over relu's value, not over the output t.
    let want = [None, None, None, None, Some(2), Some(4), None, Some(5), Some(7)];
    assert_eq!(over, want);
    let a = plan_arena(&plan);
    assert_valid(&plan, &a);
    assert_eq!(check_arena(&plan, &a), Ok(()));
    assert_eq!(a.offsets[4], a.offsets[2]);
    assert_eq!(a.offsets[8], a.offsets[2], "the chain stays in a's words");
    // At the sum x, a and b (and s) are alive, and c takes a's words: three values of
    // 4096, not four.
    assert_eq!(plan_memory(&plan).peak_live_bytes, 3 * 4096 * 4 + 4);
    levels_of(&plan, &a);
}

/// A permuted store writes element `i` of its chain elsewhere than it reads it: never over
/// its operand, even a square one that dies there.
#[test]
fn a_permuted_store_is_not_written_over_its_operand() {
    use crate::program::{Elem, GpuOp};
    let mut plan = GpuPlan::of(&over_plan(64));
    let root = view_roots(&plan);
    let fused = GpuOp::Fused { program: vec![Elem::Input(0), Elem::Unary(UnaryOp::Relu, 0)] };
    plan.steps[7].op = fused.clone();
    assert_eq!(element_in_place(&plan, &root, &root_last_uses(&plan, &root))[7], Some(5));
    let (shape, view) = (vec![64], vec![8, 8]);
    plan.steps[7].op = GpuOp::PermutedStore { op: Box::new(fused), shape, view, perm: vec![1, 0] };
    assert_eq!(element_in_place(&plan, &root, &root_last_uses(&plan, &root))[7], None);
    assert_valid(&plan, &plan_arena(&plan));
}

#[test]
fn results_written_over_their_operands_match_the_cpu() {
    // x → a = exp(x) → k = softmax(a) → c = a + k → y = softmax(c): a has two readers and
    // k is no element-wise step, so c stays a step of its own, written over a or k.
    let step = |op, inputs| crate::test_util::step(op, inputs, DType::F32, &[64, 64]);
    let softmax = Op::Softmax { axis: 1, log: false };
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![]),
        step(Op::Unary(UnaryOp::Exp), vec![0]),
        step(softmax.clone(), vec![1]),
        step(Op::Binary(BinaryOp::Add), vec![1, 2]),
        step(softmax, vec![3]),
    ];
    let plan = Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 4)]);
    let program = crate::rewrite::for_gpu(&plan);
    let sum = program.position(crate::program::StepId(3)).expect("kept");
    let a = plan_arena(&program);
    let operands = &program.steps[sum].inputs;
    assert!(operands.iter().any(|&x| a.offsets[x as usize] == a.offsets[sum]), "in place");
    assert_valid(&program, &a);
    assert_eq!(check_arena(&program, &a), Ok(()));
    levels_of(&program, &a);
    let values = (0..4096).map(|i| (i as f32 * 0.01).sin()).collect();
    let x = mgn_ir::Tensor::f32(vec![64, 64], values);
    let Some(mut gpu) = crate::test_util::open(plan.clone(), &[]) else { return };
    let got = gpu.run(&[("x", &x)], 0).expect("runs").outputs;
    let want = crate::test_util::run_on_cpu_plan(&plan, &[], &[("x", &x)]).outputs;
    crate::test_util::assert_close(
        &Op::Softmax { axis: 1, log: false },
        &got[0].1,
        &want[0].1,
        1e-5,
    );
}

#[test]
fn a_reshape_is_a_view_that_keeps_its_root_alive() {
    // x → a = relu(x) → v = reshape(a) → b = neg(x) → y = v + b: v has a's words, and a's
    // words stay taken until y reads v (b must not land on them).
    let step =
        |op, inputs, shape: Vec<usize>| crate::test_util::step(op, inputs, DType::F32, &shape);
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], vec![64]),
        step(Op::Unary(UnaryOp::Relu), vec![0], vec![64]),
        step(Op::Reshape, vec![1], vec![8, 8]),
        step(Op::Unary(UnaryOp::Neg), vec![0], vec![8, 8]),
        step(Op::Binary(BinaryOp::Add), vec![2, 3], vec![8, 8]),
    ];
    let plan = Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 4)]);
    let plan = GpuPlan::of(&plan);
    assert_eq!(view_roots(&plan), vec![0, 1, 1, 3, 4]);
    let a = plan_arena(&plan);
    assert_eq!(a.offsets[2], a.offsets[1]);
    assert_ne!(a.offsets[3], a.offsets[1]);
    check_arena(&plan, &a).expect("valid");
    let m = plan_memory(&plan);
    assert_eq!(m.peak_live_bytes, 3 * 256, "three 64-float values at most: v shares a's bytes");
}

#[test]
fn arenas_past_a_binding_the_device_or_32_bit_offsets_are_refused_by_name() {
    let plan = chain(6);
    let words = plan_arena(&plan).total_words;
    let limits = crate::limits::DeviceLimits::MIN_SPEC;
    check_fits(&plan, words, &limits, None).expect("a small chain fits");
    let bytes = words as u64 * 4;
    assert!(bytes > 256, "the chain keeps at least two 64-float values: {bytes} B");
    let small = crate::limits::DeviceLimits { max_storage_buffer_range: 256, ..limits };
    let e = check_fits(&plan, words, &small, None).unwrap_err();
    assert!(e.contains("more than one storage binding on this device holds (256 B)"), "{e}");
    assert!(e.contains("its largest values: `"), "{e}");
    let e = check_fits(&plan, words, &limits, Some(256)).unwrap_err();
    assert!(e.contains("more than the device's memory (256 B)"), "{e}");
    // The tightest limit passed is the one named.
    let e = check_fits(&plan, 1 << 33, &limits, None).unwrap_err();
    assert!(e.contains("one storage binding on this device holds (128 MiB)"), "{e}");
    let any = crate::limits::DeviceLimits { max_storage_buffer_range: u64::MAX, ..limits };
    let e = check_fits(&plan, 1 << 33, &any, None).unwrap_err();
    assert!(e.contains("32.0 GiB") && e.contains("32-bit word offsets"), "{e}");
}

/// The arena and the levels of `gpu` pass their checks, and no step that `view` names has a
/// kernel (a view shares its root's words: `check_arena` knows, `assert_valid` does not).
fn assert_views_take_no_kernel(gpu: &GpuPlan, view: impl Fn(usize) -> bool) {
    let a = plan_arena(gpu);
    assert_eq!(check_arena(gpu, &a), Ok(()));
    let words: Vec<usize> = gpu.steps.iter().map(|s| value_words(s.dtype, &s.shape)).collect();
    let l = crate::schedule::levels(gpu, &a.offsets, &words);
    crate::schedule::check(gpu, &a.offsets, &words, &l).expect("ordered");
    assert!((0..gpu.steps.len()).all(|i| !view(i) || l.step[i].is_none()), "no kernel");
}

/// Products split along k (16 × 512 × 16: one tile, deep) whose plain sums are read by a
/// split sum's epilogue (SwiGLU's, as SmolLM2's) and a rotary embedding are read through,
/// summed as they load; one read by a layer norm keeps its kernel.
fn split_sums() -> Plan {
    let f = DType::F32;
    let step = |op, inputs, shape: &[usize]| crate::test_util::step(op, inputs, f, shape);
    let ln = Op::LayerNorm { eps: 1e-5, has_weight: false, has_bias: false };
    let rope = Op::Rope { theta: 10000.0, offset: 0, inverse: false };
    let (x, w, y) = ([16, 512], [512, 16], [16, 16]);
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], &x), // 0
        step(Op::Input { name: "w1".into() }, vec![], &w), // 1
        step(Op::Input { name: "w2".into() }, vec![], &w), // 2
        step(Op::Input { name: "w3".into() }, vec![], &w), // 3
        step(Op::MatMul, vec![0, 1], &y),                 // 4: gate
        step(Op::MatMul, vec![0, 2], &y),                 // 5: up
        step(Op::Unary(UnaryOp::Silu), vec![4], &y),      // 6
        step(Op::Binary(BinaryOp::Mul), vec![6, 5], &y),  // 7: y0
        step(Op::MatMul, vec![0, 3], &y),                 // 8
        step(rope, vec![8], &y),                          // 9: y1
        step(Op::MatMul, vec![0, 3], &y),                 // 10
        step(ln, vec![10], &y),                           // 11: y2
        step(Op::MatMul, vec![0, 2], &y),                 // 12
        step(Op::Binary(BinaryOp::Add), vec![12, 8], &y), // 13: y3, reading two sums
    ];
    let inputs = ["x", "w1", "w2", "w3"].iter().enumerate();
    let inputs = inputs.map(|(i, n)| (n.to_string(), i as u32)).collect();
    let outputs = [7, 9, 11, 13].iter().map(|&i| (format!("y{i}"), i)).collect();
    Plan::of_steps(Mode::Infer, steps, inputs, outputs)
}

#[test]
fn split_sums_read_only_by_loads_are_summed_views() {
    let plan = split_sums();
    plan.validate().expect("valid");
    let gpu = crate::rewrite::for_gpu(&plan);
    let summed = summed_views(&gpu);
    let sums = |f: &dyn Fn(usize) -> bool| {
        (0..gpu.steps.len())
            .filter(|&i| matches!(gpu.steps[i].op, GpuOp::SplitSum { .. }) && f(i))
            .count()
    };
    // Fusion makes the gate's product head SwiGLU (silu(g) · u) and step 12's the sum: the
    // up projection's plain sum is read by the gate's split sum, and step 8's by the rotary
    // embedding and the other sum — two views. The layer norm's input and the two sums with
    // epilogues stay kernels.
    let described: Vec<String> = gpu.steps.iter().map(|s| s.op.describe()).collect();
    assert_eq!(sums(&|i| summed[i] > 1), 2, "{described:?}");
    assert_eq!(sums(&|i| summed[i] == 0), 3, "{described:?}");
    let norm = gpu.steps.iter().find(|s| matches!(s.op, GpuOp::Plan(Op::LayerNorm { .. })));
    assert_eq!(summed[norm.expect("kept").inputs[0] as usize], 0, "a norm reads rows thrice");
    assert!(summed.iter().all(|&s| s == 0 || s == 4), "{summed:?}");
    assert_views_take_no_kernel(&gpu, |i| summed[i] > 1);
    let t = crate::test_util::tensor;
    let v = [t(&[16, 512], 1), t(&[512, 16], 2), t(&[512, 16], 3), t(&[512, 16], 4)];
    let given: Vec<(&str, &mgn_ir::tensor::Tensor)> =
        ["x", "w1", "w2", "w3"].into_iter().zip(&v).collect();
    // k = 512 summed in four ranges: the order of the additions differs from the CPU's.
    crate::test_util::assert_rewrite_keeps_results_within(&plan, gpu, &given, (1e-4, 1e-4));
}

/// A GEGLU over a product's two halves (slices along the last axis read by `gelu(b) · a`), a
/// middle-axis slice read by `exp`: sliced views. A slice read by a product and a slice that is
/// a result stay kernels.
fn slices() -> Plan {
    let f = DType::F32;
    let step = |op, inputs, shape: &[usize]| crate::test_util::step(op, inputs, f, shape);
    let slice = |axis, start, end| Op::Slice { axis, start, end };
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], &[3, 5, 8]), // 0
        step(Op::Input { name: "w".into() }, vec![], &[8, 12]),   // 1
        step(Op::Input { name: "v".into() }, vec![], &[12, 4]),   // 2
        step(Op::MatMul, vec![0, 1], &[3, 5, 12]),                // 3
        step(slice(2, 0, 6), vec![3], &[3, 5, 6]),                // 4: a
        step(slice(2, 6, 12), vec![3], &[3, 5, 6]),               // 5: b
        step(Op::Unary(UnaryOp::Gelu), vec![5], &[3, 5, 6]),      // 6
        step(Op::Binary(BinaryOp::Mul), vec![4, 6], &[3, 5, 6]),  // 7: y0
        step(slice(1, 2, 5), vec![3], &[3, 3, 12]),               // 8
        step(Op::Unary(UnaryOp::Exp), vec![8], &[3, 3, 12]),      // 9: y1
        step(slice(1, 1, 4), vec![3], &[3, 3, 12]),               // 10
        step(Op::MatMul, vec![10, 2], &[3, 3, 4]),                // 11: y2
        step(slice(0, 1, 3), vec![3], &[2, 5, 12]),               // 12: y3
    ];
    let inputs = ["x", "w", "v"].iter().enumerate();
    let inputs = inputs.map(|(i, n)| (n.to_string(), i as u32)).collect();
    let outputs = [7, 9, 11, 12].iter().map(|&i| (format!("y{i}"), i)).collect();
    Plan::of_steps(Mode::Infer, steps, inputs, outputs)
}

#[test]
fn slices_read_only_by_loads_are_sliced_views() {
    let plan = slices();
    plan.validate().expect("valid");
    let gpu = crate::rewrite::for_gpu(&plan);
    let sliced = sliced_views(&gpu);
    let views: Vec<(usize, bool)> = (0..gpu.steps.len())
        .filter_map(|i| match gpu.steps[i].op {
            GpuOp::Plan(Op::Slice { start, .. }) => Some((start, sliced[i])),
            _ => None,
        })
        .collect();
    assert_eq!(views, [(0, true), (6, true), (2, true), (1, false), (1, false)]);
    assert_views_take_no_kernel(&gpu, |i| sliced[i]);
    let t = crate::test_util::tensor;
    let v = [t(&[3, 5, 8], 1), t(&[8, 12], 2), t(&[12, 4], 3)];
    let given: Vec<(&str, &mgn_ir::tensor::Tensor)> = ["x", "w", "v"].into_iter().zip(&v).collect();
    crate::test_util::assert_rewrite_keeps_results(&plan, gpu, &given);
}
