//! Optimizer settings carried by a training plan. (The update rules run in the backends.)

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with (optional) momentum, PyTorch's formulation.
    Sgd { momentum: f64 },
    Adam { beta1: f64, beta2: f64, eps: f64 },
    /// Adam with decoupled weight decay.
    AdamW { beta1: f64, beta2: f64, eps: f64, weight_decay: f64 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    Constant,
    /// Linear warm-up from 0 over `warmup` steps, then cosine decay to `min_lr` at `total` steps.
    WarmupCosine { warmup: u64, total: u64, min_lr: f64 },
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
        OptimizerSpec { kind: OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 }, lr: 1e-3, schedule: Schedule::Constant, clip_norm: None }
    }
}
