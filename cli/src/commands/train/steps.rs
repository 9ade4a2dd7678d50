//! The training loop: epochs of optimizer steps in each epoch's order, from wherever the
//! session's step count puts the run in the data; periodic checkpoints; a checkpoint on
//! Ctrl-C or SIGTERM; and a stop at the first non-finite loss that saves nothing.

use super::checkpoints;
use super::order::Order;
use super::TrainArgs;
use crate::commands::data::Dataset;
use mgn_ir::tensor::Tensor;
use mgn_runtime::session::Session;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Why training stopped early: the exit code, and the error to print (empty when the reason
/// was already said).
#[derive(Debug)]
pub struct Stop {
    pub code: u8,
    pub message: String,
}

impl Stop {
    fn error(message: String) -> Stop {
        Stop { code: crate::commands::EXIT_ERRORS, message }
    }
}

/// `--loss-log`'s file: a new one with its header, or, when resuming, the existing one to
/// append to.
fn open_loss_log(path: &Path, resuming: bool) -> Result<std::io::BufWriter<std::fs::File>, Stop> {
    let fresh = !resuming || !path.exists();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(!fresh)
        .truncate(fresh)
        .open(path)
        .map_err(|e| Stop::error(format!("cannot write {}: {e}", path.display())))?;
    let mut w = std::io::BufWriter::new(file);
    if fresh {
        writeln!(w, "batch,loss,applied,loss_scale")
            .map_err(|e| Stop::error(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(w)
}

/// Text appended to an epoch's line after it (held-out accuracy), from the trained session.
pub type AfterEpoch<'f> = dyn FnMut(&mut Session) -> Result<String, Stop> + 'f;

pub struct Trainer<'a> {
    pub a: &'a TrainArgs,
    pub session: Session,
    pub data: &'a Dataset,
    pub order: Order,
    /// Set by the Ctrl-C / SIGTERM handler; looked at after every step.
    pub interrupted: &'a AtomicBool,
    /// The newest checkpoint this run wrote, and its step.
    last_saved: Option<(PathBuf, u64)>,
    /// `--loss-log`: one CSV line per training step.
    loss_log: Option<std::io::BufWriter<std::fs::File>>,
}

impl<'a> Trainer<'a> {
    pub fn new(
        a: &'a TrainArgs,
        session: Session,
        data: &'a Dataset,
        order: Order,
        interrupted: &'a AtomicBool,
    ) -> Result<Trainer<'a>, Stop> {
        let loss_log = match &a.loss_log {
            Some(path) => Some(open_loss_log(path, a.resume.is_some())?),
            None => None,
        };
        Ok(Trainer { a, session, data, order, interrupted, last_saved: None, loss_log })
    }

    /// Trains up to the end of epoch `a.epochs`, starting at the step the session is at.
    pub fn run(&mut self, after_epoch: &mut AfterEpoch) -> Result<(), Stop> {
        let (first_epoch, first_batch) = self.order.position(self.session.batches_done());
        for epoch in first_epoch..self.a.epochs as u64 {
            let from = if epoch == first_epoch { first_batch } else { 0 };
            let sum = self.epoch(epoch, from)?;
            let spe = self.order.steps_per_epoch();
            let mut line = format!(
                "epoch {:>3}/{}  loss {:.4}",
                epoch + 1,
                self.a.epochs,
                sum / (spe - from) as f64
            );
            if from > 0 {
                line += &format!(" (batches {}–{spe} after resuming)", from + 1);
            }
            line += &after_epoch(&mut self.session)?;
            eprintln!("{line}");
        }
        Ok(())
    }

    /// "training step N (epoch E/EPOCHS, batch B/PER_EPOCH)" for the step about to be taken.
    fn where_(&self) -> String {
        let (epoch, batch) = self.order.position(self.session.batches_done());
        format!(
            "training step {} (epoch {}/{}, batch {}/{})",
            self.session.batches_done() + 1,
            epoch + 1,
            self.a.epochs,
            batch + 1,
            self.order.steps_per_epoch()
        )
    }

    /// What stopping now leaves on disk, for error messages.
    fn kept(&self) -> String {
        match (&self.last_saved, &self.a.save) {
            (Some((p, step)), _) => {
                format!("the newest checkpoint is {} (step {step})", p.display())
            }
            (None, Some(p)) if p.exists() => format!("{} is left as it was", p.display()),
            (None, Some(p)) => format!("nothing was written to {}", p.display()),
            (None, None) => "no checkpoint was written".to_string(),
        }
    }

    /// One optimizer step on the samples at `rows`; a failed step or a non-finite loss stops
    /// the run without saving (the update may already have spoilt the parameters).
    fn step(&mut self, rows: &[usize]) -> Result<f64, Stop> {
        let cols = self.data.batch(rows);
        let given: Vec<(&str, &Tensor)> = cols.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let here = self.where_();
        let file = self.a.file.display();
        let skipped_before = self.session.skipped_steps();
        let loss = self.session.train_step(&given).map_err(|e| {
            Stop::error(format!(
                "{file}: {here}: {e}; stopped: the parameters were not saved ({})",
                self.kept()
            ))
        })?;
        if let (Some(log), Some(path)) = (&mut self.loss_log, &self.a.loss_log) {
            let applied = self.session.skipped_steps() == skipped_before;
            let scale = self.session.loss_scale().map_or(1.0, |(s, _)| s);
            let line = format!("{},{loss},{},{scale}", self.session.batches_done(), applied as u8);
            writeln!(log, "{line}")
                .and_then(|_| log.flush())
                .map_err(|e| Stop::error(format!("cannot write {}: {e}", path.display())))?;
        }
        if !loss.is_finite() {
            let what = if loss.is_nan() { "NaN".to_string() } else { format!("{loss}") };
            return Err(Stop::error(format!(
                "{file}: {here}: the loss is {what}; stopped: the parameters were not saved \
                 ({}). A lower `--lr` or `--clip-norm` may help; `--check-numerics` names the \
                 op and line that first produced a NaN or infinity",
                self.kept()
            )));
        }
        Ok(loss)
    }

    /// The batches `from..` of `epoch` behind a progress bar; the sum of their losses.
    fn epoch(&mut self, epoch: u64, from: u64) -> Result<f64, Stop> {
        let spe = self.order.steps_per_epoch();
        let bar = super::progress(spe, self.a.quiet, epoch as u32 + 1, self.a.epochs);
        bar.set_position(from);
        let order = self.order.of_epoch(epoch);
        let b = self.order.batch;
        let mut sum = 0.0;
        for s in from as usize..spe as usize {
            let loss = self.step(&order[s * b..(s + 1) * b]).inspect_err(|_| bar.abandon())?;
            sum += loss;
            bar.set_message(format!("loss {loss:.4}"));
            bar.inc(1);
            if let Some(n) = self.a.save_every {
                if self.session.batches_done().is_multiple_of(n) {
                    let line = self.save_periodic().inspect_err(|_| bar.abandon())?;
                    bar.suspend(|| eprintln!("{line}"));
                }
            }
            if self.interrupted.load(Ordering::SeqCst) {
                bar.abandon();
                return Err(self.save_interrupted());
            }
        }
        bar.finish_and_clear();
        Ok(sum)
    }

    /// Writes `path` (finite parameters only, atomically, with the place in the data).
    fn save(&mut self, path: &std::path::Path) -> Result<(), Stop> {
        checkpoints::save(&mut self.session, &self.order, path, self.a.save_aliases)
            .map_err(|e| Stop::error(format!("{e}; stopped ({})", self.kept())))?;
        self.last_saved = Some((path.to_path_buf(), self.session.step));
        Ok(())
    }

    /// The periodic checkpoint of this step, then the older ones beyond `--keep` deleted.
    fn save_periodic(&mut self) -> Result<String, Stop> {
        let save = self.a.save.clone().expect("--save-every is refused without --save");
        let path = checkpoints::periodic_path(&save, self.session.step);
        self.save(&path)?;
        for warning in checkpoints::prune(&save, self.session.step, self.a.keep()) {
            eprintln!("warning: {warning}");
        }
        Ok(format!("saved the checkpoint of step {} to {}", self.session.step, path.display()))
    }

    /// On Ctrl-C or SIGTERM: a checkpoint at `--save` (or `MODEL.interrupted.safetensors`),
    /// then exit code 130.
    fn save_interrupted(&mut self) -> Stop {
        let path = self.a.save.clone().unwrap_or_else(|| {
            PathBuf::from(format!("{}.interrupted.safetensors", self.session.plan.model))
        });
        match self.save(&path) {
            Ok(()) => {
                eprintln!(
                    "interrupted at step {}: checkpoint saved to {}",
                    self.session.step,
                    path.display()
                );
                Stop { code: 130, message: String::new() }
            }
            Err(stop) => stop,
        }
    }

    /// The checkpoint at the end of training, at `--save`.
    pub fn save_final(&mut self) -> Result<(), Stop> {
        let Some(path) = self.a.save.clone() else { return Ok(()) };
        self.save(&path)?;
        eprintln!("saved checkpoint to {}", path.display());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The loop without `--check-numerics` (release builds, the GPU): the loss itself and the
    //! parameters before each save are what stop a diverging run.
    use super::*;
    use clap::Parser;
    use mgn_compiler::lower::PlanOptions;
    use mgn_ir::optim::{OptimizerKind, OptimizerSpec};
    use std::path::Path;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: TrainArgs,
    }

    /// Trains the digits MLP for two epochs with Adam at `lr`, NaN checks off, and `extra`
    /// arguments; returns how it stopped.
    fn diverge(lr: f64, save: &Path, extra: &[&str]) -> Stop {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace");
        let model = root.join("models/digits_mlp.mgn");
        let data = root.join("data/digits_train.safetensors");
        let mut args = vec!["mgnc", model.to_str().unwrap(), "--data", data.to_str().unwrap()];
        args.extend(["--epochs", "2", "--quiet", "--save", save.to_str().unwrap()]);
        args.extend(extra);
        let a = Cli::parse_from(args).a;
        let kind = OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let spec = OptimizerSpec { kind, lr, ..OptimizerSpec::default() };
        let opts = PlanOptions::train(&[], spec);
        let (_, plan) = mgn_compiler::driver::plan_path(&model, None, vec![], &opts).unwrap();
        let mut session = Session::new(plan.expect("the model builds"), 0);
        session.check_numerics = false;
        let data = Dataset::load(&data, &session.plan).unwrap();
        let order = Order { seed: 0, batch: 64, samples: data.len };
        let flag = AtomicBool::new(false);
        let mut trainer = Trainer::new(&a, session, &data, order, &flag).expect("no log to open");
        let stop = trainer.run(&mut |_: &mut Session| Ok(String::new())).unwrap_err();
        assert_eq!(stop.code, 1);
        stop
    }

    #[test]
    fn a_non_finite_loss_stops_at_its_step_and_saves_nothing() {
        let dir = std::env::temp_dir().join(format!("mgnc-nan-loss-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let save = dir.join("c.safetensors");
        // Step 1 sends the weights to ~1e30; step 2's logits overflow.
        let stop = diverge(1e30, &save, &[]);
        let m = &stop.message;
        assert!(m.contains("training step 2 (epoch 1/2, batch 2/22)"), "{m}");
        assert!(m.contains("the loss is") && m.contains("not saved"), "{m}");
        assert!(!save.exists());

        // At 1e39 step 1's loss is finite but its update makes the weights infinite: the
        // periodic checkpoint of step 1 is refused.
        let stop = diverge(1e39, &save, &["--save-every", "1"]);
        assert!(stop.message.contains("step 1") && stop.message.contains("not finite"));
        assert!(!save.exists() && !checkpoints::periodic_path(&save, 1).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
