//! Sentence embeddings with all-MiniLM-L6-v2, as sentence-transformers computes them, from a
//! plan of models/minilm_l6.mgn and the model's own files (`scripts/fetch_minilm.sh`): the
//! Hugging Face tokenizer, then the plan over batches of sentences padded to the longest of
//! each batch. Built with `--dynamic B=…,T=…`, one plan runs every batch at its own size;
//! a static plan runs every batch padded to its one size.
//!
//! Shared by the example (`main.rs`) and the test that holds it to sentence-transformers'
//! output (`tests/search.rs`).

use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::{Plan, Restore, Session, Tensor};
use std::path::Path;
use tokenizers::{Tokenizer, TruncationParams};

/// sentence-transformers truncates all-MiniLM-L6-v2's input at this many tokens
/// (`max_seq_length` in its `sentence_bert_config.json`).
pub const MAX_SEQ_LENGTH: usize = 256;

/// The range of one axis a plan takes: its size, or a dynamic size's range.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Range {
    min: usize,
    max: usize,
}

pub struct Embedder {
    tokenizer: Tokenizer,
    session: Session,
    batch: Range,
    tokens: Range,
    /// Where the plan runs, for people.
    pub device: String,
}

/// The range of axis `axis` of input `name` of `plan`.
fn range(plan: &Plan, name: &str, axis: usize) -> Result<Range, String> {
    let (_, v) = (plan.inputs.iter().find(|(n, _)| n == name))
        .ok_or_else(|| format!("the plan of `{}` has no input `{name}`", plan.model))?;
    let step = &plan.steps[*v as usize];
    if step.shape.len() != 2 {
        return Err(format!("input `{name}` is {:?}, not [B, T]", step.shape));
    }
    let size = step.shape[axis];
    let dynamic = plan.dynamic.as_ref().and_then(|d| {
        let (_, poly) = d.shape_of(*v as usize).into_iter().find(|(a, _)| *a == axis)?;
        d.sizes.get(poly.as_var()?)
    });
    Ok(match dynamic {
        Some(var) => Range { min: var.min, max: var.max },
        None => Range { min: size, max: size },
    })
}

impl Embedder {
    /// An embedder running `plan` with the weights and tokenizer in `model_dir`, on the GPU
    /// when `gpu` (an error when it cannot be used).
    pub fn new(plan: Plan, model_dir: &Path, gpu: bool) -> Result<Embedder, String> {
        let batch = range(&plan, "input_ids", 0)?;
        let tokens = range(&plan, "input_ids", 1)?;
        if !plan.outputs.iter().any(|(n, _)| n == "embeddings") {
            return Err(format!("the plan of `{}` has no output `embeddings`", plan.model));
        }
        let weights = model_dir.join("model.safetensors");
        let (mut session, _) =
            Session::from_checkpoint(plan, 0, &weights, MatchMode::Strict, Restore::Weights)
                .map_err(|e| e.to_string())?;
        let device = match gpu {
            true => session.use_gpu().map_err(|e| e.to_string())?,
            false => "the CPU".to_string(),
        };
        let file = model_dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&file)
            .map_err(|e| format!("{}: {e} (run scripts/fetch_minilm.sh)", file.display()))?;
        // The file pads every input to 128 and cuts it there; sentence-transformers pads a
        // batch to its longest and cuts at MAX_SEQ_LENGTH, as the plan's T allows.
        tokenizer.with_padding(None);
        let cut =
            TruncationParams { max_length: MAX_SEQ_LENGTH.min(tokens.max), ..Default::default() };
        tokenizer.with_truncation(Some(cut)).map_err(|e| e.to_string())?;
        Ok(Embedder { tokenizer, session, batch, tokens, device })
    }

    /// The token ids of `sentence`, `[CLS] … [SEP]`, cut as sentence-transformers cuts them.
    #[allow(dead_code)] // tests/search.rs, which includes this file, checks them
    pub fn ids(&self, sentence: &str) -> Result<Vec<u32>, String> {
        let e = self.tokenizer.encode(sentence, true).map_err(|e| e.to_string())?;
        Ok(e.get_ids().to_vec())
    }

    /// One embedding (384 floats, unit length) per sentence, in order. Sentences of similar
    /// lengths run together (longest first), each batch padded to its longest.
    pub fn embed(&mut self, sentences: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        // All at once: the tokenizer spreads a batch over the host's cores.
        let encoded =
            self.tokenizer.encode_batch(sentences.to_vec(), true).map_err(|e| e.to_string())?;
        let ids: Vec<Vec<u32>> = encoded.iter().map(|e| e.get_ids().to_vec()).collect();
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
        let mut out = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(self.batch.max) {
            let rows: Vec<&[u32]> = chunk.iter().map(|&i| ids[i].as_slice()).collect();
            for (&i, e) in chunk.iter().zip(self.run(&rows)?) {
                out[i] = e;
            }
        }
        Ok(out)
    }

    /// The embeddings of one batch of token-id rows.
    fn run(&mut self, rows: &[&[u32]]) -> Result<Vec<Vec<f32>>, String> {
        let longest = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let (b, t) = (rows.len().max(self.batch.min), longest.max(self.tokens.min));
        let (mut ids, mut mask) = (vec![0i32; b * t], vec![0i32; b * t]);
        for (r, row) in rows.iter().enumerate() {
            for (k, &id) in row.iter().enumerate() {
                ids[r * t + k] = id as i32;
                mask[r * t + k] = 1;
            }
        }
        let shape = vec![b, t];
        let ids = Tensor::i32(shape.clone(), ids);
        let types = Tensor::i32(shape.clone(), vec![0; b * t]);
        let mask = Tensor::i32(shape, mask);
        let given = [("input_ids", &ids), ("token_type_ids", &types), ("attention_mask", &mask)];
        let out = self.session.run(&given).map_err(|e| e.to_string())?;
        let e = (out.outputs.into_iter().find(|(n, _)| n == "embeddings").map(|(_, t)| t))
            .ok_or("the plan returned no embeddings")?;
        let width = e.shape[1];
        let values: Vec<f32> = e.to_f64_vec().into_iter().map(|v| v as f32).collect();
        Ok(values.chunks(width).take(rows.len()).map(<[f32]>::to_vec).collect())
    }
}

/// The cosine similarity of two embeddings.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-12)
}
