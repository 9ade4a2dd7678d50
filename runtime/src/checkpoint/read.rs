//! Reading a checkpoint: the header is checked against the file before anything tensor-sized is
//! allocated, and every way a file can be wrong becomes a sentence naming the file.

use super::dtypes::{decode, packed_from_entry, PACKED_KEY_PREFIX};
use super::{Checkpoint, CheckpointError, FORMAT_KEY, FORMAT_VERSION};
use safetensors::tensor::{Dtype, SafeTensorError};
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::Path;

/// Reads a checkpoint file into host tensors.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let cannot = |r: String| CheckpointError::new(path, format!("cannot read the checkpoint: {r}"));
    // By the rule for every file mgn reads: a regular file (never a FIFO or a device), opened
    // without blocking; its size known before anything is read.
    let (mut file, len) = mgn_ir::io::open_regular(path, u64::MAX).map_err(cannot)?;
    if len >= HEADER_FIRST {
        check_sizes(&mut file, len).map_err(|m| CheckpointError::new(path, m))?;
    }
    let bytes = mgn_ir::io::read_whole(file, len).map_err(cannot)?;
    from_bytes(&bytes, path)
}

/// Files this large have their header read and checked against their size before the tensors
/// are: a truncated copy of a multi-gigabyte checkpoint is refused at once.
const HEADER_FIRST: u64 = 64 << 20;

