#!/usr/bin/env bash
# budget: 20 s; checks: 18
# Diffusion models behind model.diffusion_model. (checkpoint.h CHECKPOINT_DM_PREFIX): what ComfyUI saves
# and what stable-diffusion.cpp's `convert` writes (a GGUF without general.architecture). The golden models
# renamed that way (tests/tools/st_rename.py, gguf_rename.py: same bytes, names behind the prefix) must give
# the bare files' results exactly: `tpgen check` case errors, bytes per rank, generate latents, quantize
# output; a whole ComfyUI checkpoint (the VAE beside it as first_stage_model.*) is read as its diffusion
# model, the rest ignored and counted; the fp8 hints of _quantization_metadata may name layers with the
# prefix; a file that holds a tensor both bare and behind the prefix, or one named just the prefix, is
# refused naming it, on every rank.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN/flux2-tiny-a
CASES=$G/transformer_cases.safetensors
P=model.diffusion_model.
STR="python3 $TPGEN_ROOT/tests/tools/st_rename.py"
export OMP_NUM_THREADS=1

check_lines() { # NP MODEL PREC [ARGS]: the case errors of tpgen check (empty on failure)
    local out
    out=$($MPIRUN -np "$1" "$TPGEN" check --backend cpu --model "$2" --precision "$3" "${@:4}" 2>&1) || { echo "$out" | tail -2 >&2; return; }
    echo "$out" | grep -qE '^max_rel_err=.* PASS$' && echo "$out" | grep -E '^case[0-9]+ rel_err=|^max_rel_err='
}
same_check() { # NAME NP BARE PREFIXED PREC [ARGS]
    local a b
    a=$(check_lines "$2" "$3" "$5" "${@:6}"); b=$(check_lines "$2" "$4" "$5" "${@:6}")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "$1 ($(echo "$b" | grep '^max_rel_err'))"
    else fail "$1: bare [$(echo $a)] prefixed [$(echo $b)]"; fi
}

# --- a BFL safetensors file (ComfyUI's save) ---
mkdir -p "$TMP/bare/transformer" "$TMP/dm/transformer" "$TMP/aio/transformer"
TPGEN_BFL_OUT="$TMP/bare/transformer" "$TPGEN_TESTS" bfl_write_golden_as_bfl | grep -q '^ok - ' || fail "dm: BFL conversion"
BARE=$TMP/bare/transformer/flux2-tiny-bfl.safetensors
$STR "$BARE" "$TMP/dm/transformer/flux2-tiny-bfl.safetensors" --prefix "" "$P"
VAE=$TPGEN_GOLDEN/vae-tiny/model/vae/diffusion_pytorch_model.safetensors
$STR "$BARE" "$TMP/aio/transformer/flux2-tiny-aio.safetensors" --prefix "" "$P" --add "$VAE" first_stage_model.
for np in 1 2; do
    same_check "dm: BFL file behind the prefix, check f32 tp $np = bare" $np "$TMP/bare" "$TMP/dm" f32 --cases "$CASES"
done
same_check "dm: a whole checkpoint (VAE as first_stage_model.*), check bf16 tp 2 = bare" 2 "$TMP/bare" "$TMP/aio" bf16 --cases "$CASES"

