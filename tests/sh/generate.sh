#!/usr/bin/env bash
# budget: 45 s; checks: 27
# tier: quick
# Command-line tests of `tpgen generate` and `tpgen make-tiny`: help, every
# class of bad input (non-zero exit on every rank, message printed once),
# and runs on the golden tiny pipeline and a make-tiny folder.
. "$TPGEN_ROOT/tests/lib.sh"
A=$TPGEN_GOLDEN/flux2-tiny-a
EMB="$A/denoise.safetensors:prompt_embeds"
RUN2="$MPIRUN -np 2 $TPGEN"

# --- help documents every flag ---
help=$($TPGEN generate --help)
missing=""
for f in --model --prompt --prompt-embeds --spec --seed --steps --guidance --width --height --output \
         --precision --backend --tp --save-latents --no-decode --json-metrics --max-sequence-length \
         --negative-prompt --prompts-file --skip-existing --rng --initial-latents; do
    echo "$help" | grep -q -- "^  $f" || missing="$missing $f"
done
[ -z "$missing" ] && ok "generate --help documents every flag" || fail "generate --help lacks:$missing"

# --- bad inputs at np 2: exit non-zero, message once, no crash ---
once() { # NAME PATTERN ARGS...
    local name=$1 pat=$2; shift 2
    local out rc n
    out=$($RUN2 "$@" 2>&1); rc=$?
    n=$(echo "$out" | grep -c 'tpgen: error')
    if [ $rc -eq 0 ]; then fail "$name: exited 0"; return; fi
    if echo "$out" | grep -qE 'Segmentation|core dumped|AddressSanitizer|LeakSanitizer|runtime error'; then
        fail "$name: crashed: $(echo "$out" | tail -3)"; return
    fi
    if [ "$n" -ne 1 ]; then fail "$name: the error was printed $n times"; return; fi
    if echo "$out" | grep -qE -- "$pat"; then ok "$name"; else fail "$name: message did not match '$pat': $(echo "$out" | grep 'tpgen: error')"; fi
}
base=(--model "$A/model" --prompt-embeds "$EMB" --width 96 --height 64 --save-latents "$TMP/x.safetensors")
once "size not a multiple of 16" "--width: 100 is not a multiple of 16" "${base[@]}" --width 100
once "steps <= 0" "--steps: 0 is out of range" "${base[@]}" --steps 0
once "missing model folder" "model folder $TMP/nope does not exist" --model "$TMP/nope" --prompt-embeds "$EMB" --save-latents "$TMP/x.st"
once "unreadable run spec" "cannot read the run spec $TMP/none.yaml" "${base[@]}" --spec "$TMP/none.yaml"
printf 'steps: 4\nsteps_count: 3\n' > "$TMP/bad.yaml"
once "invalid run spec names line and column" "bad.yaml:2:1: steps_count: unknown key" "${base[@]}" --spec "$TMP/bad.yaml"
printf 'steps: 4\nwidth: [\n' > "$TMP/broken.yaml"
once "malformed YAML" "broken.yaml:[0-9]+:[0-9]+: invalid YAML" "${base[@]}" --spec "$TMP/broken.yaml"
once "output directory missing" "the directory $TMP/no/dir does not exist" "${base[@]}" --save-latents "$TMP/no/dir/l.safetensors"
once "embeddings of the wrong shape" "has 32 features per token but the transformer's joint_attention_dim is 96" \
    --model "$A/model" --prompt-embeds "$A/transformer_cases.safetensors:case0.hidden_states" --save-latents "$TMP/x.st"
