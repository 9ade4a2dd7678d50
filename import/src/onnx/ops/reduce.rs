//! Reductions, softmax and scans.

use super::{norm_axis, Lower, R};
use crate::onnx::graph::Node;
use crate::onnx::value::{Dt, Run, Sym};

const OPS: &[&str] = &[
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "Softmax",
    "LogSoftmax",
    "ArgMax",
    "ArgMin",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "CumSum",
];

pub fn handles(op: &str) -> bool {
    OPS.contains(&op)
}

pub fn lower(cx: &mut Lower, n: &Node) -> R<Run> {
    match n.op.as_str() {
        "Softmax" | "LogSoftmax" => softmax(cx, n),
        "ArgMax" | "ArgMin" => arg(cx, n),
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = cx.run(n, 0)?;
            if x.rank() < 3 {
                return Err("its input has fewer than 3 axes".into());
            }
            let axes: Vec<usize> = (2..x.rank()).collect();
            let f = if n.op == "GlobalAveragePool" { "mean" } else { "max" };
            reduce_axes(cx, x, f, &axes, true)
        }
        "CumSum" => cumsum(cx, n),
        _ => reduce(cx, n),
    }
}

fn reduce(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    // Axes moved from an attribute to an input: ReduceSum at opset 13, the others at 18.
    let input_axes = if n.op == "ReduceSum" { cx.g.opset >= 13 } else { cx.g.opset >= 18 };
    let axes = if input_axes {
        cx.ints_in(n, 1, "axes")?.map(|v| v.iter().map(|s| s.v).collect::<Vec<i64>>())
    } else {
        n.ints("axes")
    };
    let keep = n.int("keepdims", 1) != 0;
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&a| norm_axis(a, x.rank())).collect::<R<_>>()?,
        _ if n.int("noop_with_empty_axes", 0) != 0 => return Ok(x),
        _ => (0..x.rank()).collect(),
    };
    let f = match n.op.as_str() {
        "ReduceMean" => "mean",
        "ReduceSum" => "sum",
        "ReduceMax" => "max",
        _ => "min",
    };
    if f == "mean" && !x.dt.is_float() {
        return Err("the mean of integers: mgn averages floats only".into());
    }
    reduce_axes(cx, x, f, &axes, keep)
}

pub fn reduce_axes(cx: &mut Lower, x: Run, f: &str, axes: &[usize], keep: bool) -> R<Run> {
    let mut shape = Vec::new();
    for (i, d) in x.shape.iter().enumerate() {
        if !axes.contains(&i) {
            shape.push(d.clone());
        } else if keep {
            shape.push(Sym::lit(1));
        }
    }
    let list: Vec<String> = axes.iter().map(ToString::to_string).collect();
    let axis = if list.len() == 1 { list[0].clone() } else { format!("[{}]", list.join(", ")) };
    let keep = if keep { ", keepdim = true" } else { "" };
    Ok(cx.bind(f, format!("{f}({}, axis = {axis}{keep})", x.expr), x.dt, shape))
}

fn softmax(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let default = if cx.g.opset >= 13 { -1 } else { 1 };
    let axis = norm_axis(n.int("axis", default), x.rank())?;
    if cx.g.opset < 13 && axis != x.rank() - 1 {
        // Before opset 13 the input is flattened to 2-D at `axis`: a softmax over several axes.
        return Err(format!(
            "before opset 13 a softmax at axis {axis} of a rank-{} tensor spans several axes",
            x.rank()
        ));
    }
    let f = if n.op == "Softmax" { "softmax" } else { "log_softmax" };
    let arg = if axis == x.rank() - 1 { String::new() } else { format!(", axis = {axis}") };
    Ok(cx.bind(f, format!("{f}({}{arg})", x.expr), x.dt, x.shape))
}

fn arg(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    if n.int("select_last_index", 0) != 0 {
        return Err("select_last_index = 1: mgn's argmax picks the first".into());
    }
    let axis = norm_axis(n.int("axis", 0), x.rank())?;
    let src = if n.op == "ArgMax" { x.expr.clone() } else { format!("-{}", x.expr) };
    let mut shape = x.shape.clone();
    shape.remove(axis);
    let mut r =
        cx.bind("argmax", format!("cast(argmax({src}, axis = {axis}), i64)"), Dt::I64, shape);
    if n.int("keepdims", 1) != 0 {
        let mut s = r.shape.clone();
        s.insert(axis, Sym::lit(1));
        r = cx.bind("argmax", format!("unsqueeze({}, {axis})", r.expr), Dt::I64, s);
    }
    Ok(r)
}

fn cumsum(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let a = cx.konst_in(n, 1, "axis")?;
    let a = a.static_ints().filter(|v| v.len() == 1).ok_or("its axis is not one number")?[0];
    let axis = norm_axis(a, x.rank())?;
    if n.int("exclusive", 0) != 0 {
        return Err("exclusive = 1: mgn's cumsum includes each element".into());
    }
    let rev = if n.int("reverse", 0) != 0 { ", reverse = true" } else { "" };
    Ok(cx.bind("cumsum", format!("cumsum({}, axis = {axis}{rev})", x.expr), x.dt, x.shape))
}
