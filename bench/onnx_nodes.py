#!/usr/bin/env python3
"""Runs the ONNX backend node tests the `onnx` package ships through `mgnc import` and
`mgnc run`, and prints, per op, how many of its tests pass. A test passes when the import
succeeds and every output matches the expected one within the test's tolerances (rtol, atol);
an import that refuses a test (an attribute, type or opset mgn cannot express) counts as
refused, not failed: refusing is the importer's contract.

The tests come from site-packages/onnx/backend/test/data/node/test_*/ (model.onnx and
test_data_set_0/*.pb) when that directory exists, else from the generators in
onnx.backend.test.case.node (the same cases). Usage: onnx_nodes.py [--ops Relu,Conv]
[--mgnc target/debug/mgnc] [--backend cpu|vulkan] [--verbose]."""
import argparse, collections, glob, os, subprocess, sys, tempfile
import warnings
import numpy as np
import onnx
from onnx import numpy_helper
from safetensors.numpy import save_file, load_file

sys.path.insert(0, os.path.dirname(__file__))
from onnx_compare import ident  # noqa: E402

# The ops the importer translates (import/src/onnx/ops/*.rs, fold.rs).
OPS = """Abs Add And ArgMax ArgMin AveragePool BatchNormalization Cast CastLike Clip Concat Constant
ConstantOfShape Conv ConvTranspose Cos CumSum Div Dropout Einsum Elu Equal Erf Exp Expand Flatten
Gather GatherElements Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual HardSigmoid
HardSwish Identity InstanceNormalization LayerNormalization LeakyRelu Less LessOrEqual Log
LogSoftmax MatMul Max MaxPool Min Mish Mod Mul Neg Not Or PRelu Pad Pow Range Reciprocal ReduceMax
ReduceMean ReduceMin ReduceProd ReduceSum Relu Reshape Resize Shape Sigmoid Sin Size Slice
Softmax Softplus Split Sqrt Squeeze Sub Sum Tanh Transpose Trilu Unsqueeze Where""".split()


def cases():
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    if os.path.isdir(root):
        for d in sorted(glob.glob(os.path.join(root, "test_*"))):
            model = onnx.load(os.path.join(d, "model.onnx"))
            data = os.path.join(d, "test_data_set_0")
            read = lambda pre: [numpy_helper.to_array(onnx.load_tensor(f)) for f in
                                sorted(glob.glob(os.path.join(data, pre + "_*.pb")))]
            yield os.path.basename(d), model, read("input"), read("output"), 1e-3, 1e-7
        return
    from onnx.backend.test.case.node import collect_testcases
    for c in collect_testcases():
        if c.model is not None and c.data_sets:
            yield c.name, c.model, list(c.data_sets[0][0]), list(c.data_sets[0][1]), c.rtol, c.atol


# Inputs an exporter writes as constants (shapes, axes, pads, sizes, scales, bounds) and mgn
# needs when it builds the model: the runner makes them initializers of the test's values.
STATIC = {"Reshape": {1}, "Expand": {1}, "Unsqueeze": {1}, "Squeeze": {1}, "Slice": {1, 2, 3, 4},
          "Split": {1}, "Pad": {1, 2, 3}, "Resize": {1, 2, 3}, "ReduceMean": {1},
          "ReduceSum": {1}, "ReduceMax": {1}, "ReduceMin": {1}, "ReduceProd": {1},
          "Trilu": {1}, "Clip": {1, 2}, "Pow": {1}, "CumSum": {1}, "ConstantOfShape": {0},
          "Range": {0, 1, 2}, "Tile": {1}}


def bake(model, ins):
    """Moves the inputs in STATIC slots into initializers; returns the remaining inputs."""
    inits = {i.name for i in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in inits]
    static = {i for n in model.graph.node for k, i in enumerate(n.input)
              if k in STATIC.get(n.op_type, ())}
    keep, values = [], []
    for v, x in zip(names, ins):
        if v in static:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(x), v))
        else:
            keep.append(v)
            values.append(x)
    inputs = [v for v in model.graph.input if v.name in keep or v.name in inits]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    return keep, values


