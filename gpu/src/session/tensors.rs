//! Reading and writing chosen parameters without touching the rest: what moving a KV cache
//! between a prefill and a decode session, or resetting it, needs — a few megabytes, where
//! `params` / `set_params` would move every weight of the model.

use super::*;

impl GpuSession {
    /// The arena positions of the steps that hold parameter `index` (none when no step reads
    /// it: the device never holds it).
    fn holders(&self, index: usize) -> Vec<usize> {
        (self.plan.steps.iter().enumerate())
            .filter(|(_, s)| matches!(s.op, GpuOp::Plan(Op::Param { index: i }) if i == index))
            .map(|(at, _)| at)
            .collect()
    }

    /// The current values of parameters `which` (by plan index), `None` for one the plan
    /// never reads; of the parameter's type (one an inference plan holds as halves comes back
    /// with those values).
    pub fn read_params(&mut self, which: &[usize]) -> Result<Vec<Option<Tensor>>, GpuError> {
        let first: Vec<Option<usize>> =
            which.iter().map(|&p| self.holders(p).first().copied()).collect();
        let steps: Vec<u32> = first.iter().flatten().map(|&at| at as u32).collect();
        let mut got = self.read(&steps)?.into_iter();
        let typed = |p: usize, t: Tensor| Tensor { dtype: self.plan.params[p].dtype, ..t };
        Ok((which.iter().zip(&first))
            .map(|(&p, f)| f.and_then(|_| got.next()).map(|t| typed(p, t)))
            .collect())
    }

    /// Writes `values` (plan index, tensor of the parameter's type) into the arena.
    pub fn write_params(&mut self, values: &[(usize, &Tensor)]) -> Result<(), GpuError> {
        let mut data = Vec::new();
        for &(p, t) in values {
            for at in self.holders(p) {
                data.push((self.offsets[at], words_of(t, self.plan.steps[at].dtype)));
            }
        }
        let job = Submission {
            uploads: data.iter().map(|(o, d)| (*o, &d[..])).collect(),
            ..Default::default()
        };
        let r = self.dev.submit(self.arena.as_ref().expect("arena"), &job);
        r.map(drop).map_err(err)
    }
}
