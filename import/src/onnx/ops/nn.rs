//! Network ops: products, convolutions, pooling, normalization, padding and resizing, and the
//! std layers recognised for them (`Linear`, `Conv2d`, `BatchNorm2d`, `LayerNorm`,
//! `Embedding`).

use super::{broadcast, norm_axis, Lower, R};
use crate::onnx::graph::Node;
use crate::onnx::layers::{transpose, Claim, Kind};
use crate::onnx::value::{float_text, Const, Dt, Run, Sym};

const OPS: &[&str] = &[
    "MatMul",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "BatchNormalization",
    "LayerNormalization",
    "InstanceNormalization",
    "Pad",
    "Resize",
    "Einsum",
];

pub fn handles(op: &str) -> bool {
    OPS.contains(&op)
}

pub fn lower(cx: &mut Lower, n: &Node) -> R<Run> {
    match n.op.as_str() {
        "MatMul" => matmul(cx, n),
        "Gemm" => gemm(cx, n),
        "Conv" | "ConvTranspose" => conv(cx, n, None),
        "MaxPool" | "AveragePool" => pool(cx, n),
        "BatchNormalization" => Err("its statistics or scale are not initializers of their own \
                                      (mgn's batch_norm keeps them as buffers)"
            .into()),
        "LayerNormalization" => layer_norm(cx, n, None),
        "InstanceNormalization" => instance_norm(cx, n),
        "Pad" => pad(cx, n),
        "Resize" => resize(cx, n),
        _ => einsum(cx, n),
    }
}

fn init(cx: &Lower, name: &Option<String>) -> Option<Const> {
    cx.g.inits.get(name.as_deref()?).cloned()
}

/// A node that became a std layer: declares the layer and calls it.
pub fn claimed(cx: &mut Lower, n: &Node, c: &Claim) -> R<Option<Run>> {
    let w = init(cx, &c.inits[0]).ok_or("its weight is missing")?;
    let b = c.inits.get(1).and_then(|b| init(cx, b));
    match c.kind {
        Kind::Conv => conv(cx, n, Some(c)).map(Some),
        Kind::Linear => {
            let x = cx.run(n, 0)?;
            let w = if c.transposed { transpose(&w) } else { w };
            let (out, inf) = (w.shape[0], w.shape[1]);
            if x.shape.last().map(|d| d.v) != Some(inf as i64) {
                return Err(format!(
                    "its input has {} features, its weight {inf}",
                    x.shape.last().map_or(0, |d| d.v)
                ));
            }
            let call = if b.is_some() {
                format!("Linear({inf}, {out})")
            } else {
                format!("Linear({inf}, {out}, bias = false)")
            };
            let mut tensors = vec![("weight".to_string(), w)];
            tensors.extend(b.map(|b| ("bias".to_string(), b)));
            cx.uses.insert("nn.Linear".into());
            let f = cx.fields.layer(&c.path, call, tensors);
            let mut s = x.shape.clone();
            *s.last_mut().expect("rank >= 1") = Sym::lit(out as i64);
            Ok(Some(cx.bind(&hint(&c.path), format!("{f}({})", x.expr), x.dt, s)))
        }
        Kind::BatchNorm => batch_norm(cx, n, c).map(Some),
        Kind::LayerNorm => layer_norm(cx, n, Some(c)).map(Some),
        Kind::Embedding => {
            let ids = cx.run(n, 1)?;
            let ids_expr = if ids.dt == Dt::I32 {
                ids.expr.clone()
            } else {
                format!("cast({}, i32)", ids.expr)
            };
            let (num, d) = (w.shape[0], w.shape[1]);
            cx.uses.insert("nn.Embedding".into());
            let f = cx.fields.layer(
                &c.path,
                format!("Embedding({num}, {d})"),
                vec![("weight".into(), w)],
            );
            let mut s = ids.shape.clone();
            s.push(Sym::lit(d as i64));
            Ok(Some(cx.bind(&hint(&c.path), format!("{f}({ids_expr})"), Dt::F32, s)))
        }
    }
}

/// A `let` name from a module path: `encoder.layer.0.attention.self.query` → `query`.
fn hint(path: &str) -> String {
    let seg = path.rsplit('.').find(|s| !s.chars().all(|c| c.is_ascii_digit())).unwrap_or("h");
    seg.to_ascii_lowercase()
}

