#!/usr/bin/env bash
# The GPU part of the test suite on a GPU machine without a Rust toolchain: build here with
#   cargo build --release -p mgnc && cargo test --release -p mgn-runtime --no-run
# copy target/release/mgnc and the mgn-runtime test binary (path printed by --no-run) to .dev/
# as .dev/mgnc and .dev/runtime_tests, and Debian's libvulkan1 .deb to .gl/, then run this there.
# It prints device info, runs the GPU kernel tests (normal and MGN_MIN_SPEC=1), and trains the
# digits MLP on the CPU and on Vulkan. Results go to $OUT when set.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
M=.dev/mgnc
OUT=${OUT:-/tmp}
echo "== mgnc info"; $M info
echo "== GPU kernel tests"; MGN_REQUIRE_GPU=1 .dev/runtime_tests gpu:: 2>&1 | tail -4
echo "== GPU kernel tests, MGN_MIN_SPEC=1"; MGN_REQUIRE_GPU=1 MGN_MIN_SPEC=1 .dev/runtime_tests gpu:: 2>&1 | tail -3
for b in cpu vulkan; do
    echo "== train digits_mlp --backend $b"
    $M train models/digits_mlp.mgn --data data/digits_train.safetensors --eval-data data/digits_test.safetensors \
        --epochs 20 --lr 0.003 --quiet --backend "$b" --save "$OUT/mlp_$b.safetensors" 2>&1 | tail -3
done
