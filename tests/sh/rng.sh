#!/usr/bin/env bash
# budget: 40 s; checks: 35
# The seeded noise and --initial-latents, end to end. A transformer with
# all-zero weights (written here from klein-tiny's / FLUX.3 flow-map's
# shapes) predicts v = 0, so the saved latents are the start itself:
#  - --seed: FLUX.2's bf16 noise equals torch 2.15's draws stored in
#    randn-torch2.safetensors (tests/tools/randn_torch2.py) for 6 image sizes
#    x 5 seeds (two of them >= 2^32), bit for bit, at tp 1 and 2 (f32 and
#    bf16 precision); FLUX.3's f32 noise likewise (4 seeds); --rng torch1
#    gives torch 1.13's draw of flux2-tiny-a's golden run;
#  - --initial-latents: the exact start (a golden set's initial_latents) at
#    tp 1 and 2, several jobs from one file (one tensor each, named with
#    {index}; also as the run-spec key), decode's and the PNG's parameters (file and
#    sha256, no seed), and refusals (wrong shape on every rank of tp 2, NaN,
#    several jobs with one tensor, a missing tensor) with no file written.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
G=$TPGEN_GOLDEN
R=$G/randn-torch2.safetensors
CRAFT="python3 $TPGEN_ROOT/tests/tools/craft.py"
CHECK="python3 $TPGEN_ROOT/tests/tools/noise_check.py"
# klein-tiny with a zero transformer (no text encoder run: case 0's prompt embeddings)
Z=$TMP/zero
mkdir -p "$Z/transformer"
for x in model_index.json scheduler vae text_encoder tokenizer; do ln -s "$G/klein-tiny/model/$x" "$Z/$x"; done
cp "$G/klein-tiny/model/transformer/config.json" "$Z/transformer/"
$CRAFT zeros "$G/klein-tiny/model/transformer/diffusion_pytorch_model.safetensors" "$Z/transformer/diffusion_pytorch_model.safetensors"
E=$G/klein-tiny/e2e.safetensors:case0.prompt_embeds
BASE=(--model "$Z" --prompt-embeds "$E" --steps 2 --backend cpu --no-decode)
SEEDS="0 1 42 4294967297 18446744073709551615"
# H W (pixels) and the stored shape's h w (tokens)
SIZES="16x16:1x1 32x48:2x3 64x64:4x4 64x96:4x6 96x64:6x4 128x128:8x8"

