//! Element-wise ops: activations, arithmetic with NumPy broadcasting, comparisons, selection,
//! casts and clipping.

use super::{broadcast, Lower, R};
use crate::onnx::graph::Node;
use crate::onnx::value::{float_text, Dt, Run, Val};

const UNARY: &[(&str, &str)] = &[
    ("Relu", "relu"),
    ("Sigmoid", "sigmoid"),
    ("Tanh", "tanh"),
    ("Exp", "exp"),
    ("Log", "log"),
    ("Sqrt", "sqrt"),
    ("Abs", "abs"),
    ("Erf", "erf"),
    ("Sin", "sin"),
    ("Cos", "cos"),
    ("Softplus", "softplus"),
    ("Mish", "mish"),
    ("HardSwish", "hardswish"),
];

/// ONNX's binary ops written as an operator.
pub(crate) const BINARY: &[(&str, &str)] = &[
    ("Add", "+"),
    ("Sub", "-"),
    ("Mul", "*"),
    ("Div", "/"),
    ("Equal", "=="),
    ("Less", "<"),
    ("Greater", ">"),
    ("LessOrEqual", "<="),
    ("GreaterOrEqual", ">="),
    ("And", "&&"),
    ("Or", "||"),
];

const OTHER: &[&str] = &[
    "Neg",
    "Not",
    "Reciprocal",
    "Pow",
    "Cast",
    "CastLike",
    "Where",
    "Clip",
    "Max",
    "Min",
    "Sum",
    "Gelu",
    "HardSigmoid",
    "LeakyRelu",
    "Elu",
    "PRelu",
];

pub fn handles(op: &str) -> bool {
    UNARY.iter().any(|(o, _)| *o == op)
        || BINARY.iter().any(|(o, _)| *o == op)
        || OTHER.contains(&op)
}

pub fn lower(cx: &mut Lower, n: &Node) -> R<Run> {
    let op = n.op.as_str();
    if let Some((_, f)) = UNARY.iter().find(|(o, _)| *o == op) {
        let x = float_in(cx, n, 0)?;
        if matches!(*f, "mish" | "hardswish") {
            cx.uses.insert(format!("nn.{f}"));
        }
        return Ok(cx.bind(f, format!("{f}({})", x.expr), x.dt, x.shape));
    }
    if let Some((_, sym)) = BINARY.iter().find(|(o, _)| *o == op) {
        return binary(cx, n, 0, 1, sym);
    }
    match op {
        "Neg" => {
            let x = cx.run(n, 0)?;
            Ok(cx.bind("neg", format!("-{}", x.expr), x.dt, x.shape))
        }
        "Not" => {
            let x = cx.run(n, 0)?;
            Ok(cx.bind("not", format!("!{}", x.expr), x.dt, x.shape))
        }
        "Reciprocal" => {
            let x = float_in(cx, n, 0)?;
            Ok(cx.bind("recip", format!("1.0 / {}", x.expr), x.dt, x.shape))
        }
        "Pow" => pow(cx, n),
        "Cast" | "CastLike" => cast(cx, n),
        "Where" => select(cx, n),
        "Clip" => clip(cx, n),
        "Max" | "Min" | "Sum" => variadic(cx, n),
        _ => activation(cx, n),
    }
}

fn float_in(cx: &mut Lower, n: &Node, i: usize) -> R<Run> {
    let x = cx.run(n, i)?;
    if !x.dt.is_float() {
        return Err(format!(
            "its input is {}; mgn computes this function on floats only",
            x.dt.onnx_name()
        ));
    }
    Ok(x)
}

/// One operand of a binary op: a one-element constant that does not widen the result becomes a
/// number, anything else a tensor.
fn operand(cx: &mut Lower, n: &Node, i: usize, other_rank: usize) -> R<(String, Option<Run>)> {
    let name = n.input(i).ok_or("a required input is missing")?;
    if let Val::Const(c) = cx.val(name)? {
        if c.numel() == 1 && c.shape.len() <= other_rank && !cx.names.contains_key(name) {
            if let Some(t) = c.scalar_text() {
                if c.dt != Dt::Bool {
                    return Ok((t, None));
                }
            }
        }
    }
    let r = cx.run(n, i)?;
    Ok((r.expr.clone(), Some(r)))
}