def run_case(a, name, model, ins, outs, rtol, atol, d):
    tensor = lambda x: numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x
    ins, outs = [tensor(x) for x in ins], [tensor(x) for x in outs]
    if not all(isinstance(x, (np.ndarray, np.generic)) for x in list(ins) + list(outs)):
        return "refused", "a sequence or optional value (mgn has tensors only)"
    ins, outs = [np.asarray(x) for x in ins], [np.asarray(x) for x in outs]
    if any(x.dtype.kind in "OSU" or x.dtype.itemsize == 1 and x.dtype != np.bool_
           or x.dtype == np.float64 or x.dtype.kind == "V" for x in ins + outs):
        return "refused", "strings, 8-bit, double or exotic float elements (no mgn type)"
    names, ins = bake(model, ins)
    path = os.path.join(d, "model.onnx")
    onnx.save(model, path)
    mgn, w = os.path.join(d, "m.mgn"), os.path.join(d, "m.safetensors")
    r = subprocess.run([a.mgnc, "import", path, "-o", mgn, "--weights", w],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return "refused", r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    declared = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in model.graph.input}
    feeds = {}
    for n, x in zip(names, ins):
        shape = declared.get(n)
        if shape is not None and all(shape) and int(np.prod(shape)) == x.size:
            x = x.reshape(shape)  # a scalar given as [1], say
        feeds[ident(n)] = np.ascontiguousarray(x)
    if any(x.dtype in (np.float64, np.uint8, np.int8, np.uint64) or x.size == 0
           for x in feeds.values()):
        return "refused", "an input type or an empty input mgn has no tensor for"
    inp, out = os.path.join(d, "in.safetensors"), os.path.join(d, "out.safetensors")
    save_file(feeds, inp)
    r = subprocess.run([a.mgnc, "run", mgn, "--weights", w, "--inputs", inp, "--out", out,
                        "--backend", a.backend], capture_output=True, text=True)
    if r.returncode != 0:
        return "failed", "run: " + (r.stderr.strip().splitlines() or [""])[-1]
    got = load_file(out)
    for v, want in zip(model.graph.output, outs):
        g = got.get("output." + ident(v.name))
        if g is None or g.shape != want.shape:
            return "failed", f"{v.name}: shape {None if g is None else g.shape} != {want.shape}"
        if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
            ok = np.array_equal(g.astype(np.int64), want.astype(np.int64))
        else:
            ok = np.allclose(g.astype(np.float64), want.astype(np.float64), rtol=max(rtol, 1e-4),
                             atol=max(atol, 1e-5), equal_nan=True)
        if not ok:
            return "failed", f"{v.name}: values differ"
    return "passed", ""


def main():
    warnings.filterwarnings("ignore")
    np.seterr(all="ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops")
    ap.add_argument("--mgnc", default=os.environ.get("MGNC", "target/debug/mgnc"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    wanted = set(a.ops.split(",")) if a.ops else set(OPS)
    tally = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory() as d:
        for name, model, ins, outs, rtol, atol in cases():
            ops = {n.op_type for n in model.graph.node}
            op = model.graph.node[0].op_type if len(ops) > 1 else next(iter(ops))
            if op not in wanted or "expanded" in name:
                continue
            verdict, why = run_case(a, name, model, ins, outs, rtol, atol, d)
            tally[op][verdict] += 1
            if a.verbose and verdict != "passed":
                print(f"  {name}: {verdict}: {why}")
    total = collections.Counter()
    for op in sorted(tally):
        t = tally[op]
        total.update(t)
        n = sum(t.values())
        print(f"{op:24} {t['passed']:3}/{n:<3} passed  {t['refused']:3} refused  "
              f"{t['failed']:3} failed")
    n = sum(total.values())
    print(f"{'all':24} {total['passed']:3}/{n:<3} passed  {total['refused']:3} refused  "
          f"{total['failed']:3} failed")


if __name__ == "__main__":
    main()
