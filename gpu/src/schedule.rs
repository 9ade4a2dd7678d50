//! The order a plan's dispatches run in on the GPU: grouped into levels, a memory barrier only
//! between levels, so dispatches that do not depend on each other run back to back.
//!
//! A step must run after (a) the steps it reads (read after write) and, because the memory plan
//! reuses arena words once a value is dead, after (b) every earlier step whose region overlaps
//! its own (write after write) and (c) every reader of such a step (write after read). Its level
//! is one more than the latest of those. Plans are in topological order, so one sweep does.
//! The checker finds each value's readers with `mgn_ir::analysis::DefUse`.

use crate::program::{GpuOp, GpuPlan};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;
use mgn_ir::plan::Mode;

/// Levels of a plan's dispatches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    /// Per step: its level (`None` for inputs and parameters, which are uploaded, not computed).
    pub step: Vec<Option<usize>>,
    /// Per step: for a training plan's batch norm, the level of its running-statistics update,
    /// which reads the batch the step normalized and so must run before those words are reused.
    pub bn_update: Vec<Option<usize>>,
    /// Number of levels (the last dispatch's level + 1; 0 for a plan with nothing to compute).
    pub count: usize,
}

/// `offsets` and `words` give each value's arena region (in 32-bit words).
pub fn levels(plan: &GpuPlan, offsets: &[usize], words: &[usize]) -> Levels {
    let n = plan.steps.len();
    // A view (memory::view_roots) is not dispatched: reading it is reading its root.
    let root = crate::memory::view_roots(plan);
    let mut step: Vec<Option<usize>> = vec![None; n];
    let mut bn_update = vec![None; n];
    // The latest level at which each value is read (by a step or a running-statistics update).
    let mut read_at: Vec<Option<usize>> = vec![None; n];
    // Computed values so far, for the overlap checks.
    let mut written: Vec<usize> = Vec::new();
    let mut count = 0;
    let after = |l: Option<usize>| l.map_or(0, |l| l + 1);
    for (i, s) in plan.steps.iter().enumerate() {
        if matches!(s.op, GpuOp::Plan(Op::Input { .. } | Op::Param { .. })) || root[i] != i {
            continue;
        }
        let mut level = 0;
        for &x in &s.inputs {
            level = level.max(after(step[root[x as usize]]));
        }
        let (lo, hi) = (offsets[i], offsets[i] + words[i]);
        for &v in &written {
            if offsets[v] < hi && lo < offsets[v] + words[v] {
                level = level.max(after(step[v])).max(after(read_at[v]));
            }
        }
        step[i] = Some(level);
        for &x in &s.inputs {
            let r = &mut read_at[root[x as usize]];
            *r = Some(r.map_or(level, |r| r.max(level)));
        }
        if plan.mode == Mode::Train && s.op.updates_running_stats().is_some() {
            // After the normalization itself (which reads the running statistics it updates).
            let u = level + 1;
            bn_update[i] = Some(u);
            for &x in &s.inputs {
                let r = &mut read_at[root[x as usize]];
                *r = Some(r.map_or(u, |r| r.max(u)));
            }
            count = count.max(u + 1);
        }
        written.push(i);
        count = count.max(level + 1);
    }
    Levels { step, bn_update, count }
}

