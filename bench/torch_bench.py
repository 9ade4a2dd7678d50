#!/usr/bin/env python3
"""Times PyTorch on the workloads `mgnc bench` times, for bench/side_by_side.sh.

    python3 bench/torch_bench.py MODEL [MODEL ...] [--set k=v ...] [--compile MODEL|all ...]
                                 [--minimal k=v ... | --no-minimal] [--warmup 5] [--samples 20]
                                 [--device cuda] [--seed 0] [--out FILE]

MODEL is a file name in models/ without `.mgn` (the names of bench/reference.py, whose builders
this script imports, so the module trees, shapes and losses are the ones validate.sh checks).
`--set` takes the .mgn model's own argument names (one MODEL only), like `mgnc bench --set`.

What is measured, per model, each as `--warmup` untimed calls and then `--samples` calls, each
call timed with the wall clock between two `torch.cuda.synchronize()` (median and interquartile
range, linear interpolation like NumPy's and mgnc's):

  forward           eval mode, under torch.no_grad(): the outputs of the .mgn model's
                    inference plan (no loss; see INFER below)
  forward_minimal   the same at the minimal shape `mgnc bench` uses: every argument named B,
                    batch, T or frames set to 1 (`--minimal`/`--no-minimal` override it;
                    side_by_side.sh passes what mgnc reported)
  forward_backward  train mode: forward, the .mgn model's loss, backward (gradients set to None
                    before each call, so every call computes them fresh, as mgnc's plan does)
  train_step        the same plus Adam (lr 1e-3, betas 0.9/0.999, eps 1e-8: mgnc's default
                    optimizer), torch's default implementation for CUDA tensors

With `--compile MODEL` (or `all`) the first three are measured again through
`torch.compile(..., dynamic=False)`, and the train step as the compiled forward + backward followed
by the eager optimizer step; the compile time of each is the wall time of its first call (which
includes one run). torch.compile takes minutes per model on the H200, so it is opt-in per model.

Arithmetic is strict f32 by default: TF32 off for matmuls and cuDNN, "highest" float32 matmul
precision. `--precision tf32` allows TF32; `--precision bf16|f16` runs every forward under
`torch.autocast` to that type (f32 weights, as mgnc's mixed plans keep), f16 training through a
GradScaler — the comparison for `mgnc bench --precision mixed|mixed-bf16`.
Dropout modules keep the rate the config gives them (in train mode they drop, as mgnc's training
plan does; reference.py turns them off only because dropout cannot be matched numerically).
Memory: torch.cuda's peak allocated and reserved bytes per measurement (the caching allocator's
view, not comparable byte for byte with mgnc's planned arena).

Every model and every measurement runs under its own try: an error is recorded in the JSON
(`error`) and the run goes on. Prints one JSON object (and writes it to `--out` when given).
"""

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
import traceback

import torch
import torch._dynamo  # reset between compiled models (imported here: an import inside a function
                      # would make `torch` a local name of that function)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (the builders: one definition of every workload)

# The arguments `mgnc bench` sets to 1 for its minimal shape (bench.rs: BATCH_ARGS, SEQUENCE_ARGS).
MINIMAL_ARGS = ("B", "batch", "T", "frames")

ADAM = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# The .mgn inference plans compute outputs only, no loss. Where the model's output is one call,
# the forward here is that call; elsewhere (SmolVLA, MiniLM: their outputs need the builder's
# own forward) the builder's forward runs and its loss — an MSE over a few thousand values — is
# computed too and ignored.

INFER = {
    "smollm2_135m": lambda m, x: m(input_ids=x["input_ids"], use_cache=False).logits,
    "whisper_tiny_encoder": lambda m, x: m(x["input_features"]).last_hidden_state,
    "resnet50": lambda m, x: m(x["images"]),
    "sd_unet_tiny": lambda m, x: m(x["sample"], x["timestep"], x["encoder_hidden_states"]),
    "vit_b_16": lambda m, x: m(x["images"]),
    "gpt2": lambda m, x: m(input_ids=x["input_ids"], use_cache=False).logits,
    "mobilenet_v3_small": lambda m, x: m(x["images"]),
}


