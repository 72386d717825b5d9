#!/usr/bin/env bash
# budget: 65 s; checks: 30
# GGUF transformers run sharded: tpgen check of the golden flux2-gguf folders
# (Q8_0, Q4_K, mixed: quantised weights kept quantised, decoded in the GEMM's
# packing) against diffusers' float32 forward on gguf-py's dequantised
# weights (gguf_cases.safetensors), at tp 1 and 2 (2: row-parallel shards of
# half a K-quant block), f32 <= 1e-5 and bf16 <= 3e-2; tp 4 refused (the
# model has 2 heads); inspect --tp 2 shows the block types and per-rank
# bytes; generate from a GGUF folder gives the latents of its dequantised
# twin; again under AddressSanitizer + UBSan when build-asan/ exists.
[ -n "${TPGEN_ROOT:-}" ] && [ -n "${TPGEN:-}" ] && [ -n "${TPGEN_GOLDEN:-}" ] || { echo "FAIL - gguf_check.sh: run it through tests/run.sh"; exit 1; }
. "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN/flux2-gguf
MPI=${MPIRUN:-mpirun --oversubscribe --allow-run-as-root}

check_case() { # NAME TPGEN VARIANT TP PRECISION TOL
    local name=$1 bin=$2 v=$3 tp=$4 prec=$5 tol=$6 out
    out=$($MPI -np "$tp" "$bin" check --model "$G/$v" --cases "$G/transformer_cases.safetensors" \
          --outputs "$G/gguf_cases.safetensors" --prefix "$v" --precision "$prec" --tol "$tol" 2>&1)
    local rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -qE "^max_rel_err=.* PASS$"; then ok "$name ($(echo "$out" | grep -oE 'max_rel_err=[^ ]+'))"
    else fail "$name: rc $rc, $(echo "$out" | wc -l) lines of output: $(echo "$out" | tail -4 | tr '\n' ' ')"; fi
}

run_cases() { # TPGEN PREFIX TPS
    local bin=$1 p=$2 tps=$3 v tp
    for v in Q8_0 Q4_K mixed; do
        for tp in $tps; do
            check_case "${p}gguf_check_${v}_tp${tp}_f32" "$bin" "$v" "$tp" f32 1e-5
            check_case "${p}gguf_check_${v}_tp${tp}_bf16" "$bin" "$v" "$tp" bf16 3e-2
        done
    done
    expect_fail "${p}gguf_check_tp4_refused" "tensor-parallel degree 4 does not divide num_attention_heads 2" \
        $MPI -np 4 "$bin" check --model "$G/Q4_K" --cases "$G/transformer_cases.safetensors" \
        --outputs "$G/gguf_cases.safetensors" --prefix Q4_K
}

run_cases "$TPGEN" "" "1 2"

# inspect: the ggml types, and per-rank bytes = the blocks each rank holds
out=$("$TPGEN" inspect --model "$G/Q4_K" --tp 2 2>&1)
if echo "$out" | grep -qE '^double_blocks\.0\.img_attn\.proj\.weight +rowwise +\[256, 256\] +\[256, 128\] Q4_K$' &&
    [ "$(echo "$out" | awk '$1 ~ /^[01]$/ && NF == 6 { print $4 }' | sort -u | wc -l)" = 1 ] &&
    echo "$out" | grep -q '^valid: tp 2'; then ok "gguf_inspect_tp2"
else fail "gguf_inspect_tp2: $(echo "$out" | tail -5)"; fi

# generate end to end from a GGUF folder (transformer only: prompt embeddings
# from the cases file, latents saved): the latents equal, to f32 rounding,
# those of the same pipeline whose transformer is the GGUF's dequantised twin
# (F32 safetensors written by the test binary from gguf_read_f32), at tp 1
# and 2
rel_l2() { # A.safetensors B.safetensors: relative L2 of their F32 'latents' tensors (stdlib python)
    python3 - "$1" "$2" <<'PY'
import json, struct, sys, math
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    k = [k for k in h if k != '__metadata__' and h[k]['dtype'] == 'F32'][0]; o = h[k]['data_offsets']
    return struct.unpack('<%df' % ((o[1] - o[0]) // 4), b[8 + n + o[0]:8 + n + o[1]])
a, b = load(sys.argv[1]), load(sys.argv[2])
if len(a) != len(b) or not a: print('inf'); sys.exit()
d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))); r = math.sqrt(sum(y * y for y in b))
print('%.3e' % (d / r if r else float('inf')))
PY
}
gen() { # DIR NP OUT
    $MPI -np "$2" "$TPGEN" generate --model "$1" --prompt-embeds "$G/transformer_cases.safetensors:case1.encoder_hidden_states" \
        --width 96 --height 64 --precision f32 --seed 3 --steps 4 --backend cpu --save-latents "$3" 2>&1
}
for v in mixed Q4_K; do
    T=$TMP/twin-$v
    mkdir -p "$T/transformer" && cp "$G/$v/model_index.json" "$T/" && cp -r "$G/$v/scheduler" "$T/" && chmod -R u+w "$T"
    if ! TPGEN_GGUF_TWIN_OUT="$T/transformer" TPGEN_GGUF_TWIN_VARIANT=$v "$TPGEN_TESTS" gguf_write_dequantised_twin | grep -q '^ok - '; then
        fail "gguf_generate_$v: writing the dequantised twin failed"; continue
    fi
    for np in 1 2; do
        out=$(gen "$G/$v" $np "$TMP/q-$v-$np.st"); rq=$?
        tw=$(gen "$T" $np "$TMP/t-$v-$np.st"); rt=$?
        e=$([ $rq -eq 0 ] && [ $rt -eq 0 ] && rel_l2 "$TMP/q-$v-$np.st" "$TMP/t-$v-$np.st")
        if [ -n "$e" ] && python3 -c "import sys; sys.exit(0 if $e <= 1e-5 else 1)"; then
            ok "gguf_generate_${v}_tp$np: latents = the dequantised twin's (rel L2 $e)"
        else fail "gguf_generate_${v}_tp$np: rc $rq/$rt err '$e': $(echo "$out" | grep -v '^#' | tail -2)"; fi
    done
