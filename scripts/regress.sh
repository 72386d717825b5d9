#!/usr/bin/env bash
# Seeded regression images: render every prompt x seed of a run spec and
# compare each PNG with the stored reference of the same name by PSNR.
#
#   scripts/regress.sh --model DIR --spec RUN.yaml --ref REFDIR [--out DIR]
#                      [--min-psnr DB] [--np N] [--update] [-- EXTRA TPGEN FLAGS]
#
# Images are written as OUT/{index:04}-{seed}.png (the spec's output key is
# overridden). --update stores the renders as the new references. Prints one
# line per image and fails (exit 1) when an image is missing or below
# --min-psnr (default 35 dB; identical images print "inf"). bf16 images
# rendered at a different --tp can differ by a few 8-bit levels (reduction
# order), so do not expect "inf" across TP degrees.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TPGEN=${TPGEN:-$ROOT/build/tpgen}
MODEL= SPEC= REF= OUT= MIN=35 NP=${NP:-2} UPDATE=0
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --spec) SPEC=$2; shift 2 ;;
    --ref) REF=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --min-psnr) MIN=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --update) UPDATE=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "regress.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$MODEL" ] && [ -n "$SPEC" ] && [ -n "$REF" ] || { echo "regress.sh: --model, --spec and --ref are required" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/tpgen-regress-XXXXXX)}
mkdir -p "$OUT"

# the PSNR helper: a few lines of C over libpng
PSNR=$ROOT/build/psnr
if [ ! -x "$PSNR" ] || [ "$ROOT/scripts/psnr.c" -nt "$PSNR" ]; then
    mkdir -p "$ROOT/build"
    cc -O2 -o "$PSNR" "$ROOT/scripts/psnr.c" -lpng -lm
fi

MPIRUN=(mpirun -np "$NP" --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
echo "rendering into $OUT"
"${MPIRUN[@]}" "$TPGEN" --model "$MODEL" --spec "$SPEC" --output "$OUT/{index:04}-{seed}.png" "${EXTRA[@]}"

shopt -s nullglob
renders=("$OUT"/*.png)
[ ${#renders[@]} -gt 0 ] || { echo "regress.sh: no image was rendered" >&2; exit 1; }
if [ "$UPDATE" = 1 ]; then
    mkdir -p "$REF"
    cp "${renders[@]}" "$REF/"
    echo "stored ${#renders[@]} reference images in $REF"
    exit 0
fi

bad=0
printf '%-28s %10s\n' image "PSNR (dB)"
for img in "${renders[@]}"; do
    name=$(basename "$img")
    if [ ! -f "$REF/$name" ]; then
        printf '%-28s %10s  FAIL (no reference)\n' "$name" "-"; bad=$((bad + 1)); continue
    fi
    p=$("$PSNR" "$img" "$REF/$name") || { printf '%-28s %10s  FAIL\n' "$name" "error"; bad=$((bad + 1)); continue; }
    if [ "$p" = inf ] || awk -v p="$p" -v m="$MIN" 'BEGIN { exit !(p >= m) }'; then
        printf '%-28s %10s  ok\n' "$name" "$p"
    else
        printf '%-28s %10s  FAIL (< %s)\n' "$name" "$p" "$MIN"; bad=$((bad + 1))
    fi
done
for refimg in "$REF"/*.png; do
    [ -f "$OUT/$(basename "$refimg")" ] || { printf '%-28s %10s  FAIL (not rendered)\n' "$(basename "$refimg")" "-"; bad=$((bad + 1)); }
done
echo "${#renders[@]} rendered, $bad failed (threshold $MIN dB)"
[ "$bad" -eq 0 ]
