//! Writing a checkpoint: the safetensors layout, with metadata keys sorted so that the same
//! tensors always give the same bytes, and an atomic save.

use super::dtypes::{encode, packed_entry, PACKED_KEY_PREFIX};
use super::{CheckpointError, FORMAT_KEY, FORMAT_VERSION};
use mgn_ir::tensor::Tensor;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// The bytes of a safetensors file holding `tensors` and `metadata` (plus `mgn.format`).
///
/// The layout is the one the `safetensors` crate writes (tensors ordered by decreasing element
/// size, then name, so each is aligned; the header padded with spaces to a multiple of 8), but
/// the header is written here with its metadata keys sorted, so that saving the same tensors
/// always gives the same bytes (the crate's writer orders metadata by a randomized hash map).
pub fn to_bytes(
    tensors: &[(String, &Tensor)],
    metadata: &[(String, String)],
) -> Result<Vec<u8>, String> {
    let mut seen = HashSet::new();
    let mut encoded = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if name.is_empty() || name == "__metadata__" {
            return Err(format!("`{name}` cannot be a tensor name in a checkpoint"));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("tensor `{name}` is listed twice"));
        }
        encoded.push((name.as_str(), encode(name, t)?));
    }
    let packed: Vec<(String, String)> = (tensors.iter())
        .filter(|(_, t)| t.dtype.is_packed())
        .map(|(name, t)| (format!("{PACKED_KEY_PREFIX}{name}"), packed_entry(t)))
        .collect();
    let mut meta: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, v) in metadata {
        if k == FORMAT_KEY && v != FORMAT_VERSION {
            return Err(format!(
                "metadata `{FORMAT_KEY}` must be \"{FORMAT_VERSION}\" (it is set by the writer), \
                 not \"{v}\""
            ));
        }
        if k.starts_with(PACKED_KEY_PREFIX) {
            return Err(format!(
                "metadata key `{k}` is set by the writer, from the packed tensors it saves"
            ));
        }
        if meta.insert(k, v).is_some() {
            return Err(format!("metadata key `{k}` is listed twice"));
        }
    }
    meta.insert(FORMAT_KEY, FORMAT_VERSION);
    for (k, v) in &packed {
        meta.insert(k, v);
    }
    encoded.sort_by(|(ln, l), (rn, r)| r.dtype.bitsize().cmp(&l.dtype.bitsize()).then(ln.cmp(rn)));

    let json = |s: &str| serde_json::to_string(s).expect("strings always serialize");
    let mut header = format!(
        "{{\"__metadata__\":{}",
        serde_json::to_string(&meta).expect("a string map always serializes")
    );
    let mut offset = 0usize;
    for (name, e) in &encoded {
        let end = offset + e.bytes.len();
        header.push_str(&format!(
            ",{}:{{\"dtype\":{},\"shape\":{},\"data_offsets\":[{offset},{end}]}}",
            json(name),
            json(&e.dtype.to_string()),
            serde_json::to_string(&e.shape).expect("a shape always serializes")
        ));
        offset = end;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + offset);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for (_, e) in &encoded {
        out.extend_from_slice(&e.bytes);
    }
    Ok(out)
}

/// Writes a checkpoint atomically: the previous file at `path`, if any, stays intact unless the
/// new one is completely written.
pub fn save(
    path: &Path,
    tensors: &[(String, &Tensor)],
    metadata: &[(String, String)],
) -> Result<(), CheckpointError> {
    let bytes = to_bytes(tensors, metadata).map_err(|m| CheckpointError::new(path, m))?;
    mgn_ir::io::write_atomic(path, &bytes)
        .map_err(|e| CheckpointError::new(path, format!("cannot write the checkpoint: {e}")))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{refs, TempDir};
    use super::super::{load, standard_metadata};
    use super::*;
    use mgn_ir::tensor::Data;
    use mgn_ir::DType;

    #[test]
    fn save_refuses_inconsistent_tensors() {
        let bad_len = Tensor { dtype: DType::F32, shape: vec![3], data: Data::F32(vec![1.0]) };
        let neg_u32 = Tensor { dtype: DType::U32, shape: vec![1], data: Data::I32(vec![-1]) };
        let bad_bool = Tensor { dtype: DType::Bool, shape: vec![1], data: Data::I32(vec![2]) };
        let float_as_int = Tensor { dtype: DType::I32, shape: vec![1], data: Data::F32(vec![1.0]) };
        let ok = Tensor::f32(vec![1], vec![1.0]);
        for (name, t, want) in [
            ("a", &bad_len, "holds 1 values"),
            ("b", &neg_u32, "u32"),
            ("c", &bad_bool, "bool"),
            ("d", &float_as_int, "floating-point"),
        ] {
            let e = to_bytes(&[(name.to_string(), t)], &[]).unwrap_err();
            assert!(e.contains(&format!("`{name}`")) && e.contains(want), "{e}");
        }
        let e = to_bytes(&[("x".into(), &ok), ("x".into(), &ok)], &[]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = to_bytes(&[("__metadata__".into(), &ok)], &[]).unwrap_err();
        assert!(e.contains("cannot be a tensor name"), "{e}");
        let e = to_bytes(&[], &[(FORMAT_KEY.into(), "2".into())]).unwrap_err();
        assert!(e.contains("mgn.format"), "{e}");
    }

    #[test]
    fn failed_write_leaves_previous_file_and_no_temp_files() {
        let dir = TempDir::new("atomic");
        let path = dir.path("ck.safetensors");
        let old = vec![("w".to_string(), Tensor::f32(vec![2], vec![1.0, 2.0]))];
        save(&path, &refs(&old), &standard_metadata("M", 1)).unwrap();
        let before = std::fs::read(&path).unwrap();
        let new = vec![("w".to_string(), Tensor::f32(vec![2], vec![3.0, 4.0]))];

        // 1. An encoding error: nothing is written.
        let broken = Tensor { dtype: DType::F32, shape: vec![5], data: Data::F32(vec![0.0]) };
        let e = save(&path, &[("w".into(), &broken)], &[]).unwrap_err();
        assert!(e.to_string().contains("ck.safetensors"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(dir.entries(), vec!["ck.safetensors"]);

        // 2. The temporary file cannot be created (simulated: a directory is in its place).
        let blocker = dir.path(&format!(".ck.safetensors.tmp{}", std::process::id()));
        std::fs::create_dir(&blocker).unwrap();
        let e = save(&path, &refs(&new), &standard_metadata("M", 2)).unwrap_err();
        assert!(
            e.to_string().contains("ck.safetensors") && e.message.contains("cannot write"),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
        std::fs::remove_dir(&blocker).unwrap();
        assert_eq!(dir.entries(), vec!["ck.safetensors"]);

        // 3. A read-only directory (only meaningful when not running as root).
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o555)).unwrap();
            let writable = std::fs::File::create(dir.path("probe")).is_ok();
            if writable {
                let _ = std::fs::remove_file(dir.path("probe"));
            } else {
                assert!(save(&path, &refs(&new), &standard_metadata("M", 2)).is_err());
                assert_eq!(std::fs::read(&path).unwrap(), before);
                assert_eq!(dir.entries(), vec!["ck.safetensors"]);
            }
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        }

        // And a successful save replaces it, leaving only the one file.
        save(&path, &refs(&new), &standard_metadata("M", 2)).unwrap();
        assert_eq!(load(&path).unwrap().get("w").unwrap().to_f64_vec(), vec![3.0, 4.0]);
        assert_eq!(dir.entries(), vec!["ck.safetensors"]);
    }
}
