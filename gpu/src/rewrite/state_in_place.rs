//! State written in place: a `SliceScatter` that makes a state parameter's new value (a KV
//! cache with one more token's keys) becomes a `GpuOp::ScatterInPlace`, which the memory plan
//! puts in the parameter's own words and whose kernel writes only the new rows.
//!
//! As compiled, the scatter is a new value: each decoding step copies the whole cache into it
//! (SmolLM2's 60 caches of 256 positions: 60 dispatches of 49,152 elements), and the state
//! copies at the end of the run copy it back. Both grow with the cache, not with the tokens.
//! Writing in place is safe when nothing else reads the old value: no other step reads the
//! parameter's words during the run, and the run does not return them.

use crate::program::{GpuOp, Program};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;

/// Turns every state write that can be made in place into one (see the module header).
pub(super) fn write_state_in_place(program: &mut Program) {
    // Most plans write no state: no dense copy of their program for them.
    if program.compiled().state_writes.is_empty() {
        return;
    }
    let view = program.to_gpu_plan();
    let def_use = DefUse::of(&view);
    for &(param, v) in &view.state_writes {
        let s = &view.steps[v as usize];
        let GpuOp::Plan(Op::SliceScatter { axis }) = s.op else { continue };
        let old = s.inputs[0] as usize;
        let holds_param = view.steps[old].op == GpuOp::Plan(Op::Param { index: param });
        let only_reader = def_use.readers[old].as_slice() == [v] && !def_use.result[old];
        if holds_param && only_reader {
            program.step_mut(view.ids[v as usize]).op = GpuOp::ScatterInPlace { axis, rope: None };
        }
    }
}
