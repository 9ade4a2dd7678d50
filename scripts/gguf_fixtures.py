#!/usr/bin/env python3
"""Writes the GGUF fixtures of tests/gguf.rs and mgn-import's unit tests, with the `gguf`
package (llama.cpp's gguf-py) and numpy, into tests/fixtures/gguf/:

    quants.gguf       one tensor of each decoded type (F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K),
                      each followed by `<name>.expected`: gguf.quants.dequantize's f32 values.
                      Q4_K and Q6_K blocks are random bytes (with finite f16 scales): the package
                      does not quantize to them, but its dequantizer is the reference.
    <model>.gguf      tiny decoders of known weights, written as llama.cpp's converter writes
                      them (the q/k rows of `llama` files permuted for its interleaved rope; a
                      Gemma norm stored as 1 + w): llama and qwen3 in F32, F16, Q8_0, Q4_0 and
                      Q4_1, qwen2 (q/k/v biases, an untied output) in F32, gemma in F16, and a
                      llama whose matrices are Q4_K / Q6_K / Q8_0 blocks.
    spm.gguf          a tokenizer alone (`tokenizer.ggml.model` llama): a SentencePiece BPE model
                      with byte fallback trained here on a small corpus, written as llama.cpp's
                      converter writes one (pieces, scores, token types)
    expected.json     for each model, the logits of IDS computed here in numpy (float64) on the
                      weights read back from the file and dequantized, by llama.cpp's
                      conventions (its interleaved rope on the stored, permuted q/k rows) — an
                      implementation independent of the importer's.

    /work/torchenv/bin/python scripts/gguf_fixtures.py   # needs gguf, numpy, sentencepiece
"""
import json
import os
import sys

import io

import numpy as np
import gguf
import sentencepiece as spm
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gguf")
IDS = [3, 17, 5, 40, 22, 9, 31, 1]
SMALL = dict(vocab=48, d=32, n_layers=2, heads=4, kv_heads=2, head_dim=8, hidden=64,
             eps=1e-5, theta=1000.0, ctx=64)


