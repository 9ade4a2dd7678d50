#!/usr/bin/env python3
"""Writes tests/fixtures/upstream/NAME.txt: every key of an upstream model's state_dict with its
dtype and shape, in the state_dict's order, for the models in models/ that load upstream
checkpoints unchanged. tests/upstream.rs compares each .mgn model's checkpoint names (its
parameters, buffers and aliases) with the file, so the test needs no PyTorch.

    python3 scripts/upstream_keys.py        # needs torch, torchvision and transformers
"""

import os

import torch
import torchvision
import transformers

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "upstream")
DTYPES = {torch.float32: "f32", torch.int64: "i64"}


def dump(name, state_dict, source):
    path = os.path.join(OUT, f"{name}.txt")
    with open(path, "w") as f:
        f.write(f"# {source}\n")
        f.write("# name dtype shape, in state_dict order (scripts/upstream_keys.py writes this file)\n")
        for key, t in state_dict.items():
            f.write(f"{key} {DTYPES[t.dtype]} {list(t.shape)}\n")
    print(f"{path}: {len(state_dict)} keys")


def main():
    os.makedirs(OUT, exist_ok=True)
    tv = f"torchvision {torchvision.__version__}"
    dump("vit_b_16", torchvision.models.vit_b_16().state_dict(), f"{tv} models.vit_b_16().state_dict()")
    dump("mobilenet_v3_small", torchvision.models.mobilenet_v3_small().state_dict(),
         f"{tv} models.mobilenet_v3_small().state_dict()")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    dump("gpt2", gpt2.state_dict(), f"transformers {transformers.__version__} GPT2LMHeadModel(GPT2Config()).state_dict()")


if __name__ == "__main__":
    main()
