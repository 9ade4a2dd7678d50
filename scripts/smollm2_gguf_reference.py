#!/usr/bin/env python3
"""The expected values of tests/gguf.rs for the real SmolLM2-135M-Instruct Q4_1 GGUF
(scripts/fetch_smollm2_gguf.sh), written to tests/fixtures/gguf/smollm2_reference.json — ids
only; the model file is never committed:

    text, text_ids     a page of text and its ids from the Hugging Face `tokenizers` library
                       built here from the file's own vocab and merges, with SmolLM2's
                       pre-tokenizer (single digits, then GPT-2's byte-level split) and its
                       control tokens as special tokens
    prompt_ids, greedy 16 tokens of greedy continuation of the prompt, by a numpy (float64)
                       forward on the weights dequantized by gguf.quants.dequantize, with
                       llama.cpp's conventions (its interleaved rope on the stored q/k rows),
                       recomputing the whole sequence each step; `margins` holds each step's
                       gap between the best and second-best logit, so a near-tie is visible

    /work/torchenv/bin/python scripts/smollm2_gguf_reference.py [GGUF]
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DEFAULT = os.path.expanduser("~/.cache/mgn/smollm2_gguf/SmolLM2-135M-Instruct.Q4_1.gguf")
STEPS = 16
TEXT = """\
<|im_start|>user
What is the boiling point of water at 2,400 metres? Answer in °C and °F, please.<|im_end|>
The Rhine rises in the Swiss Alps and flows 1,233 km to the North Sea; its delta, shared with
the Meuse, holds Rotterdam — Europe's largest port since 1962 (by tonnage). Ships of up to
12,000 t reach Basel, where the river turns north at the "Rheinknie".

def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a   # fib(10) == 55

Tokenizers split text like this: "don't", "they're", "I'll've"; numbers 3.14159 and 2026-12-07;
e-mail someone@example.org; URLs https://example.com/a?b=c&d=e#f.   Spaces   and tabs\t\there.
Naïve café owners in Zürich sell crème brûlée for CHF 9.50 — ça coûte cher! 日本語のテキスト、
한국어 텍스트, русский текст, ελληνικά, עברית, العربية. Emoji: 🦀🐍✨ (crab, snake, sparkles).

  Indented line with trailing spaces   
Last line without a newline."""
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def tokenizer(reader):
    field = lambda k: reader.fields[k].contents()
    tokens, types, merges = (field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type"),
                             field("tokenizer.ggml.merges"))
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


def weights(reader):
    W = {}
    for t in reader.tensors:
        shape = [int(s) for s in reversed(t.shape)]
        W[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return W


def forward(W, c, ids):
    """Logits of the last position, llama.cpp's `llama` graph in float64."""
    H, KV, hd, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
    T = len(ids)
    norm = lambda x, w: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w
    inv = c["theta"] ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):  # adjacent pairs, on the rows as llama.cpp stores them
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    causal = np.triu(np.full((T, T), -np.inf), 1)
    x = W["token_embd.weight"][ids]
    for i in range(c["n_layers"]):
        p = lambda n: W[f"blk.{i}.{n}.weight"]
        h = norm(x, p("attn_norm"))
        q = rope((h @ p("attn_q").T).reshape(T, H, hd))
        k = np.repeat(rope((h @ p("attn_k").T).reshape(T, KV, hd)), H // KV, axis=1)
        v = np.repeat((h @ p("attn_v").T).reshape(T, KV, hd), H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        y = np.einsum("hts,shd->thd", s / s.sum(-1, keepdims=True), v).reshape(T, H * hd)
        x = x + y @ p("attn_output").T
        h = norm(x, p("ffn_norm"))
        g = h @ p("ffn_gate").T
        x = x + ((g / (1 + np.exp(-g))) * (h @ p("ffn_up").T)) @ p("ffn_down").T
    return norm(x[-1], W["output_norm.weight"]) @ W["token_embd.weight"].T


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    r = gguf.GGUFReader(path)
    tok = tokenizer(r)
    text_ids = tok.encode(TEXT, add_special_tokens=False).ids
    assert tok.decode(text_ids, skip_special_tokens=False) == TEXT, "round trip"
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False).ids
    f = lambda k: r.fields[k].contents()
    c = dict(n_layers=f("llama.block_count"), heads=f("llama.attention.head_count"),
             kv_heads=f("llama.attention.head_count_kv"),
             head_dim=f("llama.embedding_length") // f("llama.attention.head_count"),
             eps=f("llama.attention.layer_norm_rms_epsilon"), theta=f("llama.rope.freq_base"))
    W = weights(r)
    ids, greedy, margins = list(prompt_ids), [], []
    for _ in range(STEPS):
        logits = forward(W, c, ids)
        top2 = np.sort(logits)[-2:]
        nxt = int(np.argmax(logits))
        greedy.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        ids.append(nxt)
    out = dict(text=TEXT, text_ids=text_ids, prompt=PROMPT, prompt_ids=prompt_ids,
               greedy=greedy, margins=[round(m, 4) for m in margins])
    dest = os.path.join(ROOT, "tests", "fixtures", "gguf", "smollm2_reference.json")
    with open(dest, "w") as fh:
        json.dump(out, fh, ensure_ascii=False, indent=1)
    print(f"{len(text_ids)} text ids; greedy {greedy} -> {tok.decode(greedy)!r}; "
          f"smallest margin {min(margins):.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
