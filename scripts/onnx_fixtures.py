#!/usr/bin/env python3
"""Writes the ONNX import fixtures, tests/fixtures/onnx/: small graphs built op by op with
onnx.helper, and two small PyTorch models exported with torch.onnx (a CNN with batch norm, and a
transformer block with dynamic batch and sequence axes). Beside each NAME.onnx go
NAME.inputs.safetensors (the inputs, under the names the imported model gives them; the
metadata's `mgn.sets` lists the sizes of its dynamic axes) and NAME.ort.safetensors
(onnxruntime's outputs as `output.<name>`, the keys `mgnc run` writes). tests/onnx.rs imports,
runs and compares them. Run: /path/to/python scripts/onnx_fixtures.py (torch, onnx,
onnxruntime, safetensors)."""
import os, sys
import numpy as np
import onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
import onnxruntime as ort
from safetensors.numpy import save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from onnx_compare import ident  # noqa: E402  the importer's rule for names

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "onnx")
rng = np.random.default_rng(7)


def write(name, model, feeds, sets=""):

    path = os.path.join(OUT, name + ".onnx")
    onnx.save(model, path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    outs = sess.run(names, feeds)
    save_file({ident(k): np.ascontiguousarray(v) for k, v in feeds.items()},
              os.path.join(OUT, name + ".inputs.safetensors"), metadata={"mgn.sets": sets})
    save_file({"output." + ident(n): np.ascontiguousarray(v) for n, v in zip(names, outs)},
              os.path.join(OUT, name + ".ort.safetensors"))
    print(f"{name}: {len(model.graph.node)} nodes, {os.path.getsize(path)} bytes")


def graph(name, nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, name, inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def vi(name, dt, shape):
    return h.make_tensor_value_info(name, dt, shape)


def init(name, arr):
    return nh.from_array(np.asarray(arr), name)


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def pointwise():
    n = h.make_node
    nodes = [
        n("Add", ["x", "y"], ["add"]), n("Sub", ["x", "y"], ["sub"]),
        n("Mul", ["x", "y"], ["mul"]), n("Abs", ["y"], ["ay"]), n("Add", ["ay", "one"], ["ay1"]),
        n("Div", ["x", "ay1"], ["div"]), n("Relu", ["x"], ["relu"]),
        n("Sigmoid", ["x"], ["sig"]), n("Tanh", ["x"], ["tanh"]), n("Exp", ["x"], ["exp"]),
        n("Erf", ["x"], ["erf"]), n("Sqrt", ["ay1"], ["sqrt"]), n("Neg", ["x"], ["neg"]),
        n("Pow", ["x", "two"], ["sq"]), n("Pow", ["x", "three"], ["cube"]),
        n("Reciprocal", ["ay1"], ["rec"]), n("Greater", ["x", "y"], ["gt"]),
        n("Where", ["gt", "x", "y"], ["where"]), n("Clip", ["x", "lo", "hi"], ["clip"]),
        n("LeakyRelu", ["x"], ["leaky"], alpha=0.1), n("HardSigmoid", ["x"], ["hsig"]),
        n("HardSwish", ["x"], ["hswish"]), n("Softplus", ["x"], ["softplus"]),
        n("Elu", ["x"], ["elu"]), n("Max", ["x", "y"], ["max"]), n("Min", ["x", "y"], ["min"]),
        n("Cast", ["gt"], ["gt_f"], to=T.FLOAT), n("Log", ["ay1"], ["log"]),
        n("Sin", ["x"], ["sin"]), n("Cos", ["x"], ["cos"]), n("Not", ["gt"], ["le"]),
        n("Cast", ["le"], ["le_f"], to=T.FLOAT), n("Gelu", ["x"], ["gelu"]),
    ]
    outs = ["add", "sub", "mul", "div", "relu", "sig", "tanh", "exp", "erf", "sqrt", "neg", "sq",
            "cube", "rec", "where", "clip", "leaky", "hsig", "hswish", "softplus", "elu", "max",
            "min", "gt_f", "log", "sin", "cos", "le_f", "gelu"]
    inits = [init("one", np.float32(1)), init("two", np.float32(2)), init("three", np.float32(3)),
             init("lo", np.float32(-0.5)), init("hi", np.float32(0.7))]
    m = graph("pointwise", nodes, [vi("x", T.FLOAT, [2, 3, 4]), vi("y", T.FLOAT, [3, 4])],
              [vi(o, T.FLOAT, None) for o in outs], inits, opset=20)
    write("op_pointwise", m, {"x": f32(2, 3, 4), "y": f32(3, 4)})


def reduce():
    n = h.make_node
    nodes = [
        n("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1),
        n("ReduceSum", ["x", "ax"], ["sum"], keepdims=0),
        n("ReduceMax", ["x"], ["max"], axes=[-1], keepdims=0),
        n("ReduceMin", ["x"], ["min"], axes=[0, 2], keepdims=1),
        n("Softmax", ["x"], ["softmax"], axis=1), n("LogSoftmax", ["x"], ["logsoftmax"]),
        n("ArgMax", ["x"], ["argmax"], axis=2, keepdims=0),
        n("CumSum", ["x", "cax"], ["cumsum"], reverse=1),
        n("GlobalAveragePool", ["img"], ["gap"]), n("GlobalMaxPool", ["img"], ["gmp"]),
    ]
    inits = [init("ax", np.array([0, 2], np.int64)), init("cax", np.array(1, np.int64))]
    outs = [vi(o, T.FLOAT, None) for o in
            ["mean", "sum", "max", "min", "softmax", "logsoftmax", "cumsum", "gap", "gmp"]]
    outs.append(vi("argmax", T.INT64, None))
    m = graph("reduce", nodes, [vi("x", T.FLOAT, [2, 3, 5]), vi("img", T.FLOAT, [2, 3, 4, 4])],
              outs, inits, opset=17)
    write("op_reduce", m, {"x": f32(2, 3, 5), "img": f32(2, 3, 4, 4)})


def shapes():
    n = h.make_node
    c = lambda name, v: n("Constant", [], [name], value=nh.from_array(np.array(v, np.int64)))
    nodes = [
        # The exporter's shape arithmetic: [B, T, 12] → [B, T, 3, 4] from Shape and Gather.
        n("Shape", ["x"], ["s"]), c("i0", 0), c("i1", 1), c("heads", [3]), c("hd", [4]),
        n("Gather", ["s", "i0"], ["b"]), n("Gather", ["s", "i1"], ["t"]),
        c("axes0", [0]), n("Unsqueeze", ["b", "axes0"], ["b1"]),
        n("Unsqueeze", ["t", "axes0"], ["t1"]),
        n("Concat", ["b1", "t1", "heads", "hd"], ["shape4"], axis=0),
        n("Reshape", ["x", "shape4"], ["split_heads"]),
        n("Transpose", ["split_heads"], ["heads_first"], perm=[0, 2, 1, 3]),
        n("Flatten", ["x"], ["flat"], axis=1),
        n("Split", ["x", "sizes"], ["p0", "p1"], axis=2),
        n("Concat", ["p1", "p0"], ["swapped"], axis=-1),
        n("Slice", ["x", "st", "en", "sax"], ["sliced"]),
        n("Gather", ["x", "i1"], ["row"], axis=1),
        n("Gather", ["x", "idx"], ["rows"], axis=1),
        n("Unsqueeze", ["row", "axes0"], ["row1"]), n("Squeeze", ["row1", "axes0"], ["row2"]),
        n("Expand", ["bias", "s"], ["expanded"]),
        n("ConstantOfShape", ["s"], ["zeros"], value=nh.from_array(np.array([0.5], np.float32))),
        n("Add", ["x", "zeros"], ["shifted"]),
        n("Range", ["r0", "r1", "r2"], ["range"]), n("Cast", ["range"], ["range_f"], to=T.FLOAT),
        n("Add", ["x", "range_f"], ["plus_range"]),
        n("Transpose", ["x"], ["rev"], perm=[2, 0, 1]),
    ]
    inits = [init("sizes", np.array([5, 7], np.int64)), init("st", np.array([1, -9], np.int64)),
             init("en", np.array([2**62, -2], np.int64)), init("sax", np.array([1, 2], np.int64)),
             init("idx", np.array([[2, 0], [1, 1]], np.int64)), init("bias", f32(12)),
             init("r0", np.array(0, np.int64)), init("r1", np.array(12, np.int64)),
             init("r2", np.array(1, np.int64))]
    outs = ["heads_first", "flat", "swapped", "sliced", "row2", "rows", "expanded", "shifted",
            "plus_range", "rev"]
    m = graph("shapes", nodes, [vi("x", T.FLOAT, [2, 3, 12])], [vi(o, T.FLOAT, None) for o in outs],
              inits, opset=17)
    write("op_shape", m, {"x": f32(2, 3, 12)})


def nn_ops():
    n = h.make_node
    nodes = [
        n("Conv", ["img", "w1", "b1"], ["conv"], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Conv", ["conv", "w2"], ["dw"], group=4, pads=[2, 2, 2, 2], dilations=[2, 2]),
        n("BatchNormalization", ["dw", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=1e-3),
        n("MaxPool", ["bn"], ["maxp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("AveragePool", ["img"], ["avgp"], kernel_shape=[2, 2], strides=[2, 2]),
        n("ConvTranspose", ["conv", "wt", "bt"], ["up"], strides=[2, 2], pads=[1, 1, 1, 1],
          output_padding=[1, 1]),
        n("InstanceNormalization", ["conv", "in_s", "in_b"], ["inorm"]),
        n("Pad", ["img", "pads"], ["padded"], mode="reflect"),
        n("Resize", ["conv", "", "scales"], ["near"], mode="nearest",
          coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        n("Resize", ["conv", "", "", "sizes"], ["bilin"], mode="linear"),
        n("Flatten", ["maxp"], ["flat"]),
        n("Gemm", ["flat", "fc_w", "fc_b"], ["gemm"], transB=1),
        n("MatMul", ["seq", "lin_w"], ["mm"]), n("Add", ["mm", "lin_b"], ["lin"]),
        n("LayerNormalization", ["lin", "ln_s", "ln_b"], ["ln"], epsilon=1e-6),
        n("Conv", ["seq_t", "w1d", "b1d"], ["conv1d"], pads=[1, 1]),
        n("Einsum", ["seq", "seq"], ["gram"], equation="btd,bsd->bts"),
    ]
    inits = [init("w1", f32(4, 3, 3, 3, scale=0.3)), init("b1", f32(4)),
             init("w2", f32(4, 1, 3, 3, scale=0.3)),
             init("bn_s", f32(4)), init("bn_b", f32(4)), init("bn_m", f32(4)),
             init("bn_v", np.abs(f32(4)) + 0.5), init("wt", f32(4, 2, 3, 3, scale=0.3)),
             init("bt", f32(2)), init("in_s", f32(4)), init("in_b", f32(4)),
             init("pads", np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64)),
             init("scales", np.array([1, 1, 2, 2], np.float32)),
             init("sizes", np.array([2, 4, 7, 5], np.int64)),
             init("fc_w", f32(5, 4 * 2 * 2, scale=0.3)), init("fc_b", f32(5)),
             init("lin_w", f32(6, 8, scale=0.3)), init("lin_b", f32(8)), init("ln_s", f32(8)),
             init("ln_b", f32(8)), init("w1d", f32(3, 6, 3, scale=0.3)), init("b1d", f32(3))]
    outs = ["bn", "avgp", "up", "inorm", "padded", "near", "bilin", "gemm", "ln", "conv1d", "gram"]
    ins = [vi("img", T.FLOAT, [2, 3, 8, 8]), vi("seq", T.FLOAT, [2, 5, 6]),
           vi("seq_t", T.FLOAT, [2, 6, 5])]
    m = graph("nn", nodes, ins, [vi(o, T.FLOAT, None) for o in outs], inits, opset=17)
    write("op_nn", m, {"img": f32(2, 3, 8, 8), "seq": f32(2, 5, 6), "seq_t": f32(2, 6, 5)})


def models():
    import torch
    import torch.nn as nn
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(s, c):
            super().__init__()
            s.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            s.bn1 = nn.BatchNorm2d(c)
            s.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            s.bn2 = nn.BatchNorm2d(c)

        def forward(s, x):
            return torch.relu(s.bn2(s.conv2(torch.relu(s.bn1(s.conv1(x))))) + x)

    class TinyCnn(nn.Module):
        def __init__(s):
            super().__init__()
            s.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
                                   nn.BatchNorm2d(8), nn.ReLU())
            s.layer1 = nn.Sequential(Block(8), Block(8))
            s.pool = nn.MaxPool2d(2)
            s.fc = nn.Linear(8, 10)

        def forward(s, x):
            x = s.pool(s.layer1(s.stem(x)))
            return s.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    cnn = TinyCnn()
    for m in cnn.modules():  # running statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    cnn.eval()
    x = torch.randn(4, 3, 16, 16)
    path = os.path.join(OUT, "tiny_cnn.onnx")
    torch.onnx.export(cnn, (x,), path, dynamo=False, opset_version=17, input_names=["images"],
                      output_names=["logits"], training=torch.onnx.TrainingMode.PRESERVE,
                      do_constant_folding=False)
    write("tiny_cnn", onnx.load(path), {"images": x.numpy()})

    class Attention(nn.Module):
        def __init__(s, d, heads):
            super().__init__()
            s.heads = heads
            s.qkv = nn.Linear(d, 3 * d)
            s.proj = nn.Linear(d, d)

        def forward(s, x, mask):
            b, t, d = x.shape
            q, k, v = s.qkv(x).split(d, dim=-1)
            sh = lambda z: z.view(b, t, s.heads, d // s.heads).transpose(1, 2)
            q, k, v = sh(q), sh(k), sh(v)
            att = (q @ k.transpose(-2, -1)) / (d // s.heads) ** 0.5 + mask
            y = att.softmax(-1) @ v
            return s.proj(y.transpose(1, 2).reshape(b, t, d))

    class TinyTransformer(nn.Module):
        def __init__(s, vocab=50, d=32, heads=4, ctx=16):
            super().__init__()
            s.wte = nn.Embedding(vocab, d)
            s.wpe = nn.Embedding(ctx, d)
            s.ln_1 = nn.LayerNorm(d)
            s.attn = Attention(d, heads)
            s.ln_2 = nn.LayerNorm(d)
            s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            s.ln_f = nn.LayerNorm(d)
            s.head = nn.Linear(d, vocab, bias=False)

        def forward(s, ids):
            t = ids.shape[1]
            pos = torch.arange(t, device=ids.device)
            x = s.wte(ids) + s.wpe(pos)
            causal = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
            x = x + s.attn(s.ln_1(x), causal)
            x = x + s.mlp(s.ln_2(x))
            return s.head(s.ln_f(x))

    tr = TinyTransformer().eval()
    ids = torch.randint(0, 50, (2, 6))
    path = os.path.join(OUT, "tiny_transformer.onnx")
    torch.onnx.export(tr, (ids,), path, dynamo=False, opset_version=17, input_names=["ids"],
                      output_names=["logits"],
                      dynamic_axes={"ids": {0: "batch", 1: "sequence"},
                                    "logits": {0: "batch", 1: "sequence"}})
    write("tiny_transformer", onnx.load(path), {"ids": ids.numpy()}, sets="batch=2,sequence=6")


def patterns():
    """The chains the importer turns into builtins, in orderings the unit tests do not use: the
    erf GELU by 1/√2 with the half first, the tanh GELU with x·x·x, attention scaled on both
    operands with a [Tq, Tk] mask, and attention over k [B, T, H, D] transposed to [B, H, D, T]."""
    n = h.make_node
    nodes = [
        n("Mul", ["x", "inv_sqrt2"], ["g_d"]), n("Erf", ["g_d"], ["g_e"]),
        n("Add", ["one", "g_e"], ["g_a"]), n("Mul", ["half", "x"], ["g_h"]),
        n("Mul", ["g_h", "g_a"], ["gelu"]),
        n("Mul", ["x", "x"], ["t_x2"]), n("Mul", ["t_x2", "x"], ["t_x3"]),
        n("Mul", ["c", "t_x3"], ["t_c"]), n("Add", ["t_c", "x"], ["t_s"]),
        n("Mul", ["k", "t_s"], ["t_z"]), n("Tanh", ["t_z"], ["t_t"]),
        n("Add", ["t_t", "one"], ["t_a"]), n("Mul", ["x", "t_a"], ["t_m"]),
        n("Mul", ["t_m", "half"], ["gelu_tanh"]),
        n("Mul", ["q", "s4"], ["a_q"]), n("Mul", ["kt", "s4"], ["a_k"]),
        n("MatMul", ["a_q", "a_k"], ["a_s"]), n("Add", ["mask", "a_s"], ["a_m"]),
        n("Softmax", ["a_m"], ["a_p"], axis=-1), n("MatMul", ["a_p", "v"], ["attn"]),
        n("Transpose", ["kh"], ["b_kt"], perm=[0, 2, 3, 1]),
        n("MatMul", ["q", "b_kt"], ["b_s"]), n("Mul", ["b_s", "s2"], ["b_m"]),
        n("Softmax", ["b_m"], ["b_p"], axis=3), n("MatMul", ["b_p", "v"], ["attn_t"]),
    ]
    inits = [init("inv_sqrt2", np.float32(0.70710677)), init("one", np.float32(1)),
             init("half", np.float32(0.5)), init("c", np.float32(0.044715)),
             init("k", np.float32(np.sqrt(2 / np.pi))), init("s4", np.float32(8 ** -0.25)),
             init("s2", np.float32(8 ** -0.5))]
    mask = np.triu(np.full((5, 5), -1e4, np.float32), 1)
    ins = [vi("x", T.FLOAT, [2, 3, 4]), vi("q", T.FLOAT, [2, 3, 5, 8]),
           vi("kt", T.FLOAT, [2, 3, 8, 5]), vi("v", T.FLOAT, [2, 3, 5, 6]),
           vi("mask", T.FLOAT, [5, 5]), vi("kh", T.FLOAT, [2, 5, 3, 8])]
    outs = ["gelu", "gelu_tanh", "attn", "attn_t"]
    m = graph("patterns", nodes, ins, [vi(o, T.FLOAT, None) for o in outs], inits)
    write("op_patterns", m, {"x": f32(2, 3, 4), "q": f32(2, 3, 5, 8), "kt": f32(2, 3, 8, 5),
                             "v": f32(2, 3, 5, 6), "mask": mask, "kh": f32(2, 5, 3, 8)})


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    pointwise()
    reduce()
    shapes()
    nn_ops()
    patterns()
    models()
