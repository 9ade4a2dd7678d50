//! `mgnc quantize CKPT.safetensors -o OUT --type q4_0 [--model MODEL.mgn]`: a checkpoint's
//! weight matrices in a packed type, written as a checkpoint (`.safetensors`, the runtime's
//! convention for packed tensors) or as a GGUF file (`.gguf`, `gguf.rs`).
//!
//! Without `--model` the tensors are chosen by what they look like: a float tensor with at
//! least two axes, at least 4096 elements and a last axis of whole blocks — the weight matrices
//! and embeddings, never biases, norms' scales or small tables, whose bytes do not matter and
//! whose precision does. A k-quant falls back as llama.cpp does where the last axis is not
//! whole 256-value blocks: q4_k to q4_1, q6_k to q8_0. With `--model` the tensors are those the
//! compiler's `--quantize` pass packs in that model's plan. Optimizer state is left out: a packed
//! tensor is not trained. Every file is written atomically.

mod gguf;
#[cfg(test)]
mod tests;

use clap::Args;
use mgn_compiler::lower::PlanOptions;
// The smallest tensor worth packing, as the compiler's `--quantize` rule has it.
use mgn_compiler::quantize::MIN_ELEMENTS;
use mgn_ir::dtype::PACKED;
use mgn_ir::tensor::Tensor;
use mgn_ir::DType;
use mgn_runtime::checkpoint::{self, Checkpoint, OPTIM_PREFIX};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct QuantizeArgs {
    /// The checkpoint to quantize (safetensors).
    pub checkpoint: PathBuf,
    /// Where to write the result: `.safetensors` or `.gguf`.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// The packed type: q8_0, q4_0, q4_1, q4_k or q6_k.
    #[arg(long = "type")]
    pub dtype: String,
    /// Choose the tensors as the compiler's `--quantize` pass does for this model.
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// The output's format, from its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Safetensors,
    Gguf,
}

/// One quantized tensor: its name, its type and its error (‖x − q(x)‖ / ‖x‖).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Quantized {
    pub name: String,
    pub dtype: DType,
    pub rel_error: f64,
}

/// What quantizing a checkpoint made: the tensors to write, in name order, and what changed.
pub(crate) struct Outcome {
    pub tensors: Vec<(String, Tensor)>,
    pub quantized: Vec<Quantized>,
    pub dropped_optim: usize,
}

pub fn run(args: QuantizeArgs) -> u8 {
    match quantize(&args) {
        Ok(table) => {
            print!("{table}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            super::EXIT_ERRORS
        }
    }
}

/// Runs the command; the table to print, or the error.
fn quantize(args: &QuantizeArgs) -> Result<String, String> {
    let dtype = packed_type(&args.dtype)?;
    let format = output_format(&args.output)?;
    let ck = checkpoint::load(&args.checkpoint).map_err(|e| e.to_string())?;
    let outcome = match &args.model {
        Some(model) => {
            let names = chosen_by_model(model, &ck, dtype)?;
            quantize_named(&ck, &names, dtype)?
        }
        None => quantize_by_tensor(&ck, dtype)?,
    };
    let name = ck.model().map(str::to_string).unwrap_or_else(|| file_stem(&args.output));
    let bytes = match format {
        Format::Safetensors => {
            let mut meta: Vec<(String, String)> = (ck.metadata.iter())
                .filter(|(k, _)| *k != checkpoint::FORMAT_KEY)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            meta.retain(|(k, _)| k != "mgn.quantized_from");
            meta.push(("mgn.quantized_from".into(), file_name(&args.checkpoint)));
            let refs: Vec<(String, &Tensor)> =
                outcome.tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
            checkpoint::to_bytes(&refs, &meta)?
        }
        Format::Gguf => gguf::to_bytes(&outcome.tensors, &name)?,
    };
    mgn_ir::io::write_atomic(&args.output, &bytes)
        .map_err(|e| format!("cannot write `{}`: {e}", args.output.display()))?;
    Ok(table(&ck, &outcome, &args.output, bytes.len()))
}

/// The packed type a `--type` names, or an error listing them.
fn packed_type(name: &str) -> Result<DType, String> {
    DType::from_name(&name.to_ascii_lowercase()).filter(|d| d.is_packed()).ok_or_else(|| {
        let names: Vec<&str> = PACKED.iter().map(|d| d.name()).collect();
        format!("unknown type `{name}`: the packed types are {}", names.join(", "))
    })
}

fn output_format(path: &Path) -> Result<Format, String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => Ok(Format::Safetensors),
        Some("gguf") => Ok(Format::Gguf),
        _ => Err(format!(
            "cannot tell the format of `{}`: the output must end in `.safetensors` or `.gguf`",
            path.display()
        )),
    }
}

