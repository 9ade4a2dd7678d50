//! Keys rotated as they are written into the cache: a `ScatterInPlace` (`state_in_place`) of a
//! rotary embedding that nothing else reads computes the rotation itself
//! (`GpuOp::ScatterInPlace`'s `rope`), one dispatch instead of two.
//!
//! Decoding against a KV cache rotates each token's keys, then writes them into the cache, then
//! attends over the cache: the rotation was a level of its own between the key projection and
//! the write (SmolLM2's decode plan: 30 of its levels a token), though each element of the
//! write needs only its own element of the rotation and its partner half a row away, both
//! already in memory.
//!
//! The queries' rotation likewise: an attention of a few query rows a head (decoding), whose
//! queries are a rotation that nothing else reads, rotates them as its kernel loads them
//! (`GpuOp::RotatedAttention`, the decode kernel's): SmolLM2's decode plan loses a dispatch a
//! layer. (Its level stays while the cache writes share it.)

use crate::program::{GpuOp, Program, StepId};
use mgn_ir::op::Op;
use mgn_ir::DType;

/// Folds each rotation that only a scatter in place reads into that scatter.
pub(super) fn fold_rotations(program: &mut Program) {
    let readers = super::permuted_stores::readers(program);
    let mut gone = Vec::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let GpuOp::ScatterInPlace { axis, rope: None } = s.op else { continue };
        let src = s.inputs[1];
        let r = program.step(src);
        let GpuOp::Plan(rope @ Op::Rope { .. }) = &r.op else { continue };
        // The rotation's value is needed nowhere else (and is no result).
        if readers.get(&src).map(Vec::as_slice) != Some(&[id][..]) || r.dtype != s.dtype {
            continue;
        }
        let (rope, rope_in) = (rope.clone(), r.inputs.clone());
        let s = program.step_mut(id);
        s.op = GpuOp::ScatterInPlace { axis, rope: Some(rope) };
        s.inputs[1] = rope_in[0];
        s.inputs.extend(&rope_in[1..]);
        gone.push(src);
    }
    program.remove(&gone);
}

/// Folds each rotation of queries that only an attention few enough rows for the decode kernel
/// reads into that attention. Static plans only: a dynamic plan's rows may outgrow the kernel.
pub(super) fn fold_query_rotations(program: &mut Program) {
    let readers = super::permuted_stores::readers(program);
    let mut gone = Vec::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let GpuOp::Plan(attention @ Op::Attention { has_mask, .. }) = &s.op else { continue };
        let n = 3 + *has_mask as usize;
        let only_by = |v: StepId, by: StepId| readers.get(&v).map(Vec::as_slice) == Some(&[by][..]);
        // The queries, or a mixed policy's cast of them to f16 that only the attention reads.
        let (mut q, mut rounded, mut by) = (s.inputs[0], None, id);
        let c = program.step(q);
        if let (GpuOp::Plan(Op::Cast), DType::F16) = (&c.op, c.dtype) {
            let x = c.inputs[0];
            if !only_by(q, id) || program.step(x).dtype != DType::F32 {
                continue;
            }
            (rounded, by, q) = (Some(DType::F16), q, x);
        }
        let r = program.step(q);
        let GpuOp::Plan(rope @ Op::Rope { .. }) = &r.op else { continue };
        let shape = |k: usize| program.step(s.inputs[k]).shape.as_slice();
        // The rotation's value is needed nowhere else (and is no result).
        if !only_by(q, by)
            || s.inputs.len() != n
            || !crate::kernels::decodes(shape(0), shape(1), shape(2))
        {
            continue;
        }
        let (attention, rope) = (attention.clone(), rope.clone());
        let op = GpuOp::RotatedAttention { attention, rope, rounded };
        let rope_in = r.inputs.clone();
        let s = program.step_mut(id);
        s.op = op;
        s.inputs[0] = rope_in[0];
        s.inputs.extend(&rope_in[1..]);
        gone.push(q);
        if by != id {
            gone.push(by);
        }
    }
    program.remove(&gone);
}

// Tested with the caches' other tests: `tests_cache.rs`, `keys_rotated_as_they_are_written_*`.
