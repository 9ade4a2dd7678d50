//! The `.mgn` source of an imported decoder: one `Block` layer (`blk.{i}`) whose fields carry
//! the GGUF tensor names, then two models over the same fields — the full forward (logits of
//! T tokens, no loss) and the decode model against a KV cache (the convention of
//! models/smollm2_135m_decode.mgn: inputs `input_ids` and `pos`, a `cache` argument, output
//! `logits`). The text is meant to be read and edited: names are the file's, the config is
//! the models' arguments with the file's values as defaults, and comments say where things
//! come from.

use super::arch::{Arch, Config};
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The block's matrix-product weights, by field: what `Packed` records per block.
const LINEARS: [&str; 7] =
    ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

/// Which weights the checkpoint holds packed, so the source declares them so (`weight_type`):
/// per block field, each block's type; the embedding's and the output head's.
#[derive(Debug, Default)]
pub struct Packed {
    blocks: BTreeMap<&'static str, Vec<DType>>,
    token_embd: Option<DType>,
    output: Option<DType>,
}

impl Packed {
    /// From the checkpoint's tensors (`blk.{i}.{field}.weight`, `token_embd.weight`, …).
    pub fn of(weights: &[(String, Tensor)], n_layers: usize) -> Packed {
        let types: BTreeMap<&str, DType> =
            weights.iter().map(|(n, t)| (n.as_str(), t.dtype)).collect();
        let packed = |name: &str| types.get(name).copied().filter(|d| d.is_packed());
        let mut blocks = BTreeMap::new();
        for field in LINEARS {
            let per: Vec<DType> = (0..n_layers)
                .map(|i| packed(&format!("blk.{i}.{field}.weight")).unwrap_or(DType::F32))
                .collect();
            if per.iter().any(|d| d.is_packed()) {
                blocks.insert(field, per);
            }
        }
        Packed { blocks, token_embd: packed("token_embd.weight"), output: packed("output.weight") }
    }

    /// How many tensors are packed.
    pub fn count(&self) -> usize {
        let blocks: usize =
            self.blocks.values().map(|v| v.iter().filter(|d| d.is_packed()).count()).sum();
        blocks + self.token_embd.is_some() as usize + self.output.is_some() as usize
    }

    /// A block field's type when every block has the same one.
    fn uniform(&self, field: &str) -> Option<DType> {
        let v = self.blocks.get(field)?;
        v.iter().all(|d| *d == v[0]).then_some(v[0])
    }

    /// The `, weight_type = …` argument of a std layer holding a weight of type `d`.
    fn argument(d: Option<DType>) -> String {
        d.map(|d| format!(", weight_type = {d}")).unwrap_or_default()
    }
}

/// What the header comment says about the file.
pub struct Origin<'a> {
    pub file: &'a str,
    pub title: Option<&'a str>,
    pub version: u32,
    /// "F32 61, Q4_1 210, Q8_0 1"
    pub types: &'a str,
}

/// The decode model's default cache: the file's context, up to a size whose caches stay small
/// (`--set cache=N` gives more).
const MAX_DEFAULT_CACHE: usize = 2048;

pub fn source(c: &Config, name: &str, origin: &Origin, packed: &Packed) -> String {
    let mut s = String::new();
    header(&mut s, c, origin, packed);
    s.push_str("use std.nn.{Embedding, Linear, RmsNorm}\n");
    s.push_str("use std.attention.{split_heads, merge_heads, rotary, cache_mask}\n\n");
    type_tables(&mut s, packed);
    block(&mut s, c, packed);
    model(&mut s, c, name, false, packed);
    s.push('\n');
    model(&mut s, c, &format!("{name}Decode"), true, packed);
    s
}

/// The name of the table of a block field's types per block (`ATTN_V_TYPES`).
fn table_name(field: &str) -> String {
    format!("{}_TYPES", field.to_uppercase())
}

/// A table per block field whose blocks hold different types (a "mixed" quantization such as
/// Q4_K_M keeps some layers' attn_v and ffn_down in Q6_K): the repeat picks each block's.
fn type_tables(s: &mut String, packed: &Packed) {
    let mut any = false;
    for (field, types) in &packed.blocks {
        if packed.uniform(field).is_none() {
            let list: Vec<String> = types.iter().map(|d| d.to_string()).collect();
            let _ = writeln!(s, "const {} = [{}]", table_name(field), list.join(", "));
            any = true;
        }
    }
    if any {
        s.push_str("// (the file's type of each block's weight, block by block)\n\n");
    }
}

