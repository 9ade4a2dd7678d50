//! The rewrite engines preserve what a plan computes. Every model in `models/`, as an inference
//! plan and (when it has a loss) a training plan, is built with no rewrites, with the greedy
//! rules and — with the `egglog` feature (`cargo test -p mgn-compiler --features egglog`) — with
//! egglog's equality saturation; each plan runs on the CPU reference (`mgn-cpu`) in f64 from the
//! same parameters and inputs, and the outputs, loss and gradients must agree to roundoff.
//! Dropout is set to 0 where a model has an argument for it: its masks are drawn per step
//! number, which rewrites change.

use mgn_compiler::driver::plan_path;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_compiler::render::render;
use mgn_compiler::rewrite::Rewrites;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::{InitSpec, Mode, Plan};
use mgn_ir::tensor::{Data, RunOutput, Tensor};
use mgn_ir::Op;
use std::path::{Path, PathBuf};

/// One test per model, each with small arguments (B = 1 where the model's default is 1: a batch
/// of one is where the egglog rules find the most), and the list the coverage test reads.
macro_rules! models {
    ($($model:ident: [$($setting:literal),* $(,)?];)*) => {
        const MODELS: &[&str] = &[$(stringify!($model)),*];
        $(
            #[test]
            fn $model() {
                check(stringify!($model), &[$($setting),*]);
            }
        )*
    };
}

models! {
    digits_cnn: ["batch=3", "c1=4", "c2=6"];
    digits_mlp: ["batch=4", "hidden=8"];
    gpt2: ["vocab=13", "positions=8", "d=16", "n_layers=2", "heads=2", "pdrop=0.0", "B=2", "T=5"];
    minilm_l6: [
        "vocab=64", "d=32", "heads=4", "ffn=64", "n_layers=2", "max_positions=16",
        "hidden_dropout=0.0", "B=2", "T=8",
    ];
    mobilenet_v3_small: ["B=2", "size=32", "classes=5", "dropout=0.0"];
    resnet50: ["B=2", "size=32", "classes=5"];
    sd_unet_tiny: [
        "B=2", "size=8", "c0=4", "c1=8", "c2=16", "heads=2", "groups=2", "ctx_len=4", "ctx_dim=8",
    ];
    smollm2_135m: [
        "vocab=64", "d=32", "n_layers=2", "heads=4", "kv_heads=2", "head_dim=8", "hidden=48",
        "B=1", "T=8",
    ];
    smollm2_135m_decode: [
        "vocab=64", "d=32", "n_layers=2", "heads=4", "kv_heads=2", "head_dim=8", "hidden=48",
        "T=4", "cache=8",
    ];
    smolvla_expert: [
        "B=1", "chunk=4", "action_dim=4", "prefix=4", "d=32", "ffn=48", "n_layers=2", "heads=4",
        "kv_heads=2", "head_dim=8",
    ];
    tiny_bert: [
        "vocab=64", "d=32", "heads=4", "ffn=64", "n_layers=2", "max_positions=16",
        "hidden_dropout=0.0", "B=2", "T=8",
    ];
    tiny_gpt: ["vocab=11", "d=8", "depth=2", "heads=2", "block_size=8", "B=2", "T=5"];
    tiny_llama: [
        "vocab=13", "d=16", "n_layers=1", "heads=4", "kv_heads=2", "hidden=12", "B=2", "T=5",
    ];
    tiny_resnet: ["B=2", "classes=3", "width=4", "blocks=1", "size=8"];
    tiny_seq2seq: [
        "src_vocab=9", "tgt_vocab=7", "d=8", "heads=2", "enc_layers=1", "dec_layers=1",
        "max_len=8", "B=2", "S=4", "T=3",
    ];
    tiny_unet: [
        "B=2", "in_channels=2", "size=4", "ch=8", "groups=2", "heads=2", "ctx_len=3", "ctx_dim=4",
    ];
    tiny_whisper_encoder: ["B=2", "n_mels=8", "frames=16", "d=32", "heads=4", "n_layers=2"];
    vit_b_16: [
        "B=2", "size=32", "patch=16", "n_layers=1", "heads=2", "d=16", "mlp=32", "classes=5",
    ];
    whisper_tiny_encoder: [
        "B=1", "n_mels=8", "frames=16", "d=32", "heads=4", "ffn=64", "n_layers=2",
    ];
}

/// The engines this build has.
fn engines() -> Vec<Rewrites> {
    let all = [Rewrites::None, Rewrites::Greedy, Rewrites::Egglog];
    all.into_iter().filter(|e| e.available()).collect()
}

/// A small deterministic generator (reproducible noise).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64) / ((1u64 << 53) as f64)
    }
}

