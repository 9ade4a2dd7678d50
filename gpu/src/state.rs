//! State a run hands to the next one (`Plan::state_writes`: a KV cache, a position counter):
//! once every step of a run has read a parameter's old words, the value written into it is
//! copied over them, so the next run (and `GpuSession::params`) sees the new value.
//!
//! The copies are arena-to-arena buffer copies after the run's dispatches and downloads
//! (`device::Submission::copies`); an output that is the old parameter is read back before
//! them, as the CPU reads its outputs before it replaces its state. The written values are
//! results of the GPU plan (`GpuPlan::results`), so the arena plan keeps their words to the
//! end of the run, and no view or rewrite lets one share words with another value but its
//! root. A written value that *is* the parameter (its own `Param` step, or a view of it) needs
//! no copy.
//!
//! One case needs care: a value written into one parameter may be another written parameter's
//! old words (two buffers swapped). The copies of one pass are unordered, so such sources are
//! first staged into scratch words past the arena's other regions, in a pass of their own.

use crate::program::{GpuOp, GpuPlan};
use mgn_ir::op::Op;

/// One copy inside the arena, in words: (from, to, length).
pub type WordCopy = (usize, usize, usize);

/// The copies that carry a plan's state writes over, in groups to run one after another
/// (empty when the plan writes no state or every write is the parameter itself). Scratch words
/// for staged sources are taken from `top` on (which moves past them).
pub fn state_copies(
    plan: &GpuPlan,
    offsets: &[usize],
    top: &mut usize,
) -> Result<Vec<Vec<WordCopy>>, String> {
    let mut copies: Vec<WordCopy> = Vec::new();
    for &(p, v) in &plan.state_writes {
        let n = crate::memory::value_words(plan.params[p].dtype, &plan.params[p].shape);
        let from = offsets[v as usize];
        // A parameter read by several `Param` steps has words in each: all of them change.
        for (i, s) in plan.steps.iter().enumerate() {
            if s.op != GpuOp::Plan(Op::Param { index: p }) || offsets[i] == from || n == 0 {
                continue;
            }
            let to = offsets[i];
            if from < to + n && to < from + n {
                return Err(format!(
                    "{} written into `{}` shares some of its words (an arena plan error)",
                    plan.step_name(v as usize),
                    plan.params[p].name
                ));
            }
            copies.push((from, to, n));
        }
    }
    let overwritten = |f: usize, n: usize| copies.iter().any(|&(_, t, m)| f < t + m && t < f + n);
    let mut staged: Vec<WordCopy> = Vec::new();
    let mut last = Vec::with_capacity(copies.len());
    for &(from, to, n) in &copies {
        if !overwritten(from, n) {
            last.push((from, to, n));
            continue;
        }
        let scratch = match staged.iter().find(|&&(f, _, m)| f == from && m == n) {
            Some(&(_, s, _)) => s,
            None => {
                *top += n;
                staged.push((from, *top - n, n));
                *top - n
            }
        };
        last.push((scratch, to, n));
    }
    Ok([staged, last].into_iter().filter(|g| !g.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::step;
    use mgn_ir::op::BinaryOp;
    use mgn_ir::plan::{InitSpec, Mode, ParamSpec, Plan};
    use mgn_ir::DType;

    fn state(name: &str) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            dtype: DType::F32,
            shape: vec![3],
            init: InitSpec::Constant(0.0),
            trainable: false,
            frozen: false,
            persistent: false,
        }
    }

    /// `a` and `b` read; `a + b` at step 2; the writes given.
    fn plan(writes: Vec<(usize, u32)>) -> GpuPlan {
        let f = DType::F32;
        let steps = vec![
            step(Op::Param { index: 0 }, vec![], f, &[3]),
            step(Op::Param { index: 1 }, vec![], f, &[3]),
            step(Op::Binary(BinaryOp::Add), vec![0, 1], f, &[3]),
        ];
        let p = Plan {
            params: vec![state("a"), state("b")],
            state_writes: writes,
            ..Plan::of_steps(Mode::Infer, steps, vec![], vec![("y".into(), 2)])
        };
        p.validate().expect("valid");
        GpuPlan::of(&p)
    }

    #[test]
    fn a_written_value_is_copied_and_the_parameter_itself_is_not() {
        let offsets = [0, 4, 8];
        let mut top = 12;
        let g = plan(vec![(0, 2), (1, 1)]);
        assert_eq!(state_copies(&g, &offsets, &mut top), Ok(vec![vec![(8, 0, 3)]]));
        assert_eq!(top, 12, "nothing staged");
        assert_eq!(state_copies(&plan(vec![(1, 1)]), &offsets, &mut top), Ok(vec![]));
    }

    #[test]
    fn swapped_buffers_go_through_scratch_words() {
        // a ← b and b ← a + b: b's old words are read by one copy and written by the other.
        let offsets = [0, 4, 8];
        let mut top = 12;
        let got = state_copies(&plan(vec![(0, 1), (1, 2)]), &offsets, &mut top);
        assert_eq!(got, Ok(vec![vec![(4, 12, 3)], vec![(12, 0, 3), (8, 4, 3)]]));
        assert_eq!(top, 15);
        // A full swap stages both.
        let g = plan(vec![(0, 1), (1, 0)]);
        let mut top = 12;
        let got = state_copies(&g, &offsets, &mut top).expect("plans");
        assert_eq!(got, vec![vec![(4, 12, 3), (0, 15, 3)], vec![(12, 0, 3), (15, 4, 3)]]);
    }

    #[test]
    fn written_values_keep_their_words_to_the_end_and_must_fit_their_parameter() {
        // w = a + b is written into `a` and read by nothing; three more values of its size
        // follow, each dead after the next reads it: none may take w's words.
        let f = DType::F32;
        let mut steps = vec![
            step(Op::Param { index: 0 }, vec![], f, &[3]),
            step(Op::Param { index: 1 }, vec![], f, &[3]),
            step(Op::Binary(BinaryOp::Add), vec![0, 1], f, &[3]),
        ];
        for k in 0..3 {
            let x = if k == 0 { 1 } else { 2 + k };
            steps.push(step(Op::Unary(mgn_ir::op::UnaryOp::Neg), vec![x], f, &[3]));
        }
        let p = Plan {
            params: vec![state("a"), state("b")],
            state_writes: vec![(0, 2)],
            loss_scaling: None,
            ..Plan::of_steps(Mode::Infer, steps, vec![], vec![("y".into(), 5)])
        };
        p.validate().expect("valid");
        let mut g = GpuPlan::of(&p);
        let layout = crate::memory::plan_arena(&g);
        crate::memory::check_arena(&g, &layout).expect("a valid arena");
        let w = layout.offsets[2];
        for later in 3..6 {
            let o = layout.offsets[later];
            assert!(o + 3 <= w || w + 4 <= o, "step {later} at {o} takes the written words {w}");
        }
        g.validate().expect("valid");
        g.state_writes = vec![(1, 1), (0, 2)];
        g.params[0].shape = vec![1, 3];
        let e = g.validate().expect_err("an f32[3] value cannot replace an f32[1, 3] parameter");
        assert!(e.contains("`a` is f32[1, 3], but step 2 written into it is f32[3]"), "{e}");
        g.state_writes = vec![(2, 0)];
        let e = g.validate().expect_err("there is no parameter 2");
        assert!(e.contains("names parameter 2, but there are 2"), "{e}");
    }

    #[test]
    fn a_state_nothing_reads_gets_words_of_its_own() {
        // Only `b` is read; `a` is written from `b + b`: the program gives `a` a `Param` step.
        let f = DType::F32;
        let steps = vec![
            step(Op::Param { index: 1 }, vec![], f, &[3]),
            step(Op::Binary(BinaryOp::Add), vec![0, 0], f, &[3]),
        ];
        let p = Plan {
            params: vec![state("a"), state("b")],
            state_writes: vec![(0, 1)],
            loss_scaling: None,
            ..Plan::of_steps(Mode::Infer, steps, vec![], vec![])
        };
        p.validate().expect("valid");
        let g = GpuPlan::of(&p);
        g.validate().expect("valid GPU plan");
        assert_eq!(g.steps[0].op, GpuOp::Plan(Op::Param { index: 0 }));
        assert_eq!(g.state_writes, vec![(0, 2)]);
        assert_eq!(g.step_name(0), "`param` made for step 1");
        let layout = crate::memory::plan_arena(&g);
        let mut top = layout.total_words;
        let copies = state_copies(&g, &layout.offsets, &mut top).expect("plans");
        assert_eq!(copies, vec![vec![(layout.offsets[2], layout.offsets[0], 3)]]);
    }
}
