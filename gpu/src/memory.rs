//! What a GPU plan needs in memory, computed from the plan alone: the parameters, and the step
//! values under the session's order (each value is computed at its step and freed after its
//! last reader; results live to the end). `peak_live_bytes` is the most that is alive at once,
//! the lower bound a memory planner that reuses buffers between steps can reach;
//! `logical_bytes` is what one buffer per value, never reused, would take. Then the arena plan
//! the session runs with (`plan_arena`), checked by `check_arena`.
//!
//! Readers, results and last uses come from `mgn_ir::analysis::DefUse` over the plan's
//! positions. A compiled plan's memory is that of `GpuPlan::of(plan)`.
//!
//! Bytes are counted at each step's declared dtype (`f32` 4, `bf16` 2, `bool` 1, …), as a GPU
//! buffer holds it, whatever wider storage the CPU backend uses.

use crate::program::{GpuOp, GpuPlan};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;
use mgn_ir::DType;

mod dequantized;
pub use dequantized::dequantized_views;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PlanMemory {
    /// Every parameter and buffer of the plan's table (trained, frozen and running statistics).
    pub param_bytes: u64,
    /// The model inputs the plan reads.
    pub input_bytes: u64,
    /// The inputs plus every computed step's value: the total without any reuse. Parameters are
    /// not included (they are `param_bytes`).
    pub logical_bytes: u64,
    /// The most input and step-value bytes alive at once; during a step, its inputs and its
    /// result are all alive.
    pub peak_live_bytes: u64,
}

/// Bytes of one step's value at its declared dtype.
pub fn step_bytes(plan: &GpuPlan, step: usize) -> u64 {
    let s = &plan.steps[step];
    s.dtype.stored_bytes(s.shape.iter().product()) as u64
}

pub fn plan_memory(plan: &GpuPlan) -> PlanMemory {
    let param_bytes = plan.params.iter().map(|p| p.dtype.stored_bytes(p.numel()) as u64).sum();
    let root = view_roots(plan);
    let last_use = root_last_uses(plan, &root);
    let over = element_in_place(plan, &root, &last_use);
    let mut m = PlanMemory { param_bytes, ..Default::default() };
    for (i, s) in plan.steps.iter().enumerate() {
        if !matches!(s.op, GpuOp::Plan(Op::Param { .. })) {
            m.logical_bytes += step_bytes(plan, i);
        }
        if matches!(s.op, GpuOp::Plan(Op::Input { .. })) {
            m.input_bytes += step_bytes(plan, i);
        }
    }
    m.peak_live_bytes = peak_live(plan, &root, &last_use, &over);
    m
}

/// The most input and step-value bytes alive at once, with the results of the steps `over`
/// names written over those operands. Views (reshapes, identity dropout) hold no words of
/// their own: each root counts once, alive until the last reader of it or of any view of it.
fn peak_live(plan: &GpuPlan, root: &[usize], last_use: &[usize], over: &[Option<usize>]) -> u64 {
    let mut live = vec![false; plan.steps.len()];
    let (mut now, mut peak) = (0u64, 0u64);
    for (i, s) in plan.steps.iter().enumerate() {
        if root[i] == i && !matches!(s.op, GpuOp::Plan(Op::Param { .. })) {
            live[i] = true;
            now += step_bytes(plan, i);
            // Written over an operand that dies here: that operand's bytes are its bytes.
            if let Some(r) = over[i].filter(|&r| live[r]) {
                live[r] = false;
                now -= step_bytes(plan, r);
            }
        }
        peak = peak.max(now);
        for &x in &s.inputs {
            let r = root[x as usize];
            if last_use[r] == i && live[r] {
                live[r] = false;
                now -= step_bytes(plan, r);
            }
        }
    }
    peak
}

#[cfg(test)]
mod tests;

/// Where every value lives in one arena (in 32-bit words): parameters and inputs are pinned
/// (they persist across runs); every other value gets a region from its step on — until its last
/// reader for intermediates, to the end for results — and freed regions are reused by later values
/// (offset-based aliasing, best fit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaPlan {
    /// First word of each step's value (`usize` words of 4 bytes).
    pub offsets: Vec<usize>,
    /// Words of the whole arena.
    pub total_words: usize,
    /// Words of the pinned part (parameters and inputs).
    pub pinned_words: usize,
    /// Words of the parameters alone.
    pub param_words: usize,
}

