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

/// The state parameter that step `i` may write in place: a `SliceScatter` into the parameter
/// (a KV cache taking a token's rows) whose value is the parameter's next one, the last step to
/// read the old value. Every step that reads the old value runs before it, so writing the rows
/// into the parameter itself computes what the plan says without copying the whole cache.
pub(super) fn in_place(plan: &Plan, last_use: &[usize], i: usize) -> Option<usize> {
    let step = &plan.steps[i];
    let (Op::SliceScatter { .. }, [x, src, start]) = (&step.op, &step.inputs[..]) else {
        return None;
    };
    let Op::Param { index: p } = plan.steps[*x as usize].op else { return None };
    let replaces = plan.state_writes.contains(&(p, i as u32));
    let alone = last_use[*x as usize] == i && src != x && start != x;
    (replaces && alone).then_some(p)
}

/// Runs step `SliceScatter { axis }` of state parameter `p` in place (see [`in_place`]): `src`
/// and `start` are the step's other operands. On an error the state is unchanged.
pub(super) fn write_in_place(
    params: &mut [Tensor],
    p: usize,
    axis: usize,
    [src, start]: [u32; 2],
    slots: &[Slot],
    inputs: &[(&str, &Tensor)],
) -> Result<(), cpu::KernelError> {
    // Out of the list while written, so that its operands may be other parameters.
    let empty = Tensor { dtype: params[p].dtype, shape: vec![], data: Data::F32(vec![]) };
    let mut x = std::mem::replace(&mut params[p], empty);
    let (src, start) = (get(slots, src, params, inputs), get(slots, start, params, inputs));
    let done = cpu::slice_scatter_in_place(&mut x, src, start, axis);
    params[p] = x;
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::op::{ReduceOp, UnaryOp};
    use mgn_ir::plan::{InitSpec, ParamSpec, SourceLoc, Step};
    use mgn_ir::DType;

    fn step(op: Op, inputs: Vec<u32>, dtype: DType, shape: &[usize]) -> Step {
        Step { op, inputs, dtype, shape: shape.to_vec(), loc: SourceLoc::default() }
    }

    /// A cache `c: [4, 2]` (state, zeros) taking `new: [1, 2]` at `pos`; the output is the sum
    /// of the new cache, and with `late` also the old cache negated by a step after the write.
    fn plan(late: bool) -> Plan {
        let (f, i) = (DType::F32, DType::I32);
        let mut steps = vec![
            step(Op::Input { name: "new".into() }, vec![], f, &[1, 2]),
            step(Op::Input { name: "pos".into() }, vec![], i, &[]),
            step(Op::Param { index: 0 }, vec![], f, &[4, 2]),
            step(Op::SliceScatter { axis: 0 }, vec![2, 0, 1], f, &[4, 2]),
            step(
                Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdim: false },
                vec![3],
                f,
                &[],
            ),
        ];
        let mut outputs = vec![("sum".to_string(), 4)];
        if late {
            steps.push(step(Op::Unary(UnaryOp::Neg), vec![2], f, &[4, 2]));
            outputs.push(("old".into(), 5));
        }
        let inputs = vec![("new".to_string(), 0), ("pos".to_string(), 1)];
        let cache = ParamSpec {
            name: "c".into(),
            dtype: f,
            shape: vec![4, 2],
            init: InitSpec::Constant(0.0),
            trainable: false,
            frozen: true,
            persistent: false,
        };
        Plan {
            params: vec![cache],
            state_writes: vec![(0, 3)],
            ..Plan::of_steps(Mode::Infer, steps, inputs, outputs)
        }
    }

    #[test]
    fn a_cache_is_written_in_place_only_when_no_later_step_reads_the_old_one() {
        let (fast, slow) = (plan(false), plan(true));
        let (lu_fast, lu_slow) = (
            mgn_ir::analysis::DefUse::of(&fast).last_uses(),
            mgn_ir::analysis::DefUse::of(&slow).last_uses(),
        );
        assert_eq!(in_place(&fast, &lu_fast, 3), Some(0));
        assert_eq!(in_place(&slow, &lu_slow, 3), None);
        let mut a = Session::try_new(fast, 1).unwrap();
        let mut b = Session::try_new(slow, 1).unwrap();
        for (t, pos) in [(1.0, 0), (2.0, 1), (3.0, 1), (4.0, 7)] {
            let new = Tensor::f32(vec![1, 2], vec![t, 10.0 * t]);
            let pos = Tensor::i32(vec![], vec![pos]);
            let inputs = [("new", &new), ("pos", &pos)];
            let (ra, rb) = (a.run(&inputs).unwrap(), b.run(&inputs).unwrap());
            assert_eq!(ra.outputs[0], rb.outputs[0]);
            assert_eq!(a.params, b.params);
        }
        // Rows 0, 1 (3 over 2) and 3 (7 clamped); b's old cache was read after the write.
        let want = vec![1.0, 10.0, 3.0, 30.0, 0.0, 0.0, 4.0, 40.0];
        assert_eq!(a.params[0], Tensor::f32(vec![4, 2], want));
        let pos = Tensor::i32(vec![], vec![2]);
        let new = Tensor::f32(vec![1, 2], vec![5.0, 6.0]);
        let old = b.run(&[("new", &new), ("pos", &pos)]).unwrap().outputs[1].1.to_f64_vec();
        assert_eq!(old, [-1.0, -10.0, -3.0, -30.0, -0.0, -0.0, -4.0, -40.0]);
    }
}
