//! Each op's typing rule, written once: what a step computing an op over inputs of given
//! types produces. The plan validator applies it to every step of a loaded plan, the CPU
//! backend to every op it runs, and the compiler to every node it creates, so elaboration,
//! autodiff, plan files and backends cannot disagree about a type.
//!
//! Most ops determine their result ([`infer`] returns it). A few take their result's type from
//! the step itself — an input, a parameter, a constant, `arange`, `cast`, `reshape`, and the
//! derivatives that restore a forward operand's shape (`sum_to`, `broadcast_to`, `slice_grad`,
//! `gather_grad`, `conv*_grad_input`, `conv*_grad_weight`, `upsample_grad`,
//! `interpolate_grad`, `take_along_grad`); for those,
//! [`check`] tests the given type against the inputs.
//!
//! Forward ops need operands of one dtype where the language does (`+`, `@`, `concat`).
//! Derivative ops need floats but accept mixed float dtypes: autodiff gives a derivative its
//! forward node's float dtype, which can differ from an operand's around a `cast`.

use crate::dtype::DType;
use crate::op::{GradPart, Op, ReduceOp};
use crate::shape::attention::{dims, Dims};
use crate::shape::conv::{self, upsample, upsampled, Geometry};
use crate::shape::{broadcast, checked_numel, fail, matmul, ShapeError};

/// A value's element type and shape.
pub type Ty<'a> = (DType, &'a [usize]);

type Rule = Result<Option<(DType, Vec<usize>)>, ShapeError>;

/// `f32[2, 3]`.
fn show((d, s): Ty) -> String {
    let dims: Vec<String> = s.iter().map(|x| x.to_string()).collect();
    format!("{d}[{}]", dims.join(", "))
}

fn same(t: Ty) -> Rule {
    Ok(Some((t.0, t.1.to_vec())))
}

fn float(t: Ty, what: &str) -> Result<(), ShapeError> {
    if !t.0.is_float() {
        return fail(format!("{what} must be a float tensor, found {}", show(t)));
    }
    Ok(())
}

fn int(t: Ty, what: &str) -> Result<(), ShapeError> {
    if t.0.is_float() {
        return fail(format!("{what} must be an integer tensor, found {}", show(t)));
    }
    Ok(())
}

fn one_dtype(a: Ty, b: Ty) -> Result<(), ShapeError> {
    if a.0 != b.0 {
        return fail(format!(
            "operands of one dtype are needed, found {} and {}",
            show(a),
            show(b)
        ));
    }
    Ok(())
}

fn shaped(t: Ty, want: &[usize], what: &str) -> Result<(), ShapeError> {
    if t.1 != want {
        return fail(format!("{what} must have shape {want:?}, found {}", show(t)));
    }
    Ok(())
}

/// A derivative (or a broadcast) whose step gives its result type keeps the dtype of the value
/// it carries (`dy`), or widens a half one to f32 as kernels compute: a hand-edited dtype is
/// refused rather than run.
fn carries(dy: Ty, out: Ty) -> Result<(), ShapeError> {
    if dy.0 != out.0 && !(dy.0.is_half() && out.0 == DType::F32) {
        return fail(format!("the result is {}, but it carries {}", show(out), show(dy)));
    }
    Ok(())
}

fn axis_in(axis: usize, t: Ty) -> Result<(), ShapeError> {
    if axis >= t.1.len() {
        return fail(format!("axis {axis} is out of range for {}", show(t)));
    }
    Ok(())
}

/// The inputs as exactly `N` operands.
fn take<'a, 'b, const N: usize>(x: &'b [Ty<'a>]) -> Result<&'b [Ty<'a>; N], ShapeError> {
    x.try_into().or_else(|_| fail(format!("takes {N} input(s), not {}", x.len())))
}

/// The optional operands after the required ones, by their `has_*` flags: `[D]`-shaped
/// vectors each (norm weights and biases, batch norm's statistics).
fn vectors(x: &[Ty], names: &[(&str, bool)], size: usize) -> Result<usize, ShapeError> {
    let mut next = 0;
    for &(name, present) in names {
        if present {
            let t = *x.get(next).ok_or_else(|| ShapeError(format!("`{name}` is missing")))?;
            float(t, name)?;
            shaped(t, &[size], name)?;
            next += 1;
        }
    }
    Ok(next)
}