/// For each step, the value whose words hold it: itself, or — for a view — its input's root.
/// A view is a step whose output has its input's elements in the same order, so it needs no
/// words and no kernel of its own: a reshape, and dropout where it is the identity (inference
/// plans, p = 0). Values are never written after their step, so sharing words is safe.
pub fn view_roots(plan: &GpuPlan) -> Vec<usize> {
    roots_of(plan, &ReadViews::of(plan))
}

/// `view_roots` with the read views `views`.
fn roots_of(plan: &GpuPlan, views: &ReadViews) -> Vec<usize> {
    let mut root: Vec<usize> = (0..plan.steps.len()).collect();
    for (i, s) in plan.steps.iter().enumerate() {
        let read = views.transposed[i] || views.rounded[i] || views.dequantized[i];
        if read || views.summed[i] > 1 || views.sliced[i] {
            root[i] = root[s.inputs[0] as usize];
            continue;
        }
        let identity = match s.op.plan_op() {
            Some(Op::Reshape) => true,
            Some(Op::Dropout { p } | Op::DropoutGrad { p, .. }) => {
                plan.mode == mgn_ir::plan::Mode::Infer || *p == 0.0
            }
            _ => false,
        };
        if let (true, [x]) = (identity, s.inputs.as_slice()) {
            let x = *x as usize;
            let same = plan.steps[x].dtype == s.dtype
                && plan.steps[x].shape.iter().product::<usize>()
                    == s.shape.iter().product::<usize>();
            if same {
                root[i] = root[x];
            }
        }
    }
    root
}

/// The values the kernels read out of another value's words: transposed views (a parameter's
/// transpose read by products) and rounded views (a cast to a half type read only by
/// contractions, which read the f32 words and round each element as they load it).
pub struct ReadViews {
    pub transposed: Vec<bool>,
    pub rounded: Vec<bool>,
    /// Per step: the partial results a summed view adds up (`summed_views`), else 0.
    pub summed: Vec<usize>,
    /// Per step: whether it is a sliced view (`sliced_views`) or a dequantized one
    /// (`dequantized_views`).
    pub sliced: Vec<bool>,
    pub dequantized: Vec<bool>,
    /// Per step: the packed type whose blocks its words hold, for a view of a packed
    /// parameter (a dequantized view, and the views of it): each load decodes.
    pub packed: Vec<Option<DType>>,
}

impl ReadViews {
    pub fn of(plan: &GpuPlan) -> ReadViews {
        let (transposed, rounded) = (transposed_views(plan), rounded_views(plan));
        let (summed, sliced) = (summed_views(plan), sliced_views(plan));
        let (dequantized, packed) = (dequantized_views(plan), vec![None; plan.steps.len()]);
        let mut views = ReadViews { transposed, rounded, summed, sliced, dequantized, packed };
        let root = roots_of(plan, &views);
        for (i, &r) in root.iter().enumerate() {
            views.packed[i] = Some(plan.steps[r].dtype).filter(|d| r != i && d.is_packed());
        }
        views
    }

    /// No views (a plan read as it is).
    pub fn none(steps: usize) -> ReadViews {
        let (transposed, rounded) = (vec![false; steps], vec![false; steps]);
        let (summed, sliced, dequantized) =
            (vec![0; steps], vec![false; steps], vec![false; steps]);
        let packed = vec![None; steps];
        ReadViews { transposed, rounded, summed, sliced, dequantized, packed }
    }
}

/// Whether every value a step of `op` reads, it reads through `kernels::load`, each element
/// once: a split sum's epilogue, a fused chain, an element-wise step, a rotary embedding.
fn reads_by_load(op: &GpuOp) -> bool {
    match op {
        GpuOp::SplitSum { .. } | GpuOp::Fused { .. } => true,
        GpuOp::Plan(op) => matches!(
            op,
            Op::Unary(_) | Op::Binary(_) | Op::UnaryGrad(_) | Op::Pow { .. } | Op::Rope { .. }
        ),
        _ => false,
    }
}