/// Whether the header of the file (`len` bytes) describes exactly the tensor data that follows
/// it. Headers that cannot be read here are left to `from_bytes`, which describes every fault.
fn check_sizes(file: &mut std::fs::File, len: u64) -> Result<(), String> {
    use std::io::Read;
    let mut n = [0u8; 8];
    file.read_exact(&mut n).map_err(|e| mgn_ir::io::reason(&e))?;
    let n = u64::from_le_bytes(n);
    if n > 100_000_000 || n > len - 8 {
        return Ok(());
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(|e| mgn_ir::io::reason(&e))?;
    let Ok(serde_json::Value::Object(entries)) = serde_json::from_slice(&header) else {
        return Ok(());
    };
    let end = entries
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let data = len - 8 - n;
    if end != data {
        return Err(format!(
            "truncated or corrupt: the header describes {end} bytes of tensor data, but the file \
             holds {data} after the header"
        ));
    }
    Ok(())
}

/// Parses checkpoint bytes; `path` names the source in errors.
pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointError> {
    let err = |m: String| CheckpointError::new(path, m);
    // `read_metadata` checks the header length against the file, parses the header, and checks
    // that the tensors' offsets tile the data exactly and agree with their shapes and dtypes
    // (with overflow checks), all before any tensor-sized allocation.
    let (n, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| err(describe_parse_error(bytes, &e)))?;
    if let Some(what) = repeated_key(&bytes[8..8 + n]) {
        return Err(err(format!(
            "corrupt header: {what} is listed twice (a reader would keep one of them silently)"
        )));
    }
    let data = &bytes[8 + n..];
    let metadata: BTreeMap<String, String> =
        header.metadata().clone().unwrap_or_default().into_iter().collect();
    if let Some(v) = metadata.get(FORMAT_KEY) {
        if v != FORMAT_VERSION {
            return Err(err(format!(
                "checkpoint format version {v}, but this runtime reads version {FORMAT_VERSION}"
            )));
        }
    }
    // The packed tensors' entries become their tensors' types: taken out of the metadata, so
    // saving what was loaded writes them once, from the tensors.
    let mut packed: BTreeMap<String, String> = BTreeMap::new();
    let mut metadata = metadata;
    metadata.retain(|k, v| match k.strip_prefix(PACKED_KEY_PREFIX) {
        Some(name) => {
            packed.insert(name.to_string(), v.clone());
            false
        }
        None => true,
    });
    let mut tensors = Vec::new();
    for (name, info) in header.tensors() {
        let (start, end) = info.data_offsets;
        let bytes = data.get(start..end).ok_or_else(|| {
            err(format!("corrupt header: the data offsets of tensor `{name}` are out of range"))
        })?;
        let t = match (packed.remove(&name), info.dtype) {
            (Some(entry), Dtype::U8) => packed_from_entry(&name, &entry, &info.shape, bytes),
            (Some(entry), other) => Err(format!(
                "the metadata describes tensor `{name}` as packed (`{entry}`), but the file \
                 stores it as {other}, not as U8 bytes"
            )),
            (None, _) => decode(&name, info.dtype, &info.shape, bytes),
        };
        tensors.push((name, t.map_err(err)?));
    }
    if let Some((name, entry)) = packed.into_iter().next() {
        return Err(err(format!(
            "the metadata key `{PACKED_KEY_PREFIX}{name}` describes a packed tensor (`{entry}`), \
             but the file holds no tensor `{name}`"
        )));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Checkpoint { path: path.to_path_buf(), tensors, metadata })
}

/// The first name the header lists twice, described (``tensor `w` ``, ``metadata key `k` ``,
/// `` `__metadata__` ``): the `safetensors` crate reads the header into maps, which keep the
/// last of two entries with one name without a word. `header` has already been parsed as JSON.
fn repeated_key(header: &[u8]) -> Option<String> {
    let mut de = serde_json::Deserializer::from_slice(header);
    serde::de::DeserializeSeed::deserialize(FirstRepeat { top: true }, &mut de).ok().flatten()
}

/// Finds the first repeated key of a JSON object (and, at the top, of its `__metadata__`).
struct FirstRepeat {
    top: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for FirstRepeat {
    type Value = Option<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for FirstRepeat {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    /// `__metadata__` may be null.
    fn visit_unit<E>(self) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = std::collections::HashSet::new();
        let mut first = None;
        while let Some(key) = map.next_key::<String>()? {
            let inner = if self.top && key == "__metadata__" {
                map.next_value_seed(FirstRepeat { top: false })?
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
                None
            };
            let repeated = !seen.insert(key.clone());
            if first.is_none() {
                first = match (repeated, self.top) {
                    (true, true) if key == "__metadata__" => Some("`__metadata__`".to_string()),
                    (true, true) => Some(format!("tensor `{key}`")),
                    (true, false) => Some(format!("metadata key `{key}`")),
                    (false, _) => inner,
                };
            }
        }
        Ok(first)
    }
}

/// Turns a safetensors parse error into a sentence that says what is wrong with the file.
fn describe_parse_error(bytes: &[u8], e: &SafeTensorError) -> String {
    let declared = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let len = bytes.len();
    match e {
        SafeTensorError::HeaderTooSmall => format!(
            "not a safetensors checkpoint: the file has {len} bytes, fewer than the 8-byte header \
             length"
        ),
        SafeTensorError::HeaderTooLarge => format!(
            "not a safetensors checkpoint, or corrupt: the header length field says {} bytes (the \
             limit is 100 MB)",
            declared.unwrap_or(0)
        ),
        SafeTensorError::InvalidHeaderLength => format!(
            "truncated or corrupt: the header length field says {} bytes but the file has only {} \
             after it",
            declared.unwrap_or(0),
            len.saturating_sub(8)
        ),
        SafeTensorError::InvalidHeader(_) => "corrupt header: it is not UTF-8 text".into(),
        SafeTensorError::InvalidHeaderDeserialization(je) | SafeTensorError::JsonError(je) => {
            format!("corrupt header: {je}")
        }
        SafeTensorError::MetadataIncompleteBuffer => format!(
            "truncated or corrupt: the tensor data described by the header does not match the \
             {len}-byte file (it is missing or has trailing bytes)"
        ),
        SafeTensorError::ValidationOverflow => {
            "corrupt header: a tensor's declared size overflows".into()
        }
        SafeTensorError::TensorInvalidInfo => {
            "corrupt header: a tensor's shape and dtype do not match the size of its data".into()
        }
        SafeTensorError::InvalidOffset(name) => format!(
            "corrupt header: the data offsets of tensor `{name}` are out of order, overlapping or \
             out of range"
        ),
        SafeTensorError::MisalignedSlice => {
            "corrupt header: a tensor's size is not a whole number of bytes".into()
        }
        other => format!("cannot parse the checkpoint: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::dtypes::encode;
    use super::super::testing::{parse, sample_bytes, with_header};
    use super::*;
    use mgn_ir::tensor::Tensor;

    /// A large file whose header describes other tensor data than the file holds (a copy cut
    /// short) is refused from its header, before its gigabytes are read. The file is sparse:
    /// nothing of its size is written.
    #[test]
    fn a_large_file_is_checked_against_its_header_before_it_is_read() {
        let dir = super::super::testing::TempDir::new("header-first");
        let path = dir.path("big.safetensors");
        let n = (HEADER_FIRST / 4) as usize + 16;
        let mut header = format!(
            "{{\"w\":{{\"dtype\":\"F32\",\"shape\":[{n}],\"data_offsets\":[0,{}]}}}}",
            4 * n
        );
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let short = (bytes.len() + 4 * n - 64) as u64;
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(short).unwrap();
        let e = load(&path).unwrap_err().to_string();
        let want = format!("the header describes {} bytes of tensor data, but the file", 4 * n);
        assert!(e.contains(&want) && e.contains(&format!("holds {}", 4 * n - 64)), "{e}");
    }

    #[test]
    fn truncated_files_are_errors_at_every_cut() {
        let bytes = sample_bytes();
        for cut in 0..bytes.len() {
            let e = parse(&bytes[..cut]).expect_err("a truncated file must not load");
            assert!(e.to_string().starts_with("bad.safetensors: "), "{e}");
        }
        assert!(parse(&bytes).is_ok());
        let e = parse(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(e.message.contains("truncated"), "{e}");
        let e = parse(&bytes[..20]).unwrap_err();
        assert!(e.message.contains("truncated") && e.message.contains("header length"), "{e}");
        let e = parse(&bytes[..3]).unwrap_err();
        assert!(e.message.contains("fewer than the 8-byte header length"), "{e}");
        // Trailing bytes are refused too.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 4]);
        assert!(parse(&longer).is_err());
    }

    #[test]
    fn garbage_and_flipped_bytes_never_panic() {
        // Deterministic pseudo-random garbage of many lengths.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in (0..2000).step_by(37) {
            let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            assert!(parse(&junk).is_err());
        }
        let e = parse(b"this is not a checkpoint at all, just some text").unwrap_err();
        assert!(e.message.contains("header length"), "{e}");
        // Every single-byte corruption of a valid file either loads or is an error.
        let bytes = sample_bytes();
        for i in 0..bytes.len() {
            for v in [0u8, 0xFF, b'9', b'"'] {
                let mut b = bytes.clone();
                b[i] = v;
                let _ = parse(&b);
            }
        }
    }

    #[test]
    fn malicious_headers_are_refused_without_allocating() {
        // 10^12 elements, honestly sized offsets far past the end of the file.
        let h =
            r#"{"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,4000000000000]}}"#;
        let e = parse(&with_header(h, &[0; 16])).unwrap_err();
        assert!(e.message.contains("truncated or corrupt"), "{e}");
        // 10^12 elements with offsets that lie about the size.
        let h = r#"{"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,16]}}"#;
        let e = parse(&with_header(h, &[0; 16])).unwrap_err();
        assert!(e.message.contains("do not match the size"), "{e}");
        // A shape whose element count overflows.
        let h = concat!(
            r#"{"w":{"dtype":"F32","shape":[18446744073709551615,18446744073709551615],"#,
            r#""data_offsets":[0,16]}}"#
        );
        let e = parse(&with_header(h, &[0; 16])).unwrap_err();
        assert!(e.message.contains("overflows"), "{e}");
        // Offsets past the end of the data.
        let h = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        assert!(parse(&with_header(h, &[0; 8])).is_err());
        // Offsets backwards.
        let h = r#"{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}"#;
        let e = parse(&with_header(h, &[0; 8])).unwrap_err();
        assert!(e.message.contains("offsets of tensor `w`"), "{e}");
        // Absurd header lengths.
        for n in [u64::MAX, 1 << 40, 100_000_001, 1_000_000] {
            let mut b = n.to_le_bytes().to_vec();
            b.extend_from_slice(b"{}");
            let e = parse(&b).unwrap_err();
            assert!(e.message.contains("header length field says"), "{n}: {e}");
        }
        // Not JSON, not UTF-8, unknown dtype.
        assert!(parse(&with_header("{not json", &[]))
            .unwrap_err()
            .message
            .contains("corrupt header"));
        assert!(parse(&with_header("\u{0}\u{1}", &[])).is_err());
        let mut b = 4u64.to_le_bytes().to_vec();
        b.extend_from_slice(&[0xFF, 0xFE, 0xFD, 0xFC]);
        assert!(parse(&b).unwrap_err().message.contains("UTF-8"));
        let h = r#"{"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(parse(&with_header(h, &[0; 4])).unwrap_err().message.contains("corrupt header"));
    }

    #[test]
    fn duplicate_keys_in_the_header_are_refused_by_name() {
        // The `safetensors` crate keeps the last of two entries with one name, silently.
        let one = r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
        let twice = format!(r#"{{"w":{one},"w":{one}}}"#);
        let e = parse(&with_header(&twice, &[0; 4])).unwrap_err();
        assert!(e.message.contains("corrupt header: tensor `w` is listed twice"), "{e}");
        let meta = format!(r#"{{"__metadata__":{{"mgn.step":"1","mgn.step":"2"}},"w":{one}}}"#);
        let e = parse(&with_header(&meta, &[0; 4])).unwrap_err();
        assert!(e.message.contains("corrupt header: metadata key `mgn.step` is listed twice"));
        let both = format!(r#"{{"__metadata__":{{}},"w":{one},"__metadata__":{{}}}}"#);
        let e = parse(&with_header(&both, &[0; 4])).unwrap_err();
        assert!(e.message.contains("corrupt header") && e.message.contains("`__metadata__`"));
        // The same names in different places are fine; so is metadata that is null.
        let fine = format!(r#"{{"__metadata__":{{"w":"1"}},"w":{one}}}"#);
        assert!(parse(&with_header(&fine, &[0; 4])).is_ok());
        let null = format!(r#"{{"__metadata__":null,"w":{one}}}"#);
        assert!(parse(&with_header(&null, &[0; 4])).is_ok());
    }

    #[test]
    fn other_format_versions_are_refused_and_foreign_files_load() {
        let mut meta = std::collections::HashMap::new();
        meta.insert(FORMAT_KEY.to_string(), "7".to_string());
        let t = Tensor::f32(vec![1], vec![1.0]);
        let enc = encode("w", &t).unwrap();
        let bytes = safetensors::serialize([("w", &enc)], Some(meta)).unwrap();
        assert!(parse(&bytes).unwrap_err().message.contains("version 7"));
        // A file without metadata (as PyTorch or other tools may write) is fine.
        let bytes = safetensors::serialize([("w", &enc)], None).unwrap();
        let ck = parse(&bytes).unwrap();
        assert!(ck.metadata.is_empty() && ck.model().is_none());
    }

    #[test]
    fn missing_file_names_the_file() {
        let e = load(Path::new("/nonexistent/dir/x.safetensors")).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/dir/x.safetensors: cannot read"), "{e}");
    }
}
