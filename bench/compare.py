#!/usr/bin/env python3
"""Applies the numerics gates of ARCHITECTURE.md to one run of a model against its reference.

    python3 bench/compare.py EXPECTED.safetensors ACTUAL.safetensors [--name NAME] [--json OUT.json]
                             [--worst N] [--meta META.json]

EXPECTED is what bench/reference.py wrote; ACTUAL is what `mgnc run … --grads` wrote. Both hold
`output.<name>`, `loss` and `grad.<param>`. The gates:

  forward    every output's relative L2 error ‖a − e‖ / ‖e‖ < 1%, and the loss's relative
             error |a − e| / |e| < 1%;
  backward   the total gradient norm's relative error < 5%; the relative error of the vector of
             per-parameter gradient norms ‖(‖a_p‖)_p − (‖e_p‖)_p‖ / ‖(‖e_p‖)_p‖ < 5%; and every
             parameter's gradient has cosine similarity ≥ 0.99 with the reference (norms alone
             cannot see a flipped sign).

A parameter whose reference gradient is zero up to f32 roundoff (‖e_p‖ ≤ 1e-6 · the total
reference norm) has no direction to compare: BERT's pooler, which the loss does not reach, and
BERT's attention key biases, whose gradient is zero analytically (a key bias adds the same q·b to
every score of a query row, which softmax ignores), so both frameworks return ~1e-13 noise. Such
a parameter passes the cosine gate when its actual gradient is negligible too (‖a_p‖ ≤ 1e-5 ·
the total reference norm) and fails it otherwise; the report counts them. A gradient the reference has and ACTUAL lacks fails;
one ACTUAL has beyond the reference is listed.

Prints a verdict table (PASS/FAIL per gate, the worst outputs and parameters) and exits 0 when
every gate passes, 1 when one fails, 2 when a file cannot be read. Needs numpy and safetensors.
"""

import argparse
import json
import math
import sys

import numpy as np

FORWARD_LIMIT = 0.01
LOSS_LIMIT = 0.01
GRAD_NORM_LIMIT = 0.05
GRAD_VECTOR_LIMIT = 0.05
COSINE_LIMIT = 0.99
ZERO_GRAD = 1e-6          # a reference gradient this small (relative to the total norm) is zero
ZERO_GRAD_ACTUAL = 1e-5   # … and then ours must be at most this


def load(path):
    from safetensors.numpy import load_file
    try:
        return {k: np.asarray(v, dtype=np.float64) for k, v in load_file(path).items()}
    except Exception as e:  # noqa: BLE001 — any unreadable file is a usage error here
        print(f"error: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)


def norm(x):
    return float(np.sqrt(np.sum(np.square(x, dtype=np.float64))))


def rel(a, e):
    d = norm(a - e)
    n = norm(e)
    if n == 0.0:
        return 0.0 if d == 0.0 else math.inf
    return d / n


def fmt(x):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.3e}"


