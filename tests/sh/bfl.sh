#!/usr/bin/env bash
# budget: 15 s; checks: 11
# BFL single-file checkpoints: the golden flux2-tiny-a transformer converted
# to the BFL layout (by the test binary: one file, BFL names, fused qkv,
# swapped final-layer halves, no config.json) must pass `tpgen check`
# against the golden outputs at tp 1, 2 and 4 with the same errors as the
# diffusers layout; inspect shows the BFL plan; a missing tensor is named.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN/flux2-tiny-a
CASES=$G/transformer_cases.safetensors
export OMP_NUM_THREADS=1

# make_bfl DIR [SKIP]: DIR/transformer/flux2-tiny-bfl.safetensors
make_bfl() {
    mkdir -p "$1/transformer"
    TPGEN_BFL_OUT="$1/transformer" TPGEN_BFL_SKIP="${2:-}" "$TPGEN_TESTS" bfl_write_golden_as_bfl | grep -q '^ok - '
}

if make_bfl "$TMP/bfl" && [ ! -e "$TMP/bfl/transformer/config.json" ] \
   && [ "$(ls "$TMP/bfl/transformer")" = "flux2-tiny-bfl.safetensors" ]; then ok "bfl: converted golden checkpoint"
else fail "bfl: conversion failed"; fi

check_out() { $MPIRUN -np "$1" "$TPGEN" check --backend cpu --model "$2" --cases "$CASES" --precision "$3" 2>&1; }

for np in 1 2 4; do
    for prec in f32 bf16; do
        b=$(check_out $np "$TMP/bfl" $prec); brc=$?
        d=$(check_out $np "$G/model" $prec); drc=$?
        bl=$(echo "$b" | grep -E '^case[0-9]+ rel_err=|^max_rel_err=')
        dl=$(echo "$d" | grep -E '^case[0-9]+ rel_err=|^max_rel_err=')
        if [ $brc -eq 0 ] && echo "$b" | grep -qE '^max_rel_err=.* PASS$' && [ -n "$bl" ] && [ "$bl" = "$dl" ]; then
            ok "bfl: check golden $prec tp=$np, same errors as diffusers ($(echo "$b" | grep '^max_rel_err'))"
        else
            fail "bfl: check golden $prec tp=$np: rc=$brc/$drc BFL [$(echo $bl)] diffusers [$(echo $dl)] $(echo "$b" | tail -2 | tr '\n' ' ')"
        fi
    done
done

# inspect: the BFL plan, qkv packed [D,D,D], each rank a quarter of the sharded bytes
out=$("$TPGEN" inspect --model "$TMP/bfl" --tp 4 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q 'plan flux2 (BFL names)' \
   && echo "$out" | grep -E 'double_blocks\.0\.img_attn\.qkv\.weight' | grep -q 'packed_colwise'; then ok "bfl: inspect shows the BFL plan"
else fail "bfl: inspect: rc=$rc $(echo "$out" | head -3 | tr '\n' ' ')"; fi

# bad input: a tensor missing from the BFL file is named, on every rank count, without a hang
make_bfl "$TMP/miss" double_blocks.1.img_mlp.2.weight
expect_fail "bfl: missing tensor named" "double_blocks\.1\.img_mlp\.2\.weight missing" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/miss" --cases "$CASES"
# a file without img_in is not recognised as BFL: a diffusers folder needs config.json
make_bfl "$TMP/noimg" img_in.weight
expect_fail "bfl: unrecognised file asks for config.json" "config.json is missing" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/noimg" --cases "$CASES"

# generate from a pipeline folder whose transformer/ is the BFL file (no
# config.json): the same latents, bit for bit, as from the diffusers folder
cp "$G/model/model_index.json" "$TMP/bfl/" && cp -r "$G/model/scheduler" "$TMP/bfl/" && chmod -R u+w "$TMP/bfl"
gen() { $MPIRUN -np 2 "$TPGEN" generate --model "$1" --prompt-embeds "$G/denoise.safetensors:prompt_embeds" \
        --width 96 --height 64 --precision f32 --seed 1 --steps 4 --guidance 4 --backend cpu --save-latents "$2" 2>&1; }
gb=$(gen "$TMP/bfl" "$TMP/bfl.st"); rb=$?
gd=$(gen "$G/model" "$TMP/diffusers.st"); rd=$?
if [ $rb -eq 0 ] && [ $rd -eq 0 ] && cmp -s "$TMP/bfl.st" "$TMP/diffusers.st"; then ok "bfl: generate gives the diffusers layout's latents"
else fail "bfl: generate: rc=$rb/$rd $(echo "$gb" | tail -2 | tr '\n' ' ')"; fi
