//! What running a plan on the host takes in memory, computed from the plan alone, and whether
//! the machine has it. Sessions check before they allocate anything plan-sized, so a model too
//! large for the machine is an error naming its largest tensors and their model lines, not an
//! abort in the allocator.
//!
//! Host storage is 4 bytes an element whatever the declared dtype (floats as `f32`, integers
//! and `bool` as `i32`). Values are counted as the CPU backend keeps them: each from its step
//! to its last reader, results to the end of the run; the caller's inputs are the caller's.

use crate::session::RuntimeError;
use mgn_ir::analysis::DefUse;
use mgn_ir::optim::OptimizerKind;
use mgn_ir::plan::{Mode, Plan};
use mgn_ir::shape::checked_numel;
use mgn_ir::units::bytes;
use mgn_ir::Op;

/// Host bytes of one element, whatever the dtype.
const ELEMENT: u64 = 4;

/// Bytes of host memory a plan needs, by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Every parameter and buffer.
    pub params: u64,
    /// Optimizer state of the trained parameters (training plans).
    pub optimizer: u64,
    /// The most step values alive at once during a run on the CPU.
    pub values: u64,
}

impl Footprint {
    pub fn total(&self) -> u64 {
        self.params.saturating_add(self.optimizer).saturating_add(self.values)
    }
}

fn elements_bytes(shape: &[usize]) -> u64 {
    checked_numel(shape).map_or(u64::MAX, |n| (n as u64).saturating_mul(ELEMENT))
}

/// Parameters and optimizer state: what a session holds between runs.
pub fn resident(plan: &Plan) -> Footprint {
    let params = plan.params.iter().map(|p| elements_bytes(&p.shape)).fold(0, u64::saturating_add);
    let buffers = match plan.optimizer.kind {
        OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => 2,
        OptimizerKind::Sgd { momentum } if momentum != 0.0 => 1,
        OptimizerKind::Sgd { .. } => 0,
    };
    let trained = plan.grads.iter().map(|&(p, _)| elements_bytes(&plan.params[p].shape));
    let optimizer = match plan.mode {
        Mode::Train => trained.fold(0, u64::saturating_add).saturating_mul(buffers),
        Mode::Infer => 0,
    };
    Footprint { params, optimizer, values: 0 }
}

/// The peak of step values alive at once when the CPU backend runs `plan`.
pub fn peak_values(plan: &Plan) -> u64 {
    let def_use = DefUse::of(plan);
    let mut live = 0u64;
    let mut peak = 0u64;
    for (i, s) in plan.steps.iter().enumerate() {
        if !matches!(s.op, Op::Input { .. } | Op::Param { .. }) {
            live = live.saturating_add(elements_bytes(&s.shape));
            peak = peak.max(live);
        }
        for (k, &x) in s.inputs.iter().enumerate() {
            let x = x as usize;
            let computed = !matches!(plan.steps[x].op, Op::Input { .. } | Op::Param { .. });
            // A value read twice by one step is freed once.
            let first = !s.inputs[..k].contains(&(x as u32));
            if computed && first && def_use.last_use(x) == Some(i) {
                live = live.saturating_sub(elements_bytes(&plan.steps[x].shape));
            }
        }
    }
    peak
}

/// The `n` largest parameters and step values, largest first, each as a phrase naming it and
/// where it comes from: what an error about memory points the user at.
pub fn largest(plan: &Plan, n: usize) -> Vec<String> {
    let mut all: Vec<(u64, String)> = plan
        .params
        .iter()
        .map(|p| {
            (elements_bytes(&p.shape), format!("parameter `{}` {}{:?}", p.name, p.dtype, p.shape))
        })
        .collect();
    for s in &plan.steps {
        if !matches!(s.op, Op::Input { .. } | Op::Param { .. }) {
            let what = format!("`{}` {}{:?} at {}", s.op.describe(), s.dtype, s.shape, s.loc);
            all.push((elements_bytes(&s.shape), what));
        }
    }
    all.sort_by_key(|a| std::cmp::Reverse(a.0));
    all.into_iter().take(n).map(|(b, w)| format!("{w} ({})", bytes(b))).collect()
}

