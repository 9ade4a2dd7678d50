//! Graph IR → Plan: keeps the nodes the plan's results need (in order), renumbers them as
//! steps, and records each step's source location in the user's model.

use crate::autodiff::{differentiate, is_frozen, GradOptions};
use crate::graph::{to_steps, Graph, NodeId};
use crate::rewrite::{rewrite, Rewrites};
use crate::source::SourceMap;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::{Mode, ParamSpec, Plan};
use mgn_ir::precision::Precision;
use mgn_ir::valid::MAX_ELEMENTS;
use mgn_ir::DType;
use mgn_syntax::{Diagnostic, Span};

/// What a plan computes.
pub struct PlanOptions<'a> {
    pub mode: Mode,
    /// Include the loss (and the inputs it reads). Training plans always do.
    pub loss: bool,
    /// Include gradients of the trained parameters. Training plans always do.
    pub grads: bool,
    pub frozen: &'a [String],
    pub optimizer: OptimizerSpec,
    /// The rewrite engine (`rewrite/`): greedy by default; none only to compare against it.
    pub rewrites: Rewrites,
    /// The precision policy (`precision.rs`): f32 by default.
    pub precision: Precision,
    /// `--quantize TYPE` (`quantize.rs`): the packed type of the weights the plan does not
    /// train. `None` by default.
    pub quantize: Option<DType>,
    /// Restricts `quantize` to these parameters: `mgnc train`'s evaluation plan takes its
    /// training plan's choice, so that the two hold the same weights in the same types.
    pub quantize_only: Option<&'a [String]>,
}

impl PlanOptions<'_> {
    pub fn infer() -> PlanOptions<'static> {
        PlanOptions {
            mode: Mode::Infer,
            loss: false,
            grads: false,
            frozen: &[],
            optimizer: OptimizerSpec::default(),
            rewrites: Rewrites::Greedy,
            precision: Precision::F32,
            quantize: None,
            quantize_only: None,
        }
    }

    pub fn train(frozen: &[String], optimizer: OptimizerSpec) -> PlanOptions<'_> {
        PlanOptions {
            mode: Mode::Train,
            loss: true,
            grads: true,
            frozen,
            optimizer,
            rewrites: Rewrites::Greedy,
            precision: Precision::F32,
            quantize: None,
            quantize_only: None,
        }
    }
}

/// The graph, differentiated and rewritten as `opts` asks, as a validated plan.
pub fn lower(g: Graph, sources: &SourceMap, opts: &PlanOptions) -> Result<Plan, Diagnostic> {
    lower_with_spans(g, sources, opts).map(|(plan, _)| plan)
}

