//! Runs a plan on the GPU: every value gets a region of one arena buffer, every step a kernel
//! generated for its shapes (`kernels.rs`), and a run is one submission of all of them.
//!
//! A `Session` drives it (`Session::use_gpu`): the session keeps the authoritative parameters
//! and applies the optimizer on the host between submissions (for now). Values whose lifetimes
//! do not overlap share arena words (`memory::plan_arena`); a plan with an op that has no kernel
//! is refused with the op and its model line.

use super::device::{Arena, GpuDevice, Kernel, Params};
use super::kernels::{generate, Operand};
use crate::limits::fold_grid;
use crate::op::Op;
use crate::plan::Plan;
use crate::session::{RunOutput, RuntimeError};
use crate::tensor::{Data, Tensor};
use std::collections::HashMap;

pub struct GpuSession {
    dev: GpuDevice,
    pub plan: Plan,
    arena: Arena,
    /// First arena word of each step's value.
    offsets: Vec<usize>,
    kernels: Vec<Kernel>,
    /// Per step: which kernel, its grid, and for dropout the step whose mask key it needs
    /// (None for inputs and parameters).
    dispatch: Vec<Option<(usize, [u32; 3], Option<u32>)>>,
}

fn words_of(t: &Tensor) -> Vec<u32> {
    match &t.data {
        Data::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        Data::F64(v) => v.iter().map(|&x| (x as f32).to_bits()).collect(),
        Data::I32(v) => v.iter().map(|&x| x as u32).collect(),
    }
}

fn tensor_of(words: Vec<u32>, dtype: crate::DType, shape: Vec<usize>) -> Tensor {
    let data = if dtype.is_float() { Data::F32(words.into_iter().map(f32::from_bits).collect()) } else { Data::I32(words.into_iter().map(|w| w as i32).collect()) };
    Tensor { dtype, shape, data }
}

impl GpuSession {
    /// Opens the GPU, lays out the arena, uploads `params` and compiles a kernel per step.
    pub fn new(plan: Plan, params: &[Tensor]) -> Result<GpuSession, RuntimeError> {
        let dev = GpuDevice::open().map_err(RuntimeError)?;
        // Values share arena words when their lifetimes do not overlap (memory::plan_arena).
        let layout = crate::memory::plan_arena(&plan);
        let offsets = layout.offsets;
        let total = layout.total_words;
        let arena = dev.arena(total).map_err(|e| RuntimeError(format!("{}: {e}", plan.model)))?;
        let width = dev.limits.workgroup_width(256);
        let mut kernels = Vec::new();
        let mut cache: HashMap<String, usize> = HashMap::new();
        let mut dispatch = Vec::with_capacity(plan.steps.len());
        for (i, s) in plan.steps.iter().enumerate() {
            if matches!(s.op, Op::Input { .. } | Op::Param { .. }) {
                dispatch.push(None);
                continue;
            }
            let operand = |v: usize| Operand { offset: offsets[v], shape: plan.steps[v].shape.clone(), dtype: plan.steps[v].dtype };
            let inputs: Vec<Operand> = s.inputs.iter().map(|&x| operand(x as usize)).collect();
            let src = generate(s, i as u32, &inputs, &operand(i), width, plan.mode == crate::plan::Mode::Train).map_err(|e| RuntimeError(format!("{e} (at {}, step {i})", s.loc)))?;
            let k = match cache.get(&src.body) {
                Some(&k) => k,
                None => {
                    let kernel = dev.kernel(&format!("step{i}"), &src.body).map_err(|e| RuntimeError(format!("{e} (at {}, step {i})", s.loc)))?;
                    kernels.push(kernel);
                    cache.insert(src.body.clone(), kernels.len() - 1);
                    kernels.len() - 1
                }
            };
            let groups = fold_grid(src.invocations.div_ceil(width as u64), &dev.limits).map_err(|e| RuntimeError(format!("{e} (at {}, step {i})", s.loc)))?;
            dispatch.push(Some((k, groups, src.dropout_node)));
        }
        let mut session = GpuSession { dev, plan, arena, offsets, kernels, dispatch };
        session.set_params(params);
        Ok(session)
    }

    pub fn device_name(&self) -> &str {
        &self.dev.info.name
    }

    /// Writes parameter values into their regions.
    pub fn set_params(&mut self, params: &[Tensor]) {
        for (i, s) in self.plan.steps.iter().enumerate() {
            if let Op::Param { index } = s.op {
                self.dev.write(&self.arena, self.offsets[i], &words_of(&params[index]));
            }
        }
    }

    /// Reads every parameter back (for checkpoints).
    pub fn params(&self) -> Vec<Tensor> {
        let mut out: Vec<Option<Tensor>> = vec![None; self.plan.params.len()];
        for (i, s) in self.plan.steps.iter().enumerate() {
            if let Op::Param { index } = s.op {
                out[index] = Some(self.value(i as u32));
            }
        }
        out.into_iter().enumerate().map(|(i, t)| t.unwrap_or_else(|| crate::init::initialize(&self.plan.params[i], 0, i))).collect()
    }

    /// The current value of step `v` (after the last run).
    pub fn value(&self, v: u32) -> Tensor {
        let s = &self.plan.steps[v as usize];
        let n = s.shape.iter().product();
        tensor_of(self.dev.read(&self.arena, self.offsets[v as usize], n), s.dtype, s.shape.clone())
    }

    /// One submission of every step, reading nothing back (see `Session::run_resident`).
    pub fn run_resident(&mut self, inputs: &[(&str, &Tensor)], seed: u64) -> Result<(), RuntimeError> {
        self.submit(inputs, seed)
    }

    /// One submission of every step; returns outputs, loss and gradients like the CPU session.
    /// `seed` is the run's dropout seed (the CPU session's, so both draw the same masks).
    pub fn run(&mut self, inputs: &[(&str, &Tensor)], seed: u64) -> Result<RunOutput, RuntimeError> {
        self.submit(inputs, seed)?;
        Ok(RunOutput {
            outputs: self.plan.outputs.iter().map(|(n, v)| (n.clone(), self.value(*v))).collect(),
            loss: self.plan.loss.map(|v| self.value(v)),
            grads: self.plan.grads.iter().map(|(p, v)| (self.plan.params[*p].name.clone(), self.value(*v))).collect(),
        })
    }

    fn submit(&mut self, inputs: &[(&str, &Tensor)], seed: u64) -> Result<(), RuntimeError> {
        for (name, v) in &self.plan.inputs {
            let want = &self.plan.steps[*v as usize];
            let t = inputs.iter().find(|(n, _)| n == name).map(|(_, t)| *t).ok_or_else(|| RuntimeError(format!("missing input `{name}`")))?;
            if t.shape != want.shape {
                return Err(RuntimeError(format!("input `{name}` has shape {:?}, but the plan was built for {:?}", t.shape, want.shape)));
            }
            self.dev.write(&self.arena, self.offsets[*v as usize], &words_of(t));
        }
        let params = |node: &Option<u32>| -> Params {
            let mut p = [0u32; 32];
            if let Some(node) = node {
                let key = super::kernels::dropout_key(seed, *node);
                p[0] = key as u32;
                p[1] = (key >> 32) as u32;
            }
            p
        };
        let calls: Vec<(&Kernel, Params, [u32; 3])> = self.dispatch.iter().flatten().map(|(k, g, node)| (&self.kernels[*k], params(node), *g)).collect();
        self.dev.run(&self.arena, &calls).map_err(RuntimeError)
    }
}