/// The plan of `model` built with `engine`, or `None` when the model has no loss to train.
fn build(path: &Path, settings: &[&str], mode: Mode, engine: Rewrites) -> Option<Plan> {
    let model = path.display();
    let settings: Vec<Setting> = settings.iter().map(|s| s.parse().expect("valid")).collect();
    let base = match mode {
        Mode::Infer => PlanOptions::infer(),
        Mode::Train => PlanOptions::train(&[], OptimizerSpec::default()),
    };
    let opts = PlanOptions { rewrites: engine, ..base };
    let (outcome, plan) = plan_path(path, None, settings, &opts).expect("readable");
    if mode == Mode::Train && outcome.diagnostics.iter().any(|d| d.code == "E0701") {
        return None;
    }
    let rendered: Vec<String> =
        outcome.diagnostics.iter().map(|d| render(&outcome.program.sources, d, false)).collect();
    assert!(outcome.ok(), "{model} ({mode:?}, {engine:?}): {}", rendered.join("\n"));
    plan
}

/// The repository's `models/`.
fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models")
}

/// Seeded inputs for `plan`: floats N(0, 1)-ish, integers within their valid range.
fn inputs(plan: &Plan) -> Vec<(String, Tensor)> {
    let mut rng = Lcg(99);
    let values = plan.inputs.iter().map(|(name, v)| {
        let s = &plan.steps[*v as usize];
        let n: usize = s.shape.iter().product();
        let data = if s.dtype.is_float() {
            Data::F64((0..n).map(|_| 2.0 * rng.next() - 1.0).collect())
        } else {
            let hi = plan.int_input_range(*v).unwrap_or(2);
            Data::I32((0..n).map(|_| (rng.next() * hi as f64) as i32).collect())
        };
        (name.clone(), Tensor { dtype: s.dtype, shape: s.shape.clone(), data })
    });
    values.collect()
}

/// Parameters for `plan` in f64, drawn as its initializers say (a normal as a uniform of the same
/// variance) and perturbed, so that constant initializations (norm weights 1, biases 0) cannot
/// hide a difference.
fn parameters(plan: &Plan) -> Vec<Tensor> {
    let mut rng = Lcg(7);
    let params = plan.params.iter().map(|p| {
        let mut u = || 2.0 * rng.next() - 1.0;
        let n = p.numel();
        let v: Vec<f64> = match p.init {
            // A table of constants: its steps are not rewritten, so any values compare the
            // engines as well.
            InitSpec::Computed(_) => (0..n).map(|_| u()).collect(),
            InitSpec::Constant(c) => (0..n).map(|_| c + 0.1 * u()).collect(),
            InitSpec::Normal { mean, std } => {
                (0..n).map(|_| mean + std * 3f64.sqrt() * u()).collect()
            }
            InitSpec::Uniform { low, high } => {
                (0..n).map(|_| low + (high - low) * (u() + 1.0) / 2.0 + 0.01 * u()).collect()
            }
        };
        let data = if p.dtype.is_float() { Data::F64(v) } else { Data::I32(vec![0; n]) };
        Tensor { dtype: p.dtype, shape: p.shape.clone(), data }
    });
    params.collect()
}

/// One run of `plan` on the CPU reference with `params`, step by step as the runtime's session
/// runs it (less freeing values and updating batch-norm statistics, which no result reads).
fn run(plan: &Plan, params: &[Tensor], inputs: &[(String, Tensor)]) -> RunOutput {
    let training = plan.mode == Mode::Train;
    let mut values: Vec<Option<Tensor>> = Vec::with_capacity(plan.steps.len());
    for (i, s) in plan.steps.iter().enumerate() {
        let computed = match &s.op {
            Op::Input { .. } | Op::Param { .. } => None,
            op => {
                let args: Vec<&Tensor> =
                    s.inputs.iter().map(|&x| value(plan, &values, params, inputs, x)).collect();
                let ctx = mgn_cpu::Ctx { training, seed: 0, node: i as u32 };
                let t = mgn_cpu::eval(op, &args, s.dtype, &s.shape, &ctx);
                Some(t.unwrap_or_else(|e| panic!("{} (step {i}, at {})", e, s.loc)))
            }
        };
        values.push(computed);
    }
    let at = |x: u32| value(plan, &values, params, inputs, x).clone();
    RunOutput {
        outputs: plan.outputs.iter().map(|(n, x)| (n.clone(), at(*x))).collect(),
        loss: plan.loss.map(at),
        grads: plan.grads.iter().map(|(p, x)| (plan.params[*p].name.clone(), at(*x))).collect(),
    }
}

/// The value of step `x`: an input or parameter as given, else what the step computed.
fn value<'a>(
    plan: &Plan,
    values: &'a [Option<Tensor>],
    params: &'a [Tensor],
    inputs: &'a [(String, Tensor)],
    x: u32,
) -> &'a Tensor {
    match &plan.steps[x as usize].op {
        Op::Param { index } => &params[*index],
        Op::Input { name } => &inputs.iter().find(|(n, _)| n == name).expect("an input").1,
        _ => values[x as usize].as_ref().expect("computed before it is read"),
    }
}

