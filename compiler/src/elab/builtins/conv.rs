//! Convolution, pooling and upsampling.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{fmt_type, NodeId, Op, PoolOp};
use mgn_ir::{shape, DType};
use mgn_syntax::{Diagnostic, Span};

// ---- convolution and resampling -------------------------------------------------------------

/// The float input `x` of a builtin over `[N, C, …]` with one of `axes` spatial axes (the
/// layouts name them in the error): its node, dtype, shape and span.
pub(super) fn spatial_input(
    ev: &Evaluator,
    a: &Args,
    axes: &[usize],
) -> R<(NodeId, DType, Vec<usize>, Span)> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    if !axes.contains(&(s.len().saturating_sub(2))) || s.len() < 3 {
        let layouts: Vec<&str> =
            axes.iter().map(|n| if *n == 1 { "[N, C, L]" } else { "[N, C, H, W]" }).collect();
        return Err(Diagnostic::error(
            "E0206",
            format!(
                "`{}` needs an input {}, found {}",
                a.name(),
                layouts.join(" or "),
                fmt_type(d, &s)
            ),
            xs,
            format!("{} axes", s.len()),
        ));
    }
    Ok((x, d, s, xs))
}

/// The weight of a convolution builtin over `spatial` axes: `d` like the input, in `layout`
/// (`[Cout, Cin / groups, …]` or, transposed, `[Cin, Cout / groups, …]`).
pub(super) fn conv_weight(
    ev: &Evaluator,
    a: &Args,
    d: DType,
    spatial: usize,
    layout: [&str; 2],
) -> R<(NodeId, Vec<usize>, Span)> {
    let (w, ws) = float_tensor(ev, a, "weight")?;
    let sw = ev.ty(w).1.to_vec();
    if sw.len() != spatial + 2 || ev.ty(w).0 != d {
        let layout = if spatial == 1 {
            format!("[{}, {}, K]", layout[0], layout[1])
        } else {
            format!("[{}, {}, Kh, Kw]", layout[0], layout[1])
        };
        return Err(Diagnostic::error(
            "E0206",
            format!("`{}` needs a {d} weight {layout}, found {}", a.name(), ev.type_str(w)),
            ws,
            "wrong weight shape",
        ));
    }
    Ok((w, sw, ws))
}

/// An int or a per-axis list for `spatial` axes.
pub(super) fn per_axis(
    ev: &Evaluator,
    a: &Args,
    name: &str,
    default: usize,
    spatial: usize,
    min: i64,
) -> R<Vec<usize>> {
    let v = match a.ints(ev, name)? {
        None => vec![default; spatial],
        Some(v) if v.len() == 1 => vec![v[0].max(0) as usize; spatial],
        Some(v) if v.len() == spatial => v.iter().map(|&x| x.max(0) as usize).collect(),
        Some(v) => {
            return Err(Diagnostic::error(
                "E0201",
                format!("`{name}` needs 1 or {spatial} values, found {}", v.len()),
                a.span_of(name),
                "wrong number of values",
            ))
        }
    };
    if let Some(bad) = a.ints(ev, name)?.and_then(|l| l.into_iter().find(|&x| x < min)) {
        return Err(Diagnostic::error(
            "E0301",
            format!("`{name}` must be at least {min}, found {bad}"),
            a.span_of(name),
            "out of range",
        ));
    }
    Ok(v)
}

