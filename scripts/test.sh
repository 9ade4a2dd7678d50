#!/usr/bin/env bash
# The whole test suite: unit tests of every crate, golden diagnostics, valid programs, the CLI,
# the parser/checker fuzz tests, and the GPU tests (on lavapipe where installed: `apt-get install
# mesa-vulkan-drivers libvulkan1`) once more under MGN_MIN_SPEC=1 (kernels and whole models). Ends
# with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
# The GPU tests again, with every device limit at Vulkan's guaranteed floor.
MGN_MIN_SPEC=1 cargo test -p mgn-runtime --locked gpu:: 2>&1 | tee -a "$log" || status=$?
MGN_MIN_SPEC=1 cargo test -p mgn-tests --locked --test gpu --test workloads 2>&1 | tee -a "$log" || status=$?
passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s += $1} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
echo
echo "$passed passed, $failed failed"
exit "$status"
