//! Runs a plan on the GPU: the plan is rewritten into the GPU's program (`rewrite::for_gpu`),
//! every value gets a region of one device-local arena (`memory`), every step a kernel
//! generated for its shapes (`kernels`), and a run is one submission: the inputs are copied in,
//! the dispatches run level by level (`schedule`), the results are copied out. Opening a
//! session is those steps in order (`GpuSession::open`); messages name steps by their number
//! in the given plan.
//!
//! A training step adds, in the same submission, batch norm's running-statistics updates and
//! the optimizer (`update`), and reads back only the loss: parameters and optimizer state then
//! live on the device, and `params` / `optimizer_state` read them back when the host needs them
//! (checkpoints, evaluation). A plan with an op that has no kernel is refused with the op and
//! its model line. A plan that writes state (a KV cache) ends each submission by copying the
//! written values over their parameters (`state`), so `params` returns the new state.

use crate::device::{Arena, Connection, Dispatch, GpuDevice, Kernel, Params, Submission};
use crate::limits::{fold_grid, CoopUse, DeviceLimits};
use crate::program::{GpuOp, GpuPlan};
use crate::schedule::Levels;
use crate::update;
use crate::GpuError;
use mgn_ir::op::Op;
use mgn_ir::optim::OptimizerState;
use mgn_ir::plan::{Mode, Plan};
use mgn_ir::tensor::RunOutput;
use mgn_ir::tensor::{Data, Tensor};
use std::collections::HashMap;

pub(crate) mod choices;
mod dispatches;
mod sized;
mod tensors;
mod training;

pub use choices::{cache_dir, set_cache_dir, verdicts_file, write_always, Chosen, Verdict};
use dispatches::{step_dispatches, Sources, StepDispatch};
use training::{running_stats_updates, training, Training};

/// What `GpuSession::profile` measured: GPU time per op family (the first word of the op's
/// name: family, dispatches, total), slowest first, the slowest dispatches on their own (the op
/// with its attributes, the output shape and the model line it came from), and every dispatch
/// in the order it ran (for a trace).
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub by_op: Vec<(String, usize, std::time::Duration)>,
    pub slowest: Vec<(String, std::time::Duration)>,
    pub dispatches: Vec<Timed>,
}

/// One dispatch of a profiled run.
#[derive(Clone, Debug)]
pub struct Timed {
    /// The op with its attributes (`GpuOp::describe`; the first word is its family).
    pub op: String,
    pub shape: Vec<usize>,
    /// The model line the step comes from.
    pub loc: mgn_ir::plan::SourceLoc,
    /// Its dependency level: dispatches of one level run together in a real run.
    pub level: usize,
    pub time: std::time::Duration,
    /// Its arithmetic and least memory traffic (`work::of`), for the roofline.
    pub work: crate::work::Work,
}

/// An op's family: the first word of its description (`GpuOp::describe`), what a profile
/// groups its dispatches by.
pub fn family(op: &str) -> &str {
    op.split_whitespace().next().unwrap_or("?")
}

impl Profile {
    /// How many of the slowest dispatches a profile keeps.
    pub const SLOWEST: usize = 15;
}

pub struct GpuSession {
    dev: GpuDevice,
    /// The plan as run: the given one after the GPU's rewrites (`rewrite::for_gpu`). Its step
    /// ids are the given plan's step numbers.
    pub plan: GpuPlan,
    arena: Option<Arena>,
    /// First arena word of each step's value.
    offsets: Vec<usize>,
    kernels: Vec<Kernel>,
    /// Per step: which kernel, its grid, and for dropout the step whose mask key it needs
    /// (None for inputs and parameters).
    dispatch: Vec<Option<StepDispatch>>,
    levels: Levels,
    /// Training plans: batch norm running-statistics updates and the optimizer.
    train: Option<Training>,
    /// The copies that end every submission of a run: state written into its parameters.
    state: Vec<Vec<crate::state::WordCopy>>,
    /// How long each phase of opening the session took, in order (`setup_phases`).
    setup_phases: Vec<(&'static str, std::time::Duration)>,
    /// How long the arena's allocation and the parameters' upload took, alongside the pipelines
    /// phase (`setup_alongside`).
    setup_alongside: std::time::Duration,
    /// Every kernel source compiled so far (`kernels` holds their pipelines, in this order): a
    /// dynamic plan's runs at other sizes add the kernels that are not shared across sizes.
    sources: Sources,
    /// A dynamic plan: its program's sizes and sites, and the runs made at other sizes
    /// (`sized.rs`). `plan` and `dispatch` are then those of the last run's sizes.
    sizing: Option<sized::Sizing>,
    sizes: ArenaSizes,
    /// The convolutions and products measured when it opened (`CoopUse::Measured`): step and
    /// verdict.
    measured: Vec<(usize, Verdict)>,
    /// The steps whose kernel a verdict on file chose when it opened.
    choices_known: usize,
}

/// Every parameter step's arena offset and words.
fn param_words<'a>(
    plan: &GpuPlan,
    offsets: &[usize],
    params: &'a [Tensor],
) -> Vec<(usize, std::borrow::Cow<'a, [u32]>)> {
    let steps = plan.steps.iter().enumerate();
    steps
        .filter_map(|(i, s)| match s.op {
            GpuOp::Plan(Op::Param { index }) => {
                Some((offsets[i], words_of(&params[index], s.dtype)))
            }
            _ => None,
        })
        .collect()
}

