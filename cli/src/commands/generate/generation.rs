//! The loop of `mgnc generate`: the prompt through the generator, then one token at a time,
//! each chosen by the sampler, written out as soon as it reads as text (or, with `--ids`, the
//! ids at the end), until an end-of-sequence token or the token limit; and what it took.

use super::stream::TextStream;
use mgn_runtime::{Generator, Sampler};
use std::io::Write;
use std::time::{Duration, Instant};
use tokenizers::Tokenizer;

/// How the output is written.
pub struct Output<'a> {
    /// Text through this tokenizer; None: the ids, comma-separated, on one line.
    pub text: Option<&'a Tokenizer>,
    /// Ids that end generation (included in the ids, not printed as text).
    pub eos: &'a [u32],
}

/// What a generation did.
pub struct Generated {
    pub ids: Vec<i32>,
    pub prefill: Duration,
    /// Each run of the decode plan (one token).
    pub steps: Vec<Duration>,
    pub stopped_at_eos: bool,
    /// The untimed warm-up, when there was one.
    pub setup: Option<Duration>,
}

fn write(s: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes()).and_then(|()| out.flush()).map_err(|e| format!("stdout: {e}"))
}

/// Runs `prompt`, then up to `n` tokens.
pub fn generate(
    g: &mut Generator,
    prompt: &[i32],
    n: usize,
    sampler: &mut Sampler,
    out: &Output,
) -> Result<Generated, String> {
    let mut stream = out.text.map(TextStream::new);
    let t0 = Instant::now();
    let mut logits = g.prefill(prompt).map_err(|e| e.to_string())?;
    let prefill = t0.elapsed();
    let (mut ids, mut steps, mut stopped_at_eos) = (Vec::with_capacity(n), vec![], false);
    for k in 0..n {
        let next = sampler.next(&logits)?;
        ids.push(next as i32);
        if out.eos.contains(&(next as u32)) {
            stopped_at_eos = true;
            break;
        }
        if let Some(s) = &mut stream {
            if let Some(text) = s.push(next as u32)? {
                write(&text)?;
            }
        }
        if k + 1 < n {
            let t = Instant::now();
            logits = g.step(next as i32).map_err(|e| e.to_string())?;
            steps.push(t.elapsed());
        }
    }
    match &mut stream {
        Some(s) => write(&(s.finish()? + "\n"))?,
        None => {
            let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
            write(&(list.join(",") + "\n"))?;
        }
    }
    Ok(Generated { ids, prefill, steps, stopped_at_eos, setup: None })
}

/// Runs the prompt once through both plans and empties the cache again, untimed: a GPU
/// session compiles its pipelines in its first run, which is setup, not generation. The whole
/// prompt goes through the prefill plan (as it will), then one token through the decode plan,
/// where the cache has room for it; else the last prompt token is that one.
pub fn warm_up(g: &mut Generator, prompt: &[i32]) -> Result<Duration, String> {
    let t = Instant::now();
    let (last, rest) = prompt.split_last().ok_or("no prompt to warm up with")?;
    let first = if prompt.len() < g.capacity() { prompt } else { rest };
    if !first.is_empty() {
        g.prefill(first).map_err(|e| e.to_string())?;
    }
    g.step(*last).map_err(|e| e.to_string())?;
    g.reset().map_err(|e| e.to_string())?;
    Ok(t.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The report on stderr: the setup's time (a GPU's first runs), the prompt's, the tokens'
/// median time and rate, the device.
pub fn report(model: &str, device: &str, prompt: usize, g: &Generated, limit: usize) {
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    if let Some(setup) = g.setup {
        eprintln!("{device}: first runs (pipelines compiled) in {:.1} ms", ms(setup));
    }
    eprintln!(
        "{model} on {device}: {prompt} prompt tokens in {:.1} ms ({:.0} tokens/s)",
        ms(g.prefill),
        rate(prompt, g.prefill)
    );
    let why = if g.stopped_at_eos {
        "stopped at the end-of-sequence token".to_string()
    } else {
        format!("stopped at the limit of {limit} tokens")
    };
    let mut steps = g.steps.clone();
    steps.sort();
    match steps.get(steps.len() / 2) {
        Some(&median) => eprintln!(
            "{} tokens generated, {:.2} ms per token (median of {}), {:.1} tokens/s; {why}",
            g.ids.len(),
            ms(median),
            steps.len(),
            rate(1, median)
        ),
        None => eprintln!("{} tokens generated; {why}", g.ids.len()),
    }
}
