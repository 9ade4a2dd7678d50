#!/usr/bin/env python3
"""Formats a bench/side_by_side.sh run as Markdown: mgnc (GPU) next to PyTorch (eager and
torch.compile), with ratios, memory, and the Meganeura paper's RTX 5070 ratios for reference.

    python3 bench/table.py DIR [--out FILE]

DIR holds env.json (written by side_by_side.sh: date, workloads, device, driver, versions) and per
workload NAME.mgnc.json (`mgnc bench --json`) and NAME.torch.json (bench/torch_bench.py), either
of which may be missing (the side that failed or was skipped; its log is NAME.*.log). Standard
library only. Prints the Markdown and writes it to --out when given.
"""

import argparse
import json
import os
import sys

# The Meganeura paper (shared/seeds/000_*.txt), Table 6, strict f32, NVIDIA GeForce RTX 5070:
# Meganeura (Vulkan) / PyTorch CUDA *compiled* median ratios, and both sides' compile seconds.
# Its workloads are its own shapes (close to ours, not necessarily identical): a point of
# reference, not the same experiment. MiniLM is not in the paper.
PAPER_RTX5070 = {
    "smollm2_135m": {"forward": 1.93, "forward_minimal": 0.90, "forward_backward": 2.87, "compile": (1.52, 50.2)},
    "smolvla_expert": {"forward": 1.84, "forward_minimal": 1.21, "forward_backward": 2.27, "compile": (1.20, 23.7)},
    "sd_unet_tiny": {"forward": 0.82, "forward_minimal": 0.83, "forward_backward": 1.78, "compile": (0.65, 28.8)},
    "resnet50": {"forward": 0.90, "forward_minimal": 0.95, "forward_backward": 2.24, "compile": (0.99, 13.1)},
    "whisper_tiny_encoder": {"forward": 2.65, "forward_minimal": 2.64, "forward_backward": 2.78, "compile": (0.74, 7.3)},
}

ROWS = [
    ("forward", "full forward"),
    ("forward_minimal", "minimal shape"),
    ("forward_backward", "fwd + loss + bwd"),
    ("train_step", "training step"),
]


def load(path):
    try:
        with open(path) as f:
            return json.load(f), None
    except FileNotFoundError:
        return None, "not run"
    except (OSError, ValueError) as e:
        return None, f"unreadable: {e}"


def log_tail(path, n=1):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
        return " / ".join(lines[-n:]) if lines else ""
    except OSError:
        return ""


def ms(x):
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def timing(t):
    """'median (p25–p75)' in ms, or the error, or a dash."""
    if not isinstance(t, dict):
        return "—"
    if "error" in t:
        return "error: " + t["error"].replace("|", "/")[:80]
    return f"{ms(t['median_ms'])} ({ms(t['p25_ms'])}–{ms(t['p75_ms'])})"


def median(t):
    return t.get("median_ms") if isinstance(t, dict) else None


def ratio(a, b):
    if a is None or b is None or b <= 0:
        return "—"
    r = a / b
    return f"**{r:.2f}**" if r < 1 else f"{r:.2f}"


def mib(n):
    return "—" if n is None else f"{n / 2**20:,.1f}"


def describe_config(m, t):
    """The shape in words, from whichever side has it."""
    cfg = (m or {}).get("config") or (t or {}).get("config") or {}
    keys = [k for k in ("B", "batch", "T", "frames", "size", "chunk") if k in cfg]
    return ", ".join(f"{k}={cfg[k]}" for k in keys)


def mgnc_prepare_s(m):
    """Ours, in seconds: compiling the inference and training plans (medians), the minimal plan
    (once), and moving each session onto the GPU (once each)."""
    ms_ = m["measurements"]
    total = ms_["compile"]["median_ms"]
    if isinstance(ms_.get("compile_train"), dict):
        total += ms_["compile_train"]["median_ms"]
    total += m.get("compile_minimal_ms") or 0.0
    setup = m.get("setup_ms") or {}
    total += sum(v for v in setup.values() if isinstance(v, (int, float)))
    return total / 1e3