fn matmul(cx: &mut Lower, n: &Node) -> R<Run> {
    let a = cx.run(n, 0)?;
    let b = cx.run(n, 1)?;
    if !a.dt.is_float() {
        return Err(format!("a product of {} tensors", a.dt.onnx_name()));
    }
    let (ra, rb) = (a.rank(), b.rank());
    let mut s = match (ra, rb) {
        (1, 1) => vec![],
        (1, _) => {
            let mut s = b.shape[..rb - 2].to_vec();
            s.push(b.shape[rb - 1].clone());
            s
        }
        (_, 1) => a.shape[..ra - 1].to_vec(),
        _ => {
            let mut s = broadcast(&a.shape[..ra - 2], &b.shape[..rb - 2])?;
            s.push(a.shape[ra - 2].clone());
            s.push(b.shape[rb - 1].clone());
            s
        }
    };
    if s.is_empty() {
        s = vec![];
    }
    Ok(cx.bind("product", format!("{} @ {}", a.expr, b.expr), a.dt, s))
}

fn gemm(cx: &mut Lower, n: &Node) -> R<Run> {
    let a = cx.run(n, 0)?;
    let b = cx.run(n, 1)?;
    let ta = if n.int("transA", 0) != 0 { "^T" } else { "" };
    let tb = if n.int("transB", 0) != 0 { "^T" } else { "" };
    let m = if ta.is_empty() { a.shape[0].clone() } else { a.shape[1].clone() };
    let k = if tb.is_empty() { b.shape[1].clone() } else { b.shape[0].clone() };
    let s = vec![m, k];
    let (alpha, beta) = (n.float("alpha", 1.0), n.float("beta", 1.0));
    let mut e = format!("{}{ta} @ {}{tb}", a.expr, b.expr);
    if alpha != 1.0 {
        e = format!("{} * ({e})", float_text(alpha).ok_or("alpha is not finite")?);
    }
    if n.input(2).is_some() && beta != 0.0 {
        let c = cx.run(n, 2)?;
        broadcast(&s, &c.shape)?;
        let c = if beta == 1.0 {
            c.expr
        } else {
            format!("{} * {}", float_text(beta).ok_or("beta is not finite")?, c.expr)
        };
        e = format!("{e} + {c}");
    }
    Ok(cx.bind("gemm", e, a.dt, s))
}

/// `pads` as one symmetric padding per spatial axis, or the reason it is not.
fn sym_pads(n: &Node, k: usize) -> R<Vec<i64>> {
    match n.string("auto_pad").as_deref().unwrap_or("NOTSET") {
        "NOTSET" | "VALID" => {}
        a => {
            return Err(format!(
                "auto_pad = {a}: write the padding out when exporting (mgn pads explicitly)"
            ))
        }
    }
    let p = n.ints("pads").unwrap_or_else(|| vec![0; 2 * k]);
    if p.len() != 2 * k || p[..k] != p[k..] {
        return Err(format!("its padding {p:?} differs between the start and the end of an axis"));
    }
    Ok(p[..k].to_vec())
}

/// One value per axis as `.mgn` text: `2` when equal, `(2, 1)` otherwise.
fn per_axis(v: &[i64]) -> String {
    if v.iter().all(|&x| x == v[0]) {
        v[0].to_string()
    } else {
        let s: Vec<String> = v.iter().map(ToString::to_string).collect();
        format!("({})", s.join(", "))
    }
}

fn conv_out(i: i64, k: i64, s: i64, p: i64, d: i64) -> i64 {
    (i + 2 * p - d * (k - 1) - 1).div_euclid(s) + 1
}

