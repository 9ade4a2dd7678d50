//! Choosing the next token from a row of logits: greedy, or sampled with a temperature and
//! top-k / top-p (nucleus) filtering, as Hugging Face `generate` does, from a seeded ChaCha8
//! stream, so a run is reproducible on every platform.
//!
//! Order of the filters, as in `generate`: temperature scales the logits, top-k keeps the `k`
//! largest, top-p keeps the smallest set of the most likely tokens whose probability reaches
//! `p` (at least one), then one token is drawn from the renormalised rest. Ties keep the lower
//! token id first, so greedy decoding is `argmax` with the first maximum.

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 is greedy decoding (the other fields are then ignored).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the most likely tokens up to this total probability (1.0: all).
    pub top_p: f32,
    pub seed: u64,
}

impl SamplerConfig {
    pub const GREEDY: SamplerConfig =
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };
}

/// A token chooser with its own random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// Refuses a negative or non-finite temperature and a `top_p` outside (0, 1].
    pub fn new(config: SamplerConfig) -> Result<Sampler, String> {
        if !config.temperature.is_finite() || config.temperature < 0.0 {
            return Err(format!("temperature must be 0 or more, found {}", config.temperature));
        }
        if !(config.top_p > 0.0 && config.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], found {}", config.top_p));
        }
        Ok(Sampler { config, rng: ChaCha8Rng::seed_from_u64(config.seed) })
    }

    /// The next token for one row of logits. Refuses an empty row and NaN logits (a model that
    /// produced them has diverged; choosing among them would hide it).
    pub fn next(&mut self, logits: &[f32]) -> Result<usize, String> {
        if logits.is_empty() {
            return Err("no logits to choose from".into());
        }
        if let Some(i) = logits.iter().position(|v| v.is_nan()) {
            return Err(format!("logit {i} is NaN"));
        }
        if logits.iter().all(|&v| v == f32::NEG_INFINITY) {
            return Err("every logit is -inf: no token can be chosen".into());
        }
        if self.config.temperature == 0.0 {
            return Ok(greedy(logits));
        }
        let kept = self.candidates(logits);
        // A uniform draw in [0, 1) with 24 random bits, scaled by the kept mass.
        let total: f64 = kept.iter().map(|&(_, p)| p).sum();
        let mut u = (self.rng.next_u32() >> 8) as f64 / (1u32 << 24) as f64 * total;
        for &(token, p) in &kept {
            if u < p {
                return Ok(token);
            }
            u -= p;
        }
        Ok(kept.last().expect("at least one token is kept").0)
    }

    /// The tokens the filters keep, most likely first, with their unnormalised probabilities.
    fn candidates(&self, logits: &[f32]) -> Vec<(usize, f64)> {
        let t = self.config.temperature as f64;
        let mut order: Vec<usize> = (0..logits.len()).collect();
        // Most likely first; ties by token id (a stable sort of ids in order).
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if self.config.top_k > 0 {
            order.truncate(self.config.top_k);
        }
        let max = logits[order[0]] as f64;
        // Relative to the largest logit, so exp never overflows; +inf logits share all the mass.
        let weight = |v: f64| {
            if max == f64::INFINITY {
                (v == max) as u8 as f64
            } else {
                ((v - max) / t).exp()
            }
        };
        let mut kept: Vec<(usize, f64)> =
            order.iter().map(|&i| (i, weight(logits[i] as f64))).collect();
        if self.config.top_p < 1.0 {
            let total: f64 = kept.iter().map(|&(_, p)| p).sum();
            let (mut mass, mut n) = (0.0, 0);
            for &(_, p) in &kept {
                n += 1;
                mass += p / total;
                if mass >= self.config.top_p as f64 {
                    break;
                }
            }
            kept.truncate(n.max(1));
        }
        kept
    }
}

