#!/usr/bin/env bash
# The rewrite ablation: each workload built and measured with no graph rewrites, the greedy rules
# and egglog's equality saturation (`--rewrites none|greedy|egglog`), in one run, as one Markdown
# table: plan steps and GPU dispatches (inference and training plans, `mgnc build --stats`), the
# compile time of each plan and the GPU forward (at the model's shape and at one sample of one
# token), forward + loss + backward and training step (`mgnc bench --json`). Writes
# $OUT/ablation.md and prints it.
#
#   bench/ablation.sh [NAME ...]
#
# NAME: a model in models/ (default: the six workloads — smollm2_135m whisper_tiny_encoder resnet50
# sd_unet_tiny smolvla_expert minilm_l6). Meant for the GPU machine, which has no Rust toolchain:
# it runs a prebuilt mgnc that has the egglog engine:
#   cargo build --release -p mgnc --features egglog    # here; copy target/release/mgnc over
# Environment:
#   MGNC      the mgnc binary (default target/release/mgnc)
#   PYTHON    a Python 3 for the table (standard library only; python3)
#   OUT       where the build summaries, the bench JSON and ablation.md go (bench/out/ablation)
#   BACKEND   mgnc bench's backend (vulkan; cpu checks the script on a machine without a GPU)
#   ENGINES   the engines compared (none greedy egglog)
#   WARMUP, SAMPLES   per measurement (5, 10)
#   SET_<NAME>        model arguments, e.g. SET_smollm2_135m="T=64"
#   SMALL     1: tiny shapes for every workload (a quick check of the script, e.g. on the CPU)
#   STEP_TIMEOUT      seconds one bench of one workload and engine may take (300)
# A second run into the same OUT adds its workloads to the table, so a long set can be split.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
MGNC=${MGNC:-target/release/mgnc}
OUT=${OUT:-bench/out/ablation}
BACKEND=${BACKEND:-vulkan}
ENGINES=${ENGINES:-none greedy egglog}
WARMUP=${WARMUP:-5}
SAMPLES=${SAMPLES:-10}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
NAMES=("$@")
# shellcheck source=bench/common.sh
. bench/common.sh
if [ ${#NAMES[@]} -eq 0 ]; then NAMES=("${WORKLOADS[@]}"); fi
check_inputs "$MGNC" "cargo build --release -p mgnc --features egglog" "${NAMES[@]}"
if [[ " $ENGINES " == *" egglog "* ]] && ! "$MGNC" build models/digits_mlp.mgn --rewrites egglog >/dev/null 2>&1; then
    "$MGNC" build models/digits_mlp.mgn --rewrites egglog >&2
    echo "error: $MGNC has no egglog engine; build it with \`cargo build --release -p mgnc --features egglog\`" >&2
    exit 2
fi
mkdir -p "$OUT"

if [ "$BACKEND" != cpu ]; then vulkan_loader; fi

# SMALL=1: shapes that run in seconds on a CPU (compiler/tests/rewrites.rs's).
small() {
    case $1 in
        smollm2_135m) echo "vocab=64 d=32 n_layers=2 heads=4 kv_heads=2 head_dim=8 hidden=48 T=8" ;;
        whisper_tiny_encoder) echo "n_mels=8 frames=16 d=32 heads=4 ffn=64 n_layers=2" ;;
        resnet50) echo "B=2 size=32 classes=5" ;;
        sd_unet_tiny) echo "size=8 c0=4 c1=8 c2=16 heads=2 groups=2 ctx_len=4 ctx_dim=8" ;;
        smolvla_expert) echo "chunk=4 action_dim=4 prefix=4 d=32 ffn=48 n_layers=2 heads=4 kv_heads=2 head_dim=8" ;;
        minilm_l6) echo "vocab=64 d=32 heads=4 ffn=64 n_layers=2 max_positions=16 B=2 T=8" ;;
    esac
}

# A model's --set arguments: SMALL's, then SET_<name>'s (`sets_of`).
sets_with_small() {
    local kv
    if [ "${SMALL:-0}" = 1 ]; then
        for kv in $(small "$1"); do printf -- '--set\n%s\n' "$kv"; done
    fi
    sets_of "$1"
}

