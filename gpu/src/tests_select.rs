//! The selection and attention kernels (`kernels/select.rs`, `kernels/attention/`) against the
//! CPU reference: concat, slice, gather and their derivatives, ReduceGrad (with ties), argmax,
//! rope, attention, its row statistics and its three derivatives (with and without the
//! statistics given). Inputs are given explicitly (repeated gather indices, tied maxima).

use super::test_util::{
    assert_close, attention_grad_parts, check_on_both, run_on_cpu, run_on_gpu as gpu_run, values,
};
use crate::program::GpuOp;
use mgn_ir::op::{GradPart, Op, ReduceOp};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

fn floats(shape: &[usize], seed: u32) -> Tensor {
    Tensor::f32(shape.to_vec(), values(shape.iter().product(), seed))
}

#[test]
fn concat_and_slices_match_the_cpu() {
    let pieces = [floats(&[2, 3, 4], 1), floats(&[2, 1, 4], 2), floats(&[2, 5, 4], 3)];
    check_on_both(&Op::Concat { axis: 1 }, &pieces, DType::F32, &[2, 9, 4], 0.0);
    let ints = [Tensor::i32(vec![2, 2], vec![1, 2, 3, 4]), Tensor::i32(vec![2, 1], vec![-5, 6])];
    check_on_both(&Op::Concat { axis: 1 }, &ints, DType::I32, &[2, 3], 0.0);
    let x = floats(&[4, 6, 3], 4);
    check_on_both(
        &Op::Slice { axis: 1, start: 2, end: 5 },
        std::slice::from_ref(&x),
        DType::F32,
        &[4, 3, 3],
        0.0,
    );
    check_on_both(
        &Op::Slice { axis: 0, start: 1, end: 4 },
        std::slice::from_ref(&x),
        DType::F32,
        &[3, 6, 3],
        0.0,
    );
    check_on_both(
        &Op::Slice { axis: 2, start: 2, end: 3 },
        std::slice::from_ref(&x),
        DType::F32,
        &[4, 6, 1],
        0.0,
    );
    check_on_both(
        &Op::SliceGrad { axis: 1, start: 2, end: 5 },
        &[floats(&[4, 3, 3], 5)],
        DType::F32,
        &[4, 6, 3],
        0.0,
    );
    check_on_both(
        &Op::SliceGrad { axis: 0, start: 0, end: 1 },
        &[floats(&[1, 6, 3], 6)],
        DType::F32,
        &[4, 6, 3],
        0.0,
    );
    check_on_both(
        &Op::SliceGrad { axis: 2, start: 1, end: 3 },
        &[floats(&[4, 6, 2], 7)],
        DType::F32,
        &[4, 6, 3],
        0.0,
    );
}

#[test]
fn gathers_and_their_gradients_match_the_cpu() {
    // Axis 0 (an embedding lookup) with a 2-D index and repeats.
    let table = floats(&[5, 4], 11);
    let idx = Tensor::i32(vec![2, 3], vec![4, 0, 4, 1, 1, 3]);
    check_on_both(&Op::Gather { axis: 0 }, &[table, idx.clone()], DType::F32, &[2, 3, 4], 0.0);
    check_on_both(
        &Op::GatherGrad { axis: 0 },
        &[idx, floats(&[2, 3, 4], 12)],
        DType::F32,
        &[5, 4],
        1e-6,
    );
    // A middle axis with repeats and an untouched row.
    let x = floats(&[3, 6, 2], 13);
    let idx = Tensor::i32(vec![4], vec![5, 0, 5, 2]);
    check_on_both(&Op::Gather { axis: 1 }, &[x, idx.clone()], DType::F32, &[3, 4, 2], 0.0);
    check_on_both(
        &Op::GatherGrad { axis: 1 },
        &[idx, floats(&[3, 4, 2], 14)],
        DType::F32,
        &[3, 6, 2],
        1e-6,
    );
    // The last axis, and an integer source.
    let xi = Tensor::i32(vec![2, 3], vec![10, 11, 12, 20, 21, 22]);
    check_on_both(
        &Op::Gather { axis: 1 },
        &[xi, Tensor::i32(vec![2], vec![2, 2])],
        DType::I32,
        &[2, 2],
        0.0,
    );
}

