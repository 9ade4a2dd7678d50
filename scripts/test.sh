#!/usr/bin/env bash
# The whole test suite: unit tests of every crate, golden diagnostics, valid programs, the CLI
# and the parser/checker fuzz tests.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "error: cargo not found; install Rust from https://rustup.rs" >&2; exit 1; }
cargo test --workspace --locked "$@"
