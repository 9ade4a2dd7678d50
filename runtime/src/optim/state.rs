//! The optimizer's state in a checkpoint: its tensors (`optim.<name>.m`, `optim.<name>.v`,
//! `optim.step`, the loss scale's), and the checks a resumed state passes — complete, finite,
//! of the run's optimizer, naming only this model's parameters, second moments never negative.

use super::{m_name, v_name, CLEAN_STEPS_TENSOR, LOSS_SCALE_TENSOR, SKIPPED_TENSOR, STEP_TENSOR};
use mgn_ir::optim::{OptimizerKind, OptimizerState};
use mgn_ir::plan::ParamSpec;
use mgn_ir::precision::ScaleState;
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;

/// The state as named tensors for a checkpoint: `optim.<name>.m`, `optim.<name>.v` (f32, the
/// parameter's shape) for each buffer that exists, and `optim.step` (i64, shape `[]`).
///
/// Past 2^31 − 1 steps, which the host's integer storage cannot hold, an error.
pub fn state_to_tensors(
    state: &OptimizerState,
    params: &[ParamSpec],
) -> Result<Vec<(String, Tensor)>, String> {
    let step = i32::try_from(state.step).map_err(|_| {
        format!(
            "the optimizer's step count {} is past 2^31 - 1, which a checkpoint cannot store",
            state.step
        )
    })?;
    let mut out = vec![(
        STEP_TENSOR.to_string(),
        Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![step]) },
    )];
    for (i, p) in params.iter().enumerate() {
        for (buf, name) in [(&state.m, m_name(&p.name)), (&state.v, v_name(&p.name))] {
            if let Some(Some(b)) = buf.get(i) {
                out.push((name, Tensor::f32(p.shape.clone(), b.clone())));
            }
        }
    }
    if let Some(s) = state.loss_scale {
        let count = |n: u64| Tensor {
            dtype: DType::I64,
            shape: vec![],
            data: Data::I32(vec![i32::try_from(n).unwrap_or(i32::MAX)]),
        };
        out.push((LOSS_SCALE_TENSOR.into(), Tensor::f32(vec![], vec![s.scale as f32])));
        out.push((CLEAN_STEPS_TENSOR.into(), count(s.clean_steps)));
        out.push((SKIPPED_TENSOR.into(), count(s.skipped)));
    }
    Ok(out)
}

/// A dynamic loss scale stored in a checkpoint: a positive, finite `f32[]` scale and
/// non-negative counts of clean and skipped steps (0 when absent). None when the checkpoint
/// has no scale.
fn loss_scale_from<'t>(
    find: impl Fn(&str) -> Option<&'t Tensor>,
) -> Result<Option<ScaleState>, String> {
    let Some(t) = find(LOSS_SCALE_TENSOR) else { return Ok(None) };
    let scale = match (t.numel(), t.to_f64_vec().first()) {
        (1, Some(&s)) if s.is_finite() && s > 0.0 => s,
        _ => {
            return Err(format!(
                "`{LOSS_SCALE_TENSOR}` must be one positive, finite number, found {}{:?}",
                t.dtype, t.shape
            ))
        }
    };
    let count = |name: &str| match find(name) {
        None => Ok(0),
        Some(c) => match (c.numel(), c.as_i32()) {
            (1, Some(&[n])) if n >= 0 => Ok(n as u64),
            _ => Err(format!(
                "`{name}` must be one non-negative integer, found {}{:?}",
                c.dtype, c.shape
            )),
        },
    };
    let (clean_steps, skipped) = (count(CLEAN_STEPS_TENSOR)?, count(SKIPPED_TENSOR)?);
    Ok(Some(ScaleState { scale, clean_steps, skipped }))
}

