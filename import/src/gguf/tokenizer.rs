//! The tokenizer of a GGUF file (`tokenizer.ggml.*`) as Hugging Face's own files: a
//! `tokenizer.json` the `tokenizers` library loads, and a `tokenizer_config.json` with the chat
//! template and the BOS and EOS tokens, so a tool reads them as it reads a Hugging Face
//! download.
//!
//! Two GGUF tokenizer models are written: `gpt2` (byte-level BPE: vocab and merges; the
//! pre-tokenizer chosen by `tokenizer.ggml.pre`) and `llama` (SentencePiece BPE: pieces with
//! scores, whose merges are recovered from the scores, with byte fallback).

use super::read::{Gguf, Value};
use serde_json::{json, Map, Value as Json};

/// The files, and one line about them.
pub struct Files {
    pub extras: Vec<(String, Vec<u8>)>,
    pub summary: String,
}

/// ggml token types (`tokenizer.ggml.token_type`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// GPT-2's split, which `ByteLevel(use_regex = true)` applies itself.
const GPT2: &str = "gpt2";
/// Llama 3's split (HF's `Split` pre-tokenizer before a regex-free ByteLevel).
const LLAMA3_REGEX: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Qwen2's: Llama 3's with single digits.
const QWEN2_REGEX: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

struct Vocab {
    tokens: Vec<String>,
    types: Vec<i64>,
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Vec<&'a str>, String> {
    let array = g.get(key).and_then(Value::as_array).ok_or(format!("no `{key}` array"))?;
    array.iter().map(|v| v.as_str().ok_or(format!("`{key}` holds a non-string"))).collect()
}

fn token_id(g: &Gguf, key: &str, n: usize) -> Option<usize> {
    g.get(key).and_then(Value::as_u64).map(|v| v as usize).filter(|&v| v < n)
}

pub fn files(g: &Gguf) -> Result<Files, String> {
    let model = g.get("tokenizer.ggml.model").and_then(Value::as_str);
    let model = model.ok_or("the file has no `tokenizer.ggml.model`")?;
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(1.0) as i64).collect(),
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(
            "`tokenizer.ggml.token_type` and `tokenizer.ggml.tokens` differ in length".into()
        );
    }
    let arch = g.get("general.architecture").and_then(Value::as_str).unwrap_or("");
    let gemma = arch.starts_with("gemma");
    let tokens = tokens.iter().map(|t| respell(t, gemma && model == "llama")).collect();
    let vocab = Vocab { tokens, types };
    let (json, what) = match model {
        "gpt2" => byte_level(g, &vocab)?,
        "llama" => sentencepiece(g, &vocab, gemma)?,
        other => return Err(format!("tokenizer model `{other}` is not one mgnc import writes")),
    };
    let config = config(g, &vocab);
    let pretty = |v: &Json| serde_json::to_vec_pretty(v).expect("JSON values serialize");
    Ok(Files {
        extras: vec![
            ("tokenizer.json".into(), pretty(&json)),
            ("tokenizer_config.json".into(), pretty(&config)),
        ],
        summary: format!("{what}, {} tokens", vocab.tokens.len()),
    })
}

/// Gemma's files spell its pieces of several spaces with spaces, where its tokenizer (which
/// writes every space as `▁` first) looks them up as `▁▁…`.
fn respell(token: &str, gemma: bool) -> String {
    if gemma && token.contains(' ') && token.trim().is_empty() {
        "▁".repeat(token.chars().count())
    } else {
        token.to_string()
    }
}

/// Control and user-defined tokens: matched whole before the model sees the text.
fn added_tokens(v: &Vocab) -> Json {
    let added = (v.tokens.iter().zip(&v.types).enumerate())
        .filter(|(_, (_, &t))| t == CONTROL || t == USER_DEFINED)
        .map(|(id, (content, &t))| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": t == USER_DEFINED, "special": t == CONTROL,
            })
        });
    Json::Array(added.collect())
}

fn vocab_map(v: &Vocab) -> Json {
    let mut map = Map::new();
    for (id, t) in v.tokens.iter().enumerate() {
        map.insert(t.to_string(), json!(id));
    }
    Json::Object(map)
}

