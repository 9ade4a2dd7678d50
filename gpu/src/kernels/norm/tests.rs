//! The kernels not reachable through one-op plans (batch-norm forward, dropout's mask) and the
//! row kernels at narrow widths, run directly on the device against the CPU.

use super::*;
use crate::device::GpuDevice;
use crate::kernels::KernelSource;
use crate::limits::fold_grid;
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;

fn device() -> Option<GpuDevice> {
    crate::testing::or_skip(GpuDevice::open())
}

fn values(n: usize, seed: u32, shift: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0
                - 1.0
                + shift
        })
        .collect()
}

/// Lays `inputs` out in an arena followed by the output, runs `make`'s kernel and returns
/// the output with the inputs as tensors.
fn run(
    dev: &mut GpuDevice,
    inputs: &[(Vec<usize>, f32)],
    out_shape: &[usize],
    make: impl Fn(&[Operand], &Operand, u32) -> KernelSource,
) -> (Vec<f32>, Vec<Tensor>) {
    run_with(dev, inputs, out_shape, [0u32; 32], None, make)
}

/// `width`: the workgroup width to generate for (the device's preferred when None).
fn run_with(
    dev: &mut GpuDevice,
    inputs: &[(Vec<usize>, f32)],
    out_shape: &[usize],
    params: [u32; 32],
    width: Option<u32>,
    make: impl Fn(&[Operand], &Operand, u32) -> KernelSource,
) -> (Vec<f32>, Vec<Tensor>) {
    let mut offset = 0;
    let (mut ops, mut tensors) = (Vec::new(), Vec::new());
    for (k, (shape, shift)) in inputs.iter().enumerate() {
        let n: usize = shape.iter().product();
        tensors.push(Tensor::f32(shape.clone(), values(n, k as u32 * 977 + 5, *shift)));
        ops.push(Operand::at(offset, shape, DType::F32));
        offset += n;
    }
    let out = Operand::at(offset, out_shape, DType::F32);
    let n: usize = out_shape.iter().product();
    let width = width.unwrap_or(dev.limits.workgroup_width(256));
    let src = make(&ops, &out, width);
    let kernel = dev.kernel("norm_test", &src.body).expect("valid WGSL");
    let arena = dev.arena(offset + n).expect("fits");
    for (o, t) in ops.iter().zip(&tensors) {
        dev.write(
            &arena,
            o.offset,
            &t.to_f64_vec().iter().map(|&v| (v as f32).to_bits()).collect::<Vec<_>>(),
        )
        .expect("uploads");
    }
    let groups = fold_grid(src.invocations.div_ceil(width as u64), &dev.limits).expect("fits");
    dev.run(&arena, &[(&kernel, params, groups)]).expect("runs");
    (dev.read(&arena, offset, n).expect("reads").into_iter().map(f32::from_bits).collect(), tensors)
}

fn close(what: &str, got: &[f32], want: &Tensor, tol: f64) {
    let want = want.to_f64_vec();
    assert_eq!(got.len(), want.len());
    for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a as f64 - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: element {i}: gpu {a}, cpu {b}"
        );
    }
}

#[test]
fn batch_norm_forward_matches_the_cpu_in_both_modes() {
    let Some(mut dev) = device() else { return };
    for x in [
        vec![4usize, 3, 5],
        vec![5, 3],
        vec![2, 3, 2, 3],
        vec![8, 3, 700],
        vec![300, 4],
        vec![3, 2, 1],
    ] {
        let c = vec![x[1]];
        for training in [true, false] {
            for (w, b) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut inputs = vec![(x.clone(), 0.0), (c.clone(), 0.0), (c.clone(), 1.5)];
                if w {
                    inputs.push((c.clone(), 0.5));
                }
                if b {
                    inputs.push((c.clone(), 0.0));
                }
                let (got, tensors) = run(&mut dev, &inputs, &x, |ins, out, width| {
                    batch_norm(ins, out, 1e-5, w, b, training, width).expect("generates")
                });
                let op = Op::BatchNorm { eps: 1e-5, momentum: 0.1, has_weight: w, has_bias: b };
                let refs: Vec<&Tensor> = tensors.iter().collect();
                let want = mgn_cpu::eval(
                    &op,
                    &refs,
                    DType::F32,
                    &x,
                    &mgn_cpu::Ctx { training, seed: 0, node: 0 },
                )
                .expect("cpu runs");
                close(
                    &format!("batch_norm training={training} w={w} b={b} {x:?}"),
                    &got,
                    &want,
                    1e-4,
                );
            }
        }
    }
}

