//! `einsum(spec, a, b?)`, elaborated at compile time into the ops it stands for: no op of its
//! own. One operand: a sum over the letters the output drops, then a permute. Two operands:
//! letters each operand has alone and the output drops are summed first; then the operands are
//! permuted and reshaped to `[batch, rows, k]` and `[batch, k, cols]` (batch letters in both
//! and the output, contracted letters in both but not the output, kept letters in one and the
//! output) and multiplied (`@`, or `*` when nothing is contracted), and the product reshaped
//! and permuted to the output's letters. Diagonals (a letter twice in one operand) and `...`
//! are refused.

use super::args::*;
use crate::elab::eval::{Evaluator, R};
use crate::elab::value::Value;
use crate::graph::{BinaryOp, NodeId, Op, ReduceOp};
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// A parsed spec: the letters of each operand and of the output.
struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

/// Where character `at` of the spec is, when the spec is a string literal in the call; the
/// whole argument otherwise.
fn at(a: &Args, spec: &str, at: usize) -> Span {
    let s = a.span_of("spec");
    if (s.end - s.start) as usize == spec.len() + 2 {
        let start = s.start as usize + 1 + at;
        return Span::new(s.file, start, start + 1);
    }
    s
}

fn spec_error(a: &Args, spec: &str, pos: usize, msg: String, label: &str) -> Diagnostic {
    Diagnostic::error("E0201", msg, at(a, spec, pos), label.to_string())
}

