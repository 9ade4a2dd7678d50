//! Taking the measurements: timed calls with warm-up and progress, compiles, and sessions
//! opened on the bench's backend (falling back to the CPU under `--backend auto`).

use super::inputs::given;
use super::results::Profiled;
use super::BenchArgs;
use crate::commands::plan::Engine;
use crate::commands::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::plan::Mode;
use mgn_ir::tensor::Tensor;
use mgn_runtime::session::{RunOutput, Session};
use mgn_runtime::Plan;
use std::cell::Cell;
use std::time::Instant;

/// Median and interquartile range of one measurement, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Timing {
    pub median_ms: f64,
    pub p25_ms: f64,
    pub p75_ms: f64,
    pub samples: usize,
}

impl Timing {
    /// From durations in milliseconds (any order, at least one).
    pub fn from_samples(mut ms: Vec<f64>) -> Timing {
        ms.sort_by(f64::total_cmp);
        Timing {
            median_ms: quantile(&ms, 0.5),
            p25_ms: quantile(&ms, 0.25),
            p75_ms: quantile(&ms, 0.75),
            samples: ms.len(),
        }
    }
}

/// The `q` quantile of sorted values, interpolating linearly between neighbours (NumPy's
/// default).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// One bench run: its arguments, how it reports, and where its sessions run.
pub(super) struct Bench<'a> {
    pub(super) a: &'a BenchArgs,
    pub(super) format: MessageFormat,
    pub(super) progress: bool,
    /// Where the sessions run; under `auto` it becomes `Engine::Cpu` when the first session
    /// cannot use the GPU.
    pub(super) engine: Cell<Engine>,
    /// A session of this bench has run on the GPU (so falling back now would mix backends).
    pub(super) used_gpu: Cell<bool>,
}

impl Bench<'_> {
    /// `--warmup` untimed calls, then `--samples` calls timed one by one. What a call returns
    /// is dropped after its clock stops.
    pub(super) fn measure<T>(
        &self,
        what: &str,
        mut call: impl FnMut() -> Result<T, String>,
    ) -> Result<Timing, u8> {
        let total = self.a.warmup + self.a.samples;
        let mut ms = Vec::with_capacity(self.a.samples);
        for i in 0..total {
            if self.progress {
                let (phase, n, of) = if i < self.a.warmup {
                    ("warm-up", i + 1, self.a.warmup)
                } else {
                    ("sample", i + 1 - self.a.warmup, self.a.samples)
                };
                eprint!("\r\x1b[2K{what}: {phase} {n}/{of}");
            }
            let start = Instant::now();
            let r = call();
            let elapsed = start.elapsed().as_secs_f64() * 1e3;
            let r = r.map_err(|e| self.fail(&format!("{what}: {e}")))?;
            drop(r);
            if i >= self.a.warmup {
                ms.push(elapsed);
            }
        }
        if self.progress {
            eprint!("\r\x1b[2K");
        }
        Ok(Timing::from_samples(ms))
    }

    pub(super) fn fail(&self, msg: &str) -> u8 {
        report::error(msg, self.format);
        crate::commands::EXIT_ERRORS
    }

    /// Compiles the model, printing diagnostics when it does not build.
    pub(super) fn compile(
        &self,
        settings: &[Setting],
        opts: &PlanOptions,
    ) -> Result<(mgn_compiler::Outcome, Plan), u8> {
        let (outcome, plan) = mgn_compiler::driver::plan_path(
            &self.a.file,
            self.a.model.clone(),
            settings.to_vec(),
            opts,
        )
        .map_err(|e| self.fail(&e))?;
        if !report::diagnostics(&outcome, self.format) {
            return Err(crate::commands::EXIT_ERRORS);
        }
        Ok((outcome, plan.expect("a clean build lowers to a plan")))
    }

    /// The compile time from the .mgn text to a plan: check, elaborate, (autodiff,) lower. The
    /// outcome and plan are dropped after the clock stops.
    pub(super) fn measure_compile(
        &self,
        what: &str,
        settings: &[Setting],
        opts: &PlanOptions,
    ) -> Result<Timing, u8> {
        self.measure(what, || {
            match mgn_compiler::driver::plan_path(
                &self.a.file,
                self.a.model.clone(),
                settings.to_vec(),
                opts,
            )? {
                (outcome, Some(plan)) => Ok((outcome, plan)),
                (outcome, None) => Err(outcome
                    .diagnostics
                    .first()
                    .map_or("does not build".into(), |d| d.message.clone())),
            }
        })
    }

    /// A session for the first plan, moved onto the GPU when the bench runs there; with it,
    /// the device's name and the wall time (ms) `use_gpu` took. Under `--backend auto` a first
    /// session the GPU cannot run sends the whole bench to the CPU (with a note). Later plans
    /// open through `open_unless_too_large`: one the GPU cannot run for another reason is an
    /// error, so that one report never mixes backends.
    pub(super) fn open(&self, plan: Plan, notes: &mut Vec<String>) -> Result<Opened, u8> {
        let mode = mode_name(&plan);
        let model = plan.model.clone();
        self.open_unless_too_large(plan, notes)?.ok_or_else(|| {
            self.fail(&format!("the GPU cannot hold the {mode} plan of `{model}` (see above)"))
        })
    }

    /// `open` for a plan after the first: when the bench runs on the GPU and this plan's arena
    /// is past what the device holds, `None`, with a note saying why — the plans that fit are
    /// still measured (on a small device, the inference plans of a model whose training plan
    /// is too large), and the report's cells for this one stay empty.
    pub(super) fn open_unless_too_large(
        &self,
        plan: Plan,
        notes: &mut Vec<String>,
    ) -> Result<Option<Opened>, u8> {
        let model = plan.model.clone();
        let mut s = session(plan, self.a.seed)
            .map_err(|e| self.fail(&format!("cannot set up `{model}`: {e}")))?;
        self.engine.set(self.engine.get().settle(self.format));
        let Engine::Gpu { forced } = self.engine.get() else { return Ok(Some((s, None))) };
        let start = Instant::now();
        match s.use_gpu() {
            Ok(name) => {
                self.used_gpu.set(true);
                let ms = start.elapsed().as_secs_f64() * 1e3;
                notes.push(setup_note(&s, ms));
                Ok(Some((s, Some((name, ms)))))
            }
            Err(e) if e.is_too_large() && self.used_gpu.get() => {
                let w = format!("the {} plan was not measured: {e}", mode_name(&s.plan));
                if self.format == MessageFormat::Human {
                    eprintln!("note: {w}");
                }
                notes.push(w);
                Ok(None)
            }
            Err(e) if forced || self.used_gpu.get() => Err(self.fail(&format!(
                "the GPU cannot run the {} plan of `{}`: {e}",
                mode_name(&s.plan),
                s.plan.model
            ))),
            Err(e) => {
                let w = format!(
                    "measured on the CPU backend: the GPU cannot run `{}` ({e})",
                    s.plan.model
                );
                if self.format == MessageFormat::Human {
                    eprintln!("note: {w}");
                }
                notes.push(w);
                self.engine.set(Engine::Cpu);
                Ok(Some((s, None)))
            }
        }
    }
}

