//! Text generation with a KV cache: a prompt through a prefill plan, then one token per run
//! through a decode plan, both built from one `.mgn` model whose attention layers keep their
//! keys and values in `state` fields (see models/smollm2_135m_decode.mgn).
//!
//! The plans follow one convention: an input `input_ids: i32[1, T]`, an input `pos: i32[]`
//! (the position of the first token), an output `logits: f32[1, T, vocab]`, and the same
//! state tensors (`…k_cache`, `…v_cache`: [1, kv_heads, cache, head_dim]). The decode plan
//! takes T = 1 (built so, or dynamic in T from 1); the prefill plan any T (its chunk), or any
//! T up to its bound when it is dynamic (`mgnc build --dynamic T=128`). A prompt runs through
//! the prefill plan in chunks; a static plan's last chunk, when shorter than T, is padded at
//! its end, which is safe: the padding writes cache rows past the prompt that the next tokens
//! overwrite before any query can see them. A dynamic plan runs the chunk as it is.
//! Whichever session ran last holds the newest cache; it is copied to the other when the
//! roles change (only the state tensors move), and not at all while both hold the same one
//! (after `new` or `reset`, both caches are fresh).

use crate::sample::Sampler;
use crate::session::{RuntimeError, Session};
use mgn_ir::{DType, Data, Tensor};

/// A prefill session (optional) and a decode session over one KV cache.
pub struct Generator {
    prefill: Option<Session>,
    decode: Session,
    /// Tokens in the cache (the position of the next one).
    pos: usize,
    /// Positions the cache holds.
    capacity: usize,
    vocab: usize,
    /// Which session holds the newest cache.
    newest: Holder,
}

/// Where the newest KV cache lives.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Holder {
    /// Both sessions hold the same cache (fresh, after `new` or `reset`).
    Both,
    Prefill,
    Decode,
}

fn failed(s: String) -> RuntimeError {
    RuntimeError::Failed(s)
}

/// What a plan that follows the convention takes: the fewest and most tokens a run may have
/// (both T for a static plan), its vocabulary and cache size.
struct Shape {
    t_min: usize,
    t_max: usize,
    vocab: usize,
    cache: usize,
}

/// The `Shape` of a plan, or what is wrong with it.
fn shape_of(s: &Session) -> Result<Shape, RuntimeError> {
    let plan = &s.plan;
    let step = |v: u32| &plan.steps[v as usize];
    let input = |name: &str| plan.inputs.iter().find(|(n, _)| n == name).map(|(_, v)| step(*v));
    let model = &plan.model;
    let ids = input("input_ids").filter(|t| t.dtype == DType::I32 && t.shape.len() == 2);
    let ids = ids.filter(|t| t.shape[0] == 1).ok_or_else(|| {
        failed(format!("`{model}` needs an input `input_ids: i32[1, T]` to generate"))
    })?;
    input("pos").filter(|t| t.dtype == DType::I32 && t.shape.is_empty()).ok_or_else(|| {
        failed(format!("`{model}` needs an input `pos: i32[]` (the position in its cache)"))
    })?;
    let logits = (plan.outputs.iter().find(|(n, _)| n == "logits").map(|(_, v)| step(*v)))
        .filter(|t| t.shape.len() == 3 && t.shape[..2] == ids.shape[..]);
    let logits = logits.ok_or_else(|| {
        failed(format!("`{model}` needs an output `logits: f32[1, T, vocab]` to generate"))
    })?;
    let cache = (plan.state_writes.first().map(|&(p, _)| &plan.params[p].shape))
        .filter(|s| s.len() == 4)
        .map(|s| s[2])
        .ok_or_else(|| {
            failed(format!("`{model}` keeps no KV cache (no `state` field [1, heads, n, d])"))
        })?;
    let t = ids.shape[1];
    let input_step = plan.inputs.iter().find(|(n, _)| n == "input_ids").map(|(_, v)| *v as usize);
    // A dynamic plan whose T (axis 1 of input_ids) is a dynamic size runs any T in its range.
    let range = (plan.dynamic.as_ref().zip(input_step)).and_then(|(d, v)| {
        let (_, poly) = d.shape_of(v).into_iter().find(|(axis, _)| *axis == 1)?;
        let var = &d.sizes[poly.as_var()?];
        Some((var.min, var.max))
    });
    let (t_min, t_max) = range.unwrap_or((t, t));
    Ok(Shape { t_min, t_max, vocab: logits.shape[2], cache })
}

impl Generator {
    /// Checks that the plans follow the convention and agree on vocabulary and cache.
    pub fn new(prefill: Option<Session>, decode: Session) -> Result<Generator, RuntimeError> {
        let Shape { t_min, t_max, vocab, cache: capacity } = shape_of(&decode)?;
        if t_min != 1 {
            let t = if t_min == t_max { t_min.to_string() } else { format!("{t_min}..{t_max}") };
            return Err(failed(format!("the decode plan must take one token (T = 1), not {t}")));
        }
        if let Some(p) = &prefill {
            let Shape { vocab: pv, cache: pc, .. } = shape_of(p)?;
            if (pv, pc) != (vocab, capacity) || p.state_names() != decode.state_names() {
                return Err(failed(format!(
                    "the prefill plan (vocab {pv}, cache {pc}) and the decode plan (vocab \
                     {vocab}, cache {capacity}) are not one model's"
                )));
            }
        }
        Ok(Generator { prefill, decode, pos: 0, capacity, vocab, newest: Holder::Both })
    }

