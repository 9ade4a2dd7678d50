#!/usr/bin/env python3
"""Writes the demo data: the UCI handwritten digits as safetensors.

    pip install numpy scikit-learn safetensors
    python3 scripts/make_digits.py

Source: scikit-learn's copy of the UCI "Optical Recognition of Handwritten Digits" data
(E. Alpaydin, C. Kaynak, 1998; https://doi.org/10.24432/C50P49), licensed CC BY 4.0: the
1,797 grey 8x8 images (pixel counts 0..16) of UCI's test partition, optdigits.tes.

Output (see data/README.md):
    data/digits_train.safetensors   images f32[1437, 64] in [0, 1], labels i32[1437]
    data/digits_test.safetensors    images f32[360, 64],              labels i32[360]

The split is stratified by class and fixed by SEED (scikit-learn's train_test_split), and each
part is in the shuffled order the split produces. Files are written byte-for-byte
deterministically; the script prints their SHA-256 so a regeneration can be compared with
the committed files.
"""

import hashlib
import os
import sys

import numpy as np
import sklearn
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

SEED = 0
TEST_SIZE = 360
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)  # [1797, 64], pixel counts 0..16 -> [0, 1]
    labels = digits.target.astype(np.int32)
    assert images.shape == (1797, 64) and labels.shape == (1797,)
    assert images.min() == 0.0 and images.max() == 1.0

    index = np.arange(len(labels))
    train_idx, test_idx = train_test_split(index, test_size=TEST_SIZE, stratify=labels, random_state=SEED, shuffle=True)
    assert len(set(train_idx) | set(test_idx)) == len(labels) and not set(train_idx) & set(test_idx)

    common = {
        "mgn.format": "1",
        "dataset": "UCI Optical Recognition of Handwritten Digits, test partition (optdigits.tes, 1797 samples), as bundled by sklearn.datasets.load_digits",
        "source": "https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits",
        "doi": "10.24432/C50P49",
        "creators": "E. Alpaydin, C. Kaynak (1998)",
        "license": "CC BY 4.0 (https://creativecommons.org/licenses/by/4.0/)",
        "preprocessing": "pixel counts 0..16 divided by 16 (float32 in [0, 1]); images flattened row-major to 64 features",
        "split": f"stratified train_test_split(test_size={TEST_SIZE}, random_state={SEED}, shuffle=True) of all 1797 samples",
        "generator": f"scripts/make_digits.py (numpy {np.__version__}, scikit-learn {sklearn.__version__})",
    }
    for part, idx in [("train", train_idx), ("test", test_idx)]:
        path = os.path.join(ROOT, "data", f"digits_{part}.safetensors")
        tensors = {"images": np.ascontiguousarray(images[idx]), "labels": np.ascontiguousarray(labels[idx])}
        meta = dict(common, part=part, samples=str(len(idx)))
        safetensors_io.save(path, tensors, meta)
        counts = np.bincount(labels[idx], minlength=10)
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        print(f"{os.path.relpath(path, ROOT)}: {len(idx)} samples, per class {counts.tolist()}, {os.path.getsize(path)} bytes, sha256 {sha}")


if __name__ == "__main__":
    main()