/// Which steps are sliced views: an f32 slice of an f32 value, no result, whose every reader
/// reads it through `kernels::load` (`reads_by_load`) — the two halves of a GEGLU projection
/// read by `gelu(gate) · value`, in the U-Net's seven transformer blocks. Each load maps the
/// slice's index into the value it slices (`kernels::Sliced`), so the slice is no kernel, no
/// copy and no level; its readers read the value's words instead.
pub fn sliced_views(plan: &GpuPlan) -> Vec<bool> {
    let def_use = DefUse::of(plan);
    (0..plan.steps.len())
        .map(|i| {
            let s = &plan.steps[i];
            let Some(Op::Slice { .. }) = s.op.plan_op() else { return false };
            let readers = &def_use.readers[i];
            let f32_of_f32 = s.dtype == DType::F32
                && s.inputs.len() == 1
                && plan.steps[s.inputs[0] as usize].dtype == DType::F32;
            f32_of_f32
                && !def_use.result[i]
                && !readers.is_empty()
                && readers.iter().all(|&r| reads_by_load(&plan.steps[r as usize].op))
        })
        .collect()
}

/// Which steps are summed views, and of how many partials: a split product's plain sum
/// (`GpuOp::SplitSum` with no epilogue, of f32 partials, no result) whose every reader is a
/// kernel that reads each element through `kernels::load` — another split sum (SmolLM2's and
/// SmolVLA's SwiGLU: the up projection's sum reads the gate's), a fused chain, an element-wise
/// step or a rotary embedding. Each load adds the partials up, so the sum is no kernel, no
/// dispatch and no level; a reader loads `splits` words per element instead of one, which is
/// what the sum's own kernel read, and it no longer writes and reads the sum.
pub fn summed_views(plan: &GpuPlan) -> Vec<usize> {
    let def_use = DefUse::of(plan);
    (0..plan.steps.len())
        .map(|i| {
            let s = &plan.steps[i];
            let GpuOp::SplitSum { splits, program } = &s.op else { return 0 };
            let partials = s.inputs.first().map(|&x| &plan.steps[x as usize]);
            // The plain sum's program is its one input.
            let plain = program[..] == [crate::program::Elem::Input(0)]
                && s.inputs.len() == 1
                && s.dtype == DType::F32;
            let f32_partials = partials.is_some_and(|p| p.dtype == DType::F32);
            let readers = &def_use.readers[i];
            let by_load = !readers.is_empty()
                && readers.iter().all(|&r| reads_by_load(&plan.steps[r as usize].op));
            if plain && f32_partials && by_load && !def_use.result[i] && *splits > 1 {
                *splits
            } else {
                0
            }
        })
        .collect()
}

/// Which steps are rounded views: a cast of an f32 value to a half type that only
/// contractions read — directly or through reshapes, which are rounded views too — and that is
/// no result. Rounding as a load reads the f32 word computes exactly the cast's value
/// (`halves::round`), with no kernel, no words and no pass over the value: the mixed precision
/// policy rounds every operand of every product, and each would otherwise be a dispatch of its
/// own. A contraction loads each element a few times (once per tile), so the rounding costs
/// little next to its multiply-adds.
///
/// A training plan's casts of its weights are rounded views too. Computing them instead (a half
/// copy of each weight every step, staged with no conversion; the switch `MGN_HALF_WEIGHTS`,
/// removed) made the mixed training cells 5–7% faster on an H100 but SmolLM2's values 665 → 830
/// MiB, past PyTorch autocast's peak (docs/benchmarks/2026-12-06.md): memory decided it.
pub fn rounded_views(plan: &GpuPlan) -> Vec<bool> {
    let def_use = DefUse::of(plan);
    let n = plan.steps.len();
    let reshape = |i: usize| plan.steps[i].op == GpuOp::Plan(Op::Reshape);
    // Read only by contractions, through reshapes (later steps first: readers come after).
    let mut by_products = vec![false; n];
    for i in (0..n).rev() {
        by_products[i] = !def_use.result[i]
            && !def_use.readers[i].is_empty()
            && def_use.readers[i].iter().all(|&r| {
                let r = r as usize;
                plan.steps[r].op.is_contraction() || (reshape(r) && by_products[r])
            });
    }
    let mut rounded = vec![false; n];
    for (i, s) in plan.steps.iter().enumerate() {
        let x = s.inputs.first().map(|&x| x as usize);
        rounded[i] = match (&s.op, x) {
            (GpuOp::Plan(Op::Cast), Some(x)) => {
                s.dtype.is_half() && plan.steps[x].dtype == DType::F32 && by_products[i]
            }
            // A reshape of a rounded view is one (the same words, read the same way).
            (GpuOp::Plan(Op::Reshape), Some(x)) => rounded[x] && s.dtype == plan.steps[x].dtype,
            _ => false,
        };
    }
    rounded
}