def workload_rows(name, m, m_err, t, t_err):
    out = []
    paper = PAPER_RTX5070.get(name, {})
    meas = (m or {}).get("measurements", {})
    eager = (t or {}).get("measurements") or {}
    comp = (t or {}).get("compiled") or {}
    shape = describe_config(m, t)
    label = f"{name}" + (f" ({shape})" if shape else "")
    for key, what in ROWS:
        if key == "forward_minimal":
            settings = (meas.get(key) or {}).get("settings") if isinstance(meas.get(key), dict) else None
            if settings:
                what += " (" + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")"
            elif m is not None and meas.get(key) is None:
                what += " (none: see notes)"
        ours = meas.get(key) if m is not None else None
        ours_cell = timing(ours) if m is not None else f"mgnc {m_err}"
        eager_cell = timing(eager.get(key)) if t is not None else f"torch {t_err}"
        comp_cell = timing(comp.get(key)) if comp else "—"
        p = paper.get(key)
        out.append([label, what, ours_cell, eager_cell, comp_cell, ratio(median(ours), median(eager.get(key))),
                    ratio(median(ours), median(comp.get(key))) if comp else "—", f"{p:.2f}" if p else "—"])
        label = ""
    # Compile / prepare, in seconds.
    ours_s = mgnc_prepare_s(m) if m is not None else None
    comp_s = ((t or {}).get("compile_s") or {}).get("total")
    p = paper.get("compile")
    out.append(["", "compile (s)", f"{ours_s:.2f}" if ours_s is not None else "—", "—",
                f"{comp_s:.1f}" if comp_s is not None else "—", "—",
                ratio(ours_s, comp_s), f"{p[0] / p[1]:.3f} ({p[0]} / {p[1]} s)" if p else "—"])
    return out


def memory_row(name, m, t):
    mem = (m or {}).get("memory") or {}
    inf, tr = mem.get("inference") or {}, mem.get("training") or {}
    eager = (t or {}).get("measurements") or {}

    def peak(key, field):
        v = eager.get(key)
        return v.get(field) if isinstance(v, dict) else None

    def arena(plan):
        # What the GPU session allocated after its rewrites, where the run was on the GPU;
        # else the plan as compiled.
        gpu = plan.get("gpu")
        return gpu.get("values_bytes") if isinstance(gpu, dict) else plan.get("arena_values_bytes")
    return [name, mib(inf.get("param_bytes")), mib(arena(inf)), mib(inf.get("logical_bytes")),
            mib(inf.get("peak_live_bytes")), mib(arena(tr)), mib(tr.get("logical_bytes")),
            mib(tr.get("peak_live_bytes")), mib(tr.get("optimizer_state_bytes")),
            mib(peak("forward", "peak_allocated_bytes")), mib(peak("forward_backward", "peak_allocated_bytes")),
            mib(peak("train_step", "peak_reserved_bytes"))]


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def roofline_rows(name, m, top=6):
    """Per profiled plan of `m`, its largest op families with the rates they reach and how far
    above their floor they run (`mgnc bench --profile --peak-tflops --peak-tbps`)."""
    rows = []
    for plan, ops in ((m or {}).get("profile") or {}).items():
        total = sum(o.get("ms") or 0 for o in ops)
        floor = sum(o.get("floor_ms") or 0 for o in ops)
        if not ops or not floor:
            continue
        for i, o in enumerate(ops[:top]):
            s = max(o["ms"], 1e-9) / 1e3
            rows.append([
                name if not rows else "", plan if i == 0 else "", o["op"], o["dispatches"], f"{o['ms']:.3f}",
                f"{100 * o['ms'] / max(total, 1e-9):.0f}%", f"{o.get('flops', 0) / s / 1e12:.2f}",
                f"{o.get('bytes', 0) / s / 1e9:.0f}", f"{o['floor_ms']:.3f}",
                f"{100 * o['floor_ms'] / max(o['ms'], 1e-9):.0f}%"])
        rows.append(["", "", f"whole plan ({len(ops)} families)", sum(o["dispatches"] for o in ops),
                     f"{total:.3f}", "100%", "", "", f"{floor:.3f}", f"{100 * floor / max(total, 1e-9):.0f}%"])
    return rows


