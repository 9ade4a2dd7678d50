//! The GGUF front end on the committed fixtures (tests/fixtures/gguf, written by
//! scripts/gguf_fixtures.py with llama.cpp's `gguf` package): every decoded type equals
//! `gguf.quants.dequantize`; truncated and corrupt files, unknown architectures, metadata the
//! model cannot express and unsupported types are errors that say so, never panics.

use mgn_import::gguf::read::{self, Value};
use mgn_import::gguf::{import, quants};
use mgn_import::Options;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> (PathBuf, Vec<u8>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf").join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, bytes)
}

fn problems(path: &Path, bytes: &[u8]) -> Vec<String> {
    match import(path, bytes, &Options::default()) {
        Ok(_) => panic!("{} imported", path.display()),
        Err(e) => e.problems,
    }
}

#[test]
fn every_decoded_type_equals_the_gguf_packages_dequantize() {
    let (_, bytes) = fixture("quants.gguf");
    let g = read::parse(&bytes).expect("parses");
    let names = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"];
    for name in names {
        let find = |n: &str| g.tensors.iter().find(|t| t.name == n).expect("the tensor");
        let (t, want) = (find(name), find(&format!("{name}.expected")));
        let (block, size) = quants::layout(t.ggml_type).expect("decodable");
        let len = t.numel() as usize / block * size;
        let got = quants::dequantize(t.ggml_type, &bytes[t.start..t.start + len]).unwrap();
        let want = quants::dequantize(quants::F32, &bytes[want.start..want.start + 4 * 512]);
        assert_eq!(got, want.unwrap(), "{name}: every value bit for bit");
        assert_eq!(read::type_name(t.ggml_type), name);
    }
}

#[test]
fn a_truncated_file_is_an_error_at_every_length() {
    let (path, bytes) = fixture("llama_q4_0.gguf");
    let g = read::parse(&bytes).expect("the whole file parses");
    assert_eq!((g.version, g.alignment, g.tensors.len()), (3, 32, 20));
    // Every cut inside the header, then a sample of cuts inside the tensor data.
    let cuts = (0..g.data_start).chain((g.data_start..bytes.len()).step_by(97));
    for cut in cuts {
        let e = problems(&path, &bytes[..cut]);
        assert_eq!(e.len(), 1, "cut at {cut}: {e:?}");
        assert!(
            ["ends inside", "past the end", "more than the"].iter().any(|s| e[0].contains(s))
                || cut < 4,
            "cut at {cut}: {}",
            e[0]
        );
    }
}

