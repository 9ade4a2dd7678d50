#!/usr/bin/env bash
# Quantized decoding on the GPU machine: SmolLM2-135M's prefill and per-token time in f32, f16
# (`--precision mixed`), q8_0, q4_0 and q4_k (`--quantize`), each plan's arena, and PyTorch's
# f32 and f16 decoding (eager and torch.compile with a static cache) in the same command, same
# weights; then a Llama-3.2-1B-shaped model (random weights) whose f32 weights exceed one
# storage binding (the arena is one: 4 GiB on NVIDIA), built and decoded in q4_0 and q4_k.
#
#   MGNC=.dev/mgnc GENERATE=.dev/generate OUT=$OUT bench/quantized_decode.sh
#
# Prints one table. The generated ids of the f32 plan must equal PyTorch f32's; the quantized
# plans' ids differ (other weights), which is what the quality table (bench/quantized_quality.sh)
# measures.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
MGNC=${MGNC:-target/release/mgnc}
GENERATE=${GENERATE:-target/release/examples/generate}
OUT=${OUT:-/tmp/mgn-quantized-decode}
PROMPT=${PROMPT:-128}
NEW=${NEW:-64}
CACHE=${CACHE:-256}
REPEAT=${REPEAT:-3}
FORMATS=${FORMATS:-"f32 f16 q8_0 q4_0 q4_k"}
check_inputs "$MGNC" "cargo build --release -p mgnc" smollm2_135m_decode
vulkan_loader
mkdir -p "$OUT"
python3 bench/decode.py --weights "$OUT/weights.safetensors" --prompt-out "$OUT/prompt.txt" \
    --prompt-len "$PROMPT" --new "$NEW" --cache "$CACHE" --repeat "$REPEAT" --f16 \
    | tee "$OUT/torch.txt"

# The flags that build format $1.
flags() {
    case $1 in
        f32) ;;
        f16) echo --precision mixed ;;
        *) echo --quantize "$1" ;;
    esac
}

# decode NAME FORMAT WEIGHTS-OR-EMPTY [--set k=v]...: builds the prefill and decode plans,
# records the decode plan's arena and decodes; writes $OUT/NAME.txt.
decode() {
    local name=$1 fmt=$2 weights=$3
    shift 3
    local m=models/smollm2_135m_decode.mgn
    # shellcheck disable=SC2046
    "$MGNC" build "$m" --set cache="$CACHE" "$@" $(flags "$fmt") -o "$OUT/$name.decode.mgnplan" \
        --stats >"$OUT/$name.stats.txt" 2>&1 || { cat "$OUT/$name.stats.txt"; return 0; }
    # shellcheck disable=SC2046
    "$MGNC" build "$m" --set cache="$CACHE" --set T="$PROMPT" "$@" $(flags "$fmt") \
        -o "$OUT/$name.prefill.mgnplan" >/dev/null
    local w=()
    [ -n "$weights" ] && w=(--weights "$weights")
    "$GENERATE" "$OUT/$name.decode.mgnplan" --prefill "$OUT/$name.prefill.mgnplan" "${w[@]}" \
        --prompt "$(cat "$OUT/prompt.txt")" --tokens "$NEW" --repeat "$REPEAT" \
        >"$OUT/$name.txt" 2>&1 || true
    tail -3 "$OUT/$name.txt"
}

for f in $FORMATS; do
    echo "== smollm2 $f"
    decode "smollm2-$f" "$f" "$OUT/weights.safetensors"
done
# Llama-3.2-1B's shape: 1.24 B parameters, 4.9 GB in f32 (past a 4 GiB binding), random weights.
LLAMA_1B=(--set vocab=128256 --set d=2048 --set n_layers=16 --set heads=32 --set kv_heads=8
    --set head_dim=64 --set hidden=8192)
for f in f32 q4_0 q4_k; do
    echo "== llama-1b $f"
    decode "llama1b-$f" "$f" "" "${LLAMA_1B[@]}"
done

python3 - "$OUT" "$FORMATS" <<'PY'
import os, re, sys
out, formats = sys.argv[1], sys.argv[2].split()
def read(name):
    p = f"{out}/{name}"
    return open(p).read() if os.path.exists(p) else ""
def timing(text):
    pre = re.search(r"prompt: ([\d.]+) ms", text)
    tok = re.search(r"per token: ([\d.]+) ms", text)
    return (float(pre.group(1)) if pre else None, float(tok.group(1)) if tok else None)
def arena(name):
    t = read(f"{name}.stats.txt")
    # `build --stats`: "values planned X and parameters held in Y as the GPU runs the plan"
    m = re.search(r"values planned ([\d.]+ \w+) and parameters held in ([\d.]+ \w+)", t)
    return f"{m.group(2)} + {m.group(1)}" if m else (t.strip().splitlines() or ["?"])[-1][:60]
def ids(text):
    m = re.search(r"tokens: ([\d,]+)", text)
    return m.group(1).split(",")[:8] if m else []
torch = read("torch.txt")
rows = []
for line in torch.splitlines():
    m = re.match(r"torch (.+?): prefill ([\d.]+) ms, per token ([\d.]+) ms, ids ([\d,]+)", line)
    if m:
        rows.append((f"PyTorch {m.group(1)}", float(m.group(2)), float(m.group(3)), "",
                     m.group(4).split(",")[:8]))
best = {k: min((r[2] for r in rows if (("f16" in r[0]) == (k == "f16"))), default=None)
        for k in ("f32", "f16")}
print("| model | format | prefill ms | ms / token | vs faster PyTorch (same precision) | "
      "weights + arena | first ids |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| SmolLM2-135M | {r[0]} | {r[1]:.2f} | {r[2]:.3f} | | | {','.join(r[4])} |")
for f in formats:
    t = read(f"smollm2-{f}.txt")
    pre, tok = timing(t)
    ref = best["f16" if f == "f16" else "f32"]
    ratio = f"{tok / ref:.2f}x" if tok and ref else ""
    print(f"| SmolLM2-135M | mgn {f} | {pre or '-'} | {tok or '-'} | {ratio} | "
          f"{arena(f'smollm2-{f}')} | {','.join(ids(t))} |")
for f in ("f32", "q4_0", "q4_k"):
    t = read(f"llama1b-{f}.txt") or read(f"llama1b-{f}.stats.txt")
    pre, tok = timing(t)
    what = arena(f"llama1b-{f}") if tok else (t.strip().splitlines() or ["?"])[-1][:90]
    print(f"| Llama-3.2-1B shape | mgn {f} | {pre or '-'} | {tok or '-'} | | {what} | |")
PY