/// `[N, C, ..]` of rank `lo..=hi`: C.
fn channels(t: Ty, lo: usize, hi: usize) -> Result<usize, ShapeError> {
    if t.1.len() < lo || t.1.len() > hi {
        return fail(format!("needs [N, C, ..] with {lo} to {hi} axes, found {}", show(t)));
    }
    Ok(t.1[1])
}

fn reduced(s: &[usize], axes: &[usize], keepdim: bool) -> Result<Vec<usize>, ShapeError> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= s.len() || axes[..i].contains(&a) {
            return fail(format!("axes {axes:?} are not distinct axes of {s:?}"));
        }
    }
    let kept = s.iter().enumerate().filter_map(|(i, &x)| match axes.contains(&i) {
        true => keepdim.then_some(1),
        false => Some(x),
    });
    Ok(kept.collect())
}

/// An attention's operands `[q, k, v, mask?, rest..]`: its sizes, after checking the mask.
fn attention<'a>(x: &[Ty<'a>], has_mask: bool) -> Result<(Dims, &'a [usize]), ShapeError> {
    let need = 3 + has_mask as usize;
    if x.len() < need {
        return fail(format!("takes at least {need} inputs, not {}", x.len()));
    }
    for (t, name) in x[..3].iter().zip(["q", "k", "v"]) {
        float(*t, name)?;
    }
    let d = dims(x[0].1, x[1].1, x[2].1)?;
    if has_mask {
        let m = x[3];
        if broadcast(m.1, &d.scores).ok().as_deref() != Some(&d.scores[..]) {
            return fail(format!("the mask {} does not broadcast to {:?}", show(m), d.scores));
        }
    }
    let q = x[0].1;
    Ok((d, q))
}

/// The norm derivatives' result: `x`'s type for the input, `[size]` for the weight or bias.
fn norm_part(x: Ty, part: GradPart, has: (bool, bool), size: usize) -> Rule {
    match part {
        GradPart::Input => same(x),
        GradPart::Weight if has.0 => Ok(Some((x.0, vec![size]))),
        GradPart::Bias if has.1 => Ok(Some((x.0, vec![size]))),
        _ => fail(format!("has no {part:?} operand to differentiate")),
    }
}

/// The type a step computing `op` over `inputs` has; `None` when the step chooses it (see
/// [`check`]). Errors name the disagreement.
pub fn infer(op: &Op, x: &[Ty]) -> Rule {
    use Op::*;
    match op {
        Input { .. } | Param { .. } | Constant { .. } | Arange => {
            take::<0>(x)?;
            Ok(None)
        }
        Cast
        | Reshape
        | SumTo
        | BroadcastTo
        | SliceGrad { .. }
        | UpsampleGrad { .. }
        | InterpolateGrad { .. } => {
            take::<1>(x)?;
            Ok(None)
        }
        GatherGrad { .. } | ConvGradInput { .. } | ConvGradWeight { .. } => {
            take::<2>(x)?;
            Ok(None)
        }
        StopGradient => {
            let [a] = take(x)?;
            same(*a)
        }
        Dequantize => {
            let [a] = take(x)?;
            if !a.0.is_packed() {
                return fail(format!("dequantize reads a packed value, not {}", show(*a)));
            }
            a.0.packs(a.1).map_err(ShapeError)?;
            Ok(Some((DType::F32, a.1.to_vec())))
        }
        Unary(_) | Pow { .. } | Dropout { .. } | DropoutGrad { .. } => {
            let [a] = take(x)?;
            float(*a, "the operand")?;
            same(*a)
        }
        Binary(_) => {
            let [a, b] = take(x)?;
            one_dtype(*a, *b)?;
            match broadcast(a.1, b.1) {
                Ok(s) => Ok(Some((a.0, s))),
                Err(_) => fail(format!("{} and {} do not broadcast", show(*a), show(*b))),
            }
        }
        MatMul => {
            let [a, b] = take(x)?;
            float(*a, "the left operand")?;
            one_dtype(*a, *b)?;
            let s = matmul(a.1, b.1).map_err(|e| ShapeError(format!("{e}")))?;
            Ok(Some((a.0, s)))
        }
        UnaryGrad(_) | SoftmaxGrad { .. } | ReduceGrad { .. } => infer_grads(op, x),
        Permute { .. }
        | Concat { .. }
        | Slice { .. }
        | Gather { .. }
        | Reduce { .. }
        | ArgMax { .. }
        | Softmax { .. } => infer_more(op, x),
        LayerNorm { .. }
        | RmsNorm { .. }
        | GroupNorm { .. }
        | BatchNorm { .. }
        | LayerNormGrad { .. }
        | RmsNormGrad { .. }
        | GroupNormGrad { .. }
        | BatchNormGrad { .. } => infer_norms(op, x),
        Conv { .. }
        | Pool { .. }
        | PoolGrad { .. }
        | Upsample { .. }
        | Attention { .. }
        | AttentionGrad { .. }
        | Rope { .. }
        | SoftmaxCrossEntropy
        | SoftmaxCrossEntropyGrad => infer_windows(op, x),
        Pad { .. } | PadGrad { .. } | Interpolate { .. } => spatial::infer_spatial(op, x),
        Compare(_) | Where | Cumsum { .. } | TopK { .. } | TakeAlong { .. } => {
            select::infer_select(op, x)
        }
        Narrow { .. } | SliceScatter { .. } => select::infer_window(op, x),
        TakeAlongGrad { .. } => {
            take::<2>(x)?;
            Ok(None)
        }
    }
}

