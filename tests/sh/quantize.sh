#!/usr/bin/env bash
# budget: 35 s; checks: 103
# tpgen quantize: every legacy type's output equals gguf-py 0.19.0's GGUF of the same f32 input byte for
# byte (tests/data/quant, made by tests/tools/quant_testdata.py: types, shapes, tensor bytes, metadata and
# layout), Q2_K..Q6_K, IQ4_NL, IQ4_XS the GGUFs of tests/tools/kquant_ref.py (a numpy port of ggml's
# reference quantisers, its round trips checked with gguf-py's dequantisers) byte for byte on three inputs
# (mixed, varied distributions, hard blocks); the golden tiny transformer as Q2_K / Q3_K / Q4_K / Q5_K / Q6_K
# / IQ4_NL / IQ4_XS passes tpgen check within 1.7e-1 / 9e-2 / 6e-2 / 3e-2 / 1.5e-2 / 3e-1 / 4.5e-2, the K-quant
# errors falling with each bit; requantising the golden flux2-gguf Q8_0 file (ComfyUI-GGUF layout, gguf-py's quantiser)
# reproduces it byte for byte; the golden tiny transformer (diffusers folder, sharded) quantised to Q8_0
# passes tpgen check against its unquantised golden outputs within 3e-2 (measured 1.08e-2; the golden
# flux2-gguf Q8_0 model is 5.6e-3 from its unquantised outputs) and is not the f32 model (> 1e-3); F32 and
# BF16 of it (its weights are bf16, so both are lossless) within 1e-4; F32 of the golden mixed GGUF (K-quants dequantised) matches its
# gguf_cases at 1e-5, F32 of the golden fp8 folders their fp8_cases at 1e-5; --names bfl (the default for the
# diffusers input): byte-identical to tests/test_bfl.c's converter output, BFL-load errors equal to the diffusers
# load's, Q8_0 within 3e-2; unknown, incomplete or extra-tensor inputs refused for BFL names (FLUX.3: flux3_gguf.sh); bad input
# refused with no file left behind; the byte comparisons again under ASan.
[ -n "${TPGEN_ROOT:-}" ] && [ -n "${TPGEN:-}" ] && [ -n "${TPGEN_GOLDEN:-}" ] || { echo "FAIL - quantize.sh: run it through tests/run.sh"; exit 1; }
. "$TPGEN_ROOT/tests/lib.sh"
D=$TPGEN_ROOT/tests/data/quant
MPI=${MPIRUN:-mpirun --oversubscribe --allow-run-as-root}
TYPES="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS"
KTYPES="Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS"

ref_cases() { # TPGEN PREFIX
    local bin=$1 p=$2 t out
    for t in $TYPES; do
        out=$("$bin" quantize --type "$t" "$D/input.safetensors" "$TMP/$p$t.gguf" 2>&1)
        if [ $? -eq 0 ] && cmp -s "$TMP/$p$t.gguf" "$D/ref-$t.gguf"; then ok "${p}quantize_ref_$t: identical to the reference file"
        else fail "${p}quantize_ref_$t: $(echo "$out" | tail -2; cmp "$TMP/$p$t.gguf" "$D/ref-$t.gguf" 2>&1 | head -1)"; fi
    done
    for t in $KTYPES; do   # 32 more super-blocks (f16 input) of varied distributions, 14 hard ones (f32)
        for k in kq hard; do
            out=$("$bin" quantize --type "$t" "$D/$([ $k = kq ] && echo kquant || echo hard)-input.safetensors" "$TMP/$p$k$t.gguf" 2>&1)
            if [ $? -eq 0 ] && cmp -s "$TMP/$p$k$t.gguf" "$D/ref-$k-$t.gguf"; then ok "${p}quantize_ref_${k}_$t: identical to the port's file"
            else fail "${p}quantize_ref_${k}_$t: $(echo "$out" | tail -2; cmp "$TMP/$p$k$t.gguf" "$D/ref-$k-$t.gguf" 2>&1 | head -1)"; fi
        done
    done
}
ref_cases "$TPGEN" ""

