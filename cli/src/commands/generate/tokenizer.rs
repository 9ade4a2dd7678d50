//! The text side of `mgnc generate`: a Hugging Face `tokenizer.json` and what lies beside it —
//! `tokenizer_config.json` (the chat template, the BOS/EOS tokens), `chat_template.jinja` (where
//! newer `transformers` keep the template) and `generation_config.json` (more EOS ids).
//!
//! Files are found as `save_pretrained` writes them (a directory, or its `tokenizer.json`) and as
//! `mgnc import x.gguf` does (`x.tokenizer.json` with `x.tokenizer_config.json`): for a file
//! `P.json` whose name ends in `tokenizer`, its companions are `P_config.json` first, then the
//! plain names in its directory.

use serde_json::Value;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// Tokens that end a sequence in the common tokenizers, for a tokenizer without a config that
/// names its EOS token.
const USUAL_EOS: &[&str] =
    &["</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<eos>"];

/// A tokenizer with what its config says.
pub struct TextTokenizer {
    pub inner: Tokenizer,
    /// The file it was read from, for messages.
    pub path: PathBuf,
    /// The chat template, when the config has one.
    pub chat_template: Option<String>,
    /// Special tokens by their config names (`bos_token`, `eos_token`, …) as templates see them.
    pub specials: Vec<(String, String)>,
    /// Ids that end generation.
    pub eos: Vec<u32>,
    /// The config's `add_bos_token: true`: an encoding with special tokens starts with BOS even
    /// when the tokenizer's post-processor does not add it (GGUF's `add_bos_token` becomes this).
    add_bos: bool,
}

/// Tokenizer files are read by the rule for every file mgnc reads: regular files only, never
/// blocking, of a known size (here at most 1 GiB: the largest vocabularies are a few MB).
const MAX_TOKENIZER_BYTES: u64 = 1 << 30;

fn read_text(path: &Path) -> Result<String, String> {
    let bytes = mgn_ir::io::read_regular(path, MAX_TOKENIZER_BYTES)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| format!("`{}` is not UTF-8 text", path.display()))
}

fn read_json(path: &Path) -> Result<Option<Value>, String> {
    if !path.exists() {
        return Ok(None);
    }
    serde_json::from_str(&read_text(path)?)
        .map(Some)
        .map_err(|e| format!("`{}` is not valid JSON: {e}", path.display()))
}

/// Where a companion file of the tokenizer at `file` may be: `x.<suffix>` beside
/// `x.tokenizer.json`, then `<plain>` in the same directory.
fn companions(file: &Path, suffix: &str, plain: &str) -> Vec<PathBuf> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut out = Vec::new();
    if let Some(stem) = name.strip_suffix(".tokenizer.json") {
        out.push(dir.join(format!("{stem}.{suffix}")));
    }
    out.push(dir.join(plain));
    out
}

/// The first of `paths` that exists, read as JSON.
fn first_json(paths: &[PathBuf]) -> Result<Option<(PathBuf, Value)>, String> {
    for p in paths {
        if let Some(v) = read_json(p)? {
            return Ok(Some((p.clone(), v)));
        }
    }
    Ok(None)
}

/// A special token as configs write it: a string, or an added token `{"content": …}`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// The config's chat template: a string, or a list of named ones (the `default`, else the
/// first).
fn template_of(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named =
                |n: &str| list.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(n));
            let t = named("default").or_else(|| list.first())?;
            t.get("template").and_then(Value::as_str).map(str::to_string)
        }
        _ => None,
    }
}

impl TextTokenizer {
    /// Reads `tokenizer.json` at `path` (or in the directory `path`) and its companions.
    pub fn load(path: &Path) -> Result<TextTokenizer, String> {
        let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
        if std::fs::symlink_metadata(&file).is_err() {
            return Err(format!(
                "no tokenizer at `{}` (pass a tokenizer.json, or the directory holding one)",
                file.display()
            ));
        }
        let inner = read_text(&file)?
            .parse::<Tokenizer>()
            .map_err(|e| format!("cannot read the tokenizer `{}`: {e}", file.display()))?;
        let config =
            first_json(&companions(&file, "tokenizer_config.json", "tokenizer_config.json"))?;
        let config = config.map(|(_, v)| v).unwrap_or(Value::Null);
        let mut chat_template = template_of(&config);
        if chat_template.is_none() {
            for p in companions(&file, "chat_template.jinja", "chat_template.jinja") {
                if p.exists() {
                    chat_template = Some(read_text(&p)?);
                    break;
                }
            }
        }
        let specials: Vec<(String, String)> = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .iter()
            .filter_map(|k| Some((k.to_string(), token_text(config.get(*k)?)?)))
            .collect();
        let generation =
            first_json(&companions(&file, "generation_config.json", "generation_config.json"))?;
        let add_bos = config.get("add_bos_token") == Some(&Value::Bool(true));
        let mut t =
            TextTokenizer { inner, path: file, chat_template, specials, eos: vec![], add_bos };
        t.eos = t.eos_ids(generation.as_ref().map(|(_, v)| v))?;
        Ok(t)
    }

    /// A special token's text by its config name.
    pub fn special(&self, name: &str) -> Option<&str> {
        self.specials.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The ids that end generation: the config's EOS token and generation_config's
    /// `eos_token_id` (one or a list); without either, the usual EOS tokens the vocabulary has.
    fn eos_ids(&self, generation: Option<&Value>) -> Result<Vec<u32>, String> {
        let mut ids = Vec::new();
        if let Some(eos) = self.special("eos_token") {
            let id = self.inner.token_to_id(eos).ok_or_else(|| {
                format!(
                    "the tokenizer config beside `{}` names `{eos}` its EOS token, which the \
                     tokenizer does not know",
                    self.path.display()
                )
            })?;
            ids.push(id);
        }
        let listed = generation.and_then(|g| g.get("eos_token_id"));
        let listed: Vec<u32> = match listed {
            Some(Value::Number(n)) => n.as_u64().into_iter().map(|v| v as u32).collect(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|v| v as u32).collect(),
            _ => vec![],
        };
        ids.extend(listed.into_iter().filter(|i| !ids.contains(i)).collect::<Vec<_>>());
        if ids.is_empty() {
            ids = USUAL_EOS.iter().filter_map(|t| self.inner.token_to_id(t)).take(1).collect();
        }
        Ok(ids)
    }

    /// `text` as ids; `special` adds the tokenizer's own special tokens (its post-processor),
    /// and BOS first when the config asks for it, as `encode(add_special_tokens=True)` does.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, String> {
        let e = self.inner.encode(text, special).map_err(|e| format!("cannot tokenize: {e}"))?;
        let mut ids = e.get_ids().to_vec();
        let bos = self.special("bos_token").and_then(|b| self.inner.token_to_id(b));
        if let Some(bos) = bos.filter(|&b| special && self.add_bos && ids.first() != Some(&b)) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }
}
