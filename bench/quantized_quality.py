"""What quantization costs in quality, measured on the CPU backend (the numerical reference):
the driver behind bench/quantized_quality.sh, which fetches the real weights it needs.

Four tables, each f32 against every packed format (`mgnc … --quantize FMT`):
  1. all-MiniLM-L6-v2's real weights: each sentence embedding of the search fixture against the
     f32 plan's (cosine), the worst change in the 8×8 similarity matrix, and the search ranking
     (each sentence as a query: is its nearest other sentence still the f32 one's).
  2. A character-level GPT trained in f32 on a public-domain book (bench/mixed_gpt.sh's):
     validation loss of the f32 weights run f32 and run quantized.
  3. The real SmolLM2-135M-Instruct Q4_1 GGUF run as the file packs it (`mgnc import`, weights
     kept packed) against the same weights decoded to f32 (`mgnc import --dequantize`): the
     logits must agree to rounding (the same values), and so must the greedy text.
  4. SmolLM2-135M (those decoded weights taken as f32): logits cosine to f32 over a page of text
     for each format, and the greedy ids' agreement.

Usage: quantized_quality.py --mgnc MGNC --out DIR --minilm DIR --book FILE --gguf FILE
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ["q8_0", "q4_0", "q4_1", "q4_k"]


def sh(*args, **kw):
    """Runs a command, returning its stdout+stderr; exits with them on failure."""
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(map(str, args))}\n{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def quantized_line(text):
    m = re.search(r"^quantized .*$", text, re.M)
    return m.group(0) if m else ""


def run(mgnc, model, weights, inputs, out, fmt, sets, extra=()):
    """`mgnc run` of `model`, quantized to `fmt` unless it is f32; the outputs as numpy."""
    q = [] if fmt == "f32" else ["--quantize", fmt]
    s = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    log = sh(mgnc, "run", model, "--weights", weights, "--inputs", inputs, "--out", out,
             "--backend", "cpu", *s, *q, *extra)
    return load_file(out), quantized_line(log)


def cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def minilm(a):
    fx = json.load(open(os.path.join(ROOT, "tests/fixtures/minilm_search/fixture.json")))
    ids = fx["ids"]
    B, T = len(ids), max(map(len, ids))
    x = np.zeros((B, T), np.int32)
    mask = np.zeros((B, T), np.int32)
    for i, row in enumerate(ids):
        x[i, :len(row)] = row
        mask[i, :len(row)] = 1
    inputs = f"{a.out}/minilm.inputs.safetensors"
    save_file({"input_ids": x, "attention_mask": mask,
               "token_type_ids": np.zeros_like(x)}, inputs)
    model = os.path.join(ROOT, "models/minilm_l6.mgn")
    weights = f"{a.minilm}/model.safetensors"

    def embed(fmt):
        out, line = run(a.mgnc, model, weights, inputs, f"{a.out}/minilm.{fmt}.safetensors", fmt,
                        {"B": B, "T": T})
        key = next(k for k in ("output.embeddings", "output.pooler_output") if k in out)
        e = out[key].astype(np.float64)
        return e / np.linalg.norm(e, axis=1, keepdims=True), line

    ref, _ = embed("f32")
    upstream = np.array(fx["embeddings"], np.float64)
    sim_ref = ref @ ref.T
    def near(s):
        """Each sentence's nearest other sentence."""
        return [int(np.argmax(np.where(np.arange(B) == i, -9.0, s[i]))) for i in range(B)]
    print("\n### all-MiniLM-L6-v2 (real weights), the search fixture's 8 sentences\n")
    print(f"f32 against sentence-transformers: worst cosine "
          f"{min(cosine(ref[i], upstream[i]) for i in range(B)):.7f}\n")
    print("| format | worst cosine to f32 | mean cosine | worst Δ similarity | "
          "same nearest sentence | quantized |")
    print("|---|---|---|---|---|---|")
    for fmt in FORMATS:
        e, line = embed(fmt)
        cos = [cosine(e[i], ref[i]) for i in range(B)]
        sim = e @ e.T
        same = sum(p == q for p, q in zip(near(sim), near(sim_ref)))
        print(f"| {fmt} | {min(cos):.5f} | {np.mean(cos):.5f} | "
              f"{np.abs(sim - sim_ref).max():.4f} | {same}/{B} | {line} |")


