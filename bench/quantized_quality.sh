#!/usr/bin/env bash
# What quantization costs in quality, on the CPU backend (no GPU needed): all-MiniLM-L6-v2's
# real weights, a character-level GPT trained on a public-domain book, and the real SmolLM2
# GGUF, each f32 against q8_0, q4_0, q4_1 and q4_k. Prints four tables (bench/quantized_quality.py
# says what each measures). Fetches what it needs into MGN_CACHE (default ~/.cache/mgn) once.
#
#     bench/quantized_quality.sh                 # all four, ~10 minutes on 2 cores
#     OUT=dir PARTS="minilm gguf" bench/quantized_quality.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MGNC=${MGNC:-target/release/mgnc}
OUT=${OUT:-target/quantized_quality}
PARTS=${PARTS:-"minilm gpt gguf"}
cache=${MGN_CACHE:-$HOME/.cache/mgn}
[ -x "$MGNC" ] || cargo build --release --quiet -p mgnc
py="$cache/py"
if ! PYTHONPATH="$py" python3 -c "import numpy, safetensors" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$py" numpy safetensors
fi
export PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}"
args=(--mgnc "$MGNC" --out "$OUT")
for part in $PARTS; do
    case $part in
        minilm) args+=(--minilm "$(bash scripts/fetch_minilm.sh | tail -n 1)") ;;
        gpt) args+=(--book "$(bash scripts/fetch_book.sh | tail -n 1)") ;;
        gguf) args+=(--gguf "$(bash scripts/fetch_smollm2_gguf.sh | tail -n 1)/SmolLM2-135M-Instruct.Q4_1.gguf") ;;
        *) echo "error: unknown part $part (minilm, gpt, gguf)" >&2; exit 2 ;;
    esac
done
python3 bench/quantized_quality.py "${args[@]}" | tee "$OUT.md"
