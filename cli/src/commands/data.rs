//! Data sets for `mgnc train` and `mgnc eval`: a safetensors file whose tensors are named like
//! the model's inputs, all with the same number of samples along the first axis.

use mgn_ir::op::Op;
use mgn_ir::tensor::{Data, Tensor};
use mgn_runtime::Plan;
use std::path::Path;

pub struct Dataset {
    /// One tensor per plan input, in the plan's input order.
    pub columns: Vec<(String, Tensor)>,
    pub len: usize,
}

impl Dataset {
    /// Loads the tensors a plan's inputs need from `path`, checking each one's per-sample
    /// shape and kind against the plan.
    pub fn load(path: &Path, plan: &Plan) -> Result<Dataset, String> {
        let ckpt = mgn_runtime::checkpoint::load(path).map_err(|e| e.to_string())?;
        let mut columns = Vec::new();
        let mut len = None;
        for (name, step) in &plan.inputs {
            let want = &plan.steps[*step as usize];
            let Some(t) = ckpt.get(name) else {
                let have: Vec<&str> = ckpt.tensors.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!(
                    "{}: no tensor `{name}` for the model input `{name}` (the file has: {})",
                    path.display(),
                    have.join(", ")
                ));
            };
            // A sample stored flat (`[N, 64]`) feeds an input of the same size per sample
            // (`[B, 1, 8, 8]`): the rows are the same bytes. Only that way: samples with a
            // shape of their own (`[N, 8, 8]`) must have the input's, as `mgnc run` requires.
            let per_sample: usize = want.shape[1..].iter().product();
            let mut t = t.clone();
            if t.shape.len() == 2 && t.shape[1] == per_sample && t.shape.len() != want.shape.len() {
                t.shape =
                    std::iter::once(t.shape[0]).chain(want.shape[1..].iter().copied()).collect();
            }
            if t.shape.len() != want.shape.len() || t.shape[1..] != want.shape[1..] {
                return Err(format!(
                    "{}: `{name}` has shape {:?}; the model's input is {:?}, so each sample must \
                     be {:?}",
                    path.display(),
                    t.shape,
                    want.shape,
                    &want.shape[1..]
                ));
            }
            let is_float = matches!(t.data, Data::F32(_) | Data::F64(_));
            if is_float != want.dtype.is_float() {
                return Err(format!(
                    "{}: `{name}` holds {} values but the model input is {}",
                    path.display(),
                    t.dtype,
                    want.dtype
                ));
            }
            if let (Data::I32(_), Some(bound)) = (&t.data, plan.int_input_range(*step)) {
                check_range(path, name, &t, bound, bound_kind(plan, *step))?;
            }
            let n = t.shape[0];
            if *len.get_or_insert(n) != n {
                return Err(format!(
                    "{}: `{name}` has {n} samples but other inputs have {}",
                    path.display(),
                    len.unwrap_or(0)
                ));
            }
            columns.push((name.clone(), t));
        }
        let len = len.ok_or_else(|| format!("{}: the model has no inputs", path.display()))?;
        if len == 0 {
            return Err(format!("{}: the data set is empty", path.display()));
        }
        Ok(Dataset { columns, len })
    }

    /// The samples at `rows`, one tensor per input.
    pub fn batch(&self, rows: &[usize]) -> Vec<(String, Tensor)> {
        self.columns
            .iter()
            .map(|(name, t)| {
                let row = t.numel() / self.len;
                let mut shape = t.shape.clone();
                shape[0] = rows.len();
                let data = match &t.data {
                    Data::F32(v) => Data::F32(
                        rows.iter()
                            .flat_map(|&r| v[r * row..(r + 1) * row].iter().copied())
                            .collect(),
                    ),
                    Data::F64(v) => Data::F32(
                        rows.iter()
                            .flat_map(|&r| v[r * row..(r + 1) * row].iter().map(|&x| x as f32))
                            .collect(),
                    ),
                    Data::I32(v) => Data::I32(
                        rows.iter()
                            .flat_map(|&r| v[r * row..(r + 1) * row].iter().copied())
                            .collect(),
                    ),
                    Data::Packed(b) => {
                        let row = b.len() / self.len;
                        Data::Packed(
                            rows.iter()
                                .flat_map(|&r| b[r * row..(r + 1) * row].iter().copied())
                                .collect(),
                        )
                    }
                };
                (name.clone(), Tensor { dtype: t.dtype, shape, data })
            })
            .collect()
    }
}