/// The index of the largest logit (the first of equal ones).
pub fn greedy(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
        Sampler::new(SamplerConfig { temperature, top_k, top_p, seed }).expect("valid")
    }

    #[test]
    fn greedy_takes_the_first_largest_logit() {
        assert_eq!(greedy(&[0.5, 2.0, -1.0, 2.0]), 1);
        assert_eq!(greedy(&[f32::NEG_INFINITY, -3.0]), 1);
        let mut s = Sampler::new(SamplerConfig::GREEDY).expect("valid");
        assert_eq!(s.next(&[0.1, 0.3, 0.2]), Ok(1));
    }

    #[test]
    fn top_k_of_one_and_a_tiny_top_p_are_greedy() {
        let logits = [0.2, 1.5, 1.4, -2.0, 1.5];
        for seed in 0..20 {
            assert_eq!(sampler(1.0, 1, 1.0, seed).next(&logits), Ok(1));
            assert_eq!(sampler(1.0, 0, 1e-6, seed).next(&logits), Ok(1));
        }
    }

    #[test]
    fn draws_follow_the_softmax_and_the_seed_repeats_them() {
        // Softmax of these logits at temperature 1: 0.0900, 0.2447, 0.6652.
        let logits = [0.0, 1.0, 2.0];
        let mut s = sampler(1.0, 0, 1.0, 7);
        let draws: Vec<usize> = (0..20_000).map(|_| s.next(&logits).expect("a token")).collect();
        for (token, want) in [(0, 0.0900), (1, 0.2447), (2, 0.6652)] {
            let f = draws.iter().filter(|&&d| d == token).count() as f64 / draws.len() as f64;
            // Deterministic (seeded); the bound is about four standard deviations.
            assert!((f - want).abs() < 0.015, "token {token}: {f} vs {want}");
        }
        let mut again = sampler(1.0, 0, 1.0, 7);
        let first: Vec<usize> = (0..100).map(|_| again.next(&logits).expect("a token")).collect();
        assert_eq!(first, draws[..100]);
        let mut other = sampler(1.0, 0, 1.0, 8);
        let second: Vec<usize> = (0..100).map(|_| other.next(&logits).expect("a token")).collect();
        assert_ne!(first, second, "another seed, another sequence");
    }

    #[test]
    fn filters_keep_only_the_likeliest_tokens() {
        // top-k 2 of four: only tokens 2 and 3 can come out.
        let logits = [3.0, -1.0, 4.0, 3.5];
        let mut s = sampler(1.0, 2, 1.0, 1);
        assert!((0..500).all(|_| matches!(s.next(&logits), Ok(2) | Ok(3))));
        // top-p 0.5: token 2 alone holds 0.51 of the mass at this temperature.
        let mut s = sampler(1.0, 0, 0.5, 1);
        assert!((0..500).all(|_| s.next(&logits) == Ok(2)));
        // A low temperature sharpens towards the argmax, a high one flattens.
        let mut cold = sampler(0.05, 0, 1.0, 3);
        assert!((0..500).all(|_| cold.next(&logits) == Ok(2)));
        let mut hot = sampler(100.0, 0, 1.0, 3);
        let seen: std::collections::BTreeSet<usize> =
            (0..2000).map(|_| hot.next(&logits).expect("a token")).collect();
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    #[test]
    fn bad_settings_and_logits_are_refused() {
        let bad = |temperature, top_p| {
            Sampler::new(SamplerConfig { temperature, top_k: 0, top_p, seed: 0 }).unwrap_err()
        };
        assert!(bad(-1.0, 1.0).contains("temperature"));
        assert!(bad(f32::NAN, 1.0).contains("temperature"));
        assert!(bad(1.0, 0.0).contains("top_p"));
        assert!(bad(1.0, 1.5).contains("top_p"));
        let mut s = sampler(1.0, 0, 1.0, 0);
        assert!(s.next(&[]).unwrap_err().contains("no logits"));
        assert!(s.next(&[0.0, f32::NAN]).unwrap_err().contains("logit 1"));
        // Infinite logits are fine: -inf is never chosen, +inf always.
        assert_eq!(s.next(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]), Ok(1));
        assert!((0..50).all(|_| s.next(&[0.0, f32::INFINITY, 5.0]) == Ok(1)));
        assert!(s.next(&[f32::NEG_INFINITY; 3]).unwrap_err().contains("-inf"));
    }
}
