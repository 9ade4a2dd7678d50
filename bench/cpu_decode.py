"""The memory-bound floor of one decoded token on this machine: numpy's matrix-vector product
(BLAS, all cores) over every weight matrix of a checkpoint, once each, as one token reads them.

    python3 bench/cpu_decode.py --weights W.safetensors [--repeat 20]

Prints `floor_ms <median>`, `bytes <sum of the matrices' bytes>` and `matrices <count>`. The
checkpoint is read with numpy alone (a safetensors file is a JSON header and raw arrays); every
2-D f32 tensor counts, the token embedding once (the tied output head reads it whole; the
lookup reads one row). Norm weights and other vectors are left out: they are a rounding error
of the bytes. Each pass multiplies every matrix by a vector of its input size, so no matrix
stays in the caches from one pass to the next (the model is far larger than any cache).
"""

import argparse
import json
import statistics
import struct
import time

import numpy as np


def matrices(path):
    """The 2-D f32 tensors of a safetensors file, as arrays over one read of it."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = []
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32" or len(info["shape"]) != 2:
            continue
        a, b = info["data_offsets"]
        w = np.frombuffer(data, dtype=np.float32, count=(b - a) // 4, offset=a)
        # A copy of its own: the file's arrays need not be aligned, and BLAS copies those first.
        out.append((name, w.reshape(info["shape"]).copy()))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weights", required=True)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    ws = matrices(args.weights)
    if not ws:
        raise SystemExit(f"error: {args.weights} holds no 2-D f32 tensor")
    # W [out, in] as checkpoints store a linear layer's weight: y = W x reads W once, row by row.
    xs = [np.random.default_rng(0).standard_normal(w.shape[1], dtype=np.float32) for _, w in ws]
    times = []
    for i in range(args.repeat + 2):
        t = time.perf_counter()
        for (_, w), x in zip(ws, xs):
            w @ x
        if i >= 2:  # two warm-up passes
            times.append(time.perf_counter() - t)
    print(f"floor_ms {statistics.median(times) * 1e3:.2f}")
    print(f"bytes {sum(w.nbytes for _, w in ws)}")
    print(f"matrices {len(ws)}")


if __name__ == "__main__":
    main()
