//! `mgnc generate` against Hugging Face `transformers` and the runtime's own `Generator`, on the
//! fixture of tests/fixtures/generate (make.py writes it: a tiny Llama with seeded weights, a
//! byte-level BPE tokenizer with a chat template, and what `transformers` makes of them):
//! greedy ids equal `transformers`' and the `Generator`'s, on the CPU and the GPU; prompts
//! tokenize and outputs decode as `transformers` does; the chat template renders as
//! `apply_chat_template` renders it; generation stops at EOS; bad input is refused by name.

mod common;

use common::{mgnc, ok, refused, scratch, text};
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::{Generator, Restore, Sampler, SamplerConfig, Session};
use serde_json::Value;

const DIR: &str = "tests/fixtures/generate";
const MODEL: &str = "tests/fixtures/generate/tiny.mgn";
const WEIGHTS: &str = "tests/fixtures/generate/tiny.safetensors";

fn expected() -> Value {
    let path = common::root().join(DIR).join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("expected.json")).expect("JSON")
}

fn ids_of(v: &Value) -> Vec<i64> {
    v.as_array().expect("a list").iter().map(|i| i.as_i64().expect("an id")).collect()
}

fn list(ids: &[i64]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// `mgnc generate` on the fixture with these arguments; its stdout (it must succeed).
fn generate(args: &[&str]) -> (String, String) {
    let base = ["generate", MODEL, "--weights", WEIGHTS];
    let out = mgnc(&[&base[..], args].concat());
    let err = ok(&out);
    (text(&out.stdout), err)
}

/// The ids the runtime's `Generator` chooses greedily for the same plans, built in-process.
fn runtime_greedy(prompt: &[i32], n: usize, chunk: usize) -> Vec<i32> {
    let root = common::root();
    let plan = |t: usize| {
        let decode = Some("TinyLlamaDecode".to_string());
        let settings = vec![Setting::new("T", t.to_string())];
        let (outcome, plan) = mgn_compiler::driver::plan_path(
            &root.join(MODEL),
            decode,
            settings,
            &PlanOptions::infer(),
        )
        .expect("readable");
        assert!(outcome.ok(), "the fixture builds");
        plan.expect("a plan")
    };
    let session = |t: usize| {
        let w = root.join(WEIGHTS);
        Session::from_checkpoint(plan(t), 0, &w, MatchMode::Strict, Restore::Weights).unwrap().0
    };
    let mut g = Generator::new(Some(session(chunk)), session(1)).expect("a generator");
    let mut greedy = Sampler::new(SamplerConfig::GREEDY).expect("greedy");
    g.generate(prompt, n, &mut greedy).expect("generates")
}

#[test]
fn greedy_ids_equal_transformers_and_the_runtime_generator() {
    let e = expected();
    let prompt = ids_of(&e["prompt_ids"]);
    let want = ids_of(&e["prompt_ids_greedy"]);
    let prompt32: Vec<i32> = prompt.iter().map(|&i| i as i32).collect();
    let runtime: Vec<i64> =
        runtime_greedy(&prompt32, want.len(), 4).into_iter().map(i64::from).collect();
    assert_eq!(runtime, want, "the runtime's Generator against transformers");
    let n = want.len().to_string();
    let prompt_list = list(&prompt);
    // The prompt whole, in padded chunks of 2, token by token, and through one plan dynamic in
    // T (chunks of 2 at their own length, then decoding): the same ids.
    let chunks = [["128", ""], ["2", ""], ["1", ""], ["2", "--one-plan"], ["128", "--one-plan"]];
    for [chunk, how] in chunks {
        let mut args = vec!["--prompt-ids", &prompt_list, "--tokens", &n, "--backend", "cpu"];
        args.extend(["--chunk", chunk]);
        args.extend(Some(how).filter(|h| !h.is_empty()));
        let (out, err) = generate(&args);
        assert_eq!(out.trim_end(), list(&want), "chunk {chunk} {how}: {err}");
        assert!(err.contains("TinyLlamaDecode on the CPU: 5 prompt tokens in"), "{err}");
        assert!(err.contains("12 tokens generated") && err.contains("tokens/s"), "{err}");
        assert!(err.contains("ms per token (median of 11)"), "{err}");
    }
}

#[test]
fn text_is_tokenized_and_decoded_as_transformers_does() {
    let e = expected();
    let prompt = e["text"].as_str().unwrap();
    let n = ids_of(&e["text_greedy"]).len().to_string();
    let common = ["--tokenizer", DIR, "--prompt", prompt, "--tokens", &n, "--backend", "cpu"];
    let (out, _) = generate(&[&common[..], &["--ids", "--echo"]].concat());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, [list(&ids_of(&e["text_ids"])), list(&ids_of(&e["text_greedy"]))]);
    // As text: what `decode(ids, skip_special_tokens=True)` gives, stray bytes and all.
    let (out, _) = generate(&common);
    assert_eq!(out, format!("{}\n", e["text_out"].as_str().unwrap()));
    // Multi-byte characters encode as transformers encodes them (BOS first).
    let unicode = e["unicode"].as_str().unwrap();
    let args = ["--tokenizer", DIR, "--prompt", unicode, "--tokens", "0", "--ids", "--echo"];
    let (out, _) = generate(&[&args[..], &["--backend", "cpu"]].concat());
    assert_eq!(out.lines().next(), Some(list(&ids_of(&e["unicode_ids"])).as_str()));
}

