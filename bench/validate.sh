#!/usr/bin/env bash
# Every workload of issue 5 against its PyTorch reference, through `mgnc run` exactly as a user
# runs it: bench/reference.py writes weights, inputs and expected results; `mgnc run --weights
# --inputs --grads` computes ours; bench/compare.py applies the forward and backward gates.
#
#   bench/validate.sh [NAME ...]
#
# NAME: smollm2_135m whisper_tiny_encoder resnet50 sd_unet_tiny smolvla_expert minilm_l6
# minilm_l6_pretrained (the real all-MiniLM-L6-v2 weights; inference only), and the upstream
# architectures whose state_dicts load unchanged: vit_b_16 gpt2 mobilenet_v3_small. Default: all ten.
# Environment:
#   PYTHON   the Python with torch, transformers, torchvision, safetensors, numpy (python3)
#   MGNC     the mgnc binary (default target/release/mgnc, built with cargo when missing)
#   BACKEND  mgnc's backend (cpu)
#   REWRITES mgnc's graph rewrites (greedy; egglog needs an mgnc built with --features egglog)
#   PRECISION mgnc's precision policy (f32; mixed or mixed-bf16 are judged against the same f32
#            references by the same gates)
#   MODES    the modes to check (eval train); the pretrained check runs in eval only
#   OUT      where the files go (bench/out), one folder per NAME/MODE
#   DEVICE   the reference's torch device (default: cuda when available)
#   FULL     1: every workload at its full default shape (for a GPU backend, or a patient CPU)
#   GRADS    0: forward only — `mgnc run` without --grads, and only the forward gates (for a
#            device whose binding cannot hold parameters and gradients together: all-MiniLM's
#            91 MB of weights and as much of gradients on lavapipe's 128 MiB)
# Shapes: reduced where the full one is too slow for a CPU run of mgnc (see settings() below);
# the same --set values go to reference.py and to mgnc. Exit status 0 when every run passes.

set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
BACKEND=${BACKEND:-cpu}
REWRITES=${REWRITES:-greedy}
PRECISION=${PRECISION:-f32}
MODES=${MODES:-eval train}
OUT=${OUT:-bench/out}
if [ -z "${MGNC:-}" ]; then
    MGNC=target/release/mgnc
    if [ ! -x "$MGNC" ]; then
        echo "building mgnc (release)…"
        cargo build --release -p mgnc || exit 2
    fi
fi
grads=(--grads)
forward_only=()
if [ "${GRADS:-1}" = 0 ]; then
    grads=()
    forward_only=(--forward-only)
fi
DEVICE_ARGS=()
if [ -n "${DEVICE:-}" ]; then DEVICE_ARGS=(--device "$DEVICE"); fi

# NAME -> the --set values for both sides (full shapes for SmolLM2 at T=16, MiniLM, SmolVLA).
settings() {
    if [ "${FULL:-0}" = 1 ]; then
        case "$1" in
            minilm_l6 | minilm_l6_pretrained) echo "hidden_dropout=0.0" ;;
            smollm2_135m | whisper_tiny_encoder | resnet50 | sd_unet_tiny | smolvla_expert) echo "" ;;
            vit_b_16) echo "" ;;
            gpt2) echo "pdrop=0.0" ;;
            mobilenet_v3_small) echo "dropout=0.0" ;;
            *) return 1 ;;
        esac
        return 0
    fi
    case "$1" in
        smollm2_135m) echo "T=16" ;;
        whisper_tiny_encoder) echo "frames=300" ;;
        resnet50) echo "B=2 size=64" ;;
        sd_unet_tiny) echo "B=1" ;;
        smolvla_expert) echo "" ;;
        minilm_l6 | minilm_l6_pretrained) echo "hidden_dropout=0.0" ;;
        vit_b_16) echo "B=2 size=64 n_layers=2" ;;
        gpt2) echo "T=16 n_layers=2 pdrop=0.0" ;;
        mobilenet_v3_small) echo "B=2 size=64 dropout=0.0" ;;
        *) return 1 ;;
    esac
}

ALL=(smollm2_135m whisper_tiny_encoder resnet50 sd_unet_tiny smolvla_expert minilm_l6 minilm_l6_pretrained
    vit_b_16 gpt2 mobilenet_v3_small)
