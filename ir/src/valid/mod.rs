//! The plan validator: everything a backend may assume about a plan, checked once, so a
//! hand-edited, truncated or foreign plan is refused with a clear error instead of panicking
//! (or silently computing garbage) in a backend.
//!
//! A valid plan:
//! - references only earlier steps, and names only existing steps, parameters and inputs;
//! - holds only public ops (backend-private ops cannot be written in the format at all:
//!   deserializing one fails, and [`crate::infer`] refuses any that reach it);
//! - types every step by its op's rule ([`crate::infer::check`]): input counts, dtypes and
//!   shapes agree, parameters have their declared type, every gradient has its parameter's;
//! - has no tensor over 2^40 elements;
//! - computes each computed init from constants alone, ending in the tensor's own type;
//! - writes state only into untrained tensors, once per run, with values of their type;
//! - gives aliases free names of saved parameters, and counts steps only into integer scalar
//!   buffers that no step reads (sessions count on the host);
//! - when it scales its loss, keeps the scale in an untrained, unsaved `f32[]` parameter, and
//!   is a training plan with gradients;
//! - when dynamic, has well-formed sizes, each an input's axis, and sites that hold their
//!   polynomials' values at the bound (`dynamic::Dynamic::validate`).
//!
//! Validation is linear in the plan's size; the compiler runs it on every plan it builds,
//! `Plan::from_bytes` on every plan it reads, and `GpuSession::new` on hand-built ones.

use crate::infer::{check, Ty};
use crate::op::Op;
use crate::plan::{InitSpec, ParamSpec, Plan, Step};
use crate::shape::checked_numel;

/// The largest tensor a plan may hold, in elements.
pub const MAX_ELEMENTS: usize = 1 << 40;

/// The first thing wrong with `plan`, as a sentence naming the step and its model line.
pub fn validate(plan: &Plan) -> Result<(), String> {
    for i in 0..plan.steps.len() {
        step(plan, i)?;
    }
    params(plan)?;
    inputs(plan)?;
    results(plan)?;
    loss_scaling(plan)?;
    match &plan.dynamic {
        Some(d) => d.validate(plan),
        None => Ok(()),
    }
}

/// Parameters: one name each (a checkpoint holds one tensor per name), initializers that draw
/// finite values, and a loss to train them on when a plan trains them.
fn params(plan: &Plan) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for p in &plan.params {
        if !seen.insert(p.name.as_str()) {
            return Err(format!("two parameters are named `{}`", p.name));
        }
        let finite = |xs: &[f64]| xs.iter().all(|x| x.is_finite());
        let drawable = match &p.init {
            InitSpec::Constant(v) => finite(&[*v]),
            InitSpec::Normal { mean, std } => finite(&[*mean, *std]) && *std >= 0.0,
            // `high - low` is what scales a draw: it must be finite too.
            InitSpec::Uniform { low, high } => finite(&[*low, *high, high - low]) && low <= high,
            InitSpec::Computed(steps) => {
                computed_init(p, steps).map_err(|e| format!("the init of `{}`: {e}", p.name))?;
                true
            }
        };
        if !drawable {
            return Err(format!(
                "the init of `{}`, {}, does not draw finite values",
                p.name, p.init
            ));
        }
        if p.dtype.is_packed() {
            p.dtype.packs(&p.shape).map_err(|e| format!("parameter `{}`: {e}", p.name))?;
            // A packed weight has no gradient (its values are a function of a few bits); a
            // plan trains the f32 parameters around it (adapters, norms, a head).
            if p.trainable {
                return Err(format!("parameter `{}` is packed ({}) but trained", p.name, p.dtype));
            }
        }
    }
    // (A training-mode plan that trains nothing may end anywhere: the backends' tests build
    // such plans to look at derivatives.)
    if plan.mode == crate::plan::Mode::Train && !plan.grads.is_empty() && plan.loss.is_none() {
        return Err("a training plan that trains parameters without a loss".to_string());
    }
    Ok(())
}