#[test]
fn the_chat_template_renders_as_apply_chat_template() {
    let e = expected();
    let chat = ["--tokenizer", DIR, "--prompt", "hello world", "--chat", "--backend", "cpu"];
    let (out, _) = generate(&[&chat[..], &["--tokens", "0", "--echo"]].concat());
    assert_eq!(out, format!("{}\n", e["chat_user"].as_str().unwrap()));
    let system = ["--system", "You are terse. ", "--tokens", "0", "--echo"];
    let (out, _) = generate(&[&chat[..], &system].concat());
    assert_eq!(out, format!("{}\n", e["chat_system"].as_str().unwrap()));
    // The rendered text tokenizes without adding BOS again, as apply_chat_template does.
    let (out, _) = generate(&[&chat[..], &["--tokens", "0", "--echo", "--ids"]].concat());
    assert_eq!(out.lines().next(), Some(list(&ids_of(&e["chat_ids"])).as_str()));
}

/// The chat continuation reaches EOS (id 2) after four tokens: generation stops there, with
/// EOS among the ids and not in the text.
fn stops_at_eos(backend: &str) {
    let e = expected();
    let chat = ["--tokenizer", DIR, "--prompt", "hello world", "--chat", "--tokens", "12"];
    let (out, err) = generate(&[&chat[..], &["--backend", backend, "--ids"]].concat());
    assert_eq!(out.trim_end(), list(&ids_of(&e["chat_greedy"])), "{err}");
    assert!(err.contains("5 tokens generated") && err.contains("end-of-sequence"), "{err}");
    let (out, _) = generate(&[&chat[..], &["--backend", backend]].concat());
    assert_eq!(out, format!("{}\n", e["chat_text"].as_str().unwrap()));
}

#[test]
fn generation_stops_at_the_end_of_sequence_token() {
    stops_at_eos("cpu");
}

/// The GPU (lavapipe here) chooses the same ids; skipped where no Vulkan device is listed.
#[test]
fn the_gpu_gives_the_same_greedy_ids() {
    if cfg!(any(target_os = "macos", target_os = "ios")) || !mgn_gpu::testing::device_listed() {
        return;
    }
    let e = expected();
    let prompt = list(&ids_of(&e["prompt_ids"]));
    let (out, err) = generate(&["--prompt-ids", &prompt, "--tokens", "12", "--backend", "vulkan"]);
    assert_eq!(out.trim_end(), list(&ids_of(&e["prompt_ids_greedy"])), "{err}");
    assert!(err.contains("first runs (pipelines compiled)"), "{err}");
    assert!(!err.contains("on the CPU"), "{err}");
    let one = ["--prompt-ids", &prompt, "--tokens", "12", "--backend", "vulkan", "--one-plan"];
    let (out, err) = generate(&one);
    assert_eq!(out.trim_end(), list(&ids_of(&e["prompt_ids_greedy"])), "{err}");
    stops_at_eos("vulkan");
}

