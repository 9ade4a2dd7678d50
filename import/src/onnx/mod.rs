//! The ONNX front end: a `.onnx` file (opsets 11–25; external data files beside it) becomes
//! `.mgn` source and the tensors its fields hold.
//!
//! The pipeline: `proto` decodes the file; `graph` reads the main graph (attributes, module
//! paths the exporter recorded); `layers` names every initializer and recognises std layers;
//! `ops` lowers node by node, folding constants and shapes (`fold`); `structure` moves each
//! module's statements into its layer's forward, comparing their text while the nodes each
//! came from travel beside it (`provenance`); `emit` writes the source, those nodes as comments
//! where a line does not say them.
//! Every problem found on the way is collected, so one run lists all of them.

mod emit;
mod fold;
mod graph;
mod layers;
mod ops;
mod proto;
mod provenance;
mod structure;
mod value;

#[cfg(test)]
mod tests;

use crate::{ImportError, Imported, Options};
use graph::{Graph, Size};
use std::collections::HashSet;
use std::path::Path;
use value::{Dt, Run, Sym, Val};

/// The opsets whose op definitions this front end follows.
///
/// Opsets 23 to 25 changed the ops translated here only by adding element types (4- and 8-bit
/// floats and integers), which are refused by type.
const OPSETS: std::ops::RangeInclusive<i64> = 11..=25;

pub fn import(path: &Path, bytes: &[u8], options: &Options) -> Result<Imported, ImportError> {
    let fail = |problems: Vec<String>| ImportError { path: path.to_path_buf(), problems };
    let model = proto::decode(bytes).map_err(|e| fail(vec![e]))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut problems = Vec::new();
    let mut g = Graph::read(&model, dir, &mut problems);
    if !OPSETS.contains(&g.opset) {
        problems.push(format!(
            "the model uses opset {} of the default domain; mgnc imports opsets {} to {}",
            g.opset,
            OPSETS.start(),
            OPSETS.end()
        ));
    }
    copy_identities(&mut g);
    let (names, claims) = layers::plan(&g);
    let mut cx = ops::Lower::new(&g, names, claims);
    for (k, c) in &g.inits {
        cx.vals.insert(k.clone(), Val::Const(c.clone()));
    }
    let (dims, inputs) = declare_inputs(&mut cx, &g, &mut problems);
    cx.all();
    problems.append(&mut cx.problems);
    let outputs = declare_outputs(&mut cx, &g, &mut problems);
    if !problems.is_empty() {
        return Err(fail(problems));
    }
    let name = options.name.clone().unwrap_or_else(|| model_name(path));
    cx.tag("");
    ops::patterns::prune(&mut cx);
    let modules = emit::modules(&cx.fields);
    let body = cx.statements();
    let lens = emit::list_lengths(&cx.fields);
    // Tensor fields have types too: a module's forward may take one of another module's.
    let mut types = cx.types.clone();
    for (path, d) in &cx.fields.tensors {
        let dims: Vec<String> = d.shape.iter().map(ToString::to_string).collect();
        let ty = format!("{}[{}]", d.dt.mgn().unwrap_or("f32"), dims.join(", "));
        types.insert(layers::access(path), ty);
    }
    let recovered = structure::recover(body, &types, &modules, &lens);
    let mut body = recovered.body;
    rename_outputs(&mut body, &outputs);
    let mut header = header(path, &model, g.opset);
    let forwards = recovered.forwards.values().flat_map(|f| &f.body);
    if body.iter().chain(forwards).any(|s| s.text.contains("3.4028235e38")) {
        header.push(
            "Infinite constants (masks) are written as ±3.4028235e38, the largest f32: a".into(),
        );
        header.push("softmax row masked everywhere is uniform here where ONNX gives NaN.".into());
    }
    let uses = cx.uses.clone();
    let m = emit::Model {
        name: &name,
        header,
        dims: dims.clone(),
        inputs,
        fields: &cx.fields,
        uses: &uses,
        body: &body,
        forwards: &recovered.forwards,
    };
    let source = emit::source(&m).map_err(|e| fail(vec![e]))?;
    let weights = cx
        .fields
        .weights
        .iter()
        .map(|(n, c)| to_tensor(n, c))
        .collect::<Result<Vec<_>, String>>()
        .map_err(|e| fail(vec![e]))?;
    let mut summary =
        vec![format!("{} nodes of opset {} → {} statements", g.nodes.len(), g.opset, body.len())];
    let layers: Vec<&String> = cx.fields.layers.values().collect();
    summary.push(format!("{} std layers, {} tensors", layers.len(), weights.len()));
    if !dims.is_empty() {
        let d: Vec<String> = dims.iter().map(|(n, v)| format!("{n} (default {v})")).collect();
        summary.push(format!("dynamic sizes become arguments: {}", d.join(", ")));
    }
    Ok(Imported { source, weights, extras: vec![], summary })
}