/// A tensor's words as the arena holds a value of `dtype` (the holding step's: an inference
/// plan may hold an f32 parameter as halves, `rewrite::halves`): f32 and i32 values as they
/// lie in memory (no copy: a model's parameters are hundreds of megabytes), f64 rounded to f32,
/// halves packed, a packed type's bytes in little-endian words.
fn words_of(t: &Tensor, dtype: mgn_ir::DType) -> std::borrow::Cow<'_, [u32]> {
    use std::borrow::Cow;
    if dtype.is_half() {
        return Cow::Owned(crate::halves::pack(&t.to_f64_vec(), dtype));
    }
    match &t.data {
        Data::F32(v) => Cow::Borrowed(as_words(v)),
        Data::I32(v) => Cow::Borrowed(as_words(v)),
        Data::F64(v) => Cow::Owned(v.iter().map(|&x| (x as f32).to_bits()).collect()),
        Data::Packed(b) => Cow::Owned(
            b.chunks(4)
                .map(|c| {
                    let mut w = [0u8; 4];
                    w[..c.len()].copy_from_slice(c);
                    u32::from_le_bytes(w)
                })
                .collect(),
        ),
    }
}

/// The 32-bit element types the arena holds as they are.
trait Word: Copy {}
impl Word for f32 {}
impl Word for i32 {}

/// 32-bit values seen as the words that hold them (no copy).
fn as_words<T: Word>(v: &[T]) -> &[u32] {
    // Safety: f32 and i32 have the size and alignment of u32, no padding, and every bit
    // pattern is a valid u32; the words are read, never written, through this view.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u32>(), v.len()) }
}

fn tensor_of(words: Vec<u32>, dtype: mgn_ir::DType, shape: Vec<usize>) -> Tensor {
    let data = if dtype.is_half() {
        Data::F32(crate::halves::unpack(&words, shape.iter().product(), dtype))
    } else if dtype.is_float() {
        Data::F32(words.into_iter().map(f32::from_bits).collect())
    } else {
        Data::I32(words.into_iter().map(|w| w as i32).collect())
    };
    Tensor { dtype, shape, data }
}

fn params_block(words: &[u32]) -> Params {
    let mut p = [0u32; 32];
    p[..words.len()].copy_from_slice(words);
    p
}

/// The plan's dispatches by level, with this run's dropout keys, and the step each one runs.
fn step_levels<'a>(
    kernels: &'a [Kernel],
    dispatch: &[Option<StepDispatch>],
    by_level: &Levels,
    seed: u64,
) -> (Vec<Vec<Dispatch<'a>>>, Vec<Vec<usize>>) {
    let mut levels: Vec<Vec<Dispatch>> = (0..by_level.count).map(|_| Vec::new()).collect();
    let mut steps: Vec<Vec<usize>> = (0..by_level.count).map(|_| Vec::new()).collect();
    for (i, d) in dispatch.iter().enumerate() {
        if let (Some(d), Some(l)) = (d, by_level.step[i]) {
            let mut p = d.params;
            if let Some(node) = d.dropout_node {
                let key = crate::kernels::dropout_key(seed, node);
                p[0] = key as u32;
                p[1] = (key >> 32) as u32;
            }
            levels[l].push((&kernels[d.kernel], p, d.groups));
            steps[l].push(i);
        }
    }
    (levels, steps)
}