G=$TPGEN_GOLDEN/flux2-gguf
out=$("$TPGEN" quantize --type q8_0 "$G/Q8_0/transformer/flux2-tiny-Q8_0.gguf" "$TMP/re.gguf" 2>&1)
if [ $? -eq 0 ] && cmp -s "$TMP/re.gguf" "$G/Q8_0/transformer/flux2-tiny-Q8_0.gguf" && "$TPGEN" inspect --model "$TMP/re.gguf" 2>&1 | grep -qE 'general.architecture +string +"flux"'
then ok "quantize_golden_requant_Q8_0: the golden ComfyUI-GGUF file reproduced byte for byte"
else fail "quantize_golden_requant_Q8_0: $(echo "$out" | tail -2)"; fi

# a model folder around a quantised transformer of the golden tiny model (diffusers names, config.json)
A=$TPGEN_GOLDEN/flux2-tiny-a
folder() { # TYPE -> $TMP/m-TYPE
    local m=$TMP/m-$1
    mkdir -p "$m/transformer"
    cp -r "$A/model/model_index.json" "$A/model/scheduler" "$m/"
    cp "$A/model/transformer/config.json" "$m/transformer/"
    "$TPGEN" quantize --type "$1" ${QN:-} "$A/model/transformer" "$m/transformer/t-$1.gguf" > /dev/null
}
check_case() { # NAME TYPE TOL MIN [check args...]: max_rel_err <= TOL and >= MIN
    local name=$1 t=$2 tol=$3 min=$4 out e; shift 4
    if ! folder "$t"; then fail "$name: quantize failed"; return; fi
    out=$($MPI -np 2 "$TPGEN" check --backend cpu --model "$TMP/m-$t" --cases "$A/transformer_cases.safetensors" --tol "$tol" "$@" 2>&1)
    e=$(echo "$out" | grep -oE '^max_rel_err=[0-9.e+-]+' | cut -d= -f2)
    if [ -n "$e" ] && echo "$out" | grep -qE ' PASS$' && awk -v e="$e" -v m="$min" 'BEGIN { exit !(e >= m) }'
    then ok "$name (max_rel_err=$e, tp 2)"; eval "E_$t=$e"
    else fail "$name: $(echo "$out" | grep -v '^#' | tail -2)"; fi
}
check_case quantize_golden_tiny_Q8_0 Q8_0 3e-2 1e-3
# K-quants: only the 3 single-block to_out weights [512 128] have whole 256-blocks (the rest F16/F32);
# measured 2.02e-2 (Q4_K), 1.09e-2 (Q5_K), 5.08e-3 (Q6_K): the error halves per bit, as it should;
# tolerance 3x that, and not the f32 model (> 1e-3). Q2_K 8.50e-2, Q3_K 4.37e-2, IQ4_XS 2.13e-2 (the same
# 3 weights), IQ4_NL 1.57e-1 (32-blocks: all 33 matrices, like Q4_0's 1.70e-1): tolerance 2x
check_case quantize_golden_tiny_Q2_K Q2_K 1.7e-1 1e-3
check_case quantize_golden_tiny_Q3_K Q3_K 9e-2 1e-3
check_case quantize_golden_tiny_Q4_K Q4_K 6e-2 1e-3
check_case quantize_golden_tiny_Q5_K Q5_K 3e-2 1e-3
check_case quantize_golden_tiny_Q6_K Q6_K 1.5e-2 1e-3
check_case quantize_golden_tiny_IQ4_NL IQ4_NL 3e-1 1e-3
check_case quantize_golden_tiny_IQ4_XS IQ4_XS 4.5e-2 1e-3
if awk -v a="${E_Q2_K:-0}" -v b="${E_Q3_K:-0}" -v c="${E_Q4_K:-0}" -v d="${E_Q5_K:-0}" -v e="${E_Q6_K:-0}" \
       'BEGIN { exit !(a > b && b > c && c > d && d > e && e > 0) }'
