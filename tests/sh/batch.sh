#!/usr/bin/env bash
# budget: 15 s; checks: 15
# Batch features for re-queued Slurm jobs: --skip-existing (a re-run renders
# only the missing outputs, byte-identical to the first run's) and
# --prompts-file (one prompt per line, errors with line numbers).
. "$TPGEN_ROOT/tests/lib.sh"
A=$TPGEN_GOLDEN/flux2-tiny-a
EMB="$A/denoise.safetensors:prompt_embeds"
RUN2="$MPIRUN -np 2 $TPGEN"

# json_field FILE KEY: an integer field of the metrics JSON
json_field() { sed -n "s/^ *\"$2\": *\([0-9]*\),*$/\1/p" "$1"; }

# --- --skip-existing on the golden tiny transformer (latents files), tp 1 x dp 2 ---
printf 'seeds: [1, 2, 3, 4]\nsave_latents: %s/l-{index}-{seed}.safetensors\nwidth: 96\nheight: 64\nsteps: 2\nbackend: cpu\nprecision: f32\ntp: 1\n' \
    "$TMP" > "$TMP/lat.yaml"
lat=(--model "$A/model" --prompt-embeds "$EMB" --spec "$TMP/lat.yaml")
out=$($RUN2 "${lat[@]}" --json-metrics "$TMP/m1.json" 2>&1); rc=$?
n=$(ls "$TMP"/l-*.safetensors 2>/dev/null | wc -l)
if [ $rc -ne 0 ] || [ "$n" -ne 4 ]; then
    fail "first batch run: rc $rc, $n of 4 files: $(echo "$out" | tail -3)"
else
    ok "a 4-job batch writes 4 latents files (tp 1 x dp 2)"
    mkdir "$TMP/first" && cp "$TMP"/l-*.safetensors "$TMP/first/"
    rm "$TMP/l-2-3.safetensors"
    touch -d '2000-01-01' "$TMP"/l-*.safetensors   # kept files must not be rewritten
    out=$($RUN2 "${lat[@]}" --skip-existing --json-metrics "$TMP/m2.json" 2>&1); rc=$?
    if [ $rc -eq 0 ] && [ "$(json_field "$TMP/m2.json" jobs_rendered)" = 1 ] && [ "$(json_field "$TMP/m2.json" jobs_skipped)" = 3 ] \
        && [ "$(json_field "$TMP/m2.json" latents_files)" = 1 ] && [ "$(json_field "$TMP/m2.json" jobs)" = 4 ]; then
        ok "--skip-existing after a lost output: 1 job rendered, 3 skipped (metrics JSON)"
    else
        fail "--skip-existing re-run (rc $rc): $(grep -E 'jobs|latents_files' "$TMP/m2.json" 2>&1 | tr -d '\n') $(echo "$out" | tail -3)"
    fi
    echo "$out" | grep -q -- '--skip-existing: 1 job rendered, 3 skipped' && ok "the summary counts the skipped jobs" \
        || fail "summary: $(echo "$out" | grep -A1 'jobs (')"
    cmp -s "$TMP/first/l-2-3.safetensors" "$TMP/l-2-3.safetensors" && ok "the re-rendered file is byte-identical to the first run's" \
        || fail "re-rendered l-2-3.safetensors differs from the first run's (or is missing)"
    old=$(find "$TMP" -maxdepth 1 -name 'l-*.safetensors' ! -newermt '2001-01-01' | wc -l)
    [ "$old" -eq 3 ] && ok "the 3 existing files were left alone" || fail "$old of 3 existing files untouched"
    out=$($RUN2 "${lat[@]}" --skip-existing --json-metrics "$TMP/m3.json" 2>&1); rc=$?
    [ $rc -eq 0 ] && [ "$(json_field "$TMP/m3.json" jobs_skipped)" = 4 ] && [ "$(json_field "$TMP/m3.json" jobs_rendered)" = 0 ] \
        && ok "--skip-existing with every output there renders nothing" || fail "all present (rc $rc): $(echo "$out" | tail -3)"
    out=$($RUN2 "${lat[@]}" --json-metrics "$TMP/m4.json" 2>&1); rc=$?
    [ $rc -eq 0 ] && [ "$(json_field "$TMP/m4.json" jobs_rendered)" = 4 ] && [ "$(json_field "$TMP/m4.json" latents_files)" = 4 ] \
        && [ "$(json_field "$TMP/m4.json" jobs_skipped)" = 0 ] && ok "without --skip-existing all 4 jobs are rendered" \
        || fail "plain re-run (rc $rc): $(grep -E 'jobs|latents_files' "$TMP/m4.json" 2>&1 | tr -d '\n')"
    # tp 2: one group of two ranks, its lead decides for both (no hang); f32 sums in another order than
    # at tp 1, so compare with a plain tp 2 run
    t2=(--tp 2 --save-latents "$TMP/t2-{index}-{seed}.safetensors")
    timeout 120 $RUN2 "${lat[@]}" "${t2[@]}" >/dev/null 2>&1
    mkdir "$TMP/t2" && cp "$TMP"/t2-*.safetensors "$TMP/t2/" 2>/dev/null
    rm -f "$TMP/t2-0-1.safetensors" "$TMP/t2-3-4.safetensors"
    out=$(timeout 120 $RUN2 "${lat[@]}" "${t2[@]}" --skip-existing --json-metrics "$TMP/m5.json" 2>&1); rc=$?
    same=0
    for f in t2-0-1 t2-3-4; do cmp -s "$TMP/t2/$f.safetensors" "$TMP/$f.safetensors" && same=$((same + 1)); done
    [ $rc -eq 0 ] && [ "$(json_field "$TMP/m5.json" jobs_rendered)" = 2 ] && [ "$(json_field "$TMP/m5.json" jobs_skipped)" = 2 ] \
        && [ $same -eq 2 ] && ok "--skip-existing at tp 2: the 2 missing jobs rendered again, byte-identical" \
        || fail "tp 2 skip (rc $rc, $same of 2 equal): $(echo "$out" | tail -3)"