/// As `lower`, with the span in a user file of each step's expression (for diagnostics about
/// steps: `dynamic`'s).
pub fn lower_with_spans(
    mut g: Graph,
    sources: &SourceMap,
    opts: &PlanOptions,
) -> Result<(Plan, Vec<Span>), Diagnostic> {
    check_engine(opts.rewrites)?;
    check_mode(&g, opts.mode)?;
    check_frozen(&g, opts)?;
    if let Some(dtype) = opts.quantize {
        let trained = |i: usize| {
            let p = &g.params[i];
            opts.grads && p.trainable && !opts.frozen.iter().any(|f| is_frozen(&p.name, f))
        };
        let mut chosen = crate::quantize::choose_untrained(&g, dtype, trained);
        if let Some(only) = opts.quantize_only {
            chosen.retain(|(name, _)| only.contains(name));
        }
        crate::quantize::apply(&mut g, &chosen);
    }
    // State writes are results like outputs: the rewrites track them as outputs.
    let n_out = g.outputs.len();
    g.outputs.extend(g.state_writes.iter().map(|(_, id)| (String::new(), *id)));
    let grads = differentiate_and_rewrite(&mut g, opts)?;
    let written: Vec<NodeId> = g.outputs.drain(n_out..).map(|(_, id)| id).collect();
    for (w, id) in g.state_writes.iter_mut().zip(written) {
        w.1 = id;
    }
    let want_loss = opts.loss || opts.grads;
    // Liveness: everything the results read, transitively. Inputs nothing reads are dropped,
    // so an inference plan does not ask for the labels its loss would need.
    let mut roots: Vec<u32> = g.outputs.iter().map(|(_, id)| id.0).collect();
    if want_loss {
        roots.extend(g.loss.map(|id| id.0));
    }
    roots.extend(grads.iter().map(|(_, id)| id.0));
    roots.extend(g.state_writes.iter().map(|(_, id)| id.0));
    let live = mgn_ir::analysis::needed(&g, roots);
    let (steps, renumber) = to_steps(&g, &live, sources);
    let spans: Vec<Span> =
        g.nodes.iter().zip(&live).filter(|(_, &l)| l).map(|(n, _)| n.user_span).collect();
    let map = |id: NodeId| renumber[id.0 as usize];
    let params = g
        .params
        .iter()
        .map(|p| ParamSpec {
            name: p.name.clone(),
            dtype: p.dtype,
            shape: p.shape.clone(),
            init: p.init.clone(),
            trainable: p.trainable,
            frozen: p.trainable
                && !grads.iter().any(|(i, _)| g.params[*i].name == p.name)
                && opts.grads,
            persistent: p.persistent,
        })
        .collect();
    let live_inputs = g.inputs.iter().filter(|(_, id)| live[id.0 as usize]);
    let plan = Plan {
        model: g.model.clone(),
        mode: opts.mode,
        config: g.config.clone(),
        params,
        steps,
        inputs: live_inputs.map(|(n, id)| (n.clone(), map(*id))).collect(),
        outputs: g.outputs.iter().map(|(n, id)| (n.clone(), map(*id))).collect(),
        loss: if want_loss { g.loss.map(map) } else { None },
        grads: grads.iter().map(|(p, id)| (*p, map(*id))).collect(),
        optimizer: opts.optimizer.clone(),
        state_writes: g.state_writes.iter().map(|(p, id)| (*p, map(*id))).collect(),
        aliases: g.aliases.clone(),
        // Inference plans list their counters too, though they never count: a checkpoint
        // without one (older than the buffer, as PyTorch allows) then loads for inference.
        counters: g.counters.clone(),
        dynamic: None,
        precision: opts.precision,
        loss_scaling: g.loss_scaling.clone(),
    };
    check_sizes(&plan, &spans)?;
    // Every plan the compiler makes passes the validator that plan files and backends rely on:
    // a node elaboration or autodiff typed differently from the IR's rules is a compiler bug,
    // reported at the model rather than left to a backend.
    plan.validate().map_err(|e| {
        Diagnostic::error(
            "E0999",
            format!("internal error: the compiled plan is invalid: {e}"),
            Default::default(),
            "while lowering this model",
        )
    })?;
    Ok((plan, spans))
}

/// Every value within the elements a plan can hold. The front end checks the values a model
/// writes (E0301); the ones autodiff and the rewrites add (a derivative, a fused product) are
/// checked here, so that `--set vocab=2147483647` is a range error at the model's line rather
/// than the validator's internal error.
fn check_sizes(plan: &Plan, spans: &[Span]) -> Result<(), Diagnostic> {
    for (i, s) in plan.steps.iter().enumerate() {
        let n = mgn_ir::shape::checked_numel(&s.shape);
        if n.is_some_and(|n| n <= MAX_ELEMENTS) {
            continue;
        }
        let count = n.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string());
        let what = if plan.mode == Mode::Train { "the training plan" } else { "the plan" };
        return Err(Diagnostic::error(
            "E0301",
            format!(
                "{what} needs a value of shape {:?} for this `{}`: {count} elements, more than \
                 the 2^40 a plan can hold",
                s.shape,
                s.op.describe()
            ),
            spans.get(i).copied().unwrap_or_default(),
            "this value is too large",
        )
        .with_help("make the model's sizes or its batch smaller (`--set`)"));
    }
    Ok(())
}