/// The parameters the compiler's `--quantize` pass packs in `model` (its inference plan at its
/// default arguments, the same pass `mgnc build --quantize` runs), by checkpoint name.
fn chosen_by_model(
    model: &Path,
    _ck: &Checkpoint,
    dtype: DType,
) -> Result<BTreeSet<String>, String> {
    let opts = mgn_compiler::lower::PlanOptions { quantize: Some(dtype), ..PlanOptions::infer() };
    let (outcome, plan) = mgn_compiler::driver::plan_path(model, None, Vec::new(), &opts)
        .map_err(|e| format!("`--model {}`: {e}", model.display()))?;
    let Some(plan) = plan.filter(|_| outcome.ok()) else {
        return Err(format!(
            "`--model {}` has errors: `mgnc check {0}` shows them",
            model.display()
        ));
    };
    Ok(plan.params.iter().filter(|p| p.dtype.is_packed()).map(|p| p.name.clone()).collect())
}

/// The packed type a tensor gets when quantized to `dtype`, or why it is left as it is.
pub(crate) fn target(t: &Tensor, dtype: DType) -> Result<DType, Skip> {
    if !t.dtype.is_float() {
        return Err(Skip::NotFloat);
    }
    if t.shape.len() < 2 {
        return Err(Skip::FewAxes);
    }
    if t.numel() < MIN_ELEMENTS {
        return Err(Skip::Small);
    }
    let last = t.shape[t.shape.len() - 1];
    mgn_compiler::quantize::packed_type(dtype, &t.shape).ok_or(Skip::Blocks(last))
}

/// Why a tensor is not quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    NotFloat,
    FewAxes,
    Small,
    /// Its last axis (this long) is not whole blocks.
    Blocks(usize),
}

/// Every tensor `target` accepts quantized; the rest kept; optimizer state left out.
pub(crate) fn quantize_by_tensor(ck: &Checkpoint, dtype: DType) -> Result<Outcome, String> {
    let mut names = BTreeSet::new();
    let mut skipped: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (name, t) in ck.tensors.iter().filter(|(n, _)| !n.starts_with(OPTIM_PREFIX)) {
        match target(t, dtype) {
            Ok(_) => {
                names.insert(name.clone());
            }
            Err(why) => {
                let what = match why {
                    Skip::NotFloat => "not floats",
                    Skip::FewAxes => "fewer than 2 axes",
                    Skip::Small => "fewer than 4096 elements",
                    Skip::Blocks(_) => "a last axis that is not whole blocks",
                };
                *skipped.entry(what).or_default() += 1;
            }
        }
    }
    if names.is_empty() {
        let why: Vec<String> = skipped.iter().map(|(w, n)| format!("{n} with {w}")).collect();
        let why = if why.is_empty() { "it holds no tensors".into() } else { why.join(", ") };
        return Err(format!(
            "{}: nothing to quantize to {dtype}: a tensor is packed when it is float, has at \
             least 2 axes and 4096 elements, and its last axis is whole blocks; the file has {why}",
            ck.path.display()
        ));
    }
    quantize_named(ck, &names, dtype)
}