/// Rebuilds the state from checkpoint tensors (any others are ignored). Parameters without
/// stored buffers start fresh; no `optim.step` means step 0.
///
/// Refused, naming the tensors: a buffer whose shape is not its parameter's, one holding NaN or
/// an infinity, and an incomplete Adam state (some `.v` stored, but a parameter with only one
/// of its two moments), which would otherwise restart that moment from zero without a word.
/// Whether the state is of the optimizer a run trains with is [`check_kind`]'s question.
pub fn state_from_tensors(
    tensors: &[(String, Tensor)],
    params: &[ParamSpec],
) -> Result<OptimizerState, String> {
    let by_name: std::collections::HashMap<&str, &Tensor> =
        tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let find = |name: &str| by_name.get(name).copied();
    let mut state = OptimizerState::new(params.len());
    if let Some(t) = find(STEP_TENSOR) {
        match (t.numel(), t.as_i32()) {
            (1, Some(&[s])) if s >= 0 => state.step = s as u64,
            _ => {
                return Err(format!(
                    "`{STEP_TENSOR}` must be one non-negative integer, found {}{:?}",
                    t.dtype, t.shape
                ))
            }
        }
    }
    for (i, p) in params.iter().enumerate() {
        for (slot, name) in [(&mut state.m[i], m_name(&p.name)), (&mut state.v[i], v_name(&p.name))]
        {
            let Some(t) = find(&name) else { continue };
            let values = match &t.data {
                Data::F32(v) if t.shape == p.shape => v.clone(),
                Data::F64(v) if t.shape == p.shape => v.iter().map(|&x| x as f32).collect(),
                _ => {
                    return Err(format!(
                        "optimizer state `{name}` is {}{:?} but parameter `{}` is {}{:?}",
                        t.dtype, t.shape, p.name, p.dtype, p.shape
                    ))
                }
            };
            *slot = Some(values);
        }
    }
    check_names(tensors, params)?;
    let buffers = params.iter().flat_map(|p| [m_name(&p.name), v_name(&p.name)]);
    let stored: Vec<(String, &Tensor)> =
        buffers.filter_map(|n| Some((n.clone(), find(&n)?))).collect();
    if let Some(list) =
        crate::checkpoint::describe_non_finite(stored.iter().map(|(n, t)| (n.as_str(), *t)))
    {
        return Err(format!(
            "the optimizer state holds values that are not finite: {list}\n(training on would \
             make the parameters NaN; it comes from a run that diverged, or a damaged file)"
        ));
    }
    check_complete(&state, params)?;
    check_second_moments(&state, params)?;
    state.loss_scale = loss_scale_from(find)?;
    Ok(state)
}

/// Every `optim.` tensor is the step, the loss scale's, or a moment of one of `params`: state
/// for a parameter the model does not have comes from another model (or a renamed one), and
/// is refused rather than dropped.
fn check_names(tensors: &[(String, Tensor)], params: &[ParamSpec]) -> Result<(), String> {
    let known: std::collections::HashSet<String> = params
        .iter()
        .flat_map(|p| [m_name(&p.name), v_name(&p.name)])
        .chain(
            [STEP_TENSOR, LOSS_SCALE_TENSOR, CLEAN_STEPS_TENSOR, SKIPPED_TENSOR].map(String::from),
        )
        .collect();
    let stray: Vec<&str> = tensors
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.starts_with("optim.") && !known.contains(*n))
        .collect();
    match stray.as_slice() {
        [] => Ok(()),
        [first, ..] => Err(format!(
            "optimizer state `{first}` belongs to no parameter of this model{}",
            match stray.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            }
        )),
    }
}

/// Adam's second moments are averages of squares: a negative one comes from a damaged file,
/// and would make a later update's square root NaN.
fn check_second_moments(state: &OptimizerState, params: &[ParamSpec]) -> Result<(), String> {
    for (v, p) in state.v.iter().zip(params) {
        let Some(v) = v else { continue };
        if let Some(i) = v.iter().position(|&x| x < 0.0) {
            return Err(format!(
                "optimizer state `{}` holds a negative second moment ({} at element {i}); it is \
                 an average of squares, so the file is damaged",
                v_name(&p.name),
                v[i]
            ));
        }
    }
    Ok(())
}

