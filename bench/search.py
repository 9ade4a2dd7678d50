"""all-MiniLM-L6-v2 sentence embeddings with sentence-transformers on the GPU: the PyTorch side
of bench/search.sh.

Builds the model (BertModel with all-MiniLM-L6-v2's config, seeded random weights — the real
ones are 90 MB and do not travel to the GPU machine; speed does not depend on them) into a
sentence-transformers pipeline with the real tokenizer (Transformer, max_seq_length 256 → mean
Pooling → Normalize), saves the weights for mgn (--weights) and a corpus of --n sentences of
mixed lengths (--sentences, one per line, words of the tokenizer's vocabulary), then times
`model.encode(corpus, batch_size=--batch)` on the GPU in strict f32: --repeat runs after two
warm-ups, each synchronised. Prints sentences per second (median) and writes the embeddings
(--embeddings-out) for the agreement check.
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from reference import DEFAULTS, perturb_constants, save_safetensors, strict_f32  # noqa: E402


def corpus(tokenizer_json, n, seed):
    """`n` sentences of 3 to 60 whole words each, drawn from the tokenizer's vocabulary."""
    vocab = json.load(open(tokenizer_json))["model"]["vocab"]
    words = sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 1)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(3, 60)
        s = " ".join(rng.choice(words) for _ in range(k))
        out.append(s[0].upper() + s[1:] + ".")
    return out


def build(tokenizer_json, seed, device):
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast
    c = DEFAULTS["minilm_l6"]
    config = BertConfig(vocab_size=c["vocab"], hidden_size=c["d"], num_hidden_layers=c["n_layers"],
                        num_attention_heads=c["heads"], intermediate_size=c["ffn"],
                        max_position_embeddings=c["max_positions"], type_vocab_size=c["type_vocab"],
                        layer_norm_eps=c["eps"], hidden_act="gelu", hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    bert = BertModel(config).float().eval()
    perturb_constants(bert, torch.Generator().manual_seed(seed + 1))
    folder = tempfile.mkdtemp(prefix="minilm-")
    bert.save_pretrained(folder)
    BertTokenizerFast(tokenizer_file=tokenizer_json).save_pretrained(folder)
    word = models.Transformer(folder, max_seq_length=256)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[word, pool, models.Normalize()], device=str(device))
    return model, bert


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--sentences", required=True)
    ap.add_argument("--embeddings-out", required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    strict_f32()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sentences = corpus(args.tokenizer, args.n, args.seed)
    with open(args.sentences, "w") as f:
        f.write("\n".join(sentences) + "\n")
    model, bert = build(args.tokenizer, args.seed, dev)
    sd = dict(bert.state_dict())
    # mgn's model keeps BertModel's position_ids buffer so HF checkpoints load strictly.
    sd.setdefault("embeddings.position_ids", torch.arange(DEFAULTS["minilm_l6"]["max_positions"])[None])
    save_safetensors(args.weights, sd)
    encode = lambda: model.encode(sentences, batch_size=args.batch, convert_to_tensor=True)  # noqa: E731
    for _ in range(2):
        encode()
    times = []
    for _ in range(args.repeat):
        sync()
        t = time.perf_counter()
        emb = encode()
        sync()
        times.append(time.perf_counter() - t)
    save_safetensors(args.embeddings_out, {"embeddings": emb.float()})
    m = statistics.median(times)
    print(f"sentence-transformers: {len(sentences)} sentences, median {m * 1e3:.2f} ms, "
          f"{len(sentences) / m:.0f} sentences/s (batch {args.batch})")


if __name__ == "__main__":
    main()
