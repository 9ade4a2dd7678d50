//! Decoding with a KV cache on the GPU against the CPU reference: `Narrow` and `SliceScatter`
//! at a run-time start (clamped at both ends, as the CPU clamps it), `Rope` moved by a run-time
//! start, and plans whose state (`Plan::state_writes`) one run leaves for the next.

use super::test_util::{assert_close, check_on_both, open, run_on_gpu, step, values};
use crate::program::GpuPlan;
use crate::reference::run_and_write;
use mgn_ir::op::{BinaryOp, Op, ReduceOp};
use mgn_ir::plan::{InitSpec, Mode, ParamSpec, Plan};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

fn floats(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed))
}

fn ints(shape: &[usize], seed: i32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::i32(shape.to_vec(), (0..n as i32).map(|i| i * 7 - seed).collect())
}

fn start(s: i32) -> Tensor {
    Tensor::i32(vec![], vec![s])
}

/// Starts before, inside and past an axis of `size` for a window of `len`.
fn starts(size: usize, len: usize) -> Vec<i32> {
    let room = (size - len) as i32;
    vec![-5, -1, 0, 1, room / 2, room, room + 1, 1000]
}

#[test]
fn narrow_matches_the_cpu_at_every_start() {
    let cases: &[(&[usize], usize, usize)] =
        &[(&[2, 6, 3], 1, 2), (&[5, 4], 0, 3), (&[3, 2, 7], 2, 7), (&[1, 9, 2, 4], 1, 1)];
    for &(shape, axis, len) in cases {
        let mut out = shape.to_vec();
        out[axis] = len;
        for s in starts(shape[axis], len) {
            let op = Op::Narrow { axis, len };
            check_on_both(&op, &[floats(shape, 3), start(s)], DType::F32, &out, 0.0);
        }
    }
    // Integers (a cached token window) move as words too.
    let op = Op::Narrow { axis: 1, len: 2 };
    check_on_both(&op, &[ints(&[2, 5], 3), start(2)], DType::I32, &[2, 2], 0.0);
}

#[test]
fn slice_scatter_matches_the_cpu_at_every_start() {
    let cases: &[(&[usize], &[usize], usize)] = &[
        (&[1, 6, 2], &[1, 1, 2], 1),
        (&[2, 3, 8], &[2, 3, 3], 2),
        (&[4, 3], &[2, 3], 0),
        (&[2, 4, 5], &[2, 4, 5], 1),
        (&[2, 2, 7, 4], &[2, 2, 2, 4], 2),
    ];
    for &(shape, src, axis) in cases {
        let op = Op::SliceScatter { axis };
        for s in starts(shape[axis], src[axis]) {
            let x = [floats(shape, 5), floats(src, 6), start(s)];
            check_on_both(&op, &x, DType::F32, shape, 0.0);
            let x = [ints(shape, 5), ints(src, 100), start(s)];
            check_on_both(&op, &x, DType::I32, shape, 0.0);
        }
    }
}