# --- FLUX.2: --seed is torch 2.15's bf16 draw ---
for np in 1 2; do
    for sz in $SIZES; do
        px=${sz%%:*} tk=${sz##*:}
        H=${px%%x*} W=${px##*x}
        printf 'seeds: [%s]\n' "$(echo $SEEDS | sed 's/ /, /g')" > "$TMP/seeds.yaml"
        if ! $MPIRUN -np $np "$TPGEN" generate --spec "$TMP/seeds.yaml" "${BASE[@]}" --precision f32 --width $W \
            --height $H --save-latents "$TMP/s$np-$px-{seed}.st" >"$TMP/log" 2>&1; then
            fail "rng flux2 tp=$np ${W}x$H: generate: $(tail -3 "$TMP/log" | tr '\n' ' ')"; continue
        fi
        bad=
        for s in $SEEDS; do
            r=$($CHECK "$TMP/s$np-$px-$s.st" "$R" "seed$s.1x32x$tk.bf16" 2>&1) || bad="$bad seed $s: $r;"
        done
        [ -z "$bad" ] && ok "rng flux2 tp=$np ${W}x$H: --seed = torch 2.15's bf16 randn [1,32,${tk/x/,}] for seeds ${SEEDS// /, }, bit for bit" \
            || fail "rng flux2 tp=$np ${W}x$H:$bad"
    done
done
# bf16 precision (the default) starts from the same values
if $MPIRUN -np 2 "$TPGEN" generate "${BASE[@]}" --seed 4294967297 --width 96 --height 64 \
    --save-latents "$TMP/b.st" >"$TMP/log" 2>&1 && r=$($CHECK "$TMP/b.st" "$R" seed4294967297.1x32x4x6.bf16 2>&1); then
    ok "rng flux2 tp=2 bf16 precision: seed 2^32+1 = torch 2.15's draw"
else fail "rng flux2 bf16 precision: ${r:-$(tail -3 "$TMP/log" | tr '\n' ' ')}"; fi
# --rng torch1: torch 1.13's draw, as in flux2-tiny-a's golden run (seed 1, 64x96)
if $MPIRUN -np 2 "$TPGEN" generate "${BASE[@]}" --precision f32 --seed 1 --width 96 --height 64 --rng torch1 \
    --save-latents "$TMP/t1.st" >"$TMP/log" 2>&1 &&
    r=$($CHECK "$TMP/t1.st" "$G/flux2-tiny-a/denoise.safetensors" initial_latents 2>&1); then
    ok "rng --rng torch1: torch 1.13's draw (flux2-tiny-a's golden initial_latents, seed 1)"
else fail "rng --rng torch1: ${r:-$(tail -3 "$TMP/log" | tr '\n' ' ')}"; fi
r=$($CHECK "$TMP/t1.st" "$R" seed1.1x32x4x6.bf16 2>&1) && fail "rng --rng torch1 equals torch 2.15's draw" \
    || ok "rng --rng torch1 differs from the default ($r)"

# --- FLUX.3: f32 noise, unchanged from torch 1.13 to 2.15 ---
F=$TMP/f3
mkdir -p "$F/transformer"
ln -s "$G/vae-tiny/model/vae" "$F/vae"
cp "$TPGEN_ROOT/tests/data/flux3-pipe/flowmap_modular_model_index.json" "$F/modular_model_index.json"
cp "$G/flux3-tiny/flowmap/model/transformer/config.json" "$F/transformer/"
$CRAFT zeros "$G/flux3-tiny/flowmap/model/transformer/diffusion_pytorch_model.safetensors" \
    "$F/transformer/diffusion_pytorch_model.safetensors"
$CRAFT st "$TMP/e80.st" prompt_embeds:F32:1,80,80
printf 'seeds: [0, 1, 42, 4294967297]\n' > "$TMP/seeds3.yaml"
for np in 1 2; do
    for sz in 16x16:1x1 32x48:2x3 64x96:4x6 128x128:8x8; do
        px=${sz%%:*} tk=${sz##*:}
        H=${px%%x*} W=${px##*x}
        if ! $MPIRUN -np $np "$TPGEN" generate --spec "$TMP/seeds3.yaml" --model "$F" --prompt-embeds "$TMP/e80.st" \
            --steps 2 --precision f32 --backend cpu --no-decode --width $W --height $H \
            --save-latents "$TMP/f$np-$px-{seed}.st" >"$TMP/log" 2>&1; then
            fail "rng flux3 tp=$np ${W}x$H: generate: $(tail -3 "$TMP/log" | tr '\n' ' ')"; continue
        fi
        bad=
        for s in 0 1 42 4294967297; do
            r=$($CHECK "$TMP/f$np-$px-$s.st" "$R" "seed$s.1x32x$tk.f32" 2>&1) || bad="$bad seed $s: $r;"
        done
        [ -z "$bad" ] && ok "rng flux3 tp=$np ${W}x$H: --seed = torch 2.15's f32 randn for 4 seeds, bit for bit" \
            || fail "rng flux3 tp=$np ${W}x$H:$bad"
    done
done

# FLUX.3 from --initial-latents (any float tensor of the right shape: here torch's f32 draw of seed 42)
if $MPIRUN -np 2 "$TPGEN" generate --model "$F" --prompt-embeds "$TMP/e80.st" --steps 2 --precision f32 --backend cpu \
    --no-decode --width 96 --height 64 --initial-latents "$R:seed42.1x32x4x6.f32" --save-latents "$TMP/f3i.st" \
    >"$TMP/log" 2>&1 && r=$($CHECK "$TMP/f3i.st" "$R" seed42.1x32x4x6.f32 2>&1); then
    ok "initial-latents flux3 tp=2: the run starts exactly from the given tensor"
else fail "initial-latents flux3: ${r:-$(tail -3 "$TMP/log" | tr '\n' ' ')}"; fi

# --- --initial-latents ---
L=$G/flux2-tiny-a/denoise.safetensors   # initial_latents [1, 32, 4, 6]: 64x96
for np in 1 2; do
    if $MPIRUN -np $np "$TPGEN" generate "${BASE[@]}" --precision f32 --width 96 --height 64 --initial-latents "$L" \
        --save-latents "$TMP/i$np.st" >"$TMP/log" 2>&1 && r=$($CHECK "$TMP/i$np.st" "$L" initial_latents 2>&1); then
        ok "initial-latents tp=$np: the run starts exactly from $(basename "$L"):initial_latents"
    else fail "initial-latents tp=$np: ${r:-$(tail -3 "$TMP/log" | tr '\n' ' ')}"; fi
done
# several jobs: one tensor per job, named with {index} (klein-tiny's three cases, 64x96), from the run spec
cat > "$TMP/multi.yaml" <<EOY
seeds: [5, 6, 7]
initial_latents: $G/klein-tiny/e2e.safetensors:case{index}.initial_latents
EOY
if $MPIRUN -np 2 "$TPGEN" generate --spec "$TMP/multi.yaml" "${BASE[@]}" --precision f32 --width 96 --height 64 \
    --save-latents "$TMP/m{index}.st" >"$TMP/log" 2>&1; then
    bad=
    for i in 0 1 2; do
        r=$($CHECK "$TMP/m$i.st" "$G/klein-tiny/e2e.safetensors" case$i.initial_latents 2>&1) || bad="$bad job $i: $r;"
        grep -aq "case$i.initial_latents" "$TMP/m$i.st" || bad="$bad job $i: no initial_latents metadata;"
    done
    [ -z "$bad" ] && ok "initial-latents: 3 jobs, each from its own tensor (case{index}.initial_latents, run spec)" \
        || fail "initial-latents several jobs:$bad"
else fail "initial-latents several jobs: $(tail -3 "$TMP/log" | tr '\n' ' ')"; fi
# tpgen decode of such latents names the start instead of a seed
if "$TPGEN" decode --backend cpu --model "$Z" --latents "$TMP/m1.st" --output "$TMP/m1.png" >"$TMP/log" 2>&1 &&
    grep -aq "initial_latents: $G/klein-tiny/e2e.safetensors:case1.initial_latents" "$TMP/m1.png" &&
    ! grep -aq "seed: " "$TMP/m1.png"; then
    ok "initial-latents: tpgen decode's PNG names the start (file:tensor), no seed"
else fail "initial-latents: decode parameters: $(tail -3 "$TMP/log" | tr '\n' ' ')"; fi
# the PNG records the file and its sha256 instead of a seed
sha=$(sha256sum "$L" | cut -d' ' -f1)
if "$TPGEN" generate --model "$Z" --prompt-embeds "$E" --steps 2 --backend cpu --width 96 --height 64 \
    --initial-latents "$L:initial_latents" --output "$TMP/i.png" >"$TMP/log" 2>&1 &&
    grep -aq "initial_latents: $L:initial_latents (sha256 $sha)" "$TMP/i.png" && ! grep -aq "seed: " "$TMP/i.png"; then
    ok "initial-latents: the PNG's parameters name the file, tensor and sha256, and no seed"
else fail "initial-latents PNG parameters: $(tail -3 "$TMP/log" | tr '\n' ' ')"; fi
# refusals: every rank exits non-zero (mpirun's status), the message names the file, tensor and expected shape,
# nothing is written
expect_fail "initial-latents: a wrong shape is refused on every rank of tp 2" \
    "denoise.safetensors:initial_latents has shape \[1, 32, 4, 6\].*starts from \[1, 32, 4, 4\]" \
    $MPIRUN -np 2 "$TPGEN" generate "${BASE[@]}" --width 64 --height 64 --initial-latents "$L" --save-latents "$TMP/w.st"
[ ! -e "$TMP/w.st" ] && ok "initial-latents: nothing written after the refusal" || fail "initial-latents: $TMP/w.st written"
cp "$L" "$TMP/nan.st" && chmod u+w "$TMP/nan.st"
$CRAFT poke "$TMP/nan.st" initial_latents nan
expect_fail "initial-latents: a NaN is refused" "nan.st:initial_latents has a non-finite value \(nan\) at element 0" \
    $MPIRUN -np 2 "$TPGEN" generate "${BASE[@]}" --width 96 --height 64 --initial-latents "$TMP/nan.st" \
    --output "$TMP/nan.png" --save-latents "$TMP/nan-l.st"
[ ! -e "$TMP/nan.png" ] && [ ! -e "$TMP/nan-l.st" ] && ok "initial-latents: no PNG or latents after the NaN" \
    || fail "initial-latents: a file written after the NaN"
expect_fail "initial-latents: several jobs and one tensor are refused, saying how to name one per job" \
    "4 jobs, and each needs its own tensor.*initial_latents_\{index\}" \
    "$TPGEN" generate "${BASE[@]}" --width 96 --height 64 --spec "$TMP/seeds3.yaml" --initial-latents "$L" \
    --save-latents "$TMP/x{index}.st"
expect_fail "initial-latents: a missing tensor is named" "e2e.safetensors has no tensor 'case3.initial_latents' \(job 3\)" \
    "$TPGEN" generate "${BASE[@]}" --width 96 --height 64 --spec "$TMP/seeds3.yaml" \
    --initial-latents "$G/klein-tiny/e2e.safetensors:case{index}.initial_latents" --save-latents "$TMP/x{index}.st"
