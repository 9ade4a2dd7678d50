//! Each step's dispatch — its kernel, grid and parameter block — and the distinct kernel
//! sources a session compiles.

use super::choices::{self, Chosen};
use crate::device::{GpuDevice, Kernel, Params};
use crate::kernels::{generate, step_operands, KernelSource, Operand, Target};
use crate::limits::{fold_grid, DeviceLimits};
use crate::program::{GpuOp, GpuPlan};
use crate::session::family;
use crate::GpuError;
use mgn_ir::op::Op;
use mgn_ir::plan::Mode;
use std::collections::HashMap;

/// A step's kernel (index into `kernels`), grid, parameter block (its operands' offsets), and
/// for dropout the id whose per-run mask key goes in words 0 and 1.
pub(super) struct StepDispatch {
    pub kernel: usize,
    pub groups: [u32; 3],
    pub params: Params,
    pub dropout_node: Option<u32>,
}

/// Distinct kernel sources (name, body, where they come from) in first-use order: steps of the
/// same shapes share one, and all are compiled together at the end, in parallel.
#[derive(Default)]
pub(super) struct Sources {
    pub(super) list: Vec<(String, String, String)>,
    index: HashMap<String, usize>,
}

impl Sources {
    /// The index of the kernel with this body, added when new.
    pub(super) fn add(&mut self, name: &str, body: String, at: &dyn std::fmt::Display) -> usize {
        if let Some(&k) = self.index.get(&body) {
            return k;
        }
        self.list.push((name.to_string(), body.clone(), at.to_string()));
        self.index.insert(body, self.list.len() - 1);
        self.list.len() - 1
    }

    /// Every kernel from the `from`-th on compiled, or the first error with where its kernel
    /// came from.
    pub(super) fn compile(
        &self,
        dev: &mut GpuDevice,
        from: usize,
    ) -> Result<Vec<Kernel>, GpuError> {
        self.check(dev.kernels(&self.named(from)), from)
    }

    /// The `(name, body)` of every kernel from the `from`-th on.
    pub(super) fn named(&self, from: usize) -> Vec<(String, String)> {
        self.list[from..].iter().map(|(n, b, _)| (n.clone(), b.clone())).collect()
    }

    /// The kernels from the `from`-th on as compiled, or the first error with where its kernel
    /// came from.
    pub(super) fn check(
        &self,
        compiled: Vec<Result<Kernel, String>>,
        from: usize,
    ) -> Result<Vec<Kernel>, GpuError> {
        compiled
            .into_iter()
            .zip(&self.list[from..])
            .map(|(k, (_, _, at))| k.map_err(|e| GpuError::Failed(format!("{e} (at {at})"))))
            .collect()
    }
}

/// Each step's dispatch (`None` for inputs, parameters and views): its kernel, grid and
/// parameter block. A step without a kernel is an error naming its op and model line. For a
/// dynamic plan, `follows` gives a step's axes' polynomials and `sizes` are the run's, which
/// every parameter block carries (`kernels::SIZE_WORD`). With `choosing`, a convolution or a
/// product that both the tiled kernel and the tiles can run takes the kernel its verdict
/// keeps, or, with none yet, the default's and becomes a contender to measure (`choices`).
pub(super) fn step_dispatches(
    plan: &GpuPlan,
    offsets: &[usize],
    limits: &DeviceLimits,
    sources: &mut Sources,
    follows: &dyn Fn(usize) -> Vec<Option<mgn_ir::dynamic::Poly>>,
    sizes: &[usize],
    mut choosing: Option<&mut choices::Choosing>,
) -> Result<Vec<Option<StepDispatch>>, GpuError> {
    let target = Target::of(limits);
    let root = crate::memory::view_roots(plan);
    let views = crate::memory::ReadViews::of(plan);
    let mut dispatch = Vec::with_capacity(plan.steps.len());
    for (i, s) in plan.steps.iter().enumerate() {
        // Views (reshapes, identity dropout) share their input's words: nothing to run.
        if matches!(s.op, GpuOp::Plan(Op::Input { .. } | Op::Param { .. })) || root[i] != i {
            dispatch.push(None);
            continue;
        }
        let at = format!("{}, {}", s.loc, plan.step_name(i));
        let failed = |e: String| GpuError::Failed(format!("{e} (at {at})"));
        let (inputs, output, words) = step_operands(plan, offsets, &views, i, follows);
        let training = plan.mode == Mode::Train;
        let made = |target| generate(&s.op, plan.ids[i], &inputs, &output, target, training);
        let mut src = made(target).map_err(failed)?;
        let family = family(&s.op.describe()).to_string();
        let mut contender = None;
        let other = choosing.as_deref_mut().zip(other_target(&family, &inputs, target));
        if let Some((c, (default, other))) = other {
            let other = made(other).map_err(failed)?;
            if other.body != src.body {
                let (tiled, tiles) = match default {
                    Chosen::Tiled => (&src.body, &other.body),
                    Chosen::Tiles => (&other.body, &src.body),
                };
                let key = c.key(tiled, tiles);
                match c.verdict(key).map(|v| v.chosen) {
                    Some(kept) => {
                        c.known += 1;
                        if kept != default {
                            src = other;
                        }
                    }
                    None => contender = Some((key, default, other)),
                }
            }
        }
        let mut dispatch_of = |src: KernelSource| -> Result<_, GpuError> {
            let kernel = sources.add(&format!("step{i}"), src.body, &format!("{at}, {family}"));
            let group_width = src.width.unwrap_or(target.width) as u64;
            let groups = fold_grid(src.invocations.div_ceil(group_width), limits)
                .map_err(|e| failed(e.to_string()))?;
            let mut params = [0u32; 32];
            for &(w, v) in &words {
                params[w] = v;
            }
            for (j, &n) in sizes.iter().enumerate() {
                params[crate::kernels::SIZE_WORD + j] = n as u32;
            }
            // The mask key is the dropout step's id: its number in the given plan, as on the
            // CPU.
            let dropout_node = src.dropout_node;
            Ok(StepDispatch { kernel, groups, params, dropout_node })
        };
        dispatch.push(Some(dispatch_of(src)?));
        if let (Some(c), Some((key, default, other))) = (choosing.as_deref_mut(), contender) {
            let other = dispatch_of(other)?;
            c.contenders.push(choices::Contender { step: i, key, default, other });
        }
    }
    Ok(dispatch)
}

/// Which kernel a step of `family` takes by default and the target that gives it the other,
/// when both the tiled kernel and the tiles can run it (`choices`): a convolution of halves
/// (tiled by default) or a product of halves (on the tiles by default) on a device that has
/// them.
fn other_target(family: &str, inputs: &[Operand], target: Target) -> Option<(Chosen, Target)> {
    let coop = target.coop.filter(|c| !c.everywhere)?;
    if inputs.iter().filter(|o| o.dtype == mgn_ir::DType::F16).count() < 2 {
        return None;
    }
    if family.starts_with("conv") {
        let everywhere = crate::kernels::Coop { everywhere: true, ..coop };
        Some((Chosen::Tiled, Target { coop: Some(everywhere), ..target }))
    } else if family.starts_with("matmul") {
        Some((Chosen::Tiles, Target { coop: None, ..target }))
    } else {
        None
    }
}
