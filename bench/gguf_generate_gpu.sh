#!/usr/bin/env bash
# On the lent GPU machine: the real SmolLM2 GGUF (98 MB) imported and generating text on Vulkan
# and on the CPU. A carry holds 64 MiB with the working tree, so the file goes in three parts,
# each call within the machine's idle window: (1) carry .dev/ holding mgnc and gguf.a (bytes
# 0–30,000,000), run `mkdir -p /tmp/p && cp .dev/mgnc .dev/gguf.a /tmp/p/`; (2) carry .dev2/
# with gguf.b (the next 55,000,000), run `cp .dev2/gguf.b /tmp/p/`; (3) carry .dev3/ with
# gguf.c (the rest) and this script, run it. Writes $OUT/gen.txt.
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
M=/tmp/p/mgnc
cat /tmp/p/gguf.a /tmp/p/gguf.b .dev3/gguf.c > /tmp/s.gguf && sha256sum /tmp/s.gguf | cut -c1-16
cd /tmp && $M import s.gguf -o s.mgn 2>&1 | head -2
for b in vulkan cpu; do
  echo "== $b"
  $M generate s.mgn --weights s.safetensors --tokenizer s.tokenizer.json \
    --prompt "What is the capital of France?" --chat --tokens 48 --backend $b 2>&1 | tail -4
  $M generate s.mgn --weights s.safetensors --tokenizer s.tokenizer.json \
    --prompt "Write a haiku about the sea." --chat --tokens 64 --backend $b 2>&1 | tail -6
done 2>&1 | tee $OUT/gen.txt
