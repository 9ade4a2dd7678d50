use super::*;
use mgn_import::gguf::{quants, read};

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("mgnc-quantize-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0).collect()
}

/// A checkpoint as training writes one: two matrices (one of rows that are not whole k-quant
/// blocks), an embedding, a bias, a counter, a small matrix and optimizer state.
fn sample(dir: &Scratch) -> PathBuf {
    let half = Tensor { dtype: DType::F16, ..Tensor::f32(vec![64, 256], values(64 * 256)) };
    let tensors = vec![
        ("fc1.weight".to_string(), Tensor::f32(vec![128, 256], values(128 * 256))),
        ("fc2.weight".to_string(), Tensor::f32(vec![64, 96], values(64 * 96))),
        ("embed.weight".to_string(), half),
        ("fc1.bias".to_string(), Tensor::f32(vec![128], values(128))),
        ("tiny.weight".to_string(), Tensor::f32(vec![4, 32], values(128))),
        ("step".to_string(), Tensor::i32(vec![], vec![3])),
        ("optim.fc1.weight.m".to_string(), Tensor::f32(vec![128, 256], vec![0.0; 128 * 256])),
    ];
    let path = dir.0.join("ck.safetensors");
    let refs: Vec<(String, &Tensor)> = tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
    checkpoint::save(&path, &refs, &checkpoint::standard_metadata("Tiny", 7)).unwrap();
    path
}

fn args(ck: &Path, out: &Path, ty: &str) -> QuantizeArgs {
    QuantizeArgs { checkpoint: ck.into(), output: out.into(), dtype: ty.into(), model: None }
}

#[test]
fn the_choice_by_tensor_packs_weight_matrices_with_llama_cpp_fallbacks() {
    let t = |shape: Vec<usize>| Tensor::f32(shape.clone(), vec![0.0; shape.iter().product()]);
    assert_eq!(target(&t(vec![64, 256]), DType::Q4_K), Ok(DType::Q4_K));
    assert_eq!(target(&t(vec![64, 96]), DType::Q4_K), Ok(DType::Q4_1));
    assert_eq!(target(&t(vec![64, 96]), DType::Q6_K), Ok(DType::Q8_0));
    assert_eq!(target(&t(vec![64, 96]), DType::Q4_0), Ok(DType::Q4_0));
    assert_eq!(target(&t(vec![256, 20]), DType::Q4_K), Err(Skip::Blocks(20)));
    assert_eq!(target(&t(vec![8192]), DType::Q8_0), Err(Skip::FewAxes));
    assert_eq!(target(&t(vec![4, 32]), DType::Q8_0), Err(Skip::Small));
    assert_eq!(target(&Tensor::i32(vec![64, 64], vec![0; 4096]), DType::Q8_0), Err(Skip::NotFloat));
}

#[test]
fn a_safetensors_output_holds_packed_tensors_by_the_checkpoint_convention() {
    let dir = Scratch::new("st");
    let ck = sample(&dir);
    let out = dir.0.join("q.safetensors");
    let table = quantize(&args(&ck, &out, "q4_k")).unwrap();
    let q = checkpoint::load(&out).unwrap();
    let src = checkpoint::load(&ck).unwrap();
    let dtypes: Vec<(&str, DType)> = q.tensors.iter().map(|(n, t)| (n.as_str(), t.dtype)).collect();
    assert_eq!(
        dtypes,
        [
            ("embed.weight", DType::Q4_K),
            ("fc1.bias", DType::F32),
            ("fc1.weight", DType::Q4_K),
            ("fc2.weight", DType::Q4_1),
            ("step", DType::I32),
            ("tiny.weight", DType::F32),
        ]
    );
    let w = src.get("fc1.weight").unwrap();
    assert_eq!(
        q.get("fc1.weight").unwrap(),
        &Tensor::quantized(DType::Q4_K, vec![128, 256], &w.dequantized())
    );
    assert_eq!(q.model(), Some("Tiny"));
    assert_eq!(q.metadata.get("mgn.quantized_from").map(String::as_str), Some("ck.safetensors"));
    for want in
        ["q4_k", "q4_1", "3 quantized tensors", "max 0.", "median 0.", "left out 1 optimizer"]
    {
        assert!(table.contains(want), "{want}: {table}");
    }
}