once "--prompt without a text encoder" "has no text encoder" --model "$A/model" --prompt "a fox" --save-latents "$TMP/x.st"
once "no VAE and no latents requested" "has no VAE" --model "$A/model" --prompt-embeds "$EMB"
once "neither PNG nor latents" "would produce nothing" --model "$A/model" --prompt-embeds "$EMB" --no-decode
once "tp not dividing the world" "--tp 3 does not divide" "${base[@]}" --tp 3
once "unknown flag" "unknown option '--stepz'" "${base[@]}" --stepz 3
printf 'model: %s\nprompt_embeds: "%s"\nprompts: [a, b]\nsave_latents: %s/same.st\n' "$A/model" "$EMB" "$TMP" > "$TMP/clash.yaml"
once "batch writing one file" "not both|would all write" --spec "$TMP/clash.yaml"

# --- end to end on the golden tiny pipeline (needs the transformer) ---
out=$($RUN2 "${base[@]}" --precision f32 --seed 1 --steps 4 --guidance 4 --save-latents "$TMP/a.safetensors" \
      --json-metrics "$TMP/m.json" --backend cpu 2>&1); rc=$?
if true; then
    [ $rc -eq 0 ] && [ -s "$TMP/a.safetensors" ] && ok "generate --prompt-embeds --save-latents at np 2" \
        || fail "generate at np 2 (rc $rc): $(echo "$out" | tail -3)"
    [ "$(echo "$out" | grep -c 'peak RSS per rank')" -eq 1 ] && ok "summary printed once with peak RSS" \
        || fail "summary: $(echo "$out" | tail -5)"
    grep -q '"seconds_per_step"' "$TMP/m.json" 2>/dev/null && grep -q '"peak_rss_bytes"' "$TMP/m.json" \
        && ok "--json-metrics writes the figures" || fail "--json-metrics: $(head -c 300 "$TMP/m.json" 2>&1)"
    # data parallel: 2 groups of tp 1 share 4 jobs, each job written exactly once
    printf 'seeds: [1, 2, 3, 4]\nsave_latents: %s/dp-{index}-{seed}.safetensors\nwidth: 96\nheight: 64\n' "$TMP" > "$TMP/dp.yaml"
    out=$($RUN2 --model "$A/model" --prompt-embeds "$EMB" --spec "$TMP/dp.yaml" --tp 1 --steps 2 --backend cpu 2>&1); rc=$?
    n=$(ls "$TMP"/dp-*.safetensors 2>/dev/null | wc -l)
    if [ $rc -eq 0 ] && [ "$n" -eq 4 ] && [ -s "$TMP/dp-0-1.safetensors" ] && [ -s "$TMP/dp-3-4.safetensors" ]; then
        ok "data parallel (tp 1 x dp 2): 4 jobs, 4 files"
    else
        fail "data parallel: rc $rc, $n files: $(echo "$out" | tail -3)"
    fi
fi

# --- make-tiny, then a run on it ---
out=$($TPGEN make-tiny --out "$TMP/tiny" --seed 3 2>&1); rc=$?
if [ $rc -ne 0 ] || [ ! -s "$TMP/tiny/transformer/diffusion_pytorch_model.safetensors" ] || [ ! -s "$TMP/tiny/model_index.json" ]; then
    fail "make-tiny (rc $rc): $out"
else
    ok "make-tiny writes a pipeline folder"
    $TPGEN make-tiny --out "$TMP/tiny2" --seed 3 >/dev/null 2>&1
    cmp -s "$TMP/tiny/transformer/diffusion_pytorch_model.safetensors" "$TMP/tiny2/transformer/diffusion_pytorch_model.safetensors" \
        && ok "make-tiny: same seed, same weights" || fail "make-tiny is not reproducible"
    args=(--model "$TMP/tiny" --width 64 --height 48 --steps 2 --seed 5 --backend cpu --save-latents "$TMP/t.safetensors")
    if [ -d "$TMP/tiny/text_encoder" ]; then args+=(--prompt "a small test"); else args+=(--prompt-embeds "$TMP/tiny/prompt_embeds.safetensors"); fi
    [ -d "$TMP/tiny/vae" ] && args+=(--output "$TMP/t.png")
    out=$($RUN2 "${args[@]}" 2>&1); rc=$?
    if [ $rc -ne 0 ]; then
        fail "generate on make-tiny (rc $rc): $(echo "$out" | tail -3)"
    else
        ok "generate on a make-tiny folder at np 2"
        if [ -d "$TMP/tiny/vae" ]; then
            [ -s "$TMP/t.png" ] && grep -aq "seed: 5" "$TMP/t.png" && ok "PNG written with its parameters" \
                || fail "PNG missing or without parameters"
        fi
    fi
