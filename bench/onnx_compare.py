#!/usr/bin/env python3
"""Imports an ONNX model with `mgnc import`, runs it with `mgnc run`, and compares the outputs
with onnxruntime's. Usage: onnx_compare.py MODEL.onnx [--inputs IN.safetensors]
[--backend cpu|vulkan] [--mgnc PATH]. Prints one line: the model, and per output the relative
L2 error; exits 1 when the import fails or an error exceeds --tol (1e-4)."""
import argparse, os, subprocess, sys, tempfile
import numpy as np
import onnx, onnxruntime as ort
from safetensors.numpy import save_file, load_file

NP = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16}


def make_inputs(model, seed=0):
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        dims = [d.dim_value if d.dim_value > 0 else 2 for d in t.shape.dim]
        dt = NP.get(t.elem_type, np.float32)
        if np.issubdtype(dt, np.integer):
            out[v.name] = rng.integers(0, 10, size=dims).astype(dt)
        elif dt == np.bool_:
            out[v.name] = rng.random(dims) > 0.5
        else:
            out[v.name] = rng.standard_normal(dims).astype(dt)
    return out


# The importer's reserved words and builtins (import/src/onnx/emit.rs), which it suffixes.
RESERVED = set("""use const fn layer model forward repeat let if else true false self as f32 f16 bf16 i32
i64 u32 input output loss param buffer init training dim int float bool dtype state relu
gelu gelu_tanh silu sigmoid tanh exp log sqrt rsqrt abs sin cos square erf log1p expm1
softplus pow cast stop_gradient full_precision floor_div ceil_div matmul einsum transpose
permute reshape unsqueeze squeeze flatten concat split slice narrow slice_scatter gather
embedding arange sum mean max min argmax softmax log_softmax layer_norm rms_norm
group_norm batch_norm dropout conv1d conv2d conv_transpose1d conv_transpose2d max_pool1d
avg_pool1d max_pool2d avg_pool2d upsample pad interpolate attention rope
softmax_cross_entropy where maximum minimum clamp full zeros_like ones_like broadcast_to
expand one_hot cumsum topk take_along_axis tied given zeros ones constant normal uniform
relu6 hardsigmoid hardswish leaky_relu elu mish""".split())


def ident(name):
    s = "".join(c if c.isalnum() else "_" for c in name).strip("_")
    while "__" in s:
        s = s.replace("__", "_")
    if not s or s[0].isdigit():
        s = "v_" + s
    if s in RESERVED:
        s += "_1"
    return s


def rel_l2(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--inputs")
    ap.add_argument("--expected")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--mgnc", default=os.environ.get("MGNC", "target/debug/mgnc"))
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--keep")
    a = ap.parse_args()
    model = onnx.load(a.model, load_external_data=False)
    feeds = load_file(a.inputs) if a.inputs else make_inputs(model)
    sets = [f for f in feeds]
    names = [o.name for o in model.graph.output]
    if a.expected:
        exp = load_file(a.expected)
        expected = [exp[n] if n in exp else exp["output." + ident(n)] for n in names]
    else:
        sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
        expected = sess.run(names, feeds)
    d = a.keep or tempfile.mkdtemp()
    os.makedirs(d, exist_ok=True)
    mgn, w = os.path.join(d, "model.mgn"), os.path.join(d, "model.safetensors")
    r = subprocess.run([a.mgnc, "import", a.model, "-o", mgn, "--weights", w],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{os.path.basename(a.model)}: IMPORT FAILED\n{r.stderr}")
        return 1
    inp = os.path.join(d, "in.safetensors")
    save_file({ident(k): np.ascontiguousarray(v) for k, v in feeds.items()}, inp)
    out = os.path.join(d, "out.safetensors")
    sets = []
    for v in model.graph.input:
        key = v.name if v.name in feeds else ident(v.name)
        if key not in feeds:
            continue
        for d, n in zip(v.type.tensor_type.shape.dim, feeds[key].shape):
            if d.dim_param and f"{ident(d.dim_param)}={n}" not in sets:
                sets += ["--set", f"{ident(d.dim_param)}={n}"]
    r = subprocess.run([a.mgnc, "run", mgn, "--weights", w, "--inputs", inp, "--out", out,
                        "--backend", a.backend] + sets, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{os.path.basename(a.model)}: RUN FAILED\n{r.stderr}")
        return 1
    got = load_file(out)
    worst, parts = 0.0, []
    for n, e in zip(names, expected):
        g = got.get("output." + ident(n))
        if g is None:
            print(f"{os.path.basename(a.model)}: no output {n}: {list(got)}")
            return 1
        if g.shape != e.shape:
            print(f"{os.path.basename(a.model)}: {n} shape {g.shape} != {e.shape}")
            return 1
        err = rel_l2(g, e) if e.dtype.kind == "f" else float((g != e).mean())
        worst = max(worst, err)
        parts.append(f"{n}: {err:.2e}")
    print(f"{os.path.basename(a.model)} [{a.backend}]: " + ", ".join(parts))
    return 0 if worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
