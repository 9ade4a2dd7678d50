"""A character-level language-modelling data set from a plain-text book, for `mgnc train`.

    python3 bench/book_dataset.py BOOK.txt OUT.safetensors [--block 64] [--stride 8]

Every window of `block + 1` characters starting at a multiple of `stride` becomes one sample:
`tokens` (its first `block` characters) and `targets` (its last `block`: the next character at
each position), both i32 indices into the book's sorted distinct characters. Prints the
vocabulary size (the model's `vocab`) and the number of samples.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from safetensors_io import save  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("book")
    ap.add_argument("out")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--stride", type=int, default=8)
    a = ap.parse_args()
    text = open(a.book, encoding="utf-8").read()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.int32)
    starts = np.arange(0, len(ids) - a.block - 1, a.stride)
    windows = np.stack([ids[s : s + a.block + 1] for s in starts])
    save(
        a.out,
        {"tokens": windows[:, :-1], "targets": windows[:, 1:]},
        {"vocab": "".join(chars), "block": str(a.block), "stride": str(a.stride)},
    )
    print(f"vocab={len(chars)} samples={len(starts)} characters={len(text)}")


if __name__ == "__main__":
    main()
