//! Graph IR → Plan: keeps the nodes the plan's results need (in order), renumbers them as
//! steps, and records each step's source location in the user's model.

use crate::autodiff::{differentiate, GradOptions};
use crate::graph::{Graph, NodeId, Op};
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

/// The graph, differentiated and rewritten as `opts` asks, as a validated plan.
pub fn lower(mut g: Graph, sources: &SourceMap, opts: &PlanOptions) -> Result<Plan, Diagnostic> {
    check_frozen(&g, opts)?;
    let grads = differentiate_and_rewrite(&mut g, opts)?;
    let want_loss = opts.loss || opts.grads;
    // Liveness: everything the results read, transitively. Inputs nothing reads are dropped,
    // so an inference plan does not ask for the labels its loss would need.
    let mut roots: Vec<u32> = g.outputs.iter().map(|(_, id)| id.0).collect();
    if want_loss {
        roots.extend(g.loss.map(|id| id.0));
    }
    roots.extend(grads.iter().map(|(_, id)| id.0));
    let live = mgn_ir::analysis::needed(&g, roots);
    let (steps, renumber) = number_steps(&g, &live, sources);
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
    };
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
    Ok(plan)
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

/// The rewrites before autodiff (fewer forward nodes to differentiate) and after (autodiff's
/// own redundancies, e.g. transposing a transposed weight for every matmul gradient), and the
/// backward pass when `opts` asks for gradients: (parameter, gradient node) pairs.
fn differentiate_and_rewrite(
    g: &mut Graph,
    opts: &PlanOptions,
) -> Result<Vec<(usize, NodeId)>, Diagnostic> {
    if opts.rewrite {
        crate::rewrite::simplify(g);
    }
    if !opts.grads {
        return Ok(Vec::new());
    }
    let training = opts.mode == Mode::Train;
    let mut grads = differentiate(g, &GradOptions { training, frozen: opts.frozen })?;
    if opts.rewrite {
        // Gradients are results like outputs: track them through the rewrite as outputs.
        let n_out = g.outputs.len();
        g.outputs.extend(grads.iter().map(|(_, id)| (String::new(), *id)));
        crate::rewrite::simplify(g);
        for (k, (_, id)) in g.outputs.drain(n_out..).enumerate() {
            grads[k].1 = id;
        }
    }
    Ok(grads)
}

/// The live nodes as steps, in order, each with its model line; and each node's step number
/// (`u32::MAX` for dead nodes).
fn number_steps(g: &Graph, live: &[bool], sources: &SourceMap) -> (Vec<Step>, Vec<u32>) {
    let mut renumber = vec![u32::MAX; g.nodes.len()];
    let mut steps = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !live[i] {
            continue;
        }
        renumber[i] = steps.len() as u32;
        let (file, line, column) = sources.location(n.user_span);
        let mut op = n.op.clone();
        // A dropout derivative names its forward step (whose mask it replays) by number.
        if let Op::DropoutGrad { forward, .. } = &mut op {
            *forward = renumber[*forward as usize];
        }
        steps.push(Step {
            op,
            inputs: n.inputs.iter().map(|x| renumber[x.0 as usize]).collect(),
            dtype: n.dtype,
            shape: n.shape.clone(),
            loc: SourceLoc { file, line: line as u32, column: column as u32 },
        });
    }
    (steps, renumber)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{check_text, Models};
    use crate::source::Origin;

    /// The plan of the one model in `text`.
    fn plan_of(text: &str, opts: &PlanOptions) -> Plan {
        let mut out =
            check_text("m.mgn".into(), Origin::Memory("m.mgn".into()), text.into(), Models::All);
        assert!(out.ok(), "{:?}", out.diagnostics);
        let g = out.graphs.pop().expect("a graph");
        lower(g, &out.program.sources, opts).unwrap_or_else(|d| panic!("{}", d.message))
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
        let plan = plan_of(text, &PlanOptions::train(&[], OptimizerSpec::default()));
        let grads: Vec<usize> = (plan.steps.iter())
            .filter_map(|s| match s.op {
                Op::DropoutGrad { forward, .. } => Some(forward as usize),
                _ => None,
            })
            .collect();
        assert_eq!(grads.len(), 1);
        assert!(matches!(plan.steps[grads[0]].op, Op::Dropout { .. }), "replays the mask it drew");
    }
}
