#!/usr/bin/env bash
# SmolLM2-135M decoding on the GPU machine, mgn against Hugging Face transformers in one run:
# a 128-token prompt, then 128 new tokens (greedy), strict f32, same weights.
#
#   MGNC=.dev/mgnc GENERATE=.dev/generate OUT=$OUT bench/decode.sh
#
# PyTorch: bench/decode.py (eager with a DynamicCache; torch.compile with a StaticCache).
# mgn: the prefill plan (T = 128) and the decode plan (T = 1) of models/smollm2_135m_decode.mgn
# through runtime/examples/generate.rs. Prints prefill time and per-token latency (medians)
# and the first generated ids of each (they must agree).
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
check_inputs "$MGNC" "cargo build --release -p mgnc" smollm2_135m_decode
vulkan_loader
mkdir -p "$OUT"
python3 bench/decode.py --weights "$OUT/weights.safetensors" --prompt-out "$OUT/prompt.txt" \
    --prompt-len "$PROMPT" --new "$NEW" --cache "$CACHE" --repeat "$REPEAT" | tee "$OUT/torch.txt"
"$MGNC" build models/smollm2_135m_decode.mgn --set cache="$CACHE" -o "$OUT/decode.mgnplan"
"$MGNC" build models/smollm2_135m_decode.mgn --set cache="$CACHE" --set T="$PROMPT" \
    -o "$OUT/prefill.mgnplan"
"$GENERATE" "$OUT/decode.mgnplan" --prefill "$OUT/prefill.mgnplan" \
    --weights "$OUT/weights.safetensors" --prompt "$(cat "$OUT/prompt.txt")" \
    --tokens "$NEW" --repeat "$REPEAT" | tee "$OUT/mgn.txt"
