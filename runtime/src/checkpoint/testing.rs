//! What the checkpoint tests share: a sample of every dtype, its file, a scratch directory,
//! hand-made headers, and the `safetensors` crate's writer for interoperability checks.

use super::dtypes::Encoded;
use super::{from_bytes, standard_metadata, to_bytes, Checkpoint, CheckpointError};
use mgn_ir::tensor::{Data, Tensor};
use mgn_ir::DType;
use safetensors::tensor::{Dtype as StDtype, View};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// Lets the `safetensors` crate's own writer produce files for the interoperability tests.
impl View for &Encoded {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "mgn-ckpt-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    pub(super) fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One tensor of every dtype, an empty one, and one in f64 storage.
pub(super) fn sample() -> Vec<(String, Tensor)> {
    vec![
        ("fc1.weight".into(), Tensor::f32(vec![2, 3], vec![0.5, -1.25, 3.0, 1e-3, -0.0, 7.75])),
        ("fc1.bias".into(), Tensor::f32(vec![2], vec![0.1, -0.2])),
        (
            "half".into(),
            Tensor {
                dtype: DType::F16,
                shape: vec![3],
                data: Data::F32(vec![1.0, -2.5, 0.333_333]),
            },
        ),
        (
            "brain".into(),
            Tensor { dtype: DType::BF16, shape: vec![2, 1], data: Data::F32(vec![3.0, -0.1]) },
        ),
        ("ids".into(), Tensor::i32(vec![4], vec![1, -2, i32::MAX, i32::MIN])),
        (
            "bn.num_batches_tracked".into(),
            Tensor { dtype: DType::I64, shape: vec![], data: Data::I32(vec![12345]) },
        ),
        ("u".into(), Tensor { dtype: DType::U32, shape: vec![2], data: Data::I32(vec![0, 7]) }),
        (
            "mask".into(),
            Tensor { dtype: DType::Bool, shape: vec![3], data: Data::I32(vec![1, 0, 1]) },
        ),
        ("empty".into(), Tensor::f32(vec![0, 5], vec![])),
        ("wide".into(), Tensor::f64(vec![2], vec![0.25, 1.0 / 3.0])),
    ]
}

pub(super) fn refs(v: &[(String, Tensor)]) -> Vec<(String, &Tensor)> {
    v.iter().map(|(n, t)| (n.clone(), t)).collect()
}

/// The file `sample()` saves to.
pub(super) fn sample_bytes() -> Vec<u8> {
    to_bytes(&refs(&sample()), &standard_metadata("DigitsMlp", 42)).unwrap()
}

/// Loads checkpoint bytes as the file `bad.safetensors`.
pub(super) fn parse(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    from_bytes(bytes, Path::new("bad.safetensors"))
}

/// A file of a hand-written header and data, to say what a writer never would.
pub(super) fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// A file of the repository, by its path from the root.
pub(super) fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}
