//! The model a GGUF file describes, from its `general.architecture` and `{arch}.*` metadata:
//! the decoder config, the family's variations (q/k norms, biases, GELU, the embedding
//! scale), and the tensors the config implies, checked against the file's. Whatever the
//! generated model would not compute exactly (rope scaling, sliding windows, experts, a tensor
//! with no place) is a problem, never approximated.

use super::read::{Gguf, TensorInfo, Value};
use std::collections::BTreeMap;

/// The llama-family architectures the importer writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma => "gemma",
        }
    }

    /// llama.cpp's converter permutes the q and k rows of `llama` files for its interleaved
    /// (GPT-J) rope; the others use the rotate-half (NeoX) rope and are stored as trained.
    pub fn permuted_qk(self) -> bool {
        self == Arch::Llama
    }

    /// Qwen3 normalizes each head's query and key (RMSNorm over head_dim) before the rope.
    pub fn qk_norm(self) -> bool {
        self == Arch::Qwen3
    }

    /// Gemma: GELU (tanh) gate, embeddings scaled by sqrt(d).
    pub fn gemma(self) -> bool {
        self == Arch::Gemma
    }
}

/// The decoder's config, as the file gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub vocab: usize,
    pub d: usize,
    pub n_layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
    pub eps: f32,
    pub rope_theta: f32,
    pub context: usize,
    /// No `output.weight`: the logits use the token embedding.
    pub tied: bool,
    /// The q, k and v projections have biases (Qwen2's do).
    pub qkv_bias: bool,
}

/// Reads the config, or every problem with it.
pub fn config(g: &Gguf) -> Result<Config, Vec<String>> {
    let mut problems = Vec::new();
    let arch = arch_of(g).map_err(|e| vec![e])?;
    let a = arch.name();
    let mut int = |key: &str, default: Option<usize>| -> usize {
        let full = format!("{a}.{key}");
        match g.get(&full) {
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 && n < 1 << 31 => n as usize,
                _ => {
                    problems.push(format!("`{full}` is {v:?}, not a positive integer"));
                    1
                }
            },
            None => default.unwrap_or_else(|| {
                problems.push(format!("the file has no `{full}`"));
                1
            }),
        }
    };
    let d = int("embedding_length", None);
    let n_layers = int("block_count", None);
    let heads = int("attention.head_count", None);
    let kv_heads = int("attention.head_count_kv", Some(heads));
    let head_dim = int("attention.key_length", Some(d / heads.max(1)));
    let value_dim = int("attention.value_length", Some(head_dim));
    let hidden = int("feed_forward_length", None);
    let context = int("context_length", Some(2048));
    let rope_dims = int("rope.dimension_count", Some(head_dim));
    let embd = g.tensors.iter().find(|t| t.name == "token_embd.weight");
    let vocab_default = embd.and_then(|t| t.dims.get(1)).map(|&v| v as usize);
    let vocab = int("vocab_size", vocab_default.or(Some(1)));
    let float = |key: &str, default: f32| -> Option<f32> {
        match g.get(&format!("{a}.{key}")) {
            None => Some(default),
            Some(v) => v.as_f64().map(|x| x as f32),
        }
    };
    let eps = float("attention.layer_norm_rms_epsilon", f32::NAN);
    let rope_theta = float("rope.freq_base", 10000.0);
    if eps.is_none() || eps.is_some_and(f32::is_nan) {
        problems.push(format!(
            "no `{a}.attention.layer_norm_rms_epsilon`: the model's norms are not RMS norms"
        ));
    }
    if rope_theta.is_none() {
        problems.push(format!("`{a}.rope.freq_base` is not a number"));
    }
    if value_dim != head_dim {
        problems.push(format!("value heads of {value_dim} differ from key heads of {head_dim}"));
    }
    if rope_dims != head_dim {
        problems.push(format!(
            "the rope rotates {rope_dims} of each head's {head_dim} dims; the `rope` builtin \
             rotates them all"
        ));
    }
    if heads % kv_heads != 0 {
        problems.push(format!("{kv_heads} KV heads do not divide {heads} query heads"));
    }
    if head_dim % 2 != 0 {
        problems.push(format!("heads of {head_dim} dims: the rope rotates pairs"));
    }
    unexpressible(g, a, &mut problems);
    let tied = !g.tensors.iter().any(|t| t.name == "output.weight");
    let qkv_bias = g.tensors.iter().any(|t| t.name == "blk.0.attn_q.bias");
    let config = Config {
        arch,
        vocab,
        d,
        n_layers,
        heads,
        kv_heads,
        head_dim,
        hidden,
        eps: eps.unwrap_or(0.0),
        rope_theta: rope_theta.unwrap_or(0.0),
        context,
        tied,
        qkv_bias,
    };
    // Nine tensors a block: a block count the file cannot hold is corrupt (and listing every
    // missing tensor of a billion blocks would exhaust memory).
    if n_layers > g.tensors.len() {
        problems.push(format!("{n_layers} blocks, but the file holds {} tensors", g.tensors.len()));
    } else {
        problems.extend(check_tensors(&config, &g.tensors));
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(problems)
    }
}

