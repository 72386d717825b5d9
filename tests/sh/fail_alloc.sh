#!/usr/bin/env bash
# budget: 90 s; checks: 28
# One rank running out of memory in the middle of a phase never hangs its
# group (TPGEN_FAIL_ALLOC=RANK:N:PHASE, docs/generate.md "Failure"):
#  - an allocation of a phase's prepare step (load, the text encoder's
#    buffers, the transformer's activations, the VAE band's input) fails on
#    every rank with the failing rank's message, no PNG, non-zero exit;
#  - one inside a lockstep section (the VAE pool during the band decode)
#    ends the job by MPI_Abort with a message naming the rank and the
#    phase; no PNG;
#  each well within 60 s, on rank 0 and on another rank, at tp 2 (make-tiny
#  FLUX.2 klein: all four phases) and tp 3 (the golden FLUX.3 tiny, whose 6
#  heads divide by 3; it has no text encoder, and no tiny text encoder has a
#  head count that 3 divides, so "encode" runs at tp 2 only). `serve`: a
#  prepare failure answers 500 and the next request gets generate's PNG; a
#  lockstep failure ends the server within seconds with the message. Unset,
#  or aimed at a rank outside the world, the variable changes nothing
#  (byte-identical PNG); a malformed one is refused. The sanitized build
#  stays clean on both kinds of failure.
#
# The N of each case is the allocation order of these models (counted per
# phase and rank): the prepare step's allocations come first in their phase;
# FLUX.2's denoise prepares 15 activations, then the context projection
# (16, 17) and the RoPE tables, and allocates nothing later, as FLUX.3's;
# the band decode allocates its input, then (mid-phase) pool buffers.
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/tiny
"$TPGEN" make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "fail_alloc: make-tiny"
F3=$TMP/f3
flux3_folder base "$F3"
P3=$TPGEN_ROOT/tests/data/flux3-pipe/base_t2i.safetensors
TWO=(--model "$M" --prompt "a fox" --seed 7 --width 64 --height 64 --steps 1 --backend cpu)
THREE=(--model "$F3" --prompt-embeds "$P3" --guidance 1 --seed 42 --width 64 --height 48 --steps 1 --backend cpu)
MPIX="$MPIRUN -x TPGEN_FAIL_ALLOC"