start=$(date +%s)
for name in "${NAMES[@]}"; do
    mapfile -t sets < <(sets_with_small "$name")
    for engine in $ENGINES; do
        echo "=== $name --rewrites $engine ${sets[*]:-}" >&2
        base="$OUT/$name.$engine"
        rm -f "$base".*
        for mode in infer train; do
            "$MGNC" build "models/$name.mgn" --mode "$mode" --rewrites "$engine" --stats "${sets[@]}" \
                >"$base.$mode.txt" 2>"$base.$mode.log" || { echo "build ($mode) failed:" >&2; tail -5 "$base.$mode.log" >&2; }
        done
        t0=$(date +%s)
        if timeout "$STEP_TIMEOUT" "$MGNC" bench "models/$name.mgn" --backend "$BACKEND" --rewrites "$engine" --json \
            --warmup "$WARMUP" --samples "$SAMPLES" "${sets[@]}" >"$base.json" 2>"$base.bench.log"; then
            echo "bench: $(($(date +%s) - t0)) s" >&2
        else
            echo "bench failed (see $base.bench.log):" >&2
            tail -5 "$base.bench.log" >&2
            rm -f "$base.json"
            continue
        fi
        # The minimal shape's inference plan too (the bench's settings replace the same names).
        mapfile -t minimal < <("$PY" -c '
import json, sys
m = json.load(open(sys.argv[1]))["measurements"]["forward_minimal"]
shrink = m["settings"] if m else {}
for a, b in zip(sys.argv[2::2], sys.argv[3::2]):
    if b.split("=")[0] not in shrink:
        print(a); print(b)
for k, v in shrink.items():
    print("--set"); print(f"{k}={v}")
' "$base.json" "${sets[@]}")
        "$MGNC" build "models/$name.mgn" --rewrites "$engine" --stats "${minimal[@]}" >"$base.minimal.txt" 2>/dev/null
    done
done
echo "all workloads: $(($(date +%s) - start)) s" >&2

"$PY" - "$OUT" "$ENGINES" "${NAMES[@]}" <<'EOF'
import json, os, re, sys, time
out, engines, *names = sys.argv[1:]
engines = engines.split()
# A second run into the same OUT adds its workloads: keep the earlier ones, in their order.
listed = os.path.join(out, "workloads.json")
try:
    old = json.load(open(listed))
except (OSError, ValueError):
    old = []
names = [n for n in old if n not in names] + names
json.dump(names, open(listed, "w"))

def build(name, engine, mode):
    """(steps, dispatches) from `mgnc build --stats`."""
    try:
        text = open(os.path.join(out, f"{name}.{engine}.{mode}.txt")).read()
    except OSError:
        return None, None
    steps = re.search(r"plan of ([\d,]+) steps", text)
    gpu = re.search(r"gpu: (\d+) dispatches", text)
    return (int(steps.group(1).replace(",", "")) if steps else None, int(gpu.group(1)) if gpu else None)

def bench(name, engine):
    try:
        return json.load(open(os.path.join(out, f"{name}.{engine}.json")))
    except (OSError, ValueError):
        return None

def ms(report, key):
    m = report and (report["measurements"].get(key) or {}).get("median_ms")
    return "—" if m is None else (f"{m:.2f}" if m < 10 else f"{m:.1f}")

def counts(*xs):
    return " / ".join("—" if x is None else f"{x:,}" for x in xs)

device = next((r["device"] + f" ({r['backend']}, {r['build']} build)" for n in names for e in engines
               if (r := bench(n, e))), "unknown")
lines = [
    f"Rewrite ablation, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, on {device}.",
    "Steps and GPU dispatches (after the GPU's own passes; `mgnc build --stats`): the inference plan /",
    "the same at one sample of one token (`mgnc bench`'s minimal shape; — where the model is there",
    "already) / the training plan. Compile: each plan's median, .mgn to plan. Times in ms, medians of",
    "`mgnc bench`; minimal: the forward at the minimal shape.",
    "",
    "| workload | rewrites | steps | GPU dispatches | compile (infer / train) | forward | minimal | fwd + loss + bwd | training step |",
    "|---|---|---|---|---|---|---|---|---|",
]
for n in names:
    for e in engines:
        (si, di), (sm, dm), (st, dt) = (build(n, e, m) for m in ("infer", "minimal", "train"))
        r = bench(n, e)
        if not (r and r["measurements"].get("forward_minimal")):
            sm = dm = None
        lines.append(f"| {n} | {e} | {counts(si, sm, st)} | {counts(di, dm, dt)} | {ms(r, 'compile')} / {ms(r, 'compile_train')} "
                     f"| {ms(r, 'forward')} | {ms(r, 'forward_minimal')} | {ms(r, 'forward_backward')} "
                     f"| {ms(r, 'train_step')} |")
table = "\n".join(lines) + "\n"
open(os.path.join(out, "ablation.md"), "w").write(table)
print(table)
EOF
