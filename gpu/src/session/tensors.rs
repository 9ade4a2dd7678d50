//! Reading values back, and reading and writing chosen parameters without touching the rest:
//! what moving a KV cache between a prefill and a decode session, or resetting it, needs — a
//! few megabytes, where `params` / `set_params` would move every weight of the model.

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

    /// Reads back every parameter the plan reads (for checkpoints): `None` for the others,
    /// which the device never holds and so never changes.
    pub fn params(&mut self) -> Result<Vec<Option<Tensor>>, GpuError> {
        let mut out: Vec<Option<Tensor>> = vec![None; self.plan.params.len()];
        let mut wanted = Vec::new();
        for (i, s) in self.plan.steps.iter().enumerate() {
            if let GpuOp::Plan(Op::Param { index }) = s.op {
                wanted.push((index, i));
            }
        }
        let got = self.read(&wanted.iter().map(|&(_, i)| i as u32).collect::<Vec<_>>())?;
        for ((index, _), t) in wanted.into_iter().zip(got) {
            // Of the parameter's type, also where the arena holds it as halves.
            out[index] = Some(Tensor { dtype: self.plan.params[index].dtype, ..t });
        }
        Ok(out)
    }

    /// The position of the step holding a loss-scaled plan's scale.
    pub(super) fn loss_scale_position(&self) -> Option<u32> {
        let ls = self.plan.loss_scaling.as_ref()?;
        let param = GpuOp::Plan(Op::Param { index: ls.param });
        self.plan.steps.iter().position(|s| s.op == param).map(|p| p as u32)
    }

    /// Where value `v` is, as a download: its first word and its words.
    pub(super) fn download(&self, v: u32) -> (usize, usize) {
        let s = &self.plan.steps[v as usize];
        (self.offsets[v as usize], crate::memory::value_words(s.dtype, &s.shape))
    }

    /// Reads the values of `steps` back in one submission.
    fn read(&mut self, steps: &[u32]) -> Result<Vec<Tensor>, GpuError> {
        let downloads: Vec<(usize, usize)> = steps.iter().map(|&v| self.download(v)).collect();
        let r = self.dev.submit(
            self.arena.as_ref().expect("arena"),
            &Submission { downloads, ..Default::default() },
        );
        Ok(self.values_of(steps, r.map_err(err)?))
    }

    /// The values of `steps` from their downloaded words.
    pub(super) fn values_of(&self, steps: &[u32], words: Vec<Vec<u32>>) -> Vec<Tensor> {
        let value = |(&v, w): (&u32, Vec<u32>)| {
            let s = &self.plan.steps[v as usize];
            tensor_of(w, s.dtype, s.shape.clone())
        };
        steps.iter().zip(words).map(value).collect()
    }

    /// The current value of step `v` of the plan the session was given (after the last run).
    pub fn value(&mut self, v: u32) -> Result<Tensor, GpuError> {
        let at = (self.plan.position(crate::program::StepId(v)))
            .ok_or_else(|| GpuError::Failed(format!("the plan has no step {v}")))?;
        Ok(self.read(&[at as u32])?.remove(0))
    }
}