#[test]
fn dropout_draws_the_cpu_mask_exactly() {
    let Some(mut dev) = device() else { return };
    let x = vec![7usize, 301];
    for (p, seed, node) in [
        (0.5, 0u64, 0u32),
        (0.1, 0xDEAD_BEEF_0123_4567, 17),
        (0.9, u64::MAX, 3),
        (0.0, 42, 1),
        (0.3, 1 << 40, u32::MAX),
    ] {
        let key = dropout_key(seed, node);
        let mut params = [0u32; 32];
        params[0] = key as u32;
        params[1] = (key >> 32) as u32;
        let (got, tensors) =
            run_with(&mut dev, &[(x.clone(), 0.0)], &x, params, None, |ins, out, width| {
                dropout(&ins[0], out, p, width).expect("generates")
            });
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let ctx = mgn_cpu::Ctx { training: true, seed, node };
        let want =
            mgn_cpu::eval(&Op::Dropout { p }, &refs, DType::F32, &x, &ctx).expect("cpu runs");
        let what = format!("dropout p={p} seed={seed} node={node}");
        close(&what, &got, &want, 1e-6);
        // The mask itself, exactly (inputs are never 0 here except by construction).
        for (i, (&g, w)) in got.iter().zip(want.to_f64_vec()).enumerate() {
            assert_eq!(g == 0.0, w == 0.0, "{what}: element {i} mask differs");
        }
        // DropoutGrad of the same forward step draws the same mask.
        let grad = mgn_cpu::eval(
            &Op::DropoutGrad { p, forward: node },
            &refs,
            DType::F32,
            &x,
            &mgn_cpu::Ctx { training: true, seed, node: 0 },
        )
        .expect("cpu runs");
        close(&format!("{what} (grad)"), &got, &grad, 1e-6);
    }
}

/// The row and column kernels at widths below the device's (down to one invocation): a row
/// spans several workgroup widths, and a column block is narrower than 32.
#[test]
fn norm_kernels_hold_at_narrow_widths() {
    let Some(mut dev) = device() else { return };
    let g = |part| Op::LayerNormGrad { eps: 1e-5, has_weight: true, has_bias: true, part };
    let gn =
        |part| Op::GroupNormGrad { groups: 3, eps: 1e-5, has_weight: true, has_bias: true, part };
    let bn = |part| Op::BatchNormGrad {
        eps: 1e-5,
        has_weight: true,
        has_bias: false,
        part,
        training: true,
    };
    let (ln, gx, bx) = (vec![9usize, 70], vec![2usize, 6, 50], vec![4usize, 3, 70]);
    // (op, input shapes, output shape)
    let cases: Vec<(Op, Vec<Vec<usize>>, Vec<usize>)> = vec![
        (g(GradPart::Input), vec![ln.clone(), vec![70], vec![70], ln.clone()], ln.clone()),
        (g(GradPart::Weight), vec![ln.clone(), vec![70], vec![70], ln.clone()], vec![70]),
        (g(GradPart::Bias), vec![ln.clone(), vec![70], vec![70], ln.clone()], vec![70]),
        (Op::RmsNorm { eps: 1e-6, has_weight: true }, vec![vec![3, 300], vec![300]], vec![3, 300]),
        (gn(GradPart::Input), vec![gx.clone(), vec![6], vec![6], gx.clone()], gx.clone()),
        (gn(GradPart::Weight), vec![gx.clone(), vec![6], vec![6], gx.clone()], vec![6]),
        (bn(GradPart::Input), vec![bx.clone(), vec![3], vec![3], vec![3], bx.clone()], bx.clone()),
        (bn(GradPart::Weight), vec![bx.clone(), vec![3], vec![3], vec![3], bx.clone()], vec![3]),
    ];
    for width in [64u32, 32, 16, 4, 1] {
        for (op, shapes, out) in &cases {
            // Positive running variances (input 2 of batch norm); other inputs around 0.
            let inputs: Vec<(Vec<usize>, f32)> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    (
                        s.clone(),
                        if k == 2 && matches!(op, Op::BatchNormGrad { .. }) { 1.5 } else { 0.0 },
                    )
                })
                .collect();
            let (got, tensors) =
                run_with(&mut dev, &inputs, out, [0u32; 32], Some(width), |ins, o, w| {
                    generate(op, ins, o, w).expect("generates")
                });
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let want = mgn_cpu::eval(
                op,
                &refs,
                DType::F32,
                out,
                &mgn_cpu::Ctx { training: true, seed: 0, node: 0 },
            )
            .expect("cpu runs");
            close(&format!("{} at width {width}", op.describe()), &got, &want, 2e-4);
        }
    }
}