#[test]
fn a_clamped_window_stays_inside_the_axis() {
    // Written out, not only compared: the last window for a start past the end, the first
    // for a negative one.
    let x = Tensor::f32(vec![1, 4, 1], vec![0.0, 1.0, 2.0, 3.0]);
    let src = Tensor::f32(vec![1, 2, 1], vec![8.0, 9.0]);
    let scatter = |s: i32| {
        run_on_gpu(
            &Op::SliceScatter { axis: 1 },
            &[x.clone(), src.clone(), start(s)],
            DType::F32,
            &[1, 4, 1],
        )
    };
    let Some(past) = scatter(7) else { return };
    assert_eq!(past.to_f64_vec(), vec![0.0, 1.0, 8.0, 9.0]);
    let before = scatter(-2).expect("the GPU ran once");
    assert_eq!(before.to_f64_vec(), vec![8.0, 9.0, 2.0, 3.0]);
    let narrow =
        run_on_gpu(&Op::Narrow { axis: 1, len: 3 }, &[x, start(9)], DType::F32, &[1, 3, 1]);
    assert_eq!(narrow.expect("the GPU ran").to_f64_vec(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn rope_at_a_run_time_start_matches_the_cpu() {
    let x = floats(&[2, 3, 1, 8], 41);
    // Far positions too: the angle is exact there (`kernels::select::rope`).
    for (offset, s) in [(0, 0), (0, 7), (3, 5), (2, -4), (0, 300), (5, 100_000)] {
        for inverse in [false, true] {
            check_on_both(
                &Op::Rope { theta: 10000.0, offset, inverse },
                &[x.clone(), start(s)],
                DType::F32,
                &[2, 3, 1, 8],
                1e-5,
            );
        }
    }
    // Several positions from the start (a prompt's prefill at a cache offset).
    let op = Op::Rope { theta: 500.0, offset: 1, inverse: false };
    check_on_both(&op, &[floats(&[5, 4], 42), start(6)], DType::F32, &[5, 4], 1e-5);
}

/// A buffer written by a run: not trained, not saved with the weights.
fn state(name: &str, dtype: DType, shape: &[usize]) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        init: InitSpec::Constant(0.0),
        trainable: false,
        frozen: false,
        persistent: false,
    }
}

/// The KV-cache plan: `cache` ← `slice_scatter(cache, new, pos)`; outputs a window of the
/// updated cache, its sum, and the old cache (which must be read before the write lands).
fn cache_plan() -> Plan {
    let f = DType::F32;
    let steps = vec![
        step(Op::Param { index: 0 }, vec![], f, &[1, 6, 2]),
        step(Op::Input { name: "new".into() }, vec![], f, &[1, 1, 2]),
        step(Op::Input { name: "pos".into() }, vec![], DType::I32, &[]),
        step(Op::SliceScatter { axis: 1 }, vec![0, 1, 2], f, &[1, 6, 2]),
        step(Op::Narrow { axis: 1, len: 3 }, vec![3, 2], f, &[1, 3, 2]),
        step(
            Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1, 2], keepdim: false },
            vec![3],
            f,
            &[],
        ),
    ];
    let inputs = vec![("new".into(), 1), ("pos".into(), 2)];
    let outputs = vec![("window".into(), 4), ("total".into(), 5), ("old".into(), 0)];
    Plan {
        params: vec![state("cache", f, &[1, 6, 2])],
        state_writes: vec![(0, 3)],
        loss_scaling: None,
        ..Plan::of_steps(Mode::Infer, steps, inputs, outputs)
    }
}

/// Every parameter the GPU holds equals the CPU's.
fn assert_params(got: Vec<Option<Tensor>>, want: &[Tensor], run: usize) {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.as_ref().unwrap_or_else(|| panic!("run {run}: parameter {k} is not held"));
        assert_eq!(g.dtype, w.dtype, "run {run}: parameter {k}");
        assert_close(&Op::Param { index: k }, g, w, 0.0);
    }
}

/// One run of `gpu` on `given` against the CPU reference (which writes its state into `cpu`):
/// every output and, after it, every parameter the same.
fn assert_run_matches(
    gpu: &mut crate::GpuSession,
    reference: &GpuPlan,
    cpu: &mut [Tensor],
    given: &[(&str, &Tensor)],
    run: usize,
) {
    let want = run_and_write(reference, cpu, given);
    let got = gpu.run(given, 0).expect("runs");
    for ((name, g), (_, w)) in got.outputs.iter().zip(&want.outputs) {
        assert_eq!(g.shape, w.shape, "run {run}: `{name}`");
        assert_close(&Op::Reshape, g, w, 1e-6);
    }
    assert_params(gpu.params().expect("reads back"), cpu, run);
}

