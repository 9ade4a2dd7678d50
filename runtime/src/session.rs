//! A Session runs a Plan: it owns the parameters and the optimizer state, executes the steps
//! in order on a backend, and applies training updates.

use mgn_cpu as cpu;
use mgn_ir::op::Op;
use mgn_ir::optim::OptimizerState;
use mgn_ir::plan::{Mode, Plan};
use mgn_ir::precision::ScaleState;
pub use mgn_ir::tensor::RunOutput;
use mgn_ir::tensor::{Data, Tensor};
use std::fmt;

mod inputs;
mod packed;
mod sizes;
mod state;

/// Why a session could not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeError {
    /// `use_gpu` found no usable device (or the runtime was built without its GPU backend).
    NoDevice(String),
    /// `use_gpu` found the plan larger than the device holds (`GpuError::TooLarge`).
    TooLarge(String),
    /// Anything else, as one message naming the input, step or file involved.
    Failed(String),
}

impl RuntimeError {
    pub fn is_no_device(&self) -> bool {
        matches!(self, RuntimeError::NoDevice(_))
    }

    pub fn is_too_large(&self) -> bool {
        matches!(self, RuntimeError::TooLarge(_))
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::NoDevice(why) => write!(f, "no usable GPU: {why}"),
            RuntimeError::TooLarge(why) | RuntimeError::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RuntimeError {}

impl From<crate::gpu::GpuError> for RuntimeError {
    fn from(e: crate::gpu::GpuError) -> RuntimeError {
        #[allow(unreachable_patterns)] // a CPU-only build's error has one variant
        match e {
            crate::gpu::GpuError::NoDevice(why) => RuntimeError::NoDevice(why),
            #[cfg(feature = "gpu")]
            crate::gpu::GpuError::TooLarge(why) => RuntimeError::TooLarge(why),
            other => RuntimeError::Failed(other.to_string()),
        }
    }
}

pub struct Session {
    pub plan: Plan,
    pub params: Vec<Tensor>,
    pub optimizer: OptimizerState,
    /// Optimizer steps taken so far.
    pub step: u64,
    pub seed: u64,
    /// Stop at the first NaN or infinity and name the step and model line that produced it.
    pub check_numerics: bool,
    /// For each step, the last step that reads its value (`usize::MAX` for results).
    last_use: Vec<usize>,
    /// For each step, how it runs on the CPU: weights are read where they lie (packed, or
    /// transposed), never copied per run.
    fused: Vec<cpu::fused::Fused>,
    /// For each step, whether it reads the loss scale (transitively): a loss-scaled backward
    /// pass, whose infinities are overflows the step skips, not errors (`check_numerics`).
    scaled: Vec<bool>,
    /// When set, steps run on the GPU. Training steps there update the parameters and the
    /// optimizer state on the device; `sync_from_device` brings `params` and `optimizer` up to
    /// date (checkpoints do it themselves).
    gpu: Option<crate::gpu::Device>,
    /// Whether the device holds newer parameters than `params`.
    device_ahead: bool,
    /// Whether the host was found to have the memory a run on the CPU takes (checked before
    /// the first one).
    host_checked: bool,
    /// A dynamic plan's plans at the sizes of recent runs (`sizes.rs`).
    sized: sizes::SizedPlans,
}

/// A value during execution: computed here, or borrowed from the caller's inputs or the params.
enum Slot {
    Empty,
    Owned(Tensor),
    Param(usize),
    Input(usize),
}

impl Session {
    /// A session with freshly initialized parameters (deterministic for a given seed), after
    /// checking that the host has the memory its parameters and optimizer state take: a plan
    /// too large for the machine is an error naming its largest tensors.
    pub fn try_new(plan: Plan, seed: u64) -> Result<Session, RuntimeError> {
        crate::memory::check(&plan, crate::memory::resident(&plan), "a session")?;
        let params = (plan.params.iter().enumerate())
            .map(|(i, p)| crate::init::try_initialize(p, seed, i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(RuntimeError::Failed)?;
        Ok(Session::with_params(plan, seed, params))
    }

    /// A session with freshly initialized parameters (deterministic for a given seed). Memory
    /// is not checked: a plan too large for the host aborts in the allocator, and a computed
    /// init that cannot run panics (`try_new` makes both errors).
    pub fn new(plan: Plan, seed: u64) -> Session {
        let params = (plan.params.iter().enumerate())
            .map(|(i, p)| crate::init::initialize(p, seed, i))
            .collect();
        Session::with_params(plan, seed, params)
    }

    /// A session over `params` (in the plan's order, of its shapes).
    fn with_params(plan: Plan, seed: u64, params: Vec<Tensor>) -> Session {
        let last_use = mgn_ir::analysis::DefUse::of(&plan).last_uses();
        let fused = cpu::fused::fusions(&plan);
        let scaled = reads_loss_scale(&plan);
        Session {
            optimizer: OptimizerState::default(),
            plan,
            params,
            step: 0,
            seed,
            check_numerics: cfg!(debug_assertions),
            last_use,
            fused,
            scaled,
            gpu: None,
            device_ahead: false,
            host_checked: false,
            sized: Default::default(),
        }
    }

    pub fn param_index(&self, name: &str) -> Option<usize> {
        self.plan.params.iter().position(|p| p.name == name)
    }

    /// Runs the plan's steps on the GPU from now on. Returns the device's name; fails (and
    /// leaves the session on the CPU) when there is no usable device or an op has no kernel.
    pub fn use_gpu(&mut self) -> Result<String, RuntimeError> {
        let mut g = crate::gpu::open(self.plan.clone(), &self.params)?;
        g.set_optimizer_state(&self.optimizer)?;
        let name = g.device_name().to_string();
        self.gpu = Some(g);
        Ok(name)
    }

    /// The seed of this run's dropout masks: the session seed mixed with the step count, the
    /// same on every backend.
    fn run_seed(&self) -> u64 {
        self.seed ^ self.step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    pub fn on_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// How long each phase of moving onto the GPU took (`use_gpu`), in order; empty on the CPU.
    pub fn gpu_setup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        self.gpu.as_ref().map(|g| g.setup_phases()).unwrap_or_default()
    }

    /// How long the GPU arena's allocation and the parameters' upload took, alongside the
    /// pipelines phase of `gpu_setup_phases` (zero on the CPU).
    pub fn gpu_setup_alongside(&self) -> std::time::Duration {
        self.gpu.as_ref().map(|g| g.setup_alongside()).unwrap_or_default()
    }

    /// The kernel choices made when the session moved onto the GPU (`use_gpu`): how many
    /// were measured there, and how many steps a verdict already cached settled
    /// (`gpu::set_cache_dir`); `(0, 0)` on the CPU.
    pub fn gpu_choices(&self) -> (usize, usize) {
        self.gpu.as_ref().map(|g| g.choices()).unwrap_or_default()
    }

    /// Each distinct GPU kernel's compile time with the model line and step it comes from
    /// (`use_gpu`'s pipelines, kernel by kernel); empty on the CPU.
    pub fn gpu_pipeline_times(&self) -> Vec<(String, std::time::Duration)> {
        self.gpu.as_ref().map(|g| g.pipeline_times()).unwrap_or_default()
    }

    /// Brings `params` and `optimizer` up to date with the device after GPU training steps (a
    /// no-op on the CPU, or when nothing changed there).
    pub fn sync_from_device(&mut self) -> Result<(), RuntimeError> {
        if let (Some(g), true) = (&mut self.gpu, self.device_ahead) {
            for (host, device) in self.params.iter_mut().zip(g.params()?) {
                if let Some(t) = device {
                    *host = t;
                }
            }
            // The loss scale is the host's on every backend.
            let scale = self.optimizer.loss_scale;
            self.optimizer = g.optimizer_state(self.step)?;
            self.optimizer.loss_scale = scale;
            self.device_ahead = false;
        }
        Ok(())
    }

    /// GPU time per op family and the slowest dispatches over one run (see
    /// `GpuSession::profile`); None on the CPU.
    #[cfg(feature = "gpu")]
    pub fn profile(
        &mut self,
        inputs: &[(&str, &Tensor)],
    ) -> Option<Result<crate::gpu::Profile, RuntimeError>> {
        let seed = self.run_seed();
        self.gpu.as_mut().map(|g| g.profile(inputs, seed).map_err(RuntimeError::from))
    }

    /// What the GPU session's arena holds (parameters, values, the rest), when on the GPU.
    #[cfg(feature = "gpu")]
    pub fn gpu_arena_sizes(&self) -> Option<mgn_gpu::ArenaSizes> {
        self.gpu.as_ref().map(|g| g.arena_sizes())
    }

    /// Compiled GPU pipelines and dependency levels, when running on the GPU.
    #[cfg(feature = "gpu")]
    pub fn gpu_shape(&self) -> Option<(usize, usize)> {
        self.gpu.as_ref().map(|g| g.shape())
    }

    /// Runs every step; returns the outputs, the loss and the gradients the plan computes.
    pub fn run(&mut self, inputs: &[(&str, &Tensor)]) -> Result<RunOutput, RuntimeError> {
        let seed = self.run_seed();
        if let Some(g) = &mut self.gpu {
            // The GPU session divides a loss scale out itself.
            return Ok(g.run(inputs, seed)?);
        }
        let slots = self.execute(inputs, false)?;
        let mut out = self.collect(slots, inputs);
        let scale = self.scale_used();
        out.grads.iter_mut().for_each(|(_, g)| unscale(g, scale));
        Ok(out)
    }

    /// The loss scale the plan's steps read (its parameter's value; 1 without loss scaling):
    /// the factor its gradients carry.
    fn scale_used(&self) -> f64 {
        match &self.plan.loss_scaling {
            Some(ls) => self.params[ls.param].to_f64_vec()[0],
            None => 1.0,
        }
    }

    /// Runs every step and waits, reading nothing back: on the GPU the results stay on the
    /// device (what a benchmark times, and what PyTorch's synchronized timings measure); on the
    /// CPU they are computed and dropped.
    pub fn run_resident(&mut self, inputs: &[(&str, &Tensor)]) -> Result<(), RuntimeError> {
        let seed = self.run_seed();
        if let Some(g) = &mut self.gpu {
            return Ok(g.run_resident(inputs, seed)?);
        }
        self.execute(inputs, false).map(drop)
    }

    /// One training step: forward, backward, running-statistics updates and the optimizer
    /// update. Returns the loss.
    ///
    /// A plan that scales its loss (`f16` mixed precision) skips the update when a gradient is
    /// not finite and halves the scale (`skipped_steps` counts those), and doubles the scale
    /// after `growth_interval` clean steps: PyTorch's `GradScaler`. A skipped step took its
    /// batch all the same (`batches_done`).
    pub fn train_step(&mut self, inputs: &[(&str, &Tensor)]) -> Result<f64, RuntimeError> {
        if self.plan.mode != Mode::Train {
            return Err(RuntimeError::Failed(format!(
                "the plan of `{}` is an inference plan; build it with `--mode train` to train",
                self.plan.model
            )));
        }
        let seed = self.run_seed();
        self.write_loss_scale()?;
        if let Some(g) = &mut self.gpu {
            // Forward, backward, running statistics and the optimizer in one submission; the
            // parameters stay on the device.
            let (loss, applied) = g.train_step(inputs, seed, self.step + 1)?;
            self.device_ahead = true;
            self.record_step(applied);
            return Ok(loss);
        }
        let out = {
            let slots = self.execute(inputs, true)?;
            self.collect(slots, inputs)
        };
        let loss = out
            .loss
            .as_ref()
            .map(|l| l.to_f64_vec()[0])
            .ok_or_else(|| RuntimeError::Failed("the training plan has no loss".into()))?;
        let mut grads: Vec<Tensor> = out.grads.into_iter().map(|(_, g)| g).collect();
        let trained: Vec<usize> = self.plan.grads.iter().map(|(p, _)| *p).collect();
        let finite = grads.iter().all(|g| g.to_f64_vec().iter().all(|x| x.is_finite()));
        if self.plan.loss_scaling.is_some() && !finite {
            self.record_step(false);
            return Ok(loss);
        }
        let scale = self.scale_used();
        grads.iter_mut().for_each(|g| unscale(g, scale));
        self.record_step(true);
        crate::optim::apply(
            &mut self.optimizer,
            &self.plan.optimizer,
            self.step,
            &mut self.params,
            &grads,
            &trained,
        );
        Ok(loss)
    }

    /// Counts a training step: an applied update, or one a loss-scaled plan skipped; moves
    /// the loss scale on (written to its parameter before the next step), and adds one to
    /// each of the plan's counters.
    ///
    /// A skipped step counts too: its forward pass ran in training mode and updated the
    /// running statistics, as PyTorch's BatchNorm counts every training-mode forward in
    /// `num_batches_tracked`, whatever `GradScaler` then does with the gradients.
    fn record_step(&mut self, applied: bool) {
        self.step += applied as u64;
        self.count_step();
        if let Some(spec) = &self.plan.loss_scaling {
            let state = self.optimizer.loss_scale.get_or_insert(ScaleState::new(spec));
            state.record(spec, applied);
        }
    }

    /// Adds one to each counter (`Plan::counters`: BatchNorm's `num_batches_tracked`). No
    /// step reads a counter (the validator sees to it), so the GPU never holds one: the host's
    /// value is the only one, and `params`, `sync_from_device` and checkpoints all see it.
    /// The host stores integers as `i32`; a count saturates there (2^31 - 1 steps) rather
    /// than wrap to a negative count.
    fn count_step(&mut self) {
        for &c in &self.plan.counters {
            if let Data::I32(v) = &mut self.params[c].data {
                v.iter_mut().for_each(|n| *n = n.saturating_add(1));
            }
        }
    }

    /// The scale a loss-scaled plan's next step starts from: written into its parameter
    /// (on the device too) when the parameter holds another (a new session, a step that moved
    /// it, a resumed run).
    fn write_loss_scale(&mut self) -> Result<(), RuntimeError> {
        let Some(spec) = &self.plan.loss_scaling else { return Ok(()) };
        let state = *self.optimizer.loss_scale.get_or_insert(ScaleState::new(spec));
        let want = state.scale as f32;
        let param = spec.param;
        if self.params[param].to_f64_vec().first() == Some(&(want as f64)) {
            return Ok(());
        }
        self.params[param] = Tensor::f32(vec![], vec![want]);
        if let Some(g) = &mut self.gpu {
            g.write_params(&[(param, &self.params[param])])?;
        }
        Ok(())
    }

    /// The dynamic loss scale the next training step starts from (plans that scale their
    /// loss), and how many steps it has skipped for gradients that were not finite.
    pub fn loss_scale(&self) -> Option<(f64, u64)> {
        let spec = self.plan.loss_scaling.as_ref()?;
        let state = self.optimizer.loss_scale.unwrap_or(ScaleState::new(spec));
        Some((state.scale, state.skipped))
    }

    /// Training steps a loss-scaled plan skipped (a gradient was not finite; 0 for others).
    pub fn skipped_steps(&self) -> u64 {
        self.optimizer.loss_scale.map_or(0, |s| s.skipped)
    }

    /// Batches of data training has consumed: the updates made and the steps skipped.
    pub fn batches_done(&self) -> u64 {
        self.step + self.skipped_steps()
    }

    fn collect(&self, mut slots: Vec<Slot>, inputs: &[(&str, &Tensor)]) -> RunOutput {
        // A value named twice (an output that is also the loss, in a hand-built plan) is kept
        // for its later readers; every other one is moved out.
        let mut seen = std::collections::HashSet::new();
        let twice: std::collections::HashSet<u32> = self
            .plan
            .outputs
            .iter()
            .map(|(_, v)| *v)
            .chain(self.plan.loss)
            .chain(self.plan.grads.iter().map(|(_, v)| *v))
            .filter(|&v| !seen.insert(v))
            .collect();
        let mut taken: std::collections::HashMap<u32, Tensor> = std::collections::HashMap::new();
        let mut take = |v: u32| -> Tensor {
            let t = match std::mem::replace(&mut slots[v as usize], Slot::Empty) {
                Slot::Owned(t) => t,
                Slot::Param(p) => self.params[p].clone(),
                Slot::Input(i) => inputs[i].1.clone(),
                Slot::Empty => return taken.get(&v).cloned().expect("results are never freed"),
            };
            if twice.contains(&v) {
                taken.insert(v, t.clone());
            }
            t
        };
        let outputs = self.plan.outputs.iter().map(|(n, v)| (n.clone(), take(*v))).collect();
        let loss = self.plan.loss.map(&mut take);
        let grads = self
            .plan
            .grads
            .iter()
            .map(|(p, v)| (self.plan.params[*p].name.clone(), take(*v)))
            .collect();
        RunOutput { outputs, loss, grads }
    }

    fn execute(
        &mut self,
        inputs: &[(&str, &Tensor)],
        updates: bool,
    ) -> Result<Vec<Slot>, RuntimeError> {
        Session::check_given(&self.plan, inputs)?;
        let sized = self.sized_plan(inputs)?;
        let (plan, last_use, fused) = match &sized {
            Some(s) => (&s.plan, &s.last_use[..], &s.fused[..]),
            None => (&self.plan, &self.last_use[..], &self.fused[..]),
        };
        let which = Session::check_inputs(plan, inputs)?;
        if !self.host_checked {
            let need = crate::memory::Footprint {
                values: crate::memory::peak_values(&self.plan),
                ..crate::memory::resident(&self.plan)
            };
            crate::memory::check(&self.plan, need, "a run on the CPU")?;
            self.host_checked = true;
        }
        let training = self.plan.mode == Mode::Train;
        let seed = self.run_seed();
        let mut slots: Vec<Slot> = (0..plan.steps.len()).map(|_| Slot::Empty).collect();
        let mut bn_updates = Vec::new();
        for i in 0..plan.steps.len() {
            let step = &plan.steps[i];
            let slot = match &step.op {
                Op::Input { .. } => {
                    let pos = which[i].expect("checked above");
                    let given = inputs[pos].1;
                    if given.dtype == step.dtype {
                        Slot::Input(pos)
                    } else {
                        // f32 values for an f16 input, i32 ones for an i64 input: held at the
                        // declared type, so every op sees the types the plan was checked with.
                        let ctx = cpu::Ctx { training, seed, node: i as u32 };
                        let t = cpu::eval(&Op::Cast, &[given], step.dtype, &step.shape, &ctx);
                        Slot::Owned(t.map_err(|e| RuntimeError::Failed(e.to_string()))?)
                    }
                }
                Op::Param { index } => Slot::Param(*index),
                _ if fused[i] == cpu::fused::Fused::Skip => Slot::Empty,
                Op::SliceScatter { axis } if state::in_place(plan, last_use, i).is_some() => {
                    let p = state::in_place(plan, last_use, i).expect("checked by the guard");
                    let operands = [step.inputs[1], step.inputs[2]];
                    state::write_in_place(&mut self.params, p, *axis, operands, &slots, inputs)
                        .map_err(|e| {
                            RuntimeError::Failed(format!("{e} (at {}, step {i})", step.loc))
                        })?;
                    if self.check_numerics && !self.scaled[i] {
                        check_finite(&self.params[p], &step.op, i, &step.loc)?;
                    }
                    Slot::Param(p)
                }
                op => {
                    let get = |x: u32| get(&slots, x, &self.params, inputs);
                    let args = packed::operands(&fused[i], step, get, &self.params);
                    let ctx = cpu::Ctx { training, seed, node: i as u32 };
                    let t = packed::eval(&fused[i], step, &args, &ctx).map_err(|e| {
                        RuntimeError::Failed(format!("{e} (at {}, step {i})", step.loc))
                    })?;
                    if self.check_numerics && !self.scaled[i] {
                        check_finite(&t, op, i, &step.loc)?;
                    }
                    if let (true, true, Op::BatchNorm { momentum, .. }) = (updates, training, op) {
                        let (rm, rv) = (step.inputs[1] as usize, step.inputs[2] as usize);
                        if let (Op::Param { index: m }, Op::Param { index: v }) =
                            (&plan.steps[rm].op, &plan.steps[rv].op)
                        {
                            let (new_m, new_v) =
                                cpu::batch_norm_update(args[0], args[1], args[2], *momentum);
                            bn_updates.push((*m, new_m, *v, new_v));
                        }
                    }
                    Slot::Owned(t)
                }
            };
            slots[i] = slot;
            // Free what no later step reads.
            for &x in &plan.steps[i].inputs {
                if last_use[x as usize] == i {
                    slots[x as usize] = Slot::Empty;
                }
            }
        }
        for (m, new_m, v, new_v) in bn_updates {
            self.params[m] = new_m;
            self.params[v] = new_v;
        }
        // State for the next run (a KV cache): every step above read the old values.
        // (One written in place already holds its new value.)
        let written: Vec<(usize, Tensor)> = (plan.state_writes.iter())
            .filter(|&&(p, v)| !matches!(slots[v as usize], Slot::Param(q) if q == p))
            .map(|&(p, v)| (p, get(&slots, v, &self.params, inputs).clone()))
            .collect();
        for (p, t) in written {
            self.params[p] = t;
        }
        Ok(slots)
    }
}

fn get<'a>(
    slots: &'a [Slot],
    v: u32,
    params: &'a [Tensor],
    inputs: &'a [(&str, &Tensor)],
) -> &'a Tensor {
    match &slots[v as usize] {
        Slot::Owned(t) => t,
        Slot::Param(p) => &params[*p],
        Slot::Input(i) => inputs[*i].1,
        Slot::Empty => unreachable!(
            "plans are validated: every input is computed before it is read and freed after its \
             last reader"
        ),
    }
}

fn check_finite(
    t: &Tensor,
    op: &Op,
    i: usize,
    loc: &mgn_ir::plan::SourceLoc,
) -> Result<(), RuntimeError> {
    let bad = match &t.data {
        Data::F32(v) => v.iter().position(|x| !x.is_finite()).map(|k| v[k] as f64),
        Data::F64(v) => v.iter().position(|x| !x.is_finite()).map(|k| v[k]),
        Data::I32(_) | Data::Packed(_) => None,
    };
    match bad {
        Some(x) => Err(RuntimeError::Failed(format!(
            "{} produced by `{}` (step {i}) at {loc}",
            if x.is_nan() { "NaN" } else { "an infinity" },
            op.describe()
        ))),
        None => Ok(()),
    }
}

/// A gradient of a loss-scaled plan divided by the scale it carries (exact: scales are powers
/// of two).
fn unscale(g: &mut Tensor, scale: f64) {
    if scale == 1.0 {
        return;
    }
    match &mut g.data {
        Data::F32(v) => v.iter_mut().for_each(|x| *x = (*x as f64 / scale) as f32),
        Data::F64(v) => v.iter_mut().for_each(|x| *x /= scale),
        Data::I32(_) | Data::Packed(_) => {}
    }
}

/// Per step: whether it reads the plan's loss scale, directly or through other steps.
fn reads_loss_scale(plan: &Plan) -> Vec<bool> {
    let mut scaled = vec![false; plan.steps.len()];
    let Some(ls) = &plan.loss_scaling else { return scaled };
    for (i, s) in plan.steps.iter().enumerate() {
        scaled[i] = s.op == (Op::Param { index: ls.param })
            || s.inputs.iter().any(|&x| scaled.get(x as usize).copied().unwrap_or(false));
    }
    scaled
}

/// What a session takes from a checkpoint (see [`Session::from_checkpoint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore {
    /// The parameters alone: for running or evaluating a model.
    Weights,
    /// Parameters, optimizer state and step: for resuming training.
    Everything,
}

/// The optimizer state a checkpoint holds (`None` without `optim.step`): complete and finite,
/// and, when `plan` trains, of the plan's optimizer (see `optim::check_kind`).
fn checkpoint_optimizer_state(
    plan: &Plan,
    ckpt: &crate::checkpoint::Checkpoint,
) -> Result<Option<OptimizerState>, RuntimeError> {
    if ckpt.get(crate::optim::STEP_TENSOR).is_none() {
        return Ok(None);
    }
    let state =
        ckpt.optimizer_state(&plan.params).map_err(|e| RuntimeError::Failed(e.to_string()))?;
    let file = ckpt.path.display();
    if let Some(recorded) = ckpt.step().filter(|&s| s != state.step) {
        return Err(RuntimeError::Failed(format!(
            "{file}: the metadata says step {recorded} but the optimizer state's `{}` says {}; \
             the file was edited or damaged",
            crate::optim::STEP_TENSOR,
            state.step
        )));
    }
    let trains = plan.mode == Mode::Train && !plan.grads.is_empty();
    if let Some(model) = ckpt.model().filter(|&m| trains && m != plan.model) {
        return Err(RuntimeError::Failed(format!(
            "{file}: the training state was saved by model `{model}`, not `{}`; resume only a \
             run of this model (`--weights`-style loading takes another model's parameters)",
            plan.model
        )));
    }
    if plan.mode == Mode::Train && !plan.grads.is_empty() {
        crate::optim::check_kind(&state, &plan.params, &plan.optimizer.kind)
            .map_err(|e| RuntimeError::Failed(format!("{}: {e}", ckpt.path.display())))?;
    }
    Ok(Some(state))
}

/// How [`Session::save_checkpoint_as`] writes a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaveOptions {
    /// Metadata entries beside the standard ones (a training loop records its place in the
    /// data there); they come back in [`crate::checkpoint::load`]'s `metadata`.
    pub metadata: Vec<(String, String)>,
    /// Also write each alias of the plan (`Plan::aliases`: a tied weight's other names) as a
    /// copy of its parameter, as PyTorch's `model.state_dict()` lists a tied weight under
    /// every name. Off by default: each tensor once, as Hugging Face's `save_pretrained`
    /// writes. Either file loads strictly (matching checks that copies are equal).
    pub aliases: bool,
}

