#!/usr/bin/env bash
# budget: 40 s; checks: 8
# Run-spec batches on FLUX.3 folders (the golden tiny transformers + VAE +
# make-tiny's Qwen3-VL text encoder): base with CFG and a negative prompt,
# and flow-map, prompts x seeds with per-prompt references (one padded and
# cropped back, one downscaled-free 64x64, two "crop" references) and so
# per-job sizes, over tp 1 x dp 2 and tp 2 x dp 1: every batch job's PNG
# (pixels and parameters text) must be byte-identical to the same job run
# alone with flags. Also a --prompt-embeds batch (negative embeddings,
# seeds), and scripts/regress.sh on a FLUX.3 folder (store, compare: inf).
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
P=$TPGEN_ROOT/tests/data/flux3-pipe
for k in base flowmap; do
    flux3_folder $k "$TMP/$k"
    out=$(TPGEN_FLUX3_TE_OUT="$TMP/$k" "$TPGEN_TESTS" flux3te_tiny_writer_files 2>&1)
    echo "$out" | grep -q '^ok - ' || fail "flux3 batch: writing the tiny text encoder into $k: $(echo "$out" | tail -2)"
done
python3 "$TPGEN_ROOT/tests/tools/flux3_refs_images.py" "$TMP" tall small >/dev/null
cp "$P/ref.png" "$P/ref_pad.png" "$TMP/"