    /// Tokens in the cache so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Empties the cache: the next token is at position 0.
    pub fn reset(&mut self) -> Result<(), RuntimeError> {
        self.decode.reset_state()?;
        if let Some(p) = &mut self.prefill {
            p.reset_state()?;
        }
        self.pos = 0;
        self.newest = Holder::Both;
        Ok(())
    }

    fn room_for(&self, n: usize) -> Result<(), RuntimeError> {
        if self.pos + n > self.capacity {
            return Err(failed(format!(
                "the cache holds {} positions: {} are used, {n} more do not fit (build the \
                 model with a larger cache, or `reset`)",
                self.capacity, self.pos
            )));
        }
        Ok(())
    }

    /// Runs `tokens` at the current position (the prompt, or more of it); returns the logits
    /// after the last one. Full chunks go through the prefill plan, the rest one by one.
    pub fn prefill(&mut self, tokens: &[i32]) -> Result<Vec<f32>, RuntimeError> {
        if tokens.is_empty() {
            return Err(failed("prefill needs at least one token".into()));
        }
        self.room_for(tokens.len())?;
        // The prefill plan's chunk; without one, a decode plan dynamic in T is its own.
        let (least, chunk) = match &self.prefill {
            Some(p) => shape_of(p).map(|s| (s.t_min, s.t_max))?,
            None => shape_of(&self.decode).map(|s| (1, s.t_max))?,
        };
        let mut rest = tokens;
        let mut last = Vec::new();
        // A chunk may be padded (to the plan's T, or a dynamic plan's least T), but never past
        // the cache's end (its writes would be clamped).
        while rest.len() > 1 && chunk > 1 {
            let n = rest.len().min(chunk);
            let len = n.max(least);
            if self.pos + len > self.capacity {
                break;
            }
            last = self.run_prefill(&rest[..n], len)?;
            rest = &rest[n..];
        }
        for &t in rest {
            last = self.step(t)?;
        }
        Ok(last)
    }

    /// `tokens` in one run of the prefill plan (or of a dynamic decode plan, without one),
    /// padded to `len` tokens.
    fn run_prefill(&mut self, tokens: &[i32], len: usize) -> Result<Vec<f32>, RuntimeError> {
        let p = match &mut self.prefill {
            Some(p) => {
                if self.newest == Holder::Decode {
                    self.decode.copy_state_to(p)?;
                }
                self.newest = Holder::Prefill;
                p
            }
            None => {
                self.newest = Holder::Decode;
                &mut self.decode
            }
        };
        let mut ids = tokens.to_vec();
        ids.resize(len, 0);
        let logits = run(p, ids, self.pos, self.vocab)?;
        self.pos += tokens.len();
        let row = tokens.len() - 1;
        Ok(logits[row * self.vocab..(row + 1) * self.vocab].to_vec())
    }

    /// Runs one token at the current position; returns its logits.
    pub fn step(&mut self, token: i32) -> Result<Vec<f32>, RuntimeError> {
        self.room_for(1)?;
        if self.newest == Holder::Prefill {
            let p = self.prefill.as_mut().expect("set only with a prefill plan");
            p.copy_state_to(&mut self.decode)?;
        }
        self.newest = Holder::Decode;
        let logits = run(&mut self.decode, vec![token], self.pos, self.vocab)?;
        self.pos += 1;
        Ok(logits)
    }

    /// The prompt, then `n` tokens chosen by `sampler`, each fed back; returns the new tokens.
    pub fn generate(
        &mut self,
        prompt: &[i32],
        n: usize,
        sampler: &mut Sampler,
    ) -> Result<Vec<i32>, RuntimeError> {
        self.room_for(prompt.len() + n.saturating_sub(1))?;
        let mut logits = self.prefill(prompt)?;
        let mut out = Vec::with_capacity(n);
        for k in 0..n {
            let next = sampler.next(&logits).map_err(failed)? as i32;
            out.push(next);
            if k + 1 < n {
                logits = self.step(next)?;
            }
        }
        Ok(out)
    }
}

/// One run of `s` on `ids` at `pos`; the logits, row after row.
fn run(s: &mut Session, ids: Vec<i32>, pos: usize, vocab: usize) -> Result<Vec<f32>, RuntimeError> {
    let t = ids.len();
    if let Some(bad) = ids.iter().find(|&&i| i < 0 || i as usize >= vocab) {
        return Err(failed(format!("token id {bad} is outside the vocabulary (0 ..< {vocab})")));
    }
    let ids = Tensor::i32(vec![1, t], ids);
    let pos = Tensor::i32(vec![], vec![pos as i32]);
    let out = s.run(&[("input_ids", &ids), ("pos", &pos)])?;
    let logits = out.outputs.into_iter().find(|(n, _)| n == "logits").map(|(_, l)| l);
    let logits = logits.ok_or_else(|| failed("the plan returned no logits".into()))?;
    // f32 logits (every backend's) move as they are: a prefill chunk's are vocab × T values.
    Ok(match logits.data {
        Data::F32(v) => v,
        _ => logits.to_f64_vec().into_iter().map(|v| v as f32).collect(),
    })
}