#[test]
fn a_kv_cache_written_over_four_runs_matches_the_cpu() {
    let plan = cache_plan();
    plan.validate().expect("a valid plan");
    let checked = crate::kernels::check_plan(&plan, &crate::limits::DeviceLimits::MIN_SPEC);
    assert!(checked.missing.is_empty() && checked.invalid.is_empty(), "{checked:?}");
    let reference = GpuPlan::of(&plan);
    let init = floats(&[1, 6, 2], 7);
    let Some(mut gpu) = open(plan, std::slice::from_ref(&init)) else { return };
    let mut cpu = vec![init];
    for pos in 0..4 {
        let (new, p) = (floats(&[1, 1, 2], 20 + pos as u32), start(pos));
        assert_run_matches(
            &mut gpu,
            &reference,
            &mut cpu,
            &[("new", &new), ("pos", &p)],
            pos as usize,
        );
    }
    // A resident run (nothing read back) writes the state too; a start past the cache writes
    // its last row.
    let (new, p) = (floats(&[1, 1, 2], 30), start(9));
    let given = [("new", &new), ("pos", &p)];
    run_and_write(&reference, &mut cpu, &given);
    gpu.run_resident(&given, 0).expect("runs");
    assert_params(gpu.params().expect("reads back"), &cpu, 4);
}

/// A decoding step's cache written in place: `cache_plan` without the old cache among the
/// outputs, so the scatter is the cache's only reader.
#[test]
fn a_cache_nothing_else_reads_is_written_in_place_and_matches_the_cpu() {
    let mut plan = cache_plan();
    plan.outputs.retain(|(name, _)| name != "old");
    plan.validate().expect("a valid plan");
    let program = crate::rewrite::for_gpu(&plan);
    assert_eq!(program.steps[3].op, crate::program::GpuOp::ScatterInPlace { axis: 1, rope: None });
    let layout = crate::memory::plan_arena(&program);
    assert_eq!(layout.offsets[3], layout.offsets[0], "the scatter's words are the cache's");
    let mut top = layout.total_words;
    let copies = crate::state::state_copies(&program, &layout.offsets, &mut top);
    assert_eq!(copies, Ok(vec![]), "nothing to copy back");
    let words: Vec<usize> = program.steps.iter().map(|s| s.shape.iter().product()).collect();
    let levels = crate::schedule::levels(&program, &layout.offsets, &words);
    crate::schedule::check(&program, &layout.offsets, &words, &levels).expect("ordered");
    // With the old cache returned, it is read after the write would land: no rewrite.
    let kept = crate::rewrite::for_gpu(&cache_plan());
    assert_eq!(kept.steps[3].op, crate::program::GpuOp::Plan(Op::SliceScatter { axis: 1 }));

    let reference = GpuPlan::of(&plan);
    let init = floats(&[1, 6, 2], 7);
    let Some(mut gpu) = open(plan, std::slice::from_ref(&init)) else { return };
    let mut cpu = vec![init];
    for (run, pos) in [0, 1, 2, 5, 9, -3].into_iter().enumerate() {
        let (new, p) = (floats(&[1, 1, 2], 40 + run as u32), start(pos));
        assert_run_matches(&mut gpu, &reference, &mut cpu, &[("new", &new), ("pos", &p)], run);
    }
}

/// Writes that could alias: `a` ← old `b` while `b` ← `a + x` (b's words are read by one copy
/// and written by the other), `c` ← `c` (no copy), `n` ← `n + 1` (an i32 counter), and `u`,
/// which no step reads, ← the input `y`. Outputs: the old `a`, `a + b`, the old counter.
fn aliasing_plan() -> Plan {
    let (f, i) = (DType::F32, DType::I32);
    let steps = vec![
        step(Op::Param { index: 0 }, vec![], f, &[3]),
        step(Op::Param { index: 1 }, vec![], f, &[3]),
        step(Op::Param { index: 2 }, vec![], i, &[]),
        step(Op::Input { name: "x".into() }, vec![], f, &[3]),
        step(Op::Binary(BinaryOp::Add), vec![0, 3], f, &[3]),
        step(Op::Constant { value: 1.0 }, vec![], i, &[]),
        step(Op::Binary(BinaryOp::Add), vec![2, 5], i, &[]),
        step(Op::Input { name: "y".into() }, vec![], f, &[2]),
        step(Op::Binary(BinaryOp::Add), vec![0, 1], f, &[3]),
        step(Op::Param { index: 3 }, vec![], f, &[4]),
        step(Op::Unary(mgn_ir::op::UnaryOp::Neg), vec![9], f, &[4]),
    ];
    let inputs = vec![("x".into(), 3), ("y".into(), 7)];
    let outputs = vec![("a".into(), 0), ("sum".into(), 8), ("n".into(), 2), ("neg".into(), 10)];
    Plan {
        params: vec![
            state("a", f, &[3]),
            state("b", f, &[3]),
            state("n", i, &[]),
            state("c", f, &[4]),
            state("u", f, &[2]),
        ],
        state_writes: vec![(0, 1), (1, 4), (2, 6), (3, 9), (4, 7)],
        loss_scaling: None,
        ..Plan::of_steps(Mode::Infer, steps, inputs, outputs)
    }
}

