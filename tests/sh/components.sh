#!/usr/bin/env bash
# budget: 45 s; checks: 29
# A model from single component files (ComfyUI's diffusion_models/,
# text_encoders/, vae/ files): --transformer/--text-encoder/--vae PATH and
# --family, against the same weights as a diffusers pipeline folder.
# The files are made here from the golden klein-tiny and vae-tiny folders:
# the transformer in BFL names (tests/test_bfl.c's converter), the text
# encoder with other name prefixes and no config.json, the VAE in BFL/LDM
# names (tests/tools/vae_bfl_testdata.py; its sha256 is the one that
# diffusers' convert_ldm_vae_checkpoint turned back into the golden tensors).
source "$TPGEN_ROOT/tests/lib.sh"
K=$TPGEN_GOLDEN/klein-tiny/model
V=$TPGEN_GOLDEN/vae-tiny
C=$TMP/comfy
export OMP_NUM_THREADS=1
mkdir -p "$C/diffusion_models" "$C/text_encoders" "$C/vae" "$C/vae_nocfg" "$C/te_folder" "$C/tok/tokenizer"

# the component files
TPGEN_BFL_OUT="$C/diffusion_models" TPGEN_BFL_SRC="$K/transformer" "$TPGEN_TESTS" bfl_write_golden_as_bfl | grep -q '^ok - ' \
    && mv "$C/diffusion_models/flux2-tiny-bfl.safetensors" "$C/diffusion_models/flux2-klein-tiny.safetensors"
python3 "$TPGEN_ROOT/tests/tools/vae_bfl_testdata.py" "$V/model/vae" "$C/vae" --no-verify --raw
cp "$V/model/vae/config.json" "$C/vae/"            # tiny widths: the config beside the file
mkdir -p "$C/kvae" && python3 "$TPGEN_ROOT/tests/tools/vae_bfl_testdata.py" "$K/vae" "$C/kvae" --no-verify --raw \
    && cp "$K/vae/config.json" "$C/kvae/"          # klein-tiny's own VAE, for the pipeline comparisons
cp "$C/vae/flux2-vae.safetensors" "$C/vae_nocfg/"  # no config: FLUX.2's, which the tiny shapes do not fit
R=$TPGEN_ROOT/tests/tools/st_rename.py
python3 "$R" "$K/text_encoder/model.safetensors" "$C/text_encoders/qwen_3_tiny.safetensors" --prefix model. ""
python3 "$R" "$K/text_encoder/model.safetensors" "$C/te_folder/model.safetensors" --prefix model. text_encoder.model.
cp "$K/tokenizer/"* "$C/te_folder/"; cp "$K/tokenizer/"* "$C/tok/tokenizer/"
want=$(cut -d' ' -f1 "$TPGEN_ROOT/tests/data/vae-bfl/vae-tiny-bfl.sha256")
got=$(sha256sum "$C/vae/flux2-vae.safetensors" | cut -d' ' -f1)
if [ -s "$C/diffusion_models/flux2-klein-tiny.safetensors" ] && [ "$got" = "$want" ]; then
    ok "components: files written; the BFL VAE is the one diffusers' converter maps back to the golden tensors"
else fail "components: files: BFL VAE sha256 $got, want $want"; fi

png_pixels() { local off; off=$(LC_ALL=C grep -obUa IDAT "$1" | head -1 | cut -d: -f1); tail -c +$((off - 3)) "$1"; }
same_pixels() { [ -s "$1" ] && [ -s "$2" ] && cmp -s <(png_pixels "$1") <(png_pixels "$2"); }

# --- the BFL-named VAE file decodes as the golden diffusers VAE ---
for prec in f32 bf16; do
    for c in "0 48 80" "1 64 32"; do
        set -- $c
        ci=$1 hh=$2 ww=$3
        dec() { "$TPGEN" decode --backend cpu --precision $prec --latents "$V/vae_cases.safetensors:case$ci.packed_latents" \
                --height $hh --width $ww "$@"; }
        a=$(dec --model "$V/model" --output "$TMP/d-$prec-$1.png" 2>&1); ra=$?
        b=$(dec --vae "$C/vae/flux2-vae.safetensors" --output "$TMP/b-$prec-$1.png" 2>&1); rb=$?
        if [ $ra -eq 0 ] && [ $rb -eq 0 ] && same_pixels "$TMP/d-$prec-$1.png" "$TMP/b-$prec-$1.png"; then
            ok "components: decode --vae BFL file = diffusers folder, case$1 $prec"
        else fail "components: decode case$1 $prec: rc $ra/$rb $(echo "$b" | tail -1)"; fi
    done