/// Movement, selection and reductions.
fn infer_more(op: &Op, x: &[Ty]) -> Rule {
    use Op::*;
    match op {
        Permute { perm } => {
            let [a] = take(x)?;
            let mut seen = vec![false; a.1.len()];
            for &p in perm {
                match seen.get_mut(p) {
                    Some(s) if !*s => *s = true,
                    _ => return fail(format!("{perm:?} is not a permutation of {}", show(*a))),
                }
            }
            if perm.len() != a.1.len() {
                return fail(format!("{perm:?} is not a permutation of {}", show(*a)));
            }
            Ok(Some((a.0, perm.iter().map(|&p| a.1[p]).collect())))
        }
        Concat { axis } => {
            let first = *x.first().ok_or_else(|| ShapeError("needs at least one input".into()))?;
            axis_in(*axis, first)?;
            let mut out = first.1.to_vec();
            out[*axis] = 0;
            for t in x {
                let fits = t.0 == first.0
                    && t.1.len() == first.1.len()
                    && t.1.iter().zip(first.1).enumerate().all(|(k, (a, b))| k == *axis || a == b);
                if !fits {
                    return fail(format!("cannot join {} to {}", show(*t), show(first)));
                }
                out[*axis] += t.1[*axis];
            }
            Ok(Some((first.0, out)))
        }
        Slice { axis, start, end } => {
            let [a] = take(x)?;
            axis_in(*axis, *a)?;
            if !(start < end && *end <= a.1[*axis]) {
                return fail(format!(
                    "{start}..{end} is out of range for axis {axis} of {}",
                    show(*a)
                ));
            }
            let mut out = a.1.to_vec();
            out[*axis] = end - start;
            Ok(Some((a.0, out)))
        }
        Gather { axis } => {
            let [t, i] = take(x)?;
            axis_in(*axis, *t)?;
            int(*i, "the index")?;
            let mut out = t.1[..*axis].to_vec();
            out.extend_from_slice(i.1);
            out.extend_from_slice(&t.1[axis + 1..]);
            Ok(Some((t.0, out)))
        }
        Reduce { op, axes, keepdim } => {
            let [a] = take(x)?;
            if *op == ReduceOp::Mean {
                float(*a, "a mean's operand")?;
            }
            Ok(Some((a.0, reduced(a.1, axes, *keepdim)?)))
        }
        ArgMax { axis } => {
            let [a] = take(x)?;
            axis_in(*axis, *a)?;
            let mut out = a.1.to_vec();
            out.remove(*axis);
            Ok(Some((DType::I32, out)))
        }
        Softmax { axis, .. } => {
            let [a] = take(x)?;
            float(*a, "the operand")?;
            axis_in(*axis, *a)?;
            same(*a)
        }
        _ => unreachable!("`infer` sends movement and reductions here"),
    }
}

/// A position read at run time (`Narrow`, `SliceScatter`, `Rope`): an `i32[]`.
pub(super) fn run_time_start(t: Ty) -> Result<(), ShapeError> {
    if t.0 != DType::I32 || !t.1.is_empty() {
        return fail(format!("the start must be an i32[] scalar, found {}", show(t)));
    }
    Ok(())
}

