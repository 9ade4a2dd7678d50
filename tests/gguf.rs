//! GGUF files imported (mgn-import's GGUF front end, as `mgnc import` does: the source
//! formatted and written, the tensors saved as a checkpoint) and run:
//!
//! - the tiny fixtures of tests/fixtures/gguf (scripts/gguf_fixtures.py: llama and qwen3 in F32,
//!   F16, Q8_0, Q4_0 and Q4_1, qwen2, gemma, a K-quant llama): the full model's logits for fixed
//!   ids, and the decode model's token by token against its KV cache, within rel. L2 1e-5 of a
//!   numpy forward by llama.cpp's conventions on the dequantized weights;
//! - the real SmolLM2-135M-Instruct Q4_1 file (`scripts/fetch_smollm2_gguf.sh`, which
//!   `scripts/test.sh` runs first): it imports and loads strictly, its tokenizer.json encodes a
//!   page of text as the Hugging Face `tokenizers` library does, and its greedy continuation of
//!   a chat prompt is the numpy reference's (tests/fixtures/gguf/smollm2_reference.json).

use mgn_compiler::driver::plan_path;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::tensor::Tensor;
use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::{Generator, Restore, Sampler, SamplerConfig, Session};
use mgn_tests::{rendered, root};
use std::path::{Path, PathBuf};

/// A GGUF file imported into `dir`: the model names and where the files went.
struct Imported {
    source: PathBuf,
    checkpoint: PathBuf,
    full: String,
    decode: String,
}

/// A fresh directory for one import, under the build's own scratch space and under a fixed
/// name, so each run replaces the last one's files (the real SmolLM2's checkpoint is 97 MB)
/// instead of leaving a copy per process in the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gguf-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// What `mgnc import FILE -o DIR/model.mgn` writes.
fn import(file: &Path, dir: &Path) -> Imported {
    let m = mgn_import::import_file(file, &mgn_import::Options::default())
        .unwrap_or_else(|e| panic!("{e}"));
    write(&m, dir)
}

/// An import's files written into `dir` as `mgnc import` writes them.
fn write(m: &mgn_import::Imported, dir: &Path) -> Imported {
    let source = mgn_syntax::format::format(&m.source).expect("the source parses");
    let full = source
        .lines()
        .find_map(|l| l.strip_prefix("model ").and_then(|r| r.split('(').next()))
        .expect("a model")
        .to_string();
    let path = dir.join("model.mgn");
    std::fs::write(&path, &source).expect("written");
    let checkpoint = dir.join("model.safetensors");
    let tensors: Vec<(String, &Tensor)> = m.weights.iter().map(|(n, t)| (n.clone(), t)).collect();
    mgn_runtime::checkpoint::save(&checkpoint, &tensors, &[]).expect("saved");
    for (suffix, bytes) in &m.extras {
        std::fs::write(dir.join(format!("model.{suffix}")), bytes).expect("written");
    }
    Imported { source: path, checkpoint, decode: format!("{full}Decode"), full }
}