#[test]
fn swapped_unchanged_integer_and_unread_state_is_carried_like_the_cpu() {
    let plan = aliasing_plan();
    plan.validate().expect("a valid plan");
    let reference = GpuPlan::of(&plan);
    let mut cpu = vec![
        floats(&[3], 1),
        floats(&[3], 2),
        Tensor::i32(vec![], vec![5]),
        floats(&[4], 4),
        floats(&[2], 5),
    ];
    let Some(mut gpu) = open(plan, &cpu) else { return };
    for run in 0..3 {
        let (x, y) = (floats(&[3], 10 + run), floats(&[2], 20 + run));
        let given = [("x", &x), ("y", &y)];
        let want = run_and_write(&reference, &mut cpu, &given);
        let got = gpu.run(&given, 0).expect("runs");
        for ((name, g), (_, w)) in got.outputs.iter().zip(&want.outputs) {
            assert_eq!((g.dtype, &g.shape), (w.dtype, &w.shape), "run {run}: `{name}`");
            assert_close(&Op::Reshape, g, w, 1e-6);
        }
        assert_params(gpu.params().expect("reads back"), &cpu, run as usize);
    }
    assert_eq!(cpu[2].to_f64_vec(), vec![8.0], "the counter counted the runs");
}

/// A decoding step's keys rotated at the run-time position and written into the cache in
/// place (`rewrite::rope_scatter`: one step, `ScatterInPlace` with its `rope`), over runs at
/// several positions, a window of 3 tokens at once among them: the cache, and the window read
/// after the write, equal the CPU's. Queries rotated the same way but also returned keep their
/// own rotation.
#[test]
fn keys_rotated_as_they_are_written_into_the_cache_match_the_cpu() {
    use crate::program::GpuOp;
    let f = DType::F32;
    for t in [1, 3] {
        let rope = Op::Rope { theta: 100.0, offset: 0, inverse: false };
        let steps = vec![
            step(Op::Param { index: 0 }, vec![], f, &[2, 9, 6]),
            step(Op::Input { name: "new".into() }, vec![], f, &[2, t, 6]),
            step(Op::Input { name: "pos".into() }, vec![], DType::I32, &[]),
            step(rope.clone(), vec![1, 2], f, &[2, t, 6]),
            step(Op::SliceScatter { axis: 1 }, vec![0, 3, 2], f, &[2, 9, 6]),
            step(Op::Narrow { axis: 1, len: 4 }, vec![4, 2], f, &[2, 4, 6]),
            step(rope, vec![1, 2], f, &[2, t, 6]),
        ];
        let inputs = vec![("new".into(), 1), ("pos".into(), 2)];
        let outputs = vec![("window".into(), 5), ("q".into(), 6)];
        let plan = Plan {
            params: vec![state("cache", f, &[2, 9, 6])],
            state_writes: vec![(0, 4)],
            loss_scaling: None,
            ..Plan::of_steps(Mode::Infer, steps, inputs, outputs)
        };
        plan.validate().expect("a valid plan");
        let program = crate::rewrite::for_gpu(&plan);
        let rotated = |op: &GpuOp| matches!(op, GpuOp::ScatterInPlace { rope: Some(_), .. });
        assert!(program.steps.iter().any(|s| rotated(&s.op)), "{:#?}", program.steps);
        let ropes = program.steps.iter().filter(|s| matches!(s.op, GpuOp::Plan(Op::Rope { .. })));
        assert_eq!(ropes.count(), 1, "the queries' rotation stays");
        let checked = crate::kernels::check_plan(&plan, &crate::limits::DeviceLimits::MIN_SPEC);
        assert!(checked.missing.is_empty() && checked.invalid.is_empty(), "{checked:?}");
        // The reference runs the rewritten program: its rotation inside the scatter.
        let reference = program.clone();
        let init = floats(&[2, 9, 6], 7);
        let Some(mut gpu) = open(plan, std::slice::from_ref(&init)) else { return };
        let mut cpu = vec![init];
        for (run, pos) in [0, 1, 4, 7, -2].into_iter().enumerate() {
            let (new, p) = (floats(&[2, t, 6], 60 + run as u32), start(pos));
            let given = [("new", &new), ("pos", &p)];
            let want = run_and_write(&reference, &mut cpu, &given);
            let got = gpu.run(&given, 0).expect("runs");
            for ((name, g), (_, w)) in got.outputs.iter().zip(&want.outputs) {
                assert_close(&Op::Reshape, g, w, 1e-5);
                assert_eq!(g.shape, w.shape, "run {run}: `{name}`");
            }
            let params = gpu.params().expect("reads back");
            let held = params[0].as_ref().expect("the cache is held");
            assert_close(&Op::Param { index: 0 }, held, &cpu[0], 1e-5);
        }
    }
}