fn conv(cx: &mut Lower, n: &Node, claim: Option<&Claim>) -> R<Run> {
    let x = cx.run(n, 0)?;
    let wshape = cx.shape_of(n, 1)?;
    let k = x.rank().checked_sub(2).filter(|k| matches!(k, 1 | 2)).ok_or_else(|| {
        format!("a convolution over {} axes (mgn has 1-D and 2-D)", x.rank() as i64 - 2)
    })?;
    let kernel: Vec<i64> = wshape[2..].iter().map(|d| d.v).collect();
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; k]);
    let dil = n.ints("dilations").unwrap_or_else(|| vec![1; k]);
    let pads = sym_pads(n, k)?;
    let groups = n.int("group", 1);
    let transposed = n.op == "ConvTranspose";
    let opad = n.ints("output_padding").unwrap_or_else(|| vec![0; k]);
    if transposed && n.ints("output_shape").is_some() {
        return Err("output_shape is given: export with explicit padding instead".into());
    }
    let cout = if transposed { wshape[1].v * groups } else { wshape[0].v };
    let mut s = vec![x.shape[0].clone(), Sym::lit(cout)];
    for a in 0..k {
        let i = &x.shape[2 + a];
        if !i.is_static() {
            return Err("a convolution over a dynamic spatial axis".into());
        }
        let o = if transposed {
            (i.v - 1) * strides[a] - 2 * pads[a] + dil[a] * (kernel[a] - 1) + opad[a] + 1
        } else {
            conv_out(i.v, kernel[a], strides[a], pads[a], dil[a])
        };
        s.push(Sym::lit(o));
    }
    let mut opts = Vec::new();
    let mut opt = |name: &str, v: &[i64], default: i64| {
        if v.iter().any(|&x| x != default) {
            opts.push(format!("{name} = {}", per_axis(v)));
        }
    };
    opt("stride", &strides, 1);
    opt("padding", &pads, 0);
    if transposed {
        opt("output_padding", &opad, 0);
    }
    opt("dilation", &dil, 1);
    opt("groups", &[groups], 1);
    let d = if k == 1 { "1d" } else { "2d" };
    if let (Some(c), false) = (claim, transposed) {
        let w = init(cx, &c.inits[0]).ok_or("no weight")?;
        let b = c.inits.get(1).and_then(|b| init(cx, b));
        let cin = x.shape[1].v;
        let mut args = vec![cin.to_string(), cout.to_string(), per_axis(&kernel)];
        args.extend(opts);
        if b.is_none() {
            args.push("bias = false".into());
        }
        let mut tensors = vec![("weight".to_string(), w)];
        tensors.extend(b.map(|b| ("bias".to_string(), b)));
        cx.uses.insert(format!("nn.Conv{d}"));
        let f = cx.fields.layer(&c.path, format!("Conv{d}({})", args.join(", ")), tensors);
        return Ok(cx.bind(&hint(&c.path), format!("{f}({})", x.expr), x.dt, s));
    }
    let w = cx.run(n, 1)?;
    let mut args = vec![x.expr.clone(), w.expr.clone()];
    if n.input(2).is_some() {
        args.push(cx.run(n, 2)?.expr);
    }
    args.extend(opts);
    let f = if transposed { format!("conv_transpose{d}") } else { format!("conv{d}") };
    Ok(cx.bind("conv", format!("{f}({})", args.join(", ")), x.dt, s))
}

fn pool(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let k = x
        .rank()
        .checked_sub(2)
        .filter(|k| matches!(k, 1 | 2))
        .ok_or("pooling over other than 1 or 2 axes")?;
    let kernel = n.ints("kernel_shape").ok_or("no kernel_shape")?;
    let strides = n.ints("strides").unwrap_or_else(|| vec![1; k]);
    let pads = sym_pads(n, k)?;
    if n.ints("dilations").is_some_and(|d| d.iter().any(|&v| v != 1)) {
        return Err("dilated pooling".into());
    }
    if n.outputs.get(1).is_some_and(|o| !o.is_empty()) {
        return Err("its indices output is used".into());
    }
    if n.op == "AveragePool" && pads.iter().any(|&p| p > 0) && n.int("count_include_pad", 0) == 0 {
        return Err("count_include_pad = 0 with padding: mgn's average counts the padding".into());
    }
    let mut s = x.shape[..2].to_vec();
    for a in 0..k {
        let i = x.shape[2 + a].v;
        let floor = conv_out(i, kernel[a], strides[a], pads[a], 1);
        if n.int("ceil_mode", 0) != 0 {
            let ceil = (i + 2 * pads[a] - kernel[a] + strides[a] - 1).div_euclid(strides[a]) + 1;
            let ceil = if (ceil - 1) * strides[a] >= i + pads[a] { ceil - 1 } else { ceil };
            if ceil != floor {
                return Err("ceil_mode = 1 adds a window here; mgn pools with floor".into());
            }
        }
        s.push(Sym::lit(floor));
    }
    let f = if n.op == "MaxPool" { "max_pool" } else { "avg_pool" };
    let mut args = vec![x.expr.clone(), per_axis(&kernel)];
    if strides != kernel {
        args.push(format!("stride = {}", per_axis(&strides)));
    }
    if pads.iter().any(|&p| p != 0) {
        args.push(format!("padding = {}", per_axis(&pads)));
    }
    Ok(cx.bind("pooled", format!("{f}{k}d({})", args.join(", ")), x.dt, s))
}

