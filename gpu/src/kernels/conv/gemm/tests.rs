//! The implicit GEMM's tiles: every tile variant through each convolution against the CPU,
//! the chooser's tiles within the floor, and the throughput sweep (ignored; for a real GPU).

use super::*;
use crate::test_util::{check_on_both, values};
use mgn_ir::op::Op;
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;
use std::cell::RefCell;

/// A GEMM's `(groups, m, n, k)` and the tile its kernel got.
pub(super) type Made = ((usize, usize, usize, usize), Tile);

thread_local! {
    /// Tiles the GEMM kernels take instead of the chooser's (the first whose invocations
    /// match the workgroup width), so that small test shapes run every tile variant.
    pub(super) static FORCED: RefCell<Vec<Tile>> = const { RefCell::new(Vec::new()) };
    /// Every GEMM a kernel was generated for, `(groups, m, n, k)`, with the tile it got: the
    /// throughput sweep prints them beside its timings, the data for tuning `Tile::cost`.
    pub(super) static MADE: RefCell<Vec<Made>> = const { RefCell::new(Vec::new()) };
}

fn tile(tm: usize, tn: usize, rm: usize, rn: usize, s: usize, bk: usize) -> Tile {
    Tile { tm, tn, rm, rn, s, bk }
}

/// Each variant for 256- and 128-wide workgroups: the big square tile, a split K with a
/// small tile, a one-row tile (depthwise), a tile smaller than a staging pass (guarded
/// staging), a tall one, and 8×8 and 8×4 register blocks (vec4 reads of the staged slices),
/// the latter with a split K.
fn variants() -> Vec<Vec<Tile>> {
    vec![
        vec![tile(128, 128, 8, 8, 1, 8), tile(128, 64, 8, 8, 1, 8)],
        vec![tile(64, 64, 8, 4, 2, 16), tile(64, 32, 8, 4, 2, 16)],
        vec![tile(64, 64, 4, 4, 1, 16), tile(64, 32, 4, 4, 1, 16)],
        vec![tile(16, 16, 2, 2, 4, 32), tile(16, 16, 2, 2, 2, 32)],
        vec![tile(1, 128, 1, 1, 2, 16), tile(1, 128, 1, 1, 1, 16)],
        vec![tile(8, 8, 1, 1, 4, 8), tile(8, 8, 1, 1, 2, 8)],
        vec![tile(128, 16, 8, 2, 2, 16), tile(128, 16, 8, 2, 1, 16)],
    ]
}

#[test]
fn every_tile_variant_matches_the_cpu() {
    // Odd sizes that overhang every tile, groups, stride, padding and dilation.
    let (x, w) = (vec![2, 6, 9, 8], vec![10, 3, 3, 2]);
    let (stride, padding, dilation, groups) = (vec![2, 1], vec![1, 2], vec![2, 1], 2);
    let y = vec![2, 10, 4, 11];
    let (xt, wt, bt, dyt) = (
        Tensor::f32(x.clone(), values(2 * 6 * 9 * 8, 1)),
        Tensor::f32(w.clone(), values(10 * 3 * 3 * 2, 2)),
        Tensor::f32(vec![10], values(10, 3)),
        Tensor::f32(y.clone(), values(2 * 10 * 4 * 11, 4)),
    );
    for v in variants() {
        FORCED.with(|f| *f.borrow_mut() = v.clone());
        let conv = Op::Conv {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups,
            has_bias: true,
        };
        check_on_both(&conv, &[xt.clone(), wt.clone(), bt.clone()], DType::F32, &y, 1e-5);
        let gi = Op::ConvGradInput {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups,
        };
        check_on_both(&gi, &[dyt.clone(), wt.clone()], DType::F32, &x, 1e-5);
        let gw = Op::ConvGradWeight {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            groups,
        };
        check_on_both(&gw, &[xt.clone(), dyt.clone()], DType::F32, &w, 1e-5);
        // The phased input gradient (strided, dilation 1) with every tile too.
        let (s2, p2, d2) = (vec![2, 3], vec![1, 0], vec![1, 1]);
        let y2 = vec![2, 10, 5, 3];
        let gi = Op::ConvGradInput { stride: s2, padding: p2, dilation: d2, groups };
        check_on_both(
            &gi,
            &[Tensor::f32(y2.clone(), values(2 * 10 * 5 * 3, 5)), wt.clone()],
            DType::F32,
            &x,
            1e-5,
        );
    }
    FORCED.with(|f| f.borrow_mut().clear());
}

