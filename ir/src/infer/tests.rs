//! The typing rules as data: each row is an op, its inputs, and the type it gives (or the
//! words its error must contain). One row per rule at least, plus the refusals that guard
//! backends against hand-edited plans.

use super::*;
use crate::op::{BinaryOp, InterpMode, PadMode, PoolOp, UnaryOp};

const F: DType = DType::F32;
const I: DType = DType::I32;

/// `Ok(shape)` of dtype `d`, or `Err(words)`.
type Want = Result<(DType, &'static [usize]), &'static str>;

fn row(op: Op, inputs: &[(DType, &[usize])], want: Want) {
    let got = infer(&op, inputs);
    match (want, got) {
        (Ok((d, s)), Ok(Some((gd, gs)))) => {
            assert_eq!((gd, gs.as_slice()), (d, s), "{}", op.describe())
        }
        (Err(words), Err(e)) => {
            assert!(e.0.contains(words), "{}: {e} lacks `{words}`", op.describe())
        }
        (want, got) => panic!("{}: want {want:?}, got {got:?}", op.describe()),
    }
}

#[test]
fn pointwise_and_products() {
    row(Op::Unary(UnaryOp::Relu), &[(F, &[2, 3])], Ok((F, &[2, 3])));
    row(Op::Unary(UnaryOp::Exp), &[(I, &[2])], Err("must be a float"));
    row(Op::Binary(BinaryOp::Add), &[(F, &[8, 1, 4]), (F, &[3, 1])], Ok((F, &[8, 3, 4])));
    row(Op::Binary(BinaryOp::Mul), &[(F, &[2]), (I, &[2])], Err("one dtype"));
    row(Op::Binary(BinaryOp::Sub), &[(F, &[8, 3]), (F, &[8, 4])], Err("do not broadcast"));
    row(Op::MatMul, &[(F, &[8, 64, 32]), (F, &[32, 16])], Ok((F, &[8, 64, 16])));
    row(Op::MatMul, &[(F, &[4, 5]), (F, &[6, 7])], Err("inner sizes differ"));
    row(Op::Pow { exponent: 2.0 }, &[(F, &[3])], Ok((F, &[3])));
    row(Op::Unary(UnaryOp::Neg), &[(F, &[3]), (F, &[3])], Err("takes 1 input"));
}

#[test]
fn movement_and_reductions() {
    row(Op::Permute { perm: vec![2, 0, 1] }, &[(F, &[2, 3, 4])], Ok((F, &[4, 2, 3])));
    row(Op::Permute { perm: vec![0, 0] }, &[(F, &[2, 3])], Err("not a permutation"));
    row(Op::Concat { axis: 1 }, &[(F, &[2, 3]), (F, &[2, 5])], Ok((F, &[2, 8])));
    row(Op::Concat { axis: 1 }, &[(F, &[2, 3]), (F, &[3, 5])], Err("cannot join"));
    row(Op::Slice { axis: 0, start: 1, end: 3 }, &[(F, &[4, 2])], Ok((F, &[2, 2])));
    row(Op::Slice { axis: 0, start: 3, end: 5 }, &[(F, &[4, 2])], Err("out of range"));
    let start: (DType, &[usize]) = (I, &[]);
    row(Op::Narrow { axis: 1, len: 2 }, &[(F, &[4, 6]), start], Ok((F, &[4, 2])));
    row(Op::Narrow { axis: 1, len: 7 }, &[(F, &[4, 6]), start], Err("do not fit axis 1"));
    row(Op::Narrow { axis: 1, len: 2 }, &[(F, &[4, 6]), (I, &[1])], Err("i32[] scalar"));
    row(
        Op::SliceScatter { axis: 2 },
        &[(F, &[1, 3, 8]), (F, &[1, 3, 2]), start],
        Ok((F, &[1, 3, 8])),
    );
    row(
        Op::SliceScatter { axis: 2 },
        &[(F, &[1, 3, 8]), (F, &[1, 2, 2]), start],
        Err("does not fit"),
    );
    row(
        Op::SliceScatter { axis: 2 },
        &[(F, &[1, 3, 8]), (F, &[1, 3, 9]), start],
        Err("does not fit"),
    );
    row(Op::SliceScatter { axis: 0 }, &[(F, &[4]), (F, &[2]), (F, &[])], Err("i32[] scalar"));
    row(Op::Gather { axis: 0 }, &[(F, &[10, 4]), (I, &[2, 3])], Ok((F, &[2, 3, 4])));
    row(Op::Gather { axis: 0 }, &[(F, &[10, 4]), (F, &[2])], Err("integer"));
    let sum = |axes: Vec<usize>, keepdim| Op::Reduce { op: ReduceOp::Sum, axes, keepdim };
    row(sum(vec![1], false), &[(F, &[2, 3, 4])], Ok((F, &[2, 4])));
    row(sum(vec![0, 2], true), &[(F, &[2, 3, 4])], Ok((F, &[1, 3, 1])));
    row(sum(vec![1, 1], false), &[(F, &[2, 3])], Err("not distinct"));
    row(
        Op::Reduce { op: ReduceOp::Mean, axes: vec![0], keepdim: false },
        &[(I, &[2])],
        Err("float"),
    );
    row(Op::ArgMax { axis: 1 }, &[(F, &[2, 7])], Ok((I, &[2])));
    row(Op::Softmax { axis: 2, log: false }, &[(F, &[2, 7])], Err("out of range"));
}

#[test]
fn norms_check_their_vectors() {
    let ln = Op::LayerNorm { eps: 1e-5, has_weight: true, has_bias: true };
    row(ln.clone(), &[(F, &[2, 8]), (F, &[8]), (F, &[8])], Ok((F, &[2, 8])));
    row(ln.clone(), &[(F, &[2, 8]), (F, &[4]), (F, &[8])], Err("weight must have shape [8]"));
    row(ln, &[(F, &[2, 8]), (F, &[8])], Err("`bias` is missing"));
    let gn = Op::GroupNorm { groups: 3, eps: 1e-5, has_weight: false, has_bias: false };
    row(gn, &[(F, &[1, 8, 4])], Err("do not split into 3 groups"));
    let bn = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: true, has_bias: false };
    row(bn, &[(F, &[4, 3, 5, 5]), (F, &[3]), (F, &[3]), (F, &[3])], Ok((F, &[4, 3, 5, 5])));
    let part = |part| Op::LayerNormGrad { eps: 1e-5, has_weight: true, has_bias: false, part };
    let x: &[(DType, &[usize])] = &[(F, &[2, 8]), (F, &[8]), (F, &[2, 8])];
    row(part(GradPart::Input), x, Ok((F, &[2, 8])));
    row(part(GradPart::Weight), x, Ok((F, &[8])));
    row(part(GradPart::Bias), x, Err("no Bias operand"));
    row(part(GradPart::Input), &[(F, &[2, 8]), (F, &[8]), (F, &[2, 7])], Err("dy must have"));
}

