//! Padding and resampling: `pad` and `interpolate`.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, Op};
use mgn_ir::op::{InterpMode, PadMode};
use mgn_ir::shape::resample::Axis;
use mgn_syntax::Diagnostic;

/// Elements of one tensor at most (the evaluator's limit, checked here before the IR's rule
/// sees a padded size that could overflow).
const MAX_AXIS: i64 = 1 << 40;

pub(super) fn pad(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    let mode = match a.choice(ev, "mode", &["constant", "reflect", "replicate"], "constant")? {
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        _ => PadMode::Constant,
    };
    let value = match a.get("value") {
        None => 0.0,
        Some(_) if mode != PadMode::Constant => {
            return Err(Diagnostic::error(
                "E0201",
                "`value` is used only by `mode = \"constant\"`",
                a.span_of("value"),
                "not used by this mode",
            )
            .with_help("leave `value` out, or pad with `mode = \"constant\"`"))
        }
        Some(_) => a.number(ev, "value")?,
    };
    let list = a.ints(ev, "widths")?.unwrap_or_default();
    if list.is_empty() || list.len() % 2 != 0 {
        return Err(Diagnostic::error(
            "E0201",
            format!(
                "`widths` of `pad` needs pairs (before, after), last axis first, found {} value{}",
                list.len(),
                crate::elab::eval::plural(list.len())
            ),
            a.span_of("widths"),
            "not pairs",
        )
        .with_help(
            "`[1, 2]` pads the last axis by 1 before and 2 after; `[1, 1, 2, 2]` also pads the \
             axis before it by 2",
        ));
    }
    if list.len() / 2 > s.len() {
        return Err(Diagnostic::error(
            "E0206",
            format!(
                "`widths` of `pad` pads {} axes, but x has {}: {}",
                list.len() / 2,
                s.len(),
                fmt_type(d, &s)
            ),
            a.span_of("widths"),
            "too many pairs",
        )
        .with_label(xs, format!("this is {}", fmt_type(d, &s))));
    }
    if let Some(&bad) = list.iter().find(|&&w| !(0..MAX_AXIS).contains(&w)) {
        let bound = if bad < 0 { "at least 0" } else { "below 2^40" };
        let d = Diagnostic::error(
            "E0301",
            format!("`widths` of `pad` must be {bound}, found {bad}"),
            a.span_of("widths"),
            "out of range",
        );
        return Err(if bad < 0 { d.with_help("to crop, use `slice`") } else { d });
    }
    // Pairs are last axis first, as in PyTorch's `F.pad`.
    let mut widths = vec![[0usize; 2]; s.len()];
    for (k, pair) in list.chunks(2).enumerate() {
        widths[s.len() - 1 - k] = [pair[0] as usize, pair[1] as usize];
    }
    let mut out = Vec::with_capacity(s.len());
    for (axis, (&n, &[b, e])) in s.iter().zip(&widths).enumerate() {
        if mode == PadMode::Reflect && (b >= n || e >= n) {
            return Err(Diagnostic::error(
                "E0203",
                format!(
                    "reflect padding of ({b}, {e}) on axis {axis} needs widths below its size {n}"
                ),
                a.span_of("widths"),
                "too wide to reflect",
            )
            .with_label(xs, format!("this is {}", fmt_type(d, &s)))
            .with_help("pad with `mode = \"replicate\"`, or reflect a larger tensor"));
        }
        out.push(n + b + e);
    }
    node(ev, Op::Pad { widths, mode, value }, vec![x], d, out, a.span)
}