/// Decoding's queries rotated at the run-time position as the attention loads them
/// (`rewrite::rope_scatter`: one `RotatedAttention` step instead of a rope and an attention),
/// with and without a mask, one row and a causal three, head dims that fill the kernel's lanes
/// (16) and that leave some idle (6, 12): the output equals the plan's as compiled, on the CPU,
/// at every position. A rotation also returned stays a step of its own.
#[test]
fn queries_rotated_as_the_attention_loads_them_match_the_cpu() {
    use crate::program::{GpuOp, Program};
    let f = DType::F32;
    for (t, d, has_mask, returned) in
        [(1, 6, false, false), (1, 16, true, false), (3, 12, true, false), (1, 16, false, true)]
    {
        let rope = Op::Rope { theta: 100.0, offset: 1, inverse: false };
        let attention = Op::Attention { causal: t > 1, scale: 0.3, has_mask };
        let mut steps = vec![
            step(Op::Input { name: "q".into() }, vec![], f, &[2, 4, t, d]),
            step(Op::Input { name: "k".into() }, vec![], f, &[2, 2, 9, d]),
            step(Op::Input { name: "v".into() }, vec![], f, &[2, 2, 9, d]),
            step(Op::Input { name: "mask".into() }, vec![], f, &[t, 9]),
            step(Op::Input { name: "pos".into() }, vec![], DType::I32, &[]),
            step(rope, vec![0, 4], f, &[2, 4, t, d]),
        ];
        let operands = if has_mask { vec![5, 1, 2, 3] } else { vec![5, 1, 2] };
        steps.push(step(attention, operands, f, &[2, 4, t, d]));
        let mut inputs: Vec<(String, u32)> = ["q", "k", "v", "mask", "pos"]
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), i as u32))
            .collect();
        if !has_mask {
            inputs.remove(3);
        }
        let mut outputs = vec![("y".into(), 6)];
        if returned {
            outputs.push(("rotated".into(), 5));
        }
        let mut plan = Plan::of_steps(Mode::Infer, steps, inputs, outputs);
        if !has_mask {
            // The mask's step unread: a constant in its place keeps the steps' numbers.
            plan.steps[3] = step(Op::Constant { value: 0.0 }, vec![], f, &[t, 9]);
        }
        plan.validate().expect("a valid plan");
        let program = crate::rewrite::for_gpu(&plan);
        let folded = program.steps.iter().any(|s| matches!(s.op, GpuOp::RotatedAttention { .. }));
        assert_eq!(folded, !returned, "{:#?}", program.steps);
        let checked = crate::kernels::check_plan(&plan, &crate::limits::DeviceLimits::MIN_SPEC);
        assert!(checked.missing.is_empty() && checked.invalid.is_empty(), "{checked:?}");
        // The reference runs the plan as compiled: a rope, then the attention.
        let reference = Program::with_choices(&plan, Default::default()).to_gpu_plan();
        let Some(mut gpu) = open(plan, &[]) else { return };
        for (run, pos) in [0, 1, 5, 300, -2].into_iter().enumerate() {
            let seed = 10 * run as u32;
            let (q, k) = (floats(&[2, 4, t, d], seed), floats(&[2, 2, 9, d], seed + 1));
            let (v, mask) = (floats(&[2, 2, 9, d], seed + 2), floats(&[t, 9], seed + 3));
            let p = start(pos);
            let mut given = vec![("q", &q), ("k", &k), ("v", &v), ("mask", &mask), ("pos", &p)];
            if !has_mask {
                given.remove(3);
            }
            let want = crate::reference::run(&reference, &[], &given);
            let got = gpu.run(&given, 0).expect("runs");
            for ((name, g), (_, w)) in got.outputs.iter().zip(&want.outputs) {
                assert_eq!(g.shape, w.shape, "run {run}: `{name}`");
                assert_close(&Op::Reshape, g, w, 1e-5);
            }
        }
    }
}