/// The post-processor that adds BOS when the file says to (`tokenizer.ggml.add_bos_token`).
fn post_processor(g: &Gguf, v: &Vocab, otherwise: Json) -> Json {
    let add = g.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(false);
    let bos = token_id(g, "tokenizer.ggml.bos_token_id", v.tokens.len());
    match (add, bos) {
        (true, Some(id)) => {
            let tok = v.tokens[id].as_str();
            let special = json!({"SpecialToken": {"id": tok, "type_id": 0}});
            json!({
                "type": "TemplateProcessing",
                "single": [special, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [special, {"Sequence": {"id": "A", "type_id": 0}},
                         special, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {tok: {"id": tok, "ids": [id], "tokens": [tok]}},
            })
        }
        _ => otherwise,
    }
}

fn byte_level(g: &Gguf, v: &Vocab) -> Result<(Json, String), String> {
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let merges: Vec<Json> = merges
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| json!([a, b])))
        .collect::<Option<_>>()
        .ok_or("a merge in `tokenizer.ggml.merges` is not two tokens")?;
    let pre = g.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
    let byte_level = |regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": regex})
    };
    let split = |regex: &str| {
        json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
               "invert": false})
    };
    let (normalizer, pre_tokenizer) = match pre {
        "gpt-2" | "default" | GPT2 => (Json::Null, byte_level(true)),
        "smollm" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        ),
        "llama-bpe" | "llama3" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}),
        ),
        other => return Err(format!("pre-tokenizer `{other}` (tokenizer.ggml.pre) is not known")),
    };
    let post = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false,
                      "use_regex": true});
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(v),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(g, v, post),
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab_map(v), "merges": merges,
        },
    });
    Ok((json, format!("byte-level BPE, pre-tokenizer `{pre}`")))
}

/// SentencePiece BPE: its merges are not stored, but each merge makes a piece of the vocab
/// and SentencePiece applies the merge whose result scores highest first; so every split of a
/// piece into two pieces of the vocab is a merge, ranked by the merged piece's score.
/// Gemma's scores do not follow its merge order, but the pieces' order in the file does: its
/// merges are ranked by the merged piece's place instead.
fn sentencepiece(g: &Gguf, v: &Vocab, gemma: bool) -> Result<(Json, String), String> {
    let scores: Vec<f64> = match g.get("tokenizer.ggml.scores").and_then(Value::as_array) {
        Some(a) => a.iter().map(|s| s.as_f64().unwrap_or(0.0)).collect(),
        None => return Err("no `tokenizer.ggml.scores`".into()),
    };
    if scores.len() != v.tokens.len() {
        return Err("`tokenizer.ggml.scores` and `tokenizer.ggml.tokens` differ in length".into());
    }
    let ids: std::collections::HashMap<&str, usize> =
        v.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut merges: Vec<(f64, usize, usize)> = Vec::new();
    for (id, piece) in v.tokens.iter().enumerate() {
        if v.types[id] != 1 {
            continue; // control, byte and unused pieces are never the result of a merge
        }
        for (cut, _) in piece.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (ids.get(&piece[..cut]), ids.get(&piece[cut..])) {
                merges.push((if gemma { -(id as f64) } else { scores[id] }, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let merges: Vec<Json> =
        merges.iter().map(|&(_, l, r)| json!([&v.tokens[l], &v.tokens[r]])).collect();
    let unk = token_id(g, "tokenizer.ggml.unknown_token_id", v.tokens.len());
    let prefix = g.get("tokenizer.ggml.add_space_prefix").and_then(Value::as_bool).unwrap_or(true);
    let mut normalizers = Vec::new();
    if prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(v),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": post_processor(g, v, Json::Null),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk.map(|u| &v.tokens[u]),
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab_map(v), "merges": merges,
        },
    });
    Ok((json, "SentencePiece BPE (merges from the scores), byte fallback".into()))
}

/// `tokenizer_config.json`: the special tokens by content, the chat template, whether BOS is
/// added.
fn config(g: &Gguf, v: &Vocab) -> Json {
    let n = v.tokens.len();
    let token = |key: &str| token_id(g, key, n).map(|id| v.tokens[id].as_str());
    let mut c = Map::new();
    c.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    for (name, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(t) = token(key) {
            c.insert(name.into(), json!(t));
        }
    }
    for key in ["add_bos_token", "add_eos_token"] {
        if let Some(b) = g.get(&format!("tokenizer.ggml.{key}")).and_then(Value::as_bool) {
            c.insert(key.into(), json!(b));
        }
    }
    if let Some(t) = g.get("tokenizer.chat_template").and_then(Value::as_str) {
        c.insert("chat_template".into(), json!(t));
    }
    Json::Object(c)
}
