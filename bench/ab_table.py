"""The table of an A/B run (bench/ab.sh): for each workload and cell, each round's median of
A and of B, and B's median over rounds against A's. Standard library only.

Usage: python3 bench/ab_table.py DIR   (DIR holds NAME.SIDE.ROUND.json from `mgnc bench --json`)
"""

import json
import statistics
import sys
from pathlib import Path

CELLS = [
    ("forward", "forward"),
    ("forward_minimal", "minimal shape"),
    ("forward_backward", "fwd + loss + bwd"),
    ("train_step", "training step"),
]


def runs(folder):
    """{workload: {side: [json of round 1, round 2, …]}} from the file names."""
    out = {}
    for f in sorted(Path(folder).glob("*.json")):
        parts = f.name.rsplit(".", 3)
        if len(parts) != 4 or parts[1] not in ("A", "B"):
            continue
        name, side, rnd = parts[0], parts[1], int(parts[2])
        out.setdefault(name, {}).setdefault(side, []).append((rnd, json.loads(f.read_text())))
    return {n: {s: [j for _, j in sorted(r, key=lambda x: x[0])] for s, r in sides.items()}
            for n, sides in out.items()}


def median_of(run, cell):
    m = run.get("measurements", {}).get(cell)
    return m["median_ms"] if m else None


def table(folder):
    lines = [
        "| workload | cell | A per round (ms) | B per round (ms) | B / A |",
        "|---|---|---|---|---|",
    ]
    for name, sides in sorted(runs(folder).items()):
        a, b = sides.get("A", []), sides.get("B", [])
        device = (a or b)[0].get("device", "?") if (a or b) else "?"
        first = True
        for cell, label in CELLS:
            am = [m for m in (median_of(r, cell) for r in a) if m is not None]
            bm = [m for m in (median_of(r, cell) for r in b) if m is not None]
            if not am or not bm:
                continue
            ratio = statistics.median(bm) / statistics.median(am)
            fmt = lambda ms: " / ".join(f"{m:.3f}" for m in ms)
            who = f"{name} ({device})" if first else ""
            lines.append(f"| {who} | {label} | {fmt(am)} | {fmt(bm)} | {ratio:.3f} |")
            first = False
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(table(sys.argv[1]))
