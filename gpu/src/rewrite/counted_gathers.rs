//! A gather whose indices count `0 … n − 1` (`arange(n)`) reads the first n entries of its
//! table along its axis: it becomes that slice. BERT's and MiniLM's position embeddings are
//! such a lookup. A slice that only element-wise steps read is no kernel at all
//! (`memory::sliced_views`), so the embedding sum runs beside the word lookup instead of a level
//! after the position lookup, which waited a level for its `arange`. Static plans only: a dynamic
//! plan's `arange` follows a size that a slice's fixed end could not.

use crate::program::{GpuOp, Program, StepId};
use mgn_ir::analysis::Dataflow;
use mgn_ir::op::Op;

/// Makes every gather at counted indices a slice, and drops the counts nothing reads then.
pub(super) fn slice_counted_gathers(program: &mut Program, dynamic: bool) {
    if dynamic {
        return;
    }
    let mut counts = Vec::new();
    for id in program.order().to_vec() {
        let s = program.step(id);
        let (GpuOp::Plan(Op::Gather { axis }), &[table, index]) = (&s.op, &s.inputs[..]) else {
            continue;
        };
        let (t, i) = (program.step(table), program.step(index));
        let (axis, n) = (*axis, i.shape.first().copied().unwrap_or(0));
        let counted = i.op == GpuOp::Plan(Op::Arange) && i.shape.len() == 1;
        // The gather's shape is the table's with the axis replaced by the indices' [n].
        let mut sliced = t.shape.clone();
        let fits = axis < sliced.len() && n <= sliced[axis];
        if fits {
            sliced[axis] = n;
        }
        if !(counted && fits && sliced == s.shape) {
            continue;
        }
        let s = program.step_mut(id);
        s.op = GpuOp::Plan(Op::Slice { axis, start: 0, end: n });
        s.inputs = vec![table];
        counts.push(index);
    }
    // A count the gather alone read (a training plan's gather derivative reads it too).
    let results: Vec<StepId> = program.compiled().results().into_iter().map(StepId).collect();
    let read = |p: &Program, c: StepId| p.order().iter().any(|&o| p.step(o).inputs.contains(&c));
    let unread: Vec<StepId> =
        counts.into_iter().filter(|&c| !results.contains(&c) && !read(program, c)).collect();
    program.remove(&unread);
}

#[cfg(test)]
mod tests {
    use crate::test_util::step;
    use mgn_ir::op::{BinaryOp, Op};
    use mgn_ir::plan::{Mode, Plan};
    use mgn_ir::{DType, Tensor};

    /// `y = x + gather(table, arange(n))` (BERT's position embeddings, `x` `[2, n, 4]`), and
    /// `z = gather(table, ids)`, a lookup at given indices.
    fn plan(n: usize) -> Plan {
        let (f, i) = (DType::F32, DType::I32);
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[2, n, 4]), // 0
            step(Op::Input { name: "table".into() }, vec![], f, &[10, 4]), // 1
            step(Op::Input { name: "ids".into() }, vec![], i, &[3]),     // 2
            step(Op::Arange, vec![], i, &[n]),                           // 3
            step(Op::Gather { axis: 0 }, vec![1, 3], f, &[n, 4]),        // 4
            step(Op::Binary(BinaryOp::Add), vec![0, 4], f, &[2, n, 4]),  // 5: y
            step(Op::Gather { axis: 0 }, vec![1, 2], f, &[3, 4]),        // 6: z
        ];
        let inputs = ["x", "table", "ids"].iter().enumerate();
        let inputs = inputs.map(|(k, s)| (s.to_string(), k as u32)).collect();
        Plan::of_steps(Mode::Infer, steps, inputs, vec![("y".into(), 5), ("z".into(), 6)])
    }

    /// The counted gather is a slice read in place — no kernel, no `arange` — and the lookup
    /// at given indices stays a gather; both backends compute what the plan does on the CPU,
    /// the whole table counted (n = 10) and part of it (n = 7).
    #[test]
    fn a_gather_at_counted_indices_is_a_slice_of_its_table() {
        for n in [7, 10] {
            let p = plan(n);
            let g = crate::rewrite::for_gpu(&p);
            g.validate().expect("a valid plan");
            let ops: Vec<String> = g.steps.iter().map(|s| s.op.describe()).collect();
            assert!(!ops.iter().any(|o| o == "arange"), "{ops:?}");
            assert_eq!(ops.iter().filter(|o| o.starts_with("gather")).count(), 1, "{ops:?}");
            assert!(ops.contains(&format!("slice axis=0 0..{n}")), "{ops:?}");
            let views = crate::memory::ReadViews::of(&g);
            assert_eq!(
                views.sliced.iter().filter(|&&v| v).count(),
                1,
                "the slice is read in place"
            );
            let x = Tensor::f32(vec![2, n, 4], crate::test_util::values(2 * n * 4, 1));
            let table = Tensor::f32(vec![10, 4], crate::test_util::values(40, 2));
            let ids = Tensor::i32(vec![3], vec![9, 0, 4]);
            let given = [("x", &x), ("table", &table), ("ids", &ids)];
            let want = crate::test_util::run_on_cpu_plan(&p, &[], &given).outputs;
            let got = crate::test_util::run_reference(&g, &[], &given).outputs;
            assert_eq!(got, want, "the rewritten program on the CPU reference");
            let Some(mut gpu) = crate::test_util::open(p, &[]) else { return };
            let got = gpu.run(&given, 0).expect("runs on the GPU").outputs;
            for ((name, g), (_, w)) in got.iter().zip(&want) {
                assert_eq!(g, w, "{name}: a slice and an add are exact");
            }
        }
    }
}