NAMES=("$@")
if [ ${#NAMES[@]} -eq 0 ]; then NAMES=("${ALL[@]}"); fi

declare -a RESULTS=()
failed=0
for name in "${NAMES[@]}"; do
    if ! settings "$name" >/dev/null; then
        echo "error: unknown workload '$name' (known: ${ALL[*]})" >&2
        exit 2
    fi
    model=$name
    ref_extra=()
    modes=$MODES
    if [ "$name" = minilm_l6_pretrained ]; then
        model=minilm_l6
        ref_extra=(--pretrained)
        modes=eval
    fi
    sets=()
    for kv in $(settings "$name"); do sets+=(--set "$kv"); done
    for mode in $modes; do
        dir="$OUT/$name/$mode"
        mkdir -p "$dir"
        echo "=== $name ($mode) ${sets[*]:-}"
        status=PASS
        t0=$(date +%s)
        if ! "$PY" bench/reference.py "$model" --out "$dir" --mode "$mode" "${sets[@]}" "${ref_extra[@]}" \
                "${DEVICE_ARGS[@]}" >"$dir/reference.log" 2>&1; then
            status=REF-ERROR
            tail -20 "$dir/reference.log"
        else
            tail -8 "$dir/reference.log"
        fi
        t1=$(date +%s)
        if [ "$status" = PASS ]; then
            if ! "$MGNC" run "models/$model.mgn" --weights "$dir/weights.safetensors" --inputs "$dir/inputs.safetensors" \
                    --out "$dir/actual.safetensors" "${grads[@]}" --mode "$mode" --backend "$BACKEND" "${sets[@]}" \
                    --rewrites "$REWRITES" --precision "$PRECISION" >"$dir/mgnc.log" 2>&1; then
                status=MGNC-ERROR
                tail -20 "$dir/mgnc.log"
            fi
        fi
        t2=$(date +%s)
        if [ "$status" = PASS ]; then
            "$PY" bench/compare.py "$dir/expected.safetensors" "$dir/actual.safetensors" --name "$name ($mode)" \
                --json "$dir/verdict.json" --meta "$dir/meta.json" "${forward_only[@]}" | tee "$dir/compare.log"
            rc=${PIPESTATUS[0]}
            if [ "$rc" -eq 1 ]; then status=FAIL; elif [ "$rc" -ne 0 ]; then status=COMPARE-ERROR; fi
        fi
        [ "$status" = PASS ] || failed=1
        RESULTS+=("$name|$mode|$status|$((t1 - t0))|$((t2 - t1))|$dir")
    done
done

echo
echo "=== summary (backend $BACKEND)"
printf '%s\n' "${RESULTS[@]}" | "$PY" -c '
import json, os, sys
rows = [("workload", "mode", "forward", "loss", "grad norm", "grad vector", "min cosine", "ref s", "mgnc s", "verdict")]
for line in sys.stdin.read().split("\n"):
    if not line.strip():
        continue
    name, mode, status, tref, tmg, d = line.split("|")
    cells = ["-"] * 5
    path = os.path.join(d, "verdict.json")
    if status in ("PASS", "FAIL") and os.path.exists(path):
        v = json.load(open(path))
        def val(pred):
            xs = [g["value"] for g in v["gates"] if pred(g["gate"])]
            xs = [float(x) for x in xs]
            return max(xs) if xs else None
        fwd = val(lambda g: g.startswith("forward"))
        cells = [f"{fwd:.2e}" if fwd is not None else "-"]
        for key in ("loss rel err", "grad total-norm rel err", "grad norm-vector rel err"):
            x = val(lambda g, key=key: g == key)
            cells.append(f"{x:.2e}" if x is not None else "-")
        c = [float(g["value"]) for g in v["gates"] if g["gate"] == "grad min cosine"]
        cells.append(f"{c[0]:.5f}" if c else "-")
    rows.append((name, mode, *cells, tref, tmg, status))
w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
for r in rows:
    print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
'
if [ "$failed" -ne 0 ]; then
    echo "some workloads failed"
    exit 1
fi
echo "all workloads pass"
