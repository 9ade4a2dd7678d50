//! The attention kernels at model shapes, without a device: naga accepts each and its
//! workgroup array fits the Vulkan floor. Their numbers are checked against the CPU in
//! `tests_select.rs`.

use super::*;
use crate::kernels::Operand;
use mgn_ir::DType;

fn operand(offset: usize, shape: &[usize]) -> Operand {
    Operand::at(offset, shape, DType::F32)
}

/// The f32 words of a kernel's one workgroup array (of f32s or of vec4s).
fn workgroup_words(body: &str) -> usize {
    let count = |ty: &str| {
        body.split(&format!("array<{ty}, ")).nth(1).and_then(|s| s.split('>').next())?.parse().ok()
    };
    count("f32").or_else(|| count("vec4<f32>").map(|n: usize| 4 * n)).expect("one workgroup array")
}

/// Every kernel naga accepts (barriers in uniform control flow included), and its
/// workgroup array within 16 KiB, at the shapes of the models we run and both widths.
#[test]
fn model_shaped_kernels_validate_and_fit_the_floor() {
    // (batch, Hq, Hkv, Tq, Tk, D, causal): Whisper tiny's encoder, SmolLM2-135M, a
    // cross-attention, a tiny head; then SmolLM2 decoding against its cache (the forward's
    // `decode` kernel) with one and four rows, several key chunks, wide and odd heads.
    let shapes = [
        (1, 6, 6, 1500, 1500, 64, false),
        (1, 9, 3, 128, 128, 64, true),
        (2, 4, 2, 37, 70, 8, false),
        (1, 2, 1, 5, 3, 128, true),
        (1, 9, 3, 1, 256, 64, true),
        (2, 9, 3, 4, 1000, 64, false),
        (1, 2, 1, 2, 33, 256, true),
        (1, 3, 1, 1, 7, 24, false),
    ];
    for (b, hq, hkv, tq, tk, d, causal) in shapes {
        for width in [256, 128, 64] {
            // q, k, v, mask, dy, then the statistics and the forward output.
            let x = [
                operand(0, &[b, hq, tq, d]),
                operand(1 << 20, &[b, hkv, tk, d]),
                operand(2 << 20, &[b, hkv, tk, d]),
                operand(3 << 20, &[tq, tk]),
                operand(4 << 20, &[b, hq, tq, d]),
                operand(6 << 20, &[b, hq, tq, 2]),
                operand(7 << 20, &[b, hq, tq, d]),
            ];
            let (scale, has_mask) = (0.125, true);
            let grad = |part| GpuOp::Plan(Op::AttentionGrad { causal, scale, has_mask, part });
            let given = |part| GpuOp::AttentionGradWithStats { causal, scale, has_mask, part };
            let steps = [
                (GpuOp::Plan(Op::Attention { causal, scale, has_mask }), 4),
                (GpuOp::AttentionStats { causal, scale, has_mask }, 3),
                (grad(GradPart::Q), 5),
                (grad(GradPart::K), 5),
                (grad(GradPart::V), 5),
                (given(GradPart::Q), 7),
                (given(GradPart::K), 7),
                (given(GradPart::V), 6),
                (grad(GradPart::Mask), 5),
                (given(GradPart::Mask), 7),
            ];
            for (op, n) in steps {
                let shape = match &op {
                    GpuOp::Plan(Op::AttentionGrad { part: GradPart::K | GradPart::V, .. })
                    | GpuOp::AttentionGradWithStats { part: GradPart::K | GradPart::V, .. } => {
                        vec![b, hkv, tk, d]
                    }
                    GpuOp::AttentionStats { .. } => vec![b, hq, tq, 2],
                    GpuOp::Plan(Op::AttentionGrad { part: GradPart::Mask, .. })
                    | GpuOp::AttentionGradWithStats { part: GradPart::Mask, .. } => {
                        vec![b, hq, tq, tk]
                    }
                    _ => vec![b, hq, tq, d],
                };
                // The statistics read q, k and the mask.
                let stats_inputs = [x[0].clone(), x[1].clone(), x[3].clone()];
                let inputs = if matches!(op, GpuOp::AttentionStats { .. }) {
                    &stats_inputs[..]
                } else {
                    &x[..n]
                };
                let target = crate::kernels::Target::floor(width);
                let src = generate(&op, inputs, &operand(5 << 20, &shape), target)
                    .unwrap_or_else(|e| panic!("{}: {e}", op.describe()));
                assert_eq!(src.invocations % width as u64, 0);
                let words = workgroup_words(&src.body);
                assert!(words <= SHARED_WORDS, "{} at width {width}: {words} words", op.describe());
                super::super::validate(&src.body).unwrap_or_else(|e| {
                    panic!("{} at width {width}: {e}\n{}", op.describe(), src.body)
                });
            }
        }
    }
}

/// The forward takes the decode kernel for few query rows and the tiled one past them.
#[test]
fn few_query_rows_take_the_decode_kernel() {
    let forward = |tq: usize, tk: usize, d: usize, width: u32| {
        let x = [
            operand(0, &[1, 9, tq, d]),
            operand(1 << 20, &[1, 3, tk, d]),
            operand(2 << 20, &[1, 3, tk, d]),
        ];
        let op = GpuOp::Plan(Op::Attention { causal: true, scale: 0.125, has_mask: false });
        let target = crate::kernels::Target::floor(width);
        generate(&op, &x, &operand(3 << 20, &[1, 9, tq, d]), target).expect("a kernel").body
    };
    // Only the decode kernel merges `(max, sum)` pairs in a tree over the workgroup, and only
    // the blocked one keeps its workgroup array as vec4s.
    let decode = |body: &str| body.contains("s = s >> 1u");
    let blocked = |body: &str| body.contains("sh: array<vec4<f32>");
    for width in [256, 128, 64] {
        assert!(decode(&forward(1, 256, 64, width)));
        assert!(decode(&forward(decode::MAX_ROWS, 5000, 24, width)));
        let past = forward(decode::MAX_ROWS + 1, 256, 64, width);
        assert!(!decode(&past) && blocked(&past));
        // Value rows wider than the blocked kernel holds take the tiled one.
        let wide = forward(40, 40, blocked::MAX_DV + 8, width);
        assert!(!decode(&wide) && !blocked(&wide));
    }
}
