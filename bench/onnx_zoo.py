#!/usr/bin/env python3
"""The ONNX zoo: real architectures exported with PyTorch, imported with `mgnc import`, and
checked against onnxruntime.

    onnx_zoo.py export DIR [NAME...]     export each model (random weights, seeded) to
                                         DIR/NAME.onnx, with DIR/NAME.inputs.safetensors (keyed
                                         by the graph's input names) and DIR/NAME.ort.safetensors
                                         (onnxruntime's outputs, keyed by output names)
    onnx_zoo.py validate DIR [NAME...]   import each with MGNC (default target/release/mgnc),
                                         run it on the CPU and on Vulkan, and print one table:
                                         import time, lines of .mgn, layers recovered, ops,
                                         rel. L2 against onnxruntime per backend

Needs torch, torchvision, transformers, onnx, onnxscript and onnxruntime (none of them in CI:
the files are far too big to commit; tests/fixtures/onnx holds the small ones CI checks).
Weights are random: the importer translates architecture and names, and a random draw
exercises every path as well as a trained one. The exporter differs per model on purpose, so
both of `torch.onnx.export`'s front ends (TorchScript, `dynamo=True`) are covered.
"""
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GEN_SEED = 0


def randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(GEN_SEED + 1))


def ids(vocab, *shape):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(GEN_SEED + 2))


@torch.no_grad()
def realistic(model):
    """Norm weights and biases drawn away from 1 and 0, and batch-norm statistics away from
    (0, 1), so that a mistake in either cannot hide."""
    from reference import perturb_constants
    perturb_constants(model, torch.Generator().manual_seed(GEN_SEED + 3))
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.running_mean.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(7))
            m.running_var.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(8))
    return model.eval()


class Logits(nn.Module):
    """An HF model's first output (logits or hidden states) as a plain tensor."""

    def __init__(self, inner, **fixed):
        super().__init__()
        self.inner, self.fixed = inner, fixed

    def forward(self, *args):
        out = self.inner(*args, **self.fixed)
        return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state if hasattr(
            out, "last_hidden_state") and not hasattr(out, "logits") else out.logits


def hf(cls, config):
    from reference import hf_build
    return hf_build(cls, config)


def tv(name):
    import torchvision.models as m
    return realistic(getattr(m, name)())


# Each entry: (builder returning (module, {input name: tensor}), exporter, dynamic axes or None)
def zoo():
    from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM, WhisperConfig)
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    def image(name, size=224):
        return lambda: (tv(name), {"image": randn(1, 3, size, size)})

    def minilm():
        c = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                       intermediate_size=1536, max_position_embeddings=512, hidden_act="gelu")
        m = realistic(Logits(hf(BertModel, c), return_dict=True))
        mask = torch.ones(2, 16, dtype=torch.int64)
        mask[1, 11:] = 0
        return m, {"input_ids": ids(30522, 2, 16), "attention_mask": mask}

    def gpt2():
        c = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024, use_cache=False)
        return realistic(Logits(hf(GPT2LMHeadModel, c), use_cache=False)), {"input_ids": ids(50257, 1, 32)}

    def smollm2():
        c = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                        num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                        max_position_embeddings=8192, tie_word_embeddings=True, use_cache=False)
        return realistic(Logits(hf(LlamaForCausalLM, c), use_cache=False)), {"input_ids": ids(49152, 1, 32)}

    def whisper():
        c = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                          num_mel_bins=80, max_source_positions=1500)
        return realistic(Logits(hf(WhisperEncoder, c), return_dict=True)), {"input_features": randn(1, 80, 3000)}

    def unet():
        from reference import UNet2DConditionModel

        class Wrap(nn.Module):
            def __init__(self):
                super().__init__()
                self.unet = UNet2DConditionModel(
                    sample_size=32, in_channels=4, out_channels=4, block_out_channels=(64, 128, 256),
                    layers_per_block=1, cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32)

            def forward(self, sample, timestep, encoder_hidden_states):
                return self.unet(sample, timestep, encoder_hidden_states)

        return realistic(Wrap()), {"sample": randn(1, 4, 32, 32), "timestep": torch.tensor([500]),
                                   "encoder_hidden_states": randn(1, 8, 768)}

    dynamic = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    return {
        "resnet50": (image("resnet50"), "dynamo", None),
        "mobilenet_v3_small": (image("mobilenet_v3_small"), "torchscript", None),
        "efficientnet_b0": (image("efficientnet_b0"), "dynamo", None),
        "convnext_tiny": (image("convnext_tiny"), "dynamo", None),
        "vit_b_16": (image("vit_b_16"), "torchscript", None),
        "swin_t": (image("swin_t"), "dynamo", None),
        "minilm": (minilm, "torchscript", None),
        "minilm_dynamic": (minilm, "torchscript", dynamic),
        "gpt2": (gpt2, "dynamo", None),
        "whisper_tiny_encoder": (whisper, "torchscript", None),
        "smollm2_135m": (smollm2, "dynamo", None),
        "sd_unet_tiny": (unet, "dynamo", None),
    }


