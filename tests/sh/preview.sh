#!/usr/bin/env bash
# budget: 45 s; checks: 14
# `tpgen generate --preview-every K --preview PATTERN` (and the run-spec keys)
# on a make-tiny model at tp 2: the number of preview files and their sizes
# (4 steps with K = 2: after steps 2 and 4; K = 3: after step 3), {step},
# {index} and {seed} in the pattern, the preview after the last step
# pixel-identical to the image (x0 = x - 0*v: the final latents), one
# progress line per step, and the errors (missing pattern, no {step}, a
# pattern every job shares, a missing folder).
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/tiny
$TPGEN make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "make-tiny"
# the image data from IDAT on: PNGs of the same pixels differ only in the text chunk before it
png_pixels() { local off; off=$(LC_ALL=C grep -obUa IDAT "$1" | head -1 | cut -d: -f1); tail -c +$((off - 3)) "$1"; }
png_size() { od -An -tu1 -j16 -N8 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4 "x" $5*16777216+$6*65536+$7*256+$8}'; }

mkdir -p "$TMP/p"
out=$($MPIRUN -np 2 $TPGEN --model "$M" --prompt "a fox" --width 64 --height 48 --steps 4 --seed 7 \
    --preview-every 2 --preview "$TMP/p/{index}-{seed}-{step:02}.png" --output "$TMP/img.png" 2>&1)
rc=$?
files=$(ls "$TMP/p" 2>/dev/null | tr '\n' ' ')
[ $rc = 0 ] && [ "$files" = "0-7-02.png 0-7-04.png " ] && ok "4 steps, --preview-every 2: two previews, after steps 2 and 4 ($files)" ||
    fail "--preview-every 2: rc $rc, files '$files': $(echo "$out" | tail -2)"
[ "$(png_size "$TMP/p/0-7-02.png")" = 64x48 ] && [ "$(png_size "$TMP/p/0-7-04.png")" = 64x48 ] &&
    ok "the previews are PNGs of the image's size (64x48)" || fail "preview sizes: $(png_size "$TMP/p/0-7-02.png")"
cmp -s <(png_pixels "$TMP/p/0-7-04.png") <(png_pixels "$TMP/img.png") &&
    ok "the preview after the last step has the image's pixels (sigma 0: x0 is the final latents)" ||
    fail "the last preview differs from the image"
! cmp -s <(png_pixels "$TMP/p/0-7-02.png") <(png_pixels "$TMP/img.png") &&
    ok "the preview after step 2 differs from the image (a prediction, not the result)" || fail "step-2 preview equals the image"
[ "$(echo "$out" | grep -c 'step [0-9]/4')" = 4 ] && ! echo "$out" | grep -qi preview.*png &&
    ok "progress stays one line per step (4 lines, no preview lines)" || fail "progress lines: $(echo "$out" | grep -c 'step')"
echo "$out" | grep -q "2 previews, [0-9.]* s each to decode" && ok "the summary counts the previews and their decode time" ||
    fail "summary: $(echo "$out" | grep denoise)"

# the mesh: with --sp 2 the job group's first rank writes the previews (the other TP group's first rank holds no
# image); Ulysses SP changes no arithmetic, so they are one rank's, pixel for pixel
mkdir -p "$TMP/s1" "$TMP/s2"
$MPIRUN -np 1 $TPGEN --model "$M" --prompt "a fox" --width 64 --height 48 --steps 4 --seed 7 --preview-every 2 \
    --preview "$TMP/s1/{step}.png" --output "$TMP/s1/img.png" >"$TMP/s1.log" 2>&1
$MPIRUN -np 2 $TPGEN --model "$M" --prompt "a fox" --width 64 --height 48 --steps 4 --seed 7 --preview-every 2 \
    --preview "$TMP/s2/{step}.png" --output "$TMP/s2/img.png" --sp 2 >"$TMP/s2.log" 2>&1
[ "$(ls "$TMP/s2" | tr '\n' ' ')" = "2.png 4.png img.png " ] && cmp -s <(png_pixels "$TMP/s1/2.png") <(png_pixels "$TMP/s2/2.png") &&
    cmp -s <(png_pixels "$TMP/s1/img.png") <(png_pixels "$TMP/s2/img.png") &&
    ok "--sp 2: two previews, pixel-identical to one rank's" ||
    fail "--sp 2 previews: $(ls "$TMP/s2" | tr '\n' ' ') $(tail -2 "$TMP/s2.log")"

# run-spec keys, two seeds, K = 3: one preview per job (after step 3 of 4)
printf 'prompts: ["a fox"]\nseeds: [5, 6]\nwidth: 32\nheight: 32\nsteps: 4\npreview_every: 3\npreview: %s/q/{index}-{seed}-{step}.png\noutput: %s/o-{index}.png\n' "$TMP" "$TMP" >"$TMP/spec.yaml"
mkdir -p "$TMP/q"
out=$($MPIRUN -np 2 $TPGEN --model "$M" --spec "$TMP/spec.yaml" 2>&1)
files=$(ls "$TMP/q" 2>/dev/null | tr '\n' ' ')
[ "$files" = "0-5-3.png 1-6-3.png " ] && [ "$(png_size "$TMP/q/1-6-3.png")" = 32x32 ] &&
    ok "run spec preview_every: 3 / preview: two jobs, one 32x32 preview each after step 3 ($files)" ||
    fail "run-spec previews: '$files': $(echo "$out" | tail -2)"

# errors, before anything is loaded
expect_fail "--preview-every without --preview" "needs --preview PATTERN" \
    $MPIRUN -np 2 $TPGEN --model "$M" --prompt x --preview-every 2
expect_fail "--preview without {step}" "put \{step\} in it" \
    $MPIRUN -np 2 $TPGEN --model "$M" --prompt x --preview-every 2 --preview "$TMP/p.png"
expect_fail "--preview shared by two jobs" "put \{index\} or \{seed\}" \
    $MPIRUN -np 2 $TPGEN --model "$M" --spec "$TMP/spec.yaml" --preview "$TMP/q/{step}.png"
expect_fail "--preview into a missing folder" "does not exist" \
    $MPIRUN -np 2 $TPGEN --model "$M" --prompt x --preview-every 2 --preview "$TMP/nowhere/{step}.png"
expect_fail "serve refuses --preview-every (a request streams its partials)" "option of generate.*partial_images" \
    $MPIRUN -np 2 $TPGEN serve --model "$M" --preview-every 2 --preview "$TMP/{step}.png"
# a preview that cannot be written stops the job there, on every rank, saying why (one rank prefix)
mkdir -p "$TMP/d/2.png"
expect_fail "a preview that cannot be written: the job stops, naming the step and the file" \
    "error: rank 0: job 0 \(seed 0\): the preview after step 2: cannot write .*2.png" \
    $MPIRUN -np 2 $TPGEN --model "$M" --prompt x --width 32 --height 32 --steps 4 --preview-every 2 --preview "$TMP/d/{step}.png" --output "$TMP/d/i.png"