/// Which steps are transposed views: the transpose of a 2-D parameter (`x @ w^T` in every
/// linear layer) read only as the right operand of matrix products. The GPU's matmul reads the
/// parameter in place, transposed, so the transpose needs no words and no kernel; a transpose
/// anything else reads is computed as usual.
pub fn transposed_views(plan: &GpuPlan) -> Vec<bool> {
    let def_use = DefUse::of(plan);
    // Products that read an operand transposed by flag (`MatMulT`, a flagged epilogue) take no
    // transposed views: `rewrite::transposes` already folded the permutes they read.
    fn matmul(op: &GpuOp) -> bool {
        match op {
            GpuOp::NormedProduct { op, .. } => matmul(op),
            op => matches!(
                op,
                GpuOp::Plan(Op::MatMul) | GpuOp::MatMulEpilogue { ta: false, tb: false, .. }
            ),
        }
    }
    (0..plan.steps.len())
        .map(|t| {
            let s = &plan.steps[t];
            let swap = matches!(s.op.plan_op(), Some(Op::Permute { perm }) if perm[..] == [1, 0]);
            let transpose = swap
                && s.dtype.is_float()
                && dequantized::param_or_dequantized(plan, s.inputs[0] as usize);
            // Every reader reads it as its right operand and nowhere else; a result must be
            // stored in its own words.
            let right_operand_only = def_use.readers[t].iter().all(|&r| {
                let r = &plan.steps[r as usize];
                let mut at = r.inputs.iter().enumerate().filter(|(_, &x)| x as usize == t);
                matmul(&r.op) && at.next().is_some_and(|(k, _)| k == 1) && at.next().is_none()
            });
            transpose && right_operand_only && !def_use.result[t]
        })
        .collect()
}

/// `DefUse::last_uses` by root: the last step that reads a value or any view of it
/// (`usize::MAX` when the value or a view of it is a result). Views themselves get 0.
pub fn root_last_uses(plan: &GpuPlan, root: &[usize]) -> Vec<usize> {
    let per_step = DefUse::of(plan).last_uses();
    let mut out = vec![0usize; plan.steps.len()];
    for (i, &lu) in per_step.iter().enumerate() {
        out[root[i]] = out[root[i]].max(lu);
    }
    out
}

/// Regions start at multiples of this many words (16 bytes), so vector loads stay aligned.
const ALIGN: usize = 4;

/// The 32-bit words a value of this type takes: one per element, or one per two elements of
/// a half type (`f16`, `bf16`: element `2k` in the low half of word `k`, `2k + 1` in the high),
/// or a packed type's blocks, byte for byte as a checkpoint holds them, in little-endian words.
pub fn value_words(dtype: DType, shape: &[usize]) -> usize {
    let n = shape.iter().product::<usize>();
    if dtype.is_packed() {
        dtype.bytes_for(n).unwrap_or(0).div_ceil(4)
    } else if dtype.is_half() {
        n.div_ceil(2)
    } else {
        n
    }
}

/// The words step `step`'s value takes in the arena (at least one, aligned).
fn words(plan: &GpuPlan, step: usize) -> usize {
    let s = &plan.steps[step];
    value_words(s.dtype, &s.shape).max(1).div_ceil(ALIGN) * ALIGN
}

