#!/usr/bin/env bash
# budget: 15 s; checks: 21
# tpgen decode: golden latents to PNG, a --save-latents style file (tensor
# `latents`, height/width metadata), mpirun, and the errors users hit.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN/vae-tiny
CASES=$G/vae_cases.safetensors
MODEL=$G/model
DEC=("$TPGEN" decode --backend cpu --precision f32)

# little-endian u64 of a safetensors file's header length
header_len() { od -An -t u8 -N8 "$1" | tr -d ' '; }
# PNG width and height from the IHDR chunk
png_size() { echo "$(od -An -t u1 -j16 -N8 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4, $5*16777216+$6*65536+$7*256+$8}')"; }

# The image data of a PNG (IDAT onwards): PNGs of the same pixels differ
# only in their "parameters" text chunk.
png_pixels() { local off; off=$(LC_ALL=C grep -obUa IDAT "$1" | head -1 | cut -d: -f1); tail -c +$((off - 3)) "$1"; }
same_pixels() { cmp -s <(png_pixels "$1") <(png_pixels "$2"); }

# Write a --save-latents style file: tensor `latents` copied from a golden
# case, with height/width metadata.
make_latents() { # OUT TENSOR HEIGHT WIDTH
    local out=$1 name=$2 h=$3 w=$4 hl off a b hdr pad len
    hl=$(header_len "$CASES")
    off=$(head -c $((8 + hl)) "$CASES" | tail -c "$hl" | grep -o "\"$name\":{[^}]*}" | grep -o 'data_offsets":\[[0-9]*,[0-9]*' | grep -o '[0-9]*,[0-9]*')
    a=${off%,*}; b=${off#*,}
    local shape
    shape=$(head -c $((8 + hl)) "$CASES" | tail -c "$hl" | grep -o "\"$name\":{[^}]*}" | grep -o 'shape":\[[0-9,]*\]' | grep -o '\[.*\]')
    hdr="{\"__metadata__\":{\"height\":\"$h\",\"width\":\"$w\"},\"latents\":{\"dtype\":\"F32\",\"shape\":$shape,\"data_offsets\":[0,$((b - a))]}}"
    pad=$(( (8 - ${#hdr} % 8) % 8 ))
    hdr="$hdr$(printf '%*s' $pad '')"
    len=${#hdr}
    {
        for i in 0 1 2 3 4 5 6 7; do printf "\\$(printf '%03o' $(( (len >> (8 * i)) & 255 )))"; done
        printf '%s' "$hdr"
        tail -c +$((8 + hl + a + 1)) "$CASES" | head -c $((b - a))
    } > "$out"
}

# 1. golden latents named by FILE:TENSOR, size from the flags
out=$("${DEC[@]}" --model "$MODEL" --latents "$CASES:case0.packed_latents" --width 80 --height 48 --output "$TMP/a.png" 2>&1)
if [ $? -eq 0 ] && [ "$(head -c 8 "$TMP/a.png" | od -An -t x1 | tr -d ' ')" = "89504e470d0a1a0a" ] && [ "$(png_size "$TMP/a.png")" = "80 48" ]; then
    ok "decode: golden case0 latents to an 80x48 PNG"
else
    fail "decode: golden case0 latents to PNG: $out"
fi

# 2. a --save-latents style file: size from the metadata, same image
make_latents "$TMP/lat.safetensors" case0.packed_latents 48 80
out=$("${DEC[@]}" --model "$MODEL" --latents "$TMP/lat.safetensors" --output "$TMP/b.png" 2>&1)
if [ $? -eq 0 ] && same_pixels "$TMP/a.png" "$TMP/b.png"; then ok "decode: latents file with height/width metadata round trip"
else fail "decode: metadata round trip: $out"; fi

# 3. under mpirun only rank 0 decodes; the image is the same
out=$($MPIRUN -np 2 "${DEC[@]}" --model "$MODEL" --latents "$TMP/lat.safetensors" --output "$TMP/c.png" 2>&1)
if [ $? -eq 0 ] && same_pixels "$TMP/a.png" "$TMP/c.png" && [ "$(echo "$out" | grep -c 'decode: wrote')" = 1 ]; then
    ok "decode: mpirun -np 2 writes the same PNG once"
else fail "decode: mpirun -np 2: $out"; fi

# 4. bf16 precision decodes too (the default)
if "$TPGEN" decode --backend cpu --model "$MODEL" --latents "$TMP/lat.safetensors" --output "$TMP/d.png" >/dev/null 2>&1 &&
   [ "$(png_size "$TMP/d.png")" = "80 48" ]; then ok "decode: bf16 default"
else fail "decode: bf16 default failed"; fi

# errors
mkdir -p "$TMP/empty"
expect_fail "decode: missing vae/ folder" "has no vae/ folder" \
    "${DEC[@]}" --model "$TMP/empty" --latents "$TMP/lat.safetensors" --output "$TMP/e.png"
expect_fail "decode: latents of the wrong rank" "must be packed latents \[1, N, 32\]" \
    "${DEC[@]}" --model "$MODEL" --latents "$CASES:case0.after_unpack" --width 80 --height 48 --output "$TMP/e.png"
expect_fail "decode: a 1-D tensor is not latents" "must be packed latents" \
    "${DEC[@]}" --model "$MODEL" --latents "$MODEL/vae/diffusion_pytorch_model.safetensors:bn.running_mean" --width 80 --height 48 --output "$TMP/e.png"
expect_fail "decode: token count does not match the size" "holds 15 tokens" \
    "${DEC[@]}" --model "$MODEL" --latents "$TMP/lat.safetensors" --width 96 --output "$TMP/e.png"
expect_fail "decode: size not a multiple of 16" "not a multiple of 16" \
    "${DEC[@]}" --model "$MODEL" --latents "$TMP/lat.safetensors" --width 70 --output "$TMP/e.png"
expect_fail "decode: no size anywhere" "no height/width metadata" \
    "${DEC[@]}" --model "$MODEL" --latents "$CASES:case0.packed_latents" --output "$TMP/e.png"
expect_fail "decode: missing tensor" "has no tensor 'nope'" \
    "${DEC[@]}" --model "$MODEL" --latents "$CASES:nope" --output "$TMP/e.png"
expect_fail "decode: missing latents file" "no_such_file" \
    "${DEC[@]}" --model "$MODEL" --latents "$TMP/no_such_file.safetensors" --output "$TMP/e.png"
expect_fail "decode: unknown option" "unknown option '--frobnicate'" \
    "${DEC[@]}" --model "$MODEL" --frobnicate 1
expect_fail "decode: missing required flags" "needs --model" "$TPGEN" decode --backend cpu
expect_fail "decode: bad precision" "f32 or bf16" \
    "${DEC[@]}" --model "$MODEL" --latents "$TMP/lat.safetensors" --output "$TMP/e.png" --precision fp8
expect_fail "decode: output folder missing" "(cannot|could not) write" \
    "${DEC[@]}" --model "$MODEL" --latents "$TMP/lat.safetensors" --output "$TMP/nodir/e.png"
mkdir -p "$TMP/badcfg/vae"
cp "$MODEL/vae/diffusion_pytorch_model.safetensors" "$TMP/badcfg/vae/"
sed 's/"out_channels": 3/"out_channels": 4/' "$MODEL/vae/config.json" > "$TMP/badcfg/vae/config.json"
expect_fail "decode: a VAE config the decoder cannot serve" "out_channels is 4" \
    "${DEC[@]}" --model "$TMP/badcfg" --latents "$TMP/lat.safetensors" --output "$TMP/e.png"
expect_fail "decode: mpirun -np 2 error on every rank" "rank 0: .*has no vae/ folder" \
    $MPIRUN -np 2 "${DEC[@]}" --model "$TMP/empty" --latents "$TMP/lat.safetensors" --output "$TMP/e.png"

# a failed decode leaves an existing output untouched
cp "$TMP/a.png" "$TMP/keep.png"
"${DEC[@]}" --model "$MODEL" --latents "$TMP/lat.safetensors" --width 96 --output "$TMP/keep.png" >/dev/null 2>&1
if cmp -s "$TMP/a.png" "$TMP/keep.png" && [ -z "$(ls "$TMP" | grep '\.tmp')" ]; then ok "decode: failure leaves the existing PNG and no temporary file"
else fail "decode: a failed decode changed the existing output"; fi

# generate --save-latents, then decode: the same pixels as generate's own PNG
if "$TPGEN" make-tiny --out "$TMP/tiny" >/dev/null 2>&1; then
    out=$("$TPGEN" --model "$TMP/tiny" --prompt-embeds "$TMP/tiny/prompt_embeds.safetensors" --width 64 --height 48 \
          --steps 2 --seed 5 --backend cpu --precision f32 --output "$TMP/gen.png" --save-latents "$TMP/gen.safetensors" 2>&1)
    if [ ! -f "$TMP/gen.safetensors" ]; then
        fail "decode: generate --save-latents failed: $(echo "$out" | tail -2)"
    else
        out=$("${DEC[@]}" --model "$TMP/tiny" --latents "$TMP/gen.safetensors" --output "$TMP/regen.png" 2>&1)
        if [ $? -eq 0 ] && same_pixels "$TMP/gen.png" "$TMP/regen.png"; then ok "decode: generate --save-latents -> decode gives generate's pixels"
        else fail "decode: generate -> decode round trip: $out"; fi
        # generate at tp 2 decodes patch-parallel (a row band per rank); the
        # one-rank decode of its own latents, and generate at tp 1, agree
        # within one level (f32)
        PSNR=$TMP/psnr
        cc -O2 -o "$PSNR" "$TPGEN_ROOT/scripts/psnr.c" -lpng -lm || fail "decode: building scripts/psnr.c"
        out=$($MPIRUN -np 2 "$TPGEN" --model "$TMP/tiny" --prompt-embeds "$TMP/tiny/prompt_embeds.safetensors" --width 64 \
              --height 48 --steps 2 --seed 5 --backend cpu --precision f32 --output "$TMP/gen2.png" \
              --save-latents "$TMP/gen2.safetensors" 2>&1) &&
            "${DEC[@]}" --model "$TMP/tiny" --latents "$TMP/gen2.safetensors" --output "$TMP/regen2.png" >/dev/null 2>&1
        if [ $? -eq 0 ]; then
            d1=$("$PSNR" "$TMP/gen2.png" "$TMP/regen2.png" --max) d2=$("$PSNR" "$TMP/gen2.png" "$TMP/gen.png" --max)
            echo "# generate tp 2 (band decode) vs one-rank decode of its latents: max diff $d1; vs generate tp 1: max diff $d2"
            if [ "$d1" -le 1 ] && [ "$d2" -le 1 ]; then ok "decode: generate at tp 2 (patch-parallel decode) within 1 level of the one-rank decode and of tp 1"
            else fail "decode: generate tp 2 differs: $d1 levels from the one-rank decode, $d2 from tp 1"; fi
        else
            fail "decode: generate at tp 2: $(echo "$out" | tail -2)"
        fi
    fi
else
    fail "decode: tpgen make-tiny failed"
fi