/// The checkpoint with the tensors `names` quantized to `dtype` (or its fallback, `target`);
/// the others kept as they are, optimizer state left out. The entry point for a choice made
/// elsewhere (`--model`).
pub(crate) fn quantize_named(
    ck: &Checkpoint,
    names: &BTreeSet<String>,
    dtype: DType,
) -> Result<Outcome, String> {
    if let Some(missing) = names.iter().find(|n| ck.get(n).is_none()) {
        return Err(format!("{}: holds no tensor `{missing}`", ck.path.display()));
    }
    let mut out = Outcome { tensors: Vec::new(), quantized: Vec::new(), dropped_optim: 0 };
    for (name, t) in &ck.tensors {
        if name.starts_with(OPTIM_PREFIX) {
            out.dropped_optim += 1;
            continue;
        }
        if !names.contains(name) {
            out.tensors.push((name.clone(), t.clone()));
            continue;
        }
        let to = target(t, dtype).map_err(|why| {
            let why = match why {
                Skip::Blocks(n) => format!("its last axis ({n}) is not whole {dtype} blocks"),
                Skip::NotFloat => "it is not a float tensor".into(),
                Skip::FewAxes | Skip::Small => "it is a vector or too small".into(),
            };
            format!("`{name}` ({:?}) cannot be quantized to {dtype}: {why}", t.shape)
        })?;
        let values = t.dequantized();
        let q = Tensor::quantized(to, t.shape.clone(), &values);
        let rel_error = relative_error(&values, &q.dequantized());
        out.quantized.push(Quantized { name: name.clone(), dtype: to, rel_error });
        out.tensors.push((name.clone(), q));
    }
    Ok(out)
}

/// ‖x − y‖ / ‖x‖ (0 for a tensor of zeros that stays zeros).
pub(crate) fn relative_error(x: &[f32], y: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        diff += (a as f64 - b as f64).powi(2);
        norm += (a as f64).powi(2);
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

/// The bytes a tensor takes in a file.
fn stored_bytes(t: &Tensor) -> u64 {
    t.dtype.bytes_for(t.numel()).unwrap_or(0) as u64
}

/// The report: tensors and bytes per type before and after, and the quantized tensors' errors.
fn table(ck: &Checkpoint, o: &Outcome, output: &Path, file_bytes: usize) -> String {
    use mgn_ir::units::bytes;
    let mut rows: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    for (name, after) in &o.tensors {
        let before = ck.get(name).expect("every tensor written comes from the checkpoint");
        let row = rows.entry(after.dtype.name().to_string()).or_default();
        row.0 += 1;
        row.1 += stored_bytes(before);
        row.2 += stored_bytes(after);
    }
    let mut s = format!("{} -> {}\n", ck.path.display(), output.display());
    s += &format!("  {:<8} {:>7}  {:>10}    {:>10}\n", "type", "tensors", "before", "after");
    let (mut n, mut b, mut a) = (0, 0, 0);
    for (ty, (count, before, after)) in &rows {
        s += &format!("  {ty:<8} {count:>7}  {:>10} -> {:>10}\n", bytes(*before), bytes(*after));
        (n, b, a) = (n + count, b + before, a + after);
    }
    s += &format!("  {:<8} {n:>7}  {:>10} -> {:>10}", "total", bytes(b), bytes(a));
    s += &format!("  ({:.2}x smaller; the file: {})\n", b as f64 / a.max(1) as f64, {
        bytes(file_bytes as u64)
    });
    let mut errors: Vec<&Quantized> = o.quantized.iter().collect();
    errors.sort_by(|x, y| x.rel_error.total_cmp(&y.rel_error));
    if let (Some(max), Some(median)) = (errors.last(), errors.get(errors.len() / 2)) {
        s += &format!(
            "relative L2 error of the {} quantized tensors: max {:.4} (`{}`), median {:.4}\n",
            errors.len(),
            max.rel_error,
            max.name,
            median.rel_error
        );
    }
    if o.dropped_optim > 0 {
        s += &format!("left out {} optimizer-state tensors (packed ones are not trained)\n", {
            o.dropped_optim
        });
    }
    s
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

fn file_stem(p: &Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}
