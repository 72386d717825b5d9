#!/usr/bin/env bash
# Unpack the repository's golden data (tests/data/golden: one .tar.xz per set, or per few sets that share bytes)
# into DEST (default build/golden) and check every file against
# MANIFEST.sha256. Files stored once elsewhere in the tree are put back in
# place: the real Qwen3 tokenizer (tests/data/qwen3-tokenizer) is used by the
# qwen3-tokenizer and klein-tiny sets. Re-unpacks only when the data changed.
# Prints one "ok - " or "FAIL - " line; exits non-zero on failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/tests/data/golden
dest=${1:-$root/build/golden}
stamp=$dest/.unpacked
if [ -f "$stamp" ] && [ -s "$root/tests/data/qwen3-tokenizer/tokenizer.json" ] &&
    [ -z "$(find "$src" "$root/tests/data/qwen3-tokenizer" -newer "$stamp" -type f | head -1)" ]; then
    echo "ok - golden data in $dest is current"
    exit 0
fi
fail() { echo "FAIL - golden data: $*"; exit 1; }
command -v xz >/dev/null || fail "xz is not installed (scripts/install-deps.sh installs xz-utils)"
# the Qwen3 tokenizer.json is stored xz-compressed (`make` unpacks it too)
tok=$root/tests/data/qwen3-tokenizer/tokenizer.json
if [ ! -s "$tok" ] || [ "$tok.xz" -nt "$tok" ]; then
    xz -dc "$tok.xz" > "$tok.tmp" && mv "$tok.tmp" "$tok" || fail "cannot unpack $tok.xz"
fi
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
for t in "$src"/*.tar.xz; do
    xz -dc "$t" | tar -xf - -C "$dest.tmp" || fail "cannot unpack $t"
done
xz -dc "$src/randn.safetensors.xz" > "$dest.tmp/randn.safetensors" || fail "cannot unpack randn.safetensors.xz"
xz -dc "$src/randn-torch2.safetensors.xz" > "$dest.tmp/randn-torch2.safetensors" || fail "cannot unpack randn-torch2.safetensors.xz"
cp "$src/schedules.json" "$dest.tmp/"
for d in qwen3-tokenizer klein-tiny/model/tokenizer; do
    mkdir -p "$dest.tmp/$d"
    cp "$root/tests/data/qwen3-tokenizer/tokenizer.json" "$root/tests/data/qwen3-tokenizer/tokenizer_config.json" "$dest.tmp/$d/"
done
chmod -R a-w "$dest.tmp"/* # read-only, as the upstream golden folder is: tests must not write into it
(cd "$dest.tmp" && sha256sum --quiet -c "$src/MANIFEST.sha256") || fail "a file differs from tests/data/golden/MANIFEST.sha256"
n=$(wc -l < "$src/MANIFEST.sha256")
extra=$(cd "$dest.tmp" && find . -type f | wc -l)
[ "$extra" -eq "$n" ] || fail "$extra files unpacked, MANIFEST.sha256 lists $n"
if [ -d "$dest" ]; then chmod -R u+w "$dest"; rm -rf "$dest"; fi
mv "$dest.tmp" "$dest"
touch "$stamp"
echo "ok - golden data: $n files unpacked into $dest and checked against MANIFEST.sha256"
