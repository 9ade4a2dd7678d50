//! SmolLM2's decode plan (`models/smollm2_135m_decode.mgn`, one token against a KV cache) as
//! the GPU runs it: dispatches and dependency levels per token in f32 and in mixed f16, at
//! batch 1 and 8, and the ops of each level of the first decoder layers. A token's time on a
//! card is mostly its levels (a barrier each, ~4–6 µs on an H100, 30 layers of them), so every
//! rewrite that moves one shows in `tests/plans/decode_levels.txt`'s diff. `BLESS=1 cargo test
//! -p mgn-tests --test decode_levels` rewrites it; review the diff before committing it.

use mgn_compiler::driver::plan_path;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_gpu::program::{GpuOp, GpuPlan};
use mgn_gpu::rewrite::{for_gpu_with, Options};
use mgn_ir::op::Op;
use mgn_ir::precision::Precision;
use mgn_tests::{compare_golden, rendered, root};
use std::path::Path;

/// The levels listed op by op: the embedding and the first two decoder layers.
const LISTED: usize = 24;

fn program(precision: Precision, batch: usize) -> GpuPlan {
    let settings: Vec<Setting> = [format!("B={batch}"), "cache=256".into()]
        .iter()
        .map(|s| s.parse().expect("a setting"))
        .collect();
    let opts = PlanOptions { precision, ..PlanOptions::infer() };
    let path = Path::new("models/smollm2_135m_decode.mgn");
    let (outcome, plan) = plan_path(path, None, settings, &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    // The defaults, whatever an experiment's switches in the environment say.
    for_gpu_with(&plan.expect("a plan"), &Options::default())
}

/// The plan's dispatches and levels, then the ops of its first `LISTED` levels.
fn describe(name: &str, program: &GpuPlan, listed: bool) -> String {
    let (_, levels) = mgn_gpu::memory::plan_arena_and_levels(program);
    let root = mgn_gpu::memory::view_roots(program);
    let mut at: Vec<Vec<String>> = vec![Vec::new(); levels.count];
    for (i, s) in program.steps.iter().enumerate() {
        let uploaded = matches!(s.op, GpuOp::Plan(Op::Input { .. } | Op::Param { .. }));
        if uploaded || root[i] != i {
            continue;
        }
        let level = levels.step[i].expect("a dispatched step has a level");
        let op = s.op.describe();
        let family = op.split_whitespace().next().unwrap_or("?").to_string();
        at[level].push(format!("{family}{:?}", s.shape));
    }
    let dispatches: usize = at.iter().map(Vec::len).sum();
    let mut out = format!("{name:<24} {dispatches:>6} dispatches {:>5} levels\n", levels.count);
    if listed {
        for (l, ops) in at.iter().enumerate().take(LISTED) {
            out += &format!("  {l:>3}: {}\n", ops.join(", "));
        }
    }
    out
}

#[test]
fn the_decode_plans_keep_their_dispatches_and_levels() {
    root();
    let mut table = String::from(
        "# SmolLM2-135M decode (one token, cache 256) on the GPU after its rewrites\n\
         # (tests/decode_levels.rs; BLESS=1 rewrites). Levels listed: embedding, layers 0-1.\n",
    );
    for (precision, name) in [(Precision::F32, "f32"), (Precision::MixedF16, "mixed-f16")] {
        for batch in [1, 8] {
            let p = program(precision, batch);
            table += &describe(&format!("{name} B={batch}"), &p, batch == 1);
        }
    }
    if let Some(diff) = compare_golden(Path::new("tests/plans/decode_levels.txt"), &table) {
        panic!("{diff}");
    }
}