fn session(m: &Imported, model: &str, settings: &[String]) -> Session {
    root();
    let settings: Vec<Setting> = settings.iter().map(|s| s.parse().expect("a setting")).collect();
    let opts = PlanOptions::infer();
    let (outcome, plan) =
        plan_path(&m.source, Some(model.to_string()), settings, &opts).expect("readable");
    let plan = plan.unwrap_or_else(|| panic!("{}", rendered(&outcome)));
    let (s, report) =
        Session::from_checkpoint(plan, 0, &m.checkpoint, MatchMode::Strict, Restore::Weights)
            .unwrap_or_else(|e| panic!("{model}: {e}"));
    assert!(report.is_clean(), "{model}: {report:?}");
    s
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

fn json(path: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(root().join(path)).expect("the committed fixture");
    serde_json::from_str(&text).expect("JSON")
}

fn numbers<T>(v: &serde_json::Value, f: impl Fn(f64) -> T) -> Vec<T> {
    v.as_array().expect("an array").iter().map(|x| f(x.as_f64().expect("a number"))).collect()
}

/// One fixture: the full forward, then token by token through the decode model.
fn fixture_matches_numpy(name: &str) {
    let expected = json("tests/fixtures/gguf/expected.json");
    let ids: Vec<i32> = numbers(&expected["ids"], |x| x as i32);
    let want: Vec<f32> = numbers(&expected["models"][name]["logits"], |x| x as f32);
    let vocab = expected["models"][name]["vocab"].as_u64().unwrap() as usize;
    let file = root().join(format!("tests/fixtures/gguf/{name}.gguf"));
    let m = import(&file, &scratch(name));
    let t = ids.len();
    let mut full = session(&m, &m.full, &[format!("T={t}")]);
    let input = Tensor::i32(vec![1, t], ids.clone());
    let out = full.run(&[("input_ids", &input)]).expect("runs");
    let logits = &out.outputs.iter().find(|(n, _)| n == "logits").expect("logits").1;
    let got: Vec<f32> = logits.to_f64_vec().into_iter().map(|x| x as f32).collect();
    let e = rel_l2(&got, &want);
    assert!(e < 1e-5, "{name}: the full forward is {e:.2e} from numpy's");
    let decode = session(&m, &m.decode, &["cache=16".to_string()]);
    let mut g = Generator::new(None, decode).expect("the decode model follows the convention");
    for (pos, &id) in ids.iter().enumerate() {
        let row = g.step(id).expect("a step");
        let e = rel_l2(&row, &want[pos * vocab..(pos + 1) * vocab]);
        assert!(e < 1e-5, "{name}: decoding position {pos} is {e:.2e} from numpy's");
    }
}

macro_rules! fixtures {
    ($($test:ident: $name:literal,)*) => {
        $(#[test]
        fn $test() {
            fixture_matches_numpy($name);
        })*
    };
}

fixtures! {
    llama_f32: "llama_f32",
    llama_f16: "llama_f16",
    llama_q8_0: "llama_q8_0",
    llama_q4_0: "llama_q4_0",
    llama_q4_1: "llama_q4_1",
    llama_k_quants: "llama_k_quants",
    qwen3_f32: "qwen3_f32",
    qwen3_f16: "qwen3_f16",
    qwen3_q8_0: "qwen3_q8_0",
    qwen3_q4_0: "qwen3_q4_0",
    qwen3_q4_1: "qwen3_q4_1",
    qwen2_f32_with_biases_and_an_untied_output: "qwen2_f32",
    gemma_f16: "gemma_f16",
}

/// Where `scripts/fetch_smollm2_gguf.sh` puts the file by default.
fn smollm2() -> PathBuf {
    let cache = match std::env::var_os("MGN_CACHE") {
        Some(c) => PathBuf::from(c),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/mgn"),
    };
    let file = cache.join("smollm2_gguf/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(file.is_file(), "{} is missing: run scripts/fetch_smollm2_gguf.sh", file.display());
    file
}

/// The real file, imported once for the tests that share it.
fn smollm2_imported() -> &'static (Imported, PathBuf) {
    static IMPORTED: std::sync::OnceLock<(Imported, PathBuf)> = std::sync::OnceLock::new();
    IMPORTED.get_or_init(|| {
        let dir = scratch("smollm2");
        let start = std::time::Instant::now();
        let m = import(&smollm2(), &dir);
        eprintln!("imported in {:.1} s", start.elapsed().as_secs_f64());
        (m, dir)
    })
}

fn reference() -> serde_json::Value {
    json("tests/fixtures/gguf/smollm2_reference.json")
}

fn ids(v: &serde_json::Value) -> Vec<i32> {
    numbers(v, |x| x as i32)
}

#[test]
fn smollm2_q4_1_tokenizer_encodes_as_hugging_faces_does() {
    let (reference, (_, dir)) = (reference(), smollm2_imported());
    // The tokenizer, read as a Hugging Face download's is.
    let tok = tokenizers::Tokenizer::from_file(dir.join("model.tokenizer.json")).expect("loads");
    for (text, want) in [("text", "text_ids"), ("prompt", "prompt_ids")] {
        let text = reference[text].as_str().expect("text");
        let got = tok.encode(text, false).expect("encodes").get_ids().to_vec();
        let want: Vec<u32> = numbers(&reference[want], |x| x as u32);
        assert_eq!(got, want, "{text}");
        let back = tok.decode(&got, false).expect("decodes");
        assert_eq!(back, text, "decoding gives the text back");
    }
    let config = json_file(&dir.join("model.tokenizer_config.json"));
    assert_eq!(
        (config["bos_token"].as_str(), config["eos_token"].as_str()),
        (Some("<|im_start|>"), Some("<|im_end|>"))
    );
    assert!(config["chat_template"].as_str().unwrap().contains("<|im_start|>assistant"));
}

/// Greedy decoding checked in one run: the full model over the prompt and the reference's
/// continuation predicts, at each position from the prompt's last, the reference's next token
/// (so greedy decoding from the prompt produces exactly that continuation). One run of the
/// full forward keeps the debug build's test short; the KV-cache path is the next test's.
#[test]
fn smollm2_q4_1_predicts_the_reference_greedy_continuation() {
    let (reference, (m, _)) = (reference(), smollm2_imported());
    let (prompt, greedy) = (ids(&reference["prompt_ids"]), ids(&reference["greedy"]));
    let sequence: Vec<i32> = prompt.iter().chain(&greedy[..greedy.len() - 1]).copied().collect();
    let t = sequence.len();
    let start = std::time::Instant::now();
    let mut s = session(m, &m.full, &[format!("T={t}")]);
    let input = Tensor::i32(vec![1, t], sequence);
    let out = s.run(&[("input_ids", &input)]).expect("runs");
    eprintln!("planned and ran {t} tokens in {:.1} s", start.elapsed().as_secs_f64());
    let logits = out.outputs.into_iter().find(|(n, _)| n == "logits").expect("logits").1;
    let logits: Vec<f32> = logits.to_f64_vec().into_iter().map(|x| x as f32).collect();
    let vocab = logits.len() / t;
    let predicted: Vec<i32> = (prompt.len() - 1..t)
        .map(|p| mgn_runtime::greedy(&logits[p * vocab..(p + 1) * vocab]) as i32)
        .collect();
    assert_eq!(predicted, greedy, "the greedy continuation");
}

/// The same continuation generated through the decode model and its KV cache: a prefill plan
/// for the prompt, then one token a run. Its first tokens only: a run of the 135M model takes
/// some 7 s in a debug build, and the whole continuation is the test above's.
#[test]
fn smollm2_q4_1_generates_the_reference_continuation_against_its_cache() {
    let (reference, (m, _)) = (reference(), smollm2_imported());
    let (prompt, want) = (ids(&reference["prompt_ids"]), ids(&reference["greedy"]));
    let want = want[..3].to_vec();
    let start = std::time::Instant::now();
    let cache = "cache=64".to_string();
    let prefill = session(m, &m.decode, &[cache.clone(), format!("T={}", prompt.len())]);
    let decode = session(m, &m.decode, &[cache]);
    let mut g = Generator::new(Some(prefill), decode).expect("the convention");
    let mut greedy = Sampler::new(SamplerConfig::GREEDY).expect("greedy");
    let got = g.generate(&prompt, want.len(), &mut greedy).expect("generates");
    eprintln!(
        "planned and generated {} tokens in {:.1} s",
        want.len(),
        start.elapsed().as_secs_f64()
    );
    assert_eq!(got, want, "the greedy continuation");
}

fn json_file(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("written")).expect("JSON")
}

