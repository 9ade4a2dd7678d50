//! Matching a checkpoint's tensors to a plan's parameters by name: strict or partial, with
//! conversions within a kind (`f16` → `f32`, `i64` → `i32`) and a report of everything that
//! did not fit.
//!
//! Beyond one tensor per parameter, upstream checkpoints have three habits a plan describes
//! (`Plan::aliases`, `Plan::counters`, `InitSpec::Computed`), so that a PyTorch `state_dict`
//! loads unchanged:
//! - a tied weight may be saved under each of its names (`model.state_dict()`) or under one
//!   (`save_pretrained`): a tensor named by an alias must equal, bit for bit, the one loaded
//!   for its parameter, and when the parameter's own name is absent the alias supplies it;
//! - a step counter (`num_batches_tracked`) is absent from checkpoints older than it: it then
//!   starts at its initial value, as PyTorch's BatchNorm does;
//! - a buffer computed from constants (a sinusoid table, position ids) is computed unless the
//!   file holds it.
//!
//! Each of these is reported, never silent; none is a problem in strict mode, except an alias
//! whose values differ from its parameter's.

use super::{Checkpoint, CheckpointError, OPTIM_PREFIX};
use mgn_ir::plan::{InitSpec, ParamAlias, ParamSpec, Plan};
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;
use std::collections::HashSet;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchMode {
    /// Every parameter must be present with its shape, and nothing else (beyond optimizer
    /// state) may be in the checkpoint. Computed buffers and counters may be absent, and a
    /// tied parameter may be present under an alias instead (see the module docs).
    Strict,
    /// Load what matches; report the rest.
    Partial,
}

/// A tensor's dtype and shape, printed `f32[128, 64]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "{}[{}]", self.dtype, dims.join(", "))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub name: String,
    pub expected: Signature,
    pub found: Signature,
    /// Why the values cannot be used when the signatures alone do not say (an out-of-range value).
    pub note: Option<String>,
}

/// A tensor named by an alias whose values are not those of the parameter it is tied to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untied {
    pub alias: String,
    pub param: String,
    /// The first element that differs, with both values.
    pub note: String,
}

/// What matching a checkpoint against a plan's parameters found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Parameters loaded from the checkpoint (under their own name or an alias).
    pub loaded: Vec<String>,
    /// Parameters of the plan that the checkpoint lacks (with the expected signature).
    pub missing: Vec<(String, Signature)>,
    /// Checkpoint tensors that are neither parameters, aliases nor optimizer state.
    pub unexpected: Vec<(String, Signature)>,
    /// Tensors whose shape or kind (float / integer / bool) differ from the parameter's.
    pub mismatched: Vec<Mismatch>,
    /// Loaded tensors converted between dtypes of the same kind (`f16` → `f32`, `i64` → `i32`),
    /// as PyTorch's `load_state_dict` does; not an error in either mode.
    pub converted: Vec<(String, DType, DType)>,
    /// Buffers computed from constants (`InitSpec::Computed`) that the checkpoint lacks: they
    /// keep their computed value. Not an error in either mode.
    pub computed: Vec<String>,
    /// Counters (`Plan::counters`) that the checkpoint lacks: they start at their initial
    /// value (0), as PyTorch's BatchNorm does for checkpoints older than its
    /// `num_batches_tracked`. Not an error in either mode.
    pub counters_started: Vec<String>,
    /// (parameter, alias): parameters the checkpoint holds under an alias only, loaded from it
    /// (a tied weight saved under its other name).
    pub from_alias: Vec<(String, String)>,
    /// (alias, parameter): aliases the checkpoint holds beside their parameter, equal to it.
    pub tied: Vec<(String, String)>,
    /// Aliases the checkpoint holds with values other than their parameter's: the file does
    /// not tie what the model ties. An error in strict mode; the parameter's own tensor is
    /// the one loaded in partial mode.
    pub untied: Vec<Untied>,
}

