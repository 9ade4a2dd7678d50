//! The GGUF front end: a llama.cpp model file (llama, qwen2, qwen3, gemma) becomes `.mgn`
//! source (a decoder block named by the file's tensors, the full model and a decode model),
//! its tensors dequantized to f32, and the tokenizer as Hugging Face's `tokenizer.json` and
//! `tokenizer_config.json`.

pub mod arch;
pub mod emit;
pub mod quants;
pub mod read;
pub mod tokenizer;

use crate::{ImportError, Imported, Options};
use arch::Config;
use mgn_ir::tensor::Tensor;
use read::{Gguf, TensorInfo};
use std::collections::BTreeMap;
use std::path::Path;

pub fn import(path: &Path, bytes: &[u8], options: &Options) -> Result<Imported, ImportError> {
    let fail = |problems: Vec<String>| ImportError { path: path.to_path_buf(), problems };
    let g = read::parse(bytes).map_err(|e| fail(vec![e]))?;
    let name = model_name(options, path).map_err(|e| fail(vec![e]))?;
    let config = arch::config(&g).map_err(fail)?;
    let weights = weights(&g, bytes, &config, options.dequantize).map_err(fail)?;
    let packed = emit::Packed::of(&weights, config.n_layers);
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let types = type_counts(&g.tensors);
    let origin = emit::Origin {
        file: &file,
        title: g.get("general.name").and_then(read::Value::as_str),
        version: g.version,
        types: &types,
    };
    let source = emit::source(&config, &name, &origin, &packed);
    let mut summary = vec![
        format!("GGUF v{}, architecture {}: {}", g.version, config.arch.name(), types),
        format!(
            "{} layers, d {}, {} heads ({} KV) of {}, MLP {}, vocab {}, context {}{}",
            config.n_layers,
            config.d,
            config.heads,
            config.kv_heads,
            config.head_dim,
            config.hidden,
            config.vocab,
            config.context,
            if config.tied { ", tied output" } else { "" }
        ),
        format!("models {name} (full forward) and {name}Decode (KV cache, input `pos`)"),
    ];
    summary.push(match packed.count() {
        0 => "weights: f32".to_string(),
        n => format!("weights: {n} tensors kept packed as the file holds them"),
    });
    if config.arch.permuted_qk() {
        summary.push("attn_q and attn_k rows un-permuted from llama.cpp's rope layout".into());
    }
    let extras = match tokenizer::files(&g) {
        Ok(files) => {
            summary.push(format!("tokenizer: {}", files.summary));
            files.extras
        }
        Err(why) => {
            summary.push(format!("no tokenizer files: {why}"));
            Vec::new()
        }
    };
    Ok(Imported { source, weights, extras, summary })
}

/// The model's name: the one asked for, or the file's stem as an identifier
/// (`SmolLM2-135M-Instruct.Q4_1.gguf` → `SmolLM2_135MInstruct`).
fn model_name(options: &Options, path: &Path) -> Result<String, String> {
    let ident = |s: &str| {
        let mut c = s.chars();
        c.next().is_some_and(|f| f.is_ascii_alphabetic())
            && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
    };
    if let Some(n) = &options.name {
        return if ident(n) {
            Ok(n.clone())
        } else {
            Err(format!("`--name {n}` is not a model name (letters, digits and _)"))
        };
    }
    let stem = path.file_name().and_then(|f| f.to_str()).unwrap_or("model");
    let stem = stem.split('.').next().unwrap_or(stem);
    let mut name = String::new();
    for part in stem.split(|c: char| !c.is_ascii_alphanumeric()).filter(|p| !p.is_empty()) {
        if part.starts_with(|c: char| c.is_ascii_digit()) && !name.is_empty() {
            name.push('_');
        }
        let mut chars = part.chars();
        name.extend(chars.next().map(|c| c.to_ascii_uppercase()));
        name.extend(chars);
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        name.insert_str(0, "Model");
    }
    Ok(name)
}

/// "F32 61, Q4_1 210, Q8_0 1": how many tensors of each type the file holds.
fn type_counts(tensors: &[TensorInfo]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for t in tensors {
        *counts.entry(read::type_name(t.ggml_type)).or_default() += 1;
    }
    counts.iter().map(|(t, n)| format!("{t} {n}")).collect::<Vec<_>>().join(", ")
}

/// Every tensor in the file's order, the q and k rows of a permuted file put back: the block
/// types kept packed (unless `dequantize`), the rest decoded to f32; or every tensor whose type
/// cannot be decoded.
fn weights(
    g: &Gguf,
    bytes: &[u8],
    c: &Config,
    dequantize: bool,
) -> Result<Vec<(String, Tensor)>, Vec<String>> {
    let mut problems = Vec::new();
    let mut out = Vec::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let Some((block, size)) = quants::layout(t.ggml_type) else {
            problems.push(format!(
                "tensor `{}` is {}, a type mgnc import does not decode (it decodes F32, F16, \
                 BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K)",
                t.name,
                read::type_name(t.ggml_type)
            ));
            continue;
        };
        // read::parse checked that these bytes lie inside the file.
        let len = t.numel() as usize / block * size;
        let shape = t.shape();
        let raw = &bytes[t.start..t.start + len];
        if let Some(dtype) = quants::packed(t.ggml_type).filter(|_| !dequantize) {
            // A row of the matrix is whole blocks, so un-permuting moves rows of bytes.
            let row = len / shape[0].max(1);
            let raw = match unpermute_heads(c, &t.name) {
                Some(heads) => unpermute(raw, heads, shape[0] / heads, row),
                None => raw.to_vec(),
            };
            out.push((t.name.clone(), Tensor::packed(dtype, shape, raw)));
            continue;
        }
        let data = quants::dequantize(t.ggml_type, &bytes[t.start..t.start + len])
            .expect("a type with a layout decodes");
        let data = match unpermute_heads(c, &t.name) {
            Some(heads) => unpermute(&data, heads, shape[0] / heads, shape[1]),
            None => data,
        };
        out.push((t.name.clone(), Tensor::f32(shape, data)));
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The head count whose rows llama.cpp permuted in tensor `name`, if it did.
fn unpermute_heads(c: &Config, name: &str) -> Option<usize> {
    if !c.arch.permuted_qk() || !name.starts_with("blk.") {
        return None;
    }
    if name.ends_with(".attn_q.weight") {
        Some(c.heads)
    } else if name.ends_with(".attn_k.weight") {
        Some(c.kv_heads)
    } else {
        None
    }
}

/// Undoes llama.cpp's q/k permutation: within each head of `head_dim` rows, the converter put
/// the trained row `s · head_dim/2 + j` (half s of the rotate-half pairs) at row `2j + s`, so
/// that rotating adjacent pairs equals rotating the halves of the trained rows.
/// `cols` is a row's length in items (values, or bytes of packed rows).
pub fn unpermute<T: Copy + Default>(
    data: &[T],
    heads: usize,
    head_dim: usize,
    cols: usize,
) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                let from = (h * head_dim + 2 * j + s) * cols;
                let to = (h * head_dim + s * half + j) * cols;
                out[to..to + cols].copy_from_slice(&data[from..from + cols]);
            }
        }
    }
    out
}
