//! Checking a run's inputs against the plan: every one given, of the plan's shape, and stored
//! as its dtype's kind.

use super::*;

impl Session {
    /// Every input of `plan` is among `inputs`, or an error names the first one missing.
    pub(super) fn check_given(plan: &Plan, inputs: &[(&str, &Tensor)]) -> Result<(), RuntimeError> {
        match plan.inputs.iter().find(|(name, _)| !inputs.iter().any(|(n, _)| n == name)) {
            Some((name, _)) => {
                let given: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
                Err(RuntimeError::Failed(format!(
                    "missing input `{name}` (given: {})",
                    if given.is_empty() { "none".into() } else { given.join(", ") }
                )))
            }
            None => Ok(()),
        }
    }

    /// Each input step's position in `inputs`, after checking that every input is given, of
    /// `plan`'s shape (the plan at the run's sizes) and a storage type of its dtype.
    pub(super) fn check_inputs(
        plan: &Plan,
        inputs: &[(&str, &Tensor)],
    ) -> Result<Vec<Option<usize>>, RuntimeError> {
        Session::check_given(plan, inputs)?;
        let mut which = vec![None; plan.steps.len()];
        for (name, step) in &plan.inputs {
            let pos = inputs.iter().position(|(n, _)| n == name).expect("checked above");
            let want = &plan.steps[*step as usize];
            let t = inputs[pos].1;
            if t.shape != want.shape {
                return Err(RuntimeError::Failed(format!(
                    "input `{name}` has shape {:?}, but the plan was built for {:?}",
                    t.shape, want.shape
                )));
            }
            let storage_ok = match &t.data {
                Data::F32(_) | Data::F64(_) => want.dtype.is_float(),
                Data::I32(_) => !want.dtype.is_float(),
                Data::Packed(_) => false, // inputs are never packed; parameters may be
            };
            if !storage_ok {
                let (got, want) = (t.dtype, want.dtype);
                let e = format!("input `{name}` holds {got} values, but the plan expects {want}");
                return Err(RuntimeError::Failed(e));
            }
            which[*step as usize] = Some(pos);
        }
        Ok(which)
    }
}
