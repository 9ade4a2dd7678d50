//! The WGSL of the point-wise functions and their derivatives, of the binary operators, and the
//! helper functions some of them call. Element-wise kernels and fused programs (`mod.rs`) and
//! matmul epilogues build their bodies from these; every expression is tested against the CPU
//! backend (`mgn_ir::pointwise`).

use mgn_ir::op::{BinaryOp, UnaryOp};

/// `f(x)` of a pointwise op in WGSL.
pub(super) fn unary(op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Relu => format!("max({x}, 0.0)"),
        UnaryOp::Gelu => format!("(0.5 * {x} * (1.0 + mgn_erf({x} * 0.70710678118654752)))"),
        UnaryOp::GeluTanh => format!(
            "(0.5 * {x} * (1.0 + tanh(0.79788456080286536 * ({x} + 0.044715 * {x} * {x} * {x}))))"
        ),
        UnaryOp::Silu => format!("({x} / (1.0 + exp(-{x})))"),
        UnaryOp::Sigmoid => format!("(1.0 / (1.0 + exp(-{x})))"),
        UnaryOp::Tanh => format!("tanh({x})"),
        UnaryOp::Exp => format!("exp({x})"),
        UnaryOp::Log => format!("log({x})"),
        UnaryOp::Sqrt => format!("sqrt({x})"),
        UnaryOp::Rsqrt => format!("inverseSqrt({x})"),
        UnaryOp::Abs => format!("abs({x})"),
        UnaryOp::Sin => format!("sin(mgn_reduce({x}))"),
        UnaryOp::Cos => format!("cos(mgn_reduce({x}))"),
        UnaryOp::Square => format!("({x} * {x})"),
        UnaryOp::Erf => format!("mgn_erf_precise({x})"),
        UnaryOp::Log1p => format!("mgn_log1p({x})"),
        UnaryOp::Expm1 => format!("mgn_expm1({x})"),
        UnaryOp::Softplus => format!("(max({x}, 0.0) + mgn_log1p(exp(-abs({x}))))"),
    }
}

/// `f'(x) · dy` of a pointwise op in WGSL.
pub(super) fn unary_grad(op: UnaryOp, x: &str, dy: &str) -> String {
    let d = match op {
        UnaryOp::Neg => "-1.0".to_string(),
        UnaryOp::Relu => format!("select(0.0, 1.0, {x} > 0.0)"),
        UnaryOp::Gelu => format!(
            "(0.5 * (1.0 + mgn_erf({x} * 0.70710678118654752)) + \
             {x} * 0.39894228040143268 * exp(-0.5 * {x} * {x}))"
        ),
        UnaryOp::GeluTanh => {
            // tanh(u) of the forward, and d/dx of its argument.
            let t = format!("tanh(0.79788456080286536 * ({x} + 0.044715 * {x} * {x} * {x}))");
            format!(
                "(0.5 * (1.0 + {t}) + \
                 0.5 * {x} * (1.0 - {t} * {t}) * 0.79788456080286536 * \
                 (1.0 + 0.134145 * {x} * {x}))"
            )
        }
        UnaryOp::Silu => {
            format!("((1.0 / (1.0 + exp(-{x}))) * (1.0 + {x} * (1.0 - 1.0 / (1.0 + exp(-{x})))))")
        }
        UnaryOp::Sigmoid => {
            format!("((1.0 / (1.0 + exp(-{x}))) * (1.0 - 1.0 / (1.0 + exp(-{x}))))")
        }
        UnaryOp::Tanh => format!("(1.0 - tanh({x}) * tanh({x}))"),
        UnaryOp::Exp | UnaryOp::Expm1 => format!("exp({x})"),
        UnaryOp::Log => format!("(1.0 / {x})"),
        UnaryOp::Sqrt => format!("(0.5 / sqrt({x}))"),
        UnaryOp::Rsqrt => format!("(-0.5 * inverseSqrt({x}) / {x})"),
        UnaryOp::Abs => format!("sign({x})"),
        UnaryOp::Sin => format!("cos(mgn_reduce({x}))"),
        UnaryOp::Cos => format!("(-sin(mgn_reduce({x})))"),
        UnaryOp::Square => format!("(2.0 * {x})"),
        UnaryOp::Erf => format!("(1.1283791670955126 * exp(-{x} * {x}))"),
        UnaryOp::Log1p => format!("(1.0 / (1.0 + {x}))"),
        UnaryOp::Softplus => format!("(1.0 / (1.0 + exp(-{x})))"),
    };
    format!("({d} * {dy})")
}

/// `x op y` in WGSL. On floats, `maximum` and `minimum` give NaN when either side is NaN, as
/// the CPU backend (and PyTorch) do; WGSL's `max` and `min` need not.
pub(super) fn binary(op: BinaryOp, x: &str, y: &str, float: bool) -> String {
    let (f, sym) = match op {
        BinaryOp::Add => return format!("({x} + {y})"),
        BinaryOp::Sub => return format!("({x} - {y})"),
        BinaryOp::Mul => return format!("({x} * {y})"),
        BinaryOp::Div => return format!("({x} / {y})"),
        BinaryOp::Maximum => ("max", ">="),
        BinaryOp::Minimum => ("min", "<="),
    };
    if !float {
        return format!("{f}({x}, {y})");
    }
    // Written as a selection rather than `max`, so that NaN (every comparison false) falls to
    // `x + y`, which is NaN.
    format!("select(select({x} + {y}, {y}, {y} {sym} {x}), {x}, {x} {sym} {y})")
}