pub(super) fn interpolate(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (x, d, s, xs) = super::conv::spatial_input(ev, a, &[1, 2])?;
    let spatial = s.len() - 2;
    let choice = a.choice(ev, "mode", &["nearest", "linear", "bilinear"], "nearest")?;
    let mode = if choice == "nearest" { InterpMode::Nearest } else { InterpMode::Linear };
    let wants = match choice {
        "linear" => Some((1, "[N, C, L]")),
        "bilinear" => Some((2, "[N, C, H, W]")),
        _ => None,
    };
    if let Some((n, layout)) = wants.filter(|(n, _)| *n != spatial) {
        let other = if n == 1 { "bilinear" } else { "linear" };
        return Err(Diagnostic::error(
            "E0206",
            format!("`mode = \"{choice}\"` needs an input {layout}, found {}", fmt_type(d, &s)),
            xs,
            format!("{} axes", s.len()),
        )
        .with_help(format!("use `mode = \"{other}\"` for this input")));
    }
    let align_corners = a.bool_or(ev, "align_corners", false)?;
    if align_corners && mode == InterpMode::Nearest {
        return Err(Diagnostic::error(
            "E0201",
            "`align_corners` applies only to linear and bilinear interpolation",
            a.span_of("align_corners"),
            "not used by nearest",
        ));
    }
    let (size, scale) = sizes(ev, a, &s)?;
    if let Some(k) = fast_path(&s, &size, scale.as_deref(), mode) {
        return node(ev, Op::Upsample { scale: k }, vec![x], d, size_shape(&s, &size), a.span);
    }
    let out = size_shape(&s, &size);
    node(ev, Op::Interpolate { mode, size, scale, align_corners }, vec![x], d, out, a.span)
}

fn size_shape(s: &[usize], size: &[usize]) -> Vec<usize> {
    s[..2].iter().chain(size).copied().collect()
}

/// The output size per spatial axis, and the scale factors when they were given instead:
/// `floor(in · scale)`, as PyTorch computes it.
fn sizes(ev: &Evaluator, a: &Args, s: &[usize]) -> R<(Vec<usize>, Option<Vec<f64>>)> {
    let spatial = s.len() - 2;
    let count = |name: &str, n: usize| -> R<()> {
        if n == 1 || n == spatial {
            return Ok(());
        }
        Err(Diagnostic::error(
            "E0201",
            format!("`{name}` needs 1 or {spatial} values, found {n}"),
            a.span_of(name),
            "wrong number of values",
        ))
    };
    match (a.ints(ev, "size")?, a.numbers(ev, "scale")?) {
        (Some(_), Some(_)) | (None, None) => Err(Diagnostic::error(
            "E0401",
            "`interpolate` needs exactly one of `size` and `scale`",
            a.span,
            "give `size` or `scale`",
        )),
        (Some(v), None) => {
            count("size", v.len())?;
            if let Some(bad) = v.iter().find(|&&x| !(1..=MAX_AXIS).contains(&x)) {
                return Err(Diagnostic::error(
                    "E0301",
                    format!("`size` must be a positive size, found {bad}"),
                    a.span_of("size"),
                    "out of range",
                ));
            }
            Ok(((0..spatial).map(|k| v[k.min(v.len() - 1)] as usize).collect(), None))
        }
        (None, Some(v)) => {
            count("scale", v.len())?;
            let scale: Vec<f64> = (0..spatial).map(|k| v[k.min(v.len() - 1)]).collect();
            let mut size = Vec::new();
            for (k, &f) in scale.iter().enumerate() {
                let n = (s[2 + k] as f64 * f).floor();
                if !(f.is_finite() && f > 0.0 && n >= 1.0 && n <= MAX_AXIS as f64) {
                    return Err(Diagnostic::error(
                        "E0301",
                        format!(
                            "`scale = {f}` makes axis {} of size {} {}",
                            2 + k,
                            s[2 + k],
                            if n < 1.0 { "empty" } else { "too large" }
                        ),
                        a.span_of("scale"),
                        "out of range",
                    ));
                }
                size.push(n as usize);
            }
            Ok((size, Some(scale)))
        }
    }
}

/// The integer factor when nearest interpolation is `upsample` by it: the same whole factor on
/// every spatial axis, and PyTorch's index math reading `j / factor` at every output `j`.
fn fast_path(
    s: &[usize],
    size: &[usize],
    scale: Option<&[f64]>,
    mode: InterpMode,
) -> Option<usize> {
    if mode != InterpMode::Nearest || !size[0].is_multiple_of(s[2]) {
        return None;
    }
    let k = size[0] / s[2];
    let exact = (0..size.len()).all(|a| {
        let axis = Axis::new(s[2 + a], size[a], scale.map(|v| v[a]), mode, false);
        size[a] == s[2 + a] * k && (0..size[a]).all(|j| axis.nearest(j) == j / k)
    });
    exact.then_some(k)
}
