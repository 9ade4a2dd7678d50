//! Text generation with a KV cache: a prompt through a prefill plan, then one token per run
//! through a decode plan, both built from one `.mgn` model whose attention layers keep their
//! keys and values in `state` fields (see models/smollm2_135m_decode.mgn).
//!
//! The plans follow one convention: an input `input_ids: i32[1, T]`, an input `pos: i32[]`
//! (the position of the first token), an output `logits: f32[1, T, vocab]`, and the same
//! state tensors (`…k_cache`, `…v_cache`: [1, kv_heads, cache, head_dim]). The decode plan
//! has T = 1; the prefill plan any T (its chunk). A prompt runs through the prefill plan in
//! chunks; a last chunk shorter than T is padded at its end, which is safe: the padding writes
//! cache rows past the prompt that the next tokens overwrite before any query can see them.
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

/// `(T, vocab, cache)` of a plan that follows the convention, or what is wrong with it.
fn shape_of(s: &Session) -> Result<(usize, usize, usize), RuntimeError> {
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
    Ok((ids.shape[1], logits.shape[2], cache))
}

impl Generator {
    /// Checks that the plans follow the convention and agree on vocabulary and cache.
    pub fn new(prefill: Option<Session>, decode: Session) -> Result<Generator, RuntimeError> {
        let (t, vocab, capacity) = shape_of(&decode)?;
        if t != 1 {
            return Err(failed(format!("the decode plan must take one token (T = 1), not {t}")));
        }
        if let Some(p) = &prefill {
            let (_, pv, pc) = shape_of(p)?;
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
        let chunk = match &self.prefill {
            Some(p) => shape_of(p)?.0,
            None => 1,
        };
        let mut rest = tokens;
        let mut last = Vec::new();
        // A chunk may be padded, but never past the cache's end (its writes would be clamped).
        while rest.len() > 1 && chunk > 1 && self.pos + chunk <= self.capacity {
            let n = rest.len().min(chunk);
            last = self.run_prefill(&rest[..n], chunk)?;
            rest = &rest[n..];
        }
        for &t in rest {
            last = self.step(t)?;
        }
        Ok(last)
    }

    fn run_prefill(&mut self, tokens: &[i32], chunk: usize) -> Result<Vec<f32>, RuntimeError> {
        let p = self.prefill.as_mut().expect("only with a prefill plan");
        if self.newest == Holder::Decode {
            self.decode.copy_state_to(p)?;
        }
        self.newest = Holder::Prefill;
        let mut ids = tokens.to_vec();
        ids.resize(chunk, 0);
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