fn batch_norm(cx: &mut Lower, n: &Node, c: &Claim) -> R<Run> {
    let x = cx.run(n, 0)?;
    if n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return Err("its running statistics outputs are used (a training-mode export)".into());
    }
    let ch = x.shape.get(1).map(|d| d.v).ok_or("a rank-1 input")?;
    let layer = match x.rank() {
        4 => "BatchNorm2d",
        2 | 3 => "BatchNorm1d",
        r => return Err(format!("batch norm over a rank-{r} input")),
    };
    let mut args = vec![ch.to_string()];
    let eps = n.float("epsilon", 1e-5);
    if eps != 1e-5 {
        args.push(format!("eps = {}", float_text(eps).ok_or("epsilon is not finite")?));
    }
    let m = n.float("momentum", 0.9);
    if m != 0.9 {
        args.push(format!("momentum = {}", float_text(1.0 - m).ok_or("momentum")?));
    }
    let names = ["weight", "bias", "running_mean", "running_var"];
    let tensors: Vec<(String, Const)> = names
        .iter()
        .zip(&c.inits)
        .filter_map(|(r, i)| Some((r.to_string(), init(cx, i)?)))
        .collect();
    cx.uses.insert(format!("nn.{layer}"));
    let f = cx.fields.layer(&c.path, format!("{layer}({})", args.join(", ")), tensors);
    Ok(cx.bind(&hint(&c.path), format!("{f}({})", x.expr), x.dt, x.shape))
}

fn layer_norm(cx: &mut Lower, n: &Node, c: Option<&Claim>) -> R<Run> {
    let x = cx.run(n, 0)?;
    let axis = norm_axis(n.int("axis", -1), x.rank())?;
    if axis != x.rank() - 1 && c.is_none() {
        return layer_norm_axes(cx, n, x, axis);
    }
    if n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return Err("its mean or inverse deviation output is used".into());
    }
    let eps = n.float("epsilon", 1e-5);
    let eps_text = float_text(eps).ok_or("epsilon is not finite")?;
    let d = x.shape.last().map(|d| d.v).unwrap_or(1);
    if let Some(c) = c {
        let mut args = vec![d.to_string()];
        if eps != 1e-5 {
            args.push(format!("eps = {eps_text}"));
        }
        let w = init(cx, &c.inits[0]).ok_or("no scale")?;
        let mut tensors = vec![("weight".to_string(), w)];
        match c.inits.get(1).and_then(|b| init(cx, b)) {
            Some(b) => tensors.push(("bias".to_string(), b)),
            None => return Err("a layer norm without a bias".into()),
        }
        cx.uses.insert("nn.LayerNorm".into());
        let f = cx.fields.layer(&c.path, format!("LayerNorm({})", args.join(", ")), tensors);
        return Ok(cx.bind(&hint(&c.path), format!("{f}({})", x.expr), x.dt, x.shape));
    }
    let w = cx.run(n, 1)?;
    let b = if n.input(2).is_some() { format!(", {}", cx.run(n, 2)?.expr) } else { String::new() };
    let e = format!("layer_norm({}, {}{b}, eps = {eps_text})", x.expr, w.expr);
    Ok(cx.bind("normed", e, x.dt, x.shape))
}

/// A layer norm over the axes from `axis` on: those axes merged into one, normalized, split
/// again (the scale and bias merged alike).
fn layer_norm_axes(cx: &mut Lower, n: &Node, x: Run, axis: usize) -> R<Run> {
    if n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return Err("its mean or inverse deviation output is used".into());
    }
    let mut flat = x.shape[..axis].to_vec();
    flat.push(super::product(&x.shape[axis..]));
    let d = flat[axis].text();
    let eps = float_text(n.float("epsilon", 1e-5)).ok_or("epsilon is not finite")?;
    let x2 = super::shape::reshape(cx, x.clone(), flat);
    let w = cx.run(n, 1)?;
    let mut args = vec![
        x2.expr.clone(),
        format!("reshape(broadcast_to({}, {}), [{d}])", w.expr, super::dims(&x.shape[axis..])),
    ];
    if n.input(2).is_some() {
        let b = cx.run(n, 2)?;
        args.push(format!(
            "reshape(broadcast_to({}, {}), [{d}])",
            b.expr,
            super::dims(&x.shape[axis..])
        ));
    }
    let e = format!("layer_norm({}, eps = {eps})", args.join(", "));
    let y = cx.bind("normed", e, x.dt, x2.shape);
    Ok(super::shape::reshape(cx, y, x.shape))
}