# run NP FAIL OUT ARGS...: generate with TPGEN_FAIL_ALLOC=FAIL (empty: unset); sets rc, took, log
run() {
    local np=$1 f=$2 png=$3; shift 3
    log=$TMP/run-$np-${f//:/_}.log
    rm -f "$png"
    local t0; t0=$(date +%s.%N)
    if [ -n "$f" ]; then TPGEN_FAIL_ALLOC=$f timeout 90 $MPIX -np "$np" "$TPGEN" "$@" --output "$png" >"$log" 2>&1
    else timeout 90 $MPIRUN -np "$np" "$TPGEN" "$@" --output "$png" >"$log" 2>&1; fi
    rc=$?
    took=$(echo "$(date +%s.%N) - $t0" | bc)
}
# fails NP FAIL KIND ARGS...: KIND agreed (prepare step) or abort (lockstep)
fails() {
    local np=$1 f=$2 kind=$3; shift 3
    local rank=${f%%:*} n phase=${f##*:} png=$TMP/f-$np-${f//:/_}.png
    n=${f#*:}; n=${n%%:*}
    run "$np" "$f" "$png" "$@"
    local name="fail_alloc tp $np $f ($kind)"
    local inj="out of memory allocating [0-9]* bytes \(injected by TPGEN_FAIL_ALLOC: allocation $n of the $phase phase\)"
    local why=
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || why="rc $rc"
    [ "$(echo "$took < 60" | bc)" = 1 ] || why="$why; took ${took}s"
    [ -e "$png" ] && why="$why; a PNG was written"
    ls "$TMP"/."${png##*/}".tmp-* >/dev/null 2>&1 && why="$why; a temporary file was left"
    if [ $kind = agreed ]; then
        grep -qE "^tpgen: error: rank $rank: .*$inj" "$log" || why="$why; no agreed message naming rank $rank"
        grep -q 'MPI_ABORT' "$log" && why="$why; aborted instead of agreeing"
    else
        grep -qE "^tpgen: error: rank $rank: $inj, in the middle of the $phase phase" "$log" ||
            why="$why; no abort message naming rank $rank and the phase"
    fi
    grep -qE 'Segmentation|core dumped|internal error' "$log" && why="$why; crashed"
    if [ -z "$why" ]; then ok "$name: exit $rc in $(printf %.1f "$took") s, no PNG"
    else fail "$name:$why: $(grep -m2 -E 'error|ABORT' "$log" | tr '\n' ' ')"; fi
}

# the references, and the variable aimed at no rank of the world: the same PNG
run 2 "" "$TMP/ref2.png" "${TWO[@]}"
[ $rc -eq 0 ] || fail "fail_alloc: reference run tp 2: $(tail -3 "$log")"
run 3 "" "$TMP/ref3.png" "${THREE[@]}"
[ $rc -eq 0 ] || fail "fail_alloc: reference run tp 3: $(tail -3 "$log")"
run 2 5:1:denoise "$TMP/other.png" "${TWO[@]}"
[ $rc -eq 0 ] && cmp -s "$TMP/other.png" "$TMP/ref2.png" &&
    ok "fail_alloc: aimed at world rank 5 of 2: exit 0, PNG byte-identical to the unset run" ||
    fail "fail_alloc: aimed at no rank: rc $rc, $(tail -2 "$log")"
TPGEN_FAIL_ALLOC=1:x:load $MPIX -np 2 "$TPGEN" "${TWO[@]}" --output "$TMP/bad.png" >"$TMP/bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ ! -e "$TMP/bad.png" ] && grep -q 'TPGEN_FAIL_ALLOC=1:x:load: expected RANK:N:PHASE' "$TMP/bad.log" &&
    ok "fail_alloc: a malformed TPGEN_FAIL_ALLOC is refused with what to write" ||
    fail "fail_alloc: malformed value: rc $rc $(head -2 "$TMP/bad.log")"

# tp 2, FLUX.2 klein with its text encoder: every phase, rank 0 and rank 1;
# beside it (two jobs at a time: most of a run is start-up), tp 3, FLUX.3
# from prompt embeddings: rank 0 and rank 2
for r in 0 1; do
    fails 2 $r:10:load agreed "${TWO[@]}"
    fails 2 $r:3:encode agreed "${TWO[@]}"
    fails 2 $r:1:denoise agreed "${TWO[@]}"
    fails 2 $r:16:denoise agreed "${TWO[@]}"
    fails 2 $r:1:decode agreed "${TWO[@]}"
    fails 2 $r:5:decode abort "${TWO[@]}"
done >"$TMP/tp2.out" 2>&1 &
tp2=$!
for r in 0 2; do
    fails 3 $r:5:load agreed "${THREE[@]}"
    fails 3 $r:1:denoise agreed "${THREE[@]}"
    fails 3 $r:1:decode agreed "${THREE[@]}"
    fails 3 $r:5:decode abort "${THREE[@]}"
done
wait $tp2 || fail "fail_alloc: the tp 2 runs: exit $?"
cat "$TMP/tp2.out"

# serve: a prepare failure answers 500 and the server goes on; a lockstep
# failure ends it within seconds
. "$TPGEN_ROOT/tests/lib_serve.sh"
post() {   # post OUT: the HTTP status of a seed-7 request like TWO's
    curl -s -m 60 -o "$1" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/v1/images/generations" \
        -H 'Content-Type: application/json' \
        -d '{"prompt": "a fox", "size": "64x64", "seed": 7, "steps": 1, "response_format": "b64_json"}'
}
export TPGEN_FAIL_ALLOC=1:1:denoise
MPIRUN=$MPIX start_server "$TMP/s1.log" "$TPGEN" --backend cpu
unset TPGEN_FAIL_ALLOC
if [ -z "$PORT" ]; then fail "fail_alloc serve: did not become ready: $(tail -3 "$TMP/s1.log")"; else
    code=$(post "$TMP/a1.json")
    [ "$code" = 500 ] && jq -r .error.message "$TMP/a1.json" | grep -q 'rank 1: .*injected by TPGEN_FAIL_ALLOC' &&
        ok "fail_alloc serve: rank 1's failed prepare step answers 500 with its message" ||
        fail "fail_alloc serve: first request: HTTP $code $(head -c 300 "$TMP/a1.json")"
    code=$(post "$TMP/a2.json")
    jq -r '.data[0].b64_json' "$TMP/a2.json" 2>/dev/null | base64 -d >"$TMP/a2.png" 2>/dev/null
    [ "$code" = 200 ] && cmp -s "$TMP/a2.png" "$TMP/ref2.png" &&
        ok "fail_alloc serve: the next request gets generate's PNG" ||
        fail "fail_alloc serve: second request: HTTP $code"
    stop_server; src=$?
    [ $src -eq 0 ] && ok "fail_alloc serve: stops cleanly afterwards" || fail "fail_alloc serve: stop: rc $src"
fi
export TPGEN_FAIL_ALLOC=0:5:decode
MPIRUN=$MPIX start_server "$TMP/s2.log" "$TPGEN" --backend cpu
unset TPGEN_FAIL_ALLOC
if [ -z "$PORT" ]; then fail "fail_alloc serve (abort): did not become ready: $(tail -3 "$TMP/s2.log")"; else
    t0=$(date +%s.%N)
    code=$(post "$TMP/b1.json")
    wait_exit 20; src=$?
    took=$(echo "$(date +%s.%N) - $t0" | bc)
    [ $src -ne 0 ] && [ $src -ne 124 ] && [ "$code" != 200 ] &&
        grep -q '^tpgen: error: rank 0: out of memory .*, in the middle of the decode phase' "$TMP/s2.log" &&
        ok "fail_alloc serve: a lockstep failure on rank 0 ends the server in $(printf %.1f "$took") s (rc $src, HTTP $code) with the message" ||
        fail "fail_alloc serve (abort): rc $src, HTTP $code, $(grep -m1 error "$TMP/s2.log")"
fi

# the sanitized build: both kinds of failure stay clean (no report, no leak)
ASAN=$TPGEN_ROOT/build-asan/tpgen
if [ ! -x "$ASAN" ]; then skip "fail_alloc asan: $ASAN is missing (make asan)"; skip "fail_alloc asan abort: no asan build"; else
    for c in "1:1:denoise agreed" "1:5:decode abort"; do
        set -- $c
        out=$(TPGEN_FAIL_ALLOC=$1 timeout 120 $MPIX -np 2 "$ASAN" "${TWO[@]}" --output "$TMP/asan.png" 2>&1); rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ ! -e "$TMP/asan.png" ] && echo "$out" | grep -q 'injected by TPGEN_FAIL_ALLOC' &&
            ! echo "$out" | grep -qE 'AddressSanitizer|LeakSanitizer|runtime error'; then
            ok "fail_alloc asan: $1 ($2) fails cleanly under the sanitizers"
        else fail "fail_alloc asan: $1 ($2): rc $rc $(echo "$out" | grep -m3 -E 'Sanitizer|runtime error|error')"; fi
    done
fi
