#!/usr/bin/env bash
# Tiny-shape PyTorch reference fixtures for CI (tests/workloads.rs): for every workload with
# width arguments and both modes, bench/reference.py at the settings below writes weights,
# inputs, expected results (outputs, loss, every gradient) and meta.json into
# OUTDIR/MODEL/MODE/, and OUTDIR/MODEL/settings.txt records the --set values the test passes to
# the compiler. Run once on a machine with torch and commit the folder; CI has no torch.
#
#   bench/make_fixtures.sh [OUTDIR]        (default tests/fixtures/workloads)
#
# Environment: PYTHON (python3) with torch, transformers, safetensors and numpy; DEVICE (cpu: the
# shapes are tiny, and the CPU is the more reproducible reference); SEED (0).
# resnet50 is not here: it has no width arguments, and its 25.6M parameters (100 MB of weights,
# as much again of gradients) cannot be a committed fixture; bench/validate.sh checks it.

set -euo pipefail
cd "$(dirname "$0")/.."

OUTDIR=${1:-tests/fixtures/workloads}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cpu}
SEED=${SEED:-0}
LIMIT=$((1024 * 1024)) # bytes per MODEL/MODE folder

# The tiny settings, valid on both sides (the reasons are the constraints of reference.py's
# builders and the .mgn models):
#   smollm2_135m   heads % kv_heads == 0; head_dim even (RoPE); heads·head_dim need not be d.
#   whisper        frames = 2 · positions (HF checks the input length against
#                  max_source_positions · 2); d % heads == 0.
#   sd_unet_tiny   groups divides c0, c1, c2 and the skip concatenations (c2+c2, c2+c1, c1+c0,
#                  c0+c0); heads (diffusers' attention_head_dim) divides c0 and c1; c0 even
#                  (timestep sinusoid); c1 != c2 so the down path has a conv_shortcut; size
#                  divisible by 4 (two downsamplers).
#   smolvla        heads % kv_heads == 0; vlm_kv = kv_heads · head_dim (its default on both
#                  sides); d even (time sinusoid); n_layers 2 = one self-attention layer (with the
#                  cached prefix) and one cross-attention layer.
#   minilm_l6      d % heads == 0; T <= max_positions; hidden_dropout 0 as in validate.sh
#                  (the reference has no dropout).
settings() {
    case "$1" in
        smollm2_135m) echo "vocab=64 d=32 n_layers=2 heads=4 kv_heads=2 head_dim=8 hidden=48 B=2 T=8" ;;
        whisper_tiny_encoder) echo "B=2 n_mels=8 frames=16 d=32 heads=4 ffn=64 n_layers=2" ;;
        sd_unet_tiny) echo "B=2 size=8 c0=4 c1=8 c2=16 heads=2 groups=2 ctx_len=4 ctx_dim=8" ;;
        smolvla_expert) echo "B=2 chunk=4 action_dim=4 prefix=4 d=32 ffn=48 n_layers=2 heads=4 kv_heads=2 head_dim=8" ;;
        minilm_l6) echo "vocab=64 d=32 heads=4 ffn=64 n_layers=2 max_positions=16 hidden_dropout=0.0 B=2 T=8" ;;
        *) return 1 ;;
    esac
}
WORKLOADS=(smollm2_135m whisper_tiny_encoder sd_unet_tiny smolvla_expert minilm_l6)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for model in "${WORKLOADS[@]}"; do
    sets=()
    for kv in $(settings "$model"); do sets+=(--set "$kv"); done
    rm -rf "${OUTDIR:?}/$model"
    mkdir -p "$OUTDIR/$model"
    settings "$model" | tr ' ' '\n' >"$OUTDIR/$model/settings.txt"
    for mode in eval train; do
        dir="$OUTDIR/$model/$mode"
        if ! "$PY" bench/reference.py "$model" --out "$dir" --mode "$mode" --seed "$SEED" --device "$DEVICE" "${sets[@]}" >"$log" 2>&1; then
            cat "$log" >&2
            echo "error: reference.py $model ($mode) failed" >&2
            exit 1
        fi
        tail -1 "$log"
        size=$(du -sb "$dir" | cut -f1)
        if [ "$size" -gt "$LIMIT" ]; then
            echo "error: $dir is $size bytes, over the $LIMIT-byte budget of a committed fixture" >&2
            exit 1
        fi
    done
done
echo
du -sh "$OUTDIR"/*/* | sed 's/^/  /'
echo "fixtures written to $OUTDIR; check them with: cargo test -p mgn-tests --test workloads"