#[test]
fn windows_attention_and_losses() {
    let conv = Op::Conv {
        stride: vec![2, 2],
        padding: vec![3, 3],
        dilation: vec![1, 1],
        groups: 1,
        has_bias: true,
    };
    let x: &[(DType, &[usize])] = &[(F, &[4, 3, 224, 224]), (F, &[64, 3, 7, 7]), (F, &[64])];
    row(conv.clone(), x, Ok((F, &[4, 64, 112, 112])));
    row(conv, &[x[0], x[1], (F, &[3])], Err("bias must have shape [64]"));
    let pool =
        Op::Pool { op: PoolOp::Max, kernel: vec![2, 2], stride: vec![2, 2], padding: vec![0, 0] };
    row(pool, &[(F, &[1, 3, 8, 8])], Ok((F, &[1, 3, 4, 4])));
    row(Op::Upsample { scale: 2 }, &[(F, &[1, 3, 8])], Ok((F, &[1, 3, 16])));
    let att = Op::Attention { causal: true, scale: 0.5, has_mask: true };
    let qkv: [(DType, &[usize]); 3] =
        [(F, &[2, 8, 5, 16]), (F, &[2, 2, 7, 16]), (F, &[2, 2, 7, 4])];
    row(att.clone(), &[qkv[0], qkv[1], qkv[2], (F, &[5, 7])], Ok((F, &[2, 8, 5, 4])));
    row(att, &[qkv[0], qkv[1], qkv[2], (F, &[5, 6])], Err("does not broadcast"));
    let dk = Op::AttentionGrad { causal: false, scale: 0.5, has_mask: false, part: GradPart::K };
    row(dk.clone(), &[qkv[0], qkv[1], qkv[2], (F, &[2, 8, 5, 4])], Ok((F, &[2, 2, 7, 16])));
    row(dk, &[qkv[0], qkv[1], qkv[2], (F, &[2, 8, 5, 4]), (F, &[1])], Err("takes 4 inputs"));
    // The mask's derivative has the scores' full shape, whatever the mask broadcast from.
    let dmask =
        |has_mask| Op::AttentionGrad { causal: true, scale: 0.5, has_mask, part: GradPart::Mask };
    let dy = (F, &[2, 8, 5, 4][..]);
    row(dmask(true), &[qkv[0], qkv[1], qkv[2], (F, &[5, 7]), dy], Ok((F, &[2, 8, 5, 7])));
    row(dmask(false), &[qkv[0], qkv[1], qkv[2], dy], Err("has no Mask operand"));
    row(Op::Rope { theta: 1e4, offset: 0, inverse: false }, &[(F, &[2, 5, 7])], Err("even D"));
    let rope = || Op::Rope { theta: 1e4, offset: 0, inverse: false };
    row(rope(), &[(F, &[2, 5, 8]), (I, &[])], Ok((F, &[2, 5, 8])));
    row(rope(), &[(F, &[2, 5, 8]), (F, &[])], Err("i32[] scalar"));
    row(rope(), &[(F, &[2, 5, 8]), (I, &[]), (I, &[])], Err("maybe a start, not 3"));
    row(Op::SoftmaxCrossEntropy, &[(F, &[4, 10]), (I, &[4])], Ok((F, &[])));
    row(Op::SoftmaxCrossEntropy, &[(F, &[4, 10]), (I, &[5])], Err("targets must have shape [4]"));
}