/// What bounds an integer tensor's values: the classes it labels or the rows of a table it
/// indexes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bound {
    Classes,
    Rows,
}

/// Whether the integer value `value` of `plan` labels classes (it reaches a softmax
/// cross-entropy's targets, through shape-only ops) or indexes a table.
fn bound_kind(plan: &Plan, value: u32) -> Bound {
    for (me, s) in plan.steps.iter().enumerate() {
        let Some(pos) = s.inputs.iter().position(|&x| x == value) else { continue };
        match (&s.op, pos) {
            (Op::SoftmaxCrossEntropy, 1) => return Bound::Classes,
            (Op::Reshape | Op::Slice { .. } | Op::Permute { .. }, 0)
                if bound_kind(plan, me as u32) == Bound::Classes =>
            {
                return Bound::Classes
            }
            _ => {}
        }
    }
    Bound::Rows
}

/// Refuses the first value of the integer tensor `name` (samples along its first axis) outside
/// `0..bound`, naming the file, the tensor, the sample (and the position within it), the value
/// and the class count or table size that bounds it.
pub fn check_range(
    path: &Path,
    name: &str,
    t: &Tensor,
    bound: i32,
    kind: Bound,
) -> Result<(), String> {
    let Data::I32(v) = &t.data else { return Ok(()) };
    let Some(k) = v.iter().position(|&x| x < 0 || x >= bound) else { return Ok(()) };
    let per_sample = t.shape.get(1..).map_or(1, |s| s.iter().product::<usize>()).max(1);
    let at = if per_sample > 1 {
        format!("sample {}, position {} of {per_sample},", k / per_sample, k % per_sample)
    } else {
        format!("sample {}", k / per_sample)
    };
    let why = match kind {
        Bound::Classes => {
            format!("the model has {bound} classes, so `{name}` must be from 0 to {}", bound - 1)
        }
        Bound::Rows => format!(
            "`{name}` indexes a table of {bound} rows, so it must be from 0 to {}",
            bound - 1
        ),
    };
    Err(format!("{}: `{name}` {at} is {}; {why}", path.display(), v[k]))
}

/// The batch size a plan was built for (the first axis of its inputs).
pub fn plan_batch(plan: &Plan) -> Result<usize, String> {
    let mut sizes = plan
        .inputs
        .iter()
        .map(|(_, s)| plan.steps[*s as usize].shape.first().copied().unwrap_or(1));
    let first = sizes.next().ok_or("the model has no inputs")?;
    if sizes.any(|s| s != first) {
        return Err("the model's inputs do not share a batch axis".into());
    }
    Ok(first)
}

/// Where accuracy can be measured: an integer input `labels`-like tensor and an output whose
/// shape is the labels' shape plus a class axis. Returns (input name, output name).
pub fn classification(plan_train: &Plan, plan_eval: &Plan) -> Option<(String, String)> {
    for (iname, istep) in &plan_train.inputs {
        let lab = &plan_train.steps[*istep as usize];
        if lab.dtype.is_float() {
            continue;
        }
        for (oname, ostep) in &plan_eval.outputs {
            let out = &plan_eval.steps[*ostep as usize];
            if out.shape.len() == lab.shape.len() + 1
                && out.shape[..lab.shape.len()] == lab.shape[..]
            {
                return Some((iname.clone(), oname.clone()));
            }
        }
    }
    None
}

/// Number of positions where the arg-max over the last axis of `scores` equals `labels`,
/// counting only the first `valid` samples.
pub fn correct(scores: &Tensor, labels: &Tensor, valid: usize) -> usize {
    let classes = *scores.shape.last().expect("class axis");
    let s = scores.to_f64_vec();
    let l = labels.to_f64_vec();
    let per_sample = l.len() / labels.shape[0].max(1);
    let mut right = 0;
    for (pos, label) in l.iter().enumerate().take(valid * per_sample) {
        let row = &s[pos * classes..(pos + 1) * classes];
        let best = row.iter().enumerate().fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
        right += usize::from(best as f64 == *label);
    }
    right
}
