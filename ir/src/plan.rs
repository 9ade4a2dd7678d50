//! The Plan: the compiled artifact an app embeds. It lists the model's inputs, outputs,
//! parameters (with checkpoint names and initializers), the ordered steps to execute, and for
//! training plans the gradient of each trainable parameter and the optimizer.
//!
//! On disk (`.mgnplan`): the 8-byte magic `MGNPLAN\0`, the format version as a little-endian
//! u32, a checksum of the body (FNV-1a, 64 bits, little-endian), then the plan as JSON. A file
//! with another version, a body that is not the one mgnc wrote (an edit made outside mgnc: a
//! rewired step, a changed dtype) or a broken body is refused with an error that names the file
//! and the problem.

use crate::op::{fmt_f64, Op};
use crate::optim::OptimizerSpec;
use crate::precision::{LossScaling, Precision};
use crate::DType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

pub const PLAN_MAGIC: &[u8; 8] = b"MGNPLAN\0";
pub const PLAN_VERSION: u32 = 2;
/// Bytes before the JSON body: magic, version, checksum.
const HEADER: usize = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Forward only; batch norm uses running statistics, dropout is the identity.
    Infer,
    /// Forward, loss, backward and the optimizer update.
    Train,
}

/// Where in the model's source a step came from, for error and NaN reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct SourceLoc {
    pub file: String,
    pub line: u32,
    pub column: u32,
}

impl std::fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// One operation. Its result is value `i` for step `i`; `inputs` name earlier steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub op: Op,
    pub inputs: Vec<u32>,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub loc: SourceLoc,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamSpec {
    /// Dotted checkpoint name (`blocks.0.attn.q_proj.weight`).
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub init: InitSpec,
    /// `false` for buffers: saved and loaded, never trained.
    pub trainable: bool,
    /// Frozen parameters are trainable in kind but excluded from this plan's updates.
    #[serde(default)]
    pub frozen: bool,
    /// `false` for `const` fields: computed from their `init` by every session, never saved in
    /// or loaded from a checkpoint (PyTorch's non-persistent buffers).
    #[serde(default = "persistent_by_default", skip_serializing_if = "is_true")]
    pub persistent: bool,
}

fn persistent_by_default() -> bool {
    true
}

/// Persistent tensors leave the field out, so plans without `const` fields keep their bytes.
fn is_true(b: &bool) -> bool {
    *b
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub model: String,
    pub mode: Mode,
    /// Model arguments it was built with (after defaults and `--set`).
    pub config: Vec<(String, String)>,
    pub params: Vec<ParamSpec>,
    pub steps: Vec<Step>,
    pub inputs: Vec<(String, u32)>,
    pub outputs: Vec<(String, u32)>,
    pub loss: Option<u32>,
    /// Training plans: (parameter index, step holding its gradient) for each trained parameter.
    pub grads: Vec<(usize, u32)>,
    pub optimizer: OptimizerSpec,
    /// State the plan carries from one run to the next: (parameter index, step whose value
    /// replaces that buffer once the run is over). Every step of the run reads the old value.
    /// The written tensors are buffers or `state` fields (never trained); a KV cache is one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_writes: Vec<(usize, u32)>,
    /// Second checkpoint names of parameters (tied weights, `tied(…)` in the language): Hugging
    /// Face's GPT-2 lists `lm_head.weight` beside `transformer.wte.weight`, the same tensor.
    /// An alias is no parameter of its own: loading accepts it when it equals the parameter it
    /// names, and saving may write it as upstream does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<ParamAlias>,
    /// Buffers that count the training steps run (BatchNorm's `num_batches_tracked`): the
    /// session adds one to each after every training step of this plan (an inference plan
    /// lists them too and never counts). No step reads them; a checkpoint may lack one (it then
    /// starts at 0, as PyTorch's BatchNorm loads older checkpoints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<usize>,
    /// A plan over dynamic sizes (`mgnc build --dynamic`): the sizes, and the numbers of its
    /// steps that depend on them. The plan as written is the plan at the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<crate::dynamic::Dynamic>,
    /// The precision policy it was built with (`mgnc build --precision`; f32 when absent).
    #[serde(default, skip_serializing_if = "Precision::is_f32")]
    pub precision: Precision,
    /// Dynamic loss scaling: `f16` training plans (`precision::LossScaling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaling: Option<LossScaling>,
}

/// Another checkpoint name for parameter `param` (see [`Plan::aliases`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamAlias {
    pub name: String,
    pub param: usize,
}

#[derive(Debug)]
pub struct PlanError(pub String);

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlanError {}