/// Each `--freeze` prefix names some trainable parameter, in a plan with gradients.
fn check_frozen(g: &Graph, opts: &PlanOptions) -> Result<(), Diagnostic> {
    for f in opts.frozen {
        if !opts.grads {
            return Err(Diagnostic::error(
                "E0703",
                format!("`--freeze {f}` needs a plan with gradients"),
                Default::default(),
                "nothing is trained here",
            )
            .with_help("freezing applies to `--mode train` (and `mgnc run --grads`)"));
        }
        if !g.params.iter().any(|p| p.trainable && crate::autodiff::is_frozen(&p.name, f)) {
            let names: Vec<&str> =
                g.params.iter().filter(|p| p.trainable).map(|p| p.name.as_str()).collect();
            let d = Diagnostic::error(
                "E0703",
                format!("`--freeze {f}` matches no trainable parameter"),
                Default::default(),
                "in this model",
            );
            return Err(match crate::front::did_you_mean(f, names.iter().copied()) {
                Some(h) => d.with_help(h),
                None => d.with_help(
                    "give a parameter name or a dotted prefix of names, as listed by \
                     `mgnc build --emit ir`",
                ),
            });
        }
    }
    Ok(())
}

/// A graph that read `training` is made for that mode alone: lowering it into a plan of the
/// other mode would run the other mode's code (an internal error of the caller).
fn check_mode(g: &Graph, mode: Mode) -> Result<(), Diagnostic> {
    match g.training {
        Some(training) if training != (mode == Mode::Train) => Err(Diagnostic::error(
            "E0999",
            format!(
                "internal error: model `{}` reads `training` and was elaborated for {} plan, \
                 not for this {} plan",
                g.model,
                if training { "a training" } else { "an inference" },
                if mode == Mode::Train { "training" } else { "inference" },
            ),
            Default::default(),
            "while building this model",
        )),
        _ => Ok(()),
    }
}

/// The engine `--rewrites` asks for is in this build (egglog needs its cargo feature).
fn check_engine(engine: Rewrites) -> Result<(), Diagnostic> {
    if engine.available() {
        return Ok(());
    }
    Err(Diagnostic::error(
        "E0502",
        "`--rewrites egglog` needs the `egglog` feature, which this mgnc was built without",
        Default::default(),
        "while building this model",
    )
    .with_help("build it with `cargo build --release -p mgnc --features egglog`"))
}

/// The rewrites before autodiff (fewer forward nodes to differentiate) and after (autodiff's
/// own redundancies, e.g. transposing a transposed weight for every matmul gradient), the
/// backward pass when `opts` asks for gradients, and last the precision policy: (parameter,
/// gradient node) pairs.
fn differentiate_and_rewrite(
    g: &mut Graph,
    opts: &PlanOptions,
) -> Result<Vec<(usize, NodeId)>, Diagnostic> {
    let mut grads = differentiate_rewritten(g, opts)?;
    if let Some(half) = opts.precision.half() {
        let mut ids: Vec<NodeId> = grads.iter().map(|(_, id)| *id).collect();
        crate::precision::apply(g, half, &mut ids);
        grads.iter_mut().zip(ids).for_each(|(g, id)| g.1 = id);
    }
    Ok(grads)
}

fn differentiate_rewritten(
    g: &mut Graph,
    opts: &PlanOptions,
) -> Result<Vec<(usize, NodeId)>, Diagnostic> {
    rewrite(g, opts.rewrites).map_err(rewrite_failed)?;
    if !opts.grads {
        return Ok(Vec::new());
    }
    let training = opts.mode == Mode::Train;
    // f16's narrow range needs the loss scaled (an f32 loss: any other is the user's choice).
    let scaled = opts.precision == Precision::MixedF16
        && g.loss.is_some_and(|l| g.node(l).dtype == mgn_ir::DType::F32);
    let loss_scale = scaled.then(|| crate::precision::loss_scale_param(g));
    let grad_opts = GradOptions { training, frozen: opts.frozen, loss_scale };
    let mut grads = differentiate(g, &grad_opts)?;
    if opts.rewrites != Rewrites::None {
        // Gradients are results like outputs: track them through the rewrite as outputs.
        let n_out = g.outputs.len();
        g.outputs.extend(grads.iter().map(|(_, id)| (String::new(), *id)));
        rewrite(g, opts.rewrites).map_err(rewrite_failed)?;
        for (k, (_, id)) in g.outputs.drain(n_out..).enumerate() {
            grads[k].1 = id;
        }
    }
    Ok(grads)
}