#[test]
fn step_chosen_types_are_checked_against_the_inputs() {
    let ok = |op: Op, x: &[(DType, &[usize])], out: (DType, &[usize])| {
        check(&op, x, out).unwrap_or_else(|e| panic!("{}: {e}", op.describe()))
    };
    let bad = |op: Op, x: &[(DType, &[usize])], out: (DType, &[usize]), words: &str| {
        let e = check(&op, x, out).expect_err(&op.describe());
        assert!(e.0.contains(words), "{}: {e} lacks `{words}`", op.describe());
    };
    ok(Op::Reshape, &[(F, &[2, 6])], (F, &[3, 4]));
    bad(Op::Reshape, &[(F, &[2, 6])], (F, &[5]), "cannot reshape");
    ok(Op::SumTo, &[(F, &[8, 3, 4])], (F, &[3, 1]));
    bad(Op::SumTo, &[(F, &[8, 3, 4])], (F, &[2, 4]), "does not broadcast");
    ok(Op::BroadcastTo, &[(F, &[])], (F, &[2, 2]));
    ok(Op::Cast, &[(F, &[3])], (I, &[3]));
    ok(Op::StopGradient, &[(F, &[2, 3])], (F, &[2, 3]));
    bad(Op::StopGradient, &[(F, &[2, 3])], (F, &[6]), "");
    ok(Op::Arange, &[], (I, &[5]));
    bad(Op::Arange, &[], (F, &[5]), "integer");
    ok(Op::SliceGrad { axis: 1, start: 2, end: 4 }, &[(F, &[3, 2])], (F, &[3, 6]));
    bad(Op::SliceGrad { axis: 1, start: 2, end: 4 }, &[(F, &[3, 3])], (F, &[3, 6]), "dy must");
    ok(Op::GatherGrad { axis: 0 }, &[(I, &[2, 3]), (F, &[2, 3, 4])], (F, &[10, 4]));
    let geo = (vec![1], vec![1], vec![1], 1);
    let gi = Op::ConvGradInput {
        stride: geo.0.clone(),
        padding: geo.1.clone(),
        dilation: geo.2,
        groups: 1,
    };
    ok(gi, &[(F, &[2, 6, 10]), (F, &[6, 4, 3])], (F, &[2, 4, 10]));
    ok(Op::UpsampleGrad { scale: 2 }, &[(F, &[1, 3, 16])], (F, &[1, 3, 8]));
    // A type the op determines must match exactly.
    bad(Op::Unary(UnaryOp::Relu), &[(F, &[2])], (F, &[3]), "the inputs give f32[2]");
}

