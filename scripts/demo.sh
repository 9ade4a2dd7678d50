#!/usr/bin/env bash
# The main job: build mgnc, train the digits models from models/ on real data (the UCI
# handwritten digits in data/), save checkpoints, load each into a fresh inference plan and
# report its test accuracy. Each phase is announced before it starts and timed when it ends, so a
# cold build (several minutes on two cores) is never a silent wait.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }

started=$SECONDS
phase_name=
# A line before each phase starts; the previous phase's duration once it has ended.
phase() {
    [ -z "$phase_name" ] || echo "   ($phase_name: $((SECONDS - phase_start)) s)"
    phase_name=$1
    phase_start=$SECONDS
    echo
    echo "== $1"
}

phase "building mgnc (release; several minutes on a fresh 2-core machine, seconds when built)"
cargo build --release --bin mgnc
mgnc=target/release/mgnc
out=${MGN_OUT:-target/demo}
mkdir -p "$out"

phase "checking every model and stdlib module"
$mgnc check models/*.mgn stdlib/*.mgn

train_and_eval() {
    local name=$1; shift
    phase "training models/$name.mgn on data/digits_train.safetensors"
    $mgnc train "models/$name.mgn" --data data/digits_train.safetensors --eval-data data/digits_test.safetensors \
        --save "$out/$name.safetensors" --quiet "$@"
    phase "building a fresh inference plan and loading the checkpoint into it"
    $mgnc build "models/$name.mgn" --mode infer -o "$out/$name.mgnplan"
    $mgnc eval "$out/$name.mgnplan" --weights "$out/$name.safetensors" --data data/digits_test.safetensors
}

train_and_eval digits_mlp --epochs 20 --lr 0.003
train_and_eval digits_cnn --epochs 10 --lr 0.003

phase "building and running an app that embeds the plan with the runtime crate alone (runtime/examples/embed.rs; a few minutes the first time)"
cargo run --release -p mgn-runtime --example embed -- \
    "$out/digits_mlp.mgnplan" "$out/digits_mlp.safetensors" tests/fixtures/digits_mlp/inputs.safetensors

phase "what the compiler makes of the other models"
for f in models/*.mgn; do
    $mgnc build "$f"
done
echo "   ($phase_name: $((SECONDS - phase_start)) s)"
echo
echo "== done in $((SECONDS - started)) s; checkpoints and plans are in $out/"
