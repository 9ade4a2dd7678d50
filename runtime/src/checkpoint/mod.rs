//! Checkpoints: safetensors files of named host tensors plus string metadata.
//!
//! Tensors are written with their declared dtype (`f32`, `f16`, `bf16`, `i32`, `i64`, `u32`,
//! `bool`), converting from the wider host storage (`f16`/`bf16` held as `F32`, integers as
//! `I32`); reading converts back. The file is written atomically, so a crash or a failed write
//! leaves the previous checkpoint intact. Metadata records `mgn.format = "1"` and, by convention,
//! the model name (`mgn.model`) and the training step (`mgn.step`).
//!
//! A packed (quantized) tensor is stored as U8 bytes of its packed shape (the last axis counted
//! in bytes: `q4_0[576, 576]` is `U8[576, 324]`), and the metadata names its type and logical
//! shape under `mgn.packed.<tensor name>` (`"q4_0[576, 576]"`): the bytes alone cannot say
//! which blocks they are. Reading checks the entry against the bytes; a U8 tensor without one
//! stays unsupported, and an entry without its tensor is an error. The entries are the
//! writer's: a loaded checkpoint's metadata holds none, and `save` writes them from the tensors.
//!
//! Loading never trusts the file: every size and offset in the header is checked against the
//! file's length before anything is allocated, and every problem (truncation, corruption, a
//! name the header lists twice, an unsupported dtype, an `i64` that does not fit the host's
//! `i32`) is an error naming the file. Parameters holding NaN or infinite values are refused
//! by [`match_params`], naming each tensor and how many of its values are not finite.
//!
//! Upstream `state_dict`s load unchanged ([`match_plan`]): a tied weight may be saved under
//! each of its names (`Plan::aliases`; the copies must be equal, bit for bit) or under one of
//! them; a counter (`Plan::counters`, BatchNorm's `num_batches_tracked`, saved as `i64`) that
//! an older checkpoint lacks starts at 0; a buffer computed from constants that the file lacks
//! keeps its computed value. Each is reported in the [`Report`]. Saving writes each tensor once
//! unless asked for the aliases' copies too (`session::SaveOptions::aliases`).
//!
//! Optimizer state is stored beside the parameters under [`OPTIM_PREFIX`]
//! (`optim.<param name>.m`, `optim.<param name>.v`, `optim.step`, named by [`crate::optim`]);
//! [`match_params`] does not count those names as unexpected. [`Checkpoint::optimizer_state`]
//! refuses a state that is not finite or lacks one of Adam's moments; `Session::load_checkpoint`
//! also refuses one of another optimizer than the plan's (`optim::check_kind`).
//!
//! The parts: `dtypes` converts one tensor between host storage and its declared dtype's bytes,
//! `write` lays out and atomically saves a file, `read` parses and checks one, and `matching`
//! pairs a checkpoint's tensors with a plan's parameters.

mod dtypes;
mod matching;
#[cfg(test)]
mod packed_tests;
mod read;
#[cfg(test)]
mod testing;
mod write;

pub use dtypes::PACKED_KEY_PREFIX;
pub use matching::{match_params, match_plan, MatchMode, Mismatch, Report, Signature, Untied};
pub use read::{from_bytes, load};
pub use write::{save, to_bytes};

use mgn_ir::plan::ParamSpec;
use mgn_ir::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Metadata key holding the checkpoint format version.
pub const FORMAT_KEY: &str = "mgn.format";
/// The format version this runtime writes and reads.
pub const FORMAT_VERSION: &str = "1";
/// Metadata key holding the model's name.
pub const MODEL_KEY: &str = "mgn.model";
/// Metadata key holding the number of training steps taken.
pub const STEP_KEY: &str = "mgn.step";
/// Prefix of the optimizer-state tensors.
pub const OPTIM_PREFIX: &str = "optim.";

/// A checkpoint problem, naming the file.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointError {
    pub path: PathBuf,
    pub message: String,
}