fn instance_norm(cx: &mut Lower, n: &Node) -> R<Run> {
    // Instance norm is group norm with a group per channel.
    let x = cx.run(n, 0)?;
    let ch = x.shape.get(1).ok_or("a rank-1 input")?.clone();
    let w = cx.run(n, 1)?;
    let b = cx.run(n, 2)?;
    let eps = float_text(n.float("epsilon", 1e-5)).ok_or("epsilon is not finite")?;
    let e = format!("group_norm({}, {}, {}, {}, eps = {eps})", x.expr, ch.text(), w.expr, b.expr);
    Ok(cx.bind("normed", e, x.dt, x.shape))
}

fn pad(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let r = x.rank();
    let pads: Vec<i64> = if cx.g.opset >= 11 {
        cx.ints_in(n, 1, "pads")?.ok_or("no pads")?.iter().map(|s| s.v).collect()
    } else {
        n.ints("pads").ok_or("no pads")?
    };
    let axes: Vec<usize> = match cx.ints_in(n, 3, "axes")? {
        Some(a) => a.iter().map(|s| norm_axis(s.v, r)).collect::<R<_>>()?,
        None => (0..r).collect(),
    };
    let k = axes.len();
    if pads.len() != 2 * k || pads.iter().any(|&p| p < 0) {
        return Err(format!("pads {pads:?} (negative pads crop, which mgn's pad does not)"));
    }
    let mode = match n.string("mode").as_deref().unwrap_or("constant") {
        "constant" => "constant",
        "reflect" => "reflect",
        "edge" => "replicate",
        m => return Err(format!("mode \"{m}\"")),
    };
    let mut full = vec![(0i64, 0i64); r];
    for (j, &a) in axes.iter().enumerate() {
        full[a] = (pads[j], pads[j + k]);
    }
    let first = full.iter().position(|&(b, e)| b != 0 || e != 0);
    let Some(first) = first else { return Ok(x) };
    let mut widths = Vec::new();
    let mut s = x.shape.clone();
    for a in (first..r).rev() {
        widths.push(full[a].0.to_string());
        widths.push(full[a].1.to_string());
        s[a] = Sym {
            v: s[a].v + full[a].0 + full[a].1,
            e: s[a].e.as_ref().map(|e| format!("({e} + {})", full[a].0 + full[a].1)),
        };
    }
    let mut e = format!("pad({}, [{}]", x.expr, widths.join(", "));
    if mode != "constant" {
        e.push_str(&format!(", mode = \"{mode}\""));
    } else if n.input(2).is_some() {
        let v = cx
            .konst_in(n, 2, "constant_value")?
            .scalar_text()
            .ok_or("its value is not one number")?;
        if v != "0.0" {
            e.push_str(&format!(", value = {v}"));
        }
    }
    e.push(')');
    Ok(cx.bind("padded", e, x.dt, s))
}

