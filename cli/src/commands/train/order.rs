//! Where a run is in its data, and how to come back to exactly that place.
//!
//! Each epoch's order is a pure function of the seed and the epoch (a ChaCha8 stream per
//! epoch), so a run resumed at optimizer step `s` takes the batches an uninterrupted run would
//! have taken from step `s` on: epoch `s / steps_per_epoch`, batch `s % steps_per_epoch` of it.
//! That holds for the same seed, batch size and data set, which every checkpoint records in its
//! metadata and a resumed run checks.

use mgn_runtime::checkpoint::Checkpoint;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::path::Path;

/// Metadata keys of a training checkpoint, beside `mgn.model` and `mgn.step`.
pub const SEED_KEY: &str = "mgn.train.seed";
pub const BATCH_KEY: &str = "mgn.train.batch";
pub const SAMPLES_KEY: &str = "mgn.train.samples";
/// Epochs completed, and optimizer steps taken in the epoch under way.
pub const EPOCH_KEY: &str = "mgn.train.epoch";
pub const EPOCH_STEP_KEY: &str = "mgn.train.epoch_step";
/// How the data order is derived from the seed; another value means another order.
pub const ORDER_KEY: &str = "mgn.train.order";
pub const ORDER: &str = "chacha8-stream-per-epoch";

/// What fixes the order of the samples: the seed, the batch size and the data set's length.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Order {
    pub seed: u64,
    pub batch: usize,
    pub samples: usize,
}

impl Order {
    /// Full batches per epoch (the last `samples % batch` samples of each shuffle are unused).
    pub fn steps_per_epoch(&self) -> u64 {
        (self.samples / self.batch) as u64
    }