impl CheckpointError {
    fn new(path: &Path, message: impl Into<String>) -> CheckpointError {
        CheckpointError { path: path.to_path_buf(), message: message.into() }
    }
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for CheckpointError {}

/// A loaded checkpoint: every tensor (sorted by name) in host storage, and the metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub tensors: Vec<(String, Tensor)>,
    pub metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.tensors[i].1)
    }

    /// The model name recorded at save time, if any.
    pub fn model(&self) -> Option<&str> {
        self.metadata.get(MODEL_KEY).map(String::as_str)
    }

    /// The training step recorded at save time, if any (and if it is a number).
    pub fn step(&self) -> Option<u64> {
        self.metadata.get(STEP_KEY).and_then(|s| s.parse().ok())
    }

    /// The optimizer state stored in this checkpoint for `params` (a fresh state when there is
    /// none).
    pub fn optimizer_state(
        &self,
        params: &[ParamSpec],
    ) -> Result<mgn_ir::optim::OptimizerState, CheckpointError> {
        crate::optim::state_from_tensors(&self.tensors, params)
            .map_err(|m| CheckpointError::new(&self.path, m))
    }
}

/// The tensors among `tensors` holding NaN or infinite values, as one phrase
/// (`` `fc1.weight` has 3 of 8192 (2 NaN, 1 infinite), `fc2.bias` has ... ``), or `None` when
/// every value is finite. Integer tensors are always finite.
pub(crate) fn describe_non_finite<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
) -> Option<String> {
    fn count<T: Copy>(v: &[T], nan: impl Fn(T) -> bool, inf: impl Fn(T) -> bool) -> (usize, usize) {
        v.iter().fold((0, 0), |(n, i), &x| (n + nan(x) as usize, i + inf(x) as usize))
    }
    let mut parts = Vec::new();
    for (name, t) in tensors {
        let (nan, inf) = match &t.data {
            mgn_ir::tensor::Data::F32(v) => count(v, f32::is_nan, f32::is_infinite),
            mgn_ir::tensor::Data::F64(v) => count(v, f64::is_nan, f64::is_infinite),
            mgn_ir::tensor::Data::I32(_) => (0, 0),
            mgn_ir::tensor::Data::Packed(_) => {
                count(&t.dequantized(), f32::is_nan, f32::is_infinite)
            }
        };
        if nan + inf > 0 {
            let kinds: Vec<String> = [(nan, "NaN"), (inf, "infinite")]
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, what)| format!("{n} {what}"))
                .collect();
            parts.push(format!(
                "`{name}` has {} of {} ({})",
                nan + inf,
                t.data.len(),
                kinds.join(", ")
            ));
        }
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The standard metadata of an mgn checkpoint (the format version is added by [`save`]).
pub fn standard_metadata(model: &str, step: u64) -> Vec<(String, String)> {
    vec![(MODEL_KEY.to_string(), model.to_string()), (STEP_KEY.to_string(), step.to_string())]
}

#[cfg(test)]
mod tests {
    // These exercise the writer and the reader together.
    use super::testing::{refs, repo_file, sample, TempDir};
    use super::*;
    use mgn_ir::DType;

    #[test]
    fn round_trip_keeps_shapes_dtypes_values_and_metadata() {
        let dir = TempDir::new("rt");
        let path = dir.path("model.safetensors");
        let tensors = sample();
        save(&path, &refs(&tensors), &standard_metadata("DigitsMlp", 42)).unwrap();
        let ck = load(&path).unwrap();
        assert_eq!(ck.model(), Some("DigitsMlp"));
        assert_eq!(ck.step(), Some(42));
        assert_eq!(ck.metadata.get(FORMAT_KEY).map(String::as_str), Some("1"));
        assert_eq!(ck.tensors.len(), tensors.len());
        for (name, t) in &tensors {
            let got = ck.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(got.dtype, t.dtype, "{name}");
            assert_eq!(got.shape, t.shape, "{name}");
            let want: Vec<f64> = match t.dtype {
                DType::F16 => {
                    t.to_f64_vec().iter().map(|&x| half::f16::from_f64(x).to_f64()).collect()
                }
                DType::BF16 => {
                    t.to_f64_vec().iter().map(|&x| half::bf16::from_f64(x).to_f64()).collect()
                }
                DType::F32 => t.to_f64_vec().iter().map(|&x| x as f32 as f64).collect(),
                _ => t.to_f64_vec(),
            };
            assert_eq!(got.to_f64_vec(), want, "{name}");
        }
        // f16/bf16 come back in F32 storage, integers in I32 storage, f64 storage as f32.
        assert!(ck.get("half").unwrap().as_f32().is_some());
        assert!(ck.get("bn.num_batches_tracked").unwrap().as_i32().is_some());
        assert_eq!(ck.get("wide").unwrap().dtype, DType::F32);
        assert!(ck.get("wide").unwrap().as_f32().is_some());
        // Saving what was loaded gives the same bytes.
        let again = to_bytes(&refs(&ck.tensors), &standard_metadata("DigitsMlp", 42)).unwrap();
        assert_eq!(again, std::fs::read(&path).unwrap());
        assert_eq!(dir.entries(), vec!["model.safetensors"]);
    }