pub(super) fn conv(ev: &mut Evaluator, a: &Args, spatial: usize) -> R<Value> {
    let (x, d, sx, xs) = spatial_input(ev, a, &[spatial])?;
    let (w, sw, ws) = conv_weight(ev, a, d, spatial, ["Cout", "Cin / groups"])?;
    let groups = a.int_or(ev, "groups", 1)?;
    let (cin, cout) = (sx[1], sw[0]);
    if groups < 1 || cin % groups as usize != 0 || cout % groups as usize != 0 {
        let msg = format!(
            "`groups = {groups}` must divide both the input channels ({cin}) and the output \
             channels ({cout})"
        );
        return Err(Diagnostic::error("E0203", msg, a.span_of("groups"), "does not divide"));
    }
    let groups = groups as usize;
    if sw[1] * groups != cin {
        let d = Diagnostic::error(
            "E0203",
            format!(
                "`{}` input has {cin} channels but the weight expects {}",
                a.name(),
                sw[1] * groups
            ),
            xs,
            format!("this is {}", fmt_type(d, &sx)),
        )
        .with_label(
            ws,
            format!(
                "weight {} takes {} input channel{}{}",
                ev.type_str(w),
                sw[1],
                crate::elab::eval::plural(sw[1]),
                if groups > 1 { format!(" per group ({groups} groups)") } else { String::new() }
            ),
        );
        return Err(d);
    }
    let stride = per_axis(ev, a, "stride", 1, spatial, 1)?;
    let padding = per_axis(ev, a, "padding", 0, spatial, 0)?;
    let dilation = per_axis(ev, a, "dilation", 1, spatial, 1)?;
    let mut out = vec![sx[0], cout];
    for i in 0..spatial {
        let k = sw[2 + i];
        match shape::window_out(sx[2 + i], k, stride[i], padding[i], dilation[i]) {
            Some(o) => out.push(o),
            None => {
                let msg = format!(
                    "`{}` kernel of size {k} (dilation {}) does not fit spatial axis {} of size {} \
                     with padding {}",
                    a.name(),
                    dilation[i],
                    i + 2,
                    sx[2 + i],
                    padding[i]
                );
                return Err(Diagnostic::error("E0203", msg, a.span, "output would be empty")
                    .with_label(xs, format!("this is {}", fmt_type(d, &sx))));
            }
        }
    }
    let bias = vector_of(
        ev,
        a,
        "bias",
        cout,
        d,
        &format!("a convolution has one bias per output channel ({cout})"),
    )?;
    let inputs = [x, w].into_iter().chain(bias).collect();
    node(
        ev,
        Op::Conv { stride, padding, dilation, groups, has_bias: bias.is_some() },
        inputs,
        d,
        out,
        a.span,
    )
}

pub(super) fn pool(ev: &mut Evaluator, a: &Args, op: PoolOp, spatial: usize) -> R<Value> {
    let (x, xs) = float_tensor(ev, a, "x")?;
    let (d, s) = ev.ty(x);
    let s = s.to_vec();
    if s.len() != spatial + 2 {
        let layout = if spatial == 1 { "[N, C, L]" } else { "[N, C, H, W]" };
        return Err(Diagnostic::error(
            "E0206",
            format!("`{}` needs an input {layout}, found {}", a.name(), fmt_type(d, &s)),
            xs,
            format!("{} axes", s.len()),
        ));
    }
    let kernel = per_axis(ev, a, "kernel", 1, spatial, 1)?;
    let stride = if a.get("stride").is_some() {
        per_axis(ev, a, "stride", 1, spatial, 1)?
    } else {
        kernel.clone()
    };
    let padding = per_axis(ev, a, "padding", 0, spatial, 0)?;
    let mut out = vec![s[0], s[1]];
    for i in 0..spatial {
        if padding[i] * 2 > kernel[i] {
            return Err(Diagnostic::error(
                "E0203",
                format!("padding {} is more than half the kernel size {}", padding[i], kernel[i]),
                a.span_of("padding"),
                "too much padding",
            ));
        }
        match shape::window_out(s[2 + i], kernel[i], stride[i], padding[i], 1) {
            Some(o) => out.push(o),
            None => {
                return Err(Diagnostic::error(
                    "E0203",
                    format!(
                        "pooling window {} does not fit axis {} of size {}",
                        kernel[i],
                        i + 2,
                        s[2 + i]
                    ),
                    a.span,
                    "output would be empty",
                )
                .with_label(xs, format!("this is {}", fmt_type(d, &s))))
            }
        }
    }
    node(ev, Op::Pool { op, kernel, stride, padding }, vec![x], d, out, a.span)
}

pub(super) fn upsample(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let (x, d, s, _) = spatial_input(ev, a, &[1, 2])?;
    let scale = a.int_or(ev, "scale", 2)?;
    if scale < 1 {
        return Err(Diagnostic::error(
            "E0301",
            format!("`scale` must be at least 1, found {scale}"),
            a.span_of("scale"),
            "out of range",
        ));
    }
    let mut out = Vec::new();
    for (i, &x) in s.iter().enumerate() {
        let size = if i >= 2 { x.checked_mul(scale as usize) } else { Some(x) };
        out.push(size.ok_or_else(|| {
            Diagnostic::error(
                "E0301",
                format!("`upsample` by {scale} makes axis {i} too large"),
                a.span_of("scale"),
                "overflow",
            )
        })?);
    }
    node(ev, Op::Upsample { scale: scale as usize }, vec![x], d, out, a.span)
}