/// Throughput of the three convolution GEMMs on ResNet-50's layers at batch 4, with the
/// chooser's tile and with fixed alternatives: not a check, a measurement for a real GPU
/// (`cargo test --release -p mgn-gpu conv_throughput -- --ignored --nocapture`), the
/// data for tuning `Tile::cost`. One line per layer, derivative and tile.
#[test]
#[ignore]
fn conv_throughput() {
    use crate::test_util::time_op;
    let b = 4;
    // (cout, cin, kernel, stride, input size): one layer of each kind per stage.
    let layers = [
        (64, 3, 7, 2, 224),
        (64, 64, 3, 1, 56),
        (256, 64, 1, 1, 56),
        (64, 256, 1, 1, 56),
        (128, 128, 3, 2, 56),
        (512, 128, 1, 1, 28),
        (256, 256, 3, 1, 14),
        (1024, 256, 1, 1, 14),
        (512, 512, 3, 1, 7),
        (2048, 512, 1, 1, 7),
        (512, 2048, 1, 1, 7),
    ];
    // The chooser's, then 256-invocation tiles from 8×8 register blocks down to split K.
    let alternatives = [
        None,
        Some(tile(128, 128, 8, 8, 1, 8)),
        Some(tile(128, 64, 8, 4, 1, 8)),
        Some(tile(128, 64, 8, 4, 1, 16)),
        Some(tile(64, 128, 4, 8, 1, 8)),
        Some(tile(64, 128, 4, 8, 1, 16)),
        Some(tile(64, 64, 4, 4, 1, 16)),
        Some(tile(64, 64, 4, 4, 1, 32)),
        Some(tile(64, 64, 8, 4, 2, 16)),
        Some(tile(64, 32, 4, 2, 1, 16)),
        Some(tile(32, 64, 2, 4, 1, 16)),
        Some(tile(32, 32, 2, 2, 1, 16)),
        Some(tile(32, 32, 4, 4, 4, 32)),
        Some(tile(16, 16, 1, 1, 1, 16)),
    ];
    for (co, ci, k, st, size) in layers {
        let pad = k / 2;
        let o = (size + 2 * pad - k) / st + 1;
        let (x, w, y) = (vec![b, ci, size, size], vec![co, ci, k, k], vec![b, co, o, o]);
        let flops = 2.0 * (b * co * o * o * ci * k * k) as f64;
        let geo = (vec![st, st], vec![pad, pad], vec![1, 1]);
        let ops = [
            (
                "forward",
                Op::Conv {
                    stride: geo.0.clone(),
                    padding: geo.1.clone(),
                    dilation: geo.2.clone(),
                    groups: 1,
                    has_bias: false,
                },
                [&x[..], &w[..]],
                &y,
            ),
            (
                "grad input",
                Op::ConvGradInput {
                    stride: geo.0.clone(),
                    padding: geo.1.clone(),
                    dilation: geo.2.clone(),
                    groups: 1,
                },
                [&y[..], &w[..]],
                &x,
            ),
            (
                "grad weight",
                Op::ConvGradWeight {
                    stride: geo.0.clone(),
                    padding: geo.1.clone(),
                    dilation: geo.2.clone(),
                    groups: 1,
                },
                [&x[..], &y[..]],
                &w,
            ),
        ];
        for (what, op, operands, out) in &ops {
            for alt in alternatives {
                FORCED.with(|f| *f.borrow_mut() = alt.into_iter().collect());
                let label = alt.map_or("chosen".to_string(), |t| {
                    format!("{}x{} r{}x{} s{} bk{}", t.tm, t.tn, t.rm, t.rn, t.s, t.bk)
                });
                // About 2·10¹⁰ FLOP per submission, within 64 MiB of outputs.
                let out_bytes = 4 * out.iter().product::<usize>();
                let repeat = ((2e10 / flops) as usize).min((64 << 20) / out_bytes).clamp(1, 20);
                MADE.with(|m| m.borrow_mut().clear());
                if let Some((sec, device)) = time_op(op, operands, out, repeat) {
                    let gemm = made_gemm();
                    println!(
                        "conv {co}x{ci}x{k}x{k} /{st} {size}² {what:<11} {label:<22} {:8.1} µs \
                         {:8.1} GFLOP/s ({device}) {gemm}",
                        sec * 1e6,
                        flops / sec / 1e9
                    );
                }
            }
        }
    }
    FORCED.with(|f| f.borrow_mut().clear());
}