/// A norm's `x`: the first input, a float tensor.
fn first<'a>(x: &[Ty<'a>]) -> Result<Ty<'a>, ShapeError> {
    let t = *x.first().ok_or_else(|| ShapeError("takes at least one input".into()))?;
    float(t, "x")?;
    Ok(t)
}

/// The normalizations and their derivatives.
fn infer_norms(op: &Op, x: &[Ty]) -> Rule {
    use Op::*;
    let last = |t: Ty| t.1.last().copied().ok_or_else(|| ShapeError("needs an axis".into()));
    let count = |x: &[Ty], n: usize| -> Result<(), ShapeError> {
        if x.len() != n {
            return fail(format!("takes {n} inputs, not {}", x.len()));
        }
        Ok(())
    };
    match op {
        LayerNorm { has_weight, has_bias, .. } => {
            let t = first(x)?;
            let n = vectors(&x[1..], &[("weight", *has_weight), ("bias", *has_bias)], last(t)?)?;
            count(x, 1 + n)?;
            same(t)
        }
        RmsNorm { has_weight, .. } => {
            let t = first(x)?;
            let n = vectors(&x[1..], &[("weight", *has_weight)], last(t)?)?;
            count(x, 1 + n)?;
            same(t)
        }
        GroupNorm { groups, has_weight, has_bias, .. } => {
            let t = first(x)?;
            let c = group_channels(t, *groups)?;
            let n = vectors(&x[1..], &[("weight", *has_weight), ("bias", *has_bias)], c)?;
            count(x, 1 + n)?;
            same(t)
        }
        BatchNorm { has_weight, has_bias, .. } => {
            let t = first(x)?;
            let c = channels(t, 2, 4)?;
            let names = [
                ("running_mean", true),
                ("running_var", true),
                ("weight", *has_weight),
                ("bias", *has_bias),
            ];
            let n = vectors(&x[1..], &names, c)?;
            count(x, 1 + n)?;
            same(t)
        }
        LayerNormGrad { has_weight, has_bias, part, .. } => {
            let t = first(x)?;
            let d = last(t)?;
            let n = vectors(&x[1..], &[("weight", *has_weight), ("bias", *has_bias)], d)?;
            norm_dy(x, 1 + n, t)?;
            norm_part(t, *part, (*has_weight, *has_bias), d)
        }
        RmsNormGrad { has_weight, part, .. } => {
            let t = first(x)?;
            let d = last(t)?;
            let n = vectors(&x[1..], &[("weight", *has_weight)], d)?;
            norm_dy(x, 1 + n, t)?;
            norm_part(t, *part, (*has_weight, false), d)
        }
        GroupNormGrad { groups, has_weight, has_bias, part, .. } => {
            let t = first(x)?;
            let c = group_channels(t, *groups)?;
            let n = vectors(&x[1..], &[("weight", *has_weight), ("bias", *has_bias)], c)?;
            norm_dy(x, 1 + n, t)?;
            norm_part(t, *part, (*has_weight, *has_bias), c)
        }
        BatchNormGrad { has_weight, has_bias, part, .. } => {
            let t = first(x)?;
            let c = channels(t, 2, 4)?;
            let names = [
                ("running_mean", true),
                ("running_var", true),
                ("weight", *has_weight),
                ("bias", *has_bias),
            ];
            let n = vectors(&x[1..], &names, c)?;
            norm_dy(x, 1 + n, t)?;
            norm_part(t, *part, (*has_weight, *has_bias), c)
        }
        _ => unreachable!("`infer` sends the normalizations here"),
    }
}

fn group_channels(t: Ty, groups: usize) -> Result<usize, ShapeError> {
    let c = channels(t, 2, usize::MAX)?;
    if groups == 0 || c % groups != 0 {
        return fail(format!("{c} channels do not split into {groups} groups"));
    }
    Ok(c)
}

/// A norm derivative's `dy`: the last of `n + 1` inputs, of `x`'s shape.
fn norm_dy(x: &[Ty], n: usize, t: Ty) -> Result<(), ShapeError> {
    if x.len() != n + 1 {
        return fail(format!("takes {} inputs, not {}", n + 1, x.len()));
    }
    float(x[n], "dy")?;
    shaped(x[n], t.1, "dy")
}