then ok "quantize_golden_tiny_K_ladder: Q2_K > Q3_K > Q4_K > Q5_K > Q6_K errors"
else fail "quantize_golden_tiny_K_ladder: ${E_Q2_K:-} ${E_Q3_K:-} ${E_Q4_K:-} ${E_Q5_K:-} ${E_Q6_K:-}"; fi
# the block loop runs on OpenMP threads: the same bytes on 1 and 3 threads as on the default
for t in Q2_K IQ4_NL IQ4_XS; do
    if OMP_NUM_THREADS=1 "$TPGEN" quantize --type $t "$A/model/transformer" "$TMP/omp1-$t.gguf" > /dev/null &&
       OMP_NUM_THREADS=3 "$TPGEN" quantize --type $t "$A/model/transformer" "$TMP/omp3-$t.gguf" > /dev/null &&
       cmp -s "$TMP/omp1-$t.gguf" "$TMP/m-$t/transformer/t-$t.gguf" && cmp -s "$TMP/omp3-$t.gguf" "$TMP/m-$t/transformer/t-$t.gguf"
    then ok "quantize_threads_$t: 1, 3 and default threads give the same file"; else fail "quantize_threads_$t"; fi
done
if "$TPGEN" inspect --model "$TMP/m-IQ4_NL/transformer/t-IQ4_NL.gguf" 2>&1 | grep -qE '^ +double_blocks.0.img_attn.qkv.weight +IQ4_NL' &&
   "$TPGEN" inspect --model "$TMP/m-Q2_K/transformer/t-Q2_K.gguf" 2>&1 | grep -cE ' Q2_K ' | grep -qx 3
then ok "quantize_golden_tiny_types: IQ4_NL for the 32-block matrices, Q2_K for the 3 256-block ones"
else fail "quantize_golden_tiny_types: $("$TPGEN" inspect --model "$TMP/m-Q2_K/transformer/t-Q2_K.gguf" 2>&1 | grep -c Q2_K)"; fi
check_case quantize_golden_tiny_F32 F32 1e-4 0
# the golden weights are bf16: lossless; --names keep: a diffusers-named GGUF (config.json beside it) loads too
QN="--names keep" check_case quantize_golden_tiny_BF16_keep BF16 1e-4 0
if "$TPGEN" inspect --model "$TMP/m-BF16/transformer/t-BF16.gguf" 2>&1 | grep -qE '^ +transformer_blocks.0.attn.to_q.weight +BF16'
then ok "quantize_golden_tiny_BF16_keep_names: diffusers names kept"; else fail "quantize_golden_tiny_BF16_keep_names"; fi

# --names bfl (the default for a diffusers FLUX.2 transformer): the ComfyUI-GGUF layout. F32 of the golden tiny
# transformer is byte for byte the F32 GGUF (--names keep) of tests/test_bfl.c's independent diffusers -> BFL
# converter's file, passes tpgen check (BFL reader, no config.json) at 1e-5 with the diffusers load's errors;
# Q8_0 within the 3e-2 above; inspect shows BFL names only
mkdir -p "$TMP/conv/transformer" "$TMP/nb/transformer" "$TMP/nq/transformer"
if TPGEN_BFL_OUT="$TMP/conv/transformer" "$TPGEN_TESTS" bfl_write_golden_as_bfl | grep -q '^ok - ' &&
   "$TPGEN" quantize --type F32 --names keep "$TMP/conv/transformer/flux2-tiny-bfl.safetensors" "$TMP/conv.gguf" > /dev/null &&
   out=$("$TPGEN" quantize --type F32 "$A/model/transformer" "$TMP/nb/transformer/t.gguf" 2>&1) &&
   echo "$out" | grep -q '47 tensors (BFL names): 47 F32' && cmp -s "$TMP/conv.gguf" "$TMP/nb/transformer/t.gguf"