fn err(e: String) -> GpuError {
    GpuError::Failed(e)
}

/// What opening a session makes on the CPU, from the device's limits alone: the arena's layout,
/// the dependency levels, every step's dispatch and the kernels' sources.
struct Made {
    offsets: Vec<usize>,
    levels: Levels,
    dispatch: Vec<Option<StepDispatch>>,
    train: Option<Training>,
    state: Vec<Vec<crate::state::WordCopy>>,
    sources: Sources,
    /// The arena's words, optimizer state and scratch included.
    top: usize,
    /// What the plan's own values take of them: `ArenaSizes`.
    sizes: ArenaSizes,
}

/// The bytes of a session's arena, after the GPU's rewrites (`GpuSession::arena_sizes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaSizes {
    /// The parameters as held (halves where an inference plan's products read only those).
    pub params: u64,
    /// Inputs and step values after lifetime reuse.
    pub values: u64,
    /// Everything: the two above, then a training plan's optimizer state and scratch, and the
    /// copies of state parameters.
    pub total: u64,
}

impl Made {
    fn of(
        plan: &GpuPlan,
        dynamic: Option<&crate::dynamic::DynamicProgram>,
        limits: &DeviceLimits,
        memory: Option<u64>,
        choosing: Option<&mut choices::Choosing>,
        phase: &mut dyn FnMut(&'static str),
    ) -> Result<Made, GpuError> {
        // Values share arena words when their lifetimes do not overlap.
        let (layout, levels) = crate::memory::plan_arena_and_levels(plan);
        // Sizes past the device refused now, in the model's terms, before any kernel is made.
        let fits = |words| {
            crate::memory::check_fits(plan, words, limits, memory).map_err(GpuError::TooLarge)
        };
        fits(layout.total_words)?;
        let sizes = ArenaSizes {
            params: layout.param_words as u64 * 4,
            values: (layout.total_words - layout.param_words) as u64 * 4,
            total: 0,
        };
        let offsets = layout.offsets;
        phase("arena plan and levels");
        let mut sources = Sources::default();
        let bound = dynamic.map(|d| d.bound()).unwrap_or_default();
        let follows = |v: usize| match dynamic {
            Some(d) => d.dims(v, plan.steps[v].shape.len()),
            None => Vec::new(),
        };
        let dispatch =
            step_dispatches(plan, &offsets, limits, &mut sources, &follows, &bound, choosing)?;
        // Training: optimizer state and clipping scratch go past the plan's own words.
        let mut top = layout.total_words;
        let train = training(plan, &offsets, &levels, limits, &mut top, &mut sources)?;
        let state = crate::state::state_copies(plan, &offsets, &mut top).map_err(err)?;
        fits(top)?;
        phase("kernels generated");
        let sizes = ArenaSizes { total: top as u64 * 4, ..sizes };
        Ok(Made { offsets, levels, dispatch, train, state, sources, top, sizes })
    }
}

impl GpuSession {
    /// Opens the GPU for `plan` after its rewrites (`rewrite::for_gpu`), uploads `params` and
    /// compiles a kernel per step.
    pub fn new(plan: Plan, params: &[Tensor]) -> Result<GpuSession, GpuError> {
        // The rewrites index steps by the plan's own references: a plan built by hand (not by
        // mgnc, not loaded from a file) is checked first.
        plan.validate()
            .map_err(|e| GpuError::Failed(format!("{}: invalid plan: {e}", plan.model)))?;
        let options = crate::rewrite::Options::from_env().map_err(GpuError::Failed)?;
        let start = std::time::Instant::now();
        // Opening reports a device that cannot be chosen; the program is then the default one.
        let device = GpuDevice::chosen().ok().map(|(info, limits)| (limits, info.memory));
        let (rewritten, dynamic) = match (&plan.dynamic, device) {
            (None, Some((limits, memory))) => {
                (crate::rewrite::for_device(&plan, &options, &limits, memory), None)
            }
            (None, None) => (crate::rewrite::for_gpu_with(&plan, &options), None),
            (Some(_), Some((limits, memory))) => {
                let made = crate::dynamic::program_for_device(&plan, &options, &limits, memory);
                let (program, d) = made?;
                (program, Some(d))
            }
            (Some(_), None) => {
                let (program, d) = crate::dynamic::program(&plan, &options)?;
                (program, Some(d))
            }
        };
        let rewrite = start.elapsed();
        let mut session = GpuSession::open_program(rewritten, dynamic, params)?;
        session.setup_phases.insert(0, ("rewrites", rewrite));
        Ok(session)
    }

