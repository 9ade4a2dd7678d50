//! The semantic-search example's embedder (`runtime/examples/search/embed.rs`, compiled here
//! as it is) against sentence-transformers: all-MiniLM-L6-v2's real weights and tokenizer
//! (`scripts/fetch_minilm.sh`, which `scripts/test.sh` runs first) through one dynamic plan,
//! on 8 sentences of 3 to 42 tokens; the reference is `tests/fixtures/minilm_search/`. The
//! token ids must be the Hugging Face tokenizer's, each embedding within rel. L2 1e-5 of
//! sentence-transformers' on the CPU (1e-4 on the GPU), and the cosines equal to four places.

#[path = "../runtime/examples/search/embed.rs"]
mod embed;

use embed::{cosine, Embedder};
use mgn_compiler::driver::plan_path_dynamic;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::dynamic::SizeVar;
use mgn_tests::{rendered, root};
use std::path::{Path, PathBuf};

struct Fixture {
    sentences: Vec<String>,
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
    cosines: Vec<Vec<f64>>,
}

fn fixture() -> Fixture {
    let text = std::fs::read_to_string(root().join("tests/fixtures/minilm_search/fixture.json"))
        .expect("the committed fixture");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let rows = |key: &str| -> Vec<Vec<f64>> {
        (v[key].as_array().expect("rows").iter())
            .map(|r| r.as_array().expect("a row").iter().map(|x| x.as_f64().unwrap()).collect())
            .collect()
    };
    Fixture {
        sentences: (v["sentences"].as_array().unwrap().iter())
            .map(|s| s.as_str().unwrap().to_string())
            .collect(),
        ids: rows("ids").into_iter().map(|r| r.into_iter().map(|x| x as u32).collect()).collect(),
        embeddings: (rows("embeddings").into_iter())
            .map(|r| r.into_iter().map(|x| x as f32).collect())
            .collect(),
        cosines: rows("cosines"),
    }
}

/// Where `scripts/fetch_minilm.sh` puts the model by default.
fn model_dir() -> PathBuf {
    let cache = match std::env::var_os("MGN_CACHE") {
        Some(c) => PathBuf::from(c),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/mgn"),
    };
    let dir = cache.join("minilm");
    assert!(
        dir.join("model.safetensors").is_file() && dir.join("tokenizer.json").is_file(),
        "{} lacks all-MiniLM-L6-v2's files: run scripts/fetch_minilm.sh",
        dir.display()
    );
    dir
}

fn dynamic_plan() -> mgn_ir::Plan {
    root();
    let sizes: Vec<SizeVar> = ["B=4", "T=64"].iter().map(|s| s.parse().unwrap()).collect();
    let model = Path::new("models/minilm_l6.mgn");
    let opts = PlanOptions::infer();
    let (outcome, plan) = plan_path_dynamic(model, None, vec![], &sizes, &opts).expect("readable");
    plan.unwrap_or_else(|| panic!("{}", rendered(&outcome)))
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

fn matches_sentence_transformers(gpu: bool, tol: f64) {
    let f = fixture();
    let mut e = match Embedder::new(dynamic_plan(), &model_dir(), gpu) {
        Ok(e) => e,
        Err(why) if gpu && why.starts_with("no usable GPU") => {
            assert!(!mgn_gpu::testing::device_required(), "{why}");
            return mgn_gpu::testing::record_skip(&why);
        }
        Err(why) => panic!("{why}"),
    };
    for (s, want) in f.sentences.iter().zip(&f.ids) {
        assert_eq!(&e.ids(s).expect("tokenizes"), want, "the ids of {s:?}");
    }
    // Batches of at most 4 (the plan's bound), each padded to its longest sentence.
    let sentences: Vec<&str> = f.sentences.iter().map(String::as_str).collect();
    let got = e.embed(&sentences).expect("embeds");
    let mut worst = 0.0f64;
    for ((s, g), w) in sentences.iter().zip(&got).zip(&f.embeddings) {
        let err = rel_l2(g, w);
        assert!(err < tol, "{s:?}: rel. L2 {err:.2e} against sentence-transformers");
        worst = worst.max(err);
    }
    println!("on {}: worst rel. L2 {worst:.2e} against sentence-transformers", e.device);
    for (i, row) in f.cosines.iter().enumerate() {
        for (j, want) in row.iter().enumerate() {
            let c = cosine(&got[i], &got[j]);
            assert!((c - want).abs() < 5e-5, "cosine of {i} and {j}: {c:.6}, expected {want:.6}");
        }
    }
}

#[test]
fn embeddings_equal_sentence_transformers_on_the_cpu() {
    matches_sentence_transformers(false, 1e-5);
}

#[test]
fn embeddings_equal_sentence_transformers_on_the_gpu() {
    matches_sentence_transformers(true, 1e-4);
}
