#!/usr/bin/env bash
# budget: 20 s; checks: 17
# `tpgen check`: the TP transformer against the golden diffusers outputs at
# tp 1, 2, 4 (f32 and bf16), against an unsharded run on rank 0, and its errors.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN/flux2-tiny-a
CASES=$G/transformer_cases.safetensors
export OMP_NUM_THREADS=1

# run_check NAME NP ARGS...: exit 0, one rel_err line per case, a PASS verdict
run_check() {
    local name=$1 np=$2; shift 2
    local out rc
    out=$($MPIRUN -np "$np" "$TPGEN" check --backend cpu "$@" 2>&1); rc=$?
    local ncase=$(echo "$out" | grep -cE '^case[0-9]+ rel_err=[0-9.e+-]+$')
    if [ $rc -eq 0 ] && [ "$ncase" -ge 2 ] && echo "$out" | grep -qE '^max_rel_err=[0-9.e+-]+ tol=[0-9.e+-]+ PASS$'; then
        ok "$name ($(echo "$out" | grep '^max_rel_err'))"
    else
        fail "$name: rc=$rc, $ncase case lines: $(echo "$out" | tail -4 | tr '\n' ' ')"
    fi
}

for np in 1 2 4; do
    run_check "check golden f32 tp=$np" $np --model "$G/model" --cases "$CASES" --precision f32
    run_check "check golden bf16 tp=$np" $np --model "$G/model" --cases "$CASES" --precision bf16
done
run_check "check golden f32 tp=2 unfused all-reduce" 2 --model "$G/model" --cases "$CASES" --unfused
run_check "check unsharded f32 tp=2" 2 --model "$G/model/transformer" --seed 3
run_check "check unsharded f32 tp=4" 4 --model "$G/model" --seed 4
run_check "check unsharded bf16 tp=4" 4 --model "$G/model" --precision bf16

# a tolerance nobody meets must fail with FAIL and a non-zero exit
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$CASES" --tol 1e-12 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -qE '^max_rel_err=.* FAIL$'; then ok "check fails above tolerance"
else fail "check fails above tolerance: rc=$rc $(echo "$out" | tail -2 | tr '\n' ' ')"; fi

# errors: clear message once, non-zero exit, no hang
expect_fail "check without --model" "--model DIR is required" $MPIRUN -np 2 "$TPGEN" check
expect_fail "check bad precision" "precision must be f32 or bf16" "$TPGEN" check --model "$G/model" --precision fp8
expect_fail "check missing model" "config.json" $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/none"
expect_fail "check tp not dividing heads" "does not divide num_attention_heads" \
    $MPIRUN -np 3 "$TPGEN" check --backend cpu --model "$G/model"
expect_fail "check cases file missing" "$TMP/none.safetensors" \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$TMP/none.safetensors"
expect_fail "check cases file of another kind" "not a transformer cases file" \
    "$TPGEN" check --backend cpu --model "$G/model" --cases "$G/denoise.safetensors"