    /// Opens the GPU for a GPU plan as it is: lays out the arena (`memory::plan_arena`),
    /// orders the dispatches (`schedule::levels`), generates and compiles the kernels and
    /// uploads `params`.
    #[cfg(test)]
    pub(crate) fn open(plan: GpuPlan, params: &[Tensor]) -> Result<GpuSession, GpuError> {
        GpuSession::open_program(plan, None, params)
    }

    /// `open`, for a dynamic plan's program at its bound too (`dynamic` its sites). The device
    /// opens on another thread while this one plans the arena and generates the kernels, which
    /// need only the device's limits (the first open in a process takes the driver 0.2-0.5 s
    /// on the H200, each later one 70-90 ms).
    fn open_program(
        plan: GpuPlan,
        dynamic: Option<crate::dynamic::DynamicProgram>,
        params: &[Tensor],
    ) -> Result<GpuSession, GpuError> {
        let mut phases = Vec::new();
        let mut clock = std::time::Instant::now();
        let mut phase = |name: &'static str| {
            phases.push((name, clock.elapsed()));
            clock = std::time::Instant::now();
        };
        plan.validate()
            .map_err(|e| GpuError::Failed(format!("{}: invalid GPU plan: {e}", plan.model)))?;
        let (info, limits) = GpuDevice::chosen()?;
        phase("device chosen");
        let memory = info.memory;
        // Convolutions measured on this device (`choices`): static plans, on request.
        let measure = dynamic.is_none() && crate::limits::coop_use() == CoopUse::Measured;
        let mut choosing = measure.then(|| choices::Choosing::load(&info));
        let (opened, made) = std::thread::scope(|scope| {
            let opening = scope.spawn(|| Connection::open(&info));
            let made =
                Made::of(&plan, dynamic.as_ref(), &limits, memory, choosing.as_mut(), &mut phase);
            (opening.join(), made)
        });
        let crashed = || GpuError::NoDevice("the driver crashed while opening the device".into());
        let mut dev = GpuDevice::on(opened.map_err(|_| crashed())??, info, limits);
        let made = made?;
        phase("device (opened while the two phases before ran)");
        // The parameters cross the bus while the driver compiles.
        let values = param_words(&plan, &made.offsets, params);
        let fill = Submission {
            uploads: values.iter().map(|(o, d)| (*o, &d[..])).collect(),
            ..Default::default()
        };
        let sources = made.sources;
        let named = sources.named(0);
        let (compiled, arena, alongside) = dev.kernels_and_arena(&named, made.top, &fill);
        let arena = arena.map_err(|e| GpuError::Failed(format!("{}: {e}", plan.model)))?;
        let kernels = sources.check(compiled, 0);
        phase("pipelines");
        let mut dispatch = made.dispatch;
        let kernels = kernels.and_then(|k| match choosing.as_mut() {
            Some(c) => {
                let measured = c.measure(&mut dev, &arena, &k, &mut dispatch);
                measured.map(|()| k).map_err(|e| GpuError::Failed(format!("{}: {e}", plan.model)))
            }
            None => Ok(k),
        });
        let kernels = match kernels {
            Ok(k) => k,
            Err(e) => {
                dev.free(arena);
                return Err(e);
            }
        };
        if choosing.is_some() {
            phase("kernels measured");
        }
        let sizing = dynamic.map(|program| sized::Sizing::new(program, plan.clone()));
        Ok(GpuSession {
            dev,
            plan,
            arena: Some(arena),
            offsets: made.offsets,
            kernels,
            dispatch,
            levels: made.levels,
            train: made.train,
            state: made.state,
            setup_phases: phases,
            setup_alongside: alongside,
            sources,
            sizing,
            sizes: made.sizes,
            choices_known: choosing.as_ref().map_or(0, |c| c.known),
            measured: choosing.map(|c| c.measured).unwrap_or_default(),
        })
    }

    pub fn device_name(&self) -> &str {
        &self.dev.info.name
    }