done

# a whole job (prompt -> text encoder -> GGUF transformer -> VAE -> PNG): klein-tiny's transformer
# quantised to Q8_0 by tpgen quantize (bytes proven equal to gguf-py's in quantize.sh), beside the
# pipeline's own text encoder and VAE; its latents equal, to f32 rounding, those of the same job on the
# GGUF's dequantised twin (tpgen quantize --type F32 of that GGUF), at tp 1 and 2
K=$TPGEN_GOLDEN/klein-tiny/model
if "$TPGEN" quantize --type Q8_0 "$K/transformer" "$TMP/klein-q8.gguf" >/dev/null 2>&1 &&
   "$TPGEN" quantize --type F32 "$TMP/klein-q8.gguf" "$TMP/klein-q8-twin.gguf" >/dev/null 2>&1; then
    job() { # TRANSFORMER NP OUT
        $MPI -np "$2" "$TPGEN" generate --model "$K" --transformer "$1" --prompt "a red fox in the snow" --seed 5 \
            --width 64 --height 48 --steps 3 --precision f32 --backend cpu --output "$3.png" --save-latents "$3.st" 2>&1
    }
    for np in 1 2; do
        out=$(job "$TMP/klein-q8.gguf" $np "$TMP/kq-$np"); rq=$?
        tw=$(job "$TMP/klein-q8-twin.gguf" $np "$TMP/kt-$np"); rt=$?
        ref=$(job "$K/transformer" $np "$TMP/kr-$np"); rr=$?
        e=$([ $rq -eq 0 ] && [ $rt -eq 0 ] && rel_l2 "$TMP/kq-$np.st" "$TMP/kt-$np.st")
        d=$([ $rr -eq 0 ] && [ -n "$e" ] && rel_l2 "$TMP/kq-$np.st" "$TMP/kr-$np.st")
        # the twin agrees to rounding; the bf16 original differs by the quantisation (so the GGUF was used)
        if [ -n "$e" ] && [ -n "$d" ] && [ -s "$TMP/kq-$np.png" ] &&
           python3 -c "import sys; sys.exit(0 if $e <= 1e-5 and $d > 1e-4 else 1)"; then
            ok "gguf_generate_klein_Q8_0_prompt_tp$np: a whole job from a Q8_0 GGUF: latents = the dequantised twin's (rel L2 $e; vs the unquantised model $d)"
        else fail "gguf_generate_klein_Q8_0_prompt_tp$np: rc $rq/$rt/$rr err '$e' vs original '$d': $(echo "$out" | grep -v '^#' | tail -2)"; fi
    done
else fail "gguf_generate_klein_Q8_0_prompt: tpgen quantize of $K/transformer failed"; fi

# --transformer DIR (and the run-spec key transformer:) replaces the
# pipeline's transformer/: a folder without one, given the GGUF folder, gives
# the latents of the GGUF pipeline folder bit for bit
P=$TMP/pipe-only
mkdir -p "$P" && cp "$G/Q4_K/model_index.json" "$P/" && cp -r "$G/Q4_K/scheduler" "$P/" && chmod -R u+w "$P"
gen "$G/Q4_K" 2 "$TMP/folder.st" >/dev/null
out=$($MPI -np 2 "$TPGEN" generate --model "$P" --transformer "$G/Q4_K/transformer" \
      --prompt-embeds "$G/transformer_cases.safetensors:case1.encoder_hidden_states" --width 96 --height 64 \
      --precision f32 --seed 3 --steps 4 --backend cpu --save-latents "$TMP/flag.st" 2>&1)
if [ $? -eq 0 ] && cmp -s "$TMP/folder.st" "$TMP/flag.st"; then ok "gguf_transformer_flag: --transformer gives the folder's latents"
else fail "gguf_transformer_flag: $(echo "$out" | grep -v '^#' | tail -2)"; fi
printf 'model: %s\ntransformer: %s\nprompt_embeds: "%s"\nwidth: 96\nheight: 64\nprecision: f32\nseed: 3\nsteps: 4\nbackend: cpu\nsave_latents: %s\n' \
    "$P" "$G/Q4_K/transformer" "$G/transformer_cases.safetensors:case1.encoder_hidden_states" "$TMP/spec.st" > "$TMP/run.yaml"
out=$($MPI -np 2 "$TPGEN" generate --spec "$TMP/run.yaml" 2>&1)
if [ $? -eq 0 ] && cmp -s "$TMP/folder.st" "$TMP/spec.st"; then ok "gguf_transformer_spec_key: transformer: in a run spec"
else fail "gguf_transformer_spec_key: $(echo "$out" | grep -v '^#' | tail -2)"; fi
expect_fail "gguf_transformer_flag_missing" "--transformer $TMP/none does not exist" \
    $MPI -np 2 "$TPGEN" generate --model "$P" --transformer "$TMP/none" \
    --prompt-embeds "$G/transformer_cases.safetensors:case1.encoder_hidden_states" --backend cpu

ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then
    # full unwinding: with the fast unwinder the stacks of Open MPI's plugin
    # allocations are cut to "<unknown module>" and tests/lsan.supp misses them
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:fast_unwind_on_malloc=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    run_cases "$ASAN/tpgen" "asan_" "2"
else fail "sanitizer runs: build-asan/ not found (the test command 'make test' builds it; or run 'make asan')"; fi