then ok "quantize_names_bfl_F32: default BFL names, identical to the test converter's file requantised ($out)"
else fail "quantize_names_bfl_F32: $(echo "$out" | tail -2; cmp "$TMP/conv.gguf" "$TMP/nb/transformer/t.gguf" 2>&1 | head -1)"; fi
names=$("$TPGEN" inspect --model "$TMP/nb/transformer/t.gguf" 2>&1 | awk 'NR > 2 { print $1 }')
if [ "$(echo "$names" | wc -l)" -eq 47 ] && echo "$names" | grep -qx 'double_blocks.1.img_attn.qkv.weight' &&
   echo "$names" | grep -qx 'single_blocks.2.linear1.weight' && echo "$names" | grep -qx 'final_layer.adaLN_modulation.1.weight' &&
   ! echo "$names" | grep -qE 'transformer_blocks|x_embedder|norm_out|proj_out'
then ok "quantize_names_inspect: 47 BFL names, no diffusers name"
else fail "quantize_names_inspect: $(echo "$names" | head -3 | tr '\n' ' ')"; fi
d=$($MPI -np 2 "$TPGEN" check --backend cpu --model "$A/model" --cases "$A/transformer_cases.safetensors" --tol 1e-5 2>&1 | grep -E '^case[0-9]+ rel_err=|^max_rel_err=')
b=$($MPI -np 2 "$TPGEN" check --backend cpu --model "$TMP/nb" --cases "$A/transformer_cases.safetensors" --tol 1e-5 2>&1)
if echo "$b" | grep -qE '^max_rel_err=.* PASS$' && [ "$(echo "$b" | grep -E '^case[0-9]+ rel_err=|^max_rel_err=')" = "$d" ] &&
   "$TPGEN" inspect --model "$TMP/nb" 2>&1 | grep -q 'plan flux2 (BFL names)'
then ok "quantize_names_bfl_check_F32: BFL plan, the diffusers load's errors ($(echo "$b" | grep -oE '^max_rel_err=[^ ]+'), tp 2)"
else fail "quantize_names_bfl_check_F32: $(echo "$b" | grep -v '^#' | tail -2) vs $(echo $d)"; fi
out=$("$TPGEN" quantize --type Q8_0 --names bfl "$A/model/transformer" "$TMP/nq/transformer/t.gguf" 2>&1 &&
      $MPI -np 2 "$TPGEN" check --backend cpu --model "$TMP/nq" --cases "$A/transformer_cases.safetensors" --tol 3e-2 2>&1)