/// The first GEMM a kernel was made for since `MADE` was cleared, its tile and the tile's
/// modelled cost, for the sweep's lines.
fn made_gemm() -> String {
    let made = MADE.with(|m| m.borrow().first().copied());
    made.map_or(String::new(), |((g, m, n, k), t)| {
        let c = t.cost(&Gemm { groups: g, m, n, k, k_end: None, split_depth: None }, 256);
        format!("gemm {g}x{m}x{n}x{k} {t:?} cost {c:.0}")
    })
}

/// The chooser's tiles keep the kernel's invariants for ResNet-50- and U-Net-sized GEMMs
/// (and tiny ones), at both widths.
#[test]
fn chosen_tiles_fit_the_floor() {
    let shapes = [
        (1, 64, 4 * 112 * 112, 147),
        (1, 64, 4 * 56 * 56, 576),
        (1, 2048, 4 * 49, 512),
        (1, 64, 64, 4 * 3136),
        (1, 64, 147, 4 * 12544),
        (32, 1, 9, 4096),
        (1, 3, 50, 9),
        (1, 1, 1, 1),
    ];
    for width in [128usize, 256] {
        for (groups, m, n, k) in shapes {
            let gm = Gemm { groups, m, n, k, k_end: None, split_depth: None };
            let t = choose_tile(&gm, width, SHARED_WORDS).expect("a tile");
            assert_eq!(t.tmt() * t.tnt() * t.s, width, "{t:?}");
            assert!(
                t.shared_words() <= SHARED_WORDS
                    && t.bk.is_multiple_of(t.s)
                    && t.bk <= width
                    && t.tm <= width
                    && t.tn <= width,
                "{t:?}"
            );
            eprintln!("width {width} gemm {groups}x{m}x{n}x{k}: {t:?}");
        }
    }
}

/// Convolutions of f16 operands and both their derivatives take the cooperative-matrix kernel
/// on a device that has one (the H200's 16×16 tiles at subgroups of 32, lavapipe's 8×8 at 8):
/// it validates and translates to SPIR-V here, where no device runs the 16×16 one; the forward
/// reads its operands held as halves through the f16 view. f32 operands keep the tiled kernel.
#[test]
fn half_convolutions_take_cooperative_matrices_where_the_device_has_them() {
    use crate::kernels::{Coop, Operand, Target};
    let (x, w, y) = ([2, 67, 9, 9], [70, 67, 3, 3], [2, 70, 5, 5]);
    let (stride, padding, dilation, groups) = (vec![2, 2], vec![1, 1], vec![1, 1], 1);
    let ops = [
        (
            Op::Conv {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups,
                has_bias: false,
            },
            [&x[..], &w[..]],
            &y[..],
        ),
        (
            Op::ConvGradInput {
                stride: stride.clone(),
                padding: padding.clone(),
                dilation: dilation.clone(),
                groups,
            },
            [&y[..], &w[..]],
            &x[..],
        ),
        (Op::ConvGradWeight { stride, padding, dilation, groups }, [&x[..], &y[..]], &w[..]),
    ];
    let (big, small) = (
        Coop { tile: 16, subgroup: 32, everywhere: true },
        Coop { tile: 8, subgroup: 8, everywhere: true },
    );
    for coop in [big, small, Coop { everywhere: false, ..big }] {
        let target = Target { width: 256, shared_bytes: 32 << 10, coop: Some(coop) };
        for (op, ins, out) in &ops {
            for dtype in [DType::F16, DType::F32] {
                let inputs = [Operand::at(0, ins[0], dtype), Operand::at(1 << 20, ins[1], dtype)];
                let out = Operand::at(1 << 22, out, DType::F32);
                let src = crate::kernels::conv::generate(op, &inputs, &out, target).unwrap();
                let what = format!("{} {dtype} {coop:?}", op.describe());
                let takes = dtype == DType::F16 && coop.everywhere;
                assert_eq!(src.body.contains("coopMultiplyAdd"), takes, "{what}");
                // The forward stages its operands held as halves through the f16 view.
                let viewed = takes && matches!(op, Op::Conv { .. });
                assert_eq!(src.body.contains("arena_h["), viewed, "{what}");
                crate::kernels::check::spirv(&src.body)
                    .unwrap_or_else(|e| panic!("{what}: {e}\n{}", src.body));
            }
        }
    }
}
