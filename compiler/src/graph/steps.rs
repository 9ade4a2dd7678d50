//! Graph nodes as plan steps: what lowering does to a whole graph, and what a computed `init`
//! does to the few nodes of its table.

use super::{Graph, Op};
use crate::source::SourceMap;
use mgn_ir::plan::{SourceLoc, Step};

/// The `live` nodes as steps, in order, each with its model line; and each node's step number
/// (`u32::MAX` for dead nodes).
pub fn to_steps(g: &Graph, live: &[bool], sources: &SourceMap) -> (Vec<Step>, Vec<u32>) {
    let mut renumber = vec![u32::MAX; g.nodes.len()];
    let mut steps = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !live[i] {
            continue;
        }
        renumber[i] = steps.len() as u32;
        let (file, line, column) = sources.location(n.user_span);
        let mut op = n.op.clone();
        // A dropout derivative names its forward step (whose mask it replays) by number.
        if let Op::DropoutGrad { forward, .. } = &mut op {
            *forward = renumber[*forward as usize];
        }
        steps.push(Step {
            op,
            inputs: n.inputs.iter().map(|x| renumber[x.0 as usize]).collect(),
            dtype: n.dtype,
            shape: n.shape.clone(),
            loc: SourceLoc { file, line: line as u32, column: column as u32 },
        });
    }
    (steps, renumber)
}
