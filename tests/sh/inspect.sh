#!/usr/bin/env bash
# budget: 10 s; checks: 33
# tpgen inspect: per-rank bytes of the real FLUX.2 shapes (sparse, header-only
# checkpoints) against the config formulas, the JSON contract, and bad input
# (each must fail with a clear message, non-zero exit, no crash), also under
# AddressSanitizer + UBSan when build-asan/ exists.
[ -n "${TPGEN_ROOT:-}" ] && [ -n "${TPGEN:-}" ] && [ -n "${TPGEN_GOLDEN:-}" ] || { echo "FAIL - inspect.sh: run it through tests/run.sh"; exit 1; }
. "$TPGEN_ROOT/tests/lib.sh"
[ -d "$TMP" ] || { echo "FAIL - inspect.sh: no temporary folder"; exit 1; }
GOLD=$TPGEN_GOLDEN/flux2-tiny-a/model

# json_field FILE KEY: the values of "KEY": in an indented JSON dump, one a line
json_field() { grep -o "\"$2\": [^,}]*" "$1" | sed 's/^[^:]*: //'; }

# le64 N: N as 8 little-endian bytes
le64() { local i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(( ($1 >> (8 * i)) & 255 )))"; done; }

# mkst FILE NAME:ROWS:COLS ...: a header-only BF16 safetensors file (data area a hole)
mkst() {
    local f=$1 h="{" off=0 sep="" n r c sz spec; shift
    for spec in "$@"; do
        IFS=: read -r n r c <<<"$spec"; sz=$((r * c * 2))
        h+="$sep\"$n\":{\"dtype\":\"BF16\",\"shape\":[$r,$c],\"data_offsets\":[$off,$((off + sz))]}"
        off=$((off + sz)); sep=,
    done
    h+="}"
    { le64 ${#h}; printf '%s' "$h"; } >"$f"
    truncate -s $((8 + ${#h} + off)) "$f"
}

# rawst FILE CLAIMED_LEN HEADER DATA_BYTES: a file with an arbitrary header (CLAIMED_LEN - : its real length)
rawst() { local n=$2; [ "$n" = - ] && n=${#3}; { le64 "$n"; printf '%s' "$3"; } >"$1"; truncate -s $((8 + ${#3} + $4)) "$1"; }

# a model folder whose transformer is the single file $1/transformer/diffusion_pytorch_model.safetensors
mkmodel() { mkdir -p "$1/transformer"; cp "$GOLD/transformer/config.json" "$1/transformer/"; }

# ---- real shapes: per-rank weight bytes = replicated + sharded / tp (docs/spec/flux2-transformer.md §7.4) ----
check_shape() { # NAME H L S JT GUIDANCE SHARDS GB1 GB2 GB4 GB8
    local name=$1 H=$2 L=$3 S=$4 Jt=$5 g=$6 shards=$7; shift 7
    local dir=$TMP/$name D=$((128 * H)) M rep sh tp i=0 out bad=""
    M=$((3 * D))
    rep=$((2 * (D * 128 + D * Jt + D * 256 + D * D + g * (D * 256 + D * D) + 17 * D * D + 128 * D + L * 512 + S * 256)))
    sh=$((2 * (L * (8 * D * D + 6 * M * D) + S * ((3 * D + 2 * M) * D + D * (D + M)))))
    "$TPGEN" bench load --make "$dir" --shape "$name" --sparse --shards "$shards" >/dev/null || { fail "inspect_$name: make"; return; }
    for tp in 1 2 4 8; do
        i=$((i + 1))
        out=$TMP/$name-$tp.json
        "$TPGEN" inspect --model "$dir" --tp $tp --json >"$out" 2>"$out.err" || bad+=" tp$tp:exit"
        local want=$((rep + sh / tp)) got
        got=$(json_field "$out" weight_bytes | sort -u)
        [ "$got" = "$want" ] || bad+=" tp$tp:bytes($got!=$want)"
        [ "$(json_field "$out" weight_bytes | wc -l)" -eq $tp ] || bad+=" tp$tp:ranks"
        grep -q '"valid": true' "$out" && grep -q '"error": null' "$out" || bad+=" tp$tp:valid"
        local gb; gb=$(awk -v b="$want" 'BEGIN { printf "%.2f", b / 1e9 }')
        [ "$gb" = "${!i}" ] || bad+=" tp$tp:spec($gb!=${!i})"
    done
    [ -z "$bad" ] && ok "inspect_real_shape_$name" || fail "inspect_real_shape_$name:$bad"
    rm -rf "$dir"
}
check_shape dev 48 8 48 15360 1 7 64.45 33.04 17.34 9.48
check_shape klein-4b 24 5 20 7680 0 1 7.75 4.07 2.23 1.31

# ---- bench load stays usable: a small random checkpoint, 2 ranks, bytes read = each rank's share ----
"$TPGEN" bench load --make "$TMP/small" --shape small --shards 2 >/dev/null \
    && $MPIRUN -np 2 "$TPGEN" bench load --model "$TMP/small" --json >"$TMP/bl.json" 2>"$TMP/bl.err"; rc=$?
rd=$(json_field "$TMP/bl.json" bytes_read | sort -u); wb=$(json_field "$TMP/bl.json" weight_bytes | sort -u)
"$TPGEN" inspect --model "$TMP/small" --tp 2 --json >"$TMP/bl-inspect.json" 2>/dev/null
want=$(json_field "$TMP/bl-inspect.json" weight_bytes | sort -u)
if [ $rc -eq 0 ] && [ -n "$rd" ] && [ "$(echo "$rd" | wc -l)" -eq 1 ] && awk -v a="$rd" -v b="$wb" -v c="$want" 'BEGIN { exit !(a == b && a == c) }'; then
    ok "bench_load_reads_rank_share"
else fail "bench_load_reads_rank_share: rc $rc read '$rd' held '$wb' inspect '$want' $(head -c 200 "$TMP/bl.err")"; fi
rm -rf "$TMP/small"

# ---- the golden tiny model ----
out=$("$TPGEN" inspect --model "$GOLD" --tp 2)
if [ $? -eq 0 ] && echo "$out" | grep -qE 'to_qkv_mlp_proj.weight +packed_colwise\(D,D,D,M,M\) +\[1152, 128\] +\[576, 128\]' \
    && echo "$out" | grep -qE 'to_out.weight +packed_rowwise\(D,M\) +\[128, 512\] +\[128, 256\]'; then
    ok "inspect_tiny_table"
else fail "inspect_tiny_table: $(echo "$out" | head -5)"; fi

"$TPGEN" inspect --model "$GOLD" --tp 3 --json >"$TMP/tp3.json" 2>"$TMP/tp3.err"; rc=$?
if [ $rc -ne 0 ] && grep -q '"valid": false' "$TMP/tp3.json" && grep -q '"error": "tp 3 does not divide num_attention_heads (4)' "$TMP/tp3.json" \
    && grep -q '"ranks": \[\]' "$TMP/tp3.json"; then ok "inspect_json_invalid_tp"
else fail "inspect_json_invalid_tp: rc $rc $(head -c 300 "$TMP/tp3.json")"; fi

# under mpirun every process computes the same answer; the error is printed once
out=$($MPIRUN -np 2 "$TPGEN" inspect --model "$GOLD" --tp 3 --summary 2>&1); rc=$?
n=$(echo "$out" | grep -c 'tpgen: error: tp 3 does not divide')
[ $rc -ne 0 ] && [ "$n" -eq 1 ] && ok "inspect_under_mpirun_prints_once" || fail "inspect_under_mpirun_prints_once: rc $rc, $n messages"

# ---- other components: the Qwen3 text encoder (plan + layer filter) and a component without a plan ----
K=$TPGEN_GOLDEN/klein-tiny/model
"$TPGEN" inspect --model "$K" --component text_encoder --tp 2 --json >"$TMP/te.json" 2>"$TMP/te.err"; rc=$?
if [ $rc -eq 0 ] && grep -q '"plan": "qwen3"' "$TMP/te.json" && grep -q '"valid": true' "$TMP/te.json" \
    && grep -q '"loaded": false' "$TMP/te.json" && [ "$(json_field "$TMP/te.json" weight_bytes | wc -l)" -eq 2 ]; then
    ok "inspect_text_encoder_plan"
else fail "inspect_text_encoder_plan: rc $rc $(head -c 300 "$TMP/te.err")"; fi
"$TPGEN" inspect --model "$K" --component vae --tp 4 --json >"$TMP/vae.json" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q '"plan": null' "$TMP/vae.json" && ! grep -q '"style": "colwise"' "$TMP/vae.json"; then
    ok "inspect_component_without_plan_is_replicated"
else fail "inspect_component_without_plan_is_replicated: rc $rc"; fi
expect_fail "inspect_bad_component" "has no 'unet' folder" "$TPGEN" inspect --model "$K" --component unet

# ---- bad input: each case is a model folder and the message it must produce ----
B=$TMP/bad
mkdir -p "$B"
cp -r "$GOLD" "$B/trunc" && chmod -R u+w "$B/trunc"
truncate -s 100000 "$B/trunc/transformer/diffusion_pytorch_model-00002-of-00002.safetensors"
cp -r "$GOLD" "$B/idx_tensor" && chmod -R u+w "$B/idx_tensor"
sed -i 's/"proj_out.weight": "diffusion_pytorch_model-00001-of-00002/"proj_out.weight": "diffusion_pytorch_model-00002-of-00002/' \
    "$B/idx_tensor/transformer/diffusion_pytorch_model.safetensors.index.json"
cp -r "$GOLD" "$B/idx_file" && chmod -R u+w "$B/idx_file"
sed -i 's/"proj_out.weight": "diffusion_pytorch_model-00001-of-00002/"proj_out.weight": "diffusion_pytorch_model-00009-of-00009/' \
    "$B/idx_file/transformer/diffusion_pytorch_model.safetensors.index.json"
GOOD='{"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}}'
for c in hlen json offs shape dtype; do mkmodel "$B/$c"; done
rawst "$B/hlen/transformer/diffusion_pytorch_model.safetensors" 1000000 "$GOOD" 12
rawst "$B/json/transformer/diffusion_pytorch_model.safetensors" - '{"w":{"dtype":"BF16","shape":[2' 12
rawst "$B/offs/transformer/diffusion_pytorch_model.safetensors" - '{"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]}}' 12
rawst "$B/shape/transformer/diffusion_pytorch_model.safetensors" - '{"w":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,12]}}' 12
rawst "$B/dtype/transformer/diffusion_pytorch_model.safetensors" - '{"w":{"dtype":"BF99","shape":[2,3],"data_offsets":[0,12]}}' 12
# packed block not divisible: D = 64 (2 heads), M = int(64 * 3.015625) = 193, tp 2
mkdir -p "$B/packed/transformer"
echo '{"num_attention_heads": 2, "attention_head_dim": 32, "mlp_ratio": 3.015625}' >"$B/packed/transformer/config.json"
T=transformer_blocks.0
mkst "$B/packed/transformer/diffusion_pytorch_model.safetensors" \
    $T.attn.to_q.weight:64:64 $T.attn.to_k.weight:64:64 $T.attn.to_v.weight:64:64 $T.attn.add_q_proj.weight:64:64 \
    $T.attn.add_k_proj.weight:64:64 $T.attn.add_v_proj.weight:64:64 $T.attn.to_out.0.weight:64:64 \
    $T.attn.to_add_out.weight:64:64 $T.ff.linear_in.weight:386:64 $T.ff.linear_out.weight:64:193 \
    $T.ff_context.linear_in.weight:386:64 $T.ff_context.linear_out.weight:64:193 \
    single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight:578:64 single_transformer_blocks.0.attn.to_out.weight:64:257

bad_cases() { # BIN PREFIX
    local bin=$1 p=$2
    expect_fail "${p}inspect_bad_truncated" 'truncated|outside the data area' "$bin" inspect --model "$B/trunc" --tp 2
    expect_fail "${p}inspect_bad_header_len" 'header length 1000000 goes beyond' "$bin" inspect --model "$B/hlen"
    expect_fail "${p}inspect_bad_json" 'malformed JSON header' "$bin" inspect --model "$B/json"
    expect_fail "${p}inspect_bad_offsets" "tensor 'w': data_offsets \[8, 20\] lie outside" "$bin" inspect --model "$B/offs"
    expect_fail "${p}inspect_bad_shape" "tensor 'w': shape needs 16 bytes of BF16 but data_offsets span 12" "$bin" inspect --model "$B/shape"
    expect_fail "${p}inspect_bad_dtype" "unknown dtype 'BF99'" "$bin" inspect --model "$B/dtype"
    expect_fail "${p}inspect_bad_index_tensor" "'proj_out.weight' is listed in .* but missing from .*00002-of-00002" "$bin" inspect --model "$B/idx_tensor"
    expect_fail "${p}inspect_bad_index_file" '00009-of-00009.safetensors.*No such file' "$bin" inspect --model "$B/idx_file"
    expect_fail "${p}inspect_bad_tp_heads" 'tp 3 does not divide num_attention_heads \(4\)' "$bin" inspect --model "$GOLD" --tp 3
    expect_fail "${p}inspect_bad_packed_block" "single_transformer_blocks.0.attn.to_[a-z_]+.weight' \(packed_[a-z]+, blocks [DM,]+\): block [0-9] of size 193 is not divisible by tp 2" \
        "$bin" inspect --model "$B/packed" --tp 2
    expect_fail "${p}inspect_bad_no_model" 'does not exist' "$bin" inspect --model "$B/nothing-here"
}
bad_cases "$TPGEN" ""
# the same folder is fine at tp 1
"$TPGEN" inspect --model "$B/packed" --tp 1 --summary >/dev/null 2>&1 && ok "inspect_packed_tp1_valid" || fail "inspect_packed_tp1_valid"

# ---- sanitizers ----
ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ] && [ -x "$ASAN/tpgen_tests" ]; then
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1   # ASAN_OPTIONS and LSAN_OPTIONS (leaks on) come from tests/run.sh
    bad_cases "$ASAN/tpgen" "asan_"
    out=$("$ASAN/tpgen_tests" bad_ 2>&1); rc=$?
    n=$(echo "$out" | grep -c '^ok - ')
    if [ $rc -eq 0 ] && [ "$n" -gt 0 ] && ! echo "$out" | grep -qE 'AddressSanitizer|LeakSanitizer|runtime error'; then
        ok "asan_unit_bad_tests ($n passed)"
    else fail "asan_unit_bad_tests: rc $rc: $(echo "$out" | grep -E 'FAIL|ERROR|runtime error' | head -3)"; fi
else
    fail "sanitizer runs: build-asan/ not found (the test command 'make test' builds it; or run 'make asan')"
fi