/// An `Identity` of an initializer is a copy under another name (the TorchScript exporter
/// shares equal tensors that way): the copy becomes an initializer of its own, so each module
/// keeps its parameter.
fn copy_identities(g: &mut Graph) {
    let mut keep = Vec::new();
    for n in std::mem::take(&mut g.nodes) {
        let src = n.input(0).and_then(|s| g.inits.get(s)).cloned();
        match (n.op.as_str(), src, n.outputs.first()) {
            ("Identity", Some(c), Some(out)) if !g.outputs.contains(out) => {
                g.inits.insert(out.clone(), c);
            }
            _ => keep.push(n),
        }
    }
    g.nodes = keep;
}

fn model_name(path: &Path) -> String {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let camel: String = stem
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| !p.is_empty())
        .map(|p| p[..1].to_ascii_uppercase() + &p[1..])
        .collect();
    if camel.is_empty() || camel.starts_with(|c: char| c.is_ascii_digit()) {
        format!("Imported{camel}")
    } else {
        camel
    }
}

fn header(path: &Path, model: &proto::ModelProto, opset: i64) -> Vec<String> {
    let file = path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let producer =
        format!("{} {}", model.producer_name(), model.producer_version()).trim().to_string();
    let by = if producer.is_empty() { String::new() } else { format!(", made by {producer}") };
    vec![
        format!("Imported by `mgnc import` from {file} (ONNX opset {opset}{by})."),
        "Parameter names are the file's initializer names; the weights are in the checkpoint"
            .into(),
        "written beside this file. To train the model, declare its targets as an input (`input"
            .into(),
        "labels: i32[...]`) and add one line at the end of the forward, such as".into(),
        "`loss cross_entropy(logits, labels)` with `use std.loss.{cross_entropy}`.".into(),
    ]
}

/// An input's name and its `.mgn` type.
type NamedType = (String, String);

/// Declares the graph inputs; named (dynamic) sizes become `dim` arguments of the model.
fn declare_inputs(
    cx: &mut ops::Lower,
    g: &Graph,
    problems: &mut Vec<String>,
) -> (Vec<(String, i64)>, Vec<NamedType>) {
    let mut dims: Vec<(String, i64)> = Vec::new();
    let mut inputs = Vec::new();
    for inp in &g.inputs {
        let Some(dt) = Dt::from_onnx(inp.dtype).filter(|d| d.mgn().is_some()) else {
            problems.push(format!(
                "input `{}` is {}, which mgn has no tensor type for",
                inp.name,
                proto::dt_name(inp.dtype)
            ));
            // Its readers are not reported again.
            let r = Run { expr: "?".into(), dt: Dt::F32, shape: vec![] };
            cx.vals.insert(inp.name.clone(), Val::Run(r));
            continue;
        };
        let mut shape = Vec::new();
        for (k, d) in inp.dims.iter().enumerate() {
            shape.push(match d {
                Size::Fixed(v) => Sym::lit(*v),
                Size::Named(_) | Size::Unknown => {
                    let p = match d {
                        Size::Named(p) => emit::ident(p),
                        _ => format!("{}_dim{k}", emit::ident(&inp.name)),
                    };
                    let v = match dims.iter().find(|(n, _)| *n == p) {
                        Some((_, v)) => *v,
                        None => {
                            // Distinct defaults, so no size is mistaken for another or for 1.
                            let v = [2, 7, 5, 3, 11, 13][dims.len() % 6];
                            dims.push((p.clone(), v));
                            v
                        }
                    };
                    Sym::named(v, &p)
                }
            });
        }
        let name = cx.fresh_input(&inp.name);
        let run = Run { expr: name.clone(), dt, shape };
        inputs.push((name.clone(), run.ty()));
        cx.types.insert(name, run.ty());
        cx.vals.insert(inp.name.clone(), Val::Run(run));
    }
    (dims, inputs)
}

