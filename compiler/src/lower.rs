//! Graph IR → Plan: keeps the nodes the plan's results need (in order), renumbers them as
//! steps, and records each step's source location in the user's model.

use crate::autodiff::{differentiate, GradOptions};
use crate::graph::{Graph, NodeId};
use crate::source::SourceMap;
use mgn_ir::optim::OptimizerSpec;
use mgn_ir::plan::{Mode, ParamSpec, Plan, SourceLoc, Step};
use mgn_syntax::Diagnostic;

/// What a plan computes.
pub struct PlanOptions<'a> {
    pub mode: Mode,
    /// Include the loss (and the inputs it reads). Training plans always do.
    pub loss: bool,
    /// Include gradients of the trained parameters. Training plans always do.
    pub grads: bool,
    pub frozen: &'a [String],
    pub optimizer: OptimizerSpec,
    /// Run the greedy rewrites (`rewrite.rs`); off only to compare against them.
    pub rewrite: bool,
}

impl PlanOptions<'_> {
    pub fn infer() -> PlanOptions<'static> {
        PlanOptions {
            mode: Mode::Infer,
            loss: false,
            grads: false,
            frozen: &[],
            optimizer: OptimizerSpec::default(),
            rewrite: true,
        }
    }

    pub fn train(frozen: &[String], optimizer: OptimizerSpec) -> PlanOptions<'_> {
        PlanOptions { mode: Mode::Train, loss: true, grads: true, frozen, optimizer, rewrite: true }
    }
}

pub fn lower(mut g: Graph, sources: &SourceMap, opts: &PlanOptions) -> Result<Plan, Diagnostic> {
    let want_loss = opts.loss || opts.grads;
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
            let mut d = Diagnostic::error(
                "E0703",
                format!("`--freeze {f}` matches no trainable parameter"),
                Default::default(),
                "in this model",
            );
            d = match crate::front::did_you_mean(f, names.iter().copied()) {
                Some(h) => d.with_help(h),
                None => d.with_help("give a parameter name or a dotted prefix of names, as listed by `mgnc build --emit ir`"),
            };
            return Err(d);
        }
    }
    // Rewrites before autodiff (fewer forward nodes to differentiate) and after (autodiff's own
    // redundancies, e.g. transposing a transposed weight for every matmul gradient).
    if opts.rewrite {
        crate::rewrite::simplify(&mut g);
    }
    let mut grads = if opts.grads {
        differentiate(
            &mut g,
            &GradOptions { training: opts.mode == Mode::Train, frozen: opts.frozen },
        )?
    } else {
        Vec::new()
    };
    if opts.grads && opts.rewrite {
        let before: Vec<NodeId> = grads.iter().map(|(_, id)| *id).collect();
        // Gradients are results like outputs: track them through the rewrite as outputs.
        let n_out = g.outputs.len();
        g.outputs.extend(before.iter().map(|id| (String::new(), *id)));
        crate::rewrite::simplify(&mut g);
        for (k, (_, id)) in g.outputs.drain(n_out..).enumerate() {
            grads[k].1 = id;
        }
    }

    // Liveness: everything the results read, transitively. Inputs nothing reads are dropped,
    // so an inference plan does not ask for the labels its loss would need.
    let mut roots: Vec<u32> = g.outputs.iter().map(|(_, id)| id.0).collect();
    if want_loss {
        roots.extend(g.loss.map(|id| id.0));
    }
    roots.extend(grads.iter().map(|(_, id)| id.0));
    let live = mgn_ir::analysis::needed(&g, roots);
    let mut renumber = vec![u32::MAX; g.nodes.len()];
    let mut steps = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !live[i] {
            continue;
        }
        renumber[i] = steps.len() as u32;
        let (file, line, column) = sources.location(n.user_span);
        steps.push(Step {
            op: n.op.clone(),
            inputs: n.inputs.iter().map(|x| renumber[x.0 as usize]).collect(),
            dtype: n.dtype,
            shape: n.shape.clone(),
            loc: SourceLoc { file, line: line as u32, column: column as u32 },
        });
    }
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
        })
        .collect();
    let plan = Plan {
        model: g.model.clone(),
        mode: opts.mode,
        config: g.config.clone(),
        params,
        steps,
        inputs: g
            .inputs
            .iter()
            .filter(|(_, id)| live[id.0 as usize])
            .map(|(n, id)| (n.clone(), map(*id)))
            .collect(),
        outputs: g.outputs.iter().map(|(n, id)| (n.clone(), map(*id))).collect(),
        loss: if want_loss { g.loss.map(map) } else { None },
        grads: grads.iter().map(|(p, id)| (*p, map(*id))).collect(),
        optimizer: opts.optimizer.clone(),
    };
    debug_assert!(plan.validate().is_ok(), "{:?}", plan.validate());
    Ok(plan)
}