/// Rows wide enough for the workgroup-per-row gradient kernel: columns past one workgroup, index
/// counts that are not a multiple of it, a row matched by every position of a whole block, rows
/// matched by none, and a middle axis.
#[test]
fn wide_gather_gradients_sum_their_matches_in_order() {
    let m = 700;
    let idx: Vec<i32> = (0..m as i32).map(|k| if k < 300 { 5 } else { (k * k + 3) % 37 }).collect();
    let idx = Tensor::i32(vec![m], idx);
    check_on_both(
        &Op::GatherGrad { axis: 0 },
        &[idx, floats(&[m, 300], 41)],
        DType::F32,
        &[37, 300],
        1e-6,
    );
    let idx = Tensor::i32(vec![150], (0..150).map(|k: i32| k * 7 % 10).collect());
    check_on_both(
        &Op::GatherGrad { axis: 1 },
        &[idx, floats(&[3, 150, 96], 42)],
        DType::F32,
        &[3, 10, 96],
        1e-6,
    );
}

/// The wide kernel drops out-of-range positions too (the CPU refuses them, so the expected sums
/// are written out here).
#[test]
fn wide_gather_gradients_drop_out_of_range_positions() {
    let (rows, cols) = (4, 130);
    let idx = vec![-1, 2, 4, 2, 0, 7];
    let dy = floats(&[idx.len(), cols], 43);
    let Some(got) = gpu_run(
        &Op::GatherGrad { axis: 0 },
        &[Tensor::i32(vec![idx.len()], idx.clone()), dy.clone()],
        DType::F32,
        &[rows, cols],
    ) else {
        return;
    };
    let dyv = dy.to_f64_vec();
    let mut want = vec![0.0f32; rows * cols];
    for (k, &j) in idx.iter().enumerate() {
        if (0..rows as i32).contains(&j) {
            for c in 0..cols {
                want[j as usize * cols + c] += dyv[k * cols + c] as f32;
            }
        }
    }
    assert_eq!(got.to_f64_vec(), want.iter().map(|&v| v as f64).collect::<Vec<_>>());
}

#[test]
fn out_of_range_gather_indices_read_nothing() {
    // The CPU refuses these; the GPU must stay inside the tensor: 0 for gather, dropped for its
    // gradient.
    let x = floats(&[3, 2], 21);
    let idx = Tensor::i32(vec![3], vec![-1, 2, 3]);
    let Some(got) =
        gpu_run(&Op::Gather { axis: 0 }, &[x.clone(), idx.clone()], DType::F32, &[3, 2])
    else {
        return;
    };
    let xv = x.to_f64_vec();
    assert_eq!(got.to_f64_vec(), vec![0.0, 0.0, xv[4], xv[5], 0.0, 0.0]);
    let dy = Tensor::f32(vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let got = gpu_run(&Op::GatherGrad { axis: 0 }, &[idx, dy], DType::F32, &[3, 2])
        .expect("the GPU ran once");
    assert_eq!(got.to_f64_vec(), vec![0.0, 0.0, 0.0, 0.0, 3.0, 4.0]);
}

#[test]
fn reduce_gradients_and_argmax_match_the_cpu() {
    // Few distinct values, so maxima and minima tie within groups.
    let x =
        Tensor::f32(vec![2, 7, 3], values(42, 31).into_iter().map(|v| (v * 2.0).round()).collect());
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for (axes, keepdim, shape) in [
            (vec![1], false, vec![2, 3]),
            (vec![0, 2], true, vec![1, 7, 1]),
            (vec![2, 0], false, vec![7]),
            (vec![0, 1, 2], false, vec![]),
        ] {
            let y = run_on_cpu(
                &Op::Reduce { op, axes: axes.clone(), keepdim },
                &[&x],
                DType::F32,
                &shape,
            );
            let dy = floats(&shape, 32);
            check_on_both(
                &Op::ReduceGrad { op, axes, keepdim },
                &[x.clone(), y, dy],
                DType::F32,
                &[2, 7, 3],
                1e-6,
            );
        }
    }
    check_on_both(&Op::ArgMax { axis: 1 }, std::slice::from_ref(&x), DType::I32, &[2, 3], 0.0);
    check_on_both(&Op::ArgMax { axis: 0 }, std::slice::from_ref(&x), DType::I32, &[7, 3], 0.0);
    check_on_both(&Op::ArgMax { axis: 2 }, &[floats(&[4, 5, 9], 33)], DType::I32, &[4, 5], 0.0);
}