done

# --- generate from components only = generate from the pipeline folder ---
gen() { $MPIRUN -np "$1" "$TPGEN" generate --backend cpu --prompt "a red fox in the snow" --seed 3 --width 64 \
        --height 48 --precision f32 "${@:2}" 2>&1; }
for np in 1 2; do
    ref=$(gen $np --model "$K" --output "$TMP/ref$np.png" --save-latents "$TMP/ref$np.st"); r1=$?
    out=$(gen $np --transformer "$C/diffusion_models/flux2-klein-tiny.safetensors" --text-encoder "$C/te_folder" \
          --vae "$C/kvae/flux2-vae.safetensors" --family klein --output "$TMP/cmp$np.png" --save-latents "$TMP/cmp$np.st"); r2=$?
    if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && cmp -s "$TMP/ref$np.st" "$TMP/cmp$np.st" && same_pixels "$TMP/ref$np.png" "$TMP/cmp$np.png"; then
        ok "components: components only (BFL transformer file, prefixed text encoder, BFL VAE file, --family) = the pipeline folder, np $np"
    else fail "components: components only np $np: rc $r1/$r2 $(echo "$out" | grep error | tail -2)"; fi
done
# a diffusers-named transformer file without its config.json (the config derived from its shapes)
cp "$K/transformer/diffusion_pytorch_model.safetensors" "$C/diffusion_models/klein-diffusers.safetensors"
out=$(gen 2 --transformer "$C/diffusion_models/klein-diffusers.safetensors" --text-encoder "$C/te_folder" \
      --vae "$C/kvae/flux2-vae.safetensors" --family klein --output "$TMP/dn.png" --save-latents "$TMP/dn.st"); rc=$?
if [ $rc -eq 0 ] && cmp -s "$TMP/ref2.st" "$TMP/dn.st" && same_pixels "$TMP/ref2.png" "$TMP/dn.png"; then
    ok "components: a diffusers-named transformer file without config.json = the pipeline folder, np 2"
else fail "components: diffusers-named file: rc $rc $(echo "$out" | grep error | tail -2)"; fi
out=$("$TPGEN" inspect --components --transformer "$C/diffusion_models/klein-diffusers.safetensors" --family klein 2>&1)
echo "$out" | grep -q "config       derived from the diffusers tensor shapes" && echo "$out" | grep -q "naming       diffusers" \
    && ok "components: inspect names a diffusers-named file's derived config" || fail "components: inspect diffusers-named: $(echo "$out" | head -12)"
# the PNG names its components; the pixels are the same, the parameters chunk differs by those names
strings "$TMP/cmp1.png" | grep -q "components: transformer $C/diffusion_models/flux2-klein-tiny.safetensors text_encoder $C/te_folder vae $C/kvae/flux2-vae.safetensors" \
    && ok "components: the PNG parameters name each component" || fail "components: PNG parameters: $(strings "$TMP/cmp1.png" | grep -a components)"

# a run spec with the keys; the text encoder a bare-named file, the tokenizer from a --model folder without model_index.json
printf 'model: %s\ntransformer: %s\ntext_encoder: %s\nvae: %s\nfamily: klein\n' "$C/tok" \
    "$C/diffusion_models/flux2-klein-tiny.safetensors" "$C/text_encoders/qwen_3_tiny.safetensors" "$C/kvae/flux2-vae.safetensors" > "$TMP/c.yaml"
out=$(gen 2 --spec "$TMP/c.yaml" --output "$TMP/spec.png" --save-latents "$TMP/spec.st"); rc=$?
if [ $rc -eq 0 ] && cmp -s "$TMP/ref2.st" "$TMP/spec.st" && same_pixels "$TMP/ref2.png" "$TMP/spec.png"; then ok "components: run-spec keys, unprefixed text-encoder file, tokenizer from --model"
else fail "components: run spec: rc $rc $(echo "$out" | grep error | tail -2)"; fi
# one component replaced in a full pipeline folder (model_index.json present, no --family)
out=$(gen 2 --model "$K" --vae "$C/kvae/flux2-vae.safetensors" --output "$TMP/one.png"); rc=$?
if [ $rc -eq 0 ] && same_pixels "$TMP/ref2.png" "$TMP/one.png"; then ok "components: --vae file in a pipeline folder"
else fail "components: --vae in a pipeline: rc $rc $(echo "$out" | grep error | tail -2)"; fi