#[test]
fn sampling_is_seeded() {
    let sample = |seed: &str| {
        let args = ["--prompt-ids", "1,2,3", "--tokens", "16", "--backend", "cpu", "--top-k", "50"];
        generate(&[&args[..], &["--temperature", "1.5", "--seed", seed]].concat()).0
    };
    assert_eq!(sample("3"), sample("3"));
    assert_ne!(sample("3"), sample("4"));
}

/// `mgnc import x.gguf` writes `x.tokenizer.json` and `x.tokenizer_config.json`: found as a pair.
#[test]
fn an_imported_tokenizer_finds_its_config_by_its_name() {
    let dir = scratch("generate-import-names");
    let root = common::root().join(DIR);
    std::fs::copy(root.join("tokenizer.json"), dir.join("x.tokenizer.json")).unwrap();
    std::fs::copy(root.join("tokenizer_config.json"), dir.join("x.tokenizer_config.json")).unwrap();
    let tok = dir.join("x.tokenizer.json");
    let args = ["--tokenizer", tok.to_str().unwrap(), "--prompt", "hello world", "--chat"];
    let (out, _) =
        generate(&[&args[..], &["--tokens", "12", "--ids", "--backend", "cpu"]].concat());
    assert_eq!(out.trim_end(), list(&ids_of(&expected()["chat_greedy"])));
}

/// A tokenizer.json without a post-processor (as GGUF's may be) still starts an encoding with
/// BOS when its config says `add_bos_token: true`, and only then.
#[test]
fn add_bos_token_in_the_config_puts_bos_first() {
    let dir = scratch("generate-add-bos");
    let root = common::root().join(DIR);
    let mut tok: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tokenizer.json")).unwrap())
            .unwrap();
    tok["post_processor"] = Value::Null;
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let e = expected();
    let text_ids = ids_of(&e["text_ids"]);
    for (add, want) in [(false, &text_ids[1..]), (true, &text_ids[..])] {
        config["add_bos_token"] = Value::Bool(add);
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        let args = ["--tokenizer", dir.to_str().unwrap(), "--prompt", "The cat sat", "--ids"];
        let (out, _) =
            generate(&[&args[..], &["--echo", "--tokens", "0", "--backend", "cpu"]].concat());
        assert_eq!(out.lines().next(), Some(list(want).as_str()), "add_bos_token {add}");
    }
}

/// SmolLM2's hand-written decode model generates (at a small config, its initializers' weights).
#[test]
fn the_hand_written_smollm2_decode_model_generates() {
    let mut args = vec!["generate", "models/smollm2_135m_decode.mgn", "--prompt-ids", "1,5,9"];
    for s in ["vocab=64", "d=32", "n_layers=2", "heads=4", "kv_heads=2", "head_dim=8"] {
        args.extend(["--set", s]);
    }
    args.extend(["--set", "hidden=48", "--cache", "16", "--tokens", "14", "--backend", "cpu"]);
    let out = mgnc(&args);
    let err = ok(&out);
    let ids: Vec<i64> = text(&out.stdout).trim().split(',').map(|i| i.parse().unwrap()).collect();
    assert!(ids.len() == 14 && ids.iter().all(|i| (0..64).contains(i)), "{ids:?}");
    assert!(err.contains("SmolLM2Decode on the CPU: 3 prompt tokens"), "{err}");
    // 3 + 14 - 1 = 16 positions fill the cache; one more token does not fit.
    let tokens = args.len() - 3;
    args[tokens] = "15";
    let err = refused(&mgnc(&args));
    assert!(err.contains("need 17 positions") && err.contains("holds 16"), "{err}");
}

fn refuses(args: &[&str], says: &[&str]) {
    let err = refused(&mgnc(&[&["generate"], args, &["--backend", "cpu"]].concat()));
    for s in says {
        assert!(err.contains(s), "expected `{s}` in: {err}");
    }
}

