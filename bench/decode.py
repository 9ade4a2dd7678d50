"""SmolLM2-135M decoding with Hugging Face transformers on the GPU: the PyTorch side of
bench/decode.sh.

Builds LlamaForCausalLM from SmolLM2-135M's config with seeded random weights (strict f32),
saves them for mgn (--weights), then greedy-decodes a prompt of --prompt-len tokens and
--new tokens two ways, each timed per run with the device synchronised:
  eager    — a DynamicCache, model.forward per token (what `generate` does);
  compile  — a StaticCache and torch.compile(mode="reduce-overhead", fullgraph=True) of the
             one-token forward, HF's recipe for compiled generation.
Prints one line per path: prefill ms, per-token ms (median over the tokens of all repeats) and
the first generated ids (mgn's must agree); writes the prompt ids to --prompt-out. With
--batch N, also one line per precision for the compiled path decoding N sequences at once:
the median step and tokens/s.
"""

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from reference import DEFAULTS, strict_f32, save_safetensors  # noqa: E402


def build(seed, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    c = DEFAULTS["smollm2_135m"]
    config = LlamaConfig(
        vocab_size=c["vocab"], hidden_size=c["d"], intermediate_size=c["hidden"],
        num_hidden_layers=c["n_layers"], num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"], rms_norm_eps=c["eps"],
        rope_theta=c["rope_theta"], max_position_embeddings=8192, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, hidden_act="silu", bos_token_id=0, eos_token_id=0)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        rope["rope_theta"] = c["rope_theta"]
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().to(device).eval()
    with torch.no_grad():  # norms at 1 would hide a wrong norm: perturb them
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def sync():
    torch.cuda.synchronize()


@torch.no_grad()
def decode(model, prompt, new, cache, step):
    """Greedy decoding of `new` tokens after `prompt` (one sequence or a batch, one token a
    sequence a step): prefill seconds, each step's seconds, and the first sequence's ids."""
    P = prompt.shape[1]
    sync()
    t0 = time.perf_counter()
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True,
                cache_position=torch.arange(P, device=prompt.device))
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    prefill = time.perf_counter() - t0
    ids, times = [int(tok[0])], []
    for i in range(new - 1):
        pos = torch.tensor([P + i], device=prompt.device)
        sync()
        t = time.perf_counter()
        logits = step(tok, cache, pos)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        sync()
        times.append(time.perf_counter() - t)
        ids.append(int(tok[0]))
    return prefill, times, ids


def static_cache(model, max_len, device, batch=1, dtype=torch.float32):
    from transformers import StaticCache
    for kw in (dict(config=model.config, max_batch_size=batch, max_cache_len=max_len,
                    device=device, dtype=dtype),
               dict(config=model.config, max_cache_len=max_len)):
        try:
            return StaticCache(**kw)
        except TypeError:
            continue
    raise SystemExit("error: this transformers has no usable StaticCache")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--prompt-out", required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--cache", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--f16", action="store_true",
                    help="also time the model cast to float16 (the half-precision rows)")
    ap.add_argument("--batch", type=int, default=0,
                    help="also time torch.compile + static cache decoding this many sequences "
                         "at once (f32, and f16 with --f16): tokens/s over the batch")
    args = ap.parse_args()
    strict_f32()
    dev = torch.device("cuda")
    model = build(args.seed, dev)
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_safetensors(args.weights, sd)
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len), generator=gen).to(dev)
    with open(args.prompt_out, "w") as f:
        f.write(",".join(str(int(t)) for t in prompt[0]))

    from transformers import DynamicCache

    def eager_step(tok, cache, pos):
        return model(input_ids=tok, past_key_values=cache, use_cache=True,
                     cache_position=pos).logits

    compiled = torch.compile(eager_step, mode="reduce-overhead", fullgraph=True)
    paths = {"eager": (lambda: DynamicCache(), eager_step),
             "compile": (lambda: static_cache(model, args.cache, dev), compiled)}
    runs = [(name, model, make, step) for name, (make, step) in paths.items()]
    if args.f16:
        half = build(args.seed, dev).half()

        def half_step(tok, cache, pos):
            return half(input_ids=tok, past_key_values=cache, use_cache=True,
                        cache_position=pos).logits

        def half_cache():
            return static_cache(half, args.cache, dev, dtype=torch.float16)

        compiled_half = torch.compile(half_step, mode="reduce-overhead", fullgraph=True)
        runs += [("f16 eager", half, lambda: DynamicCache(), half_step),
                 ("f16 compile", half, half_cache, compiled_half)]
    for name, m, make_cache, step in runs:
        prefills, times, ids = [], [], None
        for r in range(args.repeat + 1):  # the first run warms up (and compiles)
            p, t, ids = decode(m, prompt, args.new, make_cache(), step)
            if r > 0:
                prefills.append(p)
                times.extend(t)
        print(f"torch {name}: prefill {statistics.median(prefills) * 1e3:.3f} ms, per token "
              f"{statistics.median(times) * 1e3:.3f} ms, ids {','.join(map(str, ids[:16]))}")
    if args.batch > 1:
        batch_rows(args, model, half if args.f16 else None, dev)


def batch_rows(args, model, half, dev):
    """torch.compile + static cache decoding args.batch sequences at once (random prompts):
    the median time of one step of the whole batch, and tokens/s = batch / that time."""
    n = args.batch
    gen = torch.Generator().manual_seed(args.seed + 2)
    prompt = torch.randint(0, model.config.vocab_size, (n, args.prompt_len), generator=gen).to(dev)
    runs = [("f32", model, torch.float32)] + ([("f16", half, torch.float16)] if half else [])
    for name, m, dtype in runs:
        def step(tok, cache, pos, m=m):
            return m(input_ids=tok, past_key_values=cache, use_cache=True,
                     cache_position=pos).logits

        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        times = []
        for r in range(args.repeat + 1):
            _, t, _ = decode(m, prompt, args.new, static_cache(
                m, args.cache, dev, batch=n, dtype=dtype), compiled)
            if r > 0:
                times.extend(t)
        ms = statistics.median(times) * 1e3
        print(f"torch batch {n} {name} compile: per step {ms:.3f} ms, {n / ms * 1e3:.0f} tokens/s")


if __name__ == "__main__":
    main()