impl Plan {
    /// A plan of `steps` reading the named `inputs` and returning the named `outputs`, without
    /// parameters, loss or gradients: what the hand-built plans of unit tests start from.
    pub fn of_steps(
        mode: Mode,
        steps: Vec<Step>,
        inputs: Vec<(String, u32)>,
        outputs: Vec<(String, u32)>,
    ) -> Plan {
        Plan {
            model: "T".into(),
            mode,
            config: vec![],
            params: vec![],
            steps,
            inputs,
            outputs,
            loss: None,
            grads: vec![],
            optimizer: OptimizerSpec::default(),
            state_writes: vec![],
            aliases: vec![],
            counters: vec![],
            dynamic: None,
            precision: Precision::F32,
            loss_scaling: None,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        file_bytes(&serde_json::to_vec(self).expect("plans always serialize"))
    }

    /// Parses and validates a plan; `name` is used in error messages.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Plan, PlanError> {
        let err = |m: String| PlanError(format!("{name}: {m}"));
        if bytes.len() < 12 || &bytes[..8] != PLAN_MAGIC {
            return Err(err(
                "not an mgn plan (the file does not start with the plan header)".into()
            ));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != PLAN_VERSION {
            return Err(err(format!(
                "plan format version {version}, but this runtime reads version {PLAN_VERSION}; \
                 rebuild the plan with this mgnc"
            )));
        }
        let body = bytes.get(HEADER..).ok_or_else(|| err("the plan header is cut short".into()))?;
        let sum = u64::from_le_bytes(bytes[12..HEADER].try_into().expect("8 bytes"));
        if sum != checksum(body) {
            return Err(err(
                "the plan is not the one mgnc wrote (its checksum does not match its contents: \
                 it was edited or damaged); rebuild it with `mgnc build`"
                    .into(),
            ));
        }
        let plan: Plan = serde_json::from_slice(body).map_err(|e| err(corrupt(&e)))?;
        plan.validate()
            .map_err(|m| err(format!("invalid plan: {m} (rebuild it with this mgnc)")))?;
        Ok(plan)
    }

    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        crate::io::write_atomic(path, &self.to_bytes())
            .map_err(|e| PlanError(format!("cannot write {}: {e}", path.display())))
    }

    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        let bytes = crate::io::read_regular(path, u64::MAX)
            .map_err(|e| PlanError(format!("cannot read {}: {e}", path.display())))?;
        Plan::from_bytes(&bytes, &path.display().to_string())
    }

    /// The exclusive upper bound of the values an integer step may hold for the plan to be
    /// valid: the size of the table it indexes (`Gather`) or the number of classes it labels
    /// (`SoftmaxCrossEntropy`), followed through shape-only ops (reshape, slice, permute); the
    /// smallest when it feeds several. `None` when nothing bounds it (a mask or a timestep that
    /// is only cast to floats). Random inputs for tests and benchmarks draw from `0..bound`.
    pub fn int_input_range(&self, value: u32) -> Option<i32> {
        let mut bound: Option<i32> = None;
        for (me, s) in self.steps.iter().enumerate() {
            let Some(pos) = s.inputs.iter().position(|&x| x == value) else { continue };
            let b = match (&s.op, pos) {
                (Op::Gather { axis }, 1) => {
                    Some(self.steps[s.inputs[0] as usize].shape[*axis] as i32)
                }
                (Op::TakeAlong { axis }, 1) => {
                    Some(self.steps[s.inputs[0] as usize].shape[*axis] as i32)
                }
                (Op::SoftmaxCrossEntropy, 1) => {
                    self.steps[s.inputs[0] as usize].shape.last().map(|&c| c as i32)
                }
                (Op::Reshape | Op::Slice { .. } | Op::Permute { .. }, 0) => {
                    self.int_input_range(me as u32)
                }
                _ => None,
            };
            bound = match (bound, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        bound
    }

    /// The first thing wrong with this plan, if any (see [`crate::valid`]): a hand-edited,
    /// truncated or foreign plan fails here and not mid-run.
    pub fn validate(&self) -> Result<(), String> {
        crate::valid::validate(self)
    }
}

/// A plan file's bytes for the JSON `body`: the header (magic, version, the body's checksum),
/// then the body.
pub fn file_bytes(body: &[u8]) -> Vec<u8> {
    let mut out = PLAN_MAGIC.to_vec();
    out.extend_from_slice(&PLAN_VERSION.to_le_bytes());
    out.extend_from_slice(&checksum(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// FNV-1a over the body: it tells a plan mgnc wrote from one changed after (by hand, by a
/// script, by a damaged disk). Not a defence against someone who means to forge a plan —
/// anyone can recompute it — but an edit made outside mgnc is refused, not run.
fn checksum(body: &[u8]) -> u64 {
    body.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// A plan body that does not parse: serde's sentence, except that an unknown name (an op or
/// dtype this runtime does not have) is named without serde's list of every known one.
fn corrupt(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.strip_prefix("unknown variant `").and_then(|r| r.split_once('`')) {
        Some((name, _)) => format!(
            "corrupt plan: unknown op or value `{name}` at line {} column {} (the plan was \
             written by another version of mgnc, or edited)",
            e.line(),
            e.column()
        ),
        None => format!("corrupt plan: {msg}"),
    }
}

/// How a parameter or buffer is initialized.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum InitSpec {
    Constant(f64),
    Normal {
        mean: f64,
        std: f64,
    },
    Uniform {
        low: f64,
        high: f64,
    },
    /// A table computed from constants alone (sinusoids, position ids, masks): steps in the
    /// plan's own form with no inputs or parameters, the last one the value. Sessions run it
    /// on the host reference backend when they initialize the tensor.
    Computed(Vec<Step>),
}

impl fmt::Display for InitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitSpec::Constant(v) if *v == 0.0 => write!(f, "zeros"),
            InitSpec::Constant(v) if *v == 1.0 => write!(f, "ones"),
            InitSpec::Constant(v) => write!(f, "constant({})", fmt_f64(*v)),
            InitSpec::Normal { mean, std } => {
                write!(f, "normal({}, {})", fmt_f64(*mean), fmt_f64(*std))
            }
            InitSpec::Uniform { low, high } => {
                write!(f, "uniform({}, {})", fmt_g(*low), fmt_g(*high))
            }
            InitSpec::Computed(steps) => match steps.last() {
                Some(last) => write!(f, "computed by {} steps ({})", steps.len(), last.loc),
                None => write!(f, "computed by no steps"),
            },
        }
    }
}

/// Six significant digits, for derived bounds such as 1/sqrt(784).
fn fmt_g(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::BinaryOp;

    fn tiny() -> Plan {
        let step = |op, inputs: Vec<u32>, shape: Vec<usize>| Step {
            op,
            inputs,
            dtype: DType::F32,
            shape,
            loc: SourceLoc { file: "m.mgn".into(), line: 3, column: 5 },
        };
        Plan {
            model: "M".into(),
            mode: Mode::Infer,
            config: vec![("n".into(), "2".into())],
            params: vec![ParamSpec {
                name: "w".into(),
                dtype: DType::F32,
                shape: vec![2],
                init: InitSpec::Constant(1.0),
                trainable: true,
                frozen: false,
                persistent: true,
            }],
            steps: vec![
                step(Op::Input { name: "x".into() }, vec![], vec![2]),
                step(Op::Param { index: 0 }, vec![], vec![2]),
                step(Op::Binary(BinaryOp::Add), vec![0, 1], vec![2]),
            ],
            inputs: vec![("x".into(), 0)],
            outputs: vec![("y".into(), 2)],
            loss: None,
            grads: vec![],
            optimizer: OptimizerSpec::default(),
            state_writes: vec![],
            aliases: vec![],
            counters: vec![],
            dynamic: None,
            precision: Precision::F32,
            loss_scaling: None,
        }
    }

    #[test]
    fn round_trips_through_bytes_and_files() {
        let p = tiny();
        assert_eq!(Plan::from_bytes(&p.to_bytes(), "p").expect("valid"), p);
        let dir = std::env::temp_dir().join(format!("mgn-plan-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("m.mgnplan");
        p.save(&path).expect("writable");
        assert_eq!(Plan::load(&path).expect("readable"), p);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn other_versions_and_corrupt_files_are_clear_errors() {
        let mut bytes = tiny().to_bytes();
        bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
        let e = Plan::from_bytes(&bytes, "old.mgnplan").unwrap_err().to_string();
        assert!(
            e.contains("old.mgnplan") && e.contains("version 7") && e.contains("rebuild"),
            "{e}"
        );

        let e = Plan::from_bytes(b"PK\x03\x04 not a plan", "z.mgnplan").unwrap_err().to_string();
        assert!(e.contains("not an mgn plan"), "{e}");

        let good = tiny().to_bytes();
        let e = Plan::from_bytes(&good[..12], "cut.mgnplan").unwrap_err().to_string();
        assert!(e.starts_with("cut.mgnplan: the plan header is cut short"), "{e}");
        // A truncated body no longer has the checksum of the body mgnc wrote.
        for cut in [40, good.len() / 2, good.len() - 1] {
            let e = Plan::from_bytes(&good[..cut], "cut.mgnplan").unwrap_err().to_string();
            assert!(e.starts_with("cut.mgnplan: the plan is not the one mgnc"), "cut {cut}: {e}");
        }
        // A body with the right checksum that does not parse is still named as corrupt.
        let body = &good[20..good.len() / 2];
        let e = Plan::from_bytes(&file_bytes(body), "cut.mgnplan").unwrap_err().to_string();
        assert!(e.starts_with("cut.mgnplan: corrupt plan"), "{e}");
    }

    #[test]
    fn integer_ranges_follow_tables_and_class_counts() {
        let step = |op, inputs: Vec<u32>, dtype, shape: Vec<usize>| Step {
            op,
            inputs,
            dtype,
            shape,
            loc: SourceLoc::default(),
        };
        let mut p = tiny();
        p.steps = vec![
            step(Op::Input { name: "ids".into() }, vec![], DType::I32, vec![6]),
            step(Op::Param { index: 0 }, vec![], DType::F32, vec![7, 2]),
            step(Op::Reshape, vec![0], DType::I32, vec![2, 3]),
            step(Op::Gather { axis: 0 }, vec![1, 2], DType::F32, vec![2, 3, 2]),
            step(Op::Input { name: "mask".into() }, vec![], DType::I32, vec![6]),
            step(Op::Cast, vec![4], DType::F32, vec![6]),
        ];
        assert_eq!(p.int_input_range(0), Some(7), "through the reshape to the table's rows");
        assert_eq!(p.int_input_range(4), None, "only cast: nothing bounds it");
    }
}
