#!/usr/bin/env bash
# The main job: build mgnc, train the digits models from models/ on real data (the UCI
# handwritten digits in data/), save checkpoints, load each into a fresh inference plan and
# report its test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
cargo build --release --quiet --bin mgnc
mgnc=target/release/mgnc
out=${MGN_OUT:-target/demo}
mkdir -p "$out"

echo "== check every model and stdlib module"
$mgnc check models/*.mgn stdlib/*.mgn

train_and_eval() {
    local name=$1; shift
    echo
    echo "== train models/$name.mgn"
    $mgnc train "models/$name.mgn" --data data/digits_train.safetensors --eval-data data/digits_test.safetensors \
        --save "$out/$name.safetensors" --quiet "$@"
    echo "== fresh inference plan from the checkpoint"
    $mgnc build "models/$name.mgn" --mode infer -o "$out/$name.mgnplan"
    $mgnc eval "$out/$name.mgnplan" --weights "$out/$name.safetensors" --data data/digits_test.safetensors
}

train_and_eval digits_mlp --epochs 20 --lr 0.003
train_and_eval digits_cnn --epochs 10 --lr 0.003

echo
echo "== an app embedding the plan and checkpoint with the runtime crate alone (runtime/examples/embed.rs)"
cargo run --release --quiet -p mgn-runtime --example embed -- \
    "$out/digits_mlp.mgnplan" "$out/digits_mlp.safetensors" tests/fixtures/digits_mlp/inputs.safetensors

echo
echo "== what the compiler makes of the other models"
for f in models/*.mgn; do
    $mgnc build "$f"
done