fn header(s: &mut String, c: &Config, o: &Origin, packed: &Packed) {
    let title = o.title.map(|t| format!(" (\"{t}\")")).unwrap_or_default();
    let held = if packed.count() > 0 {
        "the block-quantized weights kept packed as the file holds them (`weight_type`), the \
         others f32 (`mgnc import --dequantize` writes every weight as f32)"
    } else {
        "every weight f32 in the checkpoint"
    };
    let mut notes = vec![
        format!(
            "Imported by `mgnc import` from {}{title}: GGUF v{}, architecture `{}`; tensors {}; \
             {held}.",
            o.file,
            o.version,
            c.arch.name(),
            o.types
        ),
        "Parameter names are the file's tensor names (token_embd.weight, blk.0.attn_q.weight, \
         …), so the checkpoint loads by name."
            .to_string(),
    ];
    if c.arch.permuted_qk() {
        notes.push(
            "llama.cpp stores the attn_q and attn_k rows of `llama` files permuted for its \
             interleaved rope; the checkpoint holds them un-permuted (as trained), so the `rope` \
             builtin's rotate-half convention applies."
                .into(),
        );
    }
    if c.arch.gemma() {
        notes.push(
            "Gemma: llama.cpp stores each RMSNorm weight as 1 + w, the factor the norm applies, \
             so the norms here multiply by the stored weight as it is."
                .into(),
        );
    }
    if c.tied {
        notes
            .push("The file has no output.weight: the logits use token_embd.weight (tied).".into());
    }
    notes.push(
        "Two models: the full forward (add a loss to train it) and the `…Decode` model, which \
         decodes against a KV cache (build it with T = 1, and T = a prompt chunk to prefill)."
            .into(),
    );
    for note in notes {
        comment(s, &note, "");
    }
    s.push('\n');
}

