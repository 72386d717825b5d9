#!/usr/bin/env bash
# budget: 10 s; checks: 6
# The model family follows model_index.json's _class_name (generate on the
# tiny klein model with its model_index.json edited): a contradiction with
# guidance_embeds is followed with one warning, klein-kv is klein with
# KV-cached references, foreign classes are refused on every rank before
# anything is loaded.
. "$TPGEN_ROOT/tests/lib.sh"
ASAN=$TPGEN_ROOT/build-asan/tpgen
M=$TMP/m
"$TPGEN" make-tiny --out "$M" --seed 1 >/dev/null 2>&1 || fail "make-tiny"
args=(--model "$M" --prompt "a fox" --width 32 --height 32 --steps 1 --backend cpu --no-decode)
set_class() { jq "$1" "$M/model_index.json.orig" >"$M/model_index.json"; }
cp "$M/model_index.json" "$M/model_index.json.orig"

# Flux2KleinPipeline without is_distilled: klein base (50-step default, CFG) although the folder says distilled elsewhere
set_class '{_class_name: "Flux2KleinPipeline"}'
out=$($MPIRUN -np 2 "$TPGEN" "${args[@]}" --save-latents "$TMP/a.safetensors" --json-metrics "$TMP/a.json" 2>&1)
grep -q '"family": "FLUX.2-klein (base)"' "$TMP/a.json" 2>/dev/null && ok "Flux2KleinPipeline without is_distilled runs as klein base" \
    || fail "klein base: $(echo "$out" | tail -3)"

# Flux2Pipeline over a klein transformer (no guidance embeds): dev, one warning naming both files
set_class '{_class_name: "Flux2Pipeline"}'
out=$($MPIRUN -np 2 "$TPGEN" "${args[@]}" --save-latents "$TMP/b.safetensors" --json-metrics "$TMP/b.json" 2>&1)
n=$(echo "$out" | grep -c 'warning: .*model_index.json names Flux2Pipeline.*transformer/config.json has guidance_embeds false')
[ "$n" = 1 ] && grep -q '"family": "FLUX.2-dev"' "$TMP/b.json" 2>/dev/null \
    && ok "Flux2Pipeline without guidance embeds: dev, one warning naming both files" \
    || fail "contradiction ($n warnings): $(echo "$out" | tail -3)"

set_class '{_class_name: "Flux2KleinKVPipeline", is_distilled: true}'
out=$($MPIRUN -np 2 "$TPGEN" "${args[@]}" --save-latents "$TMP/kv.safetensors" --json-metrics "$TMP/kv.json" 2>&1)
grep -q '"family": "FLUX.2-klein-kv (distilled)"' "$TMP/kv.json" 2>/dev/null \
    && ok "Flux2KleinKVPipeline: klein-kv (distilled), references KV-cached (docs/editing.md)" \
    || fail "Flux2KleinKVPipeline: $(echo "$out" | tail -3)"
set_class '{_class_name: "FluxPipeline"}'
expect_fail "a FLUX.1 pipeline class is refused, naming the file" "model_index.json: _class_name 'FluxPipeline' is not a pipeline tpgen runs" \
    $MPIRUN -np 2 "$TPGEN" "${args[@]}" --save-latents "$TMP/d.safetensors"
if [ -x "$ASAN" ]; then
    expect_fail "asan: a foreign class" "is not a pipeline tpgen runs" "$ASAN" "${args[@]}" --save-latents "$TMP/e.safetensors"
else
    fail "no sanitized build at $ASAN (make asan)"
fi
[ ! -e "$TMP/d.safetensors" ] && ok "nothing written for a refused folder" || fail "a refused run wrote latents"