def random_k_blocks(rng, qtype, rows, cols, scale=(0.001, 0.01)):
    """Random Q4_K / Q6_K bytes whose f16 scales are small and finite."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    f16 = lambda: np.frombuffer(np.float16(rng.uniform(*scale)).tobytes(), dtype=np.uint8)
    for r in range(rows):
        for b in range(cols // block):
            if qtype == Q.Q4_K:
                data[r, b, 0:2], data[r, b, 2:4] = f16(), f16()
            else:
                data[r, b, 208:210] = f16()
    return data.reshape(rows, -1)


def write_quants(rng):
    w = gguf.GGUFWriter(os.path.join(OUT, "quants.gguf"), "none")
    for qtype in [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K]:
        x = rng.normal(0, 1, size=(2, 256)).astype(np.float32)
        raw = random_k_blocks(rng, qtype, 2, 256) if qtype in (Q.Q4_K, Q.Q6_K) \
            else quantize(x, qtype)
        w.add_tensor(qtype.name, raw, raw_dtype=qtype)
        w.add_tensor(qtype.name + ".expected", dequantize(raw, qtype).astype(np.float32))
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_permute(weights, heads):
    """llama.cpp's converter: within each head, row s·hd/2 + j goes to row 2j + s."""
    rows, cols = weights.shape
    hd = rows // heads
    return weights.reshape(heads, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def model_tensors(rng, arch, c):
    """name -> (trained-layout f32 array); what a checkpoint of the HF model would hold."""
    d, hd, hidden = c["d"], c["head_dim"], c["hidden"]
    q, kv = c["heads"] * hd, c["kv_heads"] * hd
    g = lambda *s: rng.normal(0, 0.3, size=s).astype(np.float32)
    norm = lambda n: (1.0 + rng.normal(0, 0.1, size=n)).astype(np.float32)
    t = {"token_embd.weight": g(c["vocab"], d), "output_norm.weight": norm(d)}
    if arch == "qwen2":
        t["output.weight"] = g(c["vocab"], d)
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        t.update({p + "attn_norm.weight": norm(d), p + "attn_q.weight": g(q, d),
                  p + "attn_k.weight": g(kv, d), p + "attn_v.weight": g(kv, d),
                  p + "attn_output.weight": g(d, q), p + "ffn_norm.weight": norm(d),
                  p + "ffn_gate.weight": g(c["hidden"], d), p + "ffn_up.weight": g(hidden, d),
                  p + "ffn_down.weight": g(d, hidden)})
        if arch == "qwen2":
            t.update({p + "attn_q.bias": g(q), p + "attn_k.bias": g(kv), p + "attn_v.bias": g(kv)})
        if arch == "qwen3":
            t.update({p + "attn_q_norm.weight": norm(hd), p + "attn_k_norm.weight": norm(hd)})
    return t


def write_model(rng, name, arch, qtype, c, k_quants=False):
    w = gguf.GGUFWriter(os.path.join(OUT, name + ".gguf"), arch)
    w.add_name(name)
    w.add_block_count(c["n_layers"])
    w.add_context_length(c["ctx"])
    w.add_embedding_length(c["d"])
    w.add_feed_forward_length(c["hidden"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_rope_freq_base(c["theta"])
    w.add_uint32(f"{arch}.vocab_size", c["vocab"])
    for tname, x in model_tensors(rng, arch, c).items():
        if arch == "llama" and (tname.endswith("attn_q.weight") or tname.endswith("attn_k.weight")):
            heads = c["heads"] if "attn_q" in tname else c["kv_heads"]
            x = llama_permute(x, heads)
        if x.ndim == 1:
            w.add_tensor(tname, x)  # norms and biases stay F32, as llama.cpp keeps them
            continue
        t = qtype
        if k_quants:
            t = Q.Q6_K if tname == "token_embd.weight" else Q.Q4_K
            if x.shape[1] % 256:
                t = Q.Q8_0
        if t in (Q.Q4_K, Q.Q6_K):
            raw = random_k_blocks(rng, t, *x.shape, scale=(0.0002, 0.001))
        elif t == Q.F32:
            raw = x
        else:
            raw = quantize(x, t)
        w.add_tensor(tname, raw, raw_dtype=t)
    finish(w)


SPM_TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Numbers like 12345 and 3.14 are split into digits.",
    "Spaces:  two,   three; a tab\there and a newline\nthere.",
    "Unseen letters fall back to bytes: żółw, 日本, 🦀.",
    "<s>a control token in the text</s>",
]


def write_spm(expected):
    """A tiny SentencePiece BPE model (as Llama's: identity normalization, digits split, byte
    fallback, whitespace kept), written as llama.cpp's converter writes its pieces."""
    words = ("the quick brown fox jumps over lazy dog hello world numbers like and are split "
             "into digits spaces two three tab here newline there letters fall back to bytes "
             "model token text a an of in on at for with from").split()
    rng = np.random.default_rng(7)
    corpus = [" ".join(rng.choice(words, size=12)) + f" {rng.integers(0, 1000)}." for _ in range(400)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=400, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 1)
    w = gguf.GGUFWriter(os.path.join(OUT, "spm.gguf"), "none")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    finish(w)
    # SentencePiece itself treats "<s>" in text as text; llama.cpp and HF match control tokens
    # whole, so the last text's expected ids put them in by hand.
    ids = [sp.encode(t) for t in SPM_TEXTS[:-1]]
    inner = sp.encode("a control token in the text")
    ids.append([1] + inner + [2])
    expected["spm"] = {"texts": SPM_TEXTS, "ids": ids}


# The reference forward, by llama.cpp's conventions, in float64.

def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, theta, interleaved):
    """x [T, H, hd] at positions 0..T-1: adjacent pairs (llama.cpp's NORM rope) or halves
    (NEOX)."""
    T, _, hd = x.shape
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def reference_logits(path, arch, c):
    r = gguf.GGUFReader(path)
    W = {}
    for t in r.tensors:
        shape = [int(s) for s in reversed(t.shape)]
        W[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    H, KV, hd, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
    x = W["token_embd.weight"][IDS]
    if arch == "gemma":
        x = x * np.sqrt(c["d"])
    T = len(IDS)
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c["n_layers"]):
        p = lambda n: W[f"blk.{i}.{n}"]
        h = rms_norm(x, p("attn_norm.weight"), eps)
        proj = lambda n: h @ p(n + ".weight").T + (p(n + ".bias") if arch == "qwen2" else 0)
        q = proj("attn_q").reshape(T, H, hd)
        k = proj("attn_k").reshape(T, KV, hd)
        v = proj("attn_v").reshape(T, KV, hd)
        if arch == "qwen3":
            q = rms_norm(q, p("attn_q_norm.weight"), eps)
            k = rms_norm(k, p("attn_k_norm.weight"), eps)
        q, k = rope(q, c["theta"], arch == "llama"), rope(k, c["theta"], arch == "llama")
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        y = np.einsum("hts,shd->thd", s / s.sum(-1, keepdims=True), v).reshape(T, H * hd)
        x = x + y @ p("attn_output.weight").T
        h = rms_norm(x, p("ffn_norm.weight"), eps)
        gate = h @ p("ffn_gate.weight").T
        act = gelu_tanh(gate) if arch == "gemma" else gate / (1 + np.exp(-gate))
        x = x + (act * (h @ p("ffn_up.weight").T)) @ p("ffn_down.weight").T
    x = rms_norm(x, W["output_norm.weight"], eps)
    out = W.get("output.weight", W["token_embd.weight"])
    return (x @ out.T).astype(np.float32)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(48)
    write_quants(rng)
    kq = dict(SMALL, d=256, n_layers=1, heads=2, kv_heads=1, head_dim=32, hidden=32)
    models = [(f"{a}_{q.name.lower()}", a, q, SMALL, False)
              for a in ["llama", "qwen3"] for q in [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1]]
    models += [("qwen2_f32", "qwen2", Q.F32, SMALL, False),
               ("gemma_f16", "gemma", Q.F16, SMALL, False),
               ("llama_k_quants", "llama", None, kq, True)]
    expected = {"ids": IDS, "models": {}}
    write_spm(expected)
    for name, arch, qtype, c, kquants in models:
        write_model(rng, name, arch, qtype, c, kquants)
        logits = reference_logits(os.path.join(OUT, name + ".gguf"), arch, c)
        expected["models"][name] = {
            "vocab": c["vocab"], "logits": [float(v) for v in logits.reshape(-1)]}
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f)
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {len(models) + 2} GGUF files and expected.json, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
