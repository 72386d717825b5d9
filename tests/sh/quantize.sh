#!/usr/bin/env bash
# tpgen quantize: every legacy type's output equals gguf-py 0.19.0's GGUF of the same f32 input byte for
# byte (tests/data/quant, made by tests/tools/quant_testdata.py: types, shapes, tensor bytes, metadata and
# layout), Q4_K/Q5_K/Q6_K the GGUFs of tests/tools/kquant_ref.py (a numpy port of ggml's reference
# K-quantisers) byte for byte; the golden tiny transformer as Q4_K / Q5_K / Q6_K passes tpgen check within
# 6e-2 / 3e-2 / 1.5e-2; requantising the golden flux2-gguf Q8_0 file (ComfyUI-GGUF layout, gguf-py's quantiser)
# reproduces it byte for byte; the golden tiny transformer (diffusers folder, sharded) quantised to Q8_0
# passes tpgen check against its unquantised golden outputs within 3e-2 (measured 1.08e-2; the golden
# flux2-gguf Q8_0 model is 5.6e-3 from its unquantised outputs) and is not the f32 model (> 1e-3); F32 and
# BF16 of it (its weights are bf16, so both are lossless) within 1e-4; F32 of the golden mixed GGUF (K-quants dequantised) matches its
# gguf_cases at 1e-5, F32 of the golden fp8 folders their fp8_cases at 1e-5; bad input refused with no file left behind; the byte comparisons again under ASan.
[ -n "${TPGEN_ROOT:-}" ] && [ -n "${TPGEN:-}" ] && [ -n "${TPGEN_GOLDEN:-}" ] || { echo "FAIL - quantize.sh: run it through tests/run.sh"; exit 1; }
. "$TPGEN_ROOT/tests/lib.sh"
D=$TPGEN_ROOT/tests/data/quant
MPI=${MPIRUN:-mpirun --oversubscribe --allow-run-as-root}
TYPES="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K"

ref_cases() { # TPGEN PREFIX
    local bin=$1 p=$2 t out
    for t in $TYPES; do
        out=$("$bin" quantize --type "$t" "$D/input.safetensors" "$TMP/$p$t.gguf" 2>&1)
        if [ $? -eq 0 ] && cmp -s "$TMP/$p$t.gguf" "$D/ref-$t.gguf"; then ok "${p}quantize_ref_$t: identical to the reference file"
        else fail "${p}quantize_ref_$t: $(echo "$out" | tail -2; cmp "$TMP/$p$t.gguf" "$D/ref-$t.gguf" 2>&1 | head -1)"; fi
    done
    for t in Q4_K Q5_K Q6_K; do   # 32 more super-blocks (f16 input) of varied distributions
        out=$("$bin" quantize --type "$t" "$D/kquant-input.safetensors" "$TMP/${p}kq$t.gguf" 2>&1)
        if [ $? -eq 0 ] && cmp -s "$TMP/${p}kq$t.gguf" "$D/ref-kq-$t.gguf"; then ok "${p}quantize_ref_kq_$t: identical to the port's file"
        else fail "${p}quantize_ref_kq_$t: $(echo "$out" | tail -2; cmp "$TMP/${p}kq$t.gguf" "$D/ref-kq-$t.gguf" 2>&1 | head -1)"; fi
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
    "$TPGEN" quantize --type "$1" "$A/model/transformer" "$m/transformer/t-$1.gguf" > /dev/null
}
check_case() { # NAME TYPE TOL MIN [check args...]: max_rel_err <= TOL and >= MIN
    local name=$1 t=$2 tol=$3 min=$4 out e; shift 4
    if ! folder "$t"; then fail "$name: quantize failed"; return; fi
    out=$($MPI -np 2 "$TPGEN" check --backend cpu --model "$TMP/m-$t" --cases "$A/transformer_cases.safetensors" --tol "$tol" "$@" 2>&1)
    e=$(echo "$out" | grep -oE '^max_rel_err=[0-9.e+-]+' | cut -d= -f2)
    if [ -n "$e" ] && echo "$out" | grep -qE ' PASS$' && awk -v e="$e" -v m="$min" 'BEGIN { exit !(e >= m) }'
    then ok "$name (max_rel_err=$e, tp 2)"
    else fail "$name: $(echo "$out" | grep -v '^#' | tail -2)"; fi
}
check_case quantize_golden_tiny_Q8_0 Q8_0 3e-2 1e-3
# K-quants: only the 3 single-block to_out weights [512 128] have whole 256-blocks (the rest F16/F32);
# measured 2.02e-2 (Q4_K), 1.09e-2 (Q5_K), 5.08e-3 (Q6_K): the error halves per bit, as it should;
# tolerance 3x that, and not the f32 model (> 1e-3)
check_case quantize_golden_tiny_Q4_K Q4_K 6e-2 1e-3
check_case quantize_golden_tiny_Q5_K Q5_K 3e-2 1e-3
check_case quantize_golden_tiny_Q6_K Q6_K 1.5e-2 1e-3
check_case quantize_golden_tiny_F32 F32 1e-4 0
check_case quantize_golden_tiny_BF16 BF16 1e-4 0   # the golden weights are bf16: lossless

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
bad quantize_bad_type_K "--type Q2_K is not supported yet; tpgen quantize writes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K" --type Q2_K "$D/input.safetensors" "$TMP/bad/o.gguf"
bad quantize_bad_type_name "--type Q9_9 is not a ggml type" --type Q9_9 "$D/input.safetensors" "$TMP/bad/o.gguf"
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
    TPGEN=$ASAN/tpgen bad asan_quantize_int_tensor "tensor 'z.index' is I64" --type Q8_0 "$TMP/int.safetensors" "$TMP/bad/o.gguf"
else fail "sanitizer runs: build-asan/ not found (make asan)"; fi