/// The value whose words step `i` updates in place, for the one op that does
/// (`GpuOp::ScatterInPlace`, into the state parameter it rewrites).
pub fn writes_into(plan: &GpuPlan, i: usize) -> Option<usize> {
    let s = &plan.steps[i];
    matches!(s.op, GpuOp::ScatterInPlace { .. }).then(|| s.inputs[0] as usize)
}

/// Per step: the value whose words an element-wise step writes its result into, when that
/// value dies there. Invocation `i` of such a kernel reads element `i` of an operand of the
/// result's shape and then writes element `i` of the result, so the result may take the
/// operand's words as it is read: nothing else reads them any more. The tied embedding's
/// gradient of a language model is the largest case — the head's weight gradient and the
/// lookup's, summed, three values of 108 MB for SmolLM2 alive together at the end of its
/// backward pass, the training plan's peak; the sum now writes over one of its terms.
/// Only f32 results of the per-element kernels (a fused chain, unary, binary, power, `where`
/// and the unary derivatives), over an f32 operand that is no result, parameter or input
/// and that the step reads at no other shape — never a `GpuOp::PermutedStore`, whose
/// invocation `i` writes another element than the one it reads.
pub fn element_in_place(plan: &GpuPlan, root: &[usize], last_use: &[usize]) -> Vec<Option<usize>> {
    let elementwise = |op: &GpuOp| {
        matches!(op, GpuOp::Fused { .. })
            || matches!(
                op.plan_op(),
                Some(Op::Unary(_) | Op::Binary(_) | Op::UnaryGrad(_) | Op::Pow { .. } | Op::Where)
            )
    };
    let mut over = vec![None; plan.steps.len()];
    for (i, s) in plan.steps.iter().enumerate() {
        if root[i] != i || s.dtype != DType::F32 || !elementwise(&s.op) {
            continue;
        }
        over[i] = s.inputs.iter().map(|&x| root[x as usize]).find(|&r| {
            let rs = &plan.steps[r];
            // Every read of r's words by this step is at the result's own index.
            let read_at_i = s.inputs.iter().filter(|&&x| root[x as usize] == r).all(|&x| {
                let xs = &plan.steps[x as usize];
                xs.shape == s.shape && xs.dtype == DType::F32
            });
            read_at_i
                && rs.dtype == DType::F32
                && words(plan, r) == words(plan, i)
                && last_use[r] == i
                && !pinned(plan, r)
                && writes_into(plan, r).is_none()
        });
    }
    over
}

/// Parameters and inputs: their words persist across runs.
fn pinned(plan: &GpuPlan, step: usize) -> bool {
    matches!(plan.steps[step].op, GpuOp::Plan(Op::Param { .. } | Op::Input { .. }))
}

/// A value the arena may give fresh words rather than make it wait for reused ones (one
/// barrier more, about 4 µs on the H200): any of up to this many words (64 KiB), and others
/// while the fresh words so taken stay within a budget (`SPARE`). Measured over the six
/// workloads, this keeps most steps at the level their inputs allow (SmolLM2's training plan
/// 1,469 → 1,207 levels, Whisper's 192 → 138) for at most 3.5% more arena.
const SMALL: usize = 16 * 1024;

/// Per step: the level it could run at by its inputs alone (as `schedule::levels` places it
/// when no reused words hold it back), and for a root the latest such level at which its words
/// are read or written (its own, or a reader's of it or a view of it).
fn levels_by_inputs(plan: &GpuPlan, root: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let n = plan.steps.len();
    let mut ready = vec![0usize; n];
    let mut computed = vec![false; n];
    for (i, s) in plan.steps.iter().enumerate() {
        if pinned(plan, i) || root[i] != i {
            continue;
        }
        computed[i] = true;
        ready[i] = s
            .inputs
            .iter()
            .map(|&x| root[x as usize])
            .filter(|&r| computed[r])
            .map(|r| ready[r] + 1)
            .max()
            .unwrap_or(0);
    }
    let mut touched = ready.clone();
    for (i, s) in plan.steps.iter().enumerate() {
        if computed[i] {
            for &x in &s.inputs {
                let r = root[x as usize];
                touched[r] = touched[r].max(ready[i]);
            }
        }
    }
    (ready, touched)
}