/// The two tensors agree to roundoff.
fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape, b.shape, "{what}: shapes");
    for (k, (u, v)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        assert!((u - v).abs() <= 1e-10 * (1.0 + v.abs()), "{what}[{k}]: {u} vs {v}");
    }
}

/// Steps that compute something on the GPU: not inputs, parameters or reshapes (views).
fn computing(plan: &Plan) -> usize {
    let views = |op: &Op| matches!(op, Op::Input { .. } | Op::Param { .. } | Op::Reshape);
    plan.steps.iter().filter(|s| !views(&s.op)).count()
}

/// One sample of one token (`mgnc bench`'s minimal shape), where every attention's head permute
/// moves only axes of size 1: both engines make them reshapes.
#[test]
fn one_token_at_batch_one() {
    let small = ["vocab=64", "d=32", "heads=4", "n_layers=2", "B=1", "T=1"];
    let gqa = ["kv_heads=2", "head_dim=8", "hidden=48"];
    let bert = ["ffn=64", "max_positions=16", "hidden_dropout=0.0"];
    for counts in [
        check("smollm2_135m", &[&small[..], &gqa[..]].concat()),
        check("minilm_l6", &[&small[..], &bert[..]].concat()),
    ] {
        // The inference plan's: none, then greedy computing fewer, then egglog (when built)
        // computing no more than greedy.
        let infer = &counts[0];
        assert!(infer[1] < infer[0], "{counts:?}");
        assert!(infer.len() < 3 || infer[2] <= infer[1], "{counts:?}");
    }
}

#[test]
fn every_model_is_tested() {
    for f in std::fs::read_dir(models()).expect("models/") {
        let f = f.expect("an entry").path();
        let name = f.file_stem().expect("a file name").to_string_lossy().to_string();
        if f.extension().is_some_and(|e| e == "mgn") {
            assert!(MODELS.contains(&name.as_str()), "{}: add it to `models!`", f.display());
        }
    }
}

/// Both plans of `model`, built by every engine, give the same results; each engine computes
/// no more steps than the one before it (none, greedy, egglog). Returns those step counts, for
/// the inference plan and the training plan if there is one.
fn check(model: &str, settings: &[&str]) -> Vec<Vec<usize>> {
    check_path(&models().join(format!("{model}.mgn")), settings)
}

/// [`check`] of the program at `path`.
fn check_path(path: &Path, settings: &[&str]) -> Vec<Vec<usize>> {
    let model = path.display();
    let mut all = Vec::new();
    for mode in [Mode::Infer, Mode::Train] {
        let plans: Vec<(Rewrites, Plan)> = (engines().into_iter())
            .filter_map(|e| build(path, settings, mode, e).map(|p| (e, p)))
            .collect();
        let Some((_, reference)) = plans.first() else { continue };
        let (params, data) = (parameters(reference), inputs(reference));
        let want = run(reference, &params, &data);
        for (engine, plan) in &plans[1..] {
            let what = format!("{model} ({mode:?}, {engine:?})");
            assert_eq!(plan.params, reference.params, "{what}: the parameter table");
            let got = run(plan, &params, &data);
            assert_eq!(got.outputs.len(), want.outputs.len(), "{what}: outputs");
            for ((n, x), (_, y)) in got.outputs.iter().zip(&want.outputs) {
                assert_close(x, y, &format!("{what}: output {n}"));
            }
            if let (Some(x), Some(y)) = (&got.loss, &want.loss) {
                assert_close(x, y, &format!("{what}: loss"));
            }
            assert_eq!(got.grads.len(), want.grads.len(), "{what}: gradients");
            for ((n, x), (m, y)) in got.grads.iter().zip(&want.grads) {
                assert_eq!(n, m, "{what}: gradient order");
                assert_close(x, y, &format!("{what}: gradient of {n}"));
            }
        }
        let counts: Vec<usize> = plans.iter().map(|(_, p)| computing(p)).collect();
        assert!(counts.windows(2).all(|w| w[1] <= w[0]), "{model} ({mode:?}): {counts:?}");
        all.push(counts);
    }
    all
}

/// The test programs of masks and selection, the added point-wise functions, filled tensors,
/// scans and top-k routing, and the weighted cross-entropy: ops that the egglog engine encodes
/// as opaque terms, and which no model in `models/` uses yet.
#[test]
fn programs_of_selection_scans_and_weighted_losses() {
    let valid = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/valid");
    for p in ["masks", "activations", "fill", "routing", "weighted_loss"] {
        check_path(&valid.join(format!("{p}.mgn")), &[]);
    }
}