#[test]
fn a_gguf_output_reads_back_with_the_importers_reader() {
    let dir = Scratch::new("gguf");
    let ck = sample(&dir);
    let out = dir.0.join("q.gguf");
    quantize(&args(&ck, &out, "q4_0")).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let g = read::parse(&bytes).unwrap();
    assert_eq!((g.version, g.alignment), (3, 32));
    assert_eq!(g.get("general.name").and_then(|v| v.as_str()), Some("Tiny"));
    let src = checkpoint::load(&ck).unwrap();
    for info in &g.tensors {
        let t = src.get(&info.name).unwrap();
        assert_eq!(info.shape(), if t.shape.is_empty() { vec![1] } else { t.shape.clone() });
        assert_eq!(info.start % 32, 0, "{}", info.name);
        let size = read::byte_size(info.ggml_type, &info.dims).unwrap() as usize;
        let data = &bytes[info.start..info.start + size];
        let want_type = match (info.name.as_str(), t.dtype) {
            ("fc1.weight" | "fc2.weight" | "embed.weight", _) => quants::Q4_0,
            (_, DType::F32) => quants::F32,
            (_, DType::I32) => 26,
            (n, d) => panic!("{n}: {d}"),
        };
        assert_eq!(info.ggml_type, want_type, "{}", info.name);
        if t.dtype.is_float() {
            let got = quants::dequantize(info.ggml_type, data).unwrap();
            let want = match want_type {
                quants::Q4_0 => {
                    Tensor::quantized(DType::Q4_0, t.shape.clone(), &t.dequantized()).dequantized()
                }
                _ => t.dequantized(),
            };
            assert_eq!(got, want, "{}", info.name);
        }
    }
    let names: BTreeSet<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 6);
    assert!(!names.contains("optim.fc1.weight.m"));
}

#[test]
fn errors_say_what_is_wrong() {
    let dir = Scratch::new("errors");
    let ck = sample(&dir);
    let out = dir.0.join("q.safetensors");
    let e = quantize(&args(&ck, &out, "q5_0")).unwrap_err();
    assert!(e.contains("unknown type `q5_0`: the packed types are q8_0, q4_0, q4_1, q4_k, q6_k"));
    let e = quantize(&args(&ck, &dir.0.join("q.bin"), "q8_0")).unwrap_err();
    assert!(e.contains("`.safetensors` or `.gguf`"), "{e}");
    let e = quantize(&args(&dir.0.join("none.safetensors"), &out, "q8_0")).unwrap_err();
    assert!(e.contains("none.safetensors") && e.contains("cannot read"), "{e}");
    let mut with_model = args(&ck, &out, "q8_0");
    with_model.model = Some(dir.0.join("m.mgn"));
    let e = quantize(&with_model).unwrap_err();
    assert!(e.contains("--model") && e.contains("m.mgn"), "{e}");
    let small = dir.0.join("small.safetensors");
    let b = Tensor::f32(vec![16], values(16));
    let w = Tensor::f32(vec![8, 20], values(160));
    checkpoint::save(&small, &[("b".into(), &b), ("w".into(), &w)], &[]).unwrap();
    let e = quantize(&args(&small, &out, "q8_0")).unwrap_err();
    assert!(e.contains("nothing to quantize to q8_0") && e.contains("1 with fewer than 2 axes"));
    assert!(e.contains("1 with fewer than 4096 elements"), "{e}");
    assert!(!out.exists());
}

#[test]
fn relative_error_is_the_norm_of_the_difference_over_the_norm() {
    assert_eq!(relative_error(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
    assert!((relative_error(&[3.0, 4.0], &[3.0, 3.0]) - 0.2).abs() < 1e-12);
}

#[test]
fn a_model_chooses_what_its_quantize_pass_packs() {
    let dir = Scratch::new("model");
    let ck = sample(&dir);
    let model = dir.0.join("tiny.mgn");
    // fc1 is a product's weight; the checkpoint's other matrices are not the model's.
    std::fs::write(
        &model,
        "use std.nn.{Linear}\n\nmodel Tiny {\n    input x: f32[2, 256]\n    \
         fc1 = Linear(256, 128)\n\n    forward {\n        output y = fc1(x)\n    }\n}\n",
    )
    .unwrap();
    let out = dir.0.join("q.safetensors");
    let mut a = args(&ck, &out, "q8_0");
    a.model = Some(model);
    quantize(&a).unwrap();
    let q = checkpoint::load(&out).unwrap();
    let packed: Vec<&str> =
        q.tensors.iter().filter(|(_, t)| t.dtype.is_packed()).map(|(n, _)| n.as_str()).collect();
    assert_eq!(packed, ["fc1.weight"]);
}