def export(out_dir, names):
    from safetensors.numpy import save_file
    import onnxruntime as ort
    os.makedirs(out_dir, exist_ok=True)
    entries = zoo()
    for name in names or entries:
        build, exporter, dynamic = entries[name]
        torch.manual_seed(GEN_SEED)
        model, inputs = build()
        path = os.path.join(out_dir, f"{name}.onnx")
        start = time.time()
        args = tuple(inputs.values())
        if exporter == "dynamo":
            torch.onnx.export(model, args, path, input_names=list(inputs), output_names=["output"],
                              dynamo=True, external_data=False)
        else:
            torch.onnx.export(model, args, path, input_names=list(inputs), output_names=["output"],
                              dynamic_axes=dynamic, opset_version=17, dynamo=False)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feed = {i.name: inputs[i.name].numpy() for i in sess.get_inputs()}
        outs = sess.run(None, feed)
        save_file(feed, os.path.join(out_dir, f"{name}.inputs.safetensors"))
        save_file({o.name: np.ascontiguousarray(v) for o, v in zip(sess.get_outputs(), outs)},
                  os.path.join(out_dir, f"{name}.ort.safetensors"))
        with torch.no_grad():
            ref = model(*args)
        err = rel_l2(outs[0], ref.numpy())
        print(f"{name}: {exporter}, {os.path.getsize(path) / 1e6:.1f} MB, {time.time() - start:.1f} s, "
              f"onnxruntime vs torch rel. L2 {err:.1e}", flush=True)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def dim_settings(onnx_path, inputs):
    """`--set NAME=SIZE` for each dynamic axis of the graph's inputs, at the size the stored
    inputs have (the importer makes named axes `dim` arguments with placeholder defaults)."""
    import onnx
    from onnx_compare import ident
    model = onnx.load(onnx_path, load_external_data=False)
    sets = {}
    for v in model.graph.input:
        if v.name not in inputs:
            continue
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if d.dim_param:
                sets[ident(d.dim_param)] = inputs[v.name].shape[i]
    return [a for k, n in sorted(sets.items()) for a in ("--set", f"{k}={n}")]


def ops_of(onnx_path):
    import onnx
    return len({n.op_type for n in onnx.load(onnx_path, load_external_data=False).graph.node})


def compare(mgnc, base, backend, sets, want):
    from safetensors.numpy import load_file
    from onnx_compare import ident
    out = f"{base}.{backend}.safetensors"
    r = subprocess.run([mgnc, "run", f"{base}.mgn", "--weights", f"{base}.safetensors", "--inputs",
                        f"{base}.inputs.safetensors", "--out", out, "--backend", backend, *sets],
                       capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return "refused: arena over the device's binding" if "storage binding" in last else \
            "failed: " + last[:70]
    got = load_file(out)
    errs = []
    for k, v in want.items():
        key = next((g for g in (f"output.{ident(k)}", ident(k), k) if g in got), None)
        if key is None:
            return f"no output `{k}` in {sorted(got)}"
        errs.append(rel_l2(got[key], v))
    return max(errs)


def validate(in_dir, names):
    from safetensors.numpy import load_file
    mgnc = os.environ.get("MGNC", "target/release/mgnc")
    rows = []
    names = names or [n for n in zoo() if os.path.exists(os.path.join(in_dir, f"{n}.onnx"))]
    for name in names:
        base = os.path.join(in_dir, name)
        start = time.time()
        p = subprocess.run([mgnc, "import", f"{base}.onnx", "-o", f"{base}.mgn", "--weights",
                            f"{base}.safetensors"], capture_output=True, text=True)
        took = time.time() - start
        if p.returncode != 0:
            rows.append((name, "import failed", p.stderr.strip().splitlines()[:3]))
            continue
        text = open(f"{base}.mgn").read()
        lines = text.count("\n")
        layers = sum(1 for line in text.splitlines() if line.startswith("layer "))
        sets = dim_settings(f"{base}.onnx", load_file(f"{base}.inputs.safetensors"))
        want = load_file(f"{base}.ort.safetensors")
        errs = {b: compare(mgnc, base, b, sets, want) for b in ("cpu", "vulkan")}
        rows.append((name, f"{took:.2f} s", lines, layers, ops_of(f"{base}.onnx"), errs))
        print(name, rows[-1][1:], flush=True)
    print("| model | import | lines of .mgn | layers | ONNX op types | rel. L2 CPU | rel. L2 Vulkan |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda e: f"{e:.1e}" if isinstance(e, float) else e
    for r in rows:
        if len(r) == 3:
            print(f"| {r[0]} | {r[1]}: {' '.join(r[2])[:80]} | | | | | |")
            continue
        name, took, lines, layers, ops, errs = r
        print(f"| {name} | {took} | {lines} | {layers} | {ops} | {fmt(errs['cpu'])} | {fmt(errs['vulkan'])} |")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("export", "validate"):
        sys.exit(__doc__)
    (export if sys.argv[1] == "export" else validate)(sys.argv[2], sys.argv[3:])