#[test]
fn padding_and_resampling() {
    let pad = |mode, widths: Vec<[usize; 2]>| Op::Pad { widths, mode, value: 0.0 };
    row(pad(PadMode::Constant, vec![[0, 0], [2, 1]]), &[(F, &[2, 3])], Ok((F, &[2, 6])));
    row(pad(PadMode::Reflect, vec![[0, 0], [3, 0]]), &[(F, &[2, 3])], Err("below the size 3"));
    row(pad(PadMode::Replicate, vec![[1, 1]]), &[(F, &[2, 3])], Err("one pair per axis"));
    row(pad(PadMode::Constant, vec![[1, 1]]), &[(I, &[3])], Err("must be a float"));
    let back = |mode| Op::PadGrad { widths: vec![[0, 0], [2, 1]], mode };
    row(back(PadMode::Reflect), &[(F, &[2, 6])], Ok((F, &[2, 3])));
    row(back(PadMode::Reflect), &[(F, &[2, 4])], Err("below the size 1"));
    row(back(PadMode::Constant), &[(F, &[2, 3])], Err("is not padded by"));
    let up =
        |mode, size: Vec<usize>, scale| Op::Interpolate { mode, size, scale, align_corners: false };
    row(up(InterpMode::Linear, vec![7, 5], None), &[(F, &[1, 2, 3, 4])], Ok((F, &[1, 2, 7, 5])));
    row(up(InterpMode::Nearest, vec![9], Some(vec![3.0])), &[(F, &[1, 2, 3])], Ok((F, &[1, 2, 9])));
    row(up(InterpMode::Nearest, vec![9, 9], None), &[(F, &[1, 2, 3])], Err("one positive size"));
    row(up(InterpMode::Nearest, vec![9], Some(vec![0.0])), &[(F, &[1, 2, 3])], Err("positive"));
    row(up(InterpMode::Nearest, vec![9], None), &[(F, &[2, 3])], Err("[N, C, L]"));
    let grad = Op::InterpolateGrad {
        mode: InterpMode::Linear,
        size: vec![7, 5],
        scale: None,
        align_corners: true,
    };
    check(&grad, &[(F, &[1, 2, 7, 5])], (F, &[1, 2, 3, 4])).expect("the forward's input");
    let e = check(&grad, &[(F, &[1, 2, 7, 6])], (F, &[1, 2, 3, 4])).expect_err("wrong dy");
    assert!(e.0.contains("dy must have shape [1, 2, 7, 5]"), "{e}");
}

#[test]
fn comparisons_and_selection() {
    use crate::op::CompareOp;
    const B: DType = DType::Bool;
    row(Op::Compare(CompareOp::Lt), &[(F, &[2, 1, 4]), (F, &[3, 1])], Ok((B, &[2, 3, 4])));
    row(Op::Compare(CompareOp::Eq), &[(I, &[5, 1]), (I, &[7])], Ok((B, &[5, 7])));
    row(Op::Compare(CompareOp::Ge), &[(F, &[2]), (I, &[2])], Err("one dtype"));
    row(Op::Compare(CompareOp::Ne), &[(F, &[2, 3]), (F, &[4])], Err("do not broadcast"));
    row(Op::Where, &[(B, &[2, 1]), (F, &[3]), (F, &[])], Ok((F, &[2, 3])));
    row(Op::Where, &[(B, &[4]), (I, &[1]), (I, &[2, 1])], Ok((I, &[2, 4])));
    row(Op::Where, &[(F, &[2]), (F, &[2]), (F, &[2])], Err("must be a bool tensor"));
    row(Op::Where, &[(B, &[2]), (F, &[2]), (I, &[2])], Err("one dtype"));
    row(Op::Where, &[(B, &[3]), (F, &[2]), (F, &[2])], Err("do not broadcast"));
    row(Op::Binary(BinaryOp::Maximum), &[(F, &[2, 1]), (F, &[3])], Ok((F, &[2, 3])));
    row(Op::Binary(BinaryOp::Minimum), &[(I, &[2]), (F, &[2])], Err("one dtype"));
}