#[test]
fn corrupt_counts_are_refused_before_anything_is_allocated() {
    let (path, bytes) = fixture("llama_f32.gguf");
    // The tensor count (bytes 8..16) and the metadata count (16..24) set to 2^62.
    for at in [8, 16] {
        let mut b = bytes.clone();
        b[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let e = problems(&path, &b);
        assert!(e[0].contains("more than the"), "{e:?}");
    }
    let mut b = bytes.clone();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(problems(&path, &b)[0].contains("GGUF version 1"));
    // The first key's length (bytes 24..32) made huge.
    let mut b = bytes.clone();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(problems(&path, &b)[0].contains("ends inside metadata key 0"));
}

/// A GGUF file written from parts, to vary one thing at a time.
fn write(metadata: &[(String, Value)], tensors: &[(String, u32, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Str(s) => string(out, s),
            Value::Bool(b) => out.push(*b as u8),
            other => panic!("the test writer does not write {other:?}"),
        }
    }
    let ty = |v: &Value| match v {
        Value::U32(_) => 4u32,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        _ => unreachable!(),
    };
    let align = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        Some((_, Value::U32(a))) => *a as usize,
        _ => 32,
    };
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut out, k);
        out.extend(ty(v).to_le_bytes());
        value(&mut out, v);
    }
    let mut offset = 0u64;
    for (name, t, dims, data) in tensors {
        string(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(t.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += data.len().div_ceil(align) as u64 * align as u64;
    }
    out.resize(out.len().div_ceil(align) * align, 0);
    for (_, _, _, data) in tensors {
        let start = out.len();
        out.extend(data);
        out.resize(start + data.len().div_ceil(align) * align, 0);
    }
    out
}

/// The fixture's metadata and tensors, to be varied and written back.
type Parts = (Vec<(String, Value)>, Vec<(String, u32, Vec<u64>, Vec<u8>)>);

fn parts(name: &str) -> Parts {
    let (_, bytes) = fixture(name);
    let g = read::parse(&bytes).unwrap();
    let meta = g.metadata.into_iter().filter(|(_, v)| v.as_array().is_none()).collect();
    let tensors = (g.tensors.iter())
        .map(|t| {
            let len = read::byte_size(t.ggml_type, &t.dims).unwrap() as usize;
            (t.name.clone(), t.ggml_type, t.dims.clone(), bytes[t.start..t.start + len].to_vec())
        })
        .collect();
    (meta, tensors)
}

#[test]
fn the_written_parts_import_as_the_fixture_does() {
    let (meta, tensors) = parts("llama_f32.gguf");
    let imported =
        import(Path::new("x.gguf"), &write(&meta, &tensors), &Options::default()).expect("imports");
    assert_eq!(imported.weights.len(), 20);
    assert!(imported.source.contains("model X("), "{}", imported.source);
    assert!(imported.source.contains("model XDecode("));
}

#[test]
fn the_alignment_is_the_files() {
    let (mut meta, tensors) = parts("llama_q4_0.gguf");
    meta.push(("general.alignment".into(), Value::U32(256)));
    let bytes = write(&meta, &tensors);
    let g = read::parse(&bytes).expect("parses");
    assert_eq!((g.alignment, g.data_start % 256), (256, 0));
    assert!(g.tensors.iter().all(|t| (t.start - g.data_start).is_multiple_of(256)));
    let ours = import(Path::new("x.gguf"), &bytes, &Options::default()).expect("imports");
    let (path, fixture) = fixture("llama_q4_0.gguf");
    let theirs = import(&path, &fixture, &Options::default()).expect("imports");
    assert_eq!(ours.weights, theirs.weights, "the same tensors, placed differently");
    // An alignment that is not a power of two is corrupt.
    meta.last_mut().unwrap().1 = Value::U32(48);
    let e = problems(Path::new("x.gguf"), &write(&meta, &tensors));
    assert!(e[0].contains("not a power of two"), "{e:?}");
}

#[test]
fn what_the_model_cannot_express_is_listed_not_approximated() {
    let (mut meta, mut tensors) = parts("llama_f32.gguf");
    meta.push(("llama.rope.scaling.type".into(), Value::Str("yarn".into())));
    meta.push(("llama.attention.sliding_window".into(), Value::U32(16)));
    meta.push(("llama.rope.dimension_count".into(), Value::U32(4)));
    tensors.push(("rope_freqs.weight".into(), 0, vec![4], vec![0; 16]));
    tensors.retain(|t| t.0 != "blk.1.ffn_up.weight");
    let e = problems(Path::new("x.gguf"), &write(&meta, &tensors));
    let all = e.join("\n");
    for needle in [
        "rope scaling `yarn`",
        "sliding attention window",
        "rotates 4 of each head's 8 dims",
        "tensor `rope_freqs.weight` has no place",
        "tensor `blk.1.ffn_up.weight` [64, 32] is missing",
    ] {
        assert!(all.contains(needle), "no `{needle}` in:\n{all}");
    }
    assert_eq!(e.len(), 5, "{all}");
}

#[test]
fn unknown_architectures_and_undecoded_types_are_named() {
    let (mut meta, mut tensors) = parts("llama_f32.gguf");
    let arch = meta.iter_mut().find(|(k, _)| k == "general.architecture").unwrap();
    arch.1 = Value::Str("mamba".into());
    let e = problems(Path::new("x.gguf"), &write(&meta, &tensors));
    assert!(e[0].contains("architecture `mamba` is not one"), "{e:?}");
    let (meta, _) = parts("llama_f32.gguf");
    // blk.0.ffn_up.weight [64, 32] as Q5_K (type 13): 256-element blocks do not fit rows of
    // 32, so as Q5_0 (type 6, 22 bytes a block of 32): a known layout, not decoded.
    let up = tensors.iter_mut().find(|t| t.0 == "blk.0.ffn_up.weight").unwrap();
    up.1 = 6;
    up.3 = vec![0; 64 * 22];
    let e = problems(Path::new("x.gguf"), &write(&meta, &tensors));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("tensor `blk.0.ffn_up.weight` is Q5_0, a type"), "{e:?}");
}

#[test]
fn llamas_q_and_k_rows_are_put_back_in_rotate_half_order() {
    // One head of 4 rows of 1 column, stored as llama.cpp permutes it: rows (0, 2, 1, 3).
    let stored = [0.0, 2.0, 1.0, 3.0];
    assert_eq!(mgn_import::gguf::unpermute(&stored, 1, 4, 1), vec![0.0, 1.0, 2.0, 3.0]);
}

#[test]
fn random_corruption_of_the_header_never_panics() {
    let (path, bytes) = fixture("llama_q4_0.gguf");
    let header = read::parse(&bytes).unwrap().data_start;
    // A fixed linear congruential sequence: the same mutants every run.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut refused = 0;
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 3 {
            let at = next() % header;
            b[at] = match next() % 3 {
                0 => next() as u8,
                1 => b[at] ^ (1 << (next() % 8)),
                _ => 0xff,
            };
        }
        refused += import(&path, &b, &Options::default()).is_err() as usize;
    }
    assert!(refused > 1000, "most mutants are refused ({refused} of 3000)");
}
