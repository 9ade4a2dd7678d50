//! An app that embeds a compiled model with the runtime crate alone (no compiler, no parser):
//! it loads a `.mgnplan` and a safetensors checkpoint, reads inputs from a safetensors file,
//! runs inference on the best available device and prints each output's shape and first values.
//!
//! ```sh
//! mgnc build models/digits_mlp.mgn -o digits.mgnplan            # once, at build time
//! cargo run -p mgn-runtime --example embed -- \
//!     digits.mgnplan weights.safetensors inputs.safetensors
//! ```

use mgn_runtime::checkpoint::{self, MatchMode};
use mgn_runtime::session::Session;
use mgn_runtime::{Plan, Tensor};
use std::path::Path;
use std::process::ExitCode;

fn run(plan: &Path, weights: &Path, inputs: &Path) -> Result<(), String> {
    let plan = Plan::load(plan).map_err(|e| e.to_string())?;
    let mut session = Session::new(plan, 0);
    session.load_checkpoint(weights, MatchMode::Strict).map_err(|e| e.to_string())?;
    // A hardware GPU when there is one; the CPU otherwise.
    let on = match mgn_runtime::gpu::hardware_gpu() {
        true => session.use_gpu().unwrap_or_else(|e| format!("the CPU ({e})")),
        false => "the CPU".to_string(),
    };
    let data = checkpoint::load(inputs).map_err(|e| e.to_string())?;
    let given: Vec<(&str, &Tensor)> = data.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out = session.run(&given).map_err(|e| e.to_string())?;
    println!("{} on {on}", session.plan.model);
    for (name, t) in &out.outputs {
        let v = t.to_f64_vec();
        let head: Vec<String> = v.iter().take(5).map(|x| format!("{x:.4}")).collect();
        println!(
            "  {name}: {:?} [{}{}]",
            t.shape,
            head.join(", "),
            if v.len() > 5 { ", …" } else { "" }
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [plan, weights, inputs] = args.as_slice() else {
        eprintln!("usage: embed PLAN.mgnplan WEIGHTS.safetensors INPUTS.safetensors");
        return ExitCode::from(2);
    };
    match run(Path::new(plan), Path::new(weights), Path::new(inputs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
