//! Two products of the same few rows, one feeding the other's epilogue, as one dispatch: a
//! gated feed-forward's `silu(x · gᵀ) · (x · uᵀ)` at one-token decoding, where fusion made the
//! up projection's product the head of the chain and left the gate's as a product of its own
//! that the head reads (`GpuOp::MatMulEpilogue`). The two ran one after the other — a level
//! each, both reading the same activation — though neither needs the other's result until the
//! very end. `GpuOp::ProductPair` walks both weights' rows against the activation in one
//! kernel (the few-columns kernel, swapped) and combines the two sums as it stores: one level
//! and one dispatch fewer per layer. Only static plans: the pair's kernel is the few-columns
//! one, which a dynamic plan's rows may outgrow.

use crate::kernels::SKINNY;
use crate::program::{Elem, GpuOp, Program};
use mgn_ir::DType;

/// Pairs each gate product with the epilogue product that alone reads it (see the header).
pub(super) fn pair_products(program: &mut Program) {
    let readers = super::permuted_stores::readers(program);
    let mut gone = Vec::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let GpuOp::MatMulEpilogue { program: chain, ta: false, tb: true } = &s.op else {
            continue;
        };
        let (a, w) = (s.inputs[0], s.inputs[1]);
        let few = |shape: &[usize]| {
            let k = shape.last().copied().unwrap_or(0).max(1);
            shape.iter().product::<usize>() / k <= SKINNY
        };
        let weight = |id| program.get(id).filter(|b| b.shape.len() == 2 && !b.dtype.is_packed());
        let Some(uw) = weight(w) else { continue };
        if s.dtype != DType::F32 || !few(&program.step(a).shape) || uw.shape[0] <= SKINNY {
            continue;
        }
        // The first extra input that is such a product of the same rows, read by this alone.
        let gate = s.inputs[2..].iter().position(|&e| {
            let Some(e_step) = program.get(e) else { return false };
            let product = matches!(
                e_step.op,
                GpuOp::MatMulT { ta: false, tb: true, alpha, splits: 1 } if alpha == 1.0
            );
            product
                && e_step.inputs[0] == a
                && e_step.dtype == DType::F32
                && e_step.shape == s.shape
                && weight(e_step.inputs[1]).is_some_and(|g| g.shape == uw.shape)
                && readers.get(&e).map(Vec::as_slice) == Some(&[id][..])
                && s.inputs.iter().filter(|&&i| i == e).count() == 1
        });
        let Some(at) = gate else { continue };
        let gate = s.inputs[2 + at];
        let gate_weight = program.step(gate).inputs[1];
        // Old Input(0) is the up product; Input(1 + at) the gate; Input(m) the step's input m + 1.
        let extra: Vec<_> =
            (s.inputs[2..].iter().enumerate()).filter(|&(e, _)| e != at).map(|(_, &i)| i).collect();
        let renumber = |k: u32| -> u32 {
            let k = k as usize;
            match k {
                0 => 0,
                k if k == 1 + at => 1,
                k if k < 1 + at => k as u32 + 1,
                k => k as u32,
            }
        };
        let chain: Vec<Elem> = chain
            .iter()
            .map(|e| match e {
                Elem::Input(k) => Elem::Input(renumber(*k)),
                e => e.clone(),
            })
            .collect();
        let s = program.step_mut(id);
        s.op = GpuOp::ProductPair { program: chain };
        s.inputs = [vec![a, w, gate_weight], extra].concat();
        gone.push(gate);
    }
    program.remove(&gone);
}