/// `output` statements for the graph outputs; returns (let name, output name) pairs.
fn declare_outputs(
    cx: &mut ops::Lower,
    g: &Graph,
    problems: &mut Vec<String>,
) -> Vec<(String, String)> {
    let mut seen = HashSet::new();
    let mut renames = Vec::new();
    for o in &g.outputs {
        let name = emit::ident(o);
        let name = if seen.insert(name.clone()) { name } else { format!("{name}_{}", seen.len()) };
        let run = match cx.vals.get(o).cloned() {
            Some(Val::Run(r)) => r,
            Some(Val::Const(c)) => match cx.materialize(o, &c) {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("output `{o}`: {e}"));
                    continue;
                }
            },
            None => {
                problems.push(format!("output `{o}` is produced by no node"));
                continue;
            }
        };
        if run.expr == "?" {
            continue;
        }
        if cx.is_let(&run.expr) && !cx.is_taken(&name) {
            // `output y = add_7` until the `let` takes the output's name (`rename_outputs`,
            // after structure recovery, which sees here that the value is read).
            renames.push((run.expr.clone(), name.clone()));
            cx.body.push(format!("output {name} = {}", run.expr));
        } else {
            cx.body.push(format!("output {name} = {}", run.expr));
        }
    }
    renames
}

/// Gives the value each output names the output's name in the whole forward.
fn rename_outputs(body: &mut [provenance::Stmt], renames: &[(String, String)]) {
    for line in body.iter_mut().map(|s| &mut s.text) {
        if line.starts_with("//") {
            continue;
        }
        let mut out = String::new();
        let mut word = String::new();
        let mut prev = ' ';
        let flush = |word: &mut String, out: &mut String, prev: char| {
            let repl = renames.iter().find(|(from, _)| from == word).filter(|_| prev != '.');
            out.push_str(repl.map_or(word.as_str(), |(_, to)| to.as_str()));
            word.clear();
        };
        let mut before_word = ' ';
        let mut in_string = false;
        for c in line.chars() {
            if c == '"' {
                in_string = !in_string;
            }
            if !in_string && (c.is_ascii_alphanumeric() || c == '_') {
                if word.is_empty() {
                    before_word = prev;
                }
                word.push(c);
            } else {
                flush(&mut word, &mut out, before_word);
                out.push(c);
            }
            prev = c;
        }
        flush(&mut word, &mut out, before_word);
        // `output y = y` says `output y`.
        if let Some((lhs, rhs)) = out.strip_prefix("output ").and_then(|r| r.split_once(" = ")) {
            if lhs == rhs {
                out = format!("output {lhs}");
            }
        }
        *line = out;
    }
}

fn to_tensor(name: &str, c: &value::Const) -> Result<(String, mgn_ir::tensor::Tensor), String> {
    use mgn_ir::tensor::{Data, Tensor};
    use mgn_ir::DType;
    let dtype = match c.dt {
        Dt::F32 => DType::F32,
        Dt::F16 => DType::F16,
        Dt::Bf16 => DType::BF16,
        Dt::I32 => DType::I32,
        Dt::I64 => DType::I64,
        Dt::Bool => DType::Bool,
        d => {
            return Err(format!("tensor `{name}` is {}, which mgn has no type for", d.onnx_name()))
        }
    };
    let data = match &c.elems {
        // As float_text: an infinity is the largest finite f32 of its sign.
        value::Elems::F(v) => Data::F32(
            v.iter().map(|&x| if x.is_infinite() { f32::MAX.copysign(x) } else { x }).collect(),
        ),
        value::Elems::I(v) => Data::I32(
            v.iter()
                .map(|s| {
                    i32::try_from(s.v)
                        .map_err(|_| format!("tensor `{name}` holds {}, beyond 32 bits", s.v))
                })
                .collect::<Result<_, _>>()?,
        ),
        value::Elems::B(v) => Data::I32(v.iter().map(|&b| i32::from(b)).collect()),
    };
    Ok((name.to_string(), Tensor { dtype, shape: c.shape.clone(), data }))
}