/// A session, and on the GPU the device's name and the ms its setup took.
pub(super) type Opened = (Session, Option<(String, f64)>);

/// A session with NaN checks off, so that the kernels are what is timed (an init that cannot
/// be computed is an error, not a panic).
fn session(plan: Plan, seed: u64) -> Result<Session, mgn_runtime::RuntimeError> {
    let mut s = Session::try_new(plan, seed)?;
    s.check_numerics = false;
    Ok(s)
}

/// One timed run of every step: on the GPU the results stay on the device (what is timed is the
/// submission and its wait); on the CPU they are collected, and dropped after the clock stops.
pub(super) fn timed_run(
    s: &mut Session,
    inputs: &[(&str, &Tensor)],
) -> Result<Option<RunOutput>, String> {
    match s.on_gpu() {
        true => s.run_resident(inputs).map(|()| None).map_err(|e| e.to_string()),
        false => s.run(inputs).map(Some).map_err(|e| e.to_string()),
    }
}

fn mode_name(plan: &Plan) -> &'static str {
    match plan.mode {
        Mode::Train => "training",
        Mode::Infer => "inference",
    }
}

/// Where the `ms` of moving `s` onto the GPU went, phase by phase.
fn setup_note(s: &Session, ms: f64) -> String {
    let phases = s.gpu_setup_phases();
    let known: f64 = phases.iter().map(|(_, t)| t.as_secs_f64() * 1e3).sum();
    let mut each: Vec<String> =
        phases.iter().map(|(n, t)| format!("{n} {:.1}", t.as_secs_f64() * 1e3)).collect();
    each.push(format!("optimizer state and the rest {:.1}", (ms - known).max(0.0)));
    let mut note =
        format!("GPU setup of the {} plan, {ms:.1} ms: {}", mode_name(&s.plan), each.join(", "));
    let alongside = s.gpu_setup_alongside().as_secs_f64() * 1e3;
    note.push_str(&format!(
        " (the arena allocated and the parameters uploaded during the pipelines, {alongside:.1})"
    ));
    note.push_str(&pipelines_summary(&s.gpu_pipeline_times()));
    note
}

/// `; N pipelines, X ms of compiling in all, slowest: …` — the kernels whose compile time
/// bounds the pipelines phase (their threads run in parallel), with where each comes from.
fn pipelines_summary(times: &[(String, std::time::Duration)]) -> String {
    if times.is_empty() {
        return String::new();
    }
    let ms = |t: &std::time::Duration| t.as_secs_f64() * 1e3;
    let total: f64 = times.iter().map(|(_, t)| ms(t)).sum();
    let mut slow: Vec<&(String, std::time::Duration)> = times.iter().collect();
    slow.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
    let slowest: Vec<String> =
        slow.iter().take(3).map(|(at, t)| format!("{:.1} ms ({at})", ms(t))).collect();
    format!(
        "; {} pipelines, {total:.0} ms of compiling in all, slowest {}",
        times.len(),
        slowest.join(", ")
    )
}

/// One profiled run of `s` (GPU only).
pub(super) fn profile_of(
    s: &mut mgn_runtime::session::Session,
    inputs: &[(String, Tensor)],
) -> Option<Profiled> {
    let ms = |t: std::time::Duration| t.as_secs_f64() * 1e3;
    match s.profile(&given(inputs))? {
        Ok(p) => Some(Profiled {
            by_op: p.by_op.into_iter().map(|(k, n, t)| (k, n, ms(t))).collect(),
            slowest: p.slowest.into_iter().map(|(k, t)| (k, ms(t))).collect(),
            dispatches: p.dispatches,
        }),
        Err(e) => {
            eprintln!("warning: profiling failed: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let t = Timing::from_samples(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((t.p25_ms, t.median_ms, t.p75_ms, t.samples), (1.75, 2.5, 3.25, 4));
        let one = Timing::from_samples(vec![7.0]);
        assert_eq!((one.p25_ms, one.median_ms, one.p75_ms), (7.0, 7.0, 7.0));
    }
}
