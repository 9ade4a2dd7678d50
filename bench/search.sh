#!/usr/bin/env bash
# all-MiniLM-L6-v2 over 1,000 sentences of mixed lengths on the GPU machine: mgn's one dynamic
# plan (runtime/examples/search.rs) against sentence-transformers' `encode`, same weights, same
# tokenizer, same batches of 32, strict f32, one run.
#
#   MGNC=.dev/mgnc SEARCH=.dev/search TOKENIZER=.dev/tokenizer.json OUT=$OUT bench/search.sh
#
# Prints both rates (sentences per second, medians), their ratio and how far mgn's embeddings
# are from sentence-transformers' (the larger rel. L2 over the sentences).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
MGNC=${MGNC:-target/release/mgnc}
SEARCH=${SEARCH:-target/release/examples/search}
TOKENIZER=${TOKENIZER:-${MGN_CACHE:-$HOME/.cache/mgn}/minilm/tokenizer.json}
OUT=${OUT:-/tmp/mgn-search}
N=${N:-1000}
BATCH=${BATCH:-32}
REPEAT=${REPEAT:-10}
check_inputs "$MGNC" "cargo build --release -p mgnc" minilm_l6
vulkan_loader
mkdir -p "$OUT/model"
cp "$TOKENIZER" "$OUT/model/tokenizer.json"
python3 bench/search.py --tokenizer "$TOKENIZER" --weights "$OUT/model/model.safetensors" \
    --sentences "$OUT/sentences.txt" --embeddings-out "$OUT/torch.safetensors" --n "$N" \
    --batch "$BATCH" --repeat "$REPEAT" --device "${TORCH_DEVICE:-cuda}" | tee "$OUT/torch.txt"
"$MGNC" build models/minilm_l6.mgn --dynamic "B=$BATCH,T=256" -o "$OUT/minilm.mgnplan"
"$SEARCH" "$OUT/minilm.mgnplan" "$OUT/model" --corpus "$OUT/sentences.txt" --repeat "$REPEAT" \
    --save "$OUT/mgn.safetensors" "a query" | tee "$OUT/mgn.txt"
# The same through one static plan at the bound: every batch padded to 32 × 256.
"$MGNC" build models/minilm_l6.mgn --set "B=$BATCH" --set T=256 -o "$OUT/static.mgnplan"
"$SEARCH" "$OUT/static.mgnplan" "$OUT/model" --corpus "$OUT/sentences.txt" --repeat "$REPEAT" \
    "a query" | tee "$OUT/static.txt"
python3 - "$OUT" <<'PY'
import re, sys
from safetensors.torch import load_file
out = sys.argv[1]
a = load_file(f"{out}/mgn.safetensors")["embeddings"].double()
b = load_file(f"{out}/torch.safetensors")["embeddings"].double().cpu()
rel = ((a - b).norm(dim=1) / b.norm(dim=1)).max().item()
torch_rate = float(re.search(r"(\d+) sentences/s", open(f"{out}/torch.txt").read()).group(1))
rate = lambda f: float(re.search(r"(\d+) sentences/s", open(f"{out}/{f}").read()).group(1))
mgn_rate, static_rate = rate("mgn.txt"), rate("static.txt")
print("| side | sentences/s (median) |\n|---|---|")
print(f"| mgn, one dynamic plan (batches at their own sizes) | {mgn_rate:.0f} |")
print(f"| mgn, one static plan (every batch padded to the bound) | {static_rate:.0f} |")
print(f"| sentence-transformers | {torch_rate:.0f} |")
print(f"mgn / sentence-transformers: {mgn_rate / torch_rate:.2f}x the rate; "
      f"embeddings agree to rel. L2 {rel:.2e} (worst sentence)")
PY