/// The WGSL helper functions that the expressions of `ops` call, each once.
pub(super) fn helpers(ops: impl IntoIterator<Item = UnaryOp>) -> String {
    let (mut erf, mut precise, mut log1p, mut expm1) = (false, false, false, false);
    let mut reduce = false;
    for op in ops {
        match op {
            UnaryOp::Sin | UnaryOp::Cos => reduce = true,
            UnaryOp::Gelu => erf = true,
            UnaryOp::Erf => (erf, precise) = (true, true),
            UnaryOp::Log1p | UnaryOp::Softplus => log1p = true,
            UnaryOp::Expm1 => expm1 = true,
            _ => {}
        }
    }
    let mut out = String::new();
    let all =
        [(erf, ERF), (precise, ERF_PRECISE), (log1p, LOG1P), (expm1, EXPM1), (reduce, REDUCE)];
    for (used, src) in all {
        if used {
            out += src;
        }
    }
    out
}

/// `x − 2πk` for the whole `k` nearest `x / 2π`: an argument within about [−π, π], the only
/// range where WGSL bounds the error of `sin` and `cos` (2⁻¹¹ absolute); past it NVIDIA's
/// error grows with |x| (sin(300) was 2.4e-5 off on the H200), and sinusoidal embeddings of
/// timesteps and positions reach the thousands. Cody–Waite: 2π = C1 + C2 + C3 with C1 and C2
/// of 8 significant bits, so `k · C1` and `k · C2` are exact for |k| < 2¹⁶ (|x| < 4·10⁵) and
/// the subtractions cancel nothing; the result is within 1.3e-7 of the exact remainder there.
const REDUCE: &str = "fn mgn_reduce(x: f32) -> f32 {
    let k = round(x * 0.15915494);
    return ((x - k * 6.28125) - k * 0.0019378662109375) - k * -2.559031372584286e-6;
}
";

/// erf for f32 (Abramowitz–Stegun 7.1.26, |error| < 1.5e-7), used by exact GELU, where only the
/// absolute error matters (GELU adds it to 1).
const ERF: &str = "fn mgn_erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t \
        + 0.254829592) * t * exp(-x * x);
    return select(-y, y, x >= 0.0);
}
";

/// erf with a small relative error everywhere, for the `erf` op: below |x| = 0.5 its Maclaurin
/// series to x¹⁵ (truncation below 1e-8 relative), where A–S 7.1.26's absolute 1.5e-7 would be
/// a large relative error; above, where |erf| > 0.52, that approximation.
const ERF_PRECISE: &str = "fn mgn_erf_precise(x: f32) -> f32 {
    if (abs(x) >= 0.5) { return mgn_erf(x); }
    let z = x * x;
    let p = 1.1283791670955126 + z * (-0.37612638903183752 + z * (0.11283791670955126 \
        + z * (-0.026866170645131252 + z * (0.0052239776254421878 + z * (-0.00085483270234508529 \
        + z * (0.00012055332981789664 - z * 0.000014925650358406251))))));
    return x * p;
}
";

/// log(1 + x) in f32. log(1 + x) itself loses the low bits of a small x when 1 + x rounds, so
/// below |x| = 0.5 it is 2·atanh(s) with s = x / (2 + x) (no cancellation), summed to s¹⁵
/// (|s| ≤ 1/3: truncation below 2e-9 relative); above, 1 + x is exact enough.
const LOG1P: &str = "fn mgn_log1p(x: f32) -> f32 {
    if (abs(x) >= 0.5) { return log(1.0 + x); }
    let s = x / (2.0 + x);
    let z = s * s;
    let p = 1.0 + z * (0.33333333333333333 + z * (0.2 + z * (0.14285714285714286 \
        + z * (0.11111111111111111 + z * (0.090909090909090909 + z * (0.076923076923076923 \
        + z * 0.066666666666666667))))));
    return 2.0 * s * p;
}
";

/// exp(x) − 1 in f32: below |x| = 0.5 its Maclaurin series to x⁹ (truncation below 5e-10
/// relative), where exp(x) − 1 would cancel; above, that difference loses little.
const EXPM1: &str = "fn mgn_expm1(x: f32) -> f32 {
    if (abs(x) >= 0.5) { return exp(x) - 1.0; }
    return x * (1.0 + x * (0.5 + x * (0.16666666666666667 + x * (0.041666666666666667 \
        + x * (0.0083333333333333333 + x * (0.0013888888888888889 + x * (0.00019841269841269841 \
        + x * (0.000024801587301587302 + x * 0.0000027557319223985891))))))));
}
";