/// Checks that `l` keeps every ordering the plan needs (reads after writes; reuse of words after
/// the previous owner and all of its readers). For tests over whole models.
pub fn check(plan: &GpuPlan, offsets: &[usize], words: &[usize], l: &Levels) -> Result<(), String> {
    let n = plan.steps.len();
    let root = crate::memory::view_roots(plan);
    let def_use = DefUse::of(plan);
    // Per value: the dispatches reading it or a view of it, each with the level of the read
    // (and again at its running-statistics update, which reads the same inputs).
    let mut readers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
    for (v, of_v) in def_use.readers.iter().enumerate() {
        let x = root[v];
        for &i in of_v {
            let i = i as usize;
            let Some(li) = l.step[i] else { continue };
            if let Some(lx) = l.step[x] {
                if lx >= li {
                    return Err(format!("step {i} (level {li}) reads step {x} (level {lx})"));
                }
            }
            readers[x].push((i, li));
            if let Some(u) = l.bn_update[i] {
                readers[x].push((i, u));
            }
        }
    }
    let computed: Vec<usize> = (0..n).filter(|&i| l.step[i].is_some()).collect();
    for (k, &b) in computed.iter().enumerate() {
        let lb = l.step[b].expect("computed");
        for &a in &computed[..k] {
            if offsets[a] < offsets[b] + words[b] && offsets[b] < offsets[a] + words[a] {
                let la = l.step[a].expect("computed");
                if la >= lb {
                    return Err(format!(
                        "step {b} (level {lb}) reuses the words of step {a} (level {la})"
                    ));
                }
                if let Some(&(r, lr)) = readers[a].iter().find(|&&(r, lr)| r < b && lr >= lb) {
                    return Err(format!(
                        "step {b} (level {lb}) reuses the words of step {a}, which step {r} \
                         still reads at level {lr}"
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::op::{BinaryOp, UnaryOp};
    use mgn_ir::plan::{Plan, SourceLoc, Step};
    use mgn_ir::DType;

    fn plan(steps: Vec<(Op, Vec<u32>)>) -> GpuPlan {
        let steps: Vec<Step> = steps
            .into_iter()
            .map(|(op, inputs)| Step {
                op,
                inputs,
                dtype: DType::F32,
                shape: vec![4],
                loc: SourceLoc::default(),
            })
            .collect();
        let last = steps.len() as u32 - 1;
        let outputs = vec![("y".into(), last)];
        GpuPlan::of(&Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], outputs))
    }

    #[test]
    fn independent_steps_share_a_level_and_dependent_ones_follow() {
        let p = plan(vec![
            (Op::Input { name: "x".into() }, vec![]),
            (Op::Unary(UnaryOp::Relu), vec![0]),
            (Op::Unary(UnaryOp::Neg), vec![0]),
            (Op::Binary(BinaryOp::Add), vec![1, 2]),
        ]);
        let offsets = [0, 4, 8, 12];
        let l = levels(&p, &offsets, &[4; 4]);
        assert_eq!(l.step, vec![None, Some(0), Some(0), Some(1)]);
        assert_eq!(l.count, 2);
    }

    /// x → a = relu(x) → b = neg(a); c = exp(x); y = b + c: with c placed on a's words, c must
    /// wait for b, a's last reader.
    fn reuse_plan() -> GpuPlan {
        plan(vec![
            (Op::Input { name: "x".into() }, vec![]),
            (Op::Unary(UnaryOp::Relu), vec![0]),
            (Op::Unary(UnaryOp::Neg), vec![1]),
            (Op::Unary(UnaryOp::Exp), vec![0]),
            (Op::Binary(BinaryOp::Add), vec![2, 3]),
        ])
    }

    #[test]
    fn reusing_a_dead_values_words_waits_for_its_readers() {
        // Step 3 reuses step 1's words (step 1 is dead after step 2 read it): it must come after
        // step 2 even though it only reads the input.
        let p = reuse_plan();
        let offsets = [0, 4, 8, 4, 12];
        let l = levels(&p, &offsets, &[4; 5]);
        assert_eq!(l.step, vec![None, Some(0), Some(1), Some(2), Some(3)]);
        // Without the reuse, step 3 could run first.
        let l = levels(&p, &[0, 4, 8, 16, 12], &[4; 5]);
        assert_eq!(l.step[3], Some(0));
    }

    #[test]
    fn the_checker_catches_a_reordered_reuse() {
        let p = reuse_plan();
        let (offsets, words) = ([0, 4, 8, 4, 12], [4; 5]);
        let mut l = levels(&p, &offsets, &words);
        check(&p, &offsets, &words, &l).expect("valid");
        l.step[3] = Some(1); // alongside step 2, which still reads the words step 3 overwrites
        assert!(check(&p, &offsets, &words, &l).unwrap_err().contains("step 3"));
    }
}
