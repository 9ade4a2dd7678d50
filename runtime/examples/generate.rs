//! Text generation with the runtime crate alone: a decode plan (T = 1) and optionally a prefill
//! plan (T = a prompt chunk) of one model with a KV cache, weights from a safetensors file (or
//! seeded random ones), a prompt of token ids, and N new token ids out — greedy by default, or
//! sampled with a seed. It prints the ids and how long the prompt and each token took.
//!
//! ```sh
//! mgnc build models/smollm2_135m_decode.mgn -o decode.mgnplan              # T = 1
//! mgnc build models/smollm2_135m_decode.mgn --set T=128 -o prefill.mgnplan
//! cargo run --release -p mgn-runtime --example generate -- decode.mgnplan \
//!     --prefill prefill.mgnplan --weights model.safetensors --prompt 1,504,3 --tokens 16
//! ```
//!
//! Options: `--prefill PLAN`, `--weights FILE` (strict: every weight, nothing else),
//! `--prompt IDS` (comma-separated; default `1`), `--tokens N` (default 16), `--seed S`,
//! `--temperature T`, `--top-k K`, `--top-p P`, `--cpu` (stay on the CPU), `--gpu` (the GPU even
//! when it is a software one, such as lavapipe), `--repeat R`
//! (generate R times from an empty cache and report the median timings).

use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::{Generator, Plan, Sampler, SamplerConfig, Session};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

struct Options {
    decode: String,
    prefill: Option<String>,
    weights: Option<String>,
    prompt: Vec<i32>,
    tokens: usize,
    sampler: SamplerConfig,
    cpu: bool,
    gpu: bool,
    repeat: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        decode: String::new(),
        prefill: None,
        weights: None,
        prompt: vec![1],
        tokens: 16,
        sampler: SamplerConfig::GREEDY,
        cpu: false,
        gpu: false,
        repeat: 1,
    };
    let mut it = args.iter();
    let num = |v: Option<&String>, what: &str| -> Result<f64, String> {
        v.and_then(|s| s.parse().ok()).ok_or_else(|| format!("{what} needs a number"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefill" => o.prefill = it.next().cloned(),
            "--weights" => o.weights = it.next().cloned(),
            "--prompt" => {
                let ids = it.next().ok_or("--prompt needs token ids")?;
                o.prompt = (ids.split(',').map(|t| t.trim().parse::<i32>()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--prompt {ids}: {e}"))?;
            }
            "--tokens" => o.tokens = num(it.next(), "--tokens")? as usize,
            "--seed" => o.sampler.seed = num(it.next(), "--seed")? as u64,
            "--temperature" => o.sampler.temperature = num(it.next(), "--temperature")? as f32,
            "--top-k" => o.sampler.top_k = num(it.next(), "--top-k")? as usize,
            "--top-p" => o.sampler.top_p = num(it.next(), "--top-p")? as f32,
            "--repeat" => o.repeat = (num(it.next(), "--repeat")? as usize).max(1),
            "--cpu" => o.cpu = true,
            "--gpu" => o.gpu = true,
            s if s.starts_with("--") => return Err(format!("unknown option {s}")),
            s if o.decode.is_empty() => o.decode = s.to_string(),
            s => return Err(format!("unexpected argument {s}")),
        }
    }
    if o.decode.is_empty() {
        return Err("usage: generate DECODE.mgnplan [--prefill PLAN] [--weights FILE] …".into());
    }
    Ok(o)
}

fn session(path: &str, o: &Options) -> Result<(Session, String), String> {
    let plan = Plan::load(Path::new(path)).map_err(|e| e.to_string())?;
    let mut s = Session::try_new(plan, o.sampler.seed).map_err(|e| e.to_string())?;
    if let Some(w) = &o.weights {
        s.load_checkpoint(Path::new(w), MatchMode::Strict).map_err(|e| e.to_string())?;
    }
    let on = match o.gpu || !o.cpu && mgn_runtime::gpu::hardware_gpu() {
        true => s.use_gpu().map_err(|e| e.to_string())?,
        false => "the CPU".to_string(),
    };
    Ok((s, on))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run(o: &Options) -> Result<(), String> {
    let (decode, on) = session(&o.decode, o)?;
    let prefill = o.prefill.as_deref().map(|p| session(p, o)).transpose()?.map(|(s, _)| s);
    let model = decode.plan.model.clone();
    let mut g = Generator::new(prefill, decode).map_err(|e| e.to_string())?;
    let (mut prompt_times, mut token_times, mut out) = (vec![], vec![], vec![]);
    for _ in 0..o.repeat {
        g.reset().map_err(|e| e.to_string())?;
        let mut sampler = Sampler::new(o.sampler)?;
        let t0 = Instant::now();
        let mut logits = g.prefill(&o.prompt).map_err(|e| e.to_string())?;
        prompt_times.push(t0.elapsed());
        out.clear();
        let t1 = Instant::now();
        for k in 0..o.tokens {
            let next = sampler.next(&logits)? as i32;
            out.push(next);
            if k + 1 < o.tokens {
                logits = g.step(next).map_err(|e| e.to_string())?;
            }
        }
        if o.tokens > 1 {
            token_times.push(t1.elapsed() / (o.tokens as u32 - 1));
        }
    }
    let ids: Vec<String> = out.iter().map(|t| t.to_string()).collect();
    println!("{model} on {on}: {} prompt tokens, {} new", o.prompt.len(), out.len());
    println!("tokens: {}", ids.join(","));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    print!("prompt: {:.2} ms", ms(median(prompt_times)));
    if !token_times.is_empty() {
        print!(", per token: {:.3} ms", ms(median(token_times)));
    }
    println!(" (median of {})", o.repeat);
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args).and_then(|o| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
