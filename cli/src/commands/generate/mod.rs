//! `mgnc generate MODEL.mgn --weights W --tokenizer T --prompt TEXT [--chat]`: text in, text
//! out. The model's decode plan (T = 1) and a prefill plan (T = a chunk of the prompt) run in
//! the runtime's `Generator` over one KV cache (`plans`); the prompt is tokenized, through the
//! chat template with `--chat` (`tokenizer`, `template`); the new tokens are chosen as the
//! runtime's `Sampler` chooses them and printed as they come (`generation`, `stream`).

mod generation;
mod plans;
mod stream;
mod template;
mod tokenizer;

use super::plan::{resolve_backend, Backend, PrecisionArg};
use super::report::{self, MessageFormat};
use mgn_compiler::elab::Setting;
use mgn_runtime::{Sampler, SamplerConfig};
use plans::Failure;
use std::path::PathBuf;
use tokenizer::TextTokenizer;

/// The most tokens generated when `--tokens` is not given (fewer when the cache is smaller).
const DEFAULT_TOKENS: usize = 256;
/// The longest prefill chunk when `--chunk` is not given.
const DEFAULT_CHUNK: usize = 128;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A .mgn file with a decode model: inputs `input_ids: i32[1, T]` and `pos: i32[]`, an
    /// argument `cache`, an output `logits` (see models/smollm2_135m_decode.mgn).
    pub file: PathBuf,
    /// The weights (safetensors, names as in the model; every one, nothing else). Without it,
    /// the model's initializers run (random weights, for trying a model out).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// A Hugging Face tokenizer.json, or the directory holding it; its tokenizer_config.json
    /// (or `x.tokenizer_config.json` beside `x.tokenizer.json`) gives the chat template and EOS.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated (no tokenizer needed).
    #[arg(long, value_name = "IDS")]
    pub prompt_ids: Option<String>,
    /// Put the prompt through the tokenizer's chat template, as the user's message.
    #[arg(long)]
    pub chat: bool,
    /// A system message before the user's (implies --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// The most tokens to generate (default: 256, or what the cache leaves room for).
    #[arg(long)]
    pub tokens: Option<usize>,
    /// 0 chooses the likeliest token (greedy); more samples, flatter as it grows.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample among the k likeliest tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample among the likeliest tokens up to this total probability.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed for sampling (and the initializers, without --weights).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: Backend,
    /// Which model to build when the file has several with an input `pos`.
    #[arg(long)]
    pub model: Option<String>,
    /// Override a model argument, e.g. `--set cache=1024` (repeatable; `T` is generate's).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
    /// Positions the KV cache holds: the model's argument `cache` (as `--set cache=N`).
    #[arg(long)]
    pub cache: Option<usize>,
    /// Prompt tokens a prefill run takes (default: the prompt, at most 128).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// One plan, dynamic in T, for the prompt and the tokens (`mgnc build --dynamic T=…`)
    /// instead of two: one copy of the weights in memory, and no padded prompt chunk.
    #[arg(long)]
    pub one_plan: bool,
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Pack the model's matrix and embedding weights in this type as they load (the rule of
    /// `mgnc build --quantize`): q8_0, q4_0, q4_1, q4_k, q6_k
    #[arg(long, value_name = "TYPE", value_parser = crate::commands::plan::parse_quantize)]
    pub quantize: Option<mgn_ir::DType>,
    /// Print the generated token ids (comma-separated) instead of text.
    #[arg(long)]
    pub ids: bool,
    /// Print the prompt first: its text (after the chat template), or its ids with --ids.
    #[arg(long)]
    pub echo: bool,
}

pub fn run(a: GenerateArgs) -> u8 {
    match run_inner(a) {
        Ok(()) => 0,
        Err(Failure::Printed(code)) => code,
        Err(Failure::Message(m)) => {
            report::error(&m, MessageFormat::Human);
            super::EXIT_ERRORS
        }
    }
}

