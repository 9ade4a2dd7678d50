//! Batch norm, forward and derivatives: batch statistics in training (a workgroup per channel),
//! running statistics otherwise (element-wise).

use super::rows::row_kernel;
use super::{affine, batch_layout, channel_rows, lit, Mode, Stats};
use crate::kernels::{elementwise, load, store, KernelSource, Operand};
use mgn_ir::op::GradPart;

/// Running statistics must be `[C]`.
fn check_running(inputs: &[Operand], c: usize) -> Result<(), String> {
    if inputs[1].shape != [c] || inputs[2].shape != [c] {
        return Err(format!(
            "running statistics must have shape [{c}], found {:?} and {:?}",
            inputs[1].shape, inputs[2].shape
        ));
    }
    Ok(())
}

/// The statistics of a batch norm: the batch's per channel when training (which needs more
/// than one value per channel), else the running ones (inputs 1 and 2) of row `bc`.
fn batch_stats(inputs: &[Operand], training: bool) -> Result<Stats, String> {
    let (n, c, s) = batch_layout(&inputs[0])?;
    check_running(inputs, c)?;
    if !training {
        return Ok(Stats::Given { mean: load(&inputs[1], "bc"), var: load(&inputs[2], "bc") });
    }
    if n * s <= 1 {
        return Err(format!(
            "training needs more than one value per channel, found input shape [{n}, {c}, ..] \
             with {s} per sample"
        ));
    }
    Ok(Stats::Batch { center: true })
}

/// `1/sqrt(running_var[c] + eps)` and the channel `c` of element `i`, for the elementwise
/// inference kernels.
fn running(inputs: &[Operand], eps: f64) -> Result<(String, String), String> {
    let (_, c, s) = batch_layout(&inputs[0])?;
    Ok((
        format!(
            "let c = (i / {s}u) % {c}u;\n    let rstd = 1.0 / sqrt({} + {});",
            load(&inputs[2], "c"),
            lit(eps)
        ),
        load(&inputs[1], "c"),
    ))
}

/// A training plan's batch norm (batch statistics, a workgroup per channel), each result
/// through `post`'s `mgn_epilogue` when given (`GpuOp::NormEpilogue`).
pub(crate) fn batch_norm_with(
    inputs: &[Operand],
    out: &Operand,
    eps: f64,
    (has_weight, has_bias): (bool, bool),
    width: u32,
    post: Option<&str>,
) -> Result<KernelSource, String> {
    let x = &inputs[0];
    let stats = batch_stats(inputs, true)?;
    let (w, b) = affine(inputs, 3, has_weight, has_bias);
    let mode = Mode::Forward { w, b, post };
    Ok(row_kernel(&channel_rows(x)?, x, None, &stats, eps, mode, out, width as usize))
}

/// Batch norm forward, inputs `x, running_mean, running_var, weight?, bias?`: batch statistics
/// (a workgroup per channel) when `training`, else the running ones (elementwise).
pub(crate) fn batch_norm(
    inputs: &[Operand],
    out: &Operand,
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    training: bool,
    width: u32,
) -> Result<KernelSource, String> {
    if training {
        return batch_norm_with(inputs, out, eps, (has_weight, has_bias), width, None);
    }
    let x = &inputs[0];
    batch_stats(inputs, training)?;
    let (w, b) = affine(inputs, 3, has_weight, has_bias);
    let (pre, mean) = running(inputs, eps)?;
    let mut y = format!("({} - {mean}) * rstd", load(x, "i"));
    if let Some(w) = w {
        y = format!("{y} * {}", load(w, "c"));
    }
    if let Some(b) = b {
        y = format!("{y} + {}", load(b, "c"));
    }
    Ok(elementwise(
        out.shape.iter().product::<usize>(),
        width,
        &format!("{pre}\n    {}", store(out, "i", &y)),
        "",
    ))
}

/// Inputs `x, running_mean, running_var, weight?, bias?, dy`. In training the batch statistics
/// depend on `x` (the full derivative); otherwise `dx = dy·w·rstd`, elementwise.
pub(super) fn batch_norm_grad(
    inputs: &[Operand],
    out: &Operand,
    eps: f64,
    has_weight: bool,
    part: GradPart,
    training: bool,
    width: u32,
) -> Result<KernelSource, String> {
    let x = &inputs[0];
    let dy = &inputs[inputs.len() - 1];
    let stats = batch_stats(inputs, training)?;
    let w = has_weight.then(|| &inputs[3]);
    let rows = channel_rows(x)?;
    match part {
        GradPart::Input if !training => {
            let (pre, _) = running(inputs, eps)?;
            let scale = w.map_or("rstd".to_string(), |w| format!("rstd * {}", load(w, "c")));
            Ok(elementwise(
                out.shape.iter().product::<usize>(),
                width,
                &format!("{pre}\n    {}", store(out, "i", &format!("{scale} * {}", load(dy, "i")))),
                "",
            ))
        }
        GradPart::Input => {
            Ok(row_kernel(&rows, x, Some(dy), &stats, eps, Mode::Input { w }, out, width as usize))
        }
        p => Ok(row_kernel(&rows, x, Some(dy), &stats, eps, Mode::Param(p), out, width as usize)),
    }
}
