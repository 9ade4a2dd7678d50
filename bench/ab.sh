#!/usr/bin/env bash
# A/B of two mgnc binaries in one command on one machine, for the changes a session makes:
# for each workload, ROUNDS rounds of `mgnc bench --json`, A then B then A…, so both sides see
# the same card, clocks and neighbours; then bench/ab_table.py prints each cell's median per
# round and the ratio of B's median over rounds to A's.
#
#   A=.dev/mgnc_before B=.dev/mgnc_after bench/ab.sh resnet50 sd_unet_tiny:B=1 smollm2_135m
#
# A workload is a file name in models/ without `.mgn`, optionally `:k=v,k=v` (`--set`s).
# Environment: A, B (the binaries; required), ROUNDS (2), SAMPLES (20), WARMUP (5),
# BACKEND (vulkan), PRECISION (f32), OUT (bench/out/ab: one JSON per run, and table.md), and
# A_ENV, B_ENV: variables set for one side only (`B_ENV="MGN_COOP=1"` with A = B times one
# binary with and without a switch); BENCH_ARGS: more arguments for every `mgnc bench`
# (`--inference` to time the inference plans alone).
set -eu
cd "$(dirname "$0")/.."
: "${A:?set A to the first mgnc binary}" "${B:?set B to the second mgnc binary}"
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-bench/out/ab}
mkdir -p "$OUT"
[ $# -gt 0 ] || { echo "usage: A=mgnc B=mgnc bench/ab.sh MODEL[:k=v,…] …" >&2; exit 2; }
for w in "$@"; do
    model=${w%%:*}
    sets=()
    if [ "$w" != "$model" ]; then
        IFS=, read -r -a kv <<< "${w#*:}"
        for s in "${kv[@]}"; do sets+=(--set "$s"); done
    fi
    name=$(echo "$w" | tr ':=,' '_-_')
    for r in $(seq 1 "$ROUNDS"); do
        for side in A B; do
            bin=${!side}
            side_env="${side}_ENV"
            read -r -a envs <<< "${!side_env:-}"
            env "${envs[@]}" "$bin" bench "models/$model.mgn" "${sets[@]}" \
                --backend "${BACKEND:-vulkan}" --precision "${PRECISION:-f32}" \
                --samples "${SAMPLES:-20}" --warmup "${WARMUP:-5}" --json ${BENCH_ARGS:-} \
                > "$OUT/$name.$side.$r.json"
        done
    done
done
python3 bench/ab_table.py "$OUT" | tee "$OUT/table.md"