fn resize(cx: &mut Lower, n: &Node) -> R<Run> {
    let x = cx.run(n, 0)?;
    let r = x.rank();
    if !matches!(r, 3 | 4) {
        return Err(format!(
            "resizing a rank-{r} tensor (mgn interpolates [N, C, L] and [N, C, H, W])"
        ));
    }
    let scales = if n.input(2).is_some() {
        cx.konst_in(n, 2, "scales")?.floats().map(<[f32]>::to_vec)
    } else {
        None
    };
    let sizes = if n.input(3).is_some() { cx.konst_in(n, 3, "sizes")?.static_ints() } else { None };
    let out: Vec<i64> = match (&scales, &sizes) {
        (Some(sc), _) if !sc.is_empty() => x
            .shape
            .iter()
            .zip(sc)
            .map(|(d, s)| (d.v as f64 * f64::from(*s)).floor() as i64)
            .collect(),
        (_, Some(sz)) => sz.clone(),
        _ => return Err("neither scales nor sizes".into()),
    };
    if out[..2] != [x.shape[0].v, x.shape[1].v] {
        return Err("it resizes the batch or channel axis".into());
    }
    if n.int("antialias", 0) != 0 {
        return Err("antialias = 1: mgn's interpolation reads no wider window".into());
    }
    if n.ints("axes").is_some() || n.int("exclude_outside", 0) != 0 {
        return Err("axes or exclude_outside given".into());
    }
    let mode = n.string("mode").unwrap_or_else(|| "nearest".into());
    let ctm = n.string("coordinate_transformation_mode").unwrap_or_else(|| "half_pixel".into());
    let spatial = &out[2..];
    // Given scales set the ratio (1 / scale), as `scale =` does; given sizes, in / out.
    let size = match scales.as_ref().filter(|s| !s.is_empty()) {
        Some(sc) => {
            let f: Vec<String> =
                sc[2..].iter().map(|&v| float_text(v).unwrap_or_default()).collect();
            let f = if f.iter().all(|v| *v == f[0]) {
                f[0].clone()
            } else {
                format!("({})", f.join(", "))
            };
            format!("SCALE{f}")
        }
        None => per_axis(spatial),
    };
    let mut s = x.shape[..2].to_vec();
    s.extend(spatial.iter().map(|&v| Sym::lit(v)));
    let e = match mode.as_str() {
        "nearest" => {
            let nm = n.string("nearest_mode").unwrap_or_else(|| "round_prefer_floor".into());
            if ctm != "asymmetric" || nm != "floor" {
                return Err(format!(
                    "nearest resizing with {ctm} coordinates and {nm} rounding (mgn's \
                     nearest is PyTorch's: asymmetric, floor)"
                ));
            }
            let whole = x.shape[2..]
                .iter()
                .zip(spatial)
                .all(|(d, &o)| o % d.v == 0 && o / d.v == spatial[0] / x.shape[2].v);
            if whole {
                format!("upsample({}, {})", x.expr, spatial[0] / x.shape[2].v)
            } else {
                format!("interpolate({}, {})", x.expr, size_arg(&size))
            }
        }
        "linear" => {
            let m = if r == 3 { "linear" } else { "bilinear" };
            match ctm.as_str() {
                "pytorch_half_pixel" | "align_corners" if spatial.contains(&1) => {
                    return Err(format!("{ctm} resizing to a size of 1"))
                }
                "half_pixel" | "pytorch_half_pixel" => {
                    format!("interpolate({}, {}, mode = \"{m}\")", x.expr, size_arg(&size))
                }
                "align_corners" => format!(
                    "interpolate({}, {}, mode = \"{m}\", align_corners = true)",
                    x.expr,
                    size_arg(&size)
                ),
                c => return Err(format!("linear resizing with {c} coordinates")),
            }
        }
        m => return Err(format!("mode \"{m}\" (mgn has nearest and linear)")),
    };
    Ok(cx.bind("resized", e, x.dt, s))
}

/// `size = …` or, for scales (marked `SCALE`), `scale = …`.
fn size_arg(size: &str) -> String {
    match size.strip_prefix("SCALE") {
        Some(f) => format!("scale = {f}"),
        None => format!("size = {size}"),
    }
}

fn einsum(cx: &mut Lower, n: &Node) -> R<Run> {
    let eq = n.string("equation").ok_or("no equation")?.replace(' ', "");
    if eq.contains("...") || n.inputs.len() > 2 {
        return Err("an equation with `...` or more than two operands".into());
    }
    let (lhs, out) = eq.split_once("->").ok_or("an equation without `->`")?;
    let ops: Vec<&str> = lhs.split(',').collect();
    let mut sizes = std::collections::HashMap::new();
    let mut args = Vec::new();
    for (i, spec) in ops.iter().enumerate() {
        let x = cx.run(n, i)?;
        for (ch, d) in spec.chars().zip(&x.shape) {
            sizes.insert(ch, d.clone());
        }
        args.push(x);
    }
    let s: Vec<Sym> = out
        .chars()
        .map(|c| {
            sizes.get(&c).cloned().ok_or_else(|| "an output letter no operand has".to_string())
        })
        .collect::<R<_>>()?;
    let list: Vec<&str> = args.iter().map(|a| a.expr.as_str()).collect();
    let dt = args[0].dt;
    Ok(cx.bind("einsum", format!("einsum(\"{eq}\", {})", list.join(", ")), dt, s))
}
