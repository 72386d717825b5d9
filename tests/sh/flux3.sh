#!/usr/bin/env bash
# budget: 25 s; checks: 24
# `tpgen check` on the FLUX.3 transformers (golden flux3-tiny: base and
# flow-map, 4 cases each, 2 with reference tokens): the TP forward against
# diffusers' outputs at every tp that divides the 6 heads (1, 2, 3), f32 and
# bf16; against an unsharded run on rank 0; --quantize fp8 (check and generate,
# tp 2); and its errors.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1

# run_check NAME NP ARGS...: exit 0, NCASE rel_err lines, a PASS verdict
run_check() {
    local name=$1 np=$2 want=$3; shift 3
    local out rc
    out=$($MPIRUN -np "$np" "$TPGEN" check --backend cpu "$@" 2>&1); rc=$?
    local ncase=$(echo "$out" | grep -cE '^case[0-9]+ rel_err=[0-9.e+-]+$')
    if [ $rc -eq 0 ] && [ "$ncase" -eq "$want" ] && echo "$out" | grep -q '^# FLUX.3 transformer' &&
        echo "$out" | grep -qE '^max_rel_err=[0-9.e+-]+ tol=[0-9.e+-]+ PASS$'; then
        ok "$name ($(echo "$out" | grep '^max_rel_err'))"
    else
        fail "$name: rc=$rc, $ncase case lines: $(echo "$out" | tail -4 | tr '\n' ' ')"
    fi
}

for v in base flowmap; do
    G=$TPGEN_GOLDEN/flux3-tiny/$v
    CASES=$G/transformer_cases.safetensors
    for np in 1 2 3; do
        run_check "flux3 $v check golden f32 tp=$np" $np 4 --model "$G/model" --cases "$CASES" --tol 1e-5
        run_check "flux3 $v check golden bf16 tp=$np" $np 4 --model "$G/model" --cases "$CASES" --precision bf16
    done
    run_check "flux3 $v check unsharded f32 tp=3" 3 2 --model "$G/model/transformer" --seed 5 --tol 1e-5
done
G=$TPGEN_GOLDEN/flux3-tiny/base
CASES=$G/transformer_cases.safetensors

# a tolerance nobody meets must fail with FAIL and a non-zero exit
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$CASES" --tol 1e-12 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -qE '^max_rel_err=.* FAIL$'; then ok "flux3 check fails above tolerance"
else fail "flux3 check fails above tolerance: rc=$rc $(echo "$out" | tail -2 | tr '\n' ' ')"; fi

# errors: a clear message, non-zero exit on every rank, no hang
expect_fail "flux3 check tp not dividing heads" "does not divide num_attention_heads 6" \
    $MPIRUN -np 4 "$TPGEN" check --backend cpu --model "$G/model" --cases "$CASES"
expect_fail "flux3 check flow-map cases on the base model" "case0.target_timestep" \
    "$TPGEN" check --backend cpu --model "$G/model" --cases "$TPGEN_GOLDEN/flux3-tiny/flowmap/transformer_cases.safetensors" --tol 1
expect_fail "flux3 check FLUX.2 cases on a FLUX.3 model" "encoder_hidden_states must have last dimension 80" \
    "$TPGEN" check --backend cpu --model "$G/model" --cases "$TPGEN_GOLDEN/flux2-tiny-a/transformer_cases.safetensors"
expect_fail "flux3 check FLUX.2-only option" "FLUX.2-only" \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --unfused
expect_fail "flux3 check --lora with a FLUX.2 ai-toolkit adapter: refused naming the module" "module '[^']+' matches no Linear of this transformer" \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --lora "$TPGEN_GOLDEN/flux2-lora/adapters/aitk_r4.safetensors"

# --quantize fp8 (the block linears become E4M3 with per-row absmax scales at load, per rank shard):
# tp 2 against diffusers' f32 outputs, near (fp8 rounding, ~5e-3 to 1e-2) but not at them
for v in base flowmap; do
    F=$TPGEN_GOLDEN/flux3-tiny/$v
    out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$F/model" --cases "$F/transformer_cases.safetensors" \
          --quantize fp8 --tol 5e-2 2>&1); rc=$?
    err=$(echo "$out" | sed -n 's/^max_rel_err=\([^ ]*\) .*PASS$/\1/p')
    if [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c '^case[0-9] rel_err=')" -eq 4 ] && [ -n "$err" ] &&
        python3 -c "import sys; sys.exit(0 if 1e-4 < $err < 5e-2 else 1)"; then
        ok "flux3 $v check --quantize fp8 tp=2 (max_rel_err $err)"
    else fail "flux3 $v check --quantize fp8 tp=2: rc=$rc $(echo "$out" | tail -3 | tr '\n' ' ')"; fi
done

# generate --quantize fp8 on a FLUX.3 folder at np 2: runs, and its latents are near, not at, the f32 weights' run
flux3_folder base "$TMP/q3"
P3=tests/data/flux3-pipe/base_t2i.safetensors
for q in plain fp8; do
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/q3" --prompt-embeds "$TPGEN_ROOT/$P3" \
        --negative-prompt-embeds "$TPGEN_ROOT/$P3" --seed 42 --steps 3 --width 64 --height 48 --precision f32 \
        --backend cpu --no-decode --save-latents "$TMP/q3-$q.safetensors" $([ $q = fp8 ] && echo --quantize fp8) \
        >"$TMP/q3-$q.log" 2>&1 || echo "rc=$?" >>"$TMP/q3-$q.log"
done
r=$(python3 - "$TMP/q3-plain.safetensors" "$TMP/q3-fp8.safetensors" <<'PY' 2>&1
import json, math, struct, sys
def st(path):
    f = open(path, "rb"); n, = struct.unpack("<Q", f.read(8)); h = json.loads(f.read(n))
    t = h["latents"]; a, b = t["data_offsets"]; f.seek(8 + n + a); d = f.read(b - a)
    return struct.unpack("<%df" % (len(d) // 4), d)
x, y = st(sys.argv[1]), st(sys.argv[2])
rel = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, y)) / sum(a * a for a in x))
print("latents rel %.3g" % rel); sys.exit(0 if len(x) == len(y) and 1e-4 < rel < 5e-2 else 1)
PY
) && ok "flux3 generate --quantize fp8 tp=2 ($r from the f32 weights)" \
  || fail "flux3 generate --quantize fp8: $r $(tail -2 "$TMP/q3-fp8.log" | tr '\n' ' ')"

mkdir -p "$TMP/fm/transformer"
ln -s "$G/model/transformer/diffusion_pytorch_model.safetensors" "$TMP/fm/transformer/"
sed 's/"flow_map": false/"flow_map": true/' "$G/model/transformer/config.json" > "$TMP/fm/transformer/config.json"
expect_fail "flux3 check flow-map config without target embedder" \
    "fm/transformer: tensor target_timestep_embedder.linear_1.weight missing" \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/fm"
