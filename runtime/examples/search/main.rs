//! Semantic search with the runtime crate alone: sentences as text in, their nearest
//! neighbours by all-MiniLM-L6-v2's embeddings out — the Hugging Face tokenizer, one dynamic
//! plan for sentences of any length, the model's real weights.
//!
//! ```sh
//! scripts/fetch_minilm.sh                  # the tokenizer and weights, into ~/.cache/mgn/minilm
//! mgnc build models/minilm_l6.mgn --dynamic B=32,T=256 -o minilm.mgnplan
//! cargo run --release -p mgn-runtime --example search -- minilm.mgnplan ~/.cache/mgn/minilm \
//!     "How do I reset my password?" "I forgot my login credentials." "A man is eating food."
//! ```
//!
//! The first sentence is the query; the others (or the lines of `--corpus FILE`) are searched.
//! Options: `--top K` (default 5), `--cpu` (stay on the CPU; by default a hardware GPU when
//! there is one), `--gpu` (the GPU even when it is a software one, such as lavapipe),
//! `--repeat R` (embed the corpus R more times and report the median rate),
//! `--save FILE` (the corpus's embeddings as a safetensors tensor `embeddings` [N, 384]).

mod embed;

use embed::{cosine, Embedder};
use mgn_runtime::Plan;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

struct Options {
    plan: PathBuf,
    model_dir: PathBuf,
    query: String,
    corpus: Vec<String>,
    top: usize,
    cpu: bool,
    gpu: bool,
    repeat: usize,
    save: Option<PathBuf>,
}

const USAGE: &str = "usage: search PLAN.mgnplan MODEL_DIR [--top K] [--cpu|--gpu] [--repeat R] \
                     [--save FILE] [--corpus FILE] QUERY [SENTENCE...]";

fn parse(args: &[String]) -> Result<Options, String> {
    let mut positional = Vec::new();
    let (mut top, mut cpu, mut gpu, mut repeat) = (5, false, false, 0);
    let (mut file, mut save) = (None, None);
    let mut it = args.iter();
    let num = |v: Option<&String>, what: &str| -> Result<usize, String> {
        v.and_then(|s| s.parse().ok()).ok_or_else(|| format!("{what} needs a number"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--top" => top = num(it.next(), "--top")?,
            "--repeat" => repeat = num(it.next(), "--repeat")?,
            "--cpu" => cpu = true,
            "--gpu" => gpu = true,
            "--corpus" => file = Some(it.next().ok_or("--corpus needs a file")?.clone()),
            "--save" => save = Some(PathBuf::from(it.next().ok_or("--save needs a file")?)),
            s if s.starts_with("--") => return Err(format!("unknown option {s}\n{USAGE}")),
            s => positional.push(s.to_string()),
        }
    }
    if positional.len() < 3 {
        return Err(USAGE.into());
    }
    let mut rest = positional.split_off(2).into_iter();
    let query = rest.next().expect("checked above");
    let mut corpus: Vec<String> = rest.collect();
    if let Some(f) = file {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("cannot read {f}: {e}"))?;
        corpus.extend(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from));
    }
    if corpus.is_empty() {
        return Err("nothing to search: give sentences after the query, or --corpus FILE".into());
    }
    let (plan, model_dir) = (PathBuf::from(&positional[0]), PathBuf::from(&positional[1]));
    Ok(Options { plan, model_dir, query, corpus, top, cpu, gpu, repeat, save })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run(o: &Options) -> Result<(), String> {
    let plan = Plan::load(&o.plan).map_err(|e| e.to_string())?;
    let gpu = o.gpu || !o.cpu && mgn_runtime::gpu::hardware_gpu();
    let mut embedder = Embedder::new(plan, &o.model_dir, gpu)?;
    let corpus: Vec<&str> = o.corpus.iter().map(String::as_str).collect();
    let start = Instant::now();
    let vectors = embedder.embed(&corpus)?;
    let first = start.elapsed();
    let query = embedder.embed(&[o.query.as_str()])?.remove(0);
    println!(
        "{} sentences embedded on {} in {:.1} ms",
        corpus.len(),
        embedder.device,
        first.as_secs_f64() * 1e3
    );
    if o.repeat > 0 {
        let times: Vec<Duration> = (0..o.repeat)
            .map(|_| {
                let t = Instant::now();
                embedder.embed(&corpus).map(|_| t.elapsed())
            })
            .collect::<Result<_, _>>()?;
        let m = median(times);
        let rate = corpus.len() as f64 / m.as_secs_f64();
        println!(
            "median of {} more: {:.2} ms, {rate:.0} sentences/s",
            o.repeat,
            m.as_secs_f64() * 1e3
        );
    }
    if let Some(path) = &o.save {
        let width = vectors.first().map_or(0, Vec::len);
        let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
        let t = mgn_runtime::Tensor::f32(vec![vectors.len(), width], flat);
        mgn_runtime::checkpoint::save(path, &[("embeddings".to_string(), &t)], &[])
            .map_err(|e| e.to_string())?;
    }
    let mut scored: Vec<(f64, &str)> =
        vectors.iter().zip(&corpus).map(|(v, s)| (cosine(&query, v), *s)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("nearest to {:?}:", o.query);
    for (score, sentence) in scored.iter().take(o.top) {
        println!("  {score:.4}  {sentence}");
    }
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