/// The prompt's ids and, when it was text, the text the tokenizer read.
fn prompt(a: &GenerateArgs, tok: Option<&TextTokenizer>) -> Result<(Vec<i32>, String), String> {
    let chat = a.chat || a.system.is_some();
    if let Some(list) = &a.prompt_ids {
        if chat {
            return Err("--chat applies to a --prompt text, not to --prompt-ids".into());
        }
        let ids = (list.split(',').map(|t| t.trim().parse::<i32>()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--prompt-ids `{list}`: {e} (expected ids such as 1,2,3)"))?;
        let text = match tok {
            Some(t) => (t.inner.decode(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>(), false))
                .unwrap_or_default(),
            None => String::new(),
        };
        return Ok((ids, text));
    }
    let Some(text) = &a.prompt else {
        return Err("give a prompt: --prompt TEXT (with --tokenizer) or --prompt-ids 1,2,3".into());
    };
    let tok = tok.ok_or("--prompt needs --tokenizer (or give --prompt-ids)")?;
    let (text, special) = match chat {
        true => (chat_text(a, tok, text)?, false),
        false => (text.clone(), true),
    };
    let ids = tok.encode(&text, special)?;
    Ok((ids.into_iter().map(|i| i as i32).collect(), text))
}

/// The prompt through the chat template, as `apply_chat_template(…, add_generation_prompt=True)`.
fn chat_text(a: &GenerateArgs, tok: &TextTokenizer, text: &str) -> Result<String, String> {
    let template = tok.chat_template.as_deref().ok_or_else(|| {
        format!(
            "--chat needs a chat template, and none is beside `{}` (no `chat_template` in its \
             tokenizer_config.json, no chat_template.jinja)",
            tok.path.display()
        )
    })?;
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(template::Message { role: "system".into(), content: s.clone() });
    }
    messages.push(template::Message { role: "user".into(), content: text.to_string() });
    template::render(template, &messages, &tok.specials, true)
        .map_err(|e| format!("the chat template of `{}`: {e}", tok.path.display()))
}

/// The settings with `--cache`; refuses a `T` (generate builds the model at T = 1 and the chunk).
fn settings(a: &GenerateArgs) -> Result<Vec<Setting>, String> {
    let mut settings = a.settings.clone();
    if settings.iter().any(|s| s.name == "T") {
        return Err("`T` is generate's to set: 1 for decoding, `--chunk` for the prompt".into());
    }
    if let Some(n) = a.cache {
        if settings.iter().any(|s| s.name == "cache") {
            return Err("give the cache once: `--cache N` or `--set cache=N`".into());
        }
        settings.push(Setting::new("cache", n.to_string()));
    }
    Ok(settings)
}

/// How many tokens to generate: `--tokens`, checked against the cache, or what fits.
fn token_count(
    a: &GenerateArgs,
    prompt: usize,
    cache: usize,
    model: &str,
) -> Result<usize, String> {
    let fits = (cache + 1).saturating_sub(prompt);
    let n = a.tokens.unwrap_or(fits.min(DEFAULT_TOKENS));
    // The last token is not run, so n tokens after the prompt use prompt + n - 1 positions.
    let need = prompt + n.saturating_sub(1);
    if need > cache || prompt > cache {
        let need = need.max(prompt);
        return Err(format!(
            "the prompt ({prompt} tokens) and {n} new tokens need {need} positions of the KV \
             cache, and `{model}` holds {cache}: pass `--cache {need}` (or `--set cache={need}`), \
             or fewer `--tokens`"
        ));
    }
    Ok(n)
}

fn run_inner(a: GenerateArgs) -> Result<(), Failure> {
    let engine = resolve_backend(a.backend, MessageFormat::Human).map_err(Failure::Printed)?;
    let tok = a.tokenizer.as_deref().map(TextTokenizer::load).transpose()?;
    let (ids, text) = prompt(&a, tok.as_ref())?;
    if ids.is_empty() {
        return Err(Failure::Message("the prompt is empty: it tokenizes to no tokens".into()));
    }
    let sampler =
        SamplerConfig { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    let mut sampler = Sampler::new(sampler)?;
    let src = plans::Source {
        file: &a.file,
        model: plans::choose_model(&a.file, a.model.clone())?,
        settings: settings(&a)?,
        weights: a.weights.as_ref(),
        precision: a.precision,
        quantize: a.quantize,
        seed: a.seed,
    };
    let decode = plans::decode_plan(&src)?;
    let model = decode.model.clone();
    let place = format!("`{model}` in `{}`", a.file.display());
    if !decode.inputs.iter().any(|(n, _)| n == "pos") {
        return Err(Failure::Message(format!(
            "{place} has no input `pos: i32[]`: generating needs a decode model with a KV \
             cache (see models/smollm2_135m_decode.mgn)"
        )));
    }
    let cache = plans::cache_of(&decode).ok_or_else(|| {
        format!("{place} keeps no KV cache (no `state` field [1, heads, cache, head_dim])")
    })?;
    let n = token_count(&a, ids.len(), cache, &model)?;
    let chunk = a.chunk.unwrap_or(DEFAULT_CHUNK).min(ids.len()).min(cache);
    let prefill = match chunk {
        // A dynamic size is fitted over several probe points: its bound must leave room for
        // them; a bound past the prompt costs nothing (chunks run at their own length).
        _ if a.one_plan && cache >= 4 => plans::Prefill::OnePlan(chunk.max(8).min(cache)),
        0 | 1 => plans::Prefill::None,
        _ if a.one_plan => plans::Prefill::None,
        t => plans::Prefill::Chunk(t),
    };
    let built = plans::build(&src, decode, prefill, engine)?;
    let mut g = built.generator;
    let text_tok = tok.as_ref().filter(|_| !a.ids).map(|t| &t.inner);
    if a.echo {
        let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let first = if text_tok.is_some() { text } else { list.join(",") + "\n" };
        print!("{first}");
    }
    let eos = tok.as_ref().map(|t| t.eos.clone()).unwrap_or_default();
    let out = generation::Output { text: text_tok, eos: &eos };
    let setup = built.on_gpu.then(|| generation::warm_up(&mut g, &ids)).transpose()?;
    let mut done = generation::generate(&mut g, &ids, n, &mut sampler, &out)?;
    done.setup = setup;
    generation::report(&model, &built.device, ids.len(), &done, n);
    Ok(())
}
