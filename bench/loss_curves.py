"""Loss curves of training runs logged by `mgnc train --loss-log`, plotted together, and how far
each curve is from the first (the f32 run).

    python3 bench/loss_curves.py --out curves.png NAME=FILE.csv [NAME=FILE.csv ...]

Each curve is smoothed with a moving average over `--window` steps (the raw losses of one batch
are noise); the table gives, for every curve after the first, the largest relative difference of
its smoothed curve from the first one's after the first `--skip` steps, and the mean loss of the
last `--window` steps of each.
"""

import argparse
import csv

import numpy as np


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    loss = np.array([float(r["loss"]) for r in rows])
    applied = np.array([r["applied"] == "1" for r in rows])
    scale = np.array([float(r["loss_scale"]) for r in rows])
    return loss, applied, scale


def smooth(x, w):
    return np.convolve(x, np.ones(w) / w, mode="valid")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("curves", nargs="+", metavar="NAME=FILE")
    ap.add_argument("--out", required=True)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--skip", type=int, default=200)
    ap.add_argument("--title", default="Loss curves: f32 and mixed precision")
    a = ap.parse_args()
    runs = []
    for c in a.curves:
        name, path = c.split("=", 1)
        runs.append((name, *read(path)))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    base = smooth(runs[0][1], a.window)
    print(f"| run | steps | skipped | last {a.window} steps' mean loss | max rel. diff. from {runs[0][0]} (smoothed, after step {a.skip}) |")
    print("|---|---|---|---|---|")
    for name, loss, applied, scale in runs:
        s = smooth(loss, a.window)
        x = np.arange(len(s)) + a.window
        ax.plot(x, s, label=f"{name}", linewidth=1.2)
        n = min(len(s), len(base))
        diff = np.abs(s[a.skip : n] - base[a.skip : n]) / base[a.skip : n]
        print(
            f"| {name} | {len(loss)} | {int((~applied).sum())} | {loss[-a.window:].mean():.4f} "
            f"| {100 * diff.max():.2f}% |"
        )
    ax.set_xlabel("training step")
    ax.set_ylabel(f"loss ({a.window}-step moving average)")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
