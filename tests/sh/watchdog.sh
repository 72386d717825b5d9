#!/usr/bin/env bash
# budget: 40 s; checks: 5
# The watchdog (core/dist/watchdog.h) with real ranks: a rank paused for
# less than the bound changes nothing (same PNG); a rank paused for longer
# makes the other rank end the job with a message naming its TP group,
# within the bound, leaving no PNG and no temporary file; a rank killed
# with SIGKILL ends the job within the bound.
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/m
"$TPGEN" make-tiny --out "$M" --seed 1 >/dev/null 2>&1 || fail "watchdog: make-tiny"
args=(--model "$M" --prompt "a fox" --seed 3 --width 256 --height 256 --steps 40 --backend cpu)

# the pid of rank 1 of the run $1 (mpirun's pid) once its log $2 reports step 3
rank1() {
    local mp=$1 log=$2 i p
    for i in $(seq 1 600); do
        grep -q 'step 3/40' "$log" 2>/dev/null && break
        kill -0 "$mp" 2>/dev/null || break
        sleep 0.1
    done
    for p in $(pgrep -P "$mp"); do
        tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && echo "$p"
    done
}
# wait for our child $1 at most $2 seconds; sets rc to its exit status (124: still running)
wait_for() {
    local i
    rc=124
    for i in $(seq 1 $(($2 * 10))); do
        if ! kill -0 "$1" 2>/dev/null; then wait "$1"; rc=$?; return; fi
        sleep 0.1
    done
}

$MPIRUN -np 2 "$TPGEN" "${args[@]}" --output "$TMP/ref.png" >/dev/null 2>&1 || fail "watchdog: reference run"

# a pause shorter than the bound: the run finishes, the same image
$MPIRUN -np 2 "$TPGEN" "${args[@]}" --watchdog 10 --output "$TMP/short.png" >"$TMP/short.log" 2>&1 &
mp=$!; r1=$(rank1 $mp "$TMP/short.log")
if [ -z "$r1" ]; then fail "watchdog: rank 1 not found (log: $(tail -2 "$TMP/short.log"))"; else
    kill -STOP "$r1"; sleep 3; kill -CONT "$r1"
    wait_for "$mp" 120
    [ "$rc" = 0 ] && cmp -s "$TMP/short.png" "$TMP/ref.png" && ok "watchdog: a rank paused 3 s under a 10 s bound: same PNG, exit 0" ||
        fail "watchdog: short pause: rc $rc, $(tail -2 "$TMP/short.log")"
fi

# a pause longer than the bound: rank 0 ends the job, naming the group
$MPIRUN -np 2 "$TPGEN" "${args[@]}" --watchdog 4 --output "$TMP/long.png" >"$TMP/long.log" 2>&1 &
mp=$!; r1=$(rank1 $mp "$TMP/long.log")
if [ -z "$r1" ]; then fail "watchdog: rank 1 not found"; else
    t0=$(date +%s.%N)
    kill -STOP "$r1"
    wait_for "$mp" 60
    t1=$(date +%s.%N)
    kill -CONT "$r1" 2>/dev/null; kill -9 "$r1" 2>/dev/null
    took=$(echo "$t1 - $t0" | bc)
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q 'rank 0: no progress in tensor-parallel group 0 (world ranks 0-1) for [0-9]* s while denoising' "$TMP/long.log" &&
       [ "$(echo "$took < 20" | bc)" = 1 ]; then
        ok "watchdog: a rank paused past a 4 s bound ends the job in $(printf %.1f "$took") s (rc $rc) with the group named"
    else fail "watchdog: long pause: rc $rc after ${took}s: $(grep -m1 'error' "$TMP/long.log")"; fi
    ls "$TMP"/long.png* >/dev/null 2>&1 && fail "watchdog: a PNG or temporary file was left" || ok "watchdog: no PNG and no temporary file left"
fi

# SIGKILL of a rank: the job ends (mpirun notices it; the watchdog is the bound)
$MPIRUN -np 2 "$TPGEN" "${args[@]}" --watchdog 4 --output "$TMP/kill.png" >"$TMP/kill.log" 2>&1 &
mp=$!; r1=$(rank1 $mp "$TMP/kill.log")
if [ -z "$r1" ]; then fail "watchdog: rank 1 not found"; else
    kill -9 "$r1"
    wait_for "$mp" 20
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && ok "watchdog: SIGKILL of rank 1 ends the job non-zero (rc $rc)" || fail "watchdog: kill: rc $rc"
    pgrep -f "$M" >/dev/null && fail "watchdog: processes left: $(pgrep -af "$M" | head -2)" || ok "watchdog: no process left after the kill"
fi