    #[test]
    fn committed_data_files_load_and_match_this_writer_byte_for_byte() {
        for (rel, n) in
            [("data/digits_train.safetensors", 1437), ("data/digits_test.safetensors", 360)]
        {
            let path = repo_file(rel);
            let ck = load(&path).unwrap();
            let images = ck.get("images").unwrap();
            let labels = ck.get("labels").unwrap();
            assert_eq!((images.dtype, images.shape.clone()), (DType::F32, vec![n, 64]), "{rel}");
            assert_eq!((labels.dtype, labels.shape.clone()), (DType::I32, vec![n]), "{rel}");
            assert!(images.as_f32().unwrap().iter().all(|&x| (0.0..=1.0).contains(&x)));
            assert!(labels.as_i32().unwrap().iter().all(|&y| (0..10).contains(&y)));
            assert_eq!(ck.metadata.get("license").map(|s| s.starts_with("CC BY 4.0")), Some(true));
            // The Python writer (scripts/safetensors_io.py) and this one agree on every byte.
            let meta: Vec<(String, String)> =
                ck.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_eq!(
                to_bytes(&refs(&ck.tensors), &meta).unwrap(),
                std::fs::read(&path).unwrap(),
                "{rel}"
            );
        }
    }

    #[test]
    fn digits_mlp_fixture_is_consistent() {
        let dir = "tests/fixtures/digits_mlp";
        let w = load(&repo_file(&format!("{dir}/weights.safetensors"))).unwrap();
        let inp = load(&repo_file(&format!("{dir}/inputs.safetensors"))).unwrap();
        let exp = load(&repo_file(&format!("{dir}/expected.safetensors"))).unwrap();
        let names: Vec<&str> = exp.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "grad.fc1.bias",
                "grad.fc1.weight",
                "grad.fc2.bias",
                "grad.fc2.weight",
                "loss",
                "output.logits"
            ]
        );
        for (name, shape) in [
            ("fc1.weight", vec![128, 64]),
            ("fc1.bias", vec![128]),
            ("fc2.weight", vec![10, 128]),
            ("fc2.bias", vec![10]),
        ] {
            assert_eq!(w.get(name).unwrap().shape, shape);
            assert_eq!(exp.get(&format!("grad.{name}")).unwrap().shape, shape);
        }
        assert_eq!(exp.get("loss").unwrap().shape, Vec::<usize>::new());

        // A second, plain-loop evaluation of the forward pass and of the bias gradients.
        let f = |ck: &Checkpoint, n: &str| ck.get(n).unwrap().to_f64_vec();
        let (w1, b1, w2, b2) =
            (f(&w, "fc1.weight"), f(&w, "fc1.bias"), f(&w, "fc2.weight"), f(&w, "fc2.bias"));
        let x = f(&inp, "images");
        let y = inp.get("labels").unwrap().as_i32().unwrap().to_vec();
        let (logits_want, loss_want) = (f(&exp, "output.logits"), f(&exp, "loss")[0]);
        let (mut loss, mut gb2) = (0.0, [0.0f64; 10]);
        for n in 0..64 {
            let h: Vec<f64> = (0..128)
                .map(|j| {
                    (b1[j] + (0..64).map(|k| x[n * 64 + k] * w1[j * 64 + k]).sum::<f64>()).max(0.0)
                })
                .collect();
            let z: Vec<f64> = (0..10)
                .map(|c| b2[c] + (0..128).map(|j| h[j] * w2[c * 128 + j]).sum::<f64>())
                .collect();
            for c in 0..10 {
                assert!((z[c] - logits_want[n * 10 + c]).abs() < 1e-5, "logit {n},{c}");
            }
            let m = z.iter().cloned().fold(f64::MIN, f64::max);
            let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            loss += (lse - z[y[n] as usize]) / 64.0;
            for c in 0..10 {
                gb2[c] += ((z[c] - lse).exp() - (c as i32 == y[n]) as i32 as f64) / 64.0;
            }
        }
        assert!((loss - loss_want).abs() < 1e-6, "{loss} vs {loss_want}");
        let gb2_want = f(&exp, "grad.fc2.bias");
        for c in 0..10 {
            assert!((gb2[c] - gb2_want[c]).abs() < 1e-7, "grad.fc2.bias[{c}]");
        }
    }
}