/// Plans the arena. A step's output shares no words with its own inputs (kernels read the
/// inputs while writing the output) — inputs are released only after the output is placed —
/// but for an element-wise step written over an operand that dies there (`element_in_place`).
///
/// Reused words cost barriers: a step placed in words another value held waits for that
/// value's readers (`schedule.rs`), one level more (about 4 µs on the H200), where fresh words
/// let it run with its inputs. Writing over operands has the same trade (a written-over step
/// waits for the operand's other readers) and also fixes where those results go, so the best
/// fit of what follows can fragment more (Whisper's inference arena 117 → 121 MiB, where
/// SmolLM2's training arena drops 780 → 672). So the arena is planned several ways — with and
/// without writing over operands, and with `SPARE` budgets of fresh words — and the layout
/// with the fewest levels kept among those within `ROOM` of the smallest (ties: the smaller).
/// SmolVLA's inference plan 288 → 261 levels for 5.7 MiB (beside 381 MiB of parameters),
/// SmolLM2's training plan 1,124 → 1,089 for 6.7 MiB (1%).
pub fn plan_arena(plan: &GpuPlan) -> ArenaPlan {
    plan_arena_and_levels(plan).0
}

/// `plan_arena`, with the levels `schedule::levels` gives its layout (over each value's
/// `value_words`, at least 1): the planner schedules every layout it weighs, so a session
/// takes the chosen one's levels from here rather than schedule it again.
pub fn plan_arena_and_levels(plan: &GpuPlan) -> (ArenaPlan, crate::schedule::Levels) {
    let root = view_roots(plan);
    let last_use = root_last_uses(plan, &root);
    let over = element_in_place(plan, &root, &last_use);
    let apart = vec![None; over.len()];
    let ways: Vec<&[Option<usize>]> =
        if over.iter().all(Option::is_none) { vec![&over] } else { vec![&over, &apart] };
    let words: Vec<usize> =
        plan.steps.iter().map(|s| value_words(s.dtype, &s.shape).max(1)).collect();
    let mut layouts: Vec<(ArenaPlan, crate::schedule::Levels)> = Vec::new();
    for over in ways {
        let peak = peak_live(plan, &root, &last_use, over) as usize / 4;
        for (times, per) in SPARE {
            let a = arena_writing_over(plan, &root, &last_use, over, peak * times / per);
            // The same layout from a larger budget (nothing more wanted fresh words) needs no
            // second schedule.
            if layouts.iter().any(|(b, _)| b.offsets == a.offsets) {
                continue;
            }
            let levels = crate::schedule::levels(plan, &a.offsets, &words);
            layouts.push((a, levels));
        }
    }
    let smallest = layouts.iter().map(|(a, _)| a.total_words).min().unwrap_or(0);
    let within = |a: &ArenaPlan| a.total_words - smallest <= smallest / ROOM;
    let best = (layouts.into_iter().filter(|(a, _)| within(a)))
        .min_by_key(|(a, levels)| (levels.count, a.total_words));
    best.expect("at least one layout")
}

/// Budgets of fresh words a value may take rather than wait for reused ones, as fractions
/// (times, per) of the values' peak: half, as much, twice and four times.
const SPARE: [(usize, usize); 4] = [(1, 2), (1, 1), (2, 1), (4, 1)];

/// A layout with fewer levels is kept if it is within 1/`ROOM` (2%) of the smallest arena —
/// parameters, inputs and values: what the session holds on the device.
const ROOM: usize = 50;

