#!/usr/bin/env bash
# The GPU tests whose products read f16 operands, run where those products take the
# cooperative-matrix kernels: on lavapipe from Mesa ≥ 25.1 (scripts/coop_lavapipe.sh). The
# kernel tests of half products and convolutions and the mixed-precision training tests, with
# MGN_COOP=1; MGN_COOP_ALL=1 adds every workload's mixed-precision plans against the CPU
# (tests/gpu.rs), which passes but takes about 20 minutes on two cores with a cold shader cache.
# Checks first that the device there offers cooperative matrices and that mgn uses them.
# Exits 77 when no such lavapipe can be set up here.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

# Test binaries built here (the chroot has no toolchain): the paths cargo reports.
binaries() {
    cargo test --locked --no-run --message-format=json "$@" 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}
cargo build --locked --bin mgnc
gpu_lib=$(binaries -p mgn-gpu --lib)
gpu_tests=$(binaries -p mgn-tests --test gpu)
mixed_tests=$(binaries -p mgn-tests --test mixed)
dynamic_tests=$(binaries -p mgn-tests --test dynamic)

info=$(bash scripts/coop_lavapipe.sh env MGN_COOP=1 target/debug/mgnc info) || exit $?
echo "scripts/coop_tests.sh: on the lavapipe of scripts/coop_lavapipe.sh:"
echo "$info" | grep -E "features|llvmpipe" | head -2
if ! echo "$info" | grep -qE "products .*use [0-9]+×[0-9]+ tiles"; then
    echo "error: the lavapipe in scripts/coop_lavapipe.sh offers no cooperative matrices mgn uses" >&2
    exit 1
fi
# That lavapipe compiles a cooperative-matrix kernel when it is first dispatched, 4-6 s each on
# two cores, so one submission of a plan with a hundred of them runs for minutes the first time.
run() {
    bash "$repo/scripts/coop_lavapipe.sh" env MGN_COOP=1 MGN_REQUIRE_GPU=1 MGN_GPU_TIMEOUT=1200 \
        MGN_SKIP_LOG="${MGN_SKIP_LOG:-/dev/null}" "$@"
}
status=0
# The kernels of half products and convolutions, and both measured both ways
# (the default, `MGN_COOP=measure`, which the test sets for itself).
(cd gpu && run "$gpu_lib" products_of convolutions_of_halves kernels_measured) || status=$?
# And as a plain run chooses them (MGN_COOP unset: every f16 product, convolutions on the
# tiled kernels).
(cd gpu && run env MGN_COOP= "$gpu_lib" products_of) || status=$?
(cd tests && run "$mixed_tests") || status=$?
# Mixed inference plans made for a range of sizes: their products take the tiles by default.
(cd tests && run env MGN_COOP= "$dynamic_tests" mixed_dynamic) || status=$?
if [ "${MGN_COOP_ALL:-0}" = 1 ]; then
    (cd tests && run "$gpu_tests" mixed) || status=$?
fi
exit $status