# inspect names the prefix and counts the tensors left out (the VAE's, counted from its header here)
n_vae=$(python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; \
print(len([k for k in json.loads(f.read(n)) if k != '__metadata__']))" "$VAE")
out=$("$TPGEN" inspect --model "$TMP/aio" --tp 2 2>&1); rc=$?
ref=$("$TPGEN" inspect --model "$TMP/bare" --tp 2 2>&1)
ranks() { echo "$1" | awk '/^rank /{r=1} r'; }
if [ $rc -eq 0 ] && echo "$out" | grep -q "names behind '$P' .*; $n_vae tensor(s) outside it ignored" \
   && echo "$out" | grep -q 'plan flux2 (BFL names)' && [ -n "$(ranks "$ref")" ] && [ "$(ranks "$out")" = "$(ranks "$ref")" ]; then
    ok "dm: inspect names the prefix, $n_vae VAE tensors ignored, the bare file's bytes per rank"
else fail "dm: inspect: rc $rc $(echo "$out" | head -3 | tr '\n' ' ')"; fi
out=$("$TPGEN" inspect --json --model "$TMP/aio" --tp 2 2>&1)
echo "$out" | python3 -c "import json,sys; o=json.load(sys.stdin).get('name_prefix'); \
sys.exit(0 if o == {'prefix': '$P', 'tensors_outside_ignored': $n_vae} else 1)" 2>/dev/null && ok "dm: inspect --json name_prefix" ||
    fail "dm: inspect --json: $(echo "$out" | grep -A3 name_prefix | tr '\n' ' ')"

out=$("$TPGEN" inspect --components --model "$G/model" --transformer "$TMP/aio/transformer/flux2-tiny-aio.safetensors" 2>&1)
echo "$out" | grep -qE "^  name_prefix +$P\$" && echo "$out" | grep -qE "^  tensors_outside_prefix_ignored +$n_vae\$" &&
    ok "dm: inspect --components names the prefix and the $n_vae ignored tensors" ||
    fail "dm: inspect --components: $(echo "$out" | sed -n 4,14p | tr '\n' ' ')"

# generate with --transformer FILE (the whole checkpoint): the bare file's latents, bit for bit
gen() { $MPIRUN -np 2 "$TPGEN" generate --model "$G/model" --transformer "$1" --prompt-embeds "$G/denoise.safetensors:prompt_embeds" \
        --width 96 --height 64 --precision f32 --seed 1 --steps 3 --guidance 4 --backend cpu --save-latents "$2" 2>&1; }
ga=$(gen "$BARE" "$TMP/bare.st"); ra=$?
gb=$(gen "$TMP/aio/transformer/flux2-tiny-aio.safetensors" "$TMP/aio.st"); rb=$?
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && cmp -s "$TMP/bare.st" "$TMP/aio.st"; then ok "dm: generate --transformer (whole checkpoint) = bare latents"
else fail "dm: generate: rc $ra/$rb $(echo "$gb" | tail -2 | tr '\n' ' ')"; fi

# quantize reads it as its model: the same GGUF as from the bare file
"$TPGEN" quantize --type Q8_0 "$BARE" "$TMP/bare.gguf" >/dev/null 2>&1
"$TPGEN" quantize --type Q8_0 "$TMP/aio/transformer/flux2-tiny-aio.safetensors" "$TMP/aio.gguf" >/dev/null 2>&1
[ -s "$TMP/bare.gguf" ] && cmp -s "$TMP/bare.gguf" "$TMP/aio.gguf" && ok "dm: quantize Q8_0 = of the bare file, byte for byte" ||
    fail "dm: quantize differs or failed"

# --- a stable-diffusion.cpp GGUF: names behind the prefix, no general.architecture ---
GG=$TPGEN_GOLDEN/flux2-gguf
for v in Q4_K mixed; do
    mkdir -p "$TMP/sdcpp-$v/transformer"
    f=$(ls "$GG/$v/transformer/"*.gguf)
    python3 "$TPGEN_ROOT/tests/tools/gguf_rename.py" "$f" "$TMP/sdcpp-$v/transformer/$(basename "$f")" --prefix "" "$P" \
        --drop-key general.architecture
    same_check "dm: sd.cpp-style GGUF $v, check bf16 tp 2 = the ComfyUI file" 2 "$GG/$v" "$TMP/sdcpp-$v" bf16 \
        --cases "$GG/transformer_cases.safetensors" --outputs "$GG/gguf_cases.safetensors" --prefix "$v" --tol 3e-2
done
a=$(ranks "$("$TPGEN" inspect --model "$GG/Q4_K" --tp 2 2>&1)"); b=$(ranks "$("$TPGEN" inspect --model "$TMP/sdcpp-Q4_K" --tp 2 2>&1)")
[ -n "$a" ] && [ "$a" = "$b" ] && ok "dm: sd.cpp-style GGUF: the same bytes per rank" || fail "dm: GGUF bytes per rank [$a] vs [$b]"

# --- fp8 (ComfyUI's scaled files): names and the _quantization_metadata layers behind the prefix ---
F=$TPGEN_GOLDEN/flux2-fp8
mkdir -p "$TMP/fp8/transformer"
cp "$F/scaled/transformer/config.json" "$TMP/fp8/transformer/"
$STR "$F/scaled/transformer/diffusion_pytorch_model.safetensors" "$TMP/fp8/transformer/diffusion_pytorch_model.safetensors" \
    --prefix "" "$P" --meta-layer-prefix "$P"
same_check "dm: fp8 scaled file behind the prefix (hints too), check f32 tp 2 = bare" 2 "$F/scaled" "$TMP/fp8" f32 \
    --cases "$CASES" --outputs "$F/fp8_cases.safetensors" --prefix scaled --tol 1e-5

# --- refused ---
mkdir -p "$TMP/both/transformer" "$TMP/just/transformer"
$STR "$BARE" "$TMP/both/transformer/x.safetensors" --add "$BARE" "$P"
expect_fail "dm: a tensor both bare and behind the prefix is refused naming it, np 2" \
    "holds tensor '[a-z_.0-9]+' both under that name and behind '$P'" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/both" --cases "$CASES"
python3 "$TPGEN_ROOT/tests/tools/craft.py" st "$TMP/just/transformer/x.safetensors" "$P:F32:4" "${P}img_in.weight:F32:4,4"
expect_fail "dm: a tensor named just the prefix is refused, np 2" "a tensor is named just '$P'" \
    timeout 120 $MPIRUN -np 2 "$TPGEN" check --backend cpu --model "$TMP/just" --cases "$CASES"

# --- the same paths on the sanitized build (ASan + UBSan + LeakSanitizer): reading behind the prefix, both refusals ---
ASAN=$TPGEN_ROOT/build-asan/tpgen
if [ ! -x "$ASAN" ]; then fail "dm: no sanitized build at $ASAN (make asan)"; else
    lsan_run "dm: asan inspect" "$ASAN" inspect --model "$TMP/aio" --tp 2
    if [ $rc -eq 0 ] && echo "$out" | grep -q "$n_vae tensor(s) outside it ignored" && [ "$(ranks "$out")" = "$(ranks "$ref")" ]; then
        ok "dm: asan inspect of the whole checkpoint"
    else fail "dm: asan inspect: rc $rc $(echo "$out" | grep -E 'ERROR|error' | head -3)"; fi
    lsan_run "dm: asan fp8" "$ASAN" inspect --model "$TMP/fp8" --tp 2
    r1=$rc
    lsan_run "dm: asan GGUF" "$ASAN" inspect --model "$TMP/sdcpp-mixed" --tp 2
    [ $r1 -eq 0 ] && [ $rc -eq 0 ] && ok "dm: asan inspect of the fp8 and sd.cpp GGUF files" || fail "dm: asan fp8/GGUF: rc $r1/$rc"
    expect_fail "dm: asan: a tensor both bare and behind the prefix" "both under that name and behind" \
        "$ASAN" inspect --model "$TMP/both" --tp 2
    expect_fail "dm: asan: a tensor named just the prefix" "a tensor is named just" "$ASAN" inspect --model "$TMP/just" --tp 2
fi
