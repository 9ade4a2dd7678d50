#!/usr/bin/env bash
# SmolLM2-135M decoding on the GPU machine, mgn against Hugging Face transformers in one run:
# a 128-token prompt, then 128 new tokens (greedy), same weights, in f32 and in f16 (mgn's
# `--precision mixed`, PyTorch's model cast to float16); and BATCH (8) sequences decoded at
# once, as tokens/s.
#
#   MGNC=.dev/mgnc GENERATE=.dev/generate OUT=$OUT bench/decode.sh
#
# PyTorch: bench/decode.py (eager with a DynamicCache; torch.compile with a StaticCache, the
# ratio's reference). mgn: the prefill plan (T = 128) and the decode plan (T = 1) of
# models/smollm2_135m_decode.mgn through runtime/examples/generate.rs, per-token median; the
# batch's decode plan (B = BATCH) through `mgnc bench --inference`, whose forward is one step
# of the whole batch (random ids, the caches kept on the device). Prints one table; the first
# generated ids of mgn f32 and torch f32 must agree (printed above it).
#
# TORCH=0 leaves PyTorch out (random weights, a counted prompt, no ratios): the script's own
# path on any Vulkan device, e.g. lavapipe with a small model:
#   TORCH=0 PROMPT=8 NEW=4 REPEAT=1 SETTINGS="n_layers=2 vocab=512" bench/decode.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
MGNC=${MGNC:-target/release/mgnc}
GENERATE=${GENERATE:-target/release/examples/generate}
OUT=${OUT:-/tmp/mgn-decode}
PROMPT=${PROMPT:-128}
NEW=${NEW:-128}
CACHE=${CACHE:-256}
REPEAT=${REPEAT:-5}
BATCH=${BATCH:-8}
TORCH=${TORCH:-1}
# Extra model settings (`name=value` words), e.g. a smaller model for a dry run.
SETTINGS=${SETTINGS:-}
check_inputs "$MGNC" "cargo build --release -p mgnc" smollm2_135m_decode
if [ ! -x "$GENERATE" ]; then
    echo "error: no generate at $GENERATE (cargo build --release -p mgn-runtime --example generate)" >&2
    exit 2
fi
vulkan_loader
mkdir -p "$OUT"
sets=(--set cache="$CACHE")
for s in $SETTINGS; do sets+=(--set "$s"); done
if [ "$TORCH" = 1 ]; then
    python3 bench/decode.py --weights "$OUT/weights.safetensors" --prompt-out "$OUT/prompt.txt" \
        --prompt-len "$PROMPT" --new "$NEW" --cache "$CACHE" --repeat "$REPEAT" --f16 \
        --batch "$BATCH" | tee "$OUT/torch.txt"
    weights=(--weights "$OUT/weights.safetensors")
else
    seq -s, 1 "$PROMPT" >"$OUT/prompt.txt"
    : >"$OUT/torch.txt"
    weights=()
fi

m=models/smollm2_135m_decode.mgn
for prec in f32 mixed; do
    flags=(--precision "$prec")
    "$MGNC" build "$m" "${sets[@]}" "${flags[@]}" -o "$OUT/decode-$prec.mgnplan" --stats \
        >"$OUT/stats-$prec.txt"
    "$MGNC" build "$m" "${sets[@]}" --set T="$PROMPT" "${flags[@]}" \
        -o "$OUT/prefill-$prec.mgnplan" >/dev/null
    echo "== mgn $prec: $(grep '^gpu:' "$OUT/stats-$prec.txt" | cut -d';' -f1)"
    "$GENERATE" "$OUT/decode-$prec.mgnplan" --prefill "$OUT/prefill-$prec.mgnplan" --gpu \
        "${weights[@]}" --prompt "$(cat "$OUT/prompt.txt")" --tokens "$NEW" \
        --repeat "$REPEAT" | tee "$OUT/mgn-$prec.txt"
    "$MGNC" bench "$m" "${sets[@]}" --set B="$BATCH" "${flags[@]}" --backend vulkan \
        --inference --json >"$OUT/batch-$prec.json"
done

python3 - "$OUT" "$BATCH" <<'PY'
import json, re, sys
out, batch = sys.argv[1], int(sys.argv[2])
torch = open(f"{out}/torch.txt").read()
def torch_ms(pattern):
    m = re.search(pattern + r": .*?per (?:token|step) ([\d.]+) ms", torch)
    return float(m.group(1)) if m else None
def mgn_ms(prec):
    m = re.search(r"per token: ([\d.]+) ms", open(f"{out}/mgn-{prec}.txt").read())
    return float(m.group(1)) if m else None
def batch_ms(prec):
    return json.load(open(f"{out}/batch-{prec}.json"))["measurements"]["forward"]["median_ms"]
def levels(prec):
    m = re.search(r"gpu: (\d+) dispatches in (\d+) levels", open(f"{out}/stats-{prec}.txt").read())
    return f"{m.group(1)} / {m.group(2)}" if m else "—"
fmt = lambda v, p=3: "—" if v is None else f"{v:.{p}f}"
tps = lambda ms, n=1: None if not ms else n / ms * 1e3
ratio = lambda a, b: None if a is None or b is None else a / b
print()
print(f"| SmolLM2-135M decode | per token ms | tokens/s | × torch.compile | "
      f"batch {batch}: step ms | batch {batch}: tokens/s | dispatches / levels |")
print("|---|---|---|---|---|---|---|")
for prec, name, tname in [("f32", "mgn f32", "f32"), ("mixed", "mgn f16 (mixed)", "f16")]:
    ms, bms = mgn_ms(prec), batch_ms(prec)
    ref = torch_ms("torch compile" if tname == "f32" else "torch f16 compile")
    print(f"| {name} | {fmt(ms)} | {fmt(tps(ms), 0)} | {fmt(ratio(ms, ref), 2)} | {fmt(bms)} | "
          f"{fmt(tps(bms, batch), 0)} | {levels(prec)} |")
for tname in ["f32", "f16"]:
    ref = torch_ms("torch compile" if tname == "f32" else "torch f16 compile")
    bref = torch_ms(f"torch batch {batch} {tname} compile")
    print(f"| torch.compile + static cache {tname} | {fmt(ref)} | {fmt(tps(ref), 0)} | 1.00 | "
          f"{fmt(bref)} | {fmt(tps(bref, batch), 0)} | |")
PY