#[test]
fn scans_and_top_k() {
    const B: DType = DType::Bool;
    let cumsum = |axis| Op::Cumsum { axis, reverse: true };
    row(cumsum(1), &[(F, &[2, 5])], Ok((F, &[2, 5])));
    row(cumsum(0), &[(I, &[7])], Ok((I, &[7])));
    row(cumsum(2), &[(F, &[2, 5])], Err("out of range"));
    row(cumsum(0), &[(B, &[3])], Err("number tensor"));
    row(Op::TopK { k: 2, axis: 1 }, &[(F, &[3, 8, 4])], Ok((I, &[3, 2, 4])));
    row(Op::TopK { k: 9, axis: 1 }, &[(F, &[3, 8])], Err("k = 9 is out of range"));
    row(Op::TopK { k: 0, axis: 0 }, &[(F, &[3])], Err("k = 0"));
    let along = Op::TakeAlong { axis: 1 };
    row(along.clone(), &[(F, &[3, 8, 4]), (I, &[3, 2, 4])], Ok((F, &[3, 2, 4])));
    row(along.clone(), &[(F, &[3, 8, 4]), (I, &[3, 2, 5])], Err("does not read"));
    row(along.clone(), &[(F, &[3, 8]), (I, &[2])], Err("does not read"));
    row(along, &[(F, &[3, 8]), (F, &[3, 2])], Err("integer"));
    let grad = Op::TakeAlongGrad { axis: 1 };
    check(&grad, &[(I, &[3, 2, 4]), (F, &[3, 2, 4])], (F, &[3, 8, 4])).expect("typed");
    let e = check(&grad, &[(I, &[3, 2, 4]), (F, &[3, 3, 4])], (F, &[3, 8, 4])).unwrap_err();
    assert!(e.0.contains("dy must have"), "{e}");
    assert!(check(&grad, &[(I, &[3, 2]), (F, &[3, 2])], (F, &[4, 8])).is_err());
}

#[test]
fn steps_over_half_operands_may_keep_their_f32_value() {
    let (h, b) = (DType::F16, DType::BF16);
    let ok = |op: Op, x: &[(DType, &[usize])], out: (DType, &[usize])| {
        check(&op, x, out).unwrap_or_else(|e| panic!("{}: {e}", op.describe()))
    };
    ok(Op::MatMul, &[(h, &[4, 5]), (h, &[5, 3])], (F, &[4, 3]));
    ok(Op::MatMul, &[(h, &[4, 5]), (h, &[5, 3])], (h, &[4, 3]));
    ok(Op::MatMul, &[(b, &[4, 5]), (b, &[5, 3])], (F, &[4, 3]));
    let conv = Op::Conv {
        stride: vec![1],
        padding: vec![0],
        dilation: vec![1],
        groups: 1,
        has_bias: true,
    };
    // The bias stays f32: it is added to the f32 accumulator.
    ok(conv, &[(h, &[1, 2, 8]), (h, &[3, 2, 3]), (F, &[3])], (F, &[1, 3, 6]));
    let attn = Op::Attention { causal: false, scale: 0.5, has_mask: false };
    ok(attn, &[(b, &[1, 2, 4, 8]), (b, &[1, 2, 4, 8]), (b, &[1, 2, 4, 8])], (F, &[1, 2, 4, 8]));
    // Operands still share one type.
    let e = check(&Op::MatMul, &[(h, &[4, 5]), (b, &[5, 3])], (F, &[4, 3])).unwrap_err();
    assert!(e.0.contains("one dtype"), "{e}");
    ok(Op::Unary(UnaryOp::Relu), &[(h, &[4])], (F, &[4]));
    // Never narrower, and never another type.
    let e = check(&Op::Unary(UnaryOp::Relu), &[(h, &[4])], (b, &[4])).unwrap_err();
    assert!(e.0.contains("the inputs give f16[4]"), "{e}");
    let e = check(&Op::MatMul, &[(F, &[4, 5]), (F, &[5, 3])], (h, &[4, 3])).unwrap_err();
    assert!(e.0.contains("the inputs give f32[4, 3]"), "{e}");
}