def compare(expected, actual, worst=5):
    gates = []  # (gate, value, limit text, passed, detail)
    problems = []

    # Forward: outputs and loss.
    out_names = sorted(k for k in expected if k.startswith("output."))
    out_errors = []
    for name in out_names:
        if name not in actual:
            problems.append(f"{name}: missing from the actual results")
            out_errors.append((name, math.inf))
            continue
        e, a = expected[name], actual[name]
        if e.shape != a.shape:
            problems.append(f"{name}: shape {list(a.shape)}, expected {list(e.shape)}")
            out_errors.append((name, math.inf))
            continue
        if not np.all(np.isfinite(a)):
            problems.append(f"{name}: has NaN or infinite values")
            out_errors.append((name, math.inf))
            continue
        out_errors.append((name, rel(a, e)))
    for name, err in out_errors:
        gates.append((f"forward {name} rel L2", err, f"< {FORWARD_LIMIT:g}", err < FORWARD_LIMIT, None))

    if "loss" in expected:
        if "loss" not in actual:
            problems.append("loss: missing from the actual results")
            gates.append(("loss rel err", math.inf, f"< {LOSS_LIMIT:g}", False, None))
        else:
            e, a = float(expected["loss"].reshape(-1)[0]), float(actual["loss"].reshape(-1)[0])
            err = abs(a - e) / abs(e) if e != 0.0 else (0.0 if a == 0.0 else math.inf)
            gates.append(("loss rel err", err, f"< {LOSS_LIMIT:g}", err < LOSS_LIMIT and math.isfinite(a),
                          f"expected {e:.6g}, got {a:.6g}"))

    # Backward.
    grad_names = sorted(k for k in expected if k.startswith("grad."))
    extra = sorted(k for k in actual if k.startswith("grad.") and k not in expected)
    per_param = []  # (name, cos, rel norm err, ‖e‖, ‖a‖)
    if grad_names:
        total_e = math.sqrt(sum(norm(expected[k]) ** 2 for k in grad_names))
        ne, na = [], []
        negligible = []
        for k in grad_names:
            e = expected[k]
            a = actual.get(k)
            en = norm(e)
            if a is None or a.shape != e.shape or not np.all(np.isfinite(a)):
                why = "missing" if a is None else ("shape differs" if a.shape != e.shape else "NaN/inf")
                problems.append(f"{k}: {why}")
                per_param.append((k, -math.inf, math.inf, en, math.nan))
                ne.append(en)
                na.append(math.inf)
                continue
            an = norm(a)
            if en <= ZERO_GRAD * total_e:
                negligible.append(k)
                cos = 1.0 if an <= ZERO_GRAD_ACTUAL * total_e else -math.inf
            elif an == 0.0:
                cos = 0.0
            else:
                cos = float(np.sum(a * e) / (an * en))
            per_param.append((k, cos, abs(an - en) / en if en > 0 else (0.0 if an == 0 else math.inf), en, an))
            ne.append(en)
            na.append(an)
        ne, na = np.array(ne), np.array(na)
        total_a = math.sqrt(float(np.sum(np.square(na)))) if np.all(np.isfinite(na)) else math.inf
        total_err = abs(total_a - total_e) / total_e if total_e > 0 else (0.0 if total_a == 0 else math.inf)
        vec_err = rel(na, ne) if np.all(np.isfinite(na)) else math.inf
        min_cos = min(c for _, c, _, _, _ in per_param)
        worst_name = min(per_param, key=lambda r: r[1])[0]
        gates.append(("grad total-norm rel err", total_err, f"< {GRAD_NORM_LIMIT:g}", total_err < GRAD_NORM_LIMIT,
                      f"expected {total_e:.6g}, got {total_a:.6g}"))
        gates.append(("grad norm-vector rel err", vec_err, f"< {GRAD_VECTOR_LIMIT:g}", vec_err < GRAD_VECTOR_LIMIT,
                      f"{len(grad_names)} parameters"))
        failing = sum(1 for _, c, _, _, _ in per_param if not c >= COSINE_LIMIT)
        zero_note = f"; {len(negligible)} with a zero reference gradient" if negligible else ""
        gates.append(("grad min cosine", min_cos, f">= {COSINE_LIMIT:g}", min_cos >= COSINE_LIMIT,
                      f"{worst_name[5:]}; {failing} of {len(per_param)} below{zero_note}"))

    passed = all(g[3] for g in gates) and not any("missing" in p or "differs" in p or "NaN" in p for p in problems)
    worst_outputs = sorted(out_errors, key=lambda r: -r[1])[:worst]
    worst_cos = sorted(per_param, key=lambda r: r[1])[:worst]
    worst_norm = sorted(per_param, key=lambda r: -r[2])[:worst]
    return {
        "passed": passed, "gates": gates, "problems": problems, "extra_grads": extra,
        "worst_outputs": worst_outputs, "worst_cosine": worst_cos, "worst_norm": worst_norm,
    }


