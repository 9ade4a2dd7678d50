//! Unit tests of the ONNX front end on graphs built here, message by message.

use super::graph::{dynamo_scope, torchscript_scope};
use super::proto::pb;
use super::value::float_text;
use crate::Options;
use prost::Message;
use std::path::Path;

fn attr_ints(name: &str, v: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: Some(name.into()),
        r#type: Some(pb::attribute_proto::AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> pb::NodeProto {
    pb::NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A value of element type `dt` whose sizes are numbers or named axes.
fn value(name: &str, dt: i32, dims: &[&str]) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{dimension::Value, Dimension};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d.parse::<i64>() {
                Ok(v) => Value::DimValue(v),
                Err(_) => Value::DimParam(d.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    let t =
        pb::type_proto::Tensor { elem_type: Some(dt), shape: Some(pb::TensorShapeProto { dim }) };
    pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(t)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> pb::TensorProto {
    pb::TensorProto {
        name: Some(name.into()),
        data_type: Some(7),
        dims: vec![v.len() as i64],
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn floats(name: &str, dims: &[i64], v: &[f32]) -> pb::TensorProto {
    pb::TensorProto {
        name: Some(name.into()),
        data_type: Some(1),
        dims: dims.to_vec(),
        raw_data: Some(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<pb::NodeProto>,
    inputs: Vec<pb::ValueInfoProto>,
    outputs: &[&str],
    inits: Vec<pb::TensorProto>,
) -> Vec<u8> {
    let graph = pb::GraphProto {
        node: nodes,
        input: inputs,
        output: outputs.iter().map(|o| value(o, 1, &[])).collect(),
        initializer: inits,
        ..Default::default()
    };
    let m = pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(graph),
        ..Default::default()
    };
    m.encode_to_vec()
}

fn import(bytes: &[u8]) -> Result<crate::Imported, crate::ImportError> {
    super::import(Path::new("t.onnx"), bytes, &Options::default())
}

#[test]
fn every_unsupported_op_is_listed_with_its_type_and_opset() {
    let nodes = vec![
        node("NonZero", "/a/NonZero", &["x"], &["nz"]),
        node("Relu", "/a/Relu", &["nz"], &["r"]),
        node("Det", "/b/Det", &["x"], &["d"]),
        pb::NodeProto {
            domain: Some("com.microsoft".into()),
            ..node("FusedGelu", "g", &["x"], &["g"])
        },
    ];
    let bytes = model(nodes, vec![value("x", 1, &["2", "3", "3"])], &["r", "d", "g"], vec![]);
    let e = import(&bytes).expect_err("three ops mgn has no translation for");
    assert_eq!(e.problems.len(), 3, "{e}");
    assert!(e.problems[0].contains("`/a/NonZero` (NonZero, opset 17)"), "{e}");
    assert!(e.problems[1].contains("`/b/Det` (Det, opset 17)"), "{e}");
    assert!(e.problems[2].contains("com.microsoft.FusedGelu"), "{e}");
    // The Relu after the NonZero is not reported: its input is.
    assert!(!e.to_string().contains("Relu"), "{e}");
}

#[test]
fn unsupported_attribute_values_and_types_are_problems() {
    let mut pad = node("Conv", "/c/Conv", &["x", "w"], &["y"]);
    pad.attribute.push(attr_ints("pads", &[0, 0, 1, 1]));
    let bytes = model(
        vec![pad],
        vec![value("x", 1, &["1", "1", "4", "4"]), value("q", 11, &["2"])],
        &["y"],
        vec![floats("w", &[1, 1, 1, 1], &[1.0])],
    );
    let e = import(&bytes).expect_err("asymmetric padding and a double input");
    assert!(e.problems.iter().any(|p| p.contains("input `q` is double")), "{e}");
    assert!(e.problems.iter().any(|p| p.contains("differs between the start and the end")), "{e}");
}

#[test]
fn shape_arithmetic_folds_to_the_models_named_sizes() {
    // The exporter's reshape of [batch, 12] to [batch, 3, 4] through Shape, Gather, Concat.
    let mut gather = node("Gather", "/Gather", &["s", "zero"], &["b"]);
    gather.attribute.push(pb::AttributeProto {
        name: Some("axis".into()),
        r#type: Some(pb::attribute_proto::AttributeType::Int as i32),
        i: Some(0),
        ..Default::default()
    });
    let nodes = vec![
        node("Shape", "/Shape", &["x"], &["s"]),
        gather,
        node("Unsqueeze", "/Unsqueeze", &["b", "axes"], &["b1"]),
        node("Concat", "/Concat", &["b1", "rest"], &["shape"]),
        node("Reshape", "/Reshape", &["x", "shape"], &["y"]),
    ];
    let mut concat_axis = nodes;
    concat_axis[3].attribute.push(pb::AttributeProto {
        name: Some("axis".into()),
        r#type: Some(pb::attribute_proto::AttributeType::Int as i32),
        i: Some(0),
        ..Default::default()
    });
    let inits = vec![
        pb::TensorProto { dims: vec![], ..ints("zero", &[0]) },
        ints("axes", &[0]),
        ints("rest", &[3, 4]),
    ];
    let bytes = model(concat_axis, vec![value("x", 1, &["batch", "12"])], &["y"], inits);
    let m = import(&bytes).expect("imports");
    assert!(m.source.contains("model T(batch: dim = 2)"), "{}", m.source);
    assert!(m.source.contains("input x: f32[batch, 12]"), "{}", m.source);
    assert!(m.source.contains("reshape(x, [batch, 3, 4])"), "{}", m.source);
    let code = code(&m.source);
    assert!(!code.contains("Shape") && !code.contains("concat"), "{}", m.source);
    // The static reshape names the nodes it stands for: the Reshape, then the shape arithmetic
    // folded into it, in graph order.
    assert!(
        m.source.contains(
            "let y = reshape(x, [batch, 3, 4])  // onnx: /Reshape, /Shape, /Gather +2 more\n"
        ),
        "{}",
        m.source
    );
}

/// The source without its comments.
fn code(source: &str) -> String {
    source
        .lines()
        .map(|l| l.split("//").next().unwrap_or("").trim_end())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_matmul_and_add_of_initializers_is_a_linear_named_by_its_module() {
    let nodes = vec![
        node("MatMul", "/encoder/layer.0/fc/MatMul", &["x", "onnx::MatMul_9"], &["m"]),
        node("Add", "/encoder/layer.0/fc/Add", &["m", "encoder.layer.0.fc.bias"], &["y"]),
    ];
    let inits = vec![
        floats("onnx::MatMul_9", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        floats("encoder.layer.0.fc.bias", &[3], &[0.5, 0.5, 0.5]),
    ];
    let bytes = model(nodes, vec![value("x", 1, &["4", "2"])], &["y"], inits);
    let m = import(&bytes).expect("imports");
    assert!(m.source.contains("Linear(2, 3)"), "{}", m.source);
    let names: Vec<&str> = m.weights.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["encoder.layer.0.fc.weight", "encoder.layer.0.fc.bias"]);
    // Stored as PyTorch's Linear stores it: [out, in], the file's [in, out] transposed.
    let w = &m.weights[0].1;
    assert_eq!(w.shape, [3, 2]);
    assert_eq!(w.as_f32().expect("f32"), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn module_paths_from_both_exporters() {
    assert_eq!(torchscript_scope("/layer1/layer1.0/conv1/Conv"), "layer1.0.conv1");
    assert_eq!(
        torchscript_scope("/features/features.1/block/block.0/block.0.0/Conv"),
        "features.1.block.0.0"
    );
    assert_eq!(torchscript_scope("/Flatten"), "");
    assert_eq!(torchscript_scope("Identity_0"), "");
    let ns = ": __main__.Net/layer1: torch.nn.Sequential/layer1.0: __main__.Blk/add: aten.add";
    assert_eq!(dynamo_scope(ns), "layer1.0");
    assert_eq!(dynamo_scope(": __main__.Net/view: aten.view.default"), "");
}

#[test]
fn floats_are_written_so_they_read_back_exactly() {
    for v in [1e-5f32, 0.1, 1.0 / 3.0, 2.0, -0.25, 3.4e38] {
        let text = float_text(v).expect("finite");
        let parsed: f64 = text.trim_matches(['(', ')']).parse().expect("a number");
        assert_eq!(parsed as f32, v, "{text}");
        assert!(text.contains(['.', 'e']), "{text} is a float literal");
    }
    assert_eq!(float_text(f32::NEG_INFINITY).as_deref(), Some("(-3.4028235e38)"));
    assert_eq!(float_text(f32::NAN), None);
}

#[test]
fn a_file_that_is_no_model_says_so() {
    let e = import(b"\xff\xff\xff").expect_err("not protobuf");
    assert!(e.problems[0].contains("not an ONNX model"), "{e}");
}

fn scalar(name: &str, v: f32) -> pb::TensorProto {
    floats(name, &[], &[v])
}

fn attr_int(name: &str, v: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: Some(name.into()),
        r#type: Some(pb::attribute_proto::AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

/// TorchScript's erf GELU, `x / √2` divided by `sqrt2`.
fn erf_gelu(sqrt2: f32) -> String {
    let nodes = vec![
        node("Div", "/act/Div", &["x", "sqrt2"], &["d"]),
        node("Erf", "/act/Erf", &["d"], &["e"]),
        node("Add", "/act/Add", &["e", "one"], &["a"]),
        node("Mul", "/act/Mul", &["x", "a"], &["m"]),
        node("Mul", "/act/Mul_1", &["m", "half"], &["y"]),
    ];
    let inits = vec![scalar("sqrt2", sqrt2), scalar("one", 1.0), scalar("half", 0.5)];
    let bytes = model(nodes, vec![value("x", 1, &["2", "3"])], &["y"], inits);
    import(&bytes).expect("imports").source
}

#[test]
fn the_erf_gelu_is_the_gelu_builtin_and_a_near_miss_stays_op_by_op() {
    let s = erf_gelu(std::f32::consts::SQRT_2);
    assert!(s.contains("gelu(x)") && !s.contains("erf("), "{s}");
    // x · Φ(x / 1.5 · √2) is not GELU.
    let s = erf_gelu(1.5);
    assert!(s.contains("erf(") && !s.contains("gelu("), "{s}");
}

/// GPT-2's tanh GELU as the dynamo exporter writes it, with `c` for 0.044715.
fn tanh_gelu(c: f32) -> String {
    let nodes = vec![
        node("Pow", "p", &["x", "three"], &["x3"]),
        node("Mul", "m1", &["x3", "c"], &["cx3"]),
        node("Add", "a1", &["x", "cx3"], &["s"]),
        node("Mul", "m2", &["s", "k"], &["z"]),
        node("Tanh", "t", &["z"], &["th"]),
        node("Add", "a2", &["th", "one"], &["a"]),
        node("Mul", "m3", &["x", "half"], &["hx"]),
        node("Mul", "m4", &["hx", "a"], &["y"]),
    ];
    let inits = vec![
        scalar("three", 3.0),
        scalar("c", c),
        scalar("k", (2.0 / std::f32::consts::PI).sqrt()),
        scalar("one", 1.0),
        scalar("half", 0.5),
    ];
    let bytes = model(nodes, vec![value("x", 1, &["2", "3"])], &["y"], inits);
    import(&bytes).expect("imports").source
}

#[test]
fn the_tanh_gelu_is_gelu_tanh_and_a_near_miss_stays_op_by_op() {
    let s = tanh_gelu(0.044715);
    assert!(s.contains("gelu_tanh(x)") && !s.contains(" tanh("), "{s}");
    let s = tanh_gelu(0.05);
    assert!(s.contains("tanh(") && !s.contains("gelu_tanh("), "{s}");
}

/// `softmax(q · kᵀ / √8 + m) · v`, the softmax over `axis`.
fn attention_graph(axis: i64, outputs: &[&str]) -> String {
    let mut softmax = node("Softmax", "sm", &["s"], &["p"]);
    softmax.attribute.push(attr_int("axis", axis));
    let mut t = node("Transpose", "t", &["k"], &["kt"]);
    t.attribute.push(attr_ints("perm", &[0, 1, 3, 2]));
    let nodes = vec![
        t,
        node("MatMul", "mm1", &["q", "kt"], &["qk"]),
        node("Div", "div", &["qk", "root"], &["sc"]),
        node("Add", "add", &["sc", "m"], &["s"]),
        softmax,
        node("MatMul", "mm2", &["p", "v"], &["y"]),
    ];
    let inputs = ["q", "k", "v"].map(|n| value(n, 1, &["2", "3", "4", "8"]));
    let mut inputs = inputs.to_vec();
    inputs.push(value("m", 1, &["2", "1", "4", "4"]));
    let bytes = model(nodes, inputs, outputs, vec![scalar("root", 8f32.sqrt())]);
    import(&bytes).expect("imports").source
}

#[test]
fn scaled_masked_attention_is_the_attention_builtin_and_a_near_miss_stays_op_by_op() {
    let s = attention_graph(-1, &["y"]);
    assert!(s.contains("attention(q, k, v, scale = 0.35355"), "{s}");
    assert!(s.contains("mask = m)") && !s.contains("softmax"), "{s}");
    // A softmax over the queries is no attention.
    let s = attention_graph(2, &["y"]);
    assert!(s.contains("softmax") && !s.contains("attention("), "{s}");
    // Probabilities read elsewhere (an output here) keep the written-out form.
    let s = attention_graph(-1, &["y", "p"]);
    assert!(s.contains("softmax") && !s.contains("attention("), "{s}");
}

/// Two decoder-like blocks as an exporter writes them: rotary tables computed once at the top
/// (`/Cos`, `/Sin`) and read by every block, and one epsilon and one mask the exporter shares
/// among the blocks (unnamed initializers). `extra` names more outputs (a block's value read
/// after it, as a cache of keys is).
fn decoder_blocks(extra: &[&str]) -> String {
    let mut nodes =
        vec![node("Cos", "/Cos", &["pos"], &["rc"]), node("Sin", "/Sin", &["pos"], &["rs"])];
    let mut inits = vec![
        scalar("onnx::Pow_2", 2.0),
        scalar("onnx::Add_3", 1e-5),
        floats("onnx::Add_4", &[4], &[0.0, -1.0, 0.5, 2.0]),
    ];
    for i in 0..2 {
        let at = |n: &str| format!("/layers/layers.{i}/{n}");
        let v = |n: &str| format!("{n}{i}");
        let h = if i == 0 { "x".to_string() } else { "y0".to_string() };
        let w = format!("layers.{i}.norm.weight");
        let steps: [(&str, String, [String; 2], String); 8] = [
            ("Pow", at("norm/Pow"), [h.clone(), "onnx::Pow_2".into()], v("p")),
            ("Add", at("norm/Add"), [v("p"), "onnx::Add_3".into()], v("a")),
            ("Mul", at("norm/Mul"), [v("a"), w.clone()], v("n")),
            ("Mul", at("Mul"), [v("n"), "rc".into()], v("c")),
            ("Mul", at("Mul_1"), [v("n"), "rs".into()], v("s")),
            ("Add", at("Add"), [v("c"), v("s")], v("r")),
            ("Add", at("Add_1"), [v("r"), "onnx::Add_4".into()], v("m")),
            ("Add", at("Add_2"), [h.clone(), v("m")], v("y")),
        ];
        for (op, name, ins, out) in &steps {
            nodes.push(node(op, name, &[ins[0].as_str(), ins[1].as_str()], &[out.as_str()]));
        }
        inits.push(floats(&w, &[4], &[1.0, 2.0, 3.0, 4.0]));
    }
    let mut outputs = vec!["y1"];
    outputs.extend_from_slice(extra);
    let inputs = vec![value("x", 1, &["2", "4"]), value("pos", 1, &["2", "4"])];
    let bytes = model(nodes, inputs, &outputs, inits);
    let source = import(&bytes).expect("imports").source;
    let outcome = mgn_compiler::check_text(
        "t.mgn".into(),
        mgn_compiler::source::Origin::Memory("t.mgn".into()),
        source.clone(),
        mgn_compiler::Models::All,
    );
    assert!(outcome.ok(), "the source does not check:\n{source}");
    source
}

#[test]
fn blocks_take_the_tables_and_constants_computed_outside_them() {
    let s = decoder_blocks(&[]);
    // One layer for both blocks, called as a list: the hidden state, both rotary tables, and
    // the epsilon and mask now held by the model (not by the first block) go in.
    assert!(s.contains("layers = repeat(2) LayersItem()"), "{s}");
    assert!(s.contains("let y1 = self.layers(x, cos_1, sin_1, self.bias, self.bias_1)"), "{s}");
    assert_eq!(s.matches("forward(").count(), 2, "{s}");
    // Equal blocks still merge with their comments: the layer names the first block's nodes.
    assert!(s.contains("let pow_1 = square(x)  // onnx: /layers/layers.0/norm/Pow\n"), "{s}");
    assert!(!s.contains("layers.1/norm/Pow"), "{s}");
    // An op that reads as itself is not annotated.
    assert!(s.contains("        let add = pow_1 + bias\n"), "{s}");
}

#[test]
fn several_values_leaving_a_block_are_returned_as_a_tuple() {
    let s = decoder_blocks(&["c0", "c1"]);
    assert!(s.contains("layers = repeat(2) LayersItem()"), "{s}");
    assert!(s.contains(") -> (f32[2, 4], f32[2, 4]) {"), "{s}");
    assert!(
        s.contains("let (add_3, c0) = self.layers[0](x, cos_1, sin_1, self.bias, self.bias_1)"),
        "{s}"
    );
    assert!(
        s.contains("let (y1, c1) = self.layers[1](add_3, cos_1, sin_1, self.bias, self.bias_1)"),
        "{s}"
    );
}

#[test]
fn a_fused_attention_names_the_nodes_it_stands_for() {
    let s = attention_graph(-1, &["y"]);
    // The last MatMul first, then the pattern's other nodes in graph order.
    assert!(s.contains("mask = m)  // onnx: mm2, t, mm1 +3 more\n"), "{s}");
    // A near miss stays op by op, each line reading as its node: no comment.
    let s = attention_graph(2, &["y"]);
    assert!(!s.contains("// onnx:"), "{s}");
}