/// A rewrite engine that fails is a compiler bug, reported at the model.
fn rewrite_failed(why: String) -> Diagnostic {
    Diagnostic::error(
        "E0999",
        format!("internal error: the rewrites failed: {why}"),
        Default::default(),
        "while rewriting this model's graph",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{check_text, Models};
    use crate::graph::{Op, UnaryOp};
    use crate::source::Origin;

    /// The plan of the one model in `text`.
    fn plan_of(text: &str, opts: &PlanOptions) -> Plan {
        let mut out =
            check_text("m.mgn".into(), Origin::Memory("m.mgn".into()), text.into(), Models::All);
        assert!(out.ok(), "{:?}", out.diagnostics);
        let g = out.graphs.pop().expect("a graph");
        lower(g, &out.program.sources, opts).unwrap_or_else(|d| panic!("{}", d.message))
    }

    /// The training plan of the one model in `text` under each rewrite engine this build has.
    fn training_plans(text: &str) -> Vec<(Rewrites, Plan)> {
        let engines = [Rewrites::None, Rewrites::Greedy, Rewrites::Egglog];
        (engines.into_iter().filter(|r| r.available()))
            .map(|rewrites| {
                let train = PlanOptions::train(&[], OptimizerSpec::default());
                (rewrites, plan_of(text, &PlanOptions { rewrites, ..train }))
            })
            .collect()
    }

    #[test]
    fn a_dropout_derivative_names_its_forward_step_after_dead_nodes_are_dropped() {
        // `unused` is elaborated but dead: lowering drops it, shifting every later step.
        let text = "model D(b: dim = 4) {
    input x: f32[b, 8]
    w = param f32[8] init ones
    forward {
        let unused = relu(x) * 3.0
        let y = dropout(x * w, p = 0.5)
        output y
        loss mean(y * y)
    }
}
";
        for (rewrites, plan) in training_plans(text) {
            let grads: Vec<usize> = (plan.steps.iter())
                .filter_map(|s| match s.op {
                    Op::DropoutGrad { forward, .. } => Some(forward as usize),
                    _ => None,
                })
                .collect();
            assert_eq!(grads.len(), 1, "{rewrites:?}");
            let forward = &plan.steps[grads[0]].op;
            assert!(
                matches!(forward, Op::Dropout { .. }),
                "{rewrites:?}: replays the mask it drew"
            );
        }
    }

    #[test]
    fn a_relu_derivative_reads_the_result_so_the_residual_sum_dies_in_the_forward_pass() {
        let text = "model R(b: dim = 4) {
    input x: f32[b, 8]
    input skip: f32[b, 8]
    w = param f32[8, 8] init ones
    forward {
        let h = relu(x @ w + skip)
        let y = h @ w
        output y
        loss mean(y * y)
    }
}
";
        for (rewrites, plan) in training_plans(text) {
            let of = |i: u32| &plan.steps[i as usize];
            let relu_grads: Vec<&mgn_ir::plan::Step> =
                (plan.steps.iter()).filter(|s| s.op == Op::UnaryGrad(UnaryOp::Relu)).collect();
            assert_eq!(relu_grads.len(), 1, "{rewrites:?}");
            let read = of(relu_grads[0].inputs[0]);
            assert_eq!(read.op, Op::Unary(UnaryOp::Relu), "{rewrites:?}: reads the result");
            // The sum under the relu is read by the relu alone: nothing keeps it for the
            // backward pass.
            let sum = read.inputs[0];
            let readers = plan.steps.iter().filter(|s| s.inputs.contains(&sum)).count();
            assert_eq!(readers, 1, "{rewrites:?}");
        }
    }

    #[cfg(not(feature = "egglog"))]
    #[test]
    fn the_egglog_engine_without_its_feature_says_how_to_build_it() {
        let (mut out, opts) = (
            check_text(
                "m.mgn".into(),
                Origin::Memory("m.mgn".into()),
                "model M { input x: f32[2]\n forward { output x } }".into(),
                Models::All,
            ),
            PlanOptions { rewrites: Rewrites::Egglog, ..PlanOptions::infer() },
        );
        let g = out.graphs.pop().expect("a graph");
        let d = lower(g, &out.program.sources, &opts).expect_err("refused");
        assert_eq!(d.code, "E0502");
        assert!(d.help.is_some_and(|h| h.contains("--features egglog")), "{}", d.message);
    }
}