fn rank_of(cx: &Lower, n: &Node, i: usize) -> R<usize> {
    Ok(cx.shape_of(n, i)?.len())
}

pub fn binary(cx: &mut Lower, n: &Node, a: usize, b: usize, sym: &str) -> R<Run> {
    let (ra, rb) = (rank_of(cx, n, a)?, rank_of(cx, n, b)?);
    let (ta, xa) = operand(cx, n, a, rb)?;
    let (tb, xb) = operand(cx, n, b, ra)?;
    let (dt, shape) = match (&xa, &xb) {
        (Some(x), Some(y)) => (x.dt, broadcast(&x.shape, &y.shape)?),
        (Some(x), None) | (None, Some(x)) => (x.dt, x.shape.clone()),
        (None, None) => unreachable!("two constants fold before lowering"),
    };
    if sym == "/" && !dt.is_float() {
        return Err("integer division of run-time tensors: mgn divides integers only when the \
                    model is built"
            .into());
    }
    if matches!(sym, "&&" | "||") != (dt == Dt::Bool) {
        return Err(format!("on {} tensors, which mgn does not compute this on", dt.onnx_name()));
    }
    let out = if matches!(sym, "==" | "<" | ">" | "<=" | ">=") { Dt::Bool } else { dt };
    let hint = n.op.to_ascii_lowercase();
    Ok(cx.bind(&hint, format!("{ta} {sym} {tb}"), out, shape))
}

fn pow(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = float_in(cx, n, 0)?;
    let c = cx.konst_in(n, 1, "exponent")?;
    let p = match (c.numel(), c.floats(), c.static_ints()) {
        (1, Some(f), _) => f64::from(f[0]),
        (1, _, Some(i)) => i[0] as f64,
        _ => return Err("its exponent is not one number".into()),
    };
    let expr = if p == 2.0 {
        format!("square({})", x.expr)
    } else if p == 1.0 {
        x.expr.clone()
    } else if p == 0.5 {
        format!("sqrt({})", x.expr)
    } else {
        format!("pow({}, {})", x.expr, float_text(p as f32).ok_or("its exponent is not finite")?)
    };
    Ok(cx.bind("pow", expr, x.dt, x.shape))
}

fn cast(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let to = if n.op == "CastLike" {
        match cx.val(n.input(1).ok_or("no target")?)? {
            Val::Const(c) => c.dt,
            Val::Run(r) => r.dt,
        }
    } else {
        let code = n.int("to", 0) as i32;
        Dt::from_onnx(code).ok_or_else(|| {
            format!("it casts to {}, which mgn has no type for", crate::onnx::proto::dt_name(code))
        })?
    };
    let name = to.mgn().ok_or_else(|| {
        format!("it casts to {}, which mgn has no tensor type for", to.onnx_name())
    })?;
    if to == x.dt {
        return Ok(x);
    }
    if to == Dt::Bool {
        // `bool` is no value in mgn; a cast to it is a comparison with zero.
        let zero = if x.dt.is_float() { "0.0" } else { "0" };
        return Ok(cx.bind("nonzero", format!("{} != {zero}", x.expr), to, x.shape));
    }
    Ok(cx.bind("cast", format!("cast({}, {name})", x.expr), to, x.shape))
}

fn select(cx: &mut Lower, n: &Node) -> R<Run> {
    let c = cx.run(n, 0)?;
    let ra = rank_of(cx, n, 1)?.max(c.rank());
    let (ta, xa) = operand(cx, n, 1, ra)?;
    let (tb, xb) = operand(cx, n, 2, ra)?;
    let (ta, xa) = match (&xa, &xb) {
        // Two numbers would make an f32 or i32 tensor: keep the ONNX type with a tensor.
        (None, None) => {
            let r = cx.run(n, 1)?;
            (r.expr.clone(), Some(r))
        }
        _ => (ta, xa),
    };
    let x = xa.as_ref().or(xb.as_ref()).expect("one side is a tensor");
    let mut shape = broadcast(&c.shape, &x.shape)?;
    if let (Some(a), Some(b)) = (&xa, &xb) {
        shape = broadcast(&shape, &broadcast(&a.shape, &b.shape)?)?;
    }
    let dt = x.dt;
    Ok(cx.bind("select", format!("where({}, {ta}, {tb})", c.expr), dt, shape))
}