#[test]
fn rope_matches_the_cpu() {
    let x = floats(&[2, 3, 5, 8], 41);
    for offset in [0, 3] {
        for inverse in [false, true] {
            check_on_both(
                &Op::Rope { theta: 10000.0, offset, inverse },
                std::slice::from_ref(&x),
                DType::F32,
                &[2, 3, 5, 8],
                1e-5,
            );
        }
    }
    check_on_both(
        &Op::Rope { theta: 500.0, offset: 1, inverse: false },
        &[floats(&[7, 4], 42)],
        DType::F32,
        &[7, 4],
        1e-5,
    );
}

#[test]
fn rope_inverse_undoes_rope() {
    let x = floats(&[3, 6, 4], 43);
    let Some(y) = gpu_run(
        &Op::Rope { theta: 10000.0, offset: 3, inverse: false },
        std::slice::from_ref(&x),
        DType::F32,
        &[3, 6, 4],
    ) else {
        return;
    };
    let back = gpu_run(
        &Op::Rope { theta: 10000.0, offset: 3, inverse: true },
        &[y],
        DType::F32,
        &[3, 6, 4],
    )
    .expect("the GPU ran once");
    for (a, b) in back.to_f64_vec().iter().zip(x.to_f64_vec()) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

/// q, k, v (and the mask) for batch 2, Hq 4, Hkv 2, D 8, Dv 6.
fn attention_inputs(tq: usize, tk: usize, mask: Option<&[usize]>) -> Vec<Tensor> {
    let mut x =
        vec![floats(&[2, 4, tq, 8], 51), floats(&[2, 2, tk, 8], 52), floats(&[2, 2, tk, 6], 53)];
    if let Some(m) = mask {
        x.push(floats(m, 54));
    }
    x
}

#[test]
fn attention_matches_the_cpu() {
    let scale = 1.0 / 8f64.sqrt();
    for (tq, tk) in [(3, 5), (5, 3), (4, 4)] {
        for causal in [false, true] {
            for mask in [None, Some(vec![tq, tk]), Some(vec![2, 1, tq, tk])] {
                let has_mask = mask.is_some();
                let x = attention_inputs(tq, tk, mask.as_deref());
                check_on_both(
                    &Op::Attention { causal, scale, has_mask },
                    &x,
                    DType::F32,
                    &[2, 4, tq, 6],
                    1e-5,
                );
            }
        }
    }
    // Rank 3 (no batch axes), one KV head for all query heads, Dv = D.
    let x = [floats(&[3, 2, 4], 61), floats(&[1, 3, 4], 62), floats(&[1, 3, 4], 63)];
    check_on_both(
        &Op::Attention { causal: true, scale: 0.5, has_mask: false },
        &x,
        DType::F32,
        &[3, 2, 4],
        1e-5,
    );
}

#[test]
fn attention_gradients_match_the_cpu() {
    let scale = 1.0 / 8f64.sqrt();
    for (tq, tk) in [(3, 5), (5, 3)] {
        for (causal, mask) in [(true, Some(vec![tq, tk])), (false, None), (true, None)] {
            let has_mask = mask.is_some();
            let mut x = attention_inputs(tq, tk, mask.as_deref());
            x.push(floats(&[2, 4, tq, 6], 55));
            for (part, shape) in attention_grad_parts(2, (4, 2), (tq, tk), (8, 6), has_mask) {
                check_on_both(
                    &Op::AttentionGrad { causal, scale, has_mask, part },
                    &x,
                    DType::F32,
                    &shape,
                    2e-5,
                );
            }
        }
    }
}

/// Forward, row statistics and every derivative (the mask's too) of one attention configuration
/// against the CPU. `q, k, v` are `[B, Hq, Tq, D]`, `[B, Hkv, Tk, D]`, `[B, Hkv, Tk, Dv]`;
/// `mask` (if any) is appended. The derivatives run as compiled (statistics recomputed) and as
/// the GPU rewrites them (`AttentionGradWithStats`), against the same CPU result.
fn check_attention(
    b: usize,
    (hq, hkv): (usize, usize),
    (tq, tk): (usize, usize),
    (d, dv): (usize, usize),
    causal: bool,
    mask: Option<Tensor>,
    seed: u32,
) {
    let scale = 1.0 / (d as f64).sqrt();
    let has_mask = mask.is_some();
    let mut x = vec![
        floats(&[b, hq, tq, d], seed),
        floats(&[b, hkv, tk, d], seed + 1),
        floats(&[b, hkv, tk, dv], seed + 2),
    ];
    x.extend(mask);
    let forward = Op::Attention { causal, scale, has_mask };
    check_on_both(&forward, &x, DType::F32, &[b, hq, tq, dv], 1e-5);
    let mut qk_mask = vec![x[0].clone(), x[1].clone()];
    qk_mask.extend(x.get(3).cloned());
    let stats_op = GpuOp::AttentionStats { causal, scale, has_mask };
    check_on_both(&stats_op, &qk_mask, DType::F32, &[b, hq, tq, 2], 1e-5);
    let refs: Vec<&Tensor> = x.iter().collect();
    let out = run_on_cpu(&forward, &refs, DType::F32, &[b, hq, tq, dv]);
    let stats =
        run_on_cpu(&stats_op, &qk_mask.iter().collect::<Vec<_>>(), DType::F32, &[b, hq, tq, 2]);
    x.push(floats(&[b, hq, tq, dv], seed + 3));
    for (part, shape) in attention_grad_parts(b, (hq, hkv), (tq, tk), (d, dv), has_mask) {
        let op = Op::AttentionGrad { causal, scale, has_mask, part };
        check_on_both(&op, &x, DType::F32, &shape, 5e-5);
        let want = run_on_cpu(&op, &x.iter().collect::<Vec<_>>(), DType::F32, &shape);
        // As the GPU rewrites it: with the statistics, and for dq and dk the forward output.
        let mut given = x.clone();
        given.push(stats.clone());
        if part != GradPart::V {
            given.push(out.clone());
        }
        let op = GpuOp::AttentionGradWithStats { causal, scale, has_mask, part };
        let Some(got) = gpu_run(&op, &given, DType::F32, &shape) else { return };
        assert_close(&op, &got, &want, 5e-5);
    }
}

#[test]
fn attention_statistics_on_the_gpu_match_the_cpu() {
    // One head, three keys: row 0 sees all, row 1 only key 0 (causal), row 2 is masked to -inf
    // everywhere (the reference's own values are checked in `reference.rs`).
    let q = Tensor::f32(vec![1, 3, 1], vec![1.0, 1.0, 1.0]);
    let k = Tensor::f32(vec![1, 3, 1], vec![0.0, 1.0, 2.0]);
    let inf = f32::NEG_INFINITY;
    let mask = Tensor::f32(vec![3, 3], vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, inf, inf, inf]);
    check_on_both(
        &GpuOp::AttentionStats { causal: true, scale: 1.0, has_mask: false },
        &[q.clone(), k.clone()],
        DType::F32,
        &[1, 3, 2],
        1e-6,
    );
    check_on_both(
        &GpuOp::AttentionStats { causal: false, scale: 1.0, has_mask: true },
        &[q, k, mask],
        DType::F32,
        &[1, 3, 2],
        1e-6,
    );
}

