#!/usr/bin/env bash
# budget: 20 s; checks: 15
# LoRA adapters on FLUX.3: `tpgen check --lora` with the golden adapter of
# tests/data/flux3-lora (diffusers + PEFT on the tiny FLUX.3 base, made by
# tests/tools/flux3_lora_golden.py) against diffusers' adapted outputs at tp
# 1, 2, 3 (f32, tol 1e-4) and bf16; the adapter bytes each rank reads = the
# shard formula; the file without metadata (PEFT scale 1) at weight 2 = the
# file with metadata (alpha 8 / r 4); without the adapter the cases fail;
# --quantize fp8 (merged into the shard, then quantised to E4M3); generate on a FLUX.3
# folder: weight 0 gives the base latents bit for bit, weight 1 differs;
# a FLUX.2 adapter is refused naming a module on every rank.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
G=$TPGEN_GOLDEN/flux3-tiny/base
L=$TPGEN_ROOT/tests/data/flux3-lora
A=$L/adapter.safetensors
CASES=$L/lora_cases.safetensors

# bytes of A and B one rank of tp reads: colwise (q, k, v, ff.linear_in) its rows of B and all of A,
# rowwise (to_out.0, ff.linear_out) its columns of A and all of B, the rest (embedders, ...) everything
FORMULA='
import json, struct, sys, re
path, tp = sys.argv[1], int(sys.argv[2])
f = open(path, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); h.pop("__metadata__", None)
blk = r"^transformer\.(mode_blocks\.\w+\.\d+|txt_mode_blocks\.\d+|single_transformer_blocks\.\d+)\."
tot = 0
for k in h:
    if not k.endswith(".lora_A.weight"): continue
    m = k[:-len(".lora_A.weight")]
    r, i = h[k]["shape"]; o = h[m + ".lora_B.weight"]["shape"][0]
    assert h[k]["dtype"] == "F32"
    col = re.match(blk + r"(attn\.to_[qkv]|ff\.linear_in)$", m)
    row = re.match(blk + r"(attn\.to_out\.0|ff\.linear_out)$", m)
    tot += 4 * (r * i + o // tp * r if col else r * i // tp + o * r if row else r * i + o * r)
print(tot)'

# run_check NAME NP ARGS...: exit 0, $NC (default 4) case lines, PASS; sets $out
run_check() {
    local name=$1 np=$2; shift 2
    local rc
    out=$($MPIRUN -np "$np" "$TPGEN" check --backend cpu --model "$G/model" "$@" 2>&1); rc=$?
    local ncase=$(echo "$out" | grep -cE '^case[0-9]+ rel_err=[0-9.e+-]+$')
    if [ $rc -eq 0 ] && [ "$ncase" -eq "${NC:-4}" ] && echo "$out" | grep -qE '^max_rel_err=[0-9.e+-]+ tol=[0-9.e+-]+ PASS$'; then
        ok "$name ($(echo "$out" | grep -oE '^max_rel_err=[^ ]+'))"
    else fail "$name: rc=$rc, $ncase case lines: $(echo "$out" | tail -3 | tr '\n' ' ')"; fi
}

for np in 1 2 3; do
    run_check "flux3 lora check f32 tp=$np = diffusers+PEFT" $np --cases "$CASES" --lora "$A" --tol 1e-4
    want=$(python3 -c "$FORMULA" "$A" $np)
    got=$(echo "$out" | grep -E "^# lora $A: bytes read per rank" | sed 's/.*per rank //')
    if [ -n "$want" ] && [ "$got" = "$(for r in $(seq $np); do printf '%s ' "$want"; done | sed 's/ $//')" ]; then
        ok "flux3 lora bytes read per rank tp=$np = the shard formula ($want)"
    else fail "flux3 lora bytes tp=$np: read '$got', formula $want per rank"; fi
done
NC=2 run_check "flux3 lora check unsharded reference (adapter on rank 0's copy too) tp=3" 3 --lora "$A" --seed 5 --tol 1e-5
run_check "flux3 lora check bf16 tp=2" 2 --cases "$CASES" --lora "$A" --precision bf16 --tol 3e-2
run_check "flux3 lora check --quantize fp8 tp=2 (merged, then quantised to E4M3)" 2 --cases "$CASES" --lora "$A" \
    --quantize fp8 --tol 5e-2

# the same tensors without lora_adapter_metadata: PEFT scale 1, so weight 2 = alpha 8 / r 4
python3 - "$A" "$TMP/bare.safetensors" <<'PY'
import json, struct, sys
src = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", src[:8])[0]
h = json.loads(src[8:8 + n]); h.pop("__metadata__")
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + src[8 + n:])
PY
run_check "flux3 lora without metadata at weight 2 = with metadata tp=2" 2 --cases "$CASES" \
    --lora "$TMP/bare.safetensors:2" --tol 1e-4
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$CASES" --lora "$TMP/bare.safetensors" \
      --tol 1e-4 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -qE '^max_rel_err=.* FAIL$' && ok "flux3 lora without metadata at weight 1 fails (scale 1, not 2)" \
    || fail "flux3 lora without metadata at weight 1: rc=$rc $(echo "$out" | tail -2 | tr '\n' ' ')"
# ai-toolkit: the same tensors under BFL FLUX.3 names (diffusion_model.*, content_mode_blocks, q_proj, attn_out,
# mlp_in, single_blocks ...; no metadata, scale 1), renamed as diffusers' converter maps them back
python3 "$TPGEN_ROOT/tests/tools/flux3_lora_bfl_names.py" "$A" "$TMP/aitk.safetensors"
run_check "flux3 lora ai-toolkit file with BFL FLUX.3 names at weight 2 tp=3" 3 --cases "$CASES" \
    --lora "$TMP/aitk.safetensors:2" --tol 1e-4
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$CASES" --tol 1e-2 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -qE '^max_rel_err=.* FAIL$' && ok "flux3 the lora cases fail without the adapter" \
    || fail "flux3 lora cases without the adapter: rc=$rc $(echo "$out" | tail -2 | tr '\n' ' ')"

# generate on a FLUX.3 folder: --lora through the pipeline
flux3_folder base "$TMP/base"
D=$TPGEN_ROOT/tests/data/flux3-pipe
for w in none 0 1; do
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/base" --prompt-embeds "$D/base_t2i.safetensors" --seed 42 --steps 2 --guidance 1 \
        --width 32 --height 32 --precision f32 --backend cpu --no-decode --save-latents "$TMP/g-$w.safetensors" \
        $([ $w != none ] && echo --lora "$A:$w") >"$TMP/g-$w.log" 2>&1 || fail "flux3 lora generate weight $w: $(tail -2 "$TMP/g-$w.log")"
done
if [ -s "$TMP/g-none.safetensors" ] && cmp -s "$TMP/g-none.safetensors" "$TMP/g-0.safetensors" &&
   [ -s "$TMP/g-1.safetensors" ] && ! cmp -s "$TMP/g-none.safetensors" "$TMP/g-1.safetensors"; then
    ok "flux3 generate --lora tp=2: weight 0 = the base latents bit for bit, weight 1 differs"
else fail "flux3 generate --lora: weight 0 / 1 latents against the base run"; fi

# a FLUX.2 adapter on the FLUX.3 model: refused naming the module, every rank exits non-zero
expect_fail "flux3 lora: a FLUX.2 adapter refused naming a module" \
    "peft_r4.safetensors: key transformer\..*module '[^']+' matches no Linear of this transformer" \
    $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/model" --cases "$CASES" \
    --lora "$TPGEN_GOLDEN/flux2-lora/adapters/peft_r4.safetensors"
