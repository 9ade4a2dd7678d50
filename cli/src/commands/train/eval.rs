//! `mgnc eval FILE|PLAN --weights W --data D`: accuracy of an inference plan on a labelled data
//! set (the model's inputs plus an integer labels tensor).

use super::{accuracy, fail, with_batch};
use crate::commands::data::{check_range, Bound, Dataset};
use crate::commands::plan::{
    attach, obtain, resolve_backend, Backend, PrecisionArg, RewriteEngine,
};
use crate::commands::report::MessageFormat;
use mgn_compiler::elab::Setting;
use mgn_compiler::lower::PlanOptions;
use mgn_ir::plan::Mode;
use mgn_runtime::checkpoint::MatchMode;
use mgn_runtime::session::{Restore, Session};
use mgn_runtime::Plan;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct EvalArgs {
    /// A .mgn model or an inference .mgnplan.
    pub file: PathBuf,
    #[arg(long)]
    pub weights: PathBuf,
    /// Labelled data: the model's inputs plus an integer labels tensor.
    #[arg(long)]
    pub data: PathBuf,
    /// Batch size (sets the model argument `batch` or `B`).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Override a model argument, e.g. `--set T=1` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<Setting>,
    /// Which model to build when the file defines several.
    #[arg(long)]
    pub model: Option<String>,
    /// The graph rewrites: greedy local rules, egglog's equality saturation, or none.
    #[arg(long, value_enum, default_value = "greedy")]
    pub rewrites: RewriteEngine,
    /// The precision policy: f32, or mixed (f16 or bf16 operands of matrix products,
    /// convolutions and attention, accumulated in f32); `full_precision(x)` keeps a part of a
    /// model in f32.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Store the weights the plan does not train in a packed type (q8_0, q4_0, q4_1, q4_k,
    /// q6_k): matrix products' and lookups' weights with at least 4096 elements whose last
    /// axis is whole blocks (`q4_k` falls back to `q4_1`, `q6_k` to `q8_0`).
    #[arg(long, value_name = "TYPE", value_parser = crate::commands::plan::parse_quantize)]
    pub quantize: Option<mgn_ir::DType>,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: Backend,
    #[arg(long = "message-format", value_enum, default_value = "human")]
    pub format: MessageFormat,
}

/// `mgnc eval FILE|PLAN --weights W --data D`: accuracy of an inference plan on a data set.
pub fn eval(a: EvalArgs) -> u8 {
    match eval_inner(&a) {
        Ok(()) => 0,
        Err(c) => c,
    }
}

fn eval_inner(a: &EvalArgs) -> Result<(), u8> {
    let f = a.format;
    let engine = resolve_backend(a.backend, f)?;
    let is_plan = a.file.extension().is_some_and(|e| e == "mgnplan");
    let settings = if is_plan {
        a.settings.clone()
    } else {
        with_batch(&a.file, &a.settings, a.batch, a.model.as_deref(), f)?
    };
    let infer = PlanOptions {
        rewrites: a.rewrites.into(),
        precision: a.precision.into(),
        quantize: a.quantize,
        ..PlanOptions::infer()
    };
    let plan: Plan = obtain(&a.file, a.model.clone(), settings, &infer, f)?;
    crate::commands::plan::quantize_note(&plan, &infer, f);
    if plan.mode == Mode::Train {
        return Err(fail(
            &format!(
                "{} is a training plan (its inputs include the labels, and it computes the loss \
                 and gradients); `mgnc eval` runs an inference plan: build one with `mgnc build \
                 MODEL.mgn --mode infer -o PLAN.mgnplan`, or give `mgnc eval` the .mgn file",
                a.file.display()
            ),
            f,
        ));
    }
    // The weights alone (an evaluation steps no optimizer), matched before anything is allocated.
    let (mut session, rep) =
        Session::from_checkpoint(plan, 0, &a.weights, MatchMode::Strict, Restore::Weights)
            .map_err(|e| fail(&e.to_string(), f))?;
    if rep.has_notes() {
        eprintln!("note: {}: {}", a.weights.display(), rep.to_string().trim_end());
    }
    attach(&mut session, engine, f)?;
    let data = Dataset::load(&a.data, &session.plan).map_err(|e| fail(&e, f))?;
    let (labels_name, labels, output) = find_labels(a, &session.plan).map_err(|e| fail(&e, f))?;
    if labels.shape[0] != data.len {
        let msg = format!(
            "{}: `{labels_name}` has {} samples but the model's inputs have {}",
            a.data.display(),
            labels.shape[0],
            data.len
        );
        return Err(fail(&msg, f));
    }
    let mut with_labels = data;
    with_labels.columns.push((labels_name.clone(), labels));
    let (right, total) =
        accuracy(&mut session, &with_labels, &labels_name, &output).map_err(|e| fail(&e, f))?;
    println!(
        "accuracy {:.2}% ({right}/{total}) of `{output}` against `{labels_name}` in {}",
        100.0 * right as f64 / total as f64,
        a.data.display()
    );
    Ok(())
}

/// The labels in the data file (its integer tensor that is not a model input), checked against
/// the class count of the output they label: (labels name, labels, output name).
fn find_labels(
    a: &EvalArgs,
    plan: &Plan,
) -> Result<(String, mgn_ir::tensor::Tensor, String), String> {
    // The labels are not an input of an inference plan; read them from the data file.
    let ckpt = mgn_runtime::checkpoint::load(&a.data).map_err(|e| e.to_string())?;
    let (labels_name, labels) = ckpt
        .tensors
        .into_iter()
        .find(|(n, t)| !t.dtype.is_float() && plan.inputs.iter().all(|(i, _)| i != n))
        .ok_or_else(|| {
            format!(
                "{}: no integer labels tensor besides the model's inputs ({})",
                a.data.display(),
                plan.inputs.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            )
        })?;
    let (output, classes) = plan
        .outputs
        .iter()
        .find_map(|(n, s)| {
            let st = &plan.steps[*s as usize];
            // Labels without a sample axis fit nothing (and would not slice).
            let fits = !labels.shape.is_empty()
                && st.shape.len() == labels.shape.len() + 1
                && st.shape[1..st.shape.len() - 1] == labels.shape[1..];
            fits.then(|| (n.clone(), *st.shape.last().expect("a class axis")))
        })
        .ok_or_else(|| {
            format!("no output of `{}` has a class axis for `{labels_name}`", plan.model)
        })?;
    let bound = i32::try_from(classes).unwrap_or(i32::MAX);
    check_range(&a.data, &labels_name, &labels, bound, Bound::Classes)?;
    Ok((labels_name, labels, output))
}
