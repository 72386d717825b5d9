#!/usr/bin/env bash
# budget: 45 s; checks: 9
# The watchdog (core/dist/watchdog.h) with real ranks: a rank paused for
# less than the bound changes nothing (same PNG); a rank paused for longer
# makes the other rank end the job with a message naming its TP group,
# within the bound, leaving no PNG and no temporary file; a rank killed
# with SIGKILL ends the job within the bound, leaving no PNG and no process.
# Both for a tp 2 job and an --sp 2 job (whose peers wait in the all-to-all
# around attention).
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

# a pause longer than the bound: rank 0 ends the job, naming the group. paused NAME ARGS...: the job of
# args + ARGS (tp 2, or sp 2: rank 0 then waits in the all-to-all around attention)
paused() {
    local name=$1 mp r1 t0 t1 took; shift
    $MPIRUN -np 2 "$TPGEN" "${args[@]}" "$@" --watchdog 4 --output "$TMP/long-$name.png" >"$TMP/long-$name.log" 2>&1 &
    mp=$!; r1=$(rank1 $mp "$TMP/long-$name.log")
    if [ -z "$r1" ]; then fail "watchdog $name: rank 1 not found"; kill $mp 2>/dev/null; wait $mp; return; fi
    t0=$(date +%s.%N)
    kill -STOP "$r1"
    wait_for "$mp" 60
    t1=$(date +%s.%N)
    kill -CONT "$r1" 2>/dev/null; kill -9 "$r1" 2>/dev/null
    took=$(echo "$t1 - $t0" | bc)
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q 'rank 0: no progress in job group 0 (world ranks 0-1) for [0-9]* s while denoising' "$TMP/long-$name.log" &&
       [ "$(echo "$took < 20" | bc)" = 1 ]; then
        ok "watchdog $name: a rank paused past a 4 s bound ends the job in $(printf %.1f "$took") s (rc $rc) with the group named"
    else fail "watchdog $name: long pause: rc $rc after ${took}s: $(grep -m1 'error' "$TMP/long-$name.log")"; fi
    ls "$TMP"/long-$name.png* >/dev/null 2>&1 && fail "watchdog $name: a PNG or temporary file was left" ||
        ok "watchdog $name: no PNG and no temporary file left"
}

# SIGKILL of a rank while denoising: the job ends within the bound (mpirun notices it; the watchdog is the
# bound), non-zero, and leaves no PNG and no process. killed NAME ARGS... as paused
killed() {
    local name=$1 mp r1 t0 took; shift
    $MPIRUN -np 2 "$TPGEN" "${args[@]}" "$@" --watchdog 4 --output "$TMP/kill-$name.png" >"$TMP/kill-$name.log" 2>&1 &
    mp=$!; r1=$(rank1 $mp "$TMP/kill-$name.log")
    if [ -z "$r1" ]; then fail "watchdog $name: rank 1 not found"; kill $mp 2>/dev/null; wait $mp; return; fi
    t0=$(date +%s.%N)
    kill -9 "$r1"
    wait_for "$mp" 20
    took=$(echo "$(date +%s.%N) - $t0" | bc)
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && ! grep -q 'step 40/40' "$TMP/kill-$name.log" &&
        ok "watchdog $name: SIGKILL of rank 1 while denoising ends the job non-zero in $(printf %.1f "$took") s (rc $rc)" ||
        fail "watchdog $name: kill: rc $rc after ${took}s (the last step: $(grep -o 'step [0-9]*/40' "$TMP/kill-$name.log" | tail -1))"
    if pgrep -f "$M" >/dev/null; then fail "watchdog $name: processes left: $(pgrep -af "$M" | head -2)"
    elif ls "$TMP"/kill-$name.png* >/dev/null 2>&1; then fail "watchdog $name: a PNG or temporary file was left after the kill"
    else ok "watchdog $name: no process, no PNG and no temporary file left after the kill"; fi
}

paused tp --tp 2
killed tp --tp 2
# the same in a sequence-parallel job (--sp 2): the peer of the dead or stopped rank blocks in an all-to-all
paused sp --sp 2 --tp 1
killed sp --sp 2 --tp 1