/// `plan_arena` with the results of the steps `over` names written over those operands.
fn arena_writing_over(
    plan: &GpuPlan,
    root: &[usize],
    last_use: &[usize],
    over: &[Option<usize>],
    spare: usize,
) -> ArenaPlan {
    let n = plan.steps.len();
    // Parameters and inputs persist across runs; results are placed when computed and never
    // released (their last use is "after the run"), so they need no region before that.
    let pinned: Vec<bool> = (0..n).map(|i| pinned(plan, i)).collect();
    let mut offsets = vec![0usize; n];
    let mut top = 0usize;
    for i in 0..n {
        if pinned[i] {
            offsets[i] = top;
            top += words(plan, i);
        }
    }
    let pinned_words = top;
    let param_words = (0..n)
        .filter(|&i| matches!(plan.steps[i].op, GpuOp::Plan(Op::Param { .. })))
        .map(|i| words(plan, i))
        .sum();
    // When a step's words were last touched, and when it could run by its inputs alone: a
    // region whose last use comes at or after that level would make the step wait for it
    // (schedule.rs), one barrier more.
    let (ready, touched) = levels_by_inputs(plan, root);
    // Fresh words a value may take rather than wait: `spare` in all, and any value of up to
    // `SMALL` words.
    let mut spare = spare;
    // Free regions (offset, words, the latest level their words were touched at) of the
    // transient part, kept sorted by offset.
    let mut free: Vec<(usize, usize, usize)> = Vec::new();
    for i in 0..n {
        if root[i] != i {
            offsets[i] = offsets[root[i]];
        } else if let Some(x) = writes_into(plan, i) {
            // Its kernel updates x's words (already placed: x is a parameter).
            offsets[i] = offsets[x];
        } else if let Some(r) = over[i] {
            // Its words are r's, which it reads last (r is not released below).
            offsets[i] = offsets[r];
        } else if !pinned[i] {
            let need = words(plan, i);
            // Best fit among free regions that keep the step at its level; else fresh words
            // while `spare` lasts; else best fit among all (memory counts more than a barrier).
            let best = |no_wait: bool| {
                free.iter()
                    .enumerate()
                    .filter(|(_, &(_, w, busy))| w >= need && (!no_wait || busy < ready[i]))
                    .min_by_key(|(_, &(_, w, _))| w)
                    .map(|(k, _)| k)
            };
            let waits = need > SMALL && need > spare;
            let best = best(true).or_else(|| if waits { best(false) } else { None });
            offsets[i] = match best {
                Some(k) => {
                    let (off, w, busy) = free[k];
                    if w == need {
                        free.remove(k);
                    } else {
                        free[k] = (off + need, w - need, busy);
                    }
                    off
                }
                None => {
                    // Extend a free region that ends at the top instead of leaving it stranded.
                    match free.last() {
                        Some(&(off, w, busy)) if off + w == top && (waits || busy < ready[i]) => {
                            free.pop();
                            top = off + need;
                            off
                        }
                        _ => {
                            if !waits {
                                spare = spare.saturating_sub(need);
                            }
                            top += need;
                            top - need
                        }
                    }
                }
            };
        }
        // Release what this step read for the last time.
        let mut released: Vec<usize> = plan.steps[i]
            .inputs
            .iter()
            .map(|&x| root[x as usize])
            .filter(|&r| last_use[r] == i && !pinned[r] && over[i] != Some(r))
            .collect();
        released.sort_unstable();
        released.dedup();
        for x in released {
            free.push((offsets[x], words(plan, x), touched[x]));
        }
        // A value nothing reads (last use 0: no step reads itself) is dead at once.
        if !pinned[i] && root[i] == i && last_use[i] == 0 && writes_into(plan, i).is_none() {
            free.push((offsets[i], words(plan, i), touched[i]));
        }
        free.sort_unstable();
        // Coalesce neighbours.
        let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(free.len());
        for (off, w, busy) in free.drain(..) {
            match merged.last_mut() {
                Some((o, mw, mb)) if *o + *mw == off => {
                    *mw += w;
                    *mb = (*mb).max(busy);
                }
                _ => merged.push((off, w, busy)),
            }
        }
        free = merged;
    }
    ArenaPlan { offsets, total_words: top, pinned_words, param_words }
}