/// Parses `ab,bc->ac` (or `ab,bc`, whose output is the letters appearing once, in order).
fn parse(a: &Args, spec: &str) -> R<Spec> {
    if let Some(pos) = spec.find(|c: char| !(c.is_ascii_alphabetic() || ",->".contains(c))) {
        let c = spec[pos..].chars().next().unwrap_or(' ');
        let d = spec_error(
            a,
            spec,
            pos,
            format!("`{c}` cannot appear in an einsum spec: axes are letters"),
            "not a letter",
        );
        return Err(if c == '.' {
            d.with_help("`...` (broadcast axes) is not supported")
        } else {
            d
        });
    }
    let (lhs, out) = match spec.split_once("->") {
        Some((l, o)) => (l, Some(o)),
        None => (spec, None),
    };
    if let Some(pos) = out.and_then(|o| o.find(['-', '>', ','])) {
        let pos = lhs.len() + 2 + pos;
        return Err(spec_error(a, spec, pos, "an einsum spec has one `->`".into(), "unexpected"));
    }
    if let Some(pos) = lhs.find(['-', '>']) {
        return Err(spec_error(a, spec, pos, "`->` must be written whole".into(), "unexpected"));
    }
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|p| p.chars().collect()).collect();
    let output = match out {
        Some(o) => o.chars().collect(),
        None => {
            let all: Vec<char> = inputs.concat();
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| all.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    Ok(Spec { inputs, output })
}

pub(super) fn einsum(ev: &mut Evaluator, a: &Args) -> R<Value> {
    let spec = match a.get("spec") {
        Some((Value::Str(s), _)) => s.to_string(),
        _ => return Err(a.wrong(ev, "spec", "a string such as \"bij,bjk->bik\"")),
    };
    let spec_text = spec;
    let p = parse(a, &spec_text)?;
    let mut operands = vec![float_tensor(ev, a, "a")?];
    if a.get("b").is_some() {
        operands.push(float_tensor(ev, a, "b")?);
    }
    if p.inputs.len() != operands.len() {
        let n = operands.len();
        return Err(Diagnostic::error(
            "E0401",
            format!(
                "the spec names {} operand{}, but {n} tensor{} given",
                p.inputs.len(),
                crate::elab::eval::plural(p.inputs.len()),
                if n == 1 { " is" } else { "s are" }
            ),
            a.span_of("spec"),
            "operands separated by `,`",
        ));
    }
    let d = ev.ty(operands[0].0).0;
    if operands.iter().any(|o| ev.ty(o.0).0 != d) {
        return Err(Diagnostic::error(
            "E0202",
            format!(
                "`einsum` needs operands of one dtype, found {} and {}",
                ev.type_str(operands[0].0),
                ev.type_str(operands[1].0)
            ),
            a.span,
            "mixed dtypes",
        ));
    }
    let sizes = letter_sizes(ev, a, &spec_text, &p, &operands)?;
    check_output(a, &spec_text, &p, &sizes)?;
    let ids: Vec<NodeId> = operands.iter().map(|o| o.0).collect();
    let out = if ids.len() == 1 {
        let x = sum_out(ev, a, ids[0], &p.inputs[0], &p.output, d)?;
        reorder(ev, a, x, &x_letters(&p.inputs[0], &p.output), &p.output, d)?
    } else {
        product(ev, a, &ids, &p, &sizes, d)?
    };
    Ok(Value::Tensor(out))
}

/// The size of every letter, after checking each operand's letters against its rank, once
/// each, and every letter's size against its other uses.
fn letter_sizes(
    ev: &Evaluator,
    a: &Args,
    spec: &str,
    p: &Spec,
    operands: &[(NodeId, Span)],
) -> R<Vec<(char, usize)>> {
    let mut sizes: Vec<(char, usize, usize)> = Vec::new();
    let mut offset = 0;
    for (k, (letters, &(t, ts))) in p.inputs.iter().zip(operands).enumerate() {
        let shape = ev.ty(t).1.to_vec();
        let name = ["a", "b"][k];
        if letters.len() != shape.len() {
            return Err(Diagnostic::error(
                "E0206",
                format!(
                    "`{}` names {} axes of `{name}`, which has {}: {}",
                    letters.iter().collect::<String>(),
                    letters.len(),
                    shape.len(),
                    ev.type_str(t)
                ),
                cover(a, spec, offset, letters.len()),
                "one letter per axis",
            )
            .with_label(ts, format!("this is {}", ev.type_str(t))));
        }
        for (i, (&c, &n)) in letters.iter().zip(&shape).enumerate() {
            if letters[..i].contains(&c) {
                return Err(spec_error(
                    a,
                    spec,
                    offset + i,
                    format!(
                        "`{c}` appears twice in `{}`: diagonals are not supported",
                        name_of(letters)
                    ),
                    "a second time",
                )
                .with_help("take the diagonal with `gather`, or sum a product with an identity"));
            }
            match sizes.iter().find(|s| s.0 == c) {
                Some(&(_, m, first)) if m != n => {
                    return Err(Diagnostic::error(
                        "E0203",
                        format!("`{c}` is {n} in `{name}` ({}) but {m} in `a`", ev.type_str(t)),
                        at(a, spec, offset + i),
                        "size differs",
                    )
                    .with_label(at(a, spec, first), format!("`{c}` is {m} here")))
                }
                Some(_) => {}
                None => sizes.push((c, n, offset + i)),
            }
        }
        offset += letters.len() + 1;
    }
    Ok(sizes.into_iter().map(|(c, n, _)| (c, n)).collect())
}

fn name_of(letters: &[char]) -> String {
    letters.iter().collect()
}

/// Output letters name input axes, once each.
fn check_output(a: &Args, spec: &str, p: &Spec, sizes: &[(char, usize)]) -> R<()> {
    let start = spec.find("->").map_or(0, |i| i + 2);
    for (i, &c) in p.output.iter().enumerate() {
        if !sizes.iter().any(|s| s.0 == c) {
            return Err(spec_error(
                a,
                spec,
                start + i,
                format!("the output letter `{c}` names no axis of the operands"),
                "unknown letter",
            ));
        }
        if p.output[..i].contains(&c) {
            return Err(spec_error(
                a,
                spec,
                start + i,
                format!("`{c}` appears twice in the output `{}`", name_of(&p.output)),
                "a second time",
            ));
        }
    }
    Ok(())
}

/// The span of `len` characters of the spec from `from` (the whole argument unless it is a
/// literal).
fn cover(a: &Args, spec: &str, from: usize, len: usize) -> Span {
    let first = at(a, spec, from);
    if first == a.span_of("spec") || len == 0 {
        return first;
    }
    Span::new(first.file, first.start as usize, first.start as usize + len)
}

/// The letters of `x` left after `sum_out` (its letters that `keep` has, in `x`'s order).
fn x_letters(letters: &[char], keep: &[char]) -> Vec<char> {
    letters.iter().copied().filter(|c| keep.contains(c)).collect()
}

/// `x` summed over its letters that `keep` lacks.
fn sum_out(
    ev: &mut Evaluator,
    a: &Args,
    x: NodeId,
    letters: &[char],
    keep: &[char],
    d: DType,
) -> R<NodeId> {
    let axes: Vec<usize> = (0..letters.len()).filter(|&i| !keep.contains(&letters[i])).collect();
    if axes.is_empty() {
        return Ok(x);
    }
    let shape = ev.ty(x).1.to_vec();
    let out = (0..shape.len()).filter(|i| !axes.contains(i)).map(|i| shape[i]).collect();
    let op = Op::Reduce { op: ReduceOp::Sum, axes, keepdim: false };
    checked(ev, op, vec![x], d, out, a.span)
}

/// `x`, whose axes are `from`, permuted to the order `to` (a permutation of `from`).
fn reorder(
    ev: &mut Evaluator,
    a: &Args,
    x: NodeId,
    from: &[char],
    to: &[char],
    d: DType,
) -> R<NodeId> {
    let perm: Vec<usize> =
        to.iter().map(|c| from.iter().position(|f| f == c).expect("a permutation")).collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x);
    }
    let shape = ev.ty(x).1.to_vec();
    let out = perm.iter().map(|&p| shape[p]).collect();
    checked(ev, Op::Permute { perm }, vec![x], d, out, a.span)
}

