#!/usr/bin/env bash
# How far images of the same seed move between TP degrees: renders one job at
# tp 1 and at each tp given, in f32 and in bf16, and prints the relative L2
# error of the saved latents against tp 1 and the PSNR of the PNGs.
#
#   scripts/tp-invariance.sh --model DIR [--tp "2 4"] [--size 256] [--steps 4] [--seed 0] [--prompt TEXT]
#
# A different split changes the order of the sums in the row-parallel GEMMs
# and the all-reduces, so the results agree to rounding, not bit for bit:
# this measures that agreement (docs/generate.md, "Same seed, any --tp").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TPGEN=${TPGEN:-$ROOT/build/tpgen}
MPIRUN=${MPIRUN:-mpirun --oversubscribe --allow-run-as-root --bind-to none}
MODEL= TPS="2 4" SIZE=256 STEPS=4 SEED=0 PROMPT="a red fox in the snow"
while [ $# -gt 0 ]; do
    case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --tp) TPS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tp-invariance.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$MODEL" ] || { echo "tp-invariance.sh: --model DIR is required" >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cc -std=c17 -O2 -o "$T/st_compare" "$ROOT/tests/tools/st_compare.c" -ljansson -lm
cc -std=c17 -O2 -o "$T/psnr" "$ROOT/scripts/psnr.c" -lpng -lm
render() { # precision tp
    $MPIRUN -np "$2" "$TPGEN" --model "$MODEL" --prompt "$PROMPT" --seed "$SEED" --width "$SIZE" --height "$SIZE" \
        --steps "$STEPS" --precision "$1" --tp "$2" --output "$T/$1-$2.png" --save-latents "$T/$1-$2.safetensors" >/dev/null 2>&1
}
printf '%-9s %-4s %-14s %-12s %s\n' precision tp latents_rel_l2 max_abs png_psnr_db
for p in f32 bf16; do
    render "$p" 1
    for tp in $TPS; do
        render "$p" "$tp"
        cmp_out=$("$T/st_compare" "$T/$p-$tp.safetensors" "$T/$p-1.safetensors" latents 1 || true)
        rel=$(echo "$cmp_out" | awk '{print $2}'); mx=$(echo "$cmp_out" | awk '{print $4}')
        db=$("$T/psnr" "$T/$p-$tp.png" "$T/$p-1.png" | awk '{print $NF}')
        printf '%-9s %-4s %-14s %-12s %s\n' "$p" "$tp" "$rel" "$mx" "$db"
    done
done
