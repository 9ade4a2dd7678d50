//! State a plan carries from one run to the next (`Plan::state_writes`: a KV cache, running
//! statistics): reading it, setting it, moving it to another session of the same model, and
//! resetting it to its initial value. On the GPU only these tensors cross the bus.

use super::*;

impl Session {
    /// The names of the tensors this plan writes for the next run, in the plan's order.
    pub fn state_names(&self) -> Vec<&str> {
        let params = &self.plan.params;
        self.plan.state_writes.iter().map(|&(p, _)| params[p].name.as_str()).collect()
    }

    fn state_indices(&self) -> Vec<usize> {
        self.plan.state_writes.iter().map(|&(p, _)| p).collect()
    }

    /// The current value of every state tensor, by name.
    pub fn state(&mut self) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        let which = self.state_indices();
        if let Some(g) = &mut self.gpu {
            for (&p, t) in which.iter().zip(g.read_params(&which)?) {
                if let Some(t) = t {
                    self.params[p] = t;
                }
            }
        }
        Ok(which
            .iter()
            .map(|&p| (self.plan.params[p].name.clone(), self.params[p].clone()))
            .collect())
    }

    /// Sets state tensors by name (a subset is fine): each must be one of this plan's state
    /// tensors, of its dtype and shape.
    pub fn set_state(&mut self, values: &[(String, Tensor)]) -> Result<(), RuntimeError> {
        let which = self.state_indices();
        let mut at = Vec::with_capacity(values.len());
        for (name, t) in values {
            let p = (which.iter().copied())
                .find(|&p| self.plan.params[p].name == *name)
                .ok_or_else(|| {
                    RuntimeError::Failed(format!(
                        "`{name}` is not state of `{}` (its state: {})",
                        self.plan.model,
                        self.state_names().join(", ")
                    ))
                })?;
            let spec = &self.plan.params[p];
            if t.dtype != spec.dtype || t.shape != spec.shape {
                return Err(RuntimeError::Failed(format!(
                    "state `{name}` is {}{:?}, but the value given is {}{:?}",
                    spec.dtype, spec.shape, t.dtype, t.shape
                )));
            }
            at.push((p, t));
        }
        if let Some(g) = &mut self.gpu {
            g.write_params(&at)?;
        }
        for (p, t) in at {
            self.params[p] = t.clone();
        }
        Ok(())
    }

    /// Copies this session's state into `other`, a session of the same model (a prefill plan
    /// and a decode plan share their KV cache this way).
    pub fn copy_state_to(&mut self, other: &mut Session) -> Result<(), RuntimeError> {
        let state = self.state()?;
        other.set_state(&state)
    }

    /// Puts every state tensor back to its initial value (zeros for a KV cache).
    pub fn reset_state(&mut self) -> Result<(), RuntimeError> {
        let fresh = (self.state_indices().into_iter())
            .map(|p| {
                let spec = &self.plan.params[p];
                let t = crate::init::try_initialize(spec, self.seed, p);
                t.map(|t| (spec.name.clone(), t)).map_err(RuntimeError::Failed)
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.set_state(&fresh)
    }
}