/// With Adam's state (a second moment stored for some parameter), every parameter has both
/// moments or neither.
fn check_complete(state: &OptimizerState, params: &[ParamSpec]) -> Result<(), String> {
    if state.v.iter().all(Option::is_none) {
        return Ok(());
    }
    let lacking: Vec<(String, String)> = params
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match (&state.m[i], &state.v[i]) {
            (Some(_), None) => Some((v_name(&p.name), m_name(&p.name))),
            (None, Some(_)) => Some((m_name(&p.name), v_name(&p.name))),
            _ => None,
        })
        .collect();
    let Some((missing, present)) = lacking.first() else { return Ok(()) };
    let more = match lacking.len() {
        1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    Err(format!(
        "the optimizer state is incomplete: `{missing}` is missing, though `{present}` is \
         there{more}; Adam and AdamW keep both moments of every parameter they update, and \
         resuming would restart the missing one from zero"
    ))
}

/// Which buffers (`m`, `v`) an optimizer keeps per parameter.
fn kept_buffers(kind: &OptimizerKind) -> (bool, bool) {
    match kind {
        OptimizerKind::Sgd { momentum } if *momentum == 0.0 => (false, false),
        OptimizerKind::Sgd { .. } => (true, false),
        OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => (true, true),
    }
}

/// Refuses optimizer state that is not of the optimizer `kind` a run trains with, naming both:
/// Adam and AdamW keep `.m` and `.v` per parameter, SGD with momentum `.m` only, plain SGD
/// nothing (so a state without buffers after some steps is plain SGD's). Resuming with another
/// optimizer would drop the state, or start it from zero under a step count that assumes it
/// has been accumulating. Adam and AdamW keep the same state, so either resumes the other.
pub fn check_kind(
    state: &OptimizerState,
    params: &[ParamSpec],
    kind: &OptimizerKind,
) -> Result<(), String> {
    let has_m = state.m.iter().any(Option::is_some);
    let has_v = state.v.iter().any(Option::is_some);
    let found = match (has_m, has_v) {
        (_, true) => (true, true),
        (true, false) => (true, false),
        (false, false) if state.step == 0 => return Ok(()), // nothing accumulated yet
        (false, false) => (false, false),
    };
    if found == kept_buffers(kind) {
        return Ok(());
    }
    let found_words = match found {
        (_, true) => "Adam's or AdamW's (`.m` and `.v` per parameter)".to_string(),
        (true, false) => "SGD with momentum's (`.m` only)".to_string(),
        _ => format!("plain SGD's (no buffers after {} steps)", state.step),
    };
    let want_words = match kind {
        OptimizerKind::Sgd { momentum } if *momentum == 0.0 => "plain SGD (no state)".to_string(),
        OptimizerKind::Sgd { momentum } => format!("SGD with momentum {momentum} (`.m` only)"),
        OptimizerKind::Adam { .. } => "Adam (`.m` and `.v` per parameter)".to_string(),
        OptimizerKind::AdamW { .. } => "AdamW (`.m` and `.v` per parameter)".to_string(),
    };
    // Adam's state with every `.v` gone looks like momentum's: say which tensor that would be.
    let lost_v = match (found, kept_buffers(kind)) {
        ((true, false), (true, true)) => params
            .iter()
            .zip(&state.m)
            .find(|(_, m)| m.is_some())
            .map(|(p, _)| {
                format!(" (or its `.v` tensors, such as `{}`, are missing)", v_name(&p.name))
            })
            .unwrap_or_default(),
        _ => String::new(),
    };
    Err(format!(
        "the optimizer state is {found_words}{lost_v}, but this run trains with {want_words}; \
         resume with the optimizer the checkpoint was trained with"
    ))
}
