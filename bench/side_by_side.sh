#!/usr/bin/env bash
# mgnc on the GPU next to PyTorch on the same card, same workloads and shapes, one command:
# for each workload `mgnc bench --backend vulkan --json` and bench/torch_bench.py, then
# bench/table.py writes the Markdown table to $OUT/benchmarks.md and prints it.
#
#   bench/side_by_side.sh [NAME ...]
#
# NAME: a model in models/ (default: the six workloads — smollm2_135m whisper_tiny_encoder resnet50
# sd_unet_tiny smolvla_expert minilm_l6). Meant for the GPU machine, which has no Rust
# toolchain: it runs a prebuilt mgnc (`cargo build --release -p mgnc` elsewhere, copy the binary).
# Environment:
#   MGNC      the mgnc binary (default target/release/mgnc)
#   PYTHON    the Python with torch, transformers, torchvision (python3)
#   OUT       where the JSON, the logs and benchmarks.md go (bench/out/side_by_side)
#   BACKEND   mgnc's backend (vulkan)
#   TORCH     0: skip PyTorch (checks the mgnc half and the table on a machine without torch)
#   COMPILE   workloads also measured through torch.compile, e.g. "whisper_tiny_encoder resnet50",
#             or "all"; none by default (minutes per model: see docs/BENCHMARKS.md)
#   WARMUP, SAMPLES   per measurement, both sides (5, 20)
#   SET_<NAME>        model arguments for both sides, e.g. SET_smollm2_135m="T=64"
#   STEP_TIMEOUT      seconds one side of one workload may take (300)
#   PROFILE   1 (default): mgnc also reports GPU time per op family (`mgnc bench --profile`)
#   PEAK_TFLOPS, PEAK_TBPS   the card's f32 rate and copy rate (an H200: 67 and 4.3): with the
#             profile, each op family's floor, and the table gets a roofline section
#   REVISION  the source revision the mgnc binary was built from (default: git rev-parse here)
#   PRECISION mgnc's precision policy (f32; mixed, mixed-bf16)
#   TORCH_PRECISION  PyTorch's: f32 (strict), tf32, bf16 or f16 (autocast; f16 trains with
#             GradScaler); by default the one matching PRECISION (f32, f16, bf16). To set mixed
#             mode against both autocast and TF32, run twice into two OUTs, the second with
#             MGNC_FROM set to the first.
#   MGNC_FROM a folder of an earlier run: its NAME.mgnc.json is used instead of running mgnc
#             again (the same binary and PRECISION against another TORCH_PRECISION)
# Time: see docs/BENCHMARKS.md. A second run into the same OUT adds its workloads to the table, so a
# long set can be split over two commands:  bench/side_by_side.sh smollm2_135m whisper_tiny_encoder;
# bench/side_by_side.sh resnet50 sd_unet_tiny
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
MGNC=${MGNC:-target/release/mgnc}
OUT=${OUT:-bench/out/side_by_side}
BACKEND=${BACKEND:-vulkan}
TORCH=${TORCH:-1}
COMPILE=${COMPILE:-}
WARMUP=${WARMUP:-5}
SAMPLES=${SAMPLES:-20}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
PRECISION=${PRECISION:-f32}
case "$PRECISION" in
    mixed|mixed-f16) default_torch=f16 ;;
    mixed-bf16) default_torch=bf16 ;;
    *) default_torch=f32 ;;