def gpt(a):
    d = f"{a.out}/gpt"
    os.makedirs(d, exist_ok=True)
    data = f"{d}/book.safetensors"
    log = sh(sys.executable, os.path.join(ROOT, "bench/book_dataset.py"), a.book, data,
             "--block", "64", "--stride", str(a.gpt_stride))
    vocab = int(re.search(r"vocab=(\d+)", log).group(1))
    all_ = load_file(data)
    n = len(all_["tokens"])
    cut = n * 9 // 10
    val_n = min(n - cut, 512)
    save_file({k: v[:cut] for k, v in all_.items()}, f"{d}/train.safetensors")
    save_file({k: v[cut:cut + val_n] for k, v in all_.items()}, f"{d}/val.safetensors")
    sets = {"vocab": vocab, "d": 256, "depth": 2, "heads": 4, "block_size": 64, "T": 64}
    s = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    model = os.path.join(ROOT, "models/tiny_gpt.mgn")
    ckpt = f"{d}/gpt.safetensors"
    t0 = time.time()
    sh(a.mgnc, "train", model, "--data", f"{d}/train.safetensors", *s, "--batch", "16",
       "--epochs", "1", "--lr", "0.002", "--seed", "0", "--save", ckpt, "--backend", "cpu",
       "--quiet")
    took = time.time() - t0
    print(f"\n### Character-level GPT (d = 256, 2 blocks, {vocab} characters), trained f32 on "
          f"{cut} windows of the book in {took:.0f} s; validation: {val_n} windows\n")
    print("| format | validation loss | vs f32 | quantized |")
    print("|---|---|---|---|")
    base = None
    for fmt in ["f32"] + FORMATS:
        out, line = run(a.mgnc, model, ckpt, f"{d}/val.safetensors", f"{d}/val.{fmt}.out",
                        fmt, {**sets, "B": val_n})
        loss = float(out["loss"])
        base = loss if base is None else base
        print(f"| {fmt} | {loss:.4f} | {loss - base:+.4f} | {line} |")


def smollm2(a):
    d = f"{a.out}/smollm2"
    os.makedirs(d, exist_ok=True)
    sh(a.mgnc, "import", a.gguf, "-o", f"{d}/packed.mgn")
    sh(a.mgnc, "import", a.gguf, "-o", f"{d}/f32.mgn", "--dequantize")
    ref = json.load(open(os.path.join(ROOT, "tests/fixtures/gguf/smollm2_reference.json")))
    ids = np.array(ref["text_ids"][:a.tokens], np.int32)[None, :]
    inputs = f"{d}/ids.safetensors"
    save_file({"input_ids": ids}, inputs)
    sets = {"T": ids.shape[1]}
    model = "SmolLM2_135MInstruct"

    def logits(mgn, weights, fmt, tag):
        out, line = run(a.mgnc, mgn, weights, inputs, f"{d}/logits.{tag}.safetensors", fmt,
                        sets, ("--model", model))
        return out["output.logits"][0].astype(np.float64), line

    f32, _ = logits(f"{d}/f32.mgn", f"{d}/f32.safetensors", "f32", "f32")
    packed, _ = logits(f"{d}/packed.mgn", f"{d}/packed.safetensors", "f32", "packed")
    rel = np.linalg.norm(packed - f32) / np.linalg.norm(f32)
    print(f"\n### SmolLM2-135M-Instruct, the real Q4_1 GGUF ({ids.shape[1]} tokens of the "
          f"reference page)\n")
    print(f"Packed as the file holds it (Q4_1 weights, Q8_0 embedding) against the same weights "
          f"decoded to f32: logits rel. L2 {rel:.2e}, greedy ids "
          f"{'equal' if (packed.argmax(1) == f32.argmax(1)).all() else 'DIFFER'}.\n")
    gen = []
    for tag in ("packed", "f32"):
        text = sh(a.mgnc, "generate", f"{d}/{tag}.mgn", "--weights", f"{d}/{tag}.safetensors",
                  "--tokenizer", f"{d}/{tag}.tokenizer.json", "--prompt",
                  "What is the capital of France?", "--chat", "--tokens", "24", "--backend",
                  "cpu")
        gen.append(text.strip().splitlines()[0] if text.strip() else "")
    print(f"Greedy text, packed: \"{gen[0]}\"; f32: \"{gen[1]}\" "
          f"({'the same' if gen[0] == gen[1] else 'DIFFERENT'}).\n")
    print("Those f32 weights quantized again by `--quantize` (logits over the same tokens):\n")
    print("| format | logits cosine to f32 (worst token) | mean | greedy ids equal to f32's | "
          "quantized |")
    print("|---|---|---|---|---|")
    for fmt in FORMATS:
        q, line = logits(f"{d}/f32.mgn", f"{d}/f32.safetensors", fmt, fmt)
        cos = [cosine(q[t], f32[t]) for t in range(q.shape[0])]
        same = int((q.argmax(1) == f32.argmax(1)).sum())
        print(f"| {fmt} | {min(cos):.5f} | {np.mean(cos):.5f} | {same}/{q.shape[0]} | {line} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mgnc", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minilm")
    ap.add_argument("--book")
    ap.add_argument("--gguf")
    ap.add_argument("--gpt-stride", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.minilm:
        minilm(a)
    if a.book:
        gpt(a)
    if a.gguf:
        smollm2(a)


if __name__ == "__main__":
    main()
