//! A dynamic plan's runs at sizes other than the last run's (`crate::dynamic`): the program at
//! the new sizes, its dispatches (their grids, and the sizes in every parameter block) and
//! batch norm's running-statistics updates. Kernels shared across sizes are compiled once;
//! the few that print a size as a number are compiled at the first run of each size. The
//! arena, its offsets and the dependency levels are the bound's for every size.

use super::*;
use crate::dynamic::DynamicProgram;

/// How many sizes' dispatches a session keeps besides the current one: enough for the batches
/// of a corpus sorted by length (each batch its own size) to find theirs on the next pass.
/// Measured on the H200: making one costs about 5 ms for MiniLM (the program at the sizes, every
/// step's kernel source and grid), and with 8 kept, 32 batches of a corpus paid it every pass.
const KEEP: usize = 64;

pub(super) struct Sizing {
    program: DynamicProgram,
    /// The program at the bound (the session's `plan` is at `current`).
    bound: GpuPlan,
    current: Vec<usize>,
    /// Other sizes' runs, most recently used last.
    kept: Vec<(Vec<usize>, SizedRun)>,
}

/// What a run at one set of sizes needs that the bound's does not give.
struct SizedRun {
    plan: GpuPlan,
    dispatch: Vec<Option<StepDispatch>>,
    bn: Vec<(usize, Params, [u32; 3])>,
}

impl Sizing {
    pub(super) fn new(program: DynamicProgram, bound: GpuPlan) -> Sizing {
        let current = program.bound();
        Sizing { program, bound, current, kept: Vec::new() }
    }
}

impl GpuSession {
    /// Makes the session's plan and dispatches those of the sizes `inputs` have (nothing for a
    /// static plan, or inputs lacking one: `submit` names it).
    pub(super) fn resize(&mut self, inputs: &[(&str, &Tensor)]) -> Result<(), GpuError> {
        let Some(sizing) = &self.sizing else { return Ok(()) };
        let given = |name: &str| inputs.iter().any(|(n, _)| *n == name);
        if !self.plan.inputs.iter().all(|(name, _)| given(name)) {
            return Ok(());
        }
        let sizes = sizing.program.sizes_of(inputs)?;
        if sizes == sizing.current {
            return Ok(());
        }
        let kept = sizing.kept.iter().position(|(s, _)| *s == sizes);
        let next = match kept {
            Some(k) => self.sizing.as_mut().expect("dynamic").kept.remove(k).1,
            None => self.sized_run(&sizes)?,
        };
        let bn = match &mut self.train {
            Some(t) => std::mem::replace(&mut t.bn, next.bn),
            None => Vec::new(),
        };
        let previous = SizedRun {
            plan: std::mem::replace(&mut self.plan, next.plan),
            dispatch: std::mem::replace(&mut self.dispatch, next.dispatch),
            bn,
        };
        let sizing = self.sizing.as_mut().expect("dynamic");
        let old = std::mem::replace(&mut sizing.current, sizes);
        if sizing.kept.len() == KEEP {
            sizing.kept.remove(0);
        }
        sizing.kept.push((old, previous));
        Ok(())
    }

    /// The program, dispatches and running-statistics updates at `sizes`, compiling the
    /// kernels no earlier size had.
    fn sized_run(&mut self, sizes: &[usize]) -> Result<SizedRun, GpuError> {
        let sizing = self.sizing.as_ref().expect("dynamic");
        let plan = sizing.program.at(&sizing.bound, sizes)?;
        let follows = |v: usize| sizing.program.dims(v, plan.steps[v].shape.len());
        let limits = &self.dev.limits;
        let dispatch = step_dispatches(
            &plan,
            &self.offsets,
            limits,
            &mut self.sources,
            &follows,
            sizes,
            None,
        )?;
        let bn = match self.train {
            Some(_) => running_stats_updates(&plan, &self.offsets, &self.levels, limits)?,
            None => Vec::new(),
        };
        let fresh = self.sources.compile(&mut self.dev, self.kernels.len())?;
        self.kernels.extend(fresh);
        Ok(SizedRun { plan, dispatch, bn })
    }
}