/// `text` as `//` lines of at most 100 columns, indented by `indent`.
fn comment(s: &mut String, text: &str, indent: &str) {
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty()
            && indent.len() + 3 + line.chars().count() + 1 + word.chars().count() > 100
        {
            let _ = writeln!(s, "{indent}// {line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    let _ = writeln!(s, "{indent}// {line}");
}

fn block(s: &mut String, c: &Config, packed: &Packed) {
    let bias = c.qkv_bias;
    s.push_str(
        "// One decoder block, blk.{i}: x + attention(attn_norm(x)), then + mlp(ffn_norm(·)).\n",
    );
    s.push_str(
        "layer Block(\n    d: dim,\n    heads: dim,\n    kv_heads: dim,\n    head_dim: dim,\n    \
         hidden: dim,\n    eps: float,\n    rope_theta: float,\n    cache: int = 0,\n    \
         cache_batch: dim = 1,\n",
    );
    for field in packed.blocks.keys() {
        let default = packed.uniform(field).unwrap_or(DType::F32);
        let _ = writeln!(s, "    {field}_type: dtype = {default},");
    }
    s.push_str(") {\n");
    let wt = |field: &str| {
        if packed.blocks.contains_key(field) {
            format!(", weight_type = {field}_type")
        } else {
            String::new()
        }
    };
    s.push_str("    attn_norm = RmsNorm(d, eps = eps)\n");
    let _ = writeln!(s, "    attn_q = Linear(d, heads * head_dim, bias = {bias}{})", wt("attn_q"));
    let _ =
        writeln!(s, "    attn_k = Linear(d, kv_heads * head_dim, bias = {bias}{})", wt("attn_k"));
    let _ =
        writeln!(s, "    attn_v = Linear(d, kv_heads * head_dim, bias = {bias}{})", wt("attn_v"));
    if c.arch.qk_norm() {
        s.push_str(
            "    attn_q_norm = RmsNorm(head_dim, eps = eps)  // per head, before the rope\n",
        );
        s.push_str("    attn_k_norm = RmsNorm(head_dim, eps = eps)\n");
    }
    let _ = writeln!(
        s,
        "    attn_output = Linear(heads * head_dim, d, bias = false{})",
        wt("attn_output")
    );
    s.push_str("    ffn_norm = RmsNorm(d, eps = eps)\n");
    let _ = writeln!(s, "    ffn_gate = Linear(d, hidden, bias = false{})", wt("ffn_gate"));
    let _ = writeln!(s, "    ffn_up = Linear(d, hidden, bias = false{})", wt("ffn_up"));
    let _ = writeln!(s, "    ffn_down = Linear(hidden, d, bias = false{})", wt("ffn_down"));
    s.push_str("    // The KV cache of the decode model: kept between runs, never saved.\n");
    s.push_str("    k_cache = state f32[cache_batch, kv_heads, cache, head_dim] if cache > 0\n");
    s.push_str("    v_cache = state f32[cache_batch, kv_heads, cache, head_dim] if cache > 0\n\n");
    s.push_str("    // `pos` (decoding): the position of x's first row.\n");
    s.push_str("    forward(x: f32[B, T, d], pos?: i32[]) -> f32[B, T, d] {\n");
    s.push_str("        let h = attn_norm(x)\n");
    s.push_str("        let q = split_heads(attn_q(h), heads)     // [B, heads, T, head_dim]\n");
    s.push_str("        let k = split_heads(attn_k(h), kv_heads)  // [B, kv_heads, T, head_dim]\n");
    s.push_str("        let v = split_heads(attn_v(h), kv_heads)\n");
    let (q, k) = if c.arch.qk_norm() { ("attn_q_norm(q)", "attn_k_norm(k)") } else { ("q", "k") };
    let _ = writeln!(s, "        let q = rotary({q}, rope_theta, pos)");
    let _ = writeln!(s, "        let k = rotary({k}, rope_theta, pos)");
    s.push_str(
        "        let y = if cache > 0 {\n            \
         let keys = slice_scatter(self.k_cache, k, 2, pos)\n            \
         let values = slice_scatter(self.v_cache, v, 2, pos)\n            \
         self.k_cache = keys\n            self.v_cache = values\n            \
         attention(q, keys, values, mask = cache_mask(T, cache, pos))\n        \
         } else {\n            attention(q, k, v, causal = true)\n        }\n",
    );
    s.push_str("        let x = x + attn_output(merge_heads(y))\n");
    s.push_str("        let h = ffn_norm(x)\n");
    let act = if c.arch.gemma() { "gelu_tanh" } else { "silu" };
    let _ = writeln!(s, "        x + ffn_down({act}(ffn_gate(h)) * ffn_up(h))");
    s.push_str("    }\n}\n\n");
}

/// A float literal the lexer reads back as the same f32: Rust's shortest round-trip form.
pub fn float(x: f32) -> String {
    let t = format!("{x:?}");
    if t.contains('.') || t.contains('e') || t.contains("inf") || t.contains("NaN") {
        t
    } else {
        format!("{t}.0")
    }
}

fn model(s: &mut String, c: &Config, name: &str, decode: bool, packed: &Packed) {
    if decode {
        let text = format!(
            "Decoding against the KV cache: T tokens at positions pos … pos + T - 1 (the file's \
             context is {} positions; `--set cache=N` sizes the cache).",
            c.context
        );
        comment(s, &text, "");
    } else {
        s.push_str("// The full forward: logits of T tokens at positions 0 … T - 1.\n");
    }
    let _ = writeln!(s, "model {name}(");
    for (arg, value) in [
        ("vocab: dim", c.vocab.to_string()),
        ("d: dim", c.d.to_string()),
        ("n_layers: int", c.n_layers.to_string()),
        ("heads: dim", c.heads.to_string()),
        ("kv_heads: dim", c.kv_heads.to_string()),
        ("head_dim: dim", c.head_dim.to_string()),
        ("hidden: dim", c.hidden.to_string()),
        ("eps: float", float(c.eps)),
        ("rope_theta: float", float(c.rope_theta)),
        ("B: dim", "1".into()),
        ("T: dim", if decode { "1".into() } else { c.context.min(128).to_string() }),
    ] {
        let _ = writeln!(s, "    {arg} = {value},");
    }
    if decode {
        let _ = writeln!(s, "    cache: dim = {},", c.context.min(MAX_DEFAULT_CACHE));
    }
    s.push_str(") {\n    input input_ids: i32[B, T]\n");
    if decode {
        s.push_str("    input pos: i32[]\n");
    }
    s.push('\n');
    let _ =
        writeln!(s, "    token_embd = Embedding(vocab, d{})", Packed::argument(packed.token_embd));
    let cache = if decode { ", cache, B" } else { "" };
    let mut args = format!("d, heads, kv_heads, head_dim, hidden, eps, rope_theta{cache}");
    let mixed: Vec<&&str> = packed.blocks.keys().filter(|f| packed.uniform(f).is_none()).collect();
    for field in &mixed {
        let _ = write!(args, ", {field}_type = {}[i]", table_name(field));
    }
    let index = if mixed.is_empty() { "" } else { ", i" };
    let _ = writeln!(s, "    blk = repeat(n_layers{index}) Block({args})");
    s.push_str("    output_norm = RmsNorm(d, eps = eps)\n");
    if !c.tied {
        let wt = Packed::argument(packed.output);
        let _ = writeln!(
            s,
            "    output = Linear(d, vocab, bias = false{wt})  // reached as self.output"
        );
    }
    s.push_str("\n    forward {\n");
    let embed = match c.arch {
        Arch::Gemma => "token_embd(input_ids) * sqrt(float(d))  // Gemma scales by sqrt(d)",
        _ => "token_embd(input_ids)",
    };
    let _ = writeln!(s, "        let x = {embed}");
    let pos = if decode { ", pos" } else { "" };
    let _ = writeln!(s, "        let h = output_norm(blk(x{pos}))  // [B, T, d]");
    if c.tied {
        s.push_str("        output logits = h @ self.token_embd.weight^T  // [B, T, vocab]\n");
    } else {
        s.push_str("        output logits = self.output(h)  // [B, T, vocab]\n");
    }
    s.push_str("    }\n}\n");
}
