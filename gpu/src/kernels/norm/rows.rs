//! The row kernel: a norm's forward, input derivative or per-row parameter derivative, one
//! row per `lanes_for(len)` invocations.

use super::{kernel_rows, lanes_for, lit, seg_reduce, strided, Mode, Rows, Stats};
use crate::kernels::{load, store, KernelSource, Operand};
use mgn_ir::op::GradPart;

/// One row per `lanes_for(len)` invocations: the mean, then one pass for the variance with (for
/// derivatives) `Σg` and `Σg·(x − mean)`, then the outputs. `dy` is given for derivatives.
#[allow(clippy::too_many_arguments)]
pub(super) fn row_kernel(
    rows: &Rows,
    x: &Operand,
    dy: Option<&Operand>,
    stats: &Stats,
    eps: f64,
    mode: Mode,
    out: &Operand,
    width: usize,
) -> KernelSource {
    let (len, count) = (rows.len, &rows.count);
    let l = lanes_for(len, width);
    let per = width / l;
    let n = format!("f32({len}u)");
    let mut helpers = format!(
        "fn at(b: u32, t: u32) -> u32 {{\n    return {};\n}}\n\
         fn prm(b: u32, t: u32) -> u32 {{\n    return {};\n}}\n",
        (rows.index)("b", "t"),
        (rows.param)("b", "t")
    );
    let mut body = format!(
        "let lane = tid % {l}u;
    let b = wid * {per}u + tid / {l}u;
    let valid = b < {count};
    let bc = min(b, max({count}, 1u) - 1u);
    "
    );
    if let Mode::Forward { post: Some(post), .. } = &mode {
        helpers += post;
    }
    let bias = matches!(mode, Mode::Param(GradPart::Bias));
    let center = matches!(stats, Stats::Batch { center: true });
    match stats {
        Stats::Batch { center: true } if !bias => {
            body += &strided("s1", "lane", l, len, "valid", |t| {
                format!("vec4<f32>({}, 0.0, 0.0, 0.0)", load(x, &format!("at(b, {t})")))
            });
            body += &seg_reduce("r1", "s1", "lane", l, 1);
            body += &format!("let m = r1.x / {n};\n    ");
        }
        Stats::Given { mean, .. } => body += &format!("let m = {mean};\n    "),
        _ => body += "let m = 0.0;\n    ",
    }
    // The derivative's `g` of element `e` (in row `b` at `t`).
    let g = |e: &str, t: &str| match &mode {
        Mode::Input { w: Some(w) } => Some(format!(
            "{} * {}",
            load(dy.expect("derivatives have dy"), e),
            load(w, &format!("prm(b, {t})"))
        )),
        Mode::Input { w: None } | Mode::Param(_) => Some(load(dy.expect("derivatives have dy"), e)),
        Mode::Forward { .. } => None,
    };
    let batch = matches!(stats, Stats::Batch { .. });
    if batch || g("e", "t").is_some() {
        let sq = if batch && !bias { "d * d" } else { "0.0" };
        let d = if bias { "0.0".to_string() } else { format!("{} - m", load(x, "e")) };
        let gv = g("e", "t").unwrap_or("0.0".into());
        helpers += &format!(
            "fn p2(b: u32, t: u32, m: f32) -> vec4<f32> {{
    let e = at(b, t);
    let d = {d};
    let g = {gv};
    return vec4<f32>({sq}, g, g * d, 0.0);
}}
"
        );
        body += &strided("s2", "lane", l, len, "valid", |t| format!("p2(b, {t}, m)"));
        body += &seg_reduce("r2", "s2", "lane", l, 1);
    }
    match stats {
        Stats::Batch { .. } => {
            body += &format!("let rstd = 1.0 / sqrt(r2.x / {n} + {});\n    ", lit(eps))
        }
        Stats::Given { var, .. } => {
            body += &format!("let rstd = 1.0 / sqrt({var} + {});\n    ", lit(eps))
        }
    }
    body += &row_outputs(&mode, x, g("e", "t"), center, (len, l), out);
    kernel_rows(width, per, count, &helpers, &body)
}

/// WGSL writing a row's results once its `m`, `rstd` and sums `r2` are known: each element's
/// output (forward, input derivative with `gi`, the element's `g`), or the row's one value
/// (weight or bias). `l` invocations share a row of `len`.
fn row_outputs(
    mode: &Mode,
    x: &Operand,
    gi: Option<String>,
    center: bool,
    (len, l): (usize, usize),
    out: &Operand,
) -> String {
    let n = format!("f32({len}u)");
    let each = |value: &str| {
        format!(
            "if (valid) {{\n        \
             for (var t = lane; t < {len}u; t = t + {l}u) {{\n            \
             let e = at(b, t);\n            {}\n        }}\n    }}",
            store(out, "e", value)
        )
    };
    match mode {
        Mode::Forward { w, b, post } => {
            let mut y = format!("({} - m) * rstd", load(x, "e"));
            if let Some(w) = w {
                y = format!("{y} * {}", load(w, "prm(b, t)"));
            }
            if let Some(bias) = b {
                y = format!("{y} + {}", load(bias, "prm(b, t)"));
            }
            if post.is_some() {
                y = format!("mgn_epilogue(e, {y})");
            }
            each(&y)
        }
        Mode::Input { .. } => {
            let mg = if center { format!("r2.y / {n}") } else { "0.0".into() };
            let gi = gi.expect("derivatives have dy");
            format!("let mg = {mg};\n    let mgx = r2.z * rstd / {n};\n    ")
                + &each(&format!("rstd * ({gi} - mg - ({} - m) * rstd * mgx)", load(x, "e")))
        }
        Mode::Param(part) => {
            let v = if *part == GradPart::Bias { "r2.y" } else { "r2.z * rstd" };
            format!("if (valid && lane == 0u) {{\n        {}\n    }}", store(out, "b", v))
        }
    }
}