impl Report {
    /// Nothing missing, unexpected, mismatched or untied.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.mismatched.is_empty()
            && self.untied.is_empty()
    }

    /// Whether a load took something other than the file's own tensor for a parameter,
    /// without that being a problem: a computed buffer computed, a counter started at 0, a
    /// parameter loaded from an alias, a tensor converted (`bf16` → `f32`). Worth a note where a
    /// user loads a checkpoint.
    pub fn has_notes(&self) -> bool {
        !(self.computed.is_empty() && self.counters_started.is_empty())
            || !self.from_alias.is_empty()
            || !self.converted.is_empty()
    }
}

impl Report {
    /// The first problem in a sentence, and how many more there are: a mismatch if there is
    /// one, else an alias that differs from its parameter, else a missing parameter, else an
    /// unexpected tensor.
    fn first_problem(&self) -> String {
        let total =
            self.missing.len() + self.unexpected.len() + self.mismatched.len() + self.untied.len();
        let first = if let Some(m) = self.mismatched.first() {
            let note = m.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default();
            format!("`{}` is {} in the file but {} in the model{note}", m.name, m.found, m.expected)
        } else if let Some(u) = self.untied.first() {
            format!(
                "`{}` is tied to `{}` in the model, but the file holds other values under the two \
                 names ({})",
                u.alias, u.param, u.note
            )
        } else if let Some((n, s)) = self.missing.first() {
            format!("`{n}` ({s}) is not in the file")
        } else if let Some((n, s)) = self.unexpected.first() {
            format!("`{n}` ({s}) is in the file but not in the model")
        } else {
            return "nothing".into();
        };
        match total {
            0 | 1 => first,
            n => format!("{first} (and {} more)", n - 1),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} parameter(s) loaded", self.loaded.len())?;
        if !self.missing.is_empty() {
            writeln!(f, "missing from the checkpoint ({}):", self.missing.len())?;
            for (n, s) in &self.missing {
                writeln!(f, "  {n}: expected {s}")?;
            }
        }
        if !self.unexpected.is_empty() {
            writeln!(f, "in the checkpoint but not in the model ({}):", self.unexpected.len())?;
            for (n, s) in &self.unexpected {
                writeln!(f, "  {n}: found {s}")?;
            }
        }
        if !self.mismatched.is_empty() {
            writeln!(f, "shape or dtype differs ({}):", self.mismatched.len())?;
            for m in &self.mismatched {
                write!(f, "  {}: expected {}, found {}", m.name, m.expected, m.found)?;
                match &m.note {
                    Some(n) => writeln!(f, " ({n})")?,
                    None => writeln!(f)?,
                }
            }
        }
        if !self.untied.is_empty() {
            writeln!(f, "tied in the model but not in the checkpoint ({}):", self.untied.len())?;
            for u in &self.untied {
                writeln!(f, "  {} differs from {} ({})", u.alias, u.param, u.note)?;
            }
        }
        if !self.converted.is_empty() {
            writeln!(f, "converted on load ({}):", self.converted.len())?;
            for (n, from, to) in &self.converted {
                writeln!(f, "  {n}: {from} -> {to}")?;
            }
        }
        if !self.computed.is_empty() {
            writeln!(f, "computed, not in the checkpoint ({}):", self.computed.len())?;
            for n in &self.computed {
                writeln!(f, "  {n}")?;
            }
        }
        if !self.counters_started.is_empty() {
            let n = self.counters_started.len();
            writeln!(f, "counters not in the checkpoint, started at 0 ({n}):")?;
            for n in &self.counters_started {
                writeln!(f, "  {n}")?;
            }
        }
        if !self.from_alias.is_empty() {
            writeln!(f, "loaded from an alias ({}):", self.from_alias.len())?;
            for (p, a) in &self.from_alias {
                writeln!(f, "  {p} <- {a}")?;
            }
        }
        if !self.tied.is_empty() {
            writeln!(f, "aliases equal to their parameter ({}):", self.tied.len())?;
            for (a, p) in &self.tied {
                writeln!(f, "  {a} = {p}")?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Float,
    Int,
    Bool,
}

fn kind(d: DType) -> Kind {
    match d {
        // A packed weight holds real values: a float tensor converts to it and from it.
        DType::F32 | DType::F16 | DType::BF16 => Kind::Float,
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q4_K | DType::Q6_K => Kind::Float,
        DType::I32 | DType::I64 | DType::U32 => Kind::Int,
        DType::Bool => Kind::Bool,
    }
}

/// Converts a loaded tensor to a parameter's declared dtype of the same kind. Into a packed
/// type it quantizes (`--quantize` on an f32 checkpoint); out of one it decodes.
fn convert(t: &Tensor, to: DType) -> Result<Tensor, String> {
    if to.is_packed() && t.dtype == to {
        return Ok(t.clone());
    }
    if to.is_packed() {
        to.packs(&t.shape)?;
        return Ok(Tensor::quantized(to, t.shape.clone(), &t.dequantized()));
    }
    if t.dtype.is_packed() {
        let decoded = Tensor::f32(t.shape.clone(), t.dequantized());
        return convert(&decoded, to);
    }
    let mut out = t.clone();
    out.dtype = to;
    match (&mut out.data, to) {
        (Data::F32(v), DType::F16) => {
            v.iter_mut().for_each(|x| *x = half::f16::from_f32(*x).to_f32())
        }
        (Data::F32(v), DType::BF16) => {
            v.iter_mut().for_each(|x| *x = half::bf16::from_f32(*x).to_f32())
        }
        (Data::I32(v), DType::U32) => {
            if let Some(i) = v.iter().position(|&x| x < 0) {
                return Err(format!("element {i} is {}, not a u32", v[i]));
            }
        }
        _ => {}
    }
    Ok(out)
}

/// The tensor of `name` in the file converted to `p`'s dtype, `None` when the file has no
/// tensor of that name; a mismatch (recorded in `report`) is `Some(None)`.
fn take(
    ckpt: &Checkpoint,
    name: &str,
    p: &ParamSpec,
    report: &mut Report,
) -> Option<Option<Tensor>> {
    let t = ckpt.get(name)?;
    let expected = Signature { dtype: p.dtype, shape: p.shape.clone() };
    let found = Signature { dtype: t.dtype, shape: t.shape.clone() };
    // An alias's mismatch says what it stands for: its own signature is its parameter's.
    let tied = (name != p.name).then(|| format!("tied to `{}`", p.name));
    let mismatch = |note: Option<String>| Mismatch {
        name: name.to_string(),
        expected: expected.clone(),
        found: found.clone(),
        note: match (note, &tied) {
            (Some(n), Some(t)) => Some(format!("{n}; {t}")),
            (n, t) => n.or(t.clone()),
        },
    };
    if t.shape != p.shape || kind(t.dtype) != kind(p.dtype) {
        report.mismatched.push(mismatch(None));
        return Some(None);
    }
    match convert(t, p.dtype) {
        Ok(c) => {
            if t.dtype != p.dtype {
                report.converted.push((name.to_string(), t.dtype, p.dtype));
            }
            Some(Some(c))
        }
        Err(note) => {
            report.mismatched.push(mismatch(Some(note)));
            Some(None)
        }
    }
}

/// The first element where `a` and `b` (of one dtype and shape) differ bit for bit, as a
/// phrase naming both values; `None` when they are the same bits. Bits, not values: `-0.0`
/// is not `0.0`, so the tie holds exactly what one tensor saved twice holds.
fn first_difference(a: &Tensor, b: &Tensor, a_name: &str, b_name: &str) -> Option<String> {
    let at = |i: usize, x: String, y: String| {
        Some(format!("element {i}: {x} in `{a_name}`, {y} in `{b_name}`"))
    };
    match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => {
            let i = x.iter().zip(y).position(|(p, q)| p.to_bits() != q.to_bits())?;
            at(i, x[i].to_string(), y[i].to_string())
        }
        (Data::F64(x), Data::F64(y)) => {
            let i = x.iter().zip(y).position(|(p, q)| p.to_bits() != q.to_bits())?;
            at(i, x[i].to_string(), y[i].to_string())
        }
        (Data::I32(x), Data::I32(y)) => {
            let i = x.iter().zip(y).position(|(p, q)| p != q)?;
            at(i, x[i].to_string(), y[i].to_string())
        }
        (Data::Packed(x), Data::Packed(y)) => {
            let i = x.iter().zip(y).position(|(p, q)| p != q)?;
            at(i, format!("byte {}", x[i]), format!("byte {}", y[i]))
        }
        // Matching converts both to the parameter's dtype, whose storage is one of the above.
        _ => Some("stored differently".into()),
    }
}

/// Matches checkpoint tensors to a plan's parameters by name: [`match_plan`] for a plan
/// without aliases or counters.
pub fn match_params(
    ckpt: &Checkpoint,
    params: &[ParamSpec],
    mode: MatchMode,
) -> Result<(Vec<Option<Tensor>>, Report), CheckpointError> {
    match_tensors(ckpt, params, &[], &[], mode)
}

/// Matches checkpoint tensors to `plan`'s parameters by name, taking its aliases and counters
/// into account (see the module docs). The result has one entry per parameter, in order: the
/// tensor to load (converted to the parameter's dtype), or `None` — then the session keeps or
/// computes its value (`Report::computed`, `Report::counters_started`, a partial load's
/// `missing`). Strict mode fails when anything is missing, unexpected, mismatched or untied;
/// partial mode loads what matches. Either way the report says what was found.
pub fn match_plan(
    ckpt: &Checkpoint,
    plan: &Plan,
    mode: MatchMode,
) -> Result<(Vec<Option<Tensor>>, Report), CheckpointError> {
    match_tensors(ckpt, &plan.params, &plan.aliases, &plan.counters, mode)
}

fn match_tensors(
    ckpt: &Checkpoint,
    params: &[ParamSpec],
    aliases: &[ParamAlias],
    counters: &[usize],
    mode: MatchMode,
) -> Result<(Vec<Option<Tensor>>, Report), CheckpointError> {
    let mut report = Report::default();
    let mut out: Vec<Option<Tensor>> = vec![None; params.len()];
    // Whether the file holds a tensor under the parameter's own name (matched or not).
    let mut present = vec![false; params.len()];
    let mut used = HashSet::new();
    for (i, p) in params.iter().enumerate() {
        if !p.persistent {
            // A `const` is computed by the session; a tensor of its name is not loaded.
            continue;
        }
        if let Some(t) = take(ckpt, &p.name, p, &mut report) {
            used.insert(p.name.as_str());
            present[i] = true;
            out[i] = t;
        }
    }
    for a in aliases {
        let p = &params[a.param];
        let Some(t) = take(ckpt, &a.name, p, &mut report) else { continue };
        used.insert(a.name.as_str());
        let Some(t) = t else { continue };
        match &out[a.param] {
            // The parameter's own tensor, or an earlier alias's: the two must be one tensor.
            Some(loaded) => {
                let source = match present[a.param] {
                    true => p.name.clone(),
                    false => report
                        .from_alias
                        .iter()
                        .find(|(q, _)| *q == p.name)
                        .map_or(p.name.clone(), |(_, a)| a.clone()),
                };
                match first_difference(&t, loaded, &a.name, &source) {
                    None => report.tied.push((a.name.clone(), p.name.clone())),
                    Some(note) => report.untied.push(Untied {
                        alias: a.name.clone(),
                        param: p.name.clone(),
                        note,
                    }),
                }
            }
            // Saved under its other name only (`save_pretrained` keeps one of a tie's names,
            // and not always the one the model calls the parameter).
            None if !present[a.param] => {
                report.from_alias.push((p.name.clone(), a.name.clone()));
                out[a.param] = Some(t);
            }
            // The parameter's own tensor did not fit: that is the problem reported.
            None => {}
        }
    }
    for (i, p) in params.iter().enumerate() {
        if !p.persistent {
            continue;
        }
        if out[i].is_some() {
            report.loaded.push(p.name.clone());
        } else if present[i] {
            // In the file but unusable: reported as a mismatch above.
        } else if counters.contains(&i) {
            report.counters_started.push(p.name.clone());
        } else if matches!(p.init, InitSpec::Computed(_)) {
            report.computed.push(p.name.clone());
        } else {
            let expected = Signature { dtype: p.dtype, shape: p.shape.clone() };
            report.missing.push((p.name.clone(), expected));
        }
    }
    for (name, t) in &ckpt.tensors {
        if !used.contains(name.as_str()) && !name.starts_with(OPTIM_PREFIX) {
            report
                .unexpected
                .push((name.clone(), Signature { dtype: t.dtype, shape: t.shape.clone() }));
        }
    }
    if mode == MatchMode::Strict && !report.is_clean() {
        let mut msg = format!(
            "the checkpoint does not match the model's parameters: {}\n(strict loading; partial \
             loading would load what matches)\n",
            report.first_problem()
        );
        msg.push_str(report.to_string().trim_end());
        return Err(CheckpointError::new(&ckpt.path, msg));
    }
    let loaded = params.iter().zip(&out).filter_map(|(p, t)| Some((p.name.as_str(), t.as_ref()?)));
    if let Some(list) = super::describe_non_finite(loaded) {
        return Err(CheckpointError::new(
            &ckpt.path,
            format!(
                "the checkpoint holds values that are not finite: {list}\n(a model computed with \
                 them gives NaN; they come from a run that diverged, or a damaged file)"
            ),
        ));
    }
    Ok((out, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::plan::InitSpec;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn param(name: &str, dtype: DType, shape: &[usize]) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            init: InitSpec::Constant(0.0),
            trainable: true,
            frozen: false,
            persistent: true,
        }
    }

    fn ckpt(tensors: Vec<(String, Tensor)>) -> Checkpoint {
        let mut tensors = tensors;
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Checkpoint { path: PathBuf::from("ck.safetensors"), tensors, metadata: BTreeMap::new() }
    }

    #[test]
    fn strict_match_of_a_complete_checkpoint() {
        let params = vec![
            param("fc.weight", DType::F32, &[2, 2]),
            param("fc.bias", DType::F32, &[2]),
            param("bn.n", DType::I64, &[]),
        ];
        let ck = ckpt(vec![
            ("fc.weight".into(), Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])),
            ("fc.bias".into(), Tensor::f32(vec![2], vec![5.0, 6.0])),
            ("bn.n".into(), Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![3]) }),
            ("optim.fc.weight.m".into(), Tensor::f32(vec![2, 2], vec![0.0; 4])),
            (
                "optim.step".into(),
                Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![10]) },
            ),
        ]);
        let (vals, report) = match_params(&ck, &params, MatchMode::Strict).unwrap();
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.loaded.len(), 3);
        assert_eq!(vals[1].as_ref().unwrap().to_f64_vec(), vec![5.0, 6.0]);
        assert_eq!(vals[2].as_ref().unwrap().dtype, DType::I64);
    }

    #[test]
    fn a_const_is_neither_required_nor_loaded() {
        let mut table = param("pos.table", DType::F32, &[2]);
        (table.trainable, table.persistent) = (false, false);
        let params = vec![param("fc.bias", DType::F32, &[2]), table];
        let bias = ("fc.bias".to_string(), Tensor::f32(vec![2], vec![5.0, 6.0]));
        // Without it: nothing is missing, the session computes it.
        let (vals, report) =
            match_params(&ckpt(vec![bias.clone()]), &params, MatchMode::Strict).unwrap();
        assert!(report.is_clean() && vals[1].is_none(), "{report}");
        // With a tensor of its name: that tensor is not the model's, as in PyTorch.
        let stale = ("pos.table".to_string(), Tensor::f32(vec![2], vec![7.0, 8.0]));
        let e = match_params(&ckpt(vec![bias, stale]), &params, MatchMode::Strict).unwrap_err();
        assert!(e.to_string().contains("pos.table"), "{e}");
    }

    fn messy() -> (Vec<ParamSpec>, Checkpoint) {
        let params = vec![
            param("fc1.weight", DType::F32, &[128, 64]),
            param("fc1.bias", DType::F32, &[128]),
            param("fc2.weight", DType::F32, &[10, 128]),
            param("fc2.bias", DType::F32, &[10]),
            param("emb.weight", DType::F32, &[4, 2]),
        ];
        let ck = ckpt(vec![
            ("fc1.weight".into(), Tensor::f32(vec![64, 128], vec![0.0; 64 * 128])),
            ("fc1.bias".into(), Tensor::f32(vec![128], vec![1.0; 128])),
            (
                "fc2.weight".into(),
                Tensor {
                    dtype: DType::F16,
                    shape: vec![10, 128],
                    data: Data::F32(vec![0.5; 1280]),
                },
            ),
            ("fc2.bias".into(), Tensor::i32(vec![10], vec![0; 10])),
            ("head.weight".into(), Tensor::f32(vec![3], vec![0.0; 3])),
            ("optim.fc1.weight.v".into(), Tensor::f32(vec![64, 128], vec![0.0; 64 * 128])),
        ]);
        (params, ck)
    }

    #[test]
    fn strict_match_lists_every_problem() {
        let (params, ck) = messy();
        let e = match_params(&ck, &params, MatchMode::Strict).unwrap_err();
        let m = e.to_string();
        // The first line names the file and the first problem, and counts the others.
        assert_eq!(
            m.lines().next().unwrap(),
            "ck.safetensors: the checkpoint does not match the model's parameters: `fc1.weight` \
             is f32[64, 128] in the file but f32[128, 64] in the model (and 3 more)"
        );
        assert!(
            m.contains("missing from the checkpoint (1):\n  emb.weight: expected f32[4, 2]"),
            "{m}"
        );
        assert!(
            m.contains("in the checkpoint but not in the model (1):\n  head.weight: found f32[3]"),
            "{m}"
        );
        assert!(m.contains("fc1.weight: expected f32[128, 64], found f32[64, 128]"), "{m}");
        assert!(m.contains("fc2.bias: expected f32[10], found i32[10]"), "{m}");
        assert!(!m.contains("optim."), "{m}");
        assert!(m.lines().count() >= 8, "{m}");
    }

    #[test]
    fn the_first_line_names_the_first_problem_of_any_kind() {
        let params = vec![param("a", DType::F32, &[2]), param("b", DType::F32, &[1])];
        let first = |ck: &Checkpoint| {
            let e = match_params(ck, &params, MatchMode::Strict).unwrap_err().to_string();
            e.lines().next().unwrap().to_string()
        };
        let a = || ("a".to_string(), Tensor::f32(vec![2], vec![0.0; 2]));
        let b = || ("b".to_string(), Tensor::f32(vec![1], vec![0.0]));
        let prefix = "ck.safetensors: the checkpoint does not match the model's parameters: ";
        assert_eq!(first(&ckpt(vec![a()])), format!("{prefix}`b` (f32[1]) is not in the file"));
        assert_eq!(
            first(&ckpt(vec![a(), b(), ("c".into(), Tensor::i32(vec![3], vec![0; 3]))])),
            format!("{prefix}`c` (i32[3]) is in the file but not in the model")
        );
        let u = vec![param("u", DType::U32, &[1])];
        let e = match_params(&ckpt(vec![("u".into(), Tensor::i32(vec![1], vec![-1]))]), &u, {
            MatchMode::Strict
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(&format!(
                "{prefix}`u` is i32[1] in the file but u32[1] in the model (element 0 is -1, not \
                 a u32)\n"
            )),
            "{e}"
        );
    }

    #[test]
    fn non_finite_parameters_are_refused_in_either_mode() {
        let params = vec![
            param("a", DType::F32, &[4]),
            param("b", DType::F32, &[2]),
            param("c", DType::F16, &[1]),
        ];
        let nan = f32::NAN;
        let ck = ckpt(vec![
            ("a".into(), Tensor::f32(vec![4], vec![nan, 1.0, f32::INFINITY, nan])),
            ("b".into(), Tensor::f32(vec![2], vec![0.0, 1.0])),
            ("c".into(), Tensor { dtype: DType::F16, shape: vec![1], data: Data::F32(vec![nan]) }),
        ]);
        for mode in [MatchMode::Strict, MatchMode::Partial] {
            let e = match_params(&ck, &params[..], mode).unwrap_err().to_string();
            assert_eq!(
                e.lines().next().unwrap(),
                "ck.safetensors: the checkpoint holds values that are not finite: `a` has 3 of 4 \
                 (2 NaN, 1 infinite), `c` has 1 of 1 (1 NaN)",
                "{mode:?}"
            );
        }
        let ck = ckpt(vec![
            ("a".into(), Tensor::f32(vec![4], vec![0.0; 4])),
            ("b".into(), Tensor::f32(vec![2], vec![f32::NEG_INFINITY, 1.0])),
            ("c".into(), Tensor::f32(vec![1], vec![0.0])),
            // Not a parameter of the model: not loaded (partial mode), so not refused.
            ("d".into(), Tensor::f64(vec![1], vec![f64::NAN])),
        ]);
        let e = match_params(&ck, &params, MatchMode::Partial).unwrap_err();
        assert!(
            e.message.starts_with(
                "the checkpoint holds values that are not finite: `b` has 1 \
             of 2 (1 infinite)\n"
            ),
            "{e}"
        );
    }

    #[test]
    fn partial_match_loads_what_fits() {
        let (params, ck) = messy();
        let (vals, r) = match_params(&ck, &params, MatchMode::Partial).unwrap();
        assert_eq!(r.loaded, vec!["fc1.bias", "fc2.weight"]);
        assert_eq!(r.missing.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), vec!["emb.weight"]);
        assert_eq!(
            r.unexpected.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(),
            vec!["head.weight"]
        );
        assert_eq!(
            r.mismatched.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
            vec!["fc1.weight", "fc2.bias"]
        );
        assert_eq!(r.converted, vec![("fc2.weight".to_string(), DType::F16, DType::F32)]);
        assert!(vals[0].is_none() && vals[3].is_none() && vals[4].is_none());
        assert_eq!(vals[1].as_ref().unwrap().to_f64_vec(), vec![1.0; 128]);
        let w2 = vals[2].as_ref().unwrap();
        assert_eq!((w2.dtype, w2.shape.clone()), (DType::F32, vec![10, 128]));
    }

    #[test]
    fn match_converts_within_a_kind_and_rounds_to_half() {
        let params = vec![
            param("h", DType::F16, &[1]),
            param("u", DType::U32, &[1]),
            param("n", DType::I32, &[]),
        ];
        let ck = ckpt(vec![
            ("h".into(), Tensor::f32(vec![1], vec![0.1])),
            ("u".into(), Tensor::i32(vec![1], vec![-1])),
            ("n".into(), Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![9]) }),
        ]);
        let (vals, r) = match_params(&ck, &params, MatchMode::Partial).unwrap();
        assert_eq!(
            vals[0].as_ref().unwrap().as_f32().unwrap()[0],
            half::f16::from_f32(0.1).to_f32()
        );
        assert!(vals[1].is_none());
        assert!(r.mismatched[0].note.as_ref().unwrap().contains("not a u32"));
        assert_eq!(vals[2].as_ref().unwrap(), &Tensor::i32(vec![], vec![9]));
        assert!(match_params(&ck, &params, MatchMode::Strict).is_err());
    }
}

#[cfg(test)]
mod upstream_tests;
