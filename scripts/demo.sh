#!/usr/bin/env bash
# The main job, as far as the project goes today: build mgnc, check every model and stdlib
# module, and show what the compiler makes of the digits MLP (its graph IR) and of each model
# (parameters, operations, build time). Training on real data arrives with the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
cargo build --release --quiet --bin mgnc
mgnc=target/release/mgnc

echo "== mgnc check models/ stdlib/"
$mgnc check models/*.mgn stdlib/*.mgn

echo
echo "== mgnc build models/digits_mlp.mgn --emit ir"
$mgnc build models/digits_mlp.mgn --emit ir

echo
echo "== mgnc build (summary) for every model"
for f in models/*.mgn; do
    $mgnc build "$f"
done

echo
echo "== the one-token graph of the Llama-style model: --set T=1"
$mgnc build models/tiny_llama.mgn --set T=1
