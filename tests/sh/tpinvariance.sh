#!/usr/bin/env bash
# budget: 10 s; checks: 2
# What "same seed at any --tp" means, measured (scripts/tp-invariance.sh):
# f32 latents at tp 2 within 1e-5 relative of tp 1, bf16 images above the
# 35 dB that scripts/regress.sh compares at by default.
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/m
"$TPGEN" make-tiny --out "$M" --seed 1 >/dev/null 2>&1 || fail "tpinvariance: make-tiny"
out=$(MPIRUN="$MPIRUN" TPGEN="$TPGEN" "$TPGEN_ROOT/scripts/tp-invariance.sh" --model "$M" --tp 2 --size 128 --steps 2 2>&1) ||
    fail "tpinvariance: the script failed: $(echo "$out" | tail -2)"
f32=$(echo "$out" | awk '$1 == "f32" && $2 == 2 {print $3}')
db=$(echo "$out" | awk '$1 == "bf16" && $2 == 2 {print $5}')
min=$(sed -n 's/.*MIN=\([0-9.]*\).*/\1/p' "$TPGEN_ROOT/scripts/regress.sh" | head -1)
[ -n "$f32" ] && python3 -c "import sys; sys.exit(0 if float('$f32') <= 1e-5 else 1)" &&
    ok "tpinvariance: f32 latents at tp 2 within 1e-5 of tp 1 (rel_l2 $f32)" || fail "tpinvariance: f32 rel_l2 '$f32': $out"
[ -n "$db" ] && [ -n "$min" ] && python3 -c "import sys; sys.exit(0 if float('$db') > float('$min') else 1)" &&
    ok "tpinvariance: bf16 image at tp 2 above regress.sh's default $min dB ($db dB)" || fail "tpinvariance: bf16 PSNR '$db' vs '$min': $out"