fn arch_of(g: &Gguf) -> Result<Arch, String> {
    match g.get("general.architecture").and_then(Value::as_str) {
        Some("llama") => Ok(Arch::Llama),
        Some("qwen2") => Ok(Arch::Qwen2),
        Some("qwen3") => Ok(Arch::Qwen3),
        Some("gemma") => Ok(Arch::Gemma),
        Some(other) => Err(format!(
            "architecture `{other}` is not one mgnc import writes (llama, qwen2, qwen3, gemma)"
        )),
        None => Err("the file has no `general.architecture`".into()),
    }
}

/// Metadata that changes what the model computes in ways the generated source does not.
fn unexpressible(g: &Gguf, a: &str, problems: &mut Vec<String>) {
    let present = |key: &str| g.get(&format!("{a}.{key}"));
    if let Some(v) = present("rope.scaling.type") {
        if v.as_str() != Some("none") {
            problems.push(format!(
                "rope scaling `{}` ({a}.rope.scaling.type): the `rope` builtin has no scaling",
                v.as_str().unwrap_or("?")
            ));
        }
    }
    if let Some(f) = present("rope.scaling.factor").and_then(Value::as_f64) {
        if f != 1.0 && f != 0.0 {
            problems.push(format!("rope scaling factor {f}: the `rope` builtin has no scaling"));
        }
    }
    for (key, what) in [
        ("attention.sliding_window", "a sliding attention window"),
        ("attn_logit_softcapping", "soft-capped attention logits"),
        ("final_logit_softcapping", "soft-capped final logits"),
        ("attention.clamp_kqv", "clamped q, k and v"),
        ("attention.max_alibi_bias", "ALiBi"),
        ("logit_scale", "scaled logits"),
    ] {
        if present(key).is_some() {
            problems.push(format!("`{a}.{key}`: {what}, which the generated model lacks"));
        }
    }
    if present("expert_count").and_then(Value::as_u64).unwrap_or(0) > 0 {
        problems.push(format!("`{a}.expert_count`: mixtures of experts are not imported"));
    }
    if present("attention.causal").and_then(Value::as_bool) == Some(false) {
        problems.push(format!("`{a}.attention.causal` is false: not a causal decoder"));
    }
}

/// The tensors a config implies, name → shape (outermost first).
pub fn expected(c: &Config) -> BTreeMap<String, Vec<usize>> {
    let (d, hd) = (c.d, c.head_dim);
    let (q, kv) = (c.heads * hd, c.kv_heads * hd);
    let mut want = BTreeMap::new();
    want.insert("token_embd.weight".to_string(), vec![c.vocab, d]);
    want.insert("output_norm.weight".to_string(), vec![d]);
    if !c.tied {
        want.insert("output.weight".to_string(), vec![c.vocab, d]);
    }
    for i in 0..c.n_layers {
        let mut put = |name: &str, shape: Vec<usize>| {
            want.insert(format!("blk.{i}.{name}"), shape);
        };
        put("attn_norm.weight", vec![d]);
        put("attn_q.weight", vec![q, d]);
        put("attn_k.weight", vec![kv, d]);
        put("attn_v.weight", vec![kv, d]);
        put("attn_output.weight", vec![d, q]);
        if c.qkv_bias {
            put("attn_q.bias", vec![q]);
            put("attn_k.bias", vec![kv]);
            put("attn_v.bias", vec![kv]);
        }
        if c.arch.qk_norm() {
            put("attn_q_norm.weight", vec![hd]);
            put("attn_k_norm.weight", vec![hd]);
        }
        put("ffn_norm.weight", vec![d]);
        put("ffn_gate.weight", vec![c.hidden, d]);
        put("ffn_up.weight", vec![c.hidden, d]);
        put("ffn_down.weight", vec![d, c.hidden]);
    }
    want
}

/// The file's tensors against the config's: missing, unplaced and misshapen ones.
fn check_tensors(c: &Config, tensors: &[TensorInfo]) -> Vec<String> {
    let want = expected(c);
    let mut problems = Vec::new();
    let have: BTreeMap<&str, &TensorInfo> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    for (name, shape) in &want {
        match have.get(name.as_str()) {
            None => problems.push(format!("tensor `{name}` {shape:?} is missing")),
            Some(t) if &t.shape() != shape => problems
                .push(format!("tensor `{name}` is {:?}; the config makes it {shape:?}", t.shape())),
            Some(_) => {}
        }
    }
    for t in tensors {
        if !want.contains_key(&t.name) {
            problems.push(format!(
                "tensor `{}` has no place in a {} model (it would be ignored)",
                t.name,
                c.arch.name()
            ));
        }
    }
    problems
}
