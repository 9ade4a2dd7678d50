//! Packed tensors in checkpoints: U8 bytes of their packed shape, described by a
//! `mgn.packed.<name>` metadata entry, and the four ways matching loads them.

use super::testing::{parse, refs, with_header, TempDir};
use super::*;
use mgn_ir::dtype::PACKED;
use mgn_ir::plan::{InitSpec, ParamSpec};
use mgn_ir::DType;

/// `rows × cols` values with a spread of magnitudes, deterministic.
fn values(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
}

fn param(name: &str, dtype: DType, shape: &[usize]) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        init: InitSpec::Constant(0.0),
        trainable: false,
        frozen: true,
        persistent: true,
    }
}

#[test]
fn packed_tensors_round_trip_as_u8_bytes_with_their_entries() {
    let dir = TempDir::new("packed");
    let path = dir.path("q.safetensors");
    let mut tensors: Vec<(String, Tensor)> = PACKED
        .iter()
        .map(|&d| (format!("w.{d}"), Tensor::quantized(d, vec![3, 512], &values(3, 512))))
        .collect();
    tensors.push(("bias".into(), Tensor::f32(vec![2], vec![0.5, -1.0])));
    save(&path, &refs(&tensors), &standard_metadata("M", 3)).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let q4 = st.tensor("w.q4_0").unwrap();
    assert_eq!(q4.dtype(), safetensors::Dtype::U8);
    assert_eq!(q4.shape(), &[3, 512 / 32 * 18]);
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    assert_eq!(meta["mgn.packed.w.q4_0"], "q4_0[3, 512]");
    assert_eq!(meta["mgn.packed.w.q6_k"], "q6_k[3, 512]");
    assert!(!meta.contains_key("mgn.packed.bias"));

    let ck = load(&path).unwrap();
    for (name, t) in &tensors {
        assert_eq!(ck.get(name), Some(t), "{name}");
    }
    // The entries became the tensors' types: the metadata keeps only the rest, and saving
    // what was loaded writes the same bytes.
    assert!(ck.metadata.keys().all(|k| !k.starts_with(PACKED_KEY_PREFIX)));
    let meta: Vec<(String, String)> = ck
        .metadata
        .iter()
        .filter(|(k, _)| *k != FORMAT_KEY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(to_bytes(&refs(&ck.tensors), &meta).unwrap(), bytes);
    let e = to_bytes(&[], &[("mgn.packed.w".into(), "q4_0[32]".into())]).unwrap_err();
    assert!(e.contains("set by the writer"), "{e}");
}

/// A file of one U8 tensor `w` of `file_shape` holding `n` bytes, with `entry` (if any) as
/// metadata key `key`.
fn u8_file(key: &str, entry: Option<&str>, file_shape: &[usize], n: usize) -> Vec<u8> {
    let meta = entry.map(|e| format!(r#""__metadata__":{{"{key}":"{e}"}},"#)).unwrap_or_default();
    let h =
        format!(r#"{{{meta}"w":{{"dtype":"U8","shape":{file_shape:?},"data_offsets":[0,{n}]}}}}"#);
    with_header(&h, &vec![0u8; n])
}

#[test]
fn corrupt_packed_entries_are_errors_naming_file_tensor_and_problem() {
    let key = "mgn.packed.w";
    let ok = parse(&u8_file(key, Some("q4_0[2, 64]"), &[2, 36], 72)).unwrap();
    assert_eq!(ok.get("w").unwrap().dtype, DType::Q4_0);
    for (file, want) in [
        (u8_file(key, Some("q5_9[2, 64]"), &[2, 36], 72), "`q5_9`, not a packed type (q8_0"),
        (u8_file(key, Some("f32[2, 64]"), &[2, 36], 72), "`f32`, not a packed type"),
        (u8_file(key, Some("q4_0[2, 64]"), &[2, 35], 70), "takes 72 bytes, but the file holds 70"),
        (u8_file(key, Some("q4_0[2, 64]"), &[72], 72), "stored with the shape [2, 36]"),
        (u8_file(key, Some("q4_0[2, 48]"), &[2, 27], 54), "48 is not a multiple of 32"),
        (u8_file(key, Some("q4_0 2, 64"), &[2, 36], 72), "is not of the form"),
        (u8_file(key, Some("q4_0[2, x]"), &[2, 36], 72), "not a list of sizes"),
        (u8_file(key, Some("q4_0[]"), &[2, 36], 72), "needs an axis"),
        (
            u8_file(key, Some("q8_0[18446744073709551615, 64]"), &[2, 36], 72),
            "an impossible number of bytes",
        ),
        (u8_file(key, None, &[2, 36], 72), "dtype U8, which mgn does not support"),
    ] {
        let e = parse(&file).expect_err(want).to_string();
        assert!(e.starts_with("bad.safetensors: ") && e.contains(want), "{want}: {e}");
        assert!(e.contains("`w`"), "{e}");
    }
    let h = r#"{"__metadata__":{"mgn.packed.w":"q4_0[1, 32]","mgn.packed.v":"q8_0[1, 32]"},
        "w":{"dtype":"U8","shape":[1, 18],"data_offsets":[0,18]}}"#;
    let e = parse(&with_header(h, &[0; 18])).unwrap_err().to_string();
    assert!(e.contains("`mgn.packed.v`") && e.contains("holds no tensor `v`"), "{e}");
    let h = r#"{"__metadata__":{"mgn.packed.w":"q4_0[1, 32]"},
        "w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let e = parse(&with_header(h, &[0; 4])).unwrap_err().to_string();
    assert!(e.contains("stores it as F32, not as U8"), "{e}");
}

#[test]
fn packed_and_float_tensors_load_into_packed_and_float_parameters() {
    let v = values(2, 256);
    let q4 = Tensor::quantized(DType::Q4_K, vec![2, 256], &v);
    let dir = TempDir::new("packed-match");
    let path = dir.path("m.safetensors");
    let tensors = vec![
        ("same".to_string(), q4.clone()),
        ("quantize".to_string(), Tensor::f32(vec![2, 256], v.clone())),
        ("decode".to_string(), q4.clone()),
        ("requantize".to_string(), q4.clone()),
    ];
    save(&path, &refs(&tensors), &[]).unwrap();
    let ck = load(&path).unwrap();
    let params = vec![
        param("same", DType::Q4_K, &[2, 256]),
        param("quantize", DType::Q8_0, &[2, 256]),
        param("decode", DType::F32, &[2, 256]),
        param("requantize", DType::Q6_K, &[2, 256]),
    ];
    let (vals, report) = match_params(&ck, &params, MatchMode::Strict).unwrap();
    assert!(report.is_clean(), "{report}");
    let got = |i: usize| vals[i].clone().unwrap();
    // As is: the same bytes, no note.
    assert_eq!(got(0), q4);
    // Float into packed: quantized.
    assert_eq!(got(1), Tensor::quantized(DType::Q8_0, vec![2, 256], &v));
    // Packed into float: decoded.
    assert_eq!(got(2), Tensor::f32(vec![2, 256], q4.dequantized()));
    // Packed into another packed type: decoded, then quantized.
    assert_eq!(got(3), Tensor::quantized(DType::Q6_K, vec![2, 256], &q4.dequantized()));
    assert_eq!(
        report.converted,
        vec![
            ("quantize".to_string(), DType::F32, DType::Q8_0),
            ("decode".to_string(), DType::Q4_K, DType::F32),
            ("requantize".to_string(), DType::Q4_K, DType::Q6_K),
        ]
    );
    assert!(report.to_string().contains("decode: q4_k -> f32"), "{report}");
    // A float tensor whose last axis is not whole blocks of the parameter's type is a
    // mismatch that says why, not a panic.
    let odd = Checkpoint {
        path: "o.safetensors".into(),
        tensors: vec![("w".into(), Tensor::f32(vec![2, 48], values(2, 48)))],
        metadata: Default::default(),
    };
    let e = match_params(&odd, &[param("w", DType::Q4_0, &[2, 48])], MatchMode::Strict);
    assert!(e.unwrap_err().to_string().contains("not a multiple of 32"));
}
