#!/usr/bin/env bash
# CPU decoding (the fallback every machine without a GPU gets) against the memory-bound floor
# of the same machine: the real SmolLM2-135M-Instruct (its GGUF file, imported with
# `--dequantize`: 513 MiB of f32 weights) decoded by `mgnc generate --backend cpu` in f32 and
# with its weights packed (`--quantize q8_0`, `q4_0`, `q4_1`), each its median time per token;
# next to it numpy's matrix-vector products over every weight matrix of the same checkpoint,
# once each (bench/cpu_decode.py: what reading the weights once costs here), and the ratio.
# Each format's generated ids are left in OUT/FORMAT.ids (compare two builds' with cmp).
# No GPU needed. Prints one table.
#
#     bench/cpu_decode.sh
#     MGNC=path/to/mgnc FORMATS="f32 q4_1" TOKENS=32 bench/cpu_decode.sh
#
# MGNC (default target/release/mgnc, built if missing), FORMATS (default "f32 q8_0 q4_0 q4_1"),
# TOKENS generated per format (default 32: the median is over 31 decode runs), PROMPT ids
# (default 16), CACHE positions of the KV cache (default 256, as bench/quantized_decode.sh; the
# imported model's own default, 2048, adds reading 94 MB of keys and values to every token),
# OUT (default target/cpu_decode). MGN_CPU_THREADS sets the kernels' threads.
set -euo pipefail
cd "$(dirname "$0")/.."
MGNC=${MGNC:-target/release/mgnc}
OUT=${OUT:-target/cpu_decode}
FORMATS=${FORMATS:-"f32 q8_0 q4_0 q4_1"}
TOKENS=${TOKENS:-32}
PROMPT=${PROMPT:-16}
CACHE=${CACHE:-256}
cache=${MGN_CACHE:-$HOME/.cache/mgn}
[ -x "$MGNC" ] || flock /tmp/cargo.lock cargo build --release --offline --quiet -p mgnc
py="$cache/py"
if ! PYTHONPATH="$py" python3 -c "import numpy" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$py" numpy
fi
export PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}"
gguf="$(bash scripts/fetch_smollm2_gguf.sh | tail -n 1)/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$OUT"
if [ ! -f "$OUT/smollm2.safetensors" ]; then
    "$MGNC" import "$gguf" --dequantize -o "$OUT/smollm2.mgn" >/dev/null
fi
# Fixed prompt ids (no tokenizer), greedy: every format decodes the same number of tokens.
ids=$(seq -s, 100 $((100 + PROMPT - 1)))

# decode FORMAT: the median ms per token of `mgnc generate` on the CPU.
decode() {
    local q=()
    [ "$1" != f32 ] && q=(--quantize "$1")
    "$MGNC" generate "$OUT/smollm2.mgn" --weights "$OUT/smollm2.safetensors" --backend cpu \
        --cache "$CACHE" --prompt-ids "$ids" --tokens "$TOKENS" --ids "${q[@]}" \
        >"$OUT/$1.ids" 2>"$OUT/$1.txt"
    sed -n 's/.*, \([0-9.]*\) ms per token (median.*/\1/p' "$OUT/$1.txt"
}

# The floor is numpy's faster pass of two: BLAS on every core, and on one (on a busy machine
# BLAS threads that wait for each other can take twice as long as one thread).
python3 bench/cpu_decode.py --weights "$OUT/smollm2.safetensors" >"$OUT/floor.txt"
OPENBLAS_NUM_THREADS=1 python3 bench/cpu_decode.py --weights "$OUT/smollm2.safetensors" \
    >"$OUT/floor1.txt"
all=$(sed -n 's/^floor_ms //p' "$OUT/floor.txt")
one=$(sed -n 's/^floor_ms //p' "$OUT/floor1.txt")
floor=$(python3 -c "print(min($all, $one))")
mib=$(awk '/^bytes/ { printf "%.0f", $2 / 1048576 }' "$OUT/floor.txt")
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
load=$(cut -d' ' -f1 /proc/loadavg)
echo "CPU decode, SmolLM2-135M-Instruct (cache $CACHE), $(nproc) cores (load $load)," \
    "$(date -u +%F), $rev;" \
    "numpy floor: ${floor} ms for ${mib} MiB of f32 matrices (all cores ${all} ms, one ${one} ms)"
echo
echo "| weights | ms/token (median) | numpy f32 floor (ms) | ours / floor |"
echo "| --- | ---: | ---: | ---: |"
for f in $FORMATS; do
    ms=$(decode "$f")
    if [ -z "$ms" ]; then
        echo "| $f | failed: $(tail -n 1 "$OUT/$f.txt") | | |"
        continue
    fi
    ratio=$(python3 -c "print(f'{$ms / $floor:.2f}')")
    echo "| $f | $ms | $floor | $ratio |"
done