    /// How long each phase of opening this session took, in order: the rewrites, choosing the
    /// device (the driver's list, once a process), the arena plan, kernel generation, what was
    /// left of opening the device (on another thread during the two before), and pipeline
    /// creation (with the arena's allocation and the parameters' upload alongside:
    /// `setup_alongside`).
    pub fn setup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        self.setup_phases.clone()
    }

    /// How long the arena's allocation and the parameters' upload took on the thread that
    /// made them while the pipelines compiled (within the `pipelines` phase).
    pub fn setup_alongside(&self) -> std::time::Duration {
        self.setup_alongside
    }

    /// The convolutions and products measured when the session opened (`CoopUse::Measured`),
    /// each as its step's number in the given plan and the verdict; none when every verdict
    /// was known.
    pub fn measured_kernels(&self) -> Vec<(usize, Verdict)> {
        self.measured.iter().map(|&(i, v)| (self.plan.ids[i].0 as usize, v)).collect()
    }

    /// The kernel choices of the session's opening: how many it measured (each a distinct
    /// shape; `measured_kernels`) and how many steps a verdict already on file settled.
    pub fn choices(&self) -> (usize, usize) {
        (self.measured.len(), self.choices_known)
    }

    /// Every kernel's generated body, for tests of which kernels a session chose.
    #[cfg(test)]
    pub(crate) fn kernel_bodies(&self) -> Vec<&str> {
        self.sources.list.iter().map(|(_, body, _)| body.as_str()).collect()
    }

    /// Each distinct kernel's compile time (naga and the driver, on one thread) with where it
    /// comes from (model line and step), in compile order: what the setup's `pipelines` phase
    /// spent, kernel by kernel, across its threads.
    pub fn pipeline_times(&self) -> Vec<(String, std::time::Duration)> {
        let at = self.sources.list.iter().map(|(_, _, at)| at.clone());
        at.zip(self.kernels.iter().map(|k| k.compile_time)).collect()
    }

    /// What the session's arena holds, in bytes: the memory it allocated on the device.
    pub fn arena_sizes(&self) -> ArenaSizes {
        self.sizes
    }

    /// Number of compiled pipelines and of dependency levels (for reports).
    pub fn shape(&self) -> (usize, usize) {
        (self.kernels.len(), self.levels.count)
    }

    /// Writes parameter values into their regions.
    pub fn set_params(&mut self, params: &[Tensor]) -> Result<(), GpuError> {
        let data = param_words(&self.plan, &self.offsets, params);
        let job = Submission {
            uploads: data.iter().map(|(o, d)| (*o, &d[..])).collect(),
            ..Default::default()
        };
        let r = self.dev.submit(self.arena.as_ref().expect("arena"), &job);
        r.map(drop).map_err(err)
    }

    /// One submission of every step, reading nothing back (see `Session::run_resident`).
    pub fn run_resident(&mut self, inputs: &[(&str, &Tensor)], seed: u64) -> Result<(), GpuError> {
        self.submit(inputs, seed, None, &[]).map(drop)
    }

    /// GPU time of one run of the plan's steps (`MGN_PROFILE=1`), each dispatch timed alone in its
    /// own pass: per op family and the slowest dispatches (see [`Profile`]). It is one run: state
    /// the plan writes advances once (the timed passes only recompute values).
    pub fn profile(&mut self, inputs: &[(&str, &Tensor)], seed: u64) -> Result<Profile, GpuError> {
        self.submit(inputs, seed, None, &[])?;
        let (levels, steps) = step_levels(&self.kernels, &self.dispatch, &self.levels, seed);
        let times = self.dev.profile(self.arena.as_ref().expect("arena"), &levels).map_err(err)?;
        let mut by: HashMap<String, (usize, std::time::Duration)> = HashMap::new();
        let mut each = Vec::new();
        let mut dispatches = Vec::new();
        let at_level = steps.iter().enumerate().flat_map(|(l, v)| v.iter().map(move |&i| (l, i)));
        for ((level, i), t) in at_level.zip(times) {
            let s = &self.plan.steps[i];
            let what = s.op.describe();
            let e = by.entry(family(&what).to_string()).or_default();
            e.0 += 1;
            e.1 += t;
            each.push((format!("{what} → {:?} ({})", s.shape, s.loc), t));
            let (shape, loc) = (s.shape.clone(), s.loc.clone());
            let ins: Vec<&[usize]> =
                s.inputs.iter().map(|&v| self.plan.steps[v as usize].shape.as_slice()).collect();
            let work = crate::work::of(&s.op, &ins, &s.shape);
            dispatches.push(Timed { op: what, shape, loc, level, time: t, work });
        }
        let mut by_op: Vec<(String, usize, std::time::Duration)> =
            by.into_iter().map(|(k, (n, t))| (k, n, t)).collect();
        by_op.sort_by_key(|e| std::cmp::Reverse(e.2));
        each.sort_by_key(|e| std::cmp::Reverse(e.1));
        each.truncate(Profile::SLOWEST);
        Ok(Profile { by_op, slowest: each, dispatches })
    }

    /// One submission of every step; returns outputs, loss and gradients like the CPU session.
    /// `seed` is the run's dropout seed (the CPU session's, so both draw the same masks).
    pub fn run(&mut self, inputs: &[(&str, &Tensor)], seed: u64) -> Result<RunOutput, GpuError> {
        let mut wanted: Vec<u32> = self.plan.outputs.iter().map(|(_, v)| *v).collect();
        wanted.extend(self.plan.loss);
        wanted.extend(self.plan.grads.iter().map(|(_, v)| *v));
        // A loss-scaled plan's gradients carry the scale its steps read: read it too.
        let scale_at = self.loss_scale_position().filter(|_| !self.plan.grads.is_empty());
        wanted.extend(scale_at);
        let mut values = self.submit(inputs, seed, None, &wanted)?.0;
        let scale = match scale_at {
            Some(_) => values.pop().map_or(1.0, |s| s.to_f64_vec()[0]),
            None => 1.0,
        };
        let mut got = values.into_iter();
        let outputs = self
            .plan
            .outputs
            .iter()
            .map(|(n, _)| (n.clone(), got.next().expect("one per output")))
            .collect();
        let loss = self.plan.loss.map(|_| got.next().expect("the loss"));
        let grads = self
            .plan
            .grads
            .iter()
            .map(|(p, _)| {
                let mut g = got.next().expect("one per gradient");
                if let (mgn_ir::Data::F32(v), true) = (&mut g.data, scale != 1.0) {
                    v.iter_mut().for_each(|x| *x = (*x as f64 / scale) as f32);
                }
                (self.plan.params[*p].name.clone(), g)
            })
            .collect();
        Ok(RunOutput { outputs, loss, grads })
    }

    /// One training step in one submission: forward, backward, running statistics and update
    /// number `step` of the optimizer; reads back only the loss, and whether the update was
    /// applied (a plan that scales its loss skips it when a gradient is not finite).
    pub fn train_step(
        &mut self,
        inputs: &[(&str, &Tensor)],
        seed: u64,
        step: u64,
    ) -> Result<(f64, bool), GpuError> {
        let loss = self
            .plan
            .loss
            .ok_or_else(|| GpuError::Failed("the training plan has no loss".into()))?;
        let (out, applied) = self.submit(inputs, seed, Some(step), &[loss])?;
        if let (Some(t), true) = (&mut self.train, applied) {
            for p in &mut t.params {
                p.has_state = true;
            }
        }
        Ok((out[0].to_f64_vec()[0], applied))
    }

    /// The optimizer state as the host keeps it (buffers of parameters updated at least once).
    pub fn optimizer_state(&mut self, step: u64) -> Result<OptimizerState, GpuError> {
        let mut state = OptimizerState::new(self.plan.params.len());
        state.step = step;
        let Some(t) = &self.train else {
            return Ok(state);
        };
        let mut downloads = Vec::new();
        let mut slots = Vec::new();
        for p in t.params.iter().filter(|p| p.has_state) {
            for (which, at) in [(0, p.m), (1, p.v)] {
                if let Some(at) = at {
                    downloads.push((at, p.n));
                    slots.push((which, p.index));
                }
            }
        }
        let r = self.dev.submit(
            self.arena.as_ref().expect("arena"),
            &Submission { downloads, ..Default::default() },
        );
        for ((which, index), words) in slots.into_iter().zip(r.map_err(err)?) {
            let v = Some(words.into_iter().map(f32::from_bits).collect());
            if which == 0 {
                state.m[index] = v;
            } else {
                state.v[index] = v;
            }
        }
        Ok(state)
    }

    /// Uploads optimizer state (from a checkpoint); parameters without buffers start fresh.
    pub fn set_optimizer_state(&mut self, state: &OptimizerState) -> Result<(), GpuError> {
        let Some(t) = &mut self.train else {
            return Ok(());
        };
        let mut uploads: Vec<(usize, &[u32])> = Vec::new();
        let mut zeros = Vec::new();
        for p in &mut t.params {
            let m = state.m.get(p.index).and_then(|m| m.as_ref());
            let v = state.v.get(p.index).and_then(|v| v.as_ref());
            p.has_state = m.is_some();
            for (at, buf) in [(p.m, m), (p.v, v)] {
                match (at, buf) {
                    (Some(at), Some(b)) if b.len() == p.n => uploads.push((at, as_words(b))),
                    (Some(at), _) => zeros.push((at, p.n)),
                    (None, _) => {}
                }
            }
        }
        let job = Submission { zeros, uploads, ..Default::default() };
        let r = self.dev.submit(self.arena.as_ref().expect("arena"), &job);
        r.map(drop).map_err(err)
    }

    /// Records and submits the plan (plus, with `step`, the training updates), reading back the
    /// values of `wanted`, and whether the updates were applied (a loss-scaled plan skips them
    /// when a gradient is not finite).
    fn submit(
        &mut self,
        inputs: &[(&str, &Tensor)],
        seed: u64,
        step: Option<u64>,
        wanted: &[u32],
    ) -> Result<(Vec<Tensor>, bool), GpuError> {
        self.resize(inputs)?;
        let mut uploads: Vec<(usize, std::borrow::Cow<[u32]>)> = Vec::new();
        for (name, v) in &self.plan.inputs {
            let want = &self.plan.steps[*v as usize];
            let t = inputs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| *t)
                .ok_or_else(|| GpuError::Failed(format!("missing input `{name}`")))?;
            if t.shape != want.shape {
                return Err(GpuError::Failed(format!(
                    "input `{name}` has shape {:?}, but the plan was built for {:?}",
                    t.shape, want.shape
                )));
            }
            uploads.push((self.offsets[*v as usize], words_of(t, want.dtype)));
        }
        let (mut levels, _) = step_levels(&self.kernels, &self.dispatch, &self.levels, seed);
        if let (Some(step), Some(t)) = (step, &self.train) {
            for (l, p, g) in &t.bn {
                levels[*l].push((&self.kernels[t.bn_kernel], *p, *g));
            }
            if let Some((sq, fin)) = t.norm {
                levels.push(
                    t.params
                        .iter()
                        .map(|p| {
                            (
                                &self.kernels[sq],
                                params_block(&[p.grad as u32, p.n as u32, p.partials as u32]),
                                p.norm_groups,
                            )
                        })
                        .collect(),
                );
                levels.push(vec![(&self.kernels[fin], [0; 32], [1, 1, 1])]);
            }
            let scalars = update::update_scalars(&self.plan.optimizer, step);
            levels.push(
                t.params
                    .iter()
                    .map(|p| {
                        let mut b = params_block(&[
                            p.offset as u32,
                            p.grad as u32,
                            p.m.unwrap_or(0) as u32,
                            p.v.unwrap_or(0) as u32,
                            p.n as u32,
                            u32::from(!p.has_state),
                        ]);
                        for (k, x) in scalars.iter().enumerate() {
                            b[8 + k] = x.to_bits();
                        }
                        (&self.kernels[t.update_kernel], b, p.update_groups)
                    })
                    .collect(),
            );
        }
        let mut downloads: Vec<(usize, usize)> = wanted.iter().map(|&v| self.download(v)).collect();
        // A loss-scaled update's verdict: whether it was applied.
        let verdict = step.and(self.train.as_ref().and_then(|t| t.verdict));
        downloads.extend(verdict.map(|w| (w, 1)));
        let arena = self.arena.as_ref().expect("arena");
        let job = Submission {
            zeros: Vec::new(),
            uploads: uploads.iter().map(|(o, d)| (*o, &d[..])).collect(),
            levels,
            downloads,
            copies: self.state.clone(),
        };
        let mut words = self.dev.submit(arena, &job).map_err(err)?;
        let applied = match verdict {
            Some(_) => words.pop().is_some_and(|w| w.first() != Some(&0)),
            None => true,
        };
        Ok((self.values_of(wanted, words), applied))
    }
}

impl Drop for GpuSession {
    fn drop(&mut self) {
        if let Some(a) = self.arena.take() {
            self.dev.free(a);
        }
    }
}