def render(d):
    env, err = load(os.path.join(d, "env.json"))
    if env is None:
        sys.exit(f"error: {os.path.join(d, 'env.json')}: {err}")
    names = env.get("workloads") or []
    precision = env.get("precision") or "f32"
    torch_precision = env.get("torch_precision") or "f32"
    mode = "strict f32" if (precision, torch_precision) == ("f32", "f32") else \
        f"mgnc {precision}, PyTorch {torch_precision}"
    parts = [f"## Side by side: mgnc (`--backend vulkan`) and PyTorch, {mode} ({env.get('date', '?')})", ""]
    facts = [
        ("device (mgnc)", env.get("mgnc_device")),
        ("device (torch)", env.get("torch_device")),
        ("driver", env.get("driver")),
        ("mgnc", env.get("mgnc_version")),
        ("source", env.get("revision")),
        ("torch", env.get("torch_version")),
        ("torch.compile for", env.get("compile") or "none"),
        ("samples", env.get("samples")),
    ]
    parts += [f"- {k}: {v}" for k, v in facts if v not in (None, "")]
    parts.append("")
    rows, mem_rows, notes = [], [], []
    for name in names:
        m, m_err = load(os.path.join(d, f"{name}.mgnc.json"))
        t, t_err = load(os.path.join(d, f"{name}.torch.json"))
        if m is None and m_err == "not run" and os.path.exists(os.path.join(d, f"{name}.mgnc.log")):
            m_err = "failed: " + log_tail(os.path.join(d, f"{name}.mgnc.log")).replace("|", "/")[:100]
        if t is not None:
            t = (t.get("results") or {}).get(name)
            if t is None:
                t, t_err = None, "has no result"
            elif "error" in t and "measurements" not in t:
                t, t_err = None, "failed: " + t["error"].replace("|", "/")[:100]
        if env.get("torch") == "skipped":
            t_err = "skipped"
        rows += workload_rows(name, m, m_err, t, t_err)
        mem_rows.append(memory_row(name, m, t))
        for n in (m or {}).get("notes", []):
            if "sample" in n and "fewer than" in n or "debug build" in n:
                notes.append(f"{name}: {n}")
            elif "minimal" in n or "forward only" in n:
                notes.append(f"{name}: {n}")
    parts.append(markdown_table(
        ["workload", "measurement", "ours ms (p25–p75)", "PyTorch eager ms (p25–p75)", "PyTorch compile ms (p25–p75)",
         "ours / eager", "ours / compile", "paper RTX 5070 ours / compile"], rows))
    parts += ["", "Medians of the timed samples after the warm-ups; p25–p75 is the interquartile range. Both sides "
              "are wall clock around a synchronized call (mgnc: upload, one submission, wait; PyTorch: "
              "torch.cuda.synchronize() before and after). A ratio below 1 (bold) means mgnc is faster. "
              "The training step is ours (`Session::train_step`) against eager PyTorch with Adam; its compile "
              "column is the compiled forward + backward with the eager Adam step. Compile: ours is both plans' "
              "compile medians plus the minimal plan's compile and the GPU session setups (kernels, arena, "
              "upload); PyTorch's is the first-call time of each torch.compile'd function. The paper column is "
              "Table 6 of the Meganeura paper (RTX 5070, strict f32, against compiled PyTorch; its own shapes).", ""]
    parts.append("### Memory (MiB; the bases differ, so read side by side, not as one column)")
    parts.append("")
    parts.append(markdown_table(
        ["workload", "parameters", "inference: ours arena", "inference: logical", "inference: lower bound",
         "training: ours arena", "training: logical", "training: lower bound", "optimizer state",
         "PyTorch peak allocated, forward", "PyTorch peak allocated, fwd+bwd", "PyTorch peak reserved, train step"],
        mem_rows))
    parts += ["", "Ours, per plan and without the parameters (the GPU arena holds them besides): the arena the GPU "
              "session allocated for inputs and values, after the GPU's rewrites and lifetime reuse (physical; "
              "the plan as compiled where the run was on the CPU), the plan's values without reuse (logical), "
              "and the most of them alive at once (the lower bound for the plan as compiled). "
              "PyTorch: torch.cuda's caching-allocator peaks during the timed samples (every tensor alive in the "
              "process, parameters and, for the train step, Adam's state included)."]
    roof = []
    for name in names:
        roof += roofline_rows(name, load(os.path.join(d, f"{name}.mgnc.json"))[0])
    if roof:
        parts += ["", "### Roofline per op family (mgnc's profile)", ""]
        parts.append(markdown_table(
            ["workload", "plan", "op family", "dispatches", "GPU ms", "share", "TFLOP/s", "GB/s", "floor ms",
             "floor / GPU time"], roof))
        parts += ["", "Each dispatch timed alone in its own pass (so the plan's sum is above its wall time, where "
                  "a level's dispatches overlap). FLOPs count the multiply-adds of products, convolutions and "
                  "attention (the rest one per output element); bytes are each input read once and the output "
                  "written once. A dispatch's floor is max(FLOPs / f32 rate, bytes / copy rate) at the rates "
                  f"given ({env.get('peaks') or 'PEAK_TFLOPS, PEAK_TBPS'}); a family's is the sum of its "
                  "dispatches'. 100% would be a kernel at the card's limit."]
    if notes:
        parts += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(parts) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    text = render(a.dir)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
