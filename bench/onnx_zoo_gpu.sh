#!/usr/bin/env bash
# On the lent GPU machine (no Rust there; mgnc built here and carried in .dev/, the Vulkan loader
# and glvnd debs in .gl/, as bench/README.md's recipe says): the zoo models whose arena
# lavapipe cannot bind (ViT-B/16, GPT-2, SmolLM2; Whisper's encoder too), exported there with
# its PyTorch, imported and run with mgnc on Vulkan and on the CPU, against onnxruntime.
# Writes $OUT/zoo.txt (bench/onnx_zoo.py validate's table).
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
python -c "import torch, torchvision, transformers, onnx, onnxruntime, onnxscript, safetensors; print('packages ok')" 2>&1 | tail -1
.dev/mgnc info 2>&1 | head -3
mkdir -p /tmp/zoo
timeout 300 python bench/onnx_zoo.py export /tmp/zoo vit_b_16 gpt2 whisper_tiny_encoder smollm2_135m 2>&1 | grep -E "^[a-z_0-9]+: |Error|error" | tail -8
MGNC=.dev/mgnc timeout 200 python bench/onnx_zoo.py validate /tmp/zoo vit_b_16 gpt2 whisper_tiny_encoder smollm2_135m > $OUT/zoo.txt 2>&1
tail -8 $OUT/zoo.txt
