#!/usr/bin/env bash
# The test suite's GPU-relevant part on a GPU machine without a Rust toolchain (the lent H200).
#
# Here, build the binaries and copy them next to the repository (both paths are git-ignored):
#   bench/gpu_check.sh --prepare      # cargo builds, copies mgnc + test binaries into .dev/
# There (repository root, Debian's libvulkan1 .deb in .gl/):
#   bench/gpu_check.sh
# It prints the device, runs every test binary in .dev/tests/ with MGN_REQUIRE_GPU=1 (a missing
# GPU is a failure), runs the GPU kernel and whole-model GPU tests again under MGN_MIN_SPEC=1,
# trains the digits MLP on the CPU and on Vulkan, and ends with one line per run: passed/failed.
# Results also go to $OUT when set.
set -u
cd "$(dirname "$0")/.."

if [ "${1:-}" = --prepare ]; then
    set -e
    cargo build --release -p mgnc
    mkdir -p .dev/tests
    rm -f .dev/tests/*
    cp target/release/mgnc .dev/mgnc
    # The GPU backend's unit tests (every GPU kernel against the CPU) and the whole-model tests.
    for spec in "-p mgn-gpu --lib" "-p mgn-tests --test gpu" "-p mgn-tests --test gradcheck" "-p mgn-tests --test valid" "-p mgn-tests --test mixed"; do
        # shellcheck disable=SC2086
        exe=$(cargo test --release $spec --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -1)
        name=$(echo "$spec" | awk '{print $2"_"$NF}' | tr -d '-')
        cp "$exe" ".dev/tests/$name"
    done
    ls -la .dev .dev/tests
    exit 0
fi

for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
# The whole-model tests find the repository through the path they were built in.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
M=.dev/mgnc
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
summary=()
run() { # NAME, then the command
    local name=$1
    shift
    # Letters, digits, '.', '_' and '-' only: the names travel back from the GPU machine.
    local log="$OUT/$(echo "$name" | tr -c 'A-Za-z0-9._\n-' '_').log"
    # A hung driver must not take the whole run with it.
    timeout "${TEST_TIMEOUT:-300}" "$@" >"$log" 2>&1
    local rc=$?
    if [ "$rc" = 124 ]; then echo "timed out after ${TEST_TIMEOUT:-300} s (TEST_TIMEOUT)" >>"$log"; fi
    local line
    line=$(grep -E "^test result" "$log" | awk '{p+=$4; f+=$6} END {if (NR) printf "%d passed, %d failed", p, f}')
    summary+=("$(printf '%-44s rc=%d  %s' "$name" "$rc" "${line:-}")")
    tail -3 "$log"
}
echo "== mgnc info"; $M info
for t in .dev/tests/*; do
    echo "== $(basename "$t")"
    run "$(basename "$t")" env MGN_REQUIRE_GPU=1 "$t" --test-threads 4
done
echo "== under MGN_MIN_SPEC=1"
run "GPU kernels (MGN_MIN_SPEC=1)" env MGN_REQUIRE_GPU=1 MGN_MIN_SPEC=1 .dev/tests/mgngpu_lib --test-threads 4
run "whole models on the GPU (MGN_MIN_SPEC=1)" env MGN_REQUIRE_GPU=1 MGN_MIN_SPEC=1 .dev/tests/mgntests_gpu --test-threads 4
for b in cpu vulkan; do
    echo "== train digits_mlp --backend $b"
    start=$(date +%s.%N)
    $M train models/digits_mlp.mgn --data data/digits_train.safetensors --eval-data data/digits_test.safetensors \
        --epochs 20 --lr 0.003 --quiet --backend "$b" --save "$OUT/mlp_$b.safetensors" 2>&1 | tail -2
    summary+=("$(printf '%-44s %.1f s' "digits_mlp 20 epochs --backend $b" "$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$(date +%s.%N)")")")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