    /// The order of the samples in `epoch` (0-based): a function of the seed and the epoch only.
    pub fn of_epoch(&self, epoch: u64) -> Vec<usize> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(epoch);
        let mut order: Vec<usize> = (0..self.samples).collect();
        order.shuffle(&mut rng);
        order
    }

    /// (epoch, batch within it) of the optimizer step that follows `step` steps.
    pub fn position(&self, step: u64) -> (u64, u64) {
        (step / self.steps_per_epoch(), step % self.steps_per_epoch())
    }

    /// The metadata that lets a run resume after `step` steps at the same place in the data.
    pub fn metadata(&self, step: u64) -> Vec<(String, String)> {
        let (epoch, within) = self.position(step);
        [
            (SEED_KEY, self.seed.to_string()),
            (BATCH_KEY, self.batch.to_string()),
            (SAMPLES_KEY, self.samples.to_string()),
            (EPOCH_KEY, epoch.to_string()),
            (EPOCH_STEP_KEY, within.to_string()),
            (ORDER_KEY, ORDER.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// What a checkpoint recorded of its run's data order and position, when it recorded it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Recorded {
    pub order: Order,
    pub epoch: u64,
    pub epoch_step: u64,
}

impl Recorded {
    /// Reads the training metadata of `ckpt`: `None` when it has none (written by an older
    /// mgnc or by another tool), an error when it is there but unusable.
    pub fn of(ckpt: &Checkpoint) -> Result<Option<Recorded>, String> {
        Recorded::from_metadata(&ckpt.metadata, &ckpt.path)
    }

    fn from_metadata(
        meta: &BTreeMap<String, String>,
        path: &Path,
    ) -> Result<Option<Recorded>, String> {
        if !meta.contains_key(BATCH_KEY) {
            return Ok(None);
        }
        let num = |key: &str| -> Result<u64, String> {
            let v = meta.get(key).ok_or_else(|| {
                format!("{}: the metadata has `{BATCH_KEY}` but not `{key}`", path.display())
            })?;
            v.parse().map_err(|_| format!("{}: metadata `{key}` is `{v}`", path.display()))
        };
        let order_kind = meta.get(ORDER_KEY).map(String::as_str).unwrap_or("");
        if order_kind != ORDER {
            return Err(format!(
                "{}: recorded data order `{order_kind}`, but this mgnc orders the data by \
                 `{ORDER}`; it cannot resume at the same place",
                path.display()
            ));
        }
        let order = Order {
            seed: num(SEED_KEY)?,
            batch: num(BATCH_KEY)? as usize,
            samples: num(SAMPLES_KEY)? as usize,
        };
        if order.batch == 0 || order.samples < order.batch {
            return Err(format!(
                "{}: the recorded batch and data size are unusable",
                path.display()
            ));
        }
        Ok(Some(Recorded { order, epoch: num(EPOCH_KEY)?, epoch_step: num(EPOCH_STEP_KEY)? }))
    }

    /// Refuses to resume a run whose batches would differ from those the checkpoint's run
    /// would have taken next; `this` is the resumed run's order and `step` the checkpoint's.
    pub fn check(&self, this: &Order, step: u64, path: &Path) -> Result<(), String> {
        let p = path.display();
        if this.batch != self.order.batch {
            return Err(format!(
                "{p} was written by a run with batch {b}, and this run's batch is {}: the place \
                 to resume in the data depends on it; resume with `--batch {b}`",
                this.batch,
                b = self.order.batch
            ));
        }
        if this.samples != self.order.samples {
            return Err(format!(
                "{p} was written by a run over {} samples, and this data set has {}: resuming \
                 at the same place needs the same data",
                self.order.samples, this.samples
            ));
        }
        if this.seed != self.order.seed {
            return Err(format!(
                "{p} was written by a run with seed {s}, and this run's seed is {}: the data \
                 order depends on it; resume with `--seed {s}` or without `--seed`",
                this.seed,
                s = self.order.seed
            ));
        }
        if this.position(step) != (self.epoch, self.epoch_step) {
            return Err(format!(
                "{p}: step {step} is not epoch {}, batch {} at {} steps per epoch: the metadata \
                 does not agree with the step",
                self.epoch,
                self.epoch_step,
                this.steps_per_epoch()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order() -> Order {
        Order { seed: 7, batch: 4, samples: 10 }
    }

    #[test]
    fn each_epoch_has_its_own_order_that_depends_on_the_seed_and_epoch_alone() {
        let o = order();
        let (e0, e1) = (o.of_epoch(0), o.of_epoch(1));
        assert_ne!(e0, e1, "a new order every epoch");
        assert_eq!(o.of_epoch(1), e1, "the same epoch, the same order, whatever came before");
        let mut sorted = e1.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(Order { seed: 8, ..o }.of_epoch(1), e1);
        assert_eq!(o.steps_per_epoch(), 2);
        assert_eq!(o.position(5), (2, 1));
    }

    #[test]
    fn metadata_round_trips_and_a_different_run_is_refused() {
        let o = order();
        let meta: BTreeMap<String, String> = o.metadata(5).into_iter().collect();
        let path = Path::new("c.safetensors");
        let r = Recorded::from_metadata(&meta, path).unwrap().unwrap();
        assert_eq!(r, Recorded { order: o, epoch: 2, epoch_step: 1 });
        assert!(r.check(&o, 5, path).is_ok());
        let e = r.check(&Order { batch: 2, ..o }, 5, path).unwrap_err();
        assert!(e.contains("batch 4") && e.contains("`--batch 4`"), "{e}");
        let e = r.check(&Order { samples: 12, ..o }, 5, path).unwrap_err();
        assert!(e.contains("10 samples") && e.contains("has 12"), "{e}");
        let e = r.check(&Order { seed: 1, ..o }, 5, path).unwrap_err();
        assert!(e.contains("seed 7"), "{e}");
        assert!(r.check(&o, 6, path).unwrap_err().contains("does not agree"));
        assert_eq!(Recorded::from_metadata(&BTreeMap::new(), path), Ok(None));
        let mut other = meta.clone();
        other.insert(ORDER_KEY.into(), "something-else".into());
        assert!(Recorded::from_metadata(&other, path).unwrap_err().contains("something-else"));
    }
}