def print_report(name, r, meta=None):
    print(f"== {name}")
    rows = [("gate", "value", "limit", "verdict", "")]
    for gate, value, limit, ok, detail in r["gates"]:
        rows.append((gate, fmt(value) if gate != "grad min cosine" else (f"{value:.6f}" if math.isfinite(value) else str(value)),
                     limit, "PASS" if ok else "FAIL", detail or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  " + "  ".join(row[i].ljust(widths[i]) for i in range(4)) + ("  " + row[4] if row[4] else ""))
    if r["worst_cosine"]:
        print("  worst parameters by cosine:")
        for k, c, ne, en, an in r["worst_cosine"]:
            print(f"    {k[5:]:60s} cos {c:.6f}  |g| ref {en:.3e} ours {an:.3e}")
        print("  worst parameters by gradient-norm error:")
        for k, c, ne, en, an in r["worst_norm"]:
            print(f"    {k[5:]:60s} rel {fmt(ne)}  |g| ref {en:.3e} ours {an:.3e}")
    for p in r["problems"]:
        print(f"  problem: {p}")
    if r["extra_grads"]:
        shown = ", ".join(k[5:] for k in r["extra_grads"][:5])
        more = f" and {len(r['extra_grads']) - 5} more" if len(r["extra_grads"]) > 5 else ""
        print(f"  note: gradients the reference does not have: {shown}{more}")
    if meta and meta.get("pairs"):
        print("  sentence pairs (cosine of the embeddings): reference / ours")
        for i, j, c_ref, c_ours in meta["pairs_compared"]:
            print(f"    {meta['sentences'][i]!r} ~ {meta['sentences'][j]!r}: {c_ref:.4f} / {c_ours:.4f}")
    print(f"  VERDICT: {'PASS' if r['passed'] else 'FAIL'}")


def main():
    ap = argparse.ArgumentParser(description="forward/backward gates of ARCHITECTURE.md")
    ap.add_argument("expected")
    ap.add_argument("actual")
    ap.add_argument("--name", default=None, help="label for the report (default: the actual file)")
    ap.add_argument("--json", default=None, help="also write the verdict as JSON here")
    ap.add_argument("--worst", type=int, default=5, help="how many worst outputs/parameters to list")
    ap.add_argument("--meta", default=None, help="reference meta.json (sentence pairs of the MiniLM check)")
    ap.add_argument("--forward-only", action="store_true",
                    help="apply the forward gates alone: the actual file holds outputs only (`mgnc run` without --grads)")
    args = ap.parse_args()

    expected, actual = load(args.expected), load(args.actual)
    if args.forward_only:
        expected = {k: v for k, v in expected.items() if k.startswith("output.")}
    r = compare(expected, actual, args.worst)
    meta = None
    if args.meta:
        with open(args.meta) as f:
            meta = json.load(f)
        if meta.get("pairs") and "output.embeddings" in actual:
            emb = actual["output.embeddings"]
            meta["pairs_compared"] = [(i, j, c, float(emb[i] @ emb[j])) for i, j, c in meta["pairs"]]
        else:
            meta.pop("pairs", None)
    print_report(args.name or args.actual, r, meta)
    if args.json:
        summary = {
            "name": args.name or args.actual,
            "passed": r["passed"],
            "gates": [{"gate": g, "value": (v if math.isfinite(v) else str(v)), "limit": l, "passed": ok, "detail": d}
                      for g, v, l, ok, d in r["gates"]],
            "problems": r["problems"],
            "worst_cosine": [{"param": k[5:], "cosine": (c if math.isfinite(c) else str(c))} for k, c, _, _, _ in r["worst_cosine"]],
        }
        if meta and meta.get("pairs_compared"):
            summary["pairs"] = meta["pairs_compared"]
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    sys.exit(0 if r["passed"] else 1)


if __name__ == "__main__":
    main()