# --- inspect --components: what each part is and where it came from ---
out=$("$TPGEN" inspect --components --transformer "$C/diffusion_models/flux2-klein-tiny.safetensors" --text-encoder "$C/te_folder" \
      --vae "$C/vae_nocfg/flux2-vae.safetensors" --family klein --json 2>&1); rc=$?
got=$(echo "$out" | python3 -c '
import json, sys
p = {c["component"]: c for c in json.load(sys.stdin)}
print(p["family"]["from"], p["family"]["name"], "|", p["transformer"]["from"], p["transformer"]["naming"], p["transformer"]["config"],
      p["transformer"]["dtypes"], "|", p["text_encoder"]["from"], p["text_encoder"]["naming"], p["text_encoder"]["config"],
      p["text_encoder"]["architecture"].split(",")[0], "|", p["vae"]["from"], p["vae"]["naming"], p["vae"]["config"])' 2>&1)
want="--family FLUX.2-klein (distilled) | --transformer file BFL derived from the BFL tensor shapes {'BF16': 41} | --text-encoder folder HF, prefix 'text_encoder.model.' derived from the tensor shapes for klein (Qwen3) qwen3: 28 layers | --vae file BFL/LDM FLUX.2 default (AutoencoderKLFlux2; no config.json)"
[ $rc -eq 0 ] && [ "$got" = "$want" ] && ok "components: inspect --components names source, naming, dtypes and config of each part" \
    || fail "components: inspect --components: rc $rc got [$got] want [$want]"
out=$("$TPGEN" inspect --components --model "$K" 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(echo "$out" | grep -c 'from         pipeline folder')" = 3 ] && echo "$out" | grep -q "from         model_index.json" \
    && echo "$out" | grep -q "naming       HF, prefix 'model.'" && ok "components: inspect --components on a pipeline folder" \
    || fail "components: inspect --components --model: rc $rc $(echo "$out" | head -5)"
GG=$(ls "$TPGEN_GOLDEN"/flux2-gguf/*/transformer/*.gguf | head -1)
out=$("$TPGEN" inspect --components --transformer "$GG" --family dev 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "format       gguf" && echo "$out" | grep -qE "dtypes .*Q[0-9]_" \
    && ok "components: inspect --components shows a GGUF file's block types" || fail "components: inspect gguf: rc $rc $(echo "$out" | head -12)"

# --- errors: named, non-zero on every rank (np 2), printed once, no crash ---
once() { # NAME PATTERN ARGS...
    local name=$1 pat=$2; shift 2
    local out rc n
    out=$(timeout 300 $MPIRUN -np 2 "$TPGEN" "$@" 2>&1); rc=$?
    n=$(echo "$out" | grep -c 'tpgen: error')
    if [ $rc -eq 0 ]; then fail "$name: exited 0"; return; fi
    if [ $rc -ge 124 ] || echo "$out" | grep -qE 'Segmentation|core dumped|AddressSanitizer|LeakSanitizer|runtime error'; then
        fail "$name: crashed or hung (rc $rc): $(echo "$out" | tail -3)"; return
    fi
    if [ "$n" -ne 1 ]; then fail "$name: the error was printed $n times"; return; fi
    if echo "$out" | grep -qE -- "$pat"; then ok "$name"; else fail "$name: message did not match '$pat': $(echo "$out" | grep 'tpgen: error')"; fi
}
TR=(--transformer "$C/diffusion_models/flux2-klein-tiny.safetensors")
G=(generate --backend cpu --prompt "a fox" --width 32 --height 32 --steps 1 --output "$TMP/e.png")
python3 "$R" "$C/vae/flux2-vae.safetensors" "$C/vae_miss.safetensors" --drop decoder.up.1.block.0.conv1.weight
mkdir -p "$C/vae_miss" && mv "$C/vae_miss.safetensors" "$C/vae_miss/" && cp "$C/vae/config.json" "$C/vae_miss/"
once "components: a VAE file with a missing tensor is named" \
    "vae_miss/vae_miss.safetensors: tensor decoder.up.1.block.0.conv1.weight \(diffusers decoder.up_blocks.2.resnets.0.conv1.weight\) is missing" \
    "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/vae_miss/vae_miss.safetensors" --family klein
once "components: a VAE file that is not FLUX.2's and has no config.json" \
    "vae_nocfg/flux2-vae.safetensors: tensor .* the FLUX.2 default VAE config .* implies .*needs its config.json" \
    "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/vae_nocfg/flux2-vae.safetensors" --family klein
once "components: a text encoder whose shapes do not fit the family" \
    "te_folder: the text encoder has q_norm tensors \(a Qwen3 model\), but FLUX.2-dev" \
    "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/vae/flux2-vae.safetensors" --family dev
once "components: a transformer file that is no FLUX.2 transformer" \
    "te_folder/model.safetensors: config.json is missing, and its tensors are neither BFL- nor diffusers-named FLUX.2" \
    "${G[@]}" --transformer "$C/te_folder/model.safetensors" --text-encoder "$C/te_folder" --vae "$C/vae/flux2-vae.safetensors" --family klein
once "components: --family missing" "which FLUX.2 family is this\?.*--family dev .*--family klein .*--family klein-base" \
    "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/vae/flux2-vae.safetensors"
once "components: an unknown family" "--family: expected one of dev\|klein\|klein-base, got 'schnell'" \
    "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --family schnell
once "components: a text-encoder file without a tokenizer" "no tokenizer for the text encoder .*qwen_3_tiny.safetensors: pass --model" \
    "${G[@]}" "${TR[@]}" --text-encoder "$C/text_encoders/qwen_3_tiny.safetensors" --vae "$C/vae/flux2-vae.safetensors" --family klein
once "components: a missing component file" "--vae $C/none.safetensors does not exist" \
    "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/none.safetensors" --family klein
once "components: --family contradicting model_index.json" "--family dev contradicts .*model_index.json" \
    "${G[@]}" --model "$K" --family dev

# --- the same paths under ASan + UBSan (LeakSanitizer on: tests/run.sh) ---
ASAN=$TPGEN_ROOT/build-asan/tpgen
if [ ! -x "$ASAN" ]; then fail "components: no sanitized build at $ASAN (make asan)"; else
    agen() { "$ASAN" generate --backend cpu --prompt "a red fox in the snow" --seed 3 --width 32 --height 32 --steps 2 \
             --precision f32 --no-decode "$@" 2>&1; }
    ref=$(agen --model "$K" --save-latents "$TMP/asan-ref.st"); r1=$?   # this build's own reference (-O1 rounds otherwise)
    out=$(agen "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/kvae/flux2-vae.safetensors" --family klein \
          --save-latents "$TMP/asan.st"); rc=$?
    [ $r1 -eq 0 ] && [ $rc -eq 0 ] && cmp -s "$TMP/asan-ref.st" "$TMP/asan.st" && ok "components: asan generate from components" \
        || fail "components: asan generate: rc $r1/$rc $(echo "$out" | grep -E 'ERROR|error' | head -3)"
    out=$("$ASAN" inspect --components "${TR[@]}" --text-encoder "$C/text_encoders/qwen_3_tiny.safetensors" \
          --vae "$C/vae/flux2-vae.safetensors" --family klein 2>&1); rc=$?
    [ $rc -eq 0 ] && echo "$out" | grep -q "prefix ''" && ok "components: asan inspect --components" \
        || fail "components: asan inspect: rc $rc $(echo "$out" | tail -3)"
    expect_fail "components: asan VAE missing tensor" "decoder.up.1.block.0.conv1.weight" \
        "$ASAN" "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/vae_miss/vae_miss.safetensors" --family klein
    expect_fail "components: asan text encoder not fitting the family" "q_norm tensors" \
        "$ASAN" "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder" --vae "$C/vae/flux2-vae.safetensors" --family dev
    expect_fail "components: asan --family missing" "which FLUX.2 family" \
        "$ASAN" "${G[@]}" "${TR[@]}" --text-encoder "$C/te_folder"
fi
