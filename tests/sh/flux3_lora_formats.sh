#!/usr/bin/env bash
# budget: 20 s; checks: 18
# The other FLUX.3 LoRA spellings diffusers 0.42.1 loads (tests/tools/flux3_lora_formats.py, whose --verify
# checks each against diffusers + PEFT): the golden adapter of tests/data/flux3-lora rewritten as older
# diffusers keys (transformer.<module>.lora.down/.lora.up.weight; attn.processor.to_q_lora.down ...) and as
# ai-toolkit BFL names with .lora.down/.lora.up; `tpgen check --lora` against diffusers' adapted outputs
# (lora_cases) at tp 1, 2, 3, reading exactly the bytes the original file costs. A kohya lora_unet_* file for
# FLUX.3 (diffusers has no converter and loads nothing of it) is refused naming the file on every rank; so are
# a PEFT DoRA file (lora_magnitude_vector) and a lora_bias file (lora_B.bias), which diffusers applies and tpgen
# does not, each with a message naming the key and what to do.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
G=$TPGEN_GOLDEN/flux3-tiny/base
L=$TPGEN_ROOT/tests/data/flux3-lora
F=$TPGEN_ROOT/tests/tools/flux3_lora_formats.py
for s in old processor aitk_old kohya dora bias; do python3 "$F" $s "$L/adapter.safetensors" "$TMP/$s.safetensors"; done

# check NAME NP LORA [ARGS]: 4 cases, PASS; prints the bytes-read line into $bytes
check() {
    local name=$1 np=$2 lora=$3; shift 3
    local out rc
    out=$($MPIRUN -np "$np" "$TPGEN" check --backend cpu --model "$G/model" --cases "$L/lora_cases.safetensors" \
          --lora "$lora" --tol 1e-4 "$@" 2>&1); rc=$?
    bytes=$(echo "$out" | grep -E "^# lora .*: bytes read per rank" | sed 's/.*per rank //')
    local n=$(echo "$out" | grep -cE '^case[0-9]+ rel_err=')
    if [ $rc -eq 0 ] && [ "$n" -eq 4 ] && echo "$out" | grep -qE '^max_rel_err=[0-9.e+-]+ tol=[0-9.e+-]+ PASS$'; then
        ok "$name ($(echo "$out" | grep -oE '^max_rel_err=[^ ]+'))"
    else fail "$name: rc=$rc, $n case lines: $(echo "$out" | tail -3 | tr '\n' ' ')"; fi
}
for np in 1 2 3; do
    check "flux3 lora reference spelling tp=$np" $np "$L/adapter.safetensors"
    want=$bytes
    check "flux3 lora older diffusers spelling (.lora.down/.lora.up, metadata) tp=$np = diffusers+PEFT" $np "$TMP/old.safetensors"
    [ -n "$want" ] && [ "$bytes" = "$want" ] && ok "flux3 lora older spelling tp=$np reads the same bytes per rank ($bytes)" \
        || fail "flux3 lora older spelling tp=$np: bytes '$bytes', the original file '$want'"
    check "flux3 lora attn.processor.to_q_lora.down spelling tp=$np = diffusers+PEFT" $np "$TMP/processor.safetensors"
done
check "flux3 lora ai-toolkit BFL names with .lora.down/.lora.up at weight 2 (no metadata) tp=3" 3 "$TMP/aitk_old.safetensors:2"
# the renaming is what makes them load: at weight 1 the no-metadata copy must fail the cases (scale 1, not 2)
out=$("$TPGEN" check --backend cpu --model "$G/model" --cases "$L/lora_cases.safetensors" --lora "$TMP/aitk_old.safetensors" \
      --tol 1e-4 2>&1) && fail "flux3 lora aitk_old at weight 1 passed (scale not applied?)" \
    || { echo "$out" | grep -q "FAIL" && ok "flux3 lora aitk_old at weight 1 fails the cases (scale 1, not alpha/r 2)" \
         || fail "flux3 lora aitk_old weight 1: $(echo "$out" | tail -2 | tr '\n' ' ')"; }
expect_fail "flux3 kohya lora_unet_ file refused (diffusers has no FLUX.3 kohya converter)" \
    'kohya.safetensors: a kohya LoRA \(lora_unet_\* keys\) on a FLUX.3 transformer: diffusers 0.42.1 converts no kohya' \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$L/lora_cases.safetensors" --lora "$TMP/kohya.safetensors"
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$L/lora_cases.safetensors" \
      --lora "$TMP/kohya.safetensors" 2>&1)
[ "$(echo "$out" | grep -c 'kohya LoRA')" -ge 1 ] && ! echo "$out" | grep -q "rel_err" \
    && ok "flux3 kohya refusal before any case runs" || fail "flux3 kohya: $(echo "$out" | tail -2 | tr '\n' ' ')"
expect_fail "flux3 PEFT DoRA (lora_magnitude_vector) refused naming the key" \
    'dora.safetensors: key transformer\.[^ ]*\.lora_magnitude_vector is a PEFT DoRA magnitude vector.*merge_and_unload' \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$L/lora_cases.safetensors" --lora "$TMP/dora.safetensors"
expect_fail "flux3 PEFT lora_bias (lora_B.bias) refused naming the key" \
    'bias.safetensors: key transformer\.[^ ]*\.lora_B\.bias is a PEFT lora_B bias \(lora_bias\)' \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$L/lora_cases.safetensors" --lora "$TMP/bias.safetensors"