/// Bytes the host can still give this process: the kernel's `MemAvailable`, or less when a
/// cgroup limit (containers) leaves less. `None` where neither can be read (then nothing is
/// checked).
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        let line = t.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    });
    let cgroup = (|| {
        let max = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
        let max: u64 = max.trim().parse().ok()?; // "max": no limit
        let current = std::fs::read_to_string("/sys/fs/cgroup/memory.current").ok()?;
        Some(max.saturating_sub(current.trim().parse().ok()?))
    })();
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An error when `need` is more than the host can give, naming what takes it.
pub fn check(plan: &Plan, need: Footprint, what: &str) -> Result<(), RuntimeError> {
    check_against(plan, need, what, available())
}

fn check_against(
    plan: &Plan,
    need: Footprint,
    what: &str,
    available: Option<u64>,
) -> Result<(), RuntimeError> {
    let Some(have) = available else { return Ok(()) };
    if need.total() <= have {
        return Ok(());
    }
    let mut parts = vec![format!("parameters {}", bytes(need.params))];
    if need.optimizer > 0 {
        parts.push(format!("optimizer state {}", bytes(need.optimizer)));
    }
    if need.values > 0 {
        parts.push(format!("values at their peak {}", bytes(need.values)));
    }
    Err(RuntimeError::Failed(format!(
        "{what} of `{}` needs about {} of host memory ({}), but {} is available; its largest \
         tensors: {}. Make the model or its batch smaller (`--set`)",
        plan.model,
        bytes(need.total()),
        parts.join(", "),
        bytes(have),
        largest(plan, 3).join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::op::{BinaryOp, UnaryOp};
    use mgn_ir::plan::{InitSpec, ParamSpec, SourceLoc, Step};
    use mgn_ir::DType;

    fn plan() -> Plan {
        let step = |op, inputs: Vec<u32>, shape: Vec<usize>| Step {
            op,
            inputs,
            dtype: DType::F32,
            shape,
            loc: SourceLoc { file: "m.mgn".into(), line: 4, column: 9 },
        };
        let w = ParamSpec {
            name: "w".into(),
            dtype: DType::F32,
            shape: vec![100],
            init: InitSpec::Constant(1.0),
            trainable: true,
            frozen: false,
            persistent: true,
        };
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], vec![100]),
            step(Op::Param { index: 0 }, vec![], vec![100]),
            step(Op::Binary(BinaryOp::Add), vec![0, 1], vec![100]), // 400 B
            step(Op::Binary(BinaryOp::Mul), vec![2, 2], vec![100]), // 400 B; 2 freed after
            step(Op::Unary(UnaryOp::Relu), vec![3], vec![1000]),    // 4000 B, the output
        ];
        Plan {
            params: vec![w],
            ..Plan::of_steps(Mode::Infer, steps, vec![("x".into(), 0)], vec![("y".into(), 4)])
        }
    }

    #[test]
    fn the_peak_counts_what_is_alive_together() {
        let p = plan();
        // Step 3 holds steps 2 and 3 (800 B); step 4 holds 3 and 4 (4,400 B).
        assert_eq!(peak_values(&p), 4400);
        assert_eq!(resident(&p), Footprint { params: 400, optimizer: 0, values: 0 });
        let mut t = p.clone();
        t.mode = Mode::Train;
        t.grads = vec![(0, 2)];
        assert_eq!(resident(&t).optimizer, 800, "Adam keeps two moments");
    }

    #[test]
    fn too_little_memory_is_an_error_naming_the_largest_tensors() {
        let p = plan();
        let need = Footprint { values: peak_values(&p), ..resident(&p) };
        assert!(check_against(&p, need, "a run", None).is_ok(), "unknown memory: no check");
        assert!(check_against(&p, need, "a run", Some(1 << 20)).is_ok());
        let e = check_against(&p, need, "a run", Some(1000)).unwrap_err().to_string();
        assert!(e.starts_with("a run of `T` needs about 4.69 KiB of host memory"), "{e}");
        assert!(
            e.contains("values at their peak 4.30 KiB") && e.contains("1000 B is available"),
            "{e}"
        );
        assert!(e.contains("`relu` f32[1000] at m.mgn:4:9 (3.91 KiB)"), "the largest first: {e}");
        assert!(e.contains("parameter `w` f32[100]"), "{e}");
    }

    #[test]
    fn impossible_sizes_saturate_instead_of_overflowing() {
        let mut p = plan();
        p.params[0].shape = vec![1 << 40, 1 << 40];
        assert_eq!(resident(&p).params, u64::MAX);
        assert!(check_against(&p, resident(&p), "a session", Some(1 << 40)).is_err());
    }
}