esac
TORCH_PRECISION=${TORCH_PRECISION:-$default_torch}
export PRECISION TORCH_PRECISION
NAMES=("$@")
# shellcheck source=bench/common.sh
. bench/common.sh
if [ ${#NAMES[@]} -eq 0 ]; then NAMES=("${WORKLOADS[@]}"); fi
check_inputs "$MGNC" "cargo build --release -p mgnc" "${NAMES[@]}"
mkdir -p "$OUT"
vulkan_loader

wants_compile() {
    local c
    for c in $COMPILE; do
        if [ "$c" = all ] || [ "$c" = "$1" ]; then return 0; fi
    done
    return 1
}

# One side of one workload: LABEL, its stderr LOG, then the command (run under STEP_TIMEOUT;
# stdout goes where the caller sends it). Says how long it took, or why it failed.
side() {
    local label=$1 log=$2 t0 rc=0
    shift 2
    t0=$(date +%s)
    timeout "$STEP_TIMEOUT" "$@" 2>"$log" || rc=$?
    if [ "$rc" = 0 ]; then
        echo "$label: $(($(date +%s) - t0)) s" >&2
        return 0
    fi
    if [ "$rc" = 124 ]; then echo "timed out after $STEP_TIMEOUT s (STEP_TIMEOUT)" >>"$log"; fi
    echo "$label failed on $name (exit $rc); the end of $log:" >&2
    tail -5 "$log" >&2
    return 1
}

start=$(date +%s)
for name in "${NAMES[@]}"; do
    mapfile -t sets < <(sets_of "$name")
    echo "=== $name ${sets[*]:-}" >&2
    profile=()
    if [ "${PROFILE:-1}" = 1 ] && [ "$BACKEND" != cpu ]; then
        profile=(--profile)
        if [ -n "${PEAK_TFLOPS:-}" ] && [ -n "${PEAK_TBPS:-}" ]; then
            profile+=(--peak-tflops "$PEAK_TFLOPS" --peak-tbps "$PEAK_TBPS")
        fi
    fi
    if [ -n "${MGNC_FROM:-}" ] && [ -f "$MGNC_FROM/$name.mgnc.json" ]; then
        if [ "$MGNC_FROM" != "$OUT" ]; then cp "$MGNC_FROM/$name.mgnc.json" "$OUT/$name.mgnc.json"; fi
    else
        side mgnc "$OUT/$name.mgnc.log" "$MGNC" bench "models/$name.mgn" --backend "$BACKEND" --json --warmup "$WARMUP" \
            --samples "$SAMPLES" --precision "$PRECISION" "${sets[@]}" "${profile[@]}" >"$OUT/$name.mgnc.json" \
            || rm -f "$OUT/$name.mgnc.json"
    fi
    if [ "$TORCH" = 0 ]; then continue; fi
    # The minimal shape mgnc measured (or that it measured none), so both sides agree.
    minimal=()
    if [ -f "$OUT/$name.mgnc.json" ]; then
        mapfile -t minimal < <("$PY" -c '
import json, sys
m = json.load(open(sys.argv[1]))["measurements"]["forward_minimal"]
if m is None:
    print("--no-minimal")
else:
    for k, v in m["settings"].items():
        print("--minimal")
        print(f"{k}={v}")
' "$OUT/$name.mgnc.json")
    fi
    compile=()
    if wants_compile "$name"; then compile=(--compile "$name"); fi
    side torch "$OUT/$name.torch.log" "$PY" bench/torch_bench.py "$name" --warmup "$WARMUP" --samples "$SAMPLES" \
        --precision "$TORCH_PRECISION" --out "$OUT/$name.torch.json" "${sets[@]}" "${minimal[@]}" "${compile[@]}" \
        >/dev/null
done
echo "all workloads: $(($(date +%s) - start)) s" >&2

# What the table's header records.
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
# The source revision: REVISION when given (a copied tree's git metadata can be stale), else git.
revision=${REVISION:-$(git rev-parse --short HEAD 2>/dev/null)}
mgnc_version=$("$MGNC" --version 2>/dev/null)
torch_info="skipped"
if [ "$TORCH" != 0 ]; then
    torch_info=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA", sep="|")' 2>/dev/null || echo "unavailable")
fi
peaks=""
if [ -n "${PEAK_TFLOPS:-}" ] && [ -n "${PEAK_TBPS:-}" ]; then peaks="$PEAK_TFLOPS TFLOP/s, $PEAK_TBPS TB/s"; fi
"$PY" - "$OUT" "$driver" "$revision" "$mgnc_version" "$torch_info" "$COMPILE" "$SAMPLES" "$WARMUP" "$peaks" "${NAMES[@]}" <<'EOF'
import json, os, sys, time
out, driver, revision, mgnc_version, torch_info, compile_, samples, warmup, peaks, *names = sys.argv[1:]
# A second run into the same OUT (the GPU machine allows 10 minutes a command) adds its workloads.
try:
    old = json.load(open(os.path.join(out, "env.json")))
except (OSError, ValueError):
    old = {}
names = [n for n in old.get("workloads", []) if n not in names] + names
compile_ = " ".join(dict.fromkeys(((old.get("compile") or "") + " " + compile_).split()))
env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "workloads": names, "driver": driver or None,
       "precision": os.environ.get("PRECISION", "f32"), "torch_precision": os.environ.get("TORCH_PRECISION"),
       "revision": revision or None, "mgnc_version": mgnc_version or None, "compile": compile_ or None,
       "samples": f"{warmup} warm-ups, {samples} timed", "peaks": peaks or old.get("peaks")}
if torch_info == "skipped":
    env["torch"] = "skipped"
elif "|" in torch_info:
    version, cuda, device = torch_info.split("|", 2)
    env["torch_version"] = f"{version} (CUDA {cuda})"
    env["torch_device"] = device
else:
    env["torch_version"] = torch_info
for n in names:  # the device mgnc ran on, from the first report that names it
    try:
        m = json.load(open(os.path.join(out, f"{n}.mgnc.json")))
        env["mgnc_device"] = f"{m['device']} (backend {m['backend']}, {m['build']} build)"
        break
    except (OSError, ValueError, KeyError):
        pass
json.dump(env, open(os.path.join(out, "env.json"), "w"), indent=1)
EOF
"$PY" bench/table.py "$OUT" --out "$OUT/benchmarks.md"
