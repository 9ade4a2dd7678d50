//! Optimizer settings carried by a training plan, the learning-rate schedule they define, and
//! the optimizer state every backend keeps in the same form (so a run moves between backends
//! and checkpoints exactly). The update rules themselves are each backend's: the host's in
//! `mgn_runtime::optim`, the GPU's as kernels.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with (optional) momentum, PyTorch's formulation.
    Sgd {
        momentum: f64,
    },
    Adam {
        beta1: f64,
        beta2: f64,
        eps: f64,
    },
    /// Adam with decoupled weight decay.
    AdamW {
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    Constant,
    /// Linear warm-up from 0 over `warmup` steps, then cosine decay to `min_lr` at `total` steps.
    WarmupCosine {
        warmup: u64,
        total: u64,
        min_lr: f64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerSpec {
    pub kind: OptimizerKind,
    pub lr: f64,
    pub schedule: Schedule,
    /// Global-norm gradient clipping threshold.
    pub clip_norm: Option<f64>,
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        OptimizerSpec {
            kind: OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            lr: 1e-3,
            schedule: Schedule::Constant,
            clip_norm: None,
        }
    }
}

/// The learning rate of update number `step` (1-based: the first update is step 1).
///
/// `Constant`: `lr`. `WarmupCosine`: `lr · step / warmup` while `step < warmup` (so it rises
/// linearly from 0 at step 0 and reaches `lr` at step `warmup`), then
/// `min_lr + (lr − min_lr) · ½(1 + cos(π · (step − warmup) / (total − warmup)))`, reaching
/// `min_lr` at `total` and staying there.
pub fn lr_at(spec: &OptimizerSpec, step: u64) -> f64 {
    match spec.schedule {
        Schedule::Constant => spec.lr,
        Schedule::WarmupCosine { warmup, total, min_lr } => {
            if step < warmup {
                spec.lr * step as f64 / warmup as f64
            } else if step >= total {
                min_lr
            } else {
                let progress = (step - warmup) as f64 / (total - warmup) as f64;
                min_lr + (spec.lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// Per-parameter optimizer buffers (indexed like the plan's parameters; `None` until the
/// parameter is first updated) and the number of updates applied.
///
/// `m` is Adam's first moment or SGD's momentum buffer, `v` Adam's second moment. Buffers are
/// `f32`, as in PyTorch (so a run resumed from a checkpoint continues exactly); each update's
/// arithmetic is done in `f64` from those `f32` values and rounded once when stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerState {
    pub m: Vec<Option<Vec<f32>>>,
    pub v: Vec<Option<Vec<f32>>>,
    /// Updates applied so far.
    pub step: u64,
    /// Where the dynamic loss scale stands (plans with `loss_scaling`): kept by the host on
    /// every backend, which writes the scale into the plan's parameter for each step.
    pub loss_scale: Option<crate::precision::ScaleState>,
}

impl OptimizerState {
    pub fn new(num_params: usize) -> OptimizerState {
        OptimizerState {
            m: vec![None; num_params],
            v: vec![None; num_params],
            step: 0,
            loss_scale: None,
        }
    }

    /// Makes room for `n` parameters' buffers.
    pub fn ensure(&mut self, n: usize) {
        if self.m.len() < n {
            self.m.resize(n, None);
            self.v.resize(n, None);
        }
    }
}