fn bound(cx: &mut Lower, n: &Node, i: usize, attr: &str) -> R<Option<String>> {
    if cx.g.opset < 11 {
        return Ok(n.attrs.contains_key(attr).then(|| float_text(n.float(attr, 0.0))).flatten());
    }
    if n.input(i).is_none() {
        return Ok(None);
    }
    let c = cx.konst_in(n, i, attr)?;
    c.scalar_text().map(Some).ok_or_else(|| format!("its {attr} is not one finite number"))
}

fn clip(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let lo = bound(cx, n, 1, "min")?;
    let hi = bound(cx, n, 2, "max")?;
    let args: Vec<String> = [lo.map(|v| format!("min = {v}")), hi.map(|v| format!("max = {v}"))]
        .into_iter()
        .flatten()
        .collect();
    if args.is_empty() {
        return Ok(x);
    }
    if lo_hi_relu6(&args) {
        cx.uses.insert("nn.relu6".into());
        return Ok(cx.bind("relu6", format!("relu6({})", x.expr), x.dt, x.shape));
    }
    Ok(cx.bind("clip", format!("clamp({}, {})", x.expr, args.join(", ")), x.dt, x.shape))
}

fn lo_hi_relu6(args: &[String]) -> bool {
    args == ["min = 0.0", "max = 6.0"]
}

fn variadic(cx: &mut Lower, n: &Node) -> R<Run> {
    let f = match n.op.as_str() {
        "Max" => "maximum",
        "Min" => "minimum",
        _ => "",
    };
    let count = n.inputs.iter().filter(|s| !s.is_empty()).count();
    let mut acc = cx.run(n, 0)?;
    for i in 1..count {
        let y = cx.run(n, i)?;
        let shape = broadcast(&acc.shape, &y.shape)?;
        let expr = if f.is_empty() {
            format!("{} + {}", acc.expr, y.expr)
        } else {
            format!("{f}({}, {})", acc.expr, y.expr)
        };
        acc = cx.bind(&n.op.to_ascii_lowercase(), expr, acc.dt, shape);
    }
    Ok(acc)
}

fn activation(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = float_in(cx, n, 0)?;
    let f = |v: f32| float_text(v).ok_or_else(|| "an attribute is not finite".to_string());
    let (hint, expr) = match n.op.as_str() {
        "Gelu" => match n.string("approximate").as_deref().unwrap_or("none") {
            "none" => ("gelu", format!("gelu({})", x.expr)),
            "tanh" => ("gelu", format!("gelu_tanh({})", x.expr)),
            a => return Err(format!("approximate = \"{a}\" is not a GELU mgn has")),
        },
        "HardSigmoid" => {
            let (a, b) = (n.float("alpha", 0.2), n.float("beta", 0.5));
            ("hardsigmoid", format!("clamp({} * {} + {}, 0.0, 1.0)", f(a)?, x.expr, f(b)?))
        }
        "LeakyRelu" => {
            cx.uses.insert("nn.leaky_relu".into());
            (
                "leaky_relu",
                format!("leaky_relu({}, slope = {})", x.expr, f(n.float("alpha", 0.01))?),
            )
        }
        "Elu" => {
            cx.uses.insert("nn.elu".into());
            ("elu", format!("elu({}, alpha = {})", x.expr, f(n.float("alpha", 1.0))?))
        }
        "PRelu" => {
            let s = cx.run(n, 1)?;
            let shape = broadcast(&x.shape, &s.shape)?;
            let e = format!("where({} > 0.0, {}, {} * {})", x.expr, x.expr, s.expr, x.expr);
            return Ok(cx.bind("prelu", e, x.dt, shape));
        }
        _ => return Err("mgn has no translation for this op".into()),
    };
    Ok(cx.bind(hint, expr, x.dt, x.shape))
}