#[test]
fn rows_masked_entirely_with_a_large_finite_value_stay_uniform() {
    // -1e9 on every key of rows 0 and 3 (a padded query): the softmax there is uniform on both
    // backends, which a logsumexp stored in f32 (-1e9 + ln Tk rounds to -1e9) would not give.
    let (tq, tk) = (5, 19);
    let mask = Tensor::f32(
        vec![1, 1, tq, tk],
        (0..tq * tk)
            .map(|i| if matches!(i / tk, 0 | 3) || i % tk > 15 { -1e9 } else { 0.0 })
            .collect(),
    );
    check_attention(1, (2, 1), (tq, tk), (8, 8), false, Some(mask), 111);
}

#[test]
fn causal_grouped_attention_at_lengths_off_the_tile_matches_the_cpu() {
    // Hq 6 over Hkv 2 and 3 (SmolLM2's grouping, smaller), causal, lengths not a multiple of any
    // tile.
    check_attention(1, (6, 2), (37, 37), (8, 8), true, None, 71);
    check_attention(2, (6, 3), (19, 19), (8, 6), true, None, 72);
}

#[test]
fn cross_attention_with_a_padding_mask_matches_the_cpu() {
    // Tq ≠ Tk both ways, a [B, 1, 1, Tk] padding-style mask, and a causal Tq > Tk whose first
    // rows see no key at all.
    let pad = Tensor::f32(
        vec![2, 1, 1, 70],
        (0..140).map(|i| if i % 70 >= 60 + i / 70 * 5 { -1e9 } else { 0.0 }).collect(),
    );
    check_attention(2, (2, 2), (37, 70), (8, 8), false, Some(pad), 81);
    check_attention(1, (4, 2), (70, 37), (8, 4), true, None, 82);
}