/// Convolution, pooling, upsampling, attention, rotary embeddings, the loss, and the
/// derivatives that keep a forward operand's type.
fn infer_windows(op: &Op, x: &[Ty]) -> Rule {
    use Op::*;
    match op {
        Conv { stride, padding, dilation, groups, has_bias } => {
            if x.len() != 2 + *has_bias as usize {
                return fail(format!("takes {} inputs, not {}", 2 + *has_bias as usize, x.len()));
            }
            float(x[0], "the input")?;
            one_dtype(x[0], x[1])?;
            let c = conv::Conv::new(
                x[0].1,
                x[1].1,
                &Geometry::new(stride, padding, dilation, *groups)?,
            )?;
            if *has_bias {
                shaped(x[2], &[c.cout], "the bias")?;
            }
            Ok(Some((x[0].0, c.out_shape())))
        }
        Pool { kernel, stride, padding, .. } => {
            let [a] = take(x)?;
            float(*a, "the input")?;
            Ok(Some((a.0, conv::Pool::new(a.1, kernel, stride, padding)?.out_shape())))
        }
        PoolGrad { kernel, stride, padding, .. } => {
            let [a, dy] = take(x)?;
            float(*a, "the input")?;
            shaped(*dy, &conv::Pool::new(a.1, kernel, stride, padding)?.out_shape(), "dy")?;
            same(*a)
        }
        Upsample { scale } => {
            let [a] = take(x)?;
            float(*a, "the input")?;
            upsample(a.1, *scale)?;
            Ok(Some((a.0, upsampled(a.1, *scale))))
        }
        Attention { has_mask, .. } => {
            let (d, _) = attention(x, *has_mask)?;
            if x.len() != 3 + *has_mask as usize {
                return fail(format!("takes {} inputs, not {}", 3 + *has_mask as usize, x.len()));
            }
            Ok(Some((x[0].0, d.out())))
        }
        AttentionGrad { has_mask, part, .. } => {
            let (d, _) = attention(x, *has_mask)?;
            let n = 4 + *has_mask as usize;
            if x.len() != n {
                return fail(format!("takes {n} inputs, not {}", x.len()));
            }
            shaped(x[n - 1], &d.out(), "dy")?;
            match part {
                GradPart::Q => same(x[0]),
                GradPart::K => same(x[1]),
                GradPart::V => same(x[2]),
                GradPart::Mask if *has_mask => Ok(Some((x[0].0, d.scores.clone()))),
                _ => fail(format!("has no {part:?} operand (q, k, v or a mask)")),
            }
        }
        Rope { .. } => {
            let a = match x {
                [a] => a,
                [a, start] => {
                    run_time_start(*start)?;
                    a
                }
                _ => return fail(format!("takes x and maybe a start, not {} inputs", x.len())),
            };
            float(*a, "the input")?;
            let r = a.1.len();
            if r < 2 || a.1[r - 1] % 2 != 0 {
                return fail(format!("needs [.., T, D] with an even D, found {}", show(*a)));
            }
            same(*a)
        }
        SoftmaxCrossEntropy => {
            let [logits, targets] = take(x)?;
            cross_entropy(*logits, *targets)?;
            Ok(Some((logits.0, vec![])))
        }
        SoftmaxCrossEntropyGrad => {
            let [logits, targets, dloss] = take(x)?;
            cross_entropy(*logits, *targets)?;
            shaped(*dloss, &[], "dloss")?;
            same(*logits)
        }
        _ => unreachable!("`infer` sends windows, attention and the loss here"),
    }
}

/// The derivatives of point-wise ops, softmax and reductions: the forward operand's type.
fn infer_grads(op: &Op, x: &[Ty]) -> Rule {
    use Op::*;
    match op {
        UnaryGrad(_) | SoftmaxGrad { .. } => {
            let [a, dy] = take(x)?;
            float(*a, "the operand")?;
            shaped(*dy, a.1, "dy")?;
            same(*a)
        }
        ReduceGrad { axes, keepdim, .. } => {
            let [a, y, dy] = take(x)?;
            let r = reduced(a.1, axes, *keepdim)?;
            shaped(*y, &r, "the reduction's result")?;
            shaped(*dy, &r, "dy")?;
            Ok(Some((if a.0.is_float() { a.0 } else { dy.0 }, a.1.to_vec())))
        }
        _ => unreachable!("`infer` sends point-wise and reduction derivatives here"),
    }
}

