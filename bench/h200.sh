#!/usr/bin/env bash
# Everything the lent H200 machine is for, in one command (it has CUDA, PyTorch and no Rust):
#   1. the GPU test suite (bench/gpu_check.sh: kernel and whole-model tests, also under
#      MGN_MIN_SPEC=1, and the digits MLP trained on the CPU and on Vulkan);
#   2. every workload against PyTorch at full shape through `mgnc run --backend vulkan`
#      (bench/validate.sh), in parallel with 1 — both are correctness, not timing;
#   3. the tiny-shape PyTorch fixtures CI checks on lavapipe (bench/make_fixtures.sh, on the CPU);
#   4. then, alone on the GPU, the side-by-side benchmark (bench/side_by_side.sh).
# Prepare here first: `bench/gpu_check.sh --prepare` (mgnc and the test binaries into .dev/) and
# the Vulkan loader .debs into .gl/ (see docs/BENCHMARKS.md). Results go to $OUT (default
# bench/out/h200); each part's log is kept, and a summary is printed last. After each part
# the logs are also packed into $OUT/../h200.tgz (and the fixtures into $OUT/../fixtures.tgz):
# the device tool returns a limited number of files, and a run cut short by its time limit
# keeps what the finished parts wrote.
# Environment: SAMPLES, WARMUP (bench; 20, 5), COMPILE (torch.compile workloads, none by default),
# PARTS (default "tests validate fixtures bench"; "throughput" adds the kernel sweeps), VALIDATE (workloads to validate; default all),
# VALIDATE_TIMEOUT (seconds, default 1800), BENCH (workloads to benchmark; default side_by_side's).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/h200}
mkdir -p "$OUT"
PARTS=${PARTS:-tests validate fixtures bench}
has() { [[ " $PARTS " == *" $1 "* ]]; }
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export MGNC=${MGNC:-.dev/mgnc}
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
# The device tool returns at most 8 files of 16 MiB: logs, tables and verdicts go into one
# archive (not the validation's weights and gradients, hundreds of MB), the fixtures into another.
pack() {
    tar czf "$OUT/../h200.tgz.part" --exclude='*.safetensors' --exclude=./fixtures -C "$OUT" . 2>/dev/null && mv "$OUT/../h200.tgz.part" "$OUT/../h200.tgz"
    if [ -d "$OUT/fixtures" ]; then tar czf "$OUT/../fixtures.tgz" -C "$OUT" fixtures; fi
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>/dev/null
    "$MGNC" --version
    "$MGNC" info
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

pids=()
if has validate; then
    stamp "validate (background)"
    # shellcheck disable=SC2086
    (OUT="$OUT/validate" BACKEND=vulkan FULL=1 timeout "${VALIDATE_TIMEOUT:-1800}" bench/validate.sh ${VALIDATE:-} >"$OUT/validate.log" 2>&1) &
    pids+=($!)
fi
if has fixtures; then
    stamp "fixtures (background, CPU)"
    (DEVICE=cpu OMP_NUM_THREADS=4 nice bench/make_fixtures.sh "$OUT/fixtures" >"$OUT/fixtures.log" 2>&1) &
    pids+=($!)
fi
if has tests; then
    stamp "tests"
    OUT="$OUT/tests" bash -c 'mkdir -p "$OUT"; bench/gpu_check.sh' >"$OUT/tests.log" 2>&1
    pack
fi
for p in "${pids[@]}"; do wait "$p"; done
pack
if has throughput; then
    # Kernel throughput sweeps (ignored tests): the matmul shapes and ResNet-50's convolutions
    # with each tile, the data the tile choosers are tuned by.
    stamp "throughput"
    timeout 300 .dev/tests/mgngpu_lib throughput --ignored --nocapture --test-threads 1 >"$OUT/throughput.log" 2>&1
    pack
fi
if has bench; then
    stamp "bench"
    # shellcheck disable=SC2086
    OUT="$OUT/bench" bench/side_by_side.sh ${BENCH:-} >"$OUT/bench.log" 2>&1
    pack
fi
stamp "done"
echo "== tests";    sed -n '/== summary/,$p' "$OUT/tests.log" 2>/dev/null
echo "== validate"; sed -n '/=== summary/,$p' "$OUT/validate.log" 2>/dev/null
echo "== fixtures"; tail -3 "$OUT/fixtures.log" 2>/dev/null
echo "== throughput"; grep -cE "^(conv|matmul) " "$OUT/throughput.log" 2>/dev/null
echo "== bench";    cat "$OUT/bench/benchmarks.md" 2>/dev/null | head -60