e=$(echo "$out" | grep -oE '^max_rel_err=[0-9.e+-]+' | cut -d= -f2)
if [ -n "$e" ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$' && awk -v e="$e" 'BEGIN { exit !(e >= 1e-3) }' &&
   "$TPGEN" inspect --model "$TMP/nq/transformer/t.gguf" 2>&1 | grep -qE '^ +double_blocks.0.img_attn.qkv.weight +Q8_0 +\[384, 128\]'
then ok "quantize_names_bfl_Q8_0: BFL names, max_rel_err=$e (tp 2)"
else fail "quantize_names_bfl_Q8_0: $(echo "$out" | grep -v '^#' | tail -2)"; fi
# --names bfl on a BFL file keeps its names (already BFL): the golden ComfyUI-GGUF file reproduced
if "$TPGEN" quantize --type q8_0 --names bfl "$G/Q8_0/transformer/flux2-tiny-Q8_0.gguf" "$TMP/re-bfl.gguf" > /dev/null &&
   cmp -s "$TMP/re-bfl.gguf" "$G/Q8_0/transformer/flux2-tiny-Q8_0.gguf"
then ok "quantize_names_bfl_of_bfl: BFL input kept as it is"; else fail "quantize_names_bfl_of_bfl"; fi

out=$("$TPGEN" quantize --type F32 "$G/mixed/transformer/flux2-tiny-mixed.gguf" "$TMP/mixed-f32.gguf" 2>&1)
mkdir -p "$TMP/mixed/transformer" && cp -r "$G/mixed/model_index.json" "$G/mixed/scheduler" "$TMP/mixed/" &&
    mv "$TMP/mixed-f32.gguf" "$TMP/mixed/transformer/"
out=$("$TPGEN" check --backend cpu --model "$TMP/mixed" --cases "$G/transformer_cases.safetensors" \
      --outputs "$G/gguf_cases.safetensors" --prefix mixed --tol 1e-5 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then ok "quantize_golden_mixed_F32: K-quants dequantised ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
else fail "quantize_golden_mixed_F32: $(echo "$out" | grep -v '^#' | tail -2)"; fi

# fp8 inputs (per-tensor, per-row and E5M2 scales): F32 of each matches the golden fp8 outputs at 1e-5
F=$TPGEN_GOLDEN/flux2-fp8
for v in scaled channel e5m2; do
    m=$TMP/fp8-$v
    mkdir -p "$m/transformer" && cp -r "$F/$v/model_index.json" "$F/$v/scheduler" "$m/" && cp "$F/$v/transformer/config.json" "$m/transformer/"
    out=$("$TPGEN" quantize --type F32 "$F/$v/transformer" "$m/transformer/t.gguf" 2>&1 &&
          "$TPGEN" check --backend cpu --model "$m" --cases "$A/transformer_cases.safetensors" \
              --outputs "$F/fp8_cases.safetensors" --prefix "$v" --tol 1e-5 2>&1)
    if [ $? -eq 0 ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then ok "quantize_golden_fp8_${v}_F32 ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
    else fail "quantize_golden_fp8_${v}_F32: $(echo "$out" | grep -v '^#' | tail -2)"; fi
done

# bad input: a clear error, non-zero exit, no file (and no temporary) left behind
mkdir -p "$TMP/bad"
none_left() { [ -z "$(ls -A "$TMP/bad")" ]; }
bad() { # NAME PATTERN ARGS...
    local name=$1 pat=$2; shift 2
    expect_fail "$name" "$pat" "$TPGEN" quantize "$@"
    none_left || { fail "$name: left $(ls "$TMP/bad")"; rm -rf "$TMP/bad"/*; }
}
bad quantize_bad_type_K "--type Q8_K is not supported yet; tpgen quantize writes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS" --type Q8_K "$D/input.safetensors" "$TMP/bad/o.gguf"
bad quantize_bad_type_name "--type Q9_9 is not a ggml type" --type Q9_9 "$D/input.safetensors" "$TMP/bad/o.gguf"
bad quantize_names_bad "--names foo: give bfl" --type Q8_0 --names foo "$D/input.safetensors" "$TMP/bad/o.gguf"
bad quantize_names_bfl_unknown "input.safetensors: not a diffusers FLUX.2 transformer" --type Q8_0 --names bfl "$D/input.safetensors" "$TMP/bad/o.gguf"
# FLUX.3 gets its own BFL names (the inverse of diffusers' FLUX.3 converter): tests/sh/flux3_gguf.sh
# the golden tiny transformer as one file with a tensor left out / an unknown tensor added: refused naming it
python3 - "$A/model/transformer" "$TMP" <<'PY'
import glob, json, struct, sys
t = {}
for p in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    for k, v in h.items():
        if k != "__metadata__": t[k] = (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
def write(path, t):
    h, off, data = {}, 0, b""
    for k, (d, s, raw) in t.items(): h[k] = {"dtype": d, "shape": s, "data_offsets": [off, off + len(raw)]}; off += len(raw); data += raw
    j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + data)
write(sys.argv[2] + "/less.safetensors", {k: v for k, v in t.items() if k != "transformer_blocks.1.attn.add_k_proj.weight"})
write(sys.argv[2] + "/more.safetensors", dict(t, **{"extra.weight": ("F32", [4, 64], bytes(1024))}))
PY
bad quantize_names_bfl_missing "tensor 'transformer_blocks.1.attn.add_k_proj.weight' is missing" --type Q8_0 "$TMP/less.safetensors" "$TMP/bad/o.gguf"
bad quantize_names_bfl_unmapped "tensor 'extra.weight' has no BFL name" --type Q8_0 "$TMP/more.safetensors" "$TMP/bad/o.gguf"
if "$TPGEN" quantize --type F32 --names keep "$TMP/more.safetensors" "$TMP/more.gguf" > /dev/null &&
   "$TPGEN" inspect --model "$TMP/more.gguf" 2>&1 | grep -qE '^ +transformer_blocks.1.attn.add_k_proj.weight +F32'
then ok "quantize_names_keep: diffusers names kept"; else fail "quantize_names_keep"; fi
bad quantize_no_type "needs --type T" "$D/input.safetensors" "$TMP/bad/o.gguf"
bad quantize_missing_input "input $TMP/none does not exist" --type Q8_0 "$TMP/none" "$TMP/bad/o.gguf"
bad quantize_no_folder "cannot write to the folder $TMP/bad/nodir" --type Q8_0 "$D/input.safetensors" "$TMP/bad/nodir/o.gguf"
head -c 100 /dev/urandom > "$TMP/junk.safetensors"
bad quantize_junk_input "junk.safetensors" --type Q8_0 "$TMP/junk.safetensors" "$TMP/bad/o.gguf"
touch "$TMP/bad/file"
expect_fail quantize_folder_is_file "cannot write to the folder $TMP/bad/file" "$TPGEN" quantize --type Q8_0 "$D/input.safetensors" "$TMP/bad/file/o.gguf"
echo keep > "$TMP/bad/exists.gguf"
expect_fail quantize_exists "output $TMP/bad/exists.gguf exists; pass --force" "$TPGEN" quantize --type Q8_0 "$D/input.safetensors" "$TMP/bad/exists.gguf"
if [ "$(cat "$TMP/bad/exists.gguf")" = keep ] && [ "$(ls "$TMP/bad" | wc -l)" -eq 2 ]; then ok "quantize_exists_kept: the file is untouched"
else fail "quantize_exists_kept: $(ls "$TMP/bad")"; fi
if "$TPGEN" quantize --type Q4_0 --force "$D/input.safetensors" "$TMP/bad/exists.gguf" > /dev/null && cmp -s "$TMP/bad/exists.gguf" "$D/ref-Q4_0.gguf"
then ok "quantize_force: --force replaces it"; else fail "quantize_force"; fi
rm -f "$TMP/bad"/*
# a tensor that cannot be written (an I64 tensor after a float one): refused mid-write, nothing left
python3 - "$TMP/int.safetensors" <<'PY'
import json, struct, sys
h = {"a.weight": {"dtype": "F32", "shape": [4, 64], "data_offsets": [0, 1024]},
     "z.index": {"dtype": "I64", "shape": [4], "data_offsets": [1024, 1056]}}
b = json.dumps(h).encode(); b += b' ' * (-len(b) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(b)) + b + bytes(1056))
PY
bad quantize_int_tensor "tensor 'z.index' is I64, not a float tensor" --type Q8_0 "$TMP/int.safetensors" "$TMP/bad/o.gguf"

ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:fast_unwind_on_malloc=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    ref_cases "$ASAN/tpgen" "asan_"
    if "$ASAN/tpgen" quantize --type F32 "$A/model/transformer" "$TMP/asan-bfl.gguf" > /dev/null && cmp -s "$TMP/asan-bfl.gguf" "$TMP/conv.gguf"
    then ok "asan_quantize_names_bfl_F32: the same BFL file"; else fail "asan_quantize_names_bfl_F32"; fi
    TPGEN=$ASAN/tpgen bad asan_quantize_names_bfl_unmapped "tensor 'extra.weight' has no BFL name" --type Q8_0 "$TMP/more.safetensors" "$TMP/bad/o.gguf"
    TPGEN=$ASAN/tpgen bad asan_quantize_int_tensor "tensor 'z.index' is I64" --type Q8_0 "$TMP/int.safetensors" "$TMP/bad/o.gguf"
else fail "sanitizer runs: build-asan/ not found (make asan)"; fi