# text of the PNG's parameters chunk
params() { python3 -c '
import struct, sys, zlib
b = open(sys.argv[1], "rb").read(); p = 8
while p < len(b):
    n, = struct.unpack(">I", b[p:p+4]); t = b[p+4:p+8]; d = b[p+8:p+8+n]; p += 12 + n
    if t in (b"tEXt", b"iTXt") and d.startswith(b"parameters\0"): print(d.split(b"\0", 1)[1].decode("latin-1"))' "$1"; }

# batch KIND NP TP: the spec's 3 prompts x 2 seeds, then each job alone; byte-for-byte PNGs
batch() {
    local k=$1 np=$2 tp=$3 neg=()
    local S=$TMP/$k-$np-$tp
    mkdir -p "$S"
    {
        echo "model: $TMP/$k"
        echo "prompts:"
        echo "  - {prompt: a red fox in the snow, images: [$TMP/ref_pad.png]}"
        echo "  - {prompt: a lighthouse at dusk, images: [$TMP/ref.png]}"
        echo "  - {prompt: two things side by side, images: [$TMP/tall.png, $TMP/small.png]}"
        echo "seeds: [5, 6]"
        echo "steps: 2"
        echo "precision: f32"
        echo "backend: cpu"
        echo "tp: $tp"
        echo "output: $S/b-{index}-{seed}.png"
        if [ $k = base ]; then echo "negative_prompt: blurry, low quality"; echo "guidance: 2.5"; fi
    } >"$S/spec.yaml"
    [ $k = base ] && neg=(--negative-prompt "blurry, low quality" --guidance 2.5)
    local out
    if ! out=$($MPIRUN -np $np "$TPGEN" --spec "$S/spec.yaml" 2>&1); then
        fail "flux3 batch $k np=$np tp=$tp: the batch failed: $(echo "$out" | tail -3 | tr '\n' ' ')"; return
    fi
    local prompts=("a red fox in the snow" "a lighthouse at dusk" "two things side by side")
    local imgs=("--image $TMP/ref_pad.png" "--image $TMP/ref.png" "--image $TMP/tall.png --image $TMP/small.png")
    local sizes=("70x56" "64x64" "32x192") same=0 bad=""
    for p in 0 1 2; do
        for si in 0 1; do
            local seed=$((5 + si)) idx=$((p * 2 + si))
            # shellcheck disable=SC2086
            if ! out=$($MPIRUN -np $tp "$TPGEN" generate --model "$TMP/$k" --prompt "${prompts[$p]}" ${imgs[$p]} \
                  --seed $seed --steps 2 --precision f32 --backend cpu "${neg[@]}" --output "$S/a-$idx-$seed.png" 2>&1); then
                bad+=" job $idx alone failed: $(echo "$out" | tail -1)"; continue
            fi
            local wh
            wh=$(python3 -c 'import struct,sys; b=open(sys.argv[1],"rb").read(); print("%dx%d" % struct.unpack(">II", b[16:24]))' "$S/b-$idx-$seed.png" 2>/dev/null)
            if [ "$wh" != "${sizes[$p]}" ]; then bad+=" job $idx is $wh, want ${sizes[$p]}"; continue; fi
            if cmp -s "$S/b-$idx-$seed.png" "$S/a-$idx-$seed.png"; then same=$((same + 1)); else
                bad+=" job $idx differs$(diff <(params "$S/b-$idx-$seed.png") <(params "$S/a-$idx-$seed.png") | grep '^[<>]' | head -4 | tr '\n' ' ')"
            fi
        done
    done
    [ $same -eq 6 ] && ok "flux3 batch $k np=$np tp=$tp: 3 prompts (own references and sizes) x 2 seeds, each PNG = the job alone, byte for byte" \
        || fail "flux3 batch $k np=$np tp=$tp: $same of 6 equal:$bad"
    [ $k = base ] && { params "$S/b-5-6.png" | grep -q "negative_prompt: blurry, low quality" && params "$S/b-5-6.png" | grep -q "guidance: 2.5 (CFG)" &&
        params "$S/b-5-6.png" | grep -q "seed: 6" && params "$S/b-5-6.png" | grep -q "tall.png" &&
        params "$S/b-0-5.png" | grep -q "^size: 70x56 (generated at 80x64, cropped back to the reference)" &&
        params "$S/b-2-5.png" | grep -q "^size: 64x64$" &&
        ok "flux3 batch base: the PNG parameters name the negative prompt, CFG 2.5, the job's seed, references and size (a cropped-back one with its canvas)" ||
        fail "flux3 batch base parameters: $(params "$S/b-5-6.png" | tr '\n' '|')"; }
}
batch base 2 1
batch flowmap 2 1
batch base 2 2

# a --prompt-embeds batch: negative embeddings, seeds, one reference for all jobs
cat >"$TMP/emb.yaml" <<YAML
model: $TMP/base
prompt_embeds: $P/base_ref.safetensors
negative_prompt_embeds: $P/base_ref.safetensors
images: [$TMP/ref_pad.png]
seeds: [7, 8, 9]
steps: 2
precision: f32
backend: cpu
tp: 1
output: $TMP/e-{seed}.png
YAML
if out=$($MPIRUN -np 2 "$TPGEN" --spec "$TMP/emb.yaml" 2>&1); then
    same=0
    for s in 7 8 9; do
        "$TPGEN" generate --model "$TMP/base" --prompt-embeds "$P/base_ref.safetensors" --negative-prompt-embeds \
            "$P/base_ref.safetensors" --image "$TMP/ref_pad.png" --seed $s --steps 2 --precision f32 --backend cpu \
            --output "$TMP/ea-$s.png" >/dev/null 2>&1 && cmp -s "$TMP/e-$s.png" "$TMP/ea-$s.png" && same=$((same + 1))
    done
    [ $same -eq 3 ] && ok "flux3 batch --prompt-embeds + negative embeddings, 3 seeds over dp 2: each PNG = the job alone" \
        || fail "flux3 batch --prompt-embeds: $same of 3 equal"
else
    fail "flux3 batch --prompt-embeds: $(echo "$out" | tail -2 | tr '\n' ' ')"
fi

# scripts/regress.sh on a FLUX.3 folder: store, then compare (identical renders: inf dB)
sed -e '/^output:/d' -e '/^tp:/d' "$TMP/flowmap-2-1/spec.yaml" >"$TMP/reg.yaml"
if out=$(MPIRUN="$MPIRUN" NP=2 TPGEN="$TPGEN" "$TPGEN_ROOT/scripts/regress.sh" --model "$TMP/flowmap" --spec "$TMP/reg.yaml" \
        --ref "$TMP/regref" --out "$TMP/reg1" --update 2>&1) &&
   out=$(NP=2 TPGEN="$TPGEN" "$TPGEN_ROOT/scripts/regress.sh" --model "$TMP/flowmap" --spec "$TMP/reg.yaml" --ref "$TMP/regref" \
        --out "$TMP/reg2" 2>&1) && [ "$(echo "$out" | grep -c ' inf  ok')" = 6 ]; then
    ok "scripts/regress.sh on a FLUX.3 flow-map folder: 6 images stored and compared (inf dB)"
else
    fail "scripts/regress.sh on FLUX.3: $(echo "$out" | tail -4 | tr '\n' ' ')"
fi
# a changed reference image fails the comparison
cp "$TMP/reg1/0000-5.png" "$TMP/keep.png"; cp "$TMP/regref/0002-5.png" "$TMP/regref/0000-5.png"
NP=2 TPGEN="$TPGEN" "$TPGEN_ROOT/scripts/regress.sh" --model "$TMP/flowmap" --spec "$TMP/reg.yaml" --ref "$TMP/regref" \
    --out "$TMP/reg3" >"$TMP/reg3.log" 2>&1 && fail "regress.sh accepted a wrong reference image" \
    || { grep -q "0000-5.png.*FAIL" "$TMP/reg3.log" && ok "regress.sh on FLUX.3 fails on a changed reference" \
         || fail "regress.sh: $(tail -3 "$TMP/reg3.log" | tr '\n' ' ')"; }
