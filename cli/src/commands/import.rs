//! `mgnc import FILE [-o MODEL.mgn] [--weights W.safetensors] [--name NAME]`: turns an ONNX or
//! GGUF file into `.mgn` source and a checkpoint (`mgn_import` does the translating).
//!
//! The source is put through the formatter before it is written, so `mgnc fmt` leaves it as it
//! is, and checked after, so a file that is written is one `mgnc check` accepts; either failing
//! is a bug in the importer, reported as such. Every file is written atomically.

use super::report::{self, MessageFormat};
use clap::Args;
use mgn_compiler::{check_path, Models};
use mgn_import::{import_file, Options};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct ImportArgs {
    /// The model to import: an `.onnx` file or a `.gguf` file.
    pub file: PathBuf,
    /// Where to write the `.mgn` source (default: the input's name with `.mgn`, in the current
    /// directory).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Where to write the weights (default: beside the source, with `.safetensors`).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// The generated model's name (default: from the input's file name).
    #[arg(long)]
    pub name: Option<String>,
    /// GGUF: decode the block-quantized tensors to f32 in the checkpoint, instead of keeping
    /// them packed as the file holds them (q4_1, q8_0, …)
    #[arg(long)]
    pub dequantize: bool,
}

pub fn run(args: ImportArgs) -> u8 {
    let start = Instant::now();
    let options = Options { name: args.name.clone(), dequantize: args.dequantize };
    let imported = match import_file(&args.file, &options) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return super::EXIT_ERRORS;
        }
    };
    let stem = args.file.file_stem().map(|s| s.to_string_lossy().into_owned());
    let stem = stem.unwrap_or_else(|| "model".to_string());
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from(format!("{stem}.mgn")));
    let weights = args.weights.clone().unwrap_or_else(|| output.with_extension("safetensors"));

    let source = match mgn_syntax::format::format(&imported.source) {
        Ok(s) => s,
        Err(diags) => {
            eprintln!(
                "internal error: the generated source of `{}` does not parse ({} diagnostics); \
                 this is a bug in mgnc import. The unformatted source follows.",
                args.file.display(),
                diags.len()
            );
            eprintln!("{}", imported.source);
            return super::EXIT_ERRORS;
        }
    };
    if let Err(e) = mgn_ir::io::write_atomic(&output, source.as_bytes()) {
        eprintln!("error: cannot write `{}`: {e}", output.display());
        return super::EXIT_ERRORS;
    }
    let tensors: Vec<(String, &mgn_ir::tensor::Tensor)> =
        imported.weights.iter().map(|(n, t)| (n.clone(), t)).collect();
    let metadata = vec![("mgn.imported_from".to_string(), file_name(&args.file))];
    if let Err(e) = mgn_runtime::checkpoint::save(&weights, &tensors, &metadata) {
        eprintln!("error: {e}");
        return super::EXIT_ERRORS;
    }
    let stem_out = output.with_extension("");
    for (suffix, bytes) in &imported.extras {
        let path = PathBuf::from(format!("{}.{suffix}", stem_out.display()));
        if let Err(e) = mgn_ir::io::write_atomic(&path, bytes) {
            eprintln!("error: cannot write `{}`: {e}", path.display());
            return super::EXIT_ERRORS;
        }
    }
    // The importer promises source that checks; hold it to that.
    match check_path(&output, Models::All) {
        Ok(outcome) if outcome.ok() => {}
        Ok(outcome) => {
            eprintln!(
                "internal error: the source generated from `{}` does not check; this is a bug in \
                 mgnc import:",
                args.file.display()
            );
            report::diagnostics(&outcome, MessageFormat::Human);
            return super::EXIT_ERRORS;
        }
        Err(e) => {
            report::error(&e, MessageFormat::Human);
            return super::EXIT_ERRORS;
        }
    }
    let lines = source.lines().count();
    eprintln!(
        "imported {} in {:.0} ms: {} ({lines} lines), {} ({} tensors)",
        args.file.display(),
        start.elapsed().as_secs_f64() * 1e3,
        output.display(),
        weights.display(),
        imported.weights.len()
    );
    for (suffix, _) in &imported.extras {
        eprintln!("  also wrote {}.{suffix}", stem_out.display());
    }
    for line in &imported.summary {
        eprintln!("  {line}");
    }
    0
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
