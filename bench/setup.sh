#!/usr/bin/env bash
# Setting a session up on the GPU, per plan, cold, warm and tuned, as one table:
#
#   cold   the first session of a fresh process, with no verdicts kept (an empty `--cache`
#          folder) and an empty driver shader cache: what a fresh machine pays, the kernels
#          measured at setup (session::choices) included;
#   warm   a second session of the same plan in that process (verdicts kept, the device open);
#   tuned  the first session of a new process after that one: the verdicts `mgnc tune` keeps
#          and the shader cache its driver filled (what a deployed app that ships the cache
#          folder pays on a machine whose driver cache is warm).
#
# Each cell comes from `mgnc tune --json`: first_open_ms / second_open_ms, the time
# `Session::use_gpu` takes (parameters' upload included, compiling the plan not), of the cold
# one the pipelines phase and the kernels' measuring, and pipelines, the distinct kernels a
# session compiles once its verdicts are kept. Usage, from the
# repository root:
#
#   bench/setup.sh [WORKLOAD...]        (default: the six of docs/BENCHMARKS.md)
#
# Environment:
#   MGNC        the mgnc binary (default target/release/mgnc)
#   PRECISIONS  the precision policies (default "f32 mixed")
#   SET_<NAME>  model arguments, e.g. SET_smollm2_135m="T=64"
#   INFERENCE   1: the inference plans only (no training plan)
#   OUT         where the runs' JSON goes (default a temporary folder, removed at the end)
#
# On the GPU machine (NVIDIA): each workload gets fresh folders for the verdicts and for the
# driver's shader cache (__GL_SHADER_DISK_CACHE_PATH; Mesa's MESA_SHADER_CACHE_DIR too), so
# nothing kept by an earlier run or workload warms the cold column. A smoke check on lavapipe:
#   MGNC=target/debug/mgnc SET_digits_mlp="batch=8 hidden=16" bench/setup.sh digits_mlp
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
source bench/common.sh

MGNC=${MGNC:-target/release/mgnc}
PRECISIONS=${PRECISIONS:-f32 mixed}
NAMES=("$@")
if [ ${#NAMES[@]} -eq 0 ]; then NAMES=("${WORKLOADS[@]}"); fi
check_inputs "$MGNC" "cargo build --release -p mgnc" "${NAMES[@]}"
vulkan_loader

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    keep=1
else
    OUT=$(mktemp -d)
    keep=0
fi
scratch=$(mktemp -d)
cleanup() {
    rm -rf "$scratch"
    if [ "$keep" = 0 ]; then rm -rf "$OUT"; fi
}
trap cleanup EXIT

extra=()
if [ "${INFERENCE:-0}" = 1 ]; then extra+=(--inference); fi

for name in "${NAMES[@]}"; do
    mapfile -t sets < <(sets_of "$name")
    for precision in $PRECISIONS; do
        run="$name.$precision"
        cache="$scratch/$run/verdicts"
        shaders="$scratch/$run/shaders"
        mkdir -p "$cache" "$shaders"
        for pass in cold tuned; do
            echo "setup.sh: $name, $precision, $pass" >&2
            __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_PATH="$shaders" \
                __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 MESA_SHADER_CACHE_DIR="$shaders" \
                "$MGNC" tune "models/$name.mgn" "${sets[@]}" --precision "$precision" \
                --cache "$cache" --json "${extra[@]}" >"$OUT/$run.$pass.json" \
                2>"$OUT/$run.$pass.log" || {
                echo "error: mgnc tune $name --precision $precision failed:" >&2
                cat "$OUT/$run.$pass.log" >&2
                exit 1
            }
        done
        # The shader cache is emptied between workloads, so that the next one starts cold.
        rm -rf "$shaders"
    done
done

python3 - "$OUT" "${NAMES[@]}" -- $PRECISIONS <<'EOF'
import json, sys
out = sys.argv[1]
rest = sys.argv[2:]
cut = rest.index("--")
names, precisions = rest[:cut], rest[cut + 1:]
rows = []
device = ""
for name in names:
    for p in precisions:
        cold = json.load(open(f"{out}/{name}.{p}.cold.json"))
        tuned = json.load(open(f"{out}/{name}.{p}.tuned.json"))
        device = cold["device"]
        for c, t in zip(cold["plans"], tuned["plans"]):
            rows.append((name, p, c["plan"], c["pipelines"], c["measured"], c["first_open_ms"],
                         c["first_open_compiling_ms"], c["first_open_measuring_ms"],
                         c["second_open_ms"], t["first_open_ms"], t["measured"]))
print(f"Setup per plan on {device} (ms; `mgnc tune --json`, bench/setup.sh)")
print()
print("| workload | precision | plan | pipelines | kernels measured cold | cold (compiling, "
      "measuring) | warm | tuned |")
print("|---|---|---|---|---|---|---|---|")
for name, p, plan, pipelines, measured, cold, comp, meas, warm, tuned, again in rows:
    note = "" if again == 0 else f" ({again} measured again)"
    print(f"| {name} | {p} | {plan} | {pipelines} | {measured} | {cold:.0f} ({comp:.0f}, "
          f"{meas:.0f}) | {warm:.0f} | {tuned:.0f}{note} |")
EOF