fn cross_entropy(logits: Ty, targets: Ty) -> Result<(), ShapeError> {
    float(logits, "the logits")?;
    int(targets, "the targets")?;
    let Some((_, rows)) = logits.1.split_last() else {
        return fail(format!("the logits need a class axis, found {}", show(logits)));
    };
    shaped(targets, rows, "the targets")
}

/// Whether a step of type `out` may compute `op` over `inputs`: the inferred type when the op
/// determines one, else the op's conditions on the type the step gives.
pub fn check(op: &Op, x: &[Ty], out: Ty) -> Result<(), ShapeError> {
    if let Some((d, s)) = infer(op, x)? {
        // Kernels compute in f32 from half operands and round a half result once; a step may
        // keep the f32 value instead (a contraction's accumulator under the mixed precision
        // policy, an op whose GPU kernel cannot write halves).
        let widened = d.is_half() && out.0 == DType::F32;
        if (d != out.0 && !widened) || s != out.1 {
            return fail(format!(
                "the result is {}, but the inputs give {}",
                show(out),
                show((d, &s))
            ));
        }
        return Ok(());
    }
    given(op, x, out)
}

/// The conditions on a step-chosen result type.
fn given(op: &Op, x: &[Ty], out: Ty) -> Result<(), ShapeError> {
    use Op::*;
    let elements = |s: &[usize]| checked_numel(s).unwrap_or(usize::MAX);
    match op {
        Input { .. } | Param { .. } | Constant { .. } => Ok(()),
        Arange => {
            int(out, "arange")?;
            if out.1.len() != 1 {
                return fail(format!("arange is 1-D, not {}", show(out)));
            }
            Ok(())
        }
        Cast => shaped(x[0], out.1, "the operand"),
        Reshape => {
            if x[0].0 != out.0 || elements(x[0].1) != elements(out.1) {
                return fail(format!("cannot reshape {} to {}", show(x[0]), show(out)));
            }
            Ok(())
        }
        SumTo | BroadcastTo => {
            carries(x[0], out)?;
            let (from, to) = if matches!(op, SumTo) { (out, x[0]) } else { (x[0], out) };
            if broadcast(from.1, to.1).ok().as_deref() != Some(to.1) {
                return fail(format!("{} does not broadcast to {}", show(from), show(to)));
            }
            Ok(())
        }
        SliceGrad { axis, start, end } => {
            axis_in(*axis, out)?;
            if !(start < end && *end <= out.1[*axis]) {
                return fail(format!(
                    "{start}..{end} is out of range for axis {axis} of {}",
                    show(out)
                ));
            }
            let mut dy = out.1.to_vec();
            dy[*axis] = end - start;
            carries(x[0], out)?;
            shaped(x[0], &dy, "dy")
        }
        GatherGrad { axis } => {
            axis_in(*axis, out)?;
            int(x[0], "the index")?;
            let mut dy = out.1[..*axis].to_vec();
            dy.extend_from_slice(x[0].1);
            dy.extend_from_slice(&out.1[axis + 1..]);
            carries(x[1], out)?;
            shaped(x[1], &dy, "dy")
        }
        ConvGradInput { stride, padding, dilation, groups } => {
            let geo = Geometry::new(stride, padding, dilation, *groups)?;
            carries(x[0], out)?;
            shaped(x[0], &conv::Conv::new(out.1, x[1].1, &geo)?.out_shape(), "dy")
        }
        ConvGradWeight { stride, padding, dilation, groups } => {
            let geo = Geometry::new(stride, padding, dilation, *groups)?;
            carries(x[1], out)?;
            shaped(x[1], &conv::Conv::new(x[0].1, out.1, &geo)?.out_shape(), "dy")
        }
        UpsampleGrad { scale } => {
            upsample(out.1, *scale)?;
            carries(x[0], out)?;
            shaped(x[0], &upsampled(out.1, *scale), "dy")
        }
        InterpolateGrad { .. } => spatial::given_spatial(op, x, out),
        TakeAlongGrad { axis } => {
            float(out, "the result")?;
            select::along(*axis, out, x[0])?;
            shaped(x[1], x[0].1, "dy")
        }
        _ => fail(format!("`{}` determines its own result type", op.describe())),
    }
}

mod select;
mod spatial;
#[cfg(test)]
mod tests;
