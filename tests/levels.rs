//! The six workloads' GPU plans as data: for each plan the benchmark runs (the forward at full
//! and at minimal shape, the training step), its dispatches, its dependency levels and the
//! values its arena plans, after the GPU's rewrites with their default options. They are kept
//! in `tests/plans/levels.txt`. Every plan-level change — fusion, views, splits, the arena —
//! moves these numbers, and a device to time them is not always at hand: the file makes each
//! move visible in review and catches the one nobody meant. `BLESS=1 cargo test -p mgn-tests
//! --test levels` rewrites it; review the diff before committing it.

use mgn_compiler::driver::plan_path;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_gpu::program::GpuOp;
use mgn_gpu::rewrite::{for_gpu_with, Options};
use mgn_ir::op::Op;
use mgn_ir::optim::OptimizerSpec;
use mgn_tests::{compare_golden, rendered, root};
use std::path::Path;

/// Each model (at its default, the benchmark's full shape) and the settings of its minimal
/// shape where that is another plan (`mgnc bench`: batch 1, one token).
const WORKLOADS: &[(&str, &str)] = &[
    ("smollm2_135m", "B=1 T=1"),
    ("whisper_tiny_encoder", ""),
    ("resnet50", "B=1"),
    ("sd_unet_tiny", "B=1"),
    ("smolvla_expert", ""),
    ("minilm_l6", "B=1 T=1"),
];

/// One plan's row: dispatches (steps with a kernel of their own), levels and planned values.
fn row(model: &str, settings: &str, train: bool) -> String {
    let settings: Vec<Setting> =
        settings.split_whitespace().map(|s| s.parse().expect("a setting")).collect();
    let path = format!("models/{model}.mgn");
    let opts = match train {
        true => PlanOptions::train(&[], OptimizerSpec::default()),
        false => PlanOptions::infer(),
    };
    let (outcome, plan) = plan_path(Path::new(&path), None, settings, &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let plan = plan.expect("a plan");
    // The defaults, whatever an experiment's switches in the environment say.
    let program = for_gpu_with(&plan, &Options::default());
    let (layout, levels) = mgn_gpu::memory::plan_arena_and_levels(&program);
    let root = mgn_gpu::memory::view_roots(&program);
    let dispatches = (program.steps.iter().enumerate())
        .filter(|(i, s)| {
            let uploaded = matches!(s.op, GpuOp::Plan(Op::Input { .. } | Op::Param { .. }));
            !uploaded && root[*i] == *i
        })
        .count();
    let values = (layout.total_words - layout.param_words) as u64 * 4;
    format!("{dispatches:>6} {:>6} {:>10.2}", levels.count, values as f64 / (1 << 20) as f64)
}

#[test]
fn the_workloads_plans_keep_their_dispatches_and_levels() {
    root();
    let mut table = String::from(
        "# The six workloads' GPU plans after their rewrites (tests/levels.rs; BLESS=1 rewrites).\n\
         # plan                                   dispatches levels values_MiB\n",
    );
    for (model, minimal) in WORKLOADS {
        let mut plans = vec![("forward", "", false)];
        if !minimal.is_empty() {
            plans.push(("minimal", minimal, false));
        }
        plans.push(("training", "", true));
        for (what, settings, train) in plans {
            let name = format!("{model} {what} {settings}");
            table += &format!("{:<40} {}\n", name.trim_end(), row(model, settings, train));
        }
    }
    if let Some(diff) = compare_golden(Path::new("tests/plans/levels.txt"), &table) {
        panic!("{diff}");
    }
}