def strict_f32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_default_dtype(torch.float32)


def set_precision(precision):
    """`--precision`: f32 (strict), tf32 (TF32 matmuls and convolutions), or bf16/f16 (f32
    weights under autocast, f16 training through GradScaler). Returns the autocast context to
    run forwards in."""
    strict_f32()
    if precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
    if precision in ("bf16", "f16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return lambda device: torch.autocast(device.type, dtype=dtype)
    return lambda device: contextlib.nullcontext()


def quantile(sorted_xs, q):
    pos = q * (len(sorted_xs) - 1)
    lo, hi = int(pos // 1), int(-(-pos // 1))
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summary(ms):
    xs = sorted(ms)
    return {"median_ms": quantile(xs, 0.5), "p25_ms": quantile(xs, 0.25), "p75_ms": quantile(xs, 0.75),
            "min_ms": xs[0], "max_ms": xs[-1], "samples": len(xs), "raw_ms": ms}


class Timer:
    def __init__(self, device, warmup, samples):
        self.cuda = device.type == "cuda"
        self.warmup, self.samples = warmup, samples

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def once(self, fn):
        """Wall seconds of one call, synchronized on both sides."""
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def measure(self, fn):
        """--warmup untimed calls, then --samples timed ones; the summary plus peak memory."""
        for _ in range(self.warmup):
            fn()
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        ms = [self.once(fn) * 1e3 for _ in range(self.samples)]
        out = summary(ms)
        if self.cuda:
            out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        return out


def minimal_config(name, cfg, user_settings, given):
    """The minimal shape: (settings for reference.parse_settings, {name: value}), from `given`
    (k=v strings: side_by_side.sh passes what mgnc reported) or else by mgnc bench's rule. None
    when there is none (no such argument, already at 1, or `--no-minimal`)."""
    if given is not None:
        pairs = dict(s.split("=", 1) for s in given)
        if not pairs:
            return None
    else:
        pairs = {k: "1" for k in MINIMAL_ARGS if k in reference.DEFAULTS[name]}
        if not pairs or all(cfg.get(k) == 1 for k in pairs):
            return None
    # parse_settings applies them in order: the minimal values win over the user's.
    return list(user_settings) + [f"{k}={v}" for k, v in pairs.items()], pairs


def build(name, settings, device, seed):
    """The model (f32, on `device`), its inputs, its loss forward and its inference forward."""
    cfg = reference.parse_settings(name, settings)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    args = argparse.Namespace(pretrained=False)
    model, inputs, forward, _extra = reference.BUILDERS[name](cfg, gen, device, args)
    model = model.float()
    # The .mgn models keep no KV cache: neither may transformers (it builds one per call by default).
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False
    infer = INFER.get(name, lambda m, x: forward(m, x)[0])
    return cfg, model, inputs, forward, infer


def error_record(e):
    tb = traceback.format_exc().strip().splitlines()
    return {"error": f"{type(e).__name__}: {e}", "traceback": tb[-6:]}


UNFINISHED = "did not finish: the process was stopped (STEP_TIMEOUT?)"


def guarded(results, key, fn, save=lambda: None):
    """results[key] = fn(), or the error; a CUDA out-of-memory frees the cache before going on.
    save() runs before (with the key marked unfinished) and after, so a run stopped by a time
    limit (torch.compile of a large model can take minutes) keeps every cell it finished."""
    results[key] = {"error": UNFINISHED}
    save()
    try:
        results[key] = fn()
    except (Exception, SystemExit) as e:  # reference.py exits on bad settings
        results[key] = error_record(e)
        log(f"  {key}: {results[key]['error']}")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    save()


def bench_model(name, a, device, compile_it, save=lambda res: None):
    """Every measurement of one model; save(res) after each, with what is finished so far."""
    res = {"model": name, "measurements": {}, "compiled": {}, "compile_s": {}}

    def guard(results, key, fn):
        guarded(results, key, fn, lambda: save(res))
    timer = Timer(device, a.warmup, a.samples)
    meas, comp = res["measurements"], res["compiled"]
    cfg, model, inputs, forward, infer = build(name, a.settings, device, a.seed)
    res["config"] = cfg
    res["param_count"] = reference.count_params(model)
    res["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    res["input_shapes"] = {k: list(v.shape) for k, v in inputs.items()}

    autocast = a.autocast
    # f16 autocast trains through a GradScaler (as mgnc scales its f16 loss); a disabled
    # scaler is the identity.
    scaler = torch.amp.GradScaler(device.type, enabled=a.precision == "f16")

    def fwd_bwd_call(m, x, fwd=forward):
        def call():
            m.zero_grad(set_to_none=True)
            with autocast(device):
                _, loss = fwd(m, x)
            scaler.scale(loss).backward()
        return call

    def train_call(m, x, opt, fwd=forward):
        def call():
            opt.zero_grad(set_to_none=True)
            with autocast(device):
                _, loss = fwd(m, x)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return call

    # Eager.
    model.eval()
    log(f"{name}: forward (eager)")
    guard(meas, "forward", lambda: timer.measure(lambda: infer_once(infer, model, inputs, autocast(device))))

    mini = minimal_config(name, cfg, a.settings, a.minimal)
    mini_parts = None
    if mini is None:
        meas["forward_minimal"] = None
        res["minimal_settings"] = None
    else:
        settings, pairs = mini
        res["minimal_settings"] = pairs

        def minimal():
            nonlocal mini_parts
            if name == "minilm_l6":
                # reference.py cannot draw its inputs at T=1 (a random split point in 1..T-1); the
                # weights do not depend on B or T, so the full model runs on a slice of its inputs.
                B, T = int(pairs.get("B", cfg["B"])), int(pairs.get("T", cfg["T"]))
                m_model, m_infer = model, infer
                m_inputs = {k: v[:B] if k == "target" else v[:B, :T].contiguous() for k, v in inputs.items()}
            else:
                _, m_model, m_inputs, _, m_infer = build(name, settings, device, a.seed)
            m_model.eval()
            if compile_it:  # kept for the compiled measurement; else freed with this frame
                mini_parts = (m_model, m_inputs, m_infer)
            return timer.measure(lambda: infer_once(m_infer, m_model, m_inputs, autocast(device)))
        log(f"{name}: forward at {pairs} (eager)")
        guard(meas, "forward_minimal", minimal)

    model.train()
    log(f"{name}: forward + loss + backward (eager)")
    guard(meas, "forward_backward", lambda: timer.measure(fwd_bwd_call(model, inputs)))
    log(f"{name}: training step (eager)")

    def train_eager():
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
        try:
            return timer.measure(train_call(model, inputs, opt))
        finally:
            del opt
    # The training step changes the parameters; it runs after the measurements that read them.
    guard(meas, "train_step", train_eager)

    if compile_it:
        torch._dynamo.reset()
        model.eval()

        def compiled_forward():
            cf = torch.compile(infer, dynamic=False)
            res["compile_s"]["forward"] = timer.once(lambda: infer_once(cf, model, inputs, autocast(device)))
            return timer.measure(lambda: infer_once(cf, model, inputs, autocast(device)))
        log(f"{name}: forward (torch.compile)")
        guard(comp, "forward", compiled_forward)

        if mini_parts is not None:
            m_model, m_inputs, m_infer = mini_parts

            def compiled_minimal():
                cf = torch.compile(m_infer, dynamic=False)
                res["compile_s"]["forward_minimal"] = timer.once(
                    lambda: infer_once(cf, m_model, m_inputs, autocast(device)))
                return timer.measure(lambda: infer_once(cf, m_model, m_inputs, autocast(device)))
            log(f"{name}: forward minimal (torch.compile)")
            guard(comp, "forward_minimal", compiled_minimal)
        else:
            comp["forward_minimal"] = None

        model.train()
        cfwd = torch.compile(forward, dynamic=False)

        def compiled_fwd_bwd():
            call = fwd_bwd_call(model, inputs, fwd=cfwd)
            res["compile_s"]["forward_backward"] = timer.once(call)
            return timer.measure(call)
        log(f"{name}: forward + loss + backward (torch.compile)")
        guard(comp, "forward_backward", compiled_fwd_bwd)

        def compiled_train():
            opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
            try:
                return timer.measure(train_call(model, inputs, opt, fwd=cfwd))
            finally:
                del opt
        log(f"{name}: training step (torch.compile forward + backward, eager Adam)")
        guard(comp, "train_step", compiled_train)
        done = [v for v in res["compile_s"].values() if isinstance(v, float)]
        res["compile_s"]["total"] = sum(done) if done else None
    else:
        res["compiled"] = None
        res["compile_s"] = None

    del model, inputs, mini_parts
    return res


def infer_once(f, m, x, autocast=None):
    """One inference forward without autograd (no_grad: what torch.compile handles best, and
    what eager code usually runs under), under `autocast` when given; what it returns is
    dropped."""
    with torch.no_grad(), (autocast or contextlib.nullcontext()):
        f(m, x)


def environment(device):
    env = {"torch": torch.__version__, "python": platform.python_version(), "device_type": device.type,
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
           "float32_matmul_precision": torch.get_float32_matmul_precision(),
           "cudnn_benchmark": torch.backends.cudnn.benchmark}
    if device.type == "cuda":
        env["device"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    else:
        env["device"] = platform.processor() or platform.machine()
    for lib in ("transformers", "torchvision", "diffusers"):
        try:
            env[lib] = __import__(lib).__version__
        except Exception:
            pass
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", metavar="MODEL", help=f"one or more of: {', '.join(reference.MODELS)}")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
                    help="a .mgn model argument (repeatable; one MODEL only)")
    ap.add_argument("--compile", action="append", default=[], metavar="MODEL",
                    help="also measure MODEL through torch.compile (repeatable; `all` for every model)")
    ap.add_argument("--minimal", action="append", default=None, metavar="NAME=VALUE",
                    help="the minimal shape's settings (default: B, batch, T, frames set to 1, as mgnc bench)")
    ap.add_argument("--no-minimal", action="store_true", help="skip the minimal-shape forward")
    ap.add_argument("--precision", choices=["f32", "tf32", "bf16", "f16"], default="f32",
                    help="strict f32 (default), TF32, or autocast to bf16/f16 (f16 training with GradScaler)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    unknown = [m for m in a.models + [c for c in a.compile if c != "all"] if m not in reference.MODELS]
    if unknown:
        sys.exit(f"error: unknown model {', '.join(unknown)} (known: {', '.join(reference.MODELS)})")
    if a.settings and len(a.models) != 1:
        sys.exit("error: --set applies to one MODEL; run once per model")
    if a.no_minimal:
        a.minimal = []
    if a.samples < 1 or a.warmup < 0:
        sys.exit("error: --samples must be at least 1 and --warmup at least 0")

    a.autocast = set_precision(a.precision)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    arithmetic = {"f32": "strict f32 (no TF32)", "tf32": "TF32 matmuls and convolutions",
                  "bf16": "f32 weights, bf16 autocast", "f16": "f32 weights, f16 autocast, GradScaler"}
    out = {"tool": "torch_bench", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "clock": "wall",
           "timing": "wall clock between torch.cuda.synchronize() before and after each call",
           "warmup": a.warmup, "samples": a.samples, "seed": a.seed, "arithmetic": arithmetic[a.precision],
           "precision": a.precision,
           "environment": environment(device), "results": {}}
    if device.type != "cuda":
        log("warning: not on CUDA; these timings are not the GPU comparison")
    def save(name, res):
        out["results"][name] = res
        if a.out:
            write_atomically(a.out, json.dumps(out, indent=1, default=str) + "\n")

    for name in a.models:
        log(f"== {name}")
        try:
            out["results"][name] = bench_model(name, a, device, "all" in a.compile or name in a.compile,
                                               lambda res, name=name: save(name, res))
        except (Exception, SystemExit) as e:
            out["results"][name] = {"model": name, **error_record(e)}
            log(f"{name}: {out['results'][name]['error']}")
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    text = json.dumps(out, indent=1, default=str)
    if a.out:
        write_atomically(a.out, text + "\n")
    print(text)


def write_atomically(path, text):
    """A reader (or a kill mid-write) sees the previous whole file or the new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