/// A mixed policy's decoding: the rotated queries cast to f16 before the attention, the keys
/// and values too. The cast folds with the rotation (`RotatedAttention`'s `rounded`: each
/// rotated word rounded to f16 as the cast stored it) and the output equals the plan's as
/// compiled at every position, within two of the output's f16 steps (a kernel that skips the
/// rounding differs by one step here and there, too little to tell apart on every device).
#[test]
fn queries_rotated_and_rounded_to_f16_as_the_attention_loads_them_match_the_cpu() {
    use crate::program::{GpuOp, Program};
    let (f, h) = (DType::F32, DType::F16);
    let rope = Op::Rope { theta: 100.0, offset: 0, inverse: false };
    let attention = Op::Attention { causal: false, scale: 4.0, has_mask: false };
    let steps = vec![
        step(Op::Input { name: "q".into() }, vec![], f, &[1, 4, 1, 16]),
        step(Op::Input { name: "k".into() }, vec![], f, &[1, 2, 9, 16]),
        step(Op::Input { name: "v".into() }, vec![], f, &[1, 2, 9, 16]),
        step(Op::Input { name: "pos".into() }, vec![], DType::I32, &[]),
        step(rope, vec![0, 3], f, &[1, 4, 1, 16]),
        step(Op::Cast, vec![4], h, &[1, 4, 1, 16]),
        step(Op::Cast, vec![1], h, &[1, 2, 9, 16]),
        step(Op::Cast, vec![2], h, &[1, 2, 9, 16]),
        step(attention, vec![5, 6, 7], h, &[1, 4, 1, 16]),
    ];
    let inputs = ["q", "k", "v", "pos"].iter().enumerate();
    let inputs = inputs.map(|(i, n)| (n.to_string(), i as u32)).collect();
    let plan = Plan::of_steps(Mode::Infer, steps, inputs, vec![("y".into(), 8)]);
    plan.validate().expect("a valid plan");
    let program = crate::rewrite::for_gpu(&plan);
    let rounded =
        |op: &GpuOp| matches!(op, GpuOp::RotatedAttention { rounded: Some(DType::F16), .. });
    assert!(program.steps.iter().any(|s| rounded(&s.op)), "{:#?}", program.steps);
    let checked = crate::kernels::check_plan(&plan, &crate::limits::DeviceLimits::MIN_SPEC);
    assert!(checked.missing.is_empty() && checked.invalid.is_empty(), "{checked:?}");
    let reference = Program::with_choices(&plan, Default::default()).to_gpu_plan();
    let Some(mut gpu) = open(plan, &[]) else { return };
    for (run, pos) in [0, 3, 200].into_iter().enumerate() {
        let seed = 10 * run as u32;
        let (q, k) = (floats(&[1, 4, 1, 16], seed), floats(&[1, 2, 9, 16], seed + 1));
        let (v, p) = (floats(&[1, 2, 9, 16], seed + 2), start(pos));
        let given = [("q", &q), ("k", &k), ("v", &v), ("pos", &p)];
        let want = crate::reference::run(&reference, &[], &given);
        let got = gpu.run(&given, 0).expect("runs");
        assert_close(&Op::Reshape, &got.outputs[0].1, &want.outputs[0].1, 1e-3);
    }
}