/// An error, before any kernel is generated, when an arena of `words` 32-bit words cannot be
/// allocated for `plan`: past one storage binding (the arena is one), past the device's memory,
/// or past what 32-bit word offsets address. It names the size, the limit and the largest
/// values with their model lines, so the user knows what to shrink.
pub fn check_fits(
    plan: &GpuPlan,
    words: usize,
    limits: &crate::limits::DeviceLimits,
    device_memory: Option<u64>,
) -> Result<(), String> {
    let bytes = (words as u64).saturating_mul(4);
    let b = mgn_ir::units::bytes;
    let limit = [
        Some((
            u32::MAX as u64 * 4,
            format!("the {} that 32-bit word offsets address", b(u32::MAX as u64 * 4)),
        )),
        Some((
            limits.max_storage_buffer_range,
            format!(
                "one storage binding on this device holds ({})",
                b(limits.max_storage_buffer_range)
            ),
        )),
        device_memory.map(|m| (m, format!("the device's memory ({})", b(m)))),
    ];
    let Some((_, what)) = limit.into_iter().flatten().filter(|(m, _)| bytes > *m).min() else {
        return Ok(());
    };
    let mut largest: Vec<(usize, usize)> = (0..plan.steps.len())
        .filter(|&i| !matches!(plan.steps[i].op, GpuOp::Plan(Op::Param { .. })))
        .map(|i| (value_words(plan.steps[i].dtype, &plan.steps[i].shape), i))
        .collect();
    largest.sort_unstable_by(|a, b| b.cmp(a));
    let named: Vec<String> = largest
        .iter()
        .take(3)
        .map(|&(n, i)| {
            let s = &plan.steps[i];
            let size = mgn_ir::units::bytes(n as u64 * 4);
            format!("`{}` {}{:?} at {} ({size})", s.op.describe(), s.dtype, s.shape, s.loc)
        })
        .collect();
    let params = plan.params.iter().map(|p| value_words(p.dtype, &p.shape) as u64 * 4).sum::<u64>();
    Err(format!(
        "`{}` needs a GPU arena of {} (parameters {}), more than {what}; its largest values: \
         {}. Make the model or its batch smaller (`--set`), or run it on the CPU",
        plan.model,
        b(bytes),
        b(params),
        named.join("; ")
    ))
}

/// Checks that no two values alive at the same time share a word, and that every region is
/// inside the arena; returns the first violation.
pub fn check_arena(plan: &GpuPlan, a: &ArenaPlan) -> Result<(), String> {
    let root = view_roots(plan);
    let last_use = root_last_uses(plan, &root);
    let n = plan.steps.len();
    for j in (0..n).filter(|&j| root[j] != j) {
        if a.offsets[j] != a.offsets[root[j]] {
            return Err(format!("step {j} is a view of step {} but has other words", root[j]));
        }
    }
    // A step updating a value in place has that value's words, and nothing else can.
    let in_place: Vec<Option<usize>> = (0..n).map(|j| writes_into(plan, j)).collect();
    for (j, x) in in_place.iter().enumerate().filter_map(|(j, x)| x.map(|x| (j, x))) {
        if a.offsets[j] != a.offsets[x] {
            return Err(format!("step {j} updates step {x} in place but has other words"));
        }
    }
    let end = |i: usize| {
        if last_use[i] == usize::MAX || pinned(plan, i) {
            usize::MAX
        } else {
            last_use[i].max(i)
        }
    };
    let region = |i: usize| (a.offsets[i], a.offsets[i] + words(plan, i));
    // An element-wise step written over an operand that dies there takes that operand's place.
    let over = element_in_place(plan, &root, &last_use);
    // Sweep in definition order, keeping the regions alive so far.
    let mut alive: Vec<usize> = Vec::new();
    for j in (0..n).filter(|&j| root[j] == j && in_place[j].is_none()) {
        alive.retain(|&i| end(i) >= j && (over[j] != Some(i) || a.offsets[i] != a.offsets[j]));
        let (aj, bj) = region(j);
        if bj > a.total_words {
            return Err(format!("step {j} ends past the arena"));
        }
        if let Some(&i) = alive.iter().find(|&&i| {
            let (ai, bi) = region(i);
            ai < bj && aj < bi
        }) {
            return Err(format!("steps {i} and {j} are alive together but share words"));
        }
        alive.push(j);
    }
    Ok(())
}

#[cfg(test)]
mod arena_tests;
