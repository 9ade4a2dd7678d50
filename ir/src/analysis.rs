//! Def-use over a list of steps, computed once and shared: who reads each value, which values
//! are results, where each value dies. The compiler's lowering, the runtime's session, and the
//! GPU backend's memory plan, fusion and schedule all ask these questions; they ask them here.
//!
//! Anything shaped like a plan — steps numbered `0..n` whose inputs name earlier steps, plus a
//! set of results that live to the end — implements [`Dataflow`].

use crate::plan::Plan;

/// Steps numbered `0..len()` reading earlier steps, and the values that must survive the run.
pub trait Dataflow {
    fn len(&self) -> usize;
    fn inputs(&self, step: usize) -> impl Iterator<Item = u32> + '_;
    /// Values read after the run (outputs, loss, gradients), in any order, repeats allowed.
    fn results(&self) -> Vec<u32>;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Dataflow for Plan {
    fn len(&self) -> usize {
        self.steps.len()
    }

    fn inputs(&self, step: usize) -> impl Iterator<Item = u32> + '_ {
        self.steps[step].inputs.iter().copied()
    }

    fn results(&self) -> Vec<u32> {
        let outputs = self.outputs.iter().map(|(_, v)| *v);
        let written = self.state_writes.iter().map(|(_, v)| *v);
        outputs.chain(self.loss).chain(self.grads.iter().map(|(_, v)| *v)).chain(written).collect()
    }
}

/// For every value: the distinct steps that read it (in increasing order) and whether it is a
/// result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefUse {
    pub readers: Vec<Vec<u32>>,
    pub result: Vec<bool>,
}

impl DefUse {
    /// The analysis of `flow`. References past the end (in a plan not yet validated) are
    /// ignored rather than a panic.
    pub fn of(flow: &impl Dataflow) -> DefUse {
        let n = flow.len();
        let mut readers: Vec<Vec<u32>> = vec![Vec::new(); n];
        for i in 0..n {
            for x in flow.inputs(i) {
                if let Some(r) = readers.get_mut(x as usize) {
                    if r.last() != Some(&(i as u32)) {
                        r.push(i as u32);
                    }
                }
            }
        }
        let mut result = vec![false; n];
        for v in flow.results() {
            if let Some(r) = result.get_mut(v as usize) {
                *r = true;
            }
        }
        DefUse { readers, result }
    }

    /// The step after which `v` may be freed: its last reader; `None` for a result (it lives
    /// to the end) or a value nothing reads.
    pub fn last_use(&self, v: usize) -> Option<usize> {
        if self.result[v] {
            return None;
        }
        self.readers[v].last().map(|&r| r as usize)
    }

    /// For each value, the last step that reads it; `usize::MAX` for results (never freed),
    /// 0 for a value nothing reads (freed at once, kept by those who keep such values).
    pub fn last_uses(&self) -> Vec<usize> {
        (0..self.readers.len())
            .map(|v| match (self.result[v], self.readers[v].last()) {
                (true, _) => usize::MAX,
                (false, Some(&r)) => r as usize,
                (false, None) => 0,
            })
            .collect()
    }

    /// The one step that reads `v`, when exactly one does and `v` is not also a result.
    pub fn only_reader(&self, v: usize) -> Option<usize> {
        match self.readers[v].as_slice() {
            [r] if !self.result[v] => Some(*r as usize),
            _ => None,
        }
    }
}

/// Which steps the results need, transitively (a backward sweep): what lowering keeps.
pub fn needed(flow: &impl Dataflow, roots: impl IntoIterator<Item = u32>) -> Vec<bool> {
    let mut live = vec![false; flow.len()];
    for r in roots {
        if let Some(l) = live.get_mut(r as usize) {
            *l = true;
        }
    }
    for i in (0..flow.len()).rev() {
        if live[i] {
            for x in flow.inputs(i) {
                if let Some(l) = live.get_mut(x as usize) {
                    *l = true;
                }
            }
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Steps(Vec<Vec<u32>>, Vec<u32>);

    impl Dataflow for Steps {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn inputs(&self, step: usize) -> impl Iterator<Item = u32> + '_ {
            self.0[step].iter().copied()
        }
        fn results(&self) -> Vec<u32> {
            self.1.clone()
        }
    }

    #[test]
    fn readers_results_and_last_uses() {
        // 0, 1 inputs; 2 = 0 + 1; 3 = 2 * 2; 4 = 2 + 3 (the result); 5 reads nothing useful.
        let s = Steps(vec![vec![], vec![], vec![0, 1], vec![2, 2], vec![2, 3], vec![0]], vec![4]);
        let d = DefUse::of(&s);
        assert_eq!(d.readers[2], vec![3, 4], "a step reading a value twice counts once");
        assert_eq!(d.last_uses(), vec![5, 2, 4, 4, usize::MAX, 0]);
        assert_eq!((d.last_use(4), d.last_use(5), d.last_use(1)), (None, None, Some(2)));
        assert_eq!(
            (d.only_reader(3), d.only_reader(2), d.only_reader(1)),
            (Some(4), None, Some(2))
        );
        assert_eq!(needed(&s, [4]), vec![true, true, true, true, true, false]);
    }

    #[test]
    fn references_past_the_end_are_ignored() {
        let d = DefUse::of(&Steps(vec![vec![], vec![7]], vec![9]));
        assert_eq!(d.readers, vec![Vec::<u32>::new(), vec![]]);
    }
}
