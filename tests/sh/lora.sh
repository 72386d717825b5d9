#!/usr/bin/env bash
# budget: 95 s; checks: 43
# LoRA adapters from the command line: `tpgen check --lora` on the golden
# flux2-lora cases with the BFL single-file layout (the diffusers layout is
# covered by tests/test_lora.c at np 1/2/4); end to end, a klein-tiny render
# with a LoRA must give the latents of a checkpoint with the same LoRA
# merged offline (tpgen_tests lora_offline_merge_e2e_files, double precision),
# the run-spec `loras:` the same bytes as --lora, the PNG parameters and
# --json-metrics the adapter's name, sha256 and weight; inspect --lora; bad
# input on every rank, also under the sanitizers.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN
L=$G/flux2-lora
CASES=$G/flux2-tiny-a/transformer_cases.safetensors
export OMP_NUM_THREADS=1

# ---- golden cases on the BFL layout (fused qkv, final layer in BFL order) ----
mkdir -p "$TMP/bfl/transformer"
if TPGEN_BFL_OUT="$TMP/bfl/transformer" "$TPGEN_TESTS" bfl_write_golden_as_bfl | grep -q '^ok - '; then :
else fail "lora: BFL conversion of the golden transformer failed"; fi
lora_args() {   # the --lora flags of a golden case, from lora.json
    python3 -c "import json,sys
j=json.load(open('$L/lora.json'))
c=[c for c in j['cases'] if c['name']=='$1'][0]
print(' '.join('--lora $L/%s:%r' % (a['file'], a['weight']) for a in c['adapters']))"
}
check_case() {   # NP MODEL CASE
    local out rc
    out=$($MPIRUN -np "$1" "$TPGEN" check --backend cpu --model "$2" --cases "$CASES" $(lora_args "$3") \
          --outputs "$L/lora_cases.safetensors" --prefix "$3" 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then
        ok "lora: check $3 np=$1 $(basename "$2") ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
    else fail "lora: check $3 np=$1 $2: rc=$rc $(echo "$out" | tail -2 | tr '\n' ' ')"; fi
}
out=$(TPGEN_LORA_BFL="$TMP/bfl/transformer" "$TPGEN_TESTS" lora_final_layer_halves_swapped 2>&1)
if echo "$out" | grep -q '^ok - ' && [ "$(echo "$out" | grep -c '^# BFL layout: final layer')" = 2 ]; then
    ok "lora: final-layer LoRA on the BFL layout, BFL and diffusers names (double-precision reference)"
else fail "lora: BFL final layer: $(echo "$out" | grep -E 'FAIL|#' | head -3)"; fi
for c in peft_r4 peft_r4_w06 peft_r4_w0 peft_r8 peftprefix_r4 aitk_r4 aitk_r4_dora kohya_r4 two; do
    check_case 2 "$TMP/bfl" $c
done
for np in 1 4; do check_case $np "$TMP/bfl" two; check_case $np "$TMP/bfl" aitk_r4; done
check_case 4 "$G/flux2-tiny-a/model" two
out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/flux2-tiny-a/model" --cases "$CASES" \
      $(lora_args aitk_r4_dora) --outputs "$L/lora_cases.safetensors" --prefix aitk_r4_dora 2>&1)
if [ "$(echo "$out" | grep -c 'warning: .*aitk_r4_dora.safetensors: 4 DoRA dora_scale key(s) dropped')" = 1 ]; then
    ok "lora: DoRA keys dropped with one warning"
else fail "lora: DoRA warning: $(echo "$out" | grep -i warn | head -2)"; fi

# ---- adapters on weights that stay quantised (fp8, GGUF): applied unmerged ----
# tests/test_lora_quant.c compares them with the merge into the dequantised
# twin; here the command line: tp 2 against the unsharded run on rank 0
Q=$TMP/qlora
mkdir -p "$Q"
if TPGEN_LORA_GGUF_OUT="$Q" "$TPGEN_TESTS" lora_gguf_adapter_file | grep -q '^ok - '; then :
else fail "lora: writing the GGUF model's adapter failed"; fi
qcheck() {   # NAME MODEL ADAPTER
    local out rc
    out=$($MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$2" --lora "$3" 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -qE '^max_rel_err=.* PASS$'; then
        ok "lora: $1 + LoRA (unmerged), tp 2 = unsharded ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
    else fail "lora: $1 + LoRA check: rc=$rc $(echo "$out" | tail -2 | tr '\n' ' ')"; fi
}
qcheck "fp8 weights" "$G/flux2-fp8/scaled" "$L/adapters/peft_r4.safetensors:0.8"
qcheck "GGUF mixed weights" "$G/flux2-gguf/mixed" "$Q/gguf-lora.safetensors:0.8"
expect_fail "lora: an adapter of another model size on a GGUF is refused" "another model size" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$G/flux2-gguf/mixed" --lora "$L/adapters/peft_r4.safetensors"

# ---- end to end: a LoRA at load vs the same LoRA merged offline ----
E=$TMP/e2e
mkdir -p "$E"
out=$(TPGEN_LORA_E2E="$E" "$TPGEN_TESTS" lora_offline_merge_e2e_files 2>&1)
if echo "$out" | grep -q '^ok - '; then ok "lora: offline-merged checkpoint written"
else fail "lora: offline merge: $(echo "$out" | tail -2)"; fi
K=$G/klein-tiny/model
for f in model_index.json scheduler text_encoder tokenizer vae; do ln -s "$K/$f" "$E/merged/$f"; done
gen() {   # NP MODEL OUT [ARGS...]
    local np=$1 model=$2 o=$3; shift 3
    $MPIRUN -np "$np" "$TPGEN" generate --backend cpu --model "$model" --prompt "a red fox" --width 64 --height 64 \
        --steps 2 --seed 5 --precision f32 --max-sequence-length 32 --output "$o.png" --save-latents "$o.st" "$@" 2>&1
}
rel_diff() {   # relative L2 between the 'latents' tensors of two files
    python3 - "$1" "$2" <<'EOF'
import json, struct, sys, math
def lat(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); t = h['latents']
    s, e = t['data_offsets']; d = b[8 + n + s:8 + n + e]
    return struct.unpack('<%df' % (len(d) // 4), d)
a, b = lat(sys.argv[1]), lat(sys.argv[2])
num = sum((x - y) ** 2 for x, y in zip(a, b)); den = sum(y * y for y in b)
print('%.3e' % math.sqrt(num / den))
EOF
}
g1=$(gen 2 "$K" "$TMP/withlora" --lora "$E/lora.safetensors:0.8" --json-metrics "$TMP/m.json"); r1=$?
g2=$(gen 2 "$E/merged" "$TMP/merged"); r2=$?
g3=$(gen 2 "$K" "$TMP/base"); r3=$?
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $r3 -eq 0 ]; then
    d=$(rel_diff "$TMP/withlora.st" "$TMP/merged.st"); b=$(rel_diff "$TMP/base.st" "$TMP/merged.st")
    if python3 -c "import sys; sys.exit(0 if $d <= 1e-5 and $b > 1e-3 else 1)"; then
        ok "lora: generate with --lora = offline-merged checkpoint (latents rel $d; without the LoRA $b)"
    else fail "lora: latents with --lora vs offline merge rel $d (base vs merged $b)"; fi
else fail "lora: generate rc=$r1/$r2/$r3: $(echo "$g1$g2$g3" | grep -i error | head -2)"; fi

sha=$(sha256sum "$E/lora.safetensors" | cut -d' ' -f1)
if grep -aq "loras: lora.safetensors (sha256 $sha, weight 0.8)" "$TMP/withlora.png" \
   && grep -aq "loras: none" "$TMP/base.png"; then ok "lora: PNG parameters name the adapter, its sha256 and weight"
else fail "lora: PNG parameters lack the adapter line"; fi
want=$("$TPGEN" inspect --model "$K" --tp 2 --json --lora "$E/lora.safetensors:0.8" \
       | python3 -c "import json,sys; print(json.load(sys.stdin)['loras'][0]['bytes_read_per_rank'])")
got=$(python3 -c "import json; l=json.load(open('$TMP/m.json'))['loras'][0]
assert l['file']=='lora.safetensors' and l['sha256']=='$sha' and abs(l['weight']-0.8)<1e-12 and l['format']=='peft'
print(l['bytes_read_per_rank'])" 2>&1)
if [ -n "$want" ] && [ "$got" = "$want" ]; then ok "lora: --json-metrics lists the adapter; bytes per rank $got = inspect --lora"
else fail "lora: metrics '$got' vs inspect '$want'"; fi

# the run spec's loras: key gives the same bytes as --lora
cat > "$TMP/spec.yaml" <<EOF
loras:
  - {path: $E/lora.safetensors, weight: 0.8}
EOF
g4=$(gen 2 "$K" "$TMP/spec" --spec "$TMP/spec.yaml"); r4=$?
if [ $r4 -eq 0 ] && cmp -s "$TMP/spec.st" "$TMP/withlora.st"; then ok "lora: run-spec loras: = --lora (same latents)"
else fail "lora: run spec loras: rc=$r4 $(echo "$g4" | grep -v "^#" | tail -4 | tr "\n" " ")"; fi
# --lora on the command line replaces the spec's list (weight 0 = no adapter)
g5=$(gen 1 "$K" "$TMP/flag0" --spec "$TMP/spec.yaml" --lora "$E/lora.safetensors:0"); r5=$?
g6=$(gen 1 "$K" "$TMP/base1"); r6=$?
if [ $r5 -eq 0 ] && [ $r6 -eq 0 ] && cmp -s "$TMP/flag0.st" "$TMP/base1.st"; then
    ok "lora: --lora overrides the spec's loras; weight 0 renders the base model bit for bit"
else fail "lora: override / weight 0: rc=$r5/$r6"; fi

# inspect --lora: format, rank, fused qkv split
out=$("$TPGEN" inspect --model "$G/flux2-tiny-a/model" --tp 2 --lora "$L/adapters/kohya_r4.safetensors" 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q 'format kohya, rank 4, scale 0.5' \
   && echo "$out" | grep -E '^ +double_blocks_0_img_attn_qkv +transformer_blocks\.0\.attn\.to_v\.weight' | grep -q ' 256 '; then
    ok "lora: inspect --lora shows format, scale and the q/k/v split of a fused qkv"
else fail "lora: inspect --lora: rc=$rc $(echo "$out" | head -3 | tr '\n' ' ')"; fi

# ---- bad input: clear errors, non-zero exit on every rank, no hang ----
printf 'not safetensors' > "$TMP/junk.safetensors"
cat > "$TMP/nopath.yaml" <<EOF
loras:
  - {weight: 0.5}
EOF
cat > "$TMP/notlist.yaml" <<EOF
loras: {path: a.safetensors}
EOF
# an adapter with a NaN in rank 1's rows of lora_B (to_q colwise at tp 2: rows 64..127): only rank 1 reads it
python3 - "$TMP/nan_rank1.safetensors" <<'EOF2'
import json, struct, sys
a = [0.01] * (4 * 128); b = [0.02] * (128 * 4); b[100 * 4 + 1] = float('nan')
h = {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight": {"dtype": "F32", "shape": [4, 128], "data_offsets": [0, 2048]},
     "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": {"dtype": "F32", "shape": [128, 4], "data_offsets": [2048, 4096]}}
hb = json.dumps(h).encode(); hb += b' ' * (-len(hb) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(hb)) + hb + struct.pack('<512f', *a) + struct.pack('<512f', *b))
EOF2
bad_cases() {   # BINARY PREFIX
    local T=$1 p=$2
    expect_fail "${p}lora: missing adapter file" "/nonexistent/a\.safetensors" \
        timeout 120 $MPIRUN -np 2 "$T" generate --backend cpu --model "$K" --prompt x --width 64 --height 64 \
        --output "$TMP/x.png" --lora /nonexistent/a.safetensors
    expect_fail "${p}lora: junk adapter" "junk\.safetensors" \
        timeout 120 $MPIRUN -np 2 "$T" check --backend cpu --model "$G/flux2-tiny-a/model" --lora "$TMP/junk.safetensors"
    expect_fail "${p}lora: adapter for another model size" "to_q.*needs A \[r, 128\]|matches no Linear|another model" \
        timeout 120 $MPIRUN -np 2 "$T" check --backend cpu --model "$G/flux2-tiny-a/model" --lora "$E/lora.safetensors"
    expect_fail "${p}lora: non-finite weight" "finite" \
        "$T" generate --model "$K" --prompt x --lora "$E/lora.safetensors:nan"
    expect_fail "${p}lora: spec item without path" "nopath\.yaml:2:.*no 'path'" \
        "$T" generate --model "$K" --prompt x --spec "$TMP/nopath.yaml"
    expect_fail "${p}lora: spec loras not a list" "notlist\.yaml:1:.*list of adapters" \
        "$T" generate --model "$K" --prompt x --spec "$TMP/notlist.yaml"
    expect_fail "${p}lora: NaN in rank 1's share fails every rank" "rank 1: .*to_q\.lora_B\.weight has a non-finite" \
        timeout 120 $MPIRUN -np 2 "$T" check --backend cpu --model "$G/flux2-tiny-a/model" --cases "$CASES" \
        --lora "$TMP/nan_rank1.safetensors"
    expect_fail "${p}lora: inspect with a junk adapter" "junk\.safetensors" \
        "$T" inspect --model "$G/flux2-tiny-a/model" --lora "$TMP/junk.safetensors"
}
bad_cases "$TPGEN" ""
ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ] && [ -x "$ASAN/tpgen_tests" ]; then
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1   # ASAN_OPTIONS and LSAN_OPTIONS (leaks on) come from tests/run.sh
    bad_cases "$ASAN/tpgen" "asan_"
    out=$("$ASAN/tpgen_tests" bad_lora 2>&1); rc=$?
    n=$(echo "$out" | grep -c '^ok - ')
    if [ $rc -eq 0 ] && [ "$n" -ge 6 ] && ! echo "$out" | grep -qE 'FAIL|ERROR|runtime error'; then
        ok "asan_lora_unit_bad_tests ($n passed)"
    else fail "asan_lora_unit_bad_tests: rc $rc: $(echo "$out" | grep -E 'FAIL|ERROR|runtime error' | head -3)"; fi
else
    fail "lora sanitizer runs: build-asan/ not found (make asan)"
fi