#[test]
fn head_dim_64_attention_matches_the_cpu() {
    // Whisper's and SmolLM2's head dim, where the tiles are smallest.
    check_attention(1, (2, 1), (40, 40), (64, 64), true, None, 91);
    check_attention(1, (2, 2), (23, 45), (64, 64), false, Some(floats(&[23, 45], 92)), 93);
}

#[test]
fn attention_over_several_query_tiles_and_key_blocks_matches_the_cpu() {
    // The blocked forward's tiles are 32 (16 at 64 invocations) query rows by 64 keys: lengths
    // that span several of each and end inside one, causal with Tq < Tk, a mask, grouped heads,
    // head dims that do not fill a panel, and value rows of one, two and three vec4s a lane.
    let mask = floats(&[2, 1, 100, 150], 121);
    check_attention(2, (4, 2), (100, 150), (64, 64), true, Some(mask), 122);
    check_attention(1, (3, 1), (70, 130), (24, 40), false, None, 123);
    check_attention(1, (2, 2), (33, 65), (12, 136), true, None, 124);
}

#[test]
fn fully_masked_rows_give_zeros_like_the_cpu() {
    // Rows 1 and 4 of the mask are all -inf (no key), row 2 has one visible key; the CPU gives
    // zeros for the empty rows and zero gradients through them.
    let (tq, tk) = (6, 21);
    let mask: Vec<f32> = (0..tq * tk)
        .map(|i| match (i / tk, i % tk) {
            (1 | 4, _) => f32::NEG_INFINITY,
            (2, j) if j != 17 => f32::NEG_INFINITY,
            _ => 0.0,
        })
        .collect();
    let mask = Tensor::f32(vec![tq, tk], mask);
    check_attention(2, (2, 1), (tq, tk), (8, 6), false, Some(mask.clone()), 101);
    check_attention(1, (3, 1), (tq, tk), (8, 8), true, Some(mask), 102);
    let Some(y) = gpu_run(
        &Op::Attention { causal: false, scale: 0.5, has_mask: true },
        &[
            floats(&[1, 1, tq, 4], 103),
            floats(&[1, 1, tk, 4], 104),
            floats(&[1, 1, tk, 4], 105),
            floats(&[tq, tk], 0),
        ],
        DType::F32,
        &[1, 1, tq, 4],
    ) else {
        return;
    };
    assert!(y.to_f64_vec().iter().all(|v| v.is_finite()));
}
