#!/usr/bin/env bash
# The products' kernels side by side on one GPU, in one command: `matmul_throughput` (the mgn-gpu
# test binary's ignored benchmark; each product's own GPU time, MGN_PROFILE=1) for the f32 tiled
# kernel and for the cooperative-matrix kernel at each grid, then one table (µs / TFLOP/s) and,
# with STATS=1, the driver's registers and code size of each grid's kernels
# (MGN_PIPELINE_STATS=1; timed apart, as capture mode changes the code).
#
#   GPUTESTS=.dev/gputests bench/coop_sweep.sh
#
# Environment:
#   GPUTESTS  the mgn-gpu test binary (default: built here with cargo, the path cargo reports)
#   GRIDS     MGN_COOP_GRID values ("default 2x2:2x2:2 2x4:2x2:2 4x2:2x4:2";
#             "default" is the kernel's own choice)
#   DTYPE     the operands: rounded (an activation cast by the mixed policy and a weight held as
#             halves, as an inference plan's products; default), rounded-both (two activations
#             read through rounded views, as a training plan's products) or f16 (both halves)
#   SHAPES    MGN_MM_ONLY (default: the workloads' products and 2048², 4096²)
#   STATS     1: also the pipeline statistics of each grid
#   OUT       where the raw lines and the table go (bench/out/coop_sweep)
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/coop_sweep}
mkdir -p "$OUT"
: > "$OUT/sweep.txt"
GRIDS=${GRIDS:-default 2x2:2x2:2 2x4:2x2:2 4x2:2x4:2}
DTYPE=${DTYPE:-rounded}
SHAPES=${SHAPES:-whisper,square 2048,square 4096,minilm fc1,smollm2 up}
if [ -z "${GPUTESTS:-}" ]; then
    GPUTESTS=$(cargo test --release -p mgn-gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | head -1)
fi

# label, then the variables of its run
sweep() {
    local label=$1
    shift
    env MGN_PROFILE=1 MGN_MM_ONLY="$SHAPES" "$@" "$GPUTESTS" matmul_throughput --ignored \
        --nocapture --test-threads 1 2>&1 | grep -o "matmul  *[a-z].*TFLOP.*" |
        sed "s|^|$label |" >> "$OUT/sweep.txt" || echo "$label: no result" >&2
}
# the MGN_COOP_GRID assignment for a grid ("default": none)
grid_env() { [ "$1" = default ] && echo "MGN_COOP=1" || echo "MGN_COOP=1 MGN_COOP_GRID=$1"; }

sweep f32
for g in $GRIDS; do
    # shellcheck disable=SC2046
    sweep "$g" MGN_MM_DTYPE="$DTYPE" $(grid_env "$g")
done
python3 - "$OUT/sweep.txt" <<'PY' | tee "$OUT/table.md"
import collections, re, sys
rows, labels = collections.OrderedDict(), []
for line in open(sys.argv[1]):
    label, rest = line.split(' ', 1)
    m = re.match(r'matmul\s+(.+?) \[.*?:\s+([\d.]+) µs,\s+([\d.]+) TFLOP', rest)
    if not m:
        continue
    if label not in labels:
        labels.append(label)
    rows.setdefault(m.group(1), {})[label] = (float(m.group(2)), float(m.group(3)))
print('| product | ' + ' | '.join(labels) + ' |')
print('|---' * (len(labels) + 1) + '|')
for name, cells in rows.items():
    each = (f'{cells[t][0]:,.0f} / {cells[t][1]:.1f}' if t in cells else '—' for t in labels)
    print(f'| {name} | ' + ' | '.join(each) + ' |')
PY
if [ "${STATS:-0}" = 1 ]; then
    echo
    for g in $GRIDS; do
        # shellcheck disable=SC2046
        env MGN_PIPELINE_STATS=1 MGN_MM_ONLY="$SHAPES" MGN_MM_DTYPE="$DTYPE" $(grid_env "$g") \
            "$GPUTESTS" matmul_throughput --ignored --nocapture --test-threads 1 2>&1 |
            grep -o "Register Count=[0-9]*, Binary Size=[0-9]*" | sort -u | sed "s|^|$g: |"
    done | tee "$OUT/stats.txt"
fi
