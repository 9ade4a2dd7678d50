//! Decoding with a KV cache (models/smollm2_135m_decode.mgn at a small config, random
//! weights): prefill and token-by-token decoding against the cache give the logits of one full
//! forward of the training model over the whole sequence — on the CPU (rel. L2 < 1e-5) and on
//! the GPU (< 1e-4). The state lives in the session from one run to the next; `reset` empties
//! it; the two plans share it through `copy_state_to`.

use mgn_compiler::lower::PlanOptions;
use mgn_compiler::{driver::plan_path, elab::Setting};
use mgn_ir::tensor::Tensor;
use mgn_runtime::{Generator, Plan, Sampler, SamplerConfig, Session};
use mgn_tests::{on_gpu, rendered, root};
use std::path::Path;

/// A 2-layer SmolLM2 with grouped KV heads: every path of the real one, small.
const SMALL: &[&str] = &[
    "vocab=40",
    "d=32",
    "n_layers=2",
    "heads=4",
    "kv_heads=2",
    "head_dim=8",
    "hidden=48",
    "rope_theta=100.0",
];
const SEQ: usize = 11;

fn plan(model: &str, extra: &[&str]) -> Plan {
    root();
    let settings: Vec<Setting> =
        SMALL.iter().chain(extra).map(|s| s.parse().expect("valid setting")).collect();
    let opts = PlanOptions::infer();
    let (outcome, plan) = plan_path(Path::new(model), None, settings, &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    plan.expect("a plan")
}

fn session(plan: Plan, gpu: bool) -> Option<Session> {
    let mut s = Session::try_new(plan, 5).expect("a session");
    (!gpu || on_gpu(&mut s)).then_some(s)
}

fn tokens() -> Vec<i32> {
    (0..SEQ as i32).map(|i| (i * 7 + 3) % 40).collect()
}

/// The training model's logits over the whole sequence at once, row by row.
fn full_forward(gpu: bool) -> Option<Vec<Vec<f32>>> {
    let t = format!("T={SEQ}");
    let mut s = session(plan("models/smollm2_135m.mgn", &[&t]), gpu)?;
    let ids = Tensor::i32(vec![1, SEQ], tokens());
    let out = s.run(&[("input_ids", &ids)]).expect("runs");
    let logits = out.outputs.into_iter().find(|(n, _)| n == "logits").expect("logits").1;
    let v: Vec<f32> = logits.to_f64_vec().into_iter().map(|x| x as f32).collect();
    Some(v.chunks(40).map(<[f32]>::to_vec).collect())
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

fn generator(chunk: Option<usize>, gpu: bool) -> Option<Generator> {
    let decode = session(plan("models/smollm2_135m_decode.mgn", &["cache=16"]), gpu)?;
    let prefill = match chunk {
        Some(c) => {
            let t = format!("T={c}");
            Some(session(plan("models/smollm2_135m_decode.mgn", &["cache=16", &t]), gpu)?)
        }
        None => None,
    };
    Some(Generator::new(prefill, decode).expect("the plans follow the convention"))
}

fn decode_matches_full_forward(gpu: bool, tol: f64) {
    let Some(want) = full_forward(gpu) else { return };
    let ids = tokens();
    // Token by token through the decode plan alone.
    let Some(mut g) = generator(None, gpu) else { return };
    for (t, &id) in ids.iter().enumerate() {
        let got = g.step(id).expect("a step");
        let e = rel_l2(&got, &want[t]);
        assert!(e < tol, "position {t}: rel. L2 {e:.2e} against the full forward");
    }
    assert_eq!(g.position(), SEQ);
    // A prompt of 7 through a prefill chunk of 4 (one full chunk, one padded), then decoding.
    let Some(mut g) = generator(Some(4), gpu) else { return };
    for round in 0..2 {
        let last = g.prefill(&ids[..7]).expect("prefill");
        let e = rel_l2(&last, &want[6]);
        assert!(e < tol, "round {round}: prefill's last logits, rel. L2 {e:.2e}");
        for (t, &id) in ids.iter().enumerate().skip(7) {
            let e = rel_l2(&g.step(id).expect("a step"), &want[t]);
            assert!(e < tol, "round {round}, position {t} after prefill: rel. L2 {e:.2e}");
        }
        // Emptied, the cache gives the same logits again.
        g.reset().expect("reset");
    }
    // A token through the decode plan, the rest of the prompt through the prefill plan, then
    // decoding: the cache moves to the prefill session and back.
    let e = rel_l2(&g.step(ids[0]).expect("a step"), &want[0]);
    assert!(e < tol, "position 0 before prefill: rel. L2 {e:.2e}");
    let e = rel_l2(&g.prefill(&ids[1..7]).expect("prefill"), &want[6]);
    assert!(e < tol, "prefill after a decoded token: rel. L2 {e:.2e}");
    for (t, &id) in ids.iter().enumerate().skip(7) {
        let e = rel_l2(&g.step(id).expect("a step"), &want[t]);
        assert!(e < tol, "position {t} after a mixed prompt: rel. L2 {e:.2e}");
    }
}

/// The decode model built dynamic in T (`--dynamic T=1..8`).
fn dynamic_plan() -> Plan {
    root();
    let settings: Vec<Setting> =
        SMALL.iter().chain(&["cache=16"]).map(|s| s.parse().expect("valid setting")).collect();
    let sizes = ["T=8".parse().expect("a size")];
    let opts = PlanOptions::infer();
    let model = Path::new("models/smollm2_135m_decode.mgn");
    let (outcome, plan) =
        mgn_compiler::driver::plan_path_dynamic(model, None, settings, &sizes, &opts)
            .expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    plan.expect("a plan")
}

/// A prompt through a prefill plan dynamic in T runs as it is, with no padding; and one
/// dynamic plan serves as both prefill (a chunk of up to 8) and decode (T = 1).
fn dynamic_prefill_matches_full_forward(gpu: bool, tol: f64) {
    let Some(want) = full_forward(gpu) else { return };
    let ids = tokens();
    let Some(decode) = session(plan("models/smollm2_135m_decode.mgn", &["cache=16"]), gpu) else {
        return;
    };
    let Some(prefill) = session(dynamic_plan(), gpu) else { return };
    let mut g = Generator::new(Some(prefill), decode).expect("the plans follow the convention");
    let Some(alone) = session(dynamic_plan(), gpu) else { return };
    let mut one = Generator::new(None, alone).expect("a dynamic plan decodes too");
    for g in [&mut g, &mut one] {
        for (start, end) in [(0, 3), (3, 10)] {
            let e = rel_l2(&g.prefill(&ids[start..end]).expect("prefill"), &want[end - 1]);
            assert!(e < tol, "prefill {start}..{end}: rel. L2 {e:.2e}");
        }
        let e = rel_l2(&g.step(ids[10]).expect("a step"), &want[10]);
        assert!(e < tol, "the token after: rel. L2 {e:.2e}");
    }
}

#[test]
fn a_dynamic_prefill_plan_equals_the_full_forward_on_the_cpu() {
    dynamic_prefill_matches_full_forward(false, 1e-5);
}

#[test]
fn a_dynamic_prefill_plan_equals_the_full_forward_on_the_gpu() {
    dynamic_prefill_matches_full_forward(true, 1e-4);
}

#[test]
fn decoding_against_the_cache_equals_the_full_forward_on_the_cpu() {
    decode_matches_full_forward(false, 1e-5);
}

#[test]
fn decoding_against_the_cache_equals_the_full_forward_on_the_gpu() {
    decode_matches_full_forward(true, 1e-4);
}

#[test]
fn generation_is_deterministic_and_refuses_what_does_not_fit() {
    let Some(mut g) = generator(Some(4), false) else { return };
    let mut greedy = Sampler::new(SamplerConfig::GREEDY).expect("greedy");
    let a = g.generate(&tokens()[..5], 6, &mut greedy).expect("generates");
    g.reset().expect("reset");
    let b = g.generate(&tokens()[..5], 6, &mut greedy).expect("generates");
    assert_eq!(a, b, "greedy decoding from an empty cache repeats itself");
    assert!(a.iter().all(|&t| (0..40).contains(&t)));
    assert_eq!(g.position(), 10, "5 prompt tokens and 5 fed back (the 6th is not run)");
    let e = g.prefill(&[1; 7]).expect_err("7 more do not fit in 16");
    assert!(e.to_string().contains("the cache holds 16 positions: 10 are used"), "{e}");
    let e = g.step(40).expect_err("outside the vocabulary");
    assert!(e.to_string().contains("token id 40 is outside the vocabulary"), "{e}");
    let training = session(plan("models/smollm2_135m.mgn", &[]), false).expect("cpu");
    let decode = session(plan("models/smollm2_135m_decode.mgn", &[]), false).expect("cpu");
    let e = Generator::new(Some(training), decode).err().expect("no cache, no pos");
    assert!(e.to_string().contains("needs an input `pos: i32[]`"), "{e}");
}

#[test]
fn state_moves_between_sessions_by_name_and_checks_its_type() {
    let mut a = session(plan("models/smollm2_135m_decode.mgn", &["cache=16"]), false).unwrap();
    let mut b = session(plan("models/smollm2_135m_decode.mgn", &["cache=16"]), false).unwrap();
    let names = a.state_names().iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(names.len(), 4, "k and v caches of 2 layers: {names:?}");
    assert!(names[0].ends_with("self_attn.k_cache"), "{names:?}");
    let ids = Tensor::i32(vec![1, 1], vec![3]);
    let pos = Tensor::i32(vec![], vec![0]);
    a.run(&[("input_ids", &ids), ("pos", &pos)]).expect("runs");
    let written = a.state().expect("state");
    assert!(written[0].1.to_f64_vec().iter().any(|&v| v != 0.0), "row 0 of the cache is written");
    a.copy_state_to(&mut b).expect("copies");
    assert_eq!(b.state().expect("state"), written);
    let wrong = vec![(names[0].clone(), Tensor::f32(vec![2], vec![0.0; 2]))];
    let e = b.set_state(&wrong).expect_err("wrong shape");
    assert!(e.to_string().contains("is f32[1, 2, 16, 8]"), "{e}");
    let e = b.set_state(&[("nope".into(), Tensor::f32(vec![1], vec![0.0]))]).expect_err("unknown");
    assert!(e.to_string().contains("`nope` is not state"), "{e}");
    b.reset_state().expect("reset");
    assert!(b.state().unwrap()[0].1.to_f64_vec().iter().all(|&v| v == 0.0));
}

/// The smallest stateful model: a running sum that lives in the session, run three times.
fn running_sum(gpu: bool) {
    let text = "model RunningSum {
    input x: f32[3]
    total = state f32[3]
    forward {
        let t = self.total + x
        self.total = t
        output y = t * 1.0
    }
}
";
    let dir = std::env::temp_dir().join(format!("mgn-state-{}-{gpu}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("sum.mgn");
    std::fs::write(&file, text).expect("written");
    let (outcome, plan) = plan_path(&file, None, vec![], &PlanOptions::infer()).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let plan = plan.expect("a plan");
    assert_eq!(plan.state_writes.len(), 1);
    assert!(!plan.params[0].persistent, "state is not saved in checkpoints");
    let Some(mut s) = session(plan, gpu) else { return };
    let x = Tensor::f32(vec![3], vec![1.0, 2.0, -0.5]);
    for k in 1..=3 {
        let out = s.run(&[("x", &x)]).expect("runs");
        let want: Vec<f64> = [1.0, 2.0, -0.5].iter().map(|v| v * k as f64).collect();
        assert_eq!(out.outputs[0].1.to_f64_vec(), want, "run {k} sees the sum of the runs before");
    }
    s.reset_state().expect("reset");
    assert_eq!(s.run(&[("x", &x)]).expect("runs").outputs[0].1.to_f64_vec(), [1.0, 2.0, -0.5]);
}

#[test]
fn state_lives_from_one_run_to_the_next_on_the_cpu() {
    running_sum(false);
}

#[test]
fn state_lives_from_one_run_to_the_next_on_the_gpu() {
    running_sum(true);
}

/// The decode plan under the mixed f16 policy (its products take the RMS norm and its cast to
/// f16: `rewrite/normed_products.rs`) decodes on the GPU what it decodes on the CPU, token by
/// token. Both round the same operands to f16; a value the two compute an f32 ulp apart may
/// round to the neighbouring half, hence a looser bound than f32's.
#[test]
fn mixed_precision_decoding_on_the_gpu_matches_the_cpu() {
    root();
    let settings: Vec<Setting> =
        SMALL.iter().chain(&["cache=16"]).map(|s| s.parse().expect("valid setting")).collect();
    let opts =
        PlanOptions { precision: mgn_ir::precision::Precision::MixedF16, ..PlanOptions::infer() };
    let path = Path::new("models/smollm2_135m_decode.mgn");
    let (outcome, plan) = plan_path(path, None, settings, &opts).expect("readable");
    assert!(outcome.ok(), "{}", rendered(&outcome));
    let plan = plan.expect("a plan");
    let Some(gpu) = session(plan.clone(), true) else { return };
    let cpu = session(plan, false).expect("a CPU session");
    let mut g = Generator::new(None, gpu).expect("a decode plan");
    let mut c = Generator::new(None, cpu).expect("a decode plan");
    for (t, &id) in tokens().iter().enumerate() {
        let (got, want) = (g.step(id).expect("a step"), c.step(id).expect("a step"));
        let e = rel_l2(&got, &want);
        assert!(e < 2e-3, "position {t}: rel. L2 {e:.2e} against the CPU");
    }
}