#[test]
fn bad_input_is_refused_naming_what_and_where() {
    let m = [MODEL, "--weights", WEIGHTS];
    refuses(&[&m[..], &["--tokenizer", "nope/", "--prompt", "hi"]].concat(), &["no tokenizer at"]);
    refuses(&[&m[..], &["--prompt", "hi"]].concat(), &["--prompt needs --tokenizer"]);
    let no_pos = [MODEL, "--model", "TinyLlamaFull", "--prompt-ids", "1,2"];
    refuses(&no_pos, &["`TinyLlamaFull` in `tests/fixtures/generate/tiny.mgn`", "input `pos"]);
    refuses(&["models/tiny_llama.mgn", "--prompt-ids", "1"], &["no model in", "`pos: i32[]`"]);
    let long = [&m[..], &["--prompt-ids", "1,2,3", "--tokens", "70"]].concat();
    refuses(&long, &["need 72 positions", "holds 64", "`--cache 72` (or `--set cache=72`)"]);
    let bad = [MODEL, "--weights", "tests/fixtures/generate/tokenizer.json", "--prompt-ids", "1"];
    refuses(&bad, &["tests/fixtures/generate/tokenizer.json", "not a safetensors checkpoint"]);
    // SmolLM2's decode model at the fixture's sizes with one layer more.
    let mut deeper = vec!["models/smollm2_135m_decode.mgn", "--prompt-ids", "1"];
    for s in ["vocab=320", "d=32", "heads=4", "kv_heads=2", "head_dim=8", "hidden=48"] {
        deeper.extend(["--set", s]);
    }
    deeper.extend(["--set", "n_layers=3", "--weights", WEIGHTS]);
    let missing = "`model.layers.2.self_attn.q_proj.weight` (f32[32, 32]) is not in the file";
    refuses(&deeper, &[WEIGHTS, missing]);
    let dir = scratch("generate-no-template");
    std::fs::copy(common::root().join(DIR).join("tokenizer.json"), dir.join("tokenizer.json"))
        .unwrap();
    let chat = [&m[..], &["--tokenizer", dir.to_str().unwrap(), "--prompt", "hi", "--chat"]];
    refuses(&chat.concat(), &["--chat needs a chat template", "tokenizer.json"]);
    refuses(&[&m[..], &["--prompt-ids", "1", "--set", "T=4"]].concat(), &["`T` is generate's"]);
    refuses(&[&m[..], &["--prompt-ids", "1,x"]].concat(), &["--prompt-ids `1,x`"]);
    refuses(&[&m[..], &["--prompt-ids", "1,400"]].concat(), &["token id 400 is outside"]);
    refuses(&[MODEL, "--weights", "nope.safetensors", "--prompt-ids", "1"], &["nope.safetensors"]);
    let two = scratch("generate-two-decoders").join("two.mgn");
    let model = |name: &str| {
        let body = "    input input_ids: i32[1, T]\n    input pos: i32[]\n    forward {\n        \
                    output logits = cast(input_ids, f32)\n    }\n}\n";
        format!("model {name}(T: dim = 1) {{\n{body}")
    };
    std::fs::write(&two, model("A") + "\n" + &model("B")).unwrap();
    let says = ["several models with an input `pos` (A, B)", "--model"];
    refuses(&[two.to_str().unwrap(), "--prompt-ids", "1"], &says);
}

#[test]
fn quantize_packs_the_weights_of_both_plans_as_they_load() {
    for extra in [&[][..], &["--one-plan"][..]] {
        let args = ["--prompt-ids", "1,2,3", "--tokens", "5", "--ids", "--backend", "cpu"];
        let (out, err) = generate(&[&args[..], &["--quantize", "q8_0"], extra].concat());
        assert_eq!(out.trim().split(',').count(), 5, "{out}");
        assert!(err.contains("quantized 1 weight to q8_0"), "{err}");
        assert!(err.contains("model.embed_tokens.weight: f32 -> q8_0"), "{err}");
    }
}