fi

# --- --prompts-file: errors (every rank exits non-zero, message once) ---
once() { # NAME PATTERN ARGS...
    local name=$1 pat=$2; shift 2
    local out rc n
    out=$($RUN2 "$@" 2>&1); rc=$?
    n=$(echo "$out" | grep -c 'tpgen: error')
    if [ $rc -eq 0 ]; then fail "$name: exited 0"; return; fi
    if echo "$out" | grep -qE 'Segmentation|core dumped|AddressSanitizer|LeakSanitizer|runtime error'; then fail "$name: crashed"; return; fi
    if [ "$n" -ne 1 ]; then fail "$name: the error was printed $n times"; return; fi
    if echo "$out" | grep -qE -- "$pat"; then ok "$name"; else fail "$name: message did not match '$pat': $(echo "$out" | grep 'tpgen: error')"; fi
}
printf 'a fox\n\na lighthouse at dusk\n' > "$TMP/good.txt"
printf 'a fox\n\nbad \xff byte\n' > "$TMP/bad.txt"
: > "$TMP/empty.txt"
pbase=(--model "$A/model" --width 96 --height 64 --save-latents "$TMP/p-{index}.st")
once "--prompts-file missing" "--prompts-file $TMP/nope.txt: cannot open it" "${pbase[@]}" --prompts-file "$TMP/nope.txt"
once "--prompts-file with invalid UTF-8 names the line" "bad.txt:3:5: invalid UTF-8" "${pbase[@]}" --prompts-file "$TMP/bad.txt"
once "--prompts-file empty" "empty.txt: the prompts file has no prompts" "${pbase[@]}" --prompts-file "$TMP/empty.txt"
once "--prompts-file with --prompt" "not both" "${pbase[@]}" --prompts-file "$TMP/good.txt" --prompt "x"
printf 'prompts: [a, b]\n' > "$TMP/pp.yaml"
once "--prompts-file with prompts: in the spec" "not both" "${pbase[@]}" --spec "$TMP/pp.yaml" --prompts-file "$TMP/good.txt"

# --- --prompts-file + --skip-existing end to end on a make-tiny folder (text encoder + VAE: PNGs) ---
$TPGEN make-tiny --out "$TMP/tiny" --seed 3 >/dev/null 2>&1
if [ ! -d "$TMP/tiny/text_encoder" ] || [ ! -d "$TMP/tiny/vae" ]; then
    fail "make-tiny did not write a text encoder and a VAE; the prompts-file run needs both"
else
    printf 'a small test\r\n\r\na lighthouse at dusk\r\n' > "$TMP/prompts.txt"
    printf 'prompts_file: %s/prompts.txt\nseeds: [5, 6]\noutput: %s/img-{prompt_index}-{seed}.png\nwidth: 64\nheight: 48\nsteps: 2\nmax_sequence_length: 16\nbackend: cpu\ntp: 1\n' \
        "$TMP" "$TMP" > "$TMP/png.yaml"
    out=$($RUN2 --model "$TMP/tiny" --spec "$TMP/png.yaml" --json-metrics "$TMP/p1.json" 2>&1); rc=$?
    n=$(ls "$TMP"/img-*.png 2>/dev/null | wc -l)
    if [ $rc -eq 0 ] && [ "$n" -eq 4 ] && grep -aq "prompt: a lighthouse at dusk" "$TMP/img-1-6.png" \
        && ! grep -aq $'dusk\r' "$TMP/img-1-6.png"; then
        ok "prompts_file: 2 prompts (CRLF, blank line) x 2 seeds -> 4 PNGs with their prompts"
        cp "$TMP/img-0-6.png" "$TMP/first-0-6.png"
        rm "$TMP/img-0-6.png"
        out=$($RUN2 --model "$TMP/tiny" --spec "$TMP/png.yaml" --skip-existing --json-metrics "$TMP/p2.json" 2>&1); rc=$?
        [ $rc -eq 0 ] && [ "$(json_field "$TMP/p2.json" images)" = 1 ] && [ "$(json_field "$TMP/p2.json" jobs_skipped)" = 3 ] \
            && cmp -s "$TMP/first-0-6.png" "$TMP/img-0-6.png" \
            && ok "--skip-existing with PNGs: the missing one rendered again, byte-identical" \
            || fail "PNG skip re-run (rc $rc): $(echo "$out" | tail -3)"
    else
        fail "prompts_file run (rc $rc, $n PNGs): $(echo "$out" | tail -3)"
    fi
fi
