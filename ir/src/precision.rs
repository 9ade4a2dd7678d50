//! The precision policy a plan is built with (`mgnc build --precision`), and the dynamic loss
//! scaling an `f16` training plan carries.
//!
//! Under a mixed policy the compiler gives every contraction — matrix products, convolutions and
//! their derivatives, attention — operands rounded to the half type, and the contraction
//! accumulates in f32 and stores an f32 result; everything else (norms, softmax, losses, the
//! optimizer and its state, the master copy of every parameter) stays f32. The policy is
//! visible in the plan: its casts are steps, so every backend computes the same thing.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::DType;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Precision {
    /// Every float computed and stored in f32 (the default contract).
    #[default]
    #[serde(rename = "f32")]
    F32,
    /// Contractions take f16 operands; training scales the loss dynamically.
    #[serde(rename = "mixed-f16")]
    MixedF16,
    /// Contractions take bf16 operands (f32's range: no loss scaling).
    #[serde(rename = "mixed-bf16")]
    MixedBf16,
}

impl Precision {
    /// Every accepted spelling, for `--help` and errors.
    pub const NAMES: &'static str = "f32, mixed (= mixed-f16), mixed-f16, mixed-bf16";

    /// Reads `--precision`'s value: `mixed` means `mixed-f16`.
    pub fn parse(s: &str) -> Result<Precision, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "mixed" | "mixed-f16" => Ok(Precision::MixedF16),
            "mixed-bf16" => Ok(Precision::MixedBf16),
            _ => Err(format!("unknown precision `{s}`; expected one of {}", Precision::NAMES)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::MixedF16 => "mixed-f16",
            Precision::MixedBf16 => "mixed-bf16",
        }
    }

    /// The type contractions read under this policy (`None`: f32 throughout).
    pub fn half(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::MixedF16 => Some(DType::F16),
            Precision::MixedBf16 => Some(DType::BF16),
        }
    }

    pub fn is_f32(&self) -> bool {
        *self == Precision::F32
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Dynamic loss scaling (PyTorch's `GradScaler`, with its defaults): the backward pass starts
/// from the scale `S` instead of 1, so small gradients survive the f16 rounding of the operands
/// of backward contractions, and every gradient the plan computes is `S` times the true one.
/// Backends divide `S` out where gradients are used — the optimizer's update (with clipping
/// by the true norm), and the gradients a run returns — so no step of the plan does, and no
/// caller sees a scaled gradient. After a step whose gradients hold an infinity or NaN the
/// update is skipped and `S` halves; after `growth_interval` clean steps in a row `S`
/// doubles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaling {
    /// The parameter holding `S` (`f32[]`, not trained, not saved with the model's weights:
    /// the session writes it, and checkpoints keep it with the optimizer state).
    pub param: usize,
    /// `S` before the first step.
    pub init: f64,
    /// Clean steps in a row after which `S` doubles.
    pub growth_interval: u64,
}

impl LossScaling {
    /// The scale's parameter name in a plan.
    pub const PARAM: &'static str = "mgn.loss_scale";
    /// PyTorch's `GradScaler` defaults.
    pub const INIT: f64 = 65536.0;
    pub const GROWTH_INTERVAL: u64 = 2000;
    pub const GROWTH: f64 = 2.0;
    pub const BACKOFF: f64 = 0.5;
}

/// Where a dynamic loss scale stands: the scale, the clean steps since it last changed, and
/// the steps skipped so far (each took a batch of data but made no update).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleState {
    pub scale: f64,
    pub clean_steps: u64,
    pub skipped: u64,
}

impl ScaleState {
    pub fn new(spec: &LossScaling) -> ScaleState {
        ScaleState { scale: spec.init, clean_steps: 0, skipped: 0 }
    }

    /// Records one step: `finite` when every gradient was finite (the update was applied).
    /// Returns whether the scale changed.
    pub fn record(&mut self, spec: &LossScaling, finite: bool) -> bool {
        if !finite {
            // Never below the smallest normal f32: a scale that underflows stops training.
            self.scale = (self.scale * LossScaling::BACKOFF).max(f32::MIN_POSITIVE as f64);
            self.clean_steps = 0;
            self.skipped += 1;
            return true;
        }
        self.clean_steps += 1;
        if self.clean_steps >= spec.growth_interval {
            self.clean_steps = 0;
            let grown = self.scale * LossScaling::GROWTH;
            if grown <= f32::MAX as f64 {
                self.scale = grown;
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_mixed_means_f16() {
        for p in [Precision::F32, Precision::MixedF16, Precision::MixedBf16] {
            assert_eq!(Precision::parse(p.name()), Ok(p));
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
        }
        assert_eq!(Precision::parse("mixed"), Ok(Precision::MixedF16));
        assert!(Precision::parse("fp16").unwrap_err().contains("mixed-bf16"));
        assert_eq!(Precision::MixedBf16.half(), Some(DType::BF16));
        assert_eq!(Precision::F32.half(), None);
    }

    #[test]
    fn the_scale_halves_on_overflow_and_doubles_after_clean_steps() {
        let spec = LossScaling { param: 0, init: 1024.0, growth_interval: 3 };
        let mut s = ScaleState::new(&spec);
        assert!(s.record(&spec, false));
        assert_eq!(s, ScaleState { scale: 512.0, clean_steps: 0, skipped: 1 });
        assert!(!s.record(&spec, true));
        assert!(!s.record(&spec, true));
        assert!(s.record(&spec, true));
        assert_eq!(s, ScaleState { scale: 1024.0, clean_steps: 0, skipped: 1 });
        // An overflow resets the count of clean steps.
        s.record(&spec, true);
        s.record(&spec, false);
        assert_eq!(s, ScaleState { scale: 512.0, clean_steps: 0, skipped: 2 });
        // The scale stays a normal f32 at both ends.
        let mut tiny = ScaleState { scale: f32::MIN_POSITIVE as f64, ..ScaleState::new(&spec) };
        tiny.record(&spec, false);
        assert_eq!(tiny.scale, f32::MIN_POSITIVE as f64);
        let mut huge = ScaleState { scale: f32::MAX as f64, clean_steps: 2, skipped: 0 };
        assert!(!huge.record(&spec, true));
        assert_eq!(huge.scale, f32::MAX as f64);
    }
}