fn step(plan: &Plan, i: usize) -> Result<(), String> {
    let s = &plan.steps[i];
    let at = || format!("step {i} (`{}`, from {})", s.op.describe(), s.loc);
    if let Some(&bad) = s.inputs.iter().find(|&&x| x as usize >= i) {
        return Err(format!("{} reads value {bad}, which is not computed before it", at()));
    }
    if checked_numel(&s.shape).is_none_or(|n| n > MAX_ELEMENTS) {
        return Err(format!("{} has an impossible shape {:?}", at(), s.shape));
    }
    // Packed values are parameters, read only through `Dequantize`: a backend never meets a
    // packed operand elsewhere.
    if s.dtype.is_packed() && !matches!(s.op, Op::Param { .. }) {
        return Err(format!("{} is packed ({}), but only parameters are", at(), s.dtype));
    }
    if s.op != Op::Dequantize {
        if let Some(&x) = s.inputs.iter().find(|&&x| plan.steps[x as usize].dtype.is_packed()) {
            return Err(format!(
                "{} reads the packed value {x} other than through dequantize",
                at()
            ));
        }
    }
    match &s.op {
        Op::DropoutGrad { forward, .. } => {
            let f = plan.steps.get(*forward as usize).filter(|_| (*forward as usize) < i);
            if !matches!(f.map(|f| &f.op), Some(Op::Dropout { .. })) {
                return Err(format!("{} derives step {forward}, not an earlier dropout", at()));
            }
        }
        Op::Param { index } => {
            let p = plan.params.get(*index).ok_or_else(|| {
                format!("{} names parameter {index}, but there are {}", at(), plan.params.len())
            })?;
            if p.shape != s.shape || p.dtype != s.dtype {
                return Err(format!(
                    "{}: parameter `{}` is {}{:?} but the step says {}{:?}",
                    at(),
                    p.name,
                    p.dtype,
                    p.shape,
                    s.dtype,
                    s.shape
                ));
            }
        }
        _ => {}
    }
    let types: Vec<Ty> = s
        .inputs
        .iter()
        .map(|&x| (plan.steps[x as usize].dtype, &plan.steps[x as usize].shape[..]))
        .collect();
    check(&s.op, &types, (s.dtype, &s.shape)).map_err(|e| format!("{}: {e}", at()))
}

/// A computed init: typed steps that read only earlier steps, no inputs, parameters or random
/// numbers, the last of which has the tensor's type.
fn computed_init(p: &ParamSpec, steps: &[Step]) -> Result<(), String> {
    for (i, s) in steps.iter().enumerate() {
        let at = || format!("step {i} (`{}`, from {})", s.op.describe(), s.loc);
        if let Some(&bad) = s.inputs.iter().find(|&&x| x as usize >= i) {
            return Err(format!("{} reads value {bad}, which is not computed before it", at()));
        }
        if checked_numel(&s.shape).is_none_or(|n| n > MAX_ELEMENTS) {
            return Err(format!("{} has an impossible shape {:?}", at(), s.shape));
        }
        if matches!(s.op, Op::Input { .. } | Op::Param { .. } | Op::Dropout { .. }) {
            return Err(format!("{} is not a constant", at()));
        }
        let types: Vec<Ty> = s
            .inputs
            .iter()
            .map(|&x| (steps[x as usize].dtype, &steps[x as usize].shape[..]))
            .collect();
        check(&s.op, &types, (s.dtype, &s.shape)).map_err(|e| format!("{}: {e}", at()))?;
    }
    match steps.last() {
        None => Err("it has no steps".into()),
        Some(s) if s.dtype != p.dtype || s.shape != p.shape => Err(format!(
            "it computes {}{:?}, but the tensor is {}{:?}",
            s.dtype, s.shape, p.dtype, p.shape
        )),
        Some(_) => Ok(()),
    }
}

/// The loss scale lives in an `f32[]` parameter that is neither trained nor saved (the session
/// writes it), in a plan with a loss and gradients to scale.
fn loss_scaling(plan: &Plan) -> Result<(), String> {
    let Some(ls) = &plan.loss_scaling else { return Ok(()) };
    let p = plan.params.get(ls.param).ok_or_else(|| {
        format!("the loss scale names parameter {}, but there are {}", ls.param, plan.params.len())
    })?;
    let fits = p.dtype == crate::DType::F32 && p.shape.is_empty() && !p.trainable && !p.persistent;
    if !fits {
        return Err(format!(
            "the loss scale `{}` is {}{:?}{}; it must be an f32[] that is neither trained nor \
             saved",
            p.name,
            p.dtype,
            p.shape,
            if p.trainable { ", trained" } else { "" }
        ));
    }
    if plan.loss.is_none() || plan.grads.is_empty() {
        return Err("the plan scales its loss but has no loss or no gradients".into());
    }
    if !(ls.init.is_finite() && ls.init > 0.0 && ls.growth_interval > 0) {
        return Err(format!(
            "the loss scale starts at {} and grows every {} steps; both must be positive",
            ls.init, ls.growth_interval
        ));
    }
    Ok(())
}

/// Every input step is named in the plan's input list (sessions look its value up there), and
/// the list names input steps only, each name once.
fn inputs(plan: &Plan) -> Result<(), String> {
    for (i, s) in plan.steps.iter().enumerate() {
        if let Op::Input { name } = &s.op {
            if !plan.inputs.iter().any(|(n, v)| n == name && *v as usize == i) {
                return Err(format!(
                    "step {i} reads input `{name}`, which the plan's input list does not name"
                ));
            }
        }
    }
    for (k, (name, v)) in plan.inputs.iter().enumerate() {
        if !matches!(plan.steps.get(*v as usize).map(|s| &s.op), Some(Op::Input { .. })) {
            return Err(format!("input `{name}` names step {v}, which is not an input"));
        }
        if plan.inputs[..k].iter().any(|(n, _)| n == name) {
            return Err(format!("input `{name}` is listed twice"));
        }
    }
    Ok(())
}