fn reshape(ev: &mut Evaluator, a: &Args, x: NodeId, shape: Vec<usize>, d: DType) -> R<NodeId> {
    if ev.ty(x).1 == shape.as_slice() {
        return Ok(x);
    }
    checked(ev, Op::Reshape, vec![x], d, shape, a.span)
}

/// Two operands: sums, then one product over `[batch, rows, k] × [batch, k, cols]`.
fn product(
    ev: &mut Evaluator,
    a: &Args,
    ids: &[NodeId],
    p: &Spec,
    sizes: &[(char, usize)],
    d: DType,
) -> R<NodeId> {
    let (la, lb, out) = (&p.inputs[0], &p.inputs[1], &p.output);
    let size = |c: &char| sizes.iter().find(|s| s.0 == *c).map_or(1, |s| s.1);
    let count = |v: &[char]| v.iter().map(size).product::<usize>();
    // Letters of one operand the output drops are summed away before the product.
    let keep_a: Vec<char> =
        la.iter().copied().filter(|c| lb.contains(c) || out.contains(c)).collect();
    let keep_b: Vec<char> =
        lb.iter().copied().filter(|c| la.contains(c) || out.contains(c)).collect();
    let x = sum_out(ev, a, ids[0], la, &keep_a, d)?;
    let y = sum_out(ev, a, ids[1], lb, &keep_b, d)?;
    let batch: Vec<char> =
        keep_a.iter().copied().filter(|c| lb.contains(c) && out.contains(c)).collect();
    let inner: Vec<char> =
        keep_a.iter().copied().filter(|c| lb.contains(c) && !out.contains(c)).collect();
    let rows: Vec<char> = keep_a.iter().copied().filter(|c| !lb.contains(c)).collect();
    let cols: Vec<char> = keep_b.iter().copied().filter(|c| !la.contains(c)).collect();
    let (nb, m, k, n) = (count(&batch), count(&rows), count(&inner), count(&cols));
    let lead = |v: Vec<usize>| if batch.is_empty() { v } else { [vec![nb], v].concat() };
    let x = reorder(ev, a, x, &keep_a, &[batch.clone(), rows.clone(), inner.clone()].concat(), d)?;
    let x = reshape(ev, a, x, lead(vec![m, k]), d)?;
    let y = reorder(ev, a, y, &keep_b, &[batch.clone(), inner.clone(), cols.clone()].concat(), d)?;
    let y = reshape(ev, a, y, lead(vec![k, n]), d)?;
    let z = if inner.is_empty() {
        // Nothing contracted: an outer product per batch, by broadcasting ([.., m, 1]·[.., 1, n]).
        let shape = lead(vec![m, n]);
        checked(ev, Op::Binary(BinaryOp::Mul), vec![x, y], d, shape, a.span)?
    } else {
        checked(ev, Op::MatMul, vec![x, y], d, lead(vec![m, n]), a.span)?
    };
    let letters = [batch, rows, cols].concat();
    let z = reshape(ev, a, z, letters.iter().map(size).collect(), d)?;
    reorder(ev, a, z, &letters, out, d)
}