fi

# --- klein base (CFG) and the regression script, on the make-tiny folder with every part ---
if [ -d "$TMP/tiny/vae" ] && [ -d "$TMP/tiny/text_encoder" ] && [ -s "$TMP/t.png" ]; then
    cp -r "$TMP/tiny" "$TMP/base"
    sed -i 's/"is_distilled": true/"is_distilled": false/' "$TMP/base/model_index.json"
    out=$($RUN2 --model "$TMP/base" --prompt "a small test" --negative-prompt "blurry" --steps 2 --guidance 3 \
          --width 64 --height 48 --max-sequence-length 16 --backend cpu --output "$TMP/cfg.png" 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -aq "guidance: 3 (CFG)" "$TMP/cfg.png" && grep -aq "negative_prompt: blurry" "$TMP/cfg.png"; then
        ok "klein base runs CFG (parameters record it)"
    else
        fail "klein base CFG (rc $rc): $(echo "$out" | tail -3)"
    fi
    # a batch whose prompt embeddings exceed the budget runs in chunks (text encoder, then transformer,
    # per chunk): same latents as one chunk
    printf 'prompts: [one, two, three]\nseeds: [4, 5]\nwidth: 32\nheight: 32\nsteps: 1\nmax_sequence_length: 8\nbackend: cpu\nno_decode: true\n' > "$TMP/chunk.yaml"
    $RUN2 --model "$TMP/tiny" --spec "$TMP/chunk.yaml" --save-latents "$TMP/c1-{index}.st" >/dev/null 2>&1; rc1=$?
    $MPIRUN -np 2 -x TPGEN_EMBED_BUDGET_MB=0 $TPGEN --model "$TMP/tiny" --spec "$TMP/chunk.yaml" --save-latents "$TMP/c2-{index}.st" >/dev/null 2>&1; rc2=$?
    same=0
    for i in 0 1 2 3 4 5; do cmp -s "$TMP/c1-$i.st" "$TMP/c2-$i.st" && same=$((same + 1)); done
    [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $same -eq 6 ] && ok "a batch split into chunks gives the same latents" \
        || fail "chunked batch: rc $rc1/$rc2, $same of 6 files equal"
    printf 'prompts: [a small test, a lighthouse]\nseeds: [1, 2]\nwidth: 64\nheight: 48\nsteps: 2\nmax_sequence_length: 16\nbackend: cpu\n' > "$TMP/reg.yaml"
    R="$TPGEN_ROOT/scripts/regress.sh --model $TMP/tiny --spec $TMP/reg.yaml --ref $TMP/refs --np 2"
    if $R --update --out "$TMP/r0" >/dev/null 2>&1 && [ "$(ls "$TMP/refs" | wc -l)" -eq 4 ]; then
        out=$($R --out "$TMP/r1" 2>&1); rc=$?
        [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c ' inf  ok')" -eq 4 ] && ok "regress.sh: same renders pass (inf dB)" \
            || fail "regress.sh same renders (rc $rc): $(echo "$out" | tail -3)"
        out=$($R --out "$TMP/r2" -- --steps 1 2>&1); rc=$?
        [ $rc -ne 0 ] && echo "$out" | grep -q "4 failed" && ok "regress.sh: changed renders fail under the threshold" \
            || fail "regress.sh changed renders (rc $rc): $(echo "$out" | tail -3)"
    else
        fail "regress.sh --update did not store 4 references"
    fi
fi
