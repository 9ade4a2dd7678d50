//! How many numbers a plan's tensors hold, by what they are, for `mgnc build`'s summary and
//! `mgnc bench`'s header: trainable parameters apart from buffers, const tables and state, so
//! that the first figure is the one PyTorch users know (`sum(p.numel() for p in
//! model.parameters())`) and a ResNet's running statistics or a decoder's KV cache do not
//! pass for parameters.

use mgn_compiler::graph::dump::thousands;
use mgn_runtime::Plan;

/// Elements per kind of tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Parameters this plan trains (or would: an inference plan's `param` fields).
    pub trainable: usize,
    /// Parameters `--freeze` keeps out of this plan's updates.
    pub frozen: usize,
    /// Saved and loaded, never trained: running statistics, counters, tables that upstream
    /// saves.
    pub buffers: usize,
    /// `const` tables every session computes, never saved.
    pub consts: usize,
    /// `state` a run writes for the next one (a KV cache), never saved.
    pub state: usize,
}

impl Counts {
    pub fn of(plan: &Plan) -> Counts {
        let mut c = Counts::default();
        let scale = plan.loss_scaling.as_ref().map(|s| s.param);
        for (i, p) in plan.params.iter().enumerate() {
            let n = p.numel();
            let slot = match () {
                // The session's loss scale (mixed f16 training), not the model's.
                _ if Some(i) == scale => continue,
                // A packed (quantized) parameter is never trained: frozen, not a buffer.
                _ if (p.trainable && p.frozen) || p.dtype.is_packed() => &mut c.frozen,
                _ if p.trainable => &mut c.trainable,
                _ if p.persistent => &mut c.buffers,
                _ if plan.state_writes.iter().any(|&(q, _)| q == i) => &mut c.state,
                _ => &mut c.consts,
            };
            *slot += n;
        }
        c
    }

    /// Every parameter, frozen or not: what PyTorch's `model.parameters()` holds.
    pub fn parameters(&self) -> usize {
        self.trainable + self.frozen
    }

    /// `25,557,032 trainable parameters, 53,173 in buffers`: the trainable parameters always,
    /// each other kind where there is some.
    pub fn describe(&self) -> String {
        let mut out = format!("{} trainable parameters", thousands(self.trainable));
        for (n, what) in [
            (self.frozen, "frozen"),
            (self.buffers, "in buffers"),
            (self.consts, "in const tables"),
            (self.state, "in state"),
        ] {
            if n > 0 {
                out += &format!(", {} {what}", thousands(n));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::plan::{InitSpec, Mode, ParamSpec};
    use mgn_ir::precision::LossScaling;
    use mgn_ir::DType;

    fn spec(name: &str, n: usize, trainable: bool, frozen: bool, persistent: bool) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            dtype: DType::F32,
            shape: vec![n],
            init: InitSpec::Constant(0.0),
            trainable,
            frozen,
            persistent,
        }
    }

    #[test]
    fn each_kind_is_counted_apart_and_the_loss_scale_not_at_all() {
        let mut plan = Plan::of_steps(Mode::Train, vec![], vec![], vec![]);
        plan.params = vec![
            spec("fc.weight", 1000, true, false, true),
            spec("emb.weight", 300, true, true, true),
            spec("bn.running_mean", 20, false, false, true),
            spec("pos.scale", 6, false, false, false),
            spec("cache", 4096, false, false, false),
            spec(LossScaling::PARAM, 1, false, false, false),
        ];
        plan.state_writes = vec![(4, 0)];
        plan.loss_scaling = Some(LossScaling {
            param: 5,
            init: LossScaling::INIT,
            growth_interval: LossScaling::GROWTH_INTERVAL,
        });
        let c = Counts::of(&plan);
        assert_eq!(c, Counts { trainable: 1000, frozen: 300, buffers: 20, consts: 6, state: 4096 });
        assert_eq!(c.parameters(), 1300);
        assert_eq!(
            c.describe(),
            "1,000 trainable parameters, 300 frozen, 20 in buffers, 6 in const tables, 4,096 \
             in state"
        );
        let only = Counts { trainable: 9610, ..Counts::default() };
        assert_eq!(only.describe(), "9,610 trainable parameters");
    }
}