/// A SentencePiece BPE tokenizer (`tokenizer.ggml.model` llama, trained by
/// scripts/gguf_fixtures.py): its pieces and scores become a tokenizer.json whose ids are
/// SentencePiece's own — merges recovered from the scores, byte fallback for unseen characters,
/// digits and runs of spaces as SentencePiece splits them, control tokens matched whole, BOS
/// added when asked for.
#[test]
fn a_sentencepiece_vocabulary_tokenizes_as_sentencepiece_does() {
    let bytes = std::fs::read(root().join("tests/fixtures/gguf/spm.gguf")).expect("the fixture");
    let g = mgn_import::gguf::read::parse(&bytes).expect("parses");
    let files = mgn_import::gguf::tokenizer::files(&g).expect("a tokenizer");
    let file = &files.extras.iter().find(|(n, _)| n == "tokenizer.json").expect("written").1;
    let tok = tokenizers::Tokenizer::from_bytes(file).expect("loads");
    let expected = json("tests/fixtures/gguf/expected.json");
    let texts = expected["spm"]["texts"].as_array().expect("texts");
    for (text, want) in texts.iter().zip(expected["spm"]["ids"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let want: Vec<u32> = numbers(want, |x| x as u32);
        let got = tok.encode(text, false).expect("encodes").get_ids().to_vec();
        assert_eq!(got, want, "{text:?}");
        let with_bos = tok.encode(text, true).expect("encodes").get_ids().to_vec();
        assert_eq!(with_bos[0], 1, "BOS first: add_bos_token is true");
        // Decoding strips the space SentencePiece puts before the text (as Hugging Face's
        // Llama tokenizers do), so a text opening with a control token decodes with it after.
        if !text.starts_with("<s>") {
            assert_eq!(tok.decode(&got, false).expect("decodes"), text, "decoded back");
        }
    }
}

/// A "mixed" file, whose blocks hold one field in different types (as Q4_K_M files keep some
/// layers' attn_v and ffn_down in Q6_K): the source gives each block its type from a table,
/// the checkpoint loads strictly, and the model runs close to the numpy forward (one tensor is
/// re-rounded to q8_0, so not within the exact fixtures' 1e-5).
#[test]
fn blocks_of_different_types_take_theirs_from_a_table() {
    use mgn_import::gguf::{arch, emit, read};
    let name = "llama_q4_1";
    let file = root().join(format!("tests/fixtures/gguf/{name}.gguf"));
    let bytes = std::fs::read(&file).expect("the fixture");
    let config = arch::config(&read::parse(&bytes).expect("parses")).expect("a llama");
    assert!(config.n_layers >= 2, "the fixture needs two blocks to differ");
    let mut m = mgn_import::import_file(&file, &mgn_import::Options::default()).expect("imports");
    let (_, w) = (m.weights.iter_mut())
        .find(|(n, t)| n == "blk.0.ffn_down.weight" && t.dtype.is_packed())
        .expect("a packed ffn_down in block 0");
    let other =
        if w.dtype == mgn_ir::DType::Q8_0 { mgn_ir::DType::Q4_1 } else { mgn_ir::DType::Q8_0 };
    *w = Tensor::quantized(other, w.shape.clone(), &w.dequantized());
    let packed = emit::Packed::of(&m.weights, config.n_layers);
    let origin = emit::Origin { file: "mixed.gguf", title: None, version: 3, types: "mixed" };
    let text = emit::source(&config, "Mixed", &origin, &packed);
    assert!(text.contains(&format!("const FFN_DOWN_TYPES = [{other}, ")), "{text}");
    assert!(text.contains("ffn_down_type = FFN_DOWN_TYPES[i]"), "{text}");
    let dir = scratch("mixed");
    m.source = text;
    let imported = write(&m, &dir);
    let expected = json("tests/fixtures/gguf/expected.json");
    let ids: Vec<i32> = numbers(&expected["ids"], |x| x as i32);
    let want: Vec<f32> = numbers(&expected["models"][name]["logits"], |x| x as f32);
    let mut full = session(&imported, "Mixed", &[format!("T={}", ids.len())]);
    let input = Tensor::i32(vec![1, ids.len()], ids);
    let out = full.run(&[("input_ids", &input)]).expect("runs");
    let logits = &out.outputs.iter().find(|(n, _)| n == "logits").expect("logits").1;
    let got: Vec<f32> = logits.to_f64_vec().into_iter().map(|x| x as f32).collect();
    let e = rel_l2(&got, &want);
    assert!(e < 2e-2, "the mixed model is {e:.2e} from numpy's");
}