/// Outputs, the loss and gradients name existing steps; the loss is a float scalar; each
/// gradient belongs to a trainable parameter and has its type.
fn results(plan: &Plan) -> Result<(), String> {
    let n = plan.steps.len();
    let named = plan.outputs.iter().map(|(_, v)| *v).chain(plan.loss);
    for v in named.chain(plan.grads.iter().map(|(_, v)| *v)) {
        if v as usize >= n {
            return Err(format!("value {v} is named but the plan has {n} steps"));
        }
    }
    if let Some(l) = plan.loss {
        let s = &plan.steps[l as usize];
        if !s.shape.is_empty() || !s.dtype.is_float() {
            return Err(format!(
                "the loss (step {l}) is {}{:?}, not a float scalar",
                s.dtype, s.shape
            ));
        }
    }
    for (k, &(p, v)) in plan.grads.iter().enumerate() {
        let spec = plan.params.get(p).ok_or_else(|| {
            format!("a gradient names parameter {p}, but there are {}", plan.params.len())
        })?;
        let g = &plan.steps[v as usize];
        if !spec.trainable || g.shape != spec.shape || !g.dtype.is_float() {
            return Err(format!(
                "the gradient of `{}` (step {v}) is {}{:?}, but the parameter is {}{:?}{}",
                spec.name,
                g.dtype,
                g.shape,
                spec.dtype,
                spec.shape,
                if spec.trainable { "" } else { " and not trainable" }
            ));
        }
        if plan.grads[..k].iter().any(|&(q, _)| q == p) {
            return Err(format!("parameter `{}` has two gradients", spec.name));
        }
    }
    state_writes(plan)?;
    aliases(plan)?;
    counters(plan)
}

/// Each alias names an existing parameter by a name no parameter or other alias has.
fn aliases(plan: &Plan) -> Result<(), String> {
    for (k, a) in plan.aliases.iter().enumerate() {
        let spec = plan.params.get(a.param).ok_or_else(|| {
            format!(
                "alias `{}` names parameter {}, but there are {}",
                a.name,
                a.param,
                plan.params.len()
            )
        })?;
        if plan.params.iter().any(|p| p.name == a.name)
            || plan.aliases[..k].iter().any(|b| b.name == a.name)
        {
            return Err(format!("alias `{}` of `{}` is a name taken twice", a.name, spec.name));
        }
        if !spec.persistent {
            return Err(format!(
                "alias `{}` names `{}`, which is never saved or loaded",
                a.name, spec.name
            ));
        }
    }
    Ok(())
}

/// Each counter is a persistent integer scalar buffer, counted once, that no step reads.
fn counters(plan: &Plan) -> Result<(), String> {
    for (k, &p) in plan.counters.iter().enumerate() {
        let spec = plan.params.get(p).ok_or_else(|| {
            format!("a counter names parameter {p}, but there are {}", plan.params.len())
        })?;
        if spec.trainable || !spec.persistent || !spec.dtype.is_int() || spec.numel() != 1 {
            return Err(format!(
                "counter `{}` is {}{:?}{}; a counter is an integer buffer of one element",
                spec.name,
                spec.dtype,
                spec.shape,
                if spec.trainable { ", trained" } else { "" }
            ));
        }
        if plan.counters[..k].contains(&p) {
            return Err(format!("`{}` is counted twice", spec.name));
        }
        if plan.state_writes.iter().any(|&(q, _)| q == p) {
            return Err(format!("`{}` is both counted and written by a run", spec.name));
        }
        // Sessions count on the host: a step reading a counter would read a stale copy on a
        // device (and a GPU kernel has no 64-bit integers to read it as).
        if let Some(i) = plan.steps.iter().position(|s| s.op == (Op::Param { index: p })) {
            return Err(format!(
                "step {i} (from {}) reads counter `{}`; no step may read a counter",
                plan.steps[i].loc, spec.name
            ));
        }
    }
    Ok(())
}

/// Each state write replaces an untrained tensor, once, by a step of its exact type.
fn state_writes(plan: &Plan) -> Result<(), String> {
    for (k, &(p, v)) in plan.state_writes.iter().enumerate() {
        let spec = plan.params.get(p).ok_or_else(|| {
            format!("a state write names parameter {p}, but there are {}", plan.params.len())
        })?;
        let s = plan.steps.get(v as usize).ok_or_else(|| {
            format!(
                "the write of `{}` names value {v}, but there are {}",
                spec.name,
                plan.steps.len()
            )
        })?;
        if spec.trainable {
            return Err(format!("`{}` is trained, so a run may not overwrite it", spec.name));
        }
        if s.shape != spec.shape || s.dtype != spec.dtype {
            return Err(format!(
                "`{}` is {}{:?}, but the step written into it (value {v}) is {}{:?}",
                spec.name, spec.dtype, spec.shape, s.dtype, s.shape
            ));
        }
        if plan.state_writes[..k].iter().any(|&(q, _)| q == p) {
            return Err(format!("`{}` is written twice in one run", spec.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
