#!/usr/bin/env python3
"""Two `mgnc bench --trace` files of one model, dispatch by dispatch: which kernels a switch made
faster or slower, and by how much (for example `MGN_COOP=1`, which moves convolutions onto the
cooperative matrices, against the default).

    mgnc bench models/resnet50.mgn --precision mixed --trace a.json
    MGN_COOP=1 mgnc bench models/resnet50.mgn --precision mixed --trace b.json
    bench/trace_diff.py a.json b.json --cat conv

Dispatches are matched by plan (the trace's thread), model line, result shape and kernel family,
and the how-many-th such dispatch it is: both traces must come from the same plans. Prints one
line per matched dispatch of the families whose name starts with `--cat` (all by default): GPU
time in A and B (µs) and B / A, then each plan's totals over those families.
"""
import argparse
import collections
import json


def dispatches(path, prefix):
    trace = json.load(open(path))
    events = trace["traceEvents"]
    plans = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    seen = collections.Counter()
    out = {}
    for e in events:
        if e.get("ph") != "X" or not e["cat"].startswith(prefix):
            continue
        key = (plans[e["tid"]], e["args"].get("source", ""), e["args"].get("shape", ""), e["cat"])
        seen[key] += 1
        out[key + (seen[key],)] = (e["dur"], e["args"].get("flops", 0), e["name"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--cat", default="", help="kernel families whose name starts with this")
    args = ap.parse_args()
    a, b = dispatches(args.a, args.cat), dispatches(args.b, args.cat)
    totals = collections.defaultdict(lambda: [0.0, 0.0])
    print("| plan | family | result | GFLOP | A µs | B µs | B / A | kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for key, (ta, flops, name) in a.items():
        if key not in b:
            continue
        tb = b[key][0]
        totals[key[0]][0] += ta
        totals[key[0]][1] += tb
        plan, _, shape, family, _ = key
        print(f"| {plan} | {family} | {shape} | {flops / 1e9:.3f} | {ta:.1f} | {tb:.1f} | "
              f"{tb / ta if ta else float('nan'):.2f} | {name[:60]} |")
    unmatched = len(set(a) ^ set(b))
    for plan, (ta, tb) in sorted(totals.items()):
        print(f"\n{plan}: A {ta:.0f} µs, B {tb:.0f} µs, B / A {tb / ta if ta else float('nan'):.3f}")
    if unmatched:
        print(f"\n{unmatched} dispatches in one trace only (not compared)")


if __name__ == "__main__":
    main()