impl Session {
    /// Loads parameters (and, when present, optimizer state and the step count) from a
    /// safetensors checkpoint. Strict mode refuses missing, unexpected or mismatched tensors,
    /// and a tensor named by an alias whose values are not its parameter's; a computed buffer
    /// or a counter the file lacks takes the value a fresh session gives it (its computed
    /// table; 0), and the report lists it (`checkpoint::match_plan`).
    pub fn load_checkpoint(
        &mut self,
        path: &std::path::Path,
        mode: crate::checkpoint::MatchMode,
    ) -> Result<crate::checkpoint::Report, RuntimeError> {
        let ckpt =
            crate::checkpoint::load(path).map_err(|e| RuntimeError::Failed(e.to_string()))?;
        let (tensors, report) = crate::checkpoint::match_plan(&ckpt, &self.plan, mode)
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        let optimizer = checkpoint_optimizer_state(&self.plan, &ckpt)?;
        // What the file does not say is what a session opened on it would hold: not whatever
        // this session held before (another checkpoint's count, a table replaced by one).
        let fresh = (report.computed.iter().chain(&report.counters_started))
            .map(|name| {
                let i = self.param_index(name).expect("the report names the plan's tensors");
                let t = crate::init::try_initialize(&self.plan.params[i], self.seed, i);
                t.map(|t| (i, t)).map_err(RuntimeError::Failed)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Everything is checked: only now does the session change.
        for (i, t) in tensors.into_iter().enumerate() {
            if let Some(t) = t {
                self.params[i] = t;
            }
        }
        for (i, t) in fresh {
            self.params[i] = t;
        }
        if let Some(state) = optimizer {
            self.step = state.step;
            self.optimizer = state;
        }
        if let Some(g) = &mut self.gpu {
            g.set_params(&self.params)?;
            g.set_optimizer_state(&self.optimizer)?;
        }
        self.device_ahead = false;
        Ok(report)
    }

    /// A session whose parameters come from the checkpoint at `path`: the checkpoint is read
    /// and matched against the plan before anything plan-sized is allocated (so a mismatch is
    /// the error a user sees, not an allocation failure), then the host's memory is checked.
    /// Parameters the checkpoint does not hold (`MatchMode::Partial`, computed buffers,
    /// counters) are initialized.
    /// `Restore::Everything` also takes the optimizer state and step (resuming training);
    /// `Restore::Weights` takes the parameters alone (running, evaluating).
    pub fn from_checkpoint(
        plan: Plan,
        seed: u64,
        path: &std::path::Path,
        mode: crate::checkpoint::MatchMode,
        restore: Restore,
    ) -> Result<(Session, crate::checkpoint::Report), RuntimeError> {
        let ckpt =
            crate::checkpoint::load(path).map_err(|e| RuntimeError::Failed(e.to_string()))?;
        let (tensors, report) = crate::checkpoint::match_plan(&ckpt, &plan, mode)
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        let optimizer = match restore {
            Restore::Everything => checkpoint_optimizer_state(&plan, &ckpt)?,
            Restore::Weights => None,
        };
        crate::memory::check(&plan, crate::memory::resident(&plan), "a session")?;
        let params = (tensors.into_iter().enumerate())
            .map(|(i, t)| match t {
                Some(t) => Ok(t),
                None => crate::init::try_initialize(&plan.params[i], seed, i),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(RuntimeError::Failed)?;
        let mut session = Session::with_params(plan, seed, params);
        if let Some(state) = optimizer {
            session.step = state.step;
            session.optimizer = state;
        }
        Ok((session, report))
    }

    /// Writes the parameters, the optimizer state and metadata atomically: a crash mid-write
    /// leaves the previous checkpoint intact.
    pub fn save_checkpoint(&mut self, path: &std::path::Path) -> Result<(), RuntimeError> {
        self.save_checkpoint_as(path, &SaveOptions::default())
    }

    /// [`Session::save_checkpoint`] with `extra` metadata entries beside the standard ones (a
    /// training loop records its position in the data there). They come back in
    /// [`crate::checkpoint::load`]'s `metadata`.
    pub fn save_checkpoint_with(
        &mut self,
        path: &std::path::Path,
        extra: &[(String, String)],
    ) -> Result<(), RuntimeError> {
        self.save_checkpoint_as(path, &SaveOptions { metadata: extra.to_vec(), aliases: false })
    }

    /// [`Session::save_checkpoint`] as `options` say: extra metadata, and whether each alias
    /// is written as a copy of its parameter.
    ///
    /// Counters are written as `i64` whatever integer type the plan declares: PyTorch's
    /// `num_batches_tracked` is `i64`, and its `load_state_dict` copies into the buffer's
    /// own dtype, so that is what an upstream model expects to find.
    pub fn save_checkpoint_as(
        &mut self,
        path: &std::path::Path,
        options: &SaveOptions,
    ) -> Result<(), RuntimeError> {
        self.sync_from_device()?;
        let mut state = self.optimizer.clone();
        state.step = self.step;
        // The optimizer state is the parameters': it never mentions an alias.
        let optim = crate::optim::state_to_tensors(&state, &self.plan.params)
            .map_err(|e| RuntimeError::Failed(format!("{}: {e}", path.display())))?;
        let counted: Vec<(usize, Tensor)> = (self.plan.counters.iter())
            .map(|&c| (c, Tensor { dtype: mgn_ir::DType::I64, ..self.params[c].clone() }))
            .collect();
        let value = |i: usize| -> &Tensor {
            counted.iter().find(|(c, _)| *c == i).map_or(&self.params[i], |(_, t)| t)
        };
        // `const` tensors are recomputed by every session, so a checkpoint leaves them out.
        let persistent = (self.plan.params.iter().enumerate()).filter(|(_, p)| p.persistent);
        let mut tensors: Vec<(String, &Tensor)> =
            persistent.map(|(i, p)| (p.name.clone(), value(i))).collect();
        if options.aliases {
            tensors.extend(self.plan.aliases.iter().map(|a| (a.name.clone(), value(a.param))));
        }
        tensors.extend(optim.iter().map(|(n, t)| (n.clone(), t)));
        let mut metadata = crate::checkpoint::standard_metadata(&self.plan.model, self.step);
        metadata.extend_from_slice(&options.metadata);
        crate::checkpoint::save(path, &tensors, &metadata)
            .map_err(|e| RuntimeError::Failed(e.to_string()))
    }
}
