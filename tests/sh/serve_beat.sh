#!/usr/bin/env bash
# budget: 80 s; checks: 12
# The heartbeat of idle `tpgen serve` ranks (cli/serve_ranks.h) with real
# ranks on the make-tiny model, --watchdog 10 (the idle bound: 10 s):
#   (a) an idle rank paused (SIGSTOP) for 20 s, at tp 2 and in the second
#       TP group of tp 2 x dp 2: world rank 0 ends the server within the
#       bound + 10 s, naming the rank; the port no longer accepts;
#   (b) paused 4 s only: the server stays, a request afterwards is 200;
#   (c) world rank 0 paused while idle: the other ranks end the job;
#   (d) tp 2 x dp 2 under --watchdog 6, group 0 renders a job longer than
#       the bound while group 1 is idle: no false alarm, every request 200;
#   (e) SIGTERM afterwards still stops every rank with exit 0.
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/m
"$TPGEN" make-tiny --out "$M" --seed 1 >/dev/null 2>&1 || fail "serve_beat: make-tiny"
. "$TPGEN_ROOT/tests/lib_serve.sh"   # start_server, wait_exit, stop_server
export OMP_NUM_THREADS=1

# the pid of world rank $1 of the server (a child of mpirun $SRV)
rank_pid() {
    local p
    for p in $(pgrep -P "$SRV"); do
        tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
    done
}
now() { date +%s.%N; }
since() { printf %.1f "$(echo "$(now) - $1" | bc)"; }
lt() { [ "$(echo "$1 < $2" | bc)" = 1 ]; }
gen() {   # gen JSON: the HTTP status of an images request
    curl -s -o "$TMP/gen.json" -w '%{http_code}' -m 120 "http://127.0.0.1:$PORT/v1/images/generations" -d "$1"
}
refused() { ! curl -s -o /dev/null -m 5 "http://127.0.0.1:$PORT/health"; }   # nothing listens on the port

# (a) SIGSTOP of an idle rank for 20 s: world rank 0 ends the server
# stop_case NAME NP RANK ARGS...: pause world rank RANK of an NP-rank server
stop_case() {
    local name=$1 np=$2 rank=$3 log=$TMP/$1.log; shift 3
    if ! NP=$np start_server "$log" "$TPGEN" --watchdog 10 "$@"; then fail "serve_beat $name: not ready: $(tail -3 "$log")"; return; fi
    sleep 2
    local r t0 took rc
    r=$(rank_pid "$rank")
    [ -n "$r" ] || { fail "serve_beat $name: world rank $rank not found"; kill -9 $SRV; return; }
    t0=$(now); kill -STOP "$r"
    wait_exit 40; rc=$?
    took=$(since "$t0")
    kill -CONT "$r" 2>/dev/null
    if [ $rc != 0 ] && [ $rc != 124 ] && lt "$took" 20 &&
       grep -q "rank 0: no heartbeat from world rank $rank (node [^)]*) for 1[0-9] s while serving idle" "$log"; then
        ok "serve_beat $name: world rank $rank paused while idle: the server ends ${took} s later (bound 10 s), rc $rc, the rank named"
    else
        fail "serve_beat $name: rc $rc after ${took} s: $(grep -m1 error "$log")"
    fi
    refused && ok "serve_beat $name: the port no longer accepts" || fail "serve_beat $name: port $PORT still answers"
    pgrep -f "tpgen serve --model $M" >/dev/null && fail "serve_beat $name: processes left" || ok "serve_beat $name: no process left"
}
stop_case tp2 2 1
stop_case dp2 4 3 --tp 2

# (b) a 4 s pause: nothing happens, the next request is answered; (e) then SIGTERM: exit 0
if NP=2 start_server "$TMP/short.log" "$TPGEN" --watchdog 10; then
    sleep 2
    r=$(rank_pid 1)
    kill -STOP "$r"; sleep 4; kill -CONT "$r"
    sleep 3
    st=$(gen '{"prompt": "a fox", "size": "64x64", "seed": 1, "steps": 2}')
    kill -0 $SRV 2>/dev/null && [ "$st" = 200 ] && ! grep -q "no heartbeat" "$TMP/short.log" &&
        ok "serve_beat: world rank 1 paused 4 s under a 10 s bound: the server stays, the next request 200" ||
        fail "serve_beat: short pause: HTTP $st, $(grep -m1 error "$TMP/short.log")"
    kill -TERM "$R0"
    wait_exit 30; rc=$?
    [ $rc = 0 ] && grep -q "serve: stopped" "$TMP/short.log" && ok "serve_beat: SIGTERM after the pause: every rank exits 0" ||
        fail "serve_beat: SIGTERM: rc $rc, $(tail -2 "$TMP/short.log")"
else fail "serve_beat short: not ready: $(tail -3 "$TMP/short.log")"; fi

# (c) world rank 0 paused while idle: rank 1 ends the job (then mpirun the rest)
if NP=2 start_server "$TMP/r0.log" "$TPGEN" --watchdog 10; then
    sleep 2
    t0=$(now); kill -STOP "$R0"
    wait_exit 40; rc=$?
    took=$(since "$t0")
    kill -CONT "$R0" 2>/dev/null
    [ $rc != 0 ] && [ $rc != 124 ] && lt "$took" 20 &&
        grep -q "rank 1: no heartbeat from world rank 0 (node [^)]*) for 1[0-9] s while serving idle" "$TMP/r0.log" &&
        ok "serve_beat: world rank 0 paused while idle: rank 1 ends the job ${took} s later, rc $rc" ||
        fail "serve_beat: rank 0 paused: rc $rc after ${took} s: $(grep -m1 error "$TMP/r0.log")"
    pgrep -f "tpgen serve --model $M" >/dev/null && fail "serve_beat: rank 0 paused: processes left" ||
        ok "serve_beat: rank 0 paused: no process left"
else fail "serve_beat r0: not ready: $(tail -3 "$TMP/r0.log")"; fi

# (d) tp 2 x dp 2: world rank 0's group renders a job for longer than the
# bound (each step far shorter) while group 1 is idle: no false alarm on
# either side. The group of a job is read from the ranks' CPU time
# (/proc/PID/stat): a long job L1 first; if group 0 took it, a short one
# goes to group 1, which is then idle for the rest of L1; if group 1 took
# it, a longer L2 goes to group 0 (group 1 is busy), which renders it on
# after group 1 went idle.
cpu_s() { awk '{printf "%.2f", ($14 + $15) / 100}' /proc/$1/stat 2>/dev/null; }
post() {   # post NAME JSON: in the background; NAME.code, NAME.end (when answered)
    (curl -s -o "$TMP/$1.json" -w '%{http_code}' -m 600 "http://127.0.0.1:$PORT/v1/images/generations" -d "$2" >"$TMP/$1.code"
     now >"$TMP/$1.end") &
    POSTS+=($!)
}
if NP=4 start_server "$TMP/busy.log" "$TPGEN" --watchdog 6 --tp 2 --max-steps 10000; then
    sleep 2
    # the long jobs' steps from this machine's speed now (a 10- and a 40-step job timed: the difference is 30
    # steps without the request's fixed costs): L1 ~14 s, L2 ~28 s, both past the 6 s bound with room
    timed() {
        local t0; t0=$(now)
        curl -s -o /dev/null -m 120 "http://127.0.0.1:$PORT/v1/images/generations" \
            -d "{\"prompt\": \"a timing fox\", \"size\": \"128x128\", \"seed\": 4, \"steps\": $1}"
        echo "$(now) - $t0" | bc -l
    }
    ta=$(timed 10) tb=$(timed 40)
    per=$(echo "($tb - $ta) / 30" | bc -l)
    lt "$per" 0.001 && per=0.001
    n1=$(echo "14 / $per" | bc) n2=$(echo "28 / $per" | bc)
    [ "$n1" -lt 30 ] && n1=30; [ "$n1" -gt 4000 ] && n1=4000
    [ "$n2" -lt 60 ] && n2=60; [ "$n2" -gt 8000 ] && n2=8000
    POSTS=()
    r2=$(rank_pid 2)
    a0=$(cpu_s "$R0") a2=$(cpu_s "$r2")
    post l1 "{\"prompt\": \"a long fox\", \"size\": \"128x128\", \"seed\": 2, \"steps\": $n1}"
    sleep 2
    d0=$(echo "$(cpu_s "$R0") - $a0" | bc) d2=$(echo "$(cpu_s "$r2") - $a2" | bc)
    if lt "$d2" "$d0"; then
        path="L1 on group 0 (CPU +$d0 s on rank 0, +$d2 s on rank 2), a short job on group 1"
        post s2 '{"prompt": "a short fox", "size": "64x64", "seed": 1, "steps": 2}'
        busy=l1 other=s2
    else
        path="L1 on group 1 (CPU +$d2 s on rank 2, +$d0 s on rank 0), a longer L2 on group 0"
        post s2 "{\"prompt\": \"a longer fox\", \"size\": \"128x128\", \"seed\": 3, \"steps\": $n2}"
        busy=s2 other=l1
    fi
    wait "${POSTS[@]}"
    idle=$(echo "$(cat "$TMP/$busy.end") - $(cat "$TMP/$other.end")" | bc)   # group 1 idle, group 0 rendering
    if [ "$(cat "$TMP/l1.code")" = 200 ] && [ "$(cat "$TMP/s2.code")" = 200 ] && kill -0 $SRV 2>/dev/null &&
       ! grep -q "no heartbeat\|no progress" "$TMP/busy.log" && lt 8 "$idle"; then
        ok "serve_beat: dp 2: $path ($n1 / $n2 steps, $(printf %.4f "$per") s each by the timing jobs); group 0 rendered on for $(printf %.1f "$idle") s with group 1 idle: no false alarm, both 200"
    else
        fail "serve_beat: dp 2 busy: $path: codes $(cat "$TMP/l1.code") $(cat "$TMP/s2.code"), idle overlap ${idle} s: $(grep -m1 error "$TMP/busy.log")"
    fi
    kill -TERM "$R0"
    wait_exit 30; rc=$?
    [ $rc = 0 ] && grep -q "serve: stopped" "$TMP/busy.log" && ok "serve_beat: dp 2: SIGTERM stops every rank, exit 0" ||
        fail "serve_beat: dp 2 SIGTERM: rc $rc, $(tail -2 "$TMP/busy.log")"
else fail "serve_beat busy: not ready: $(tail -3 "$TMP/busy.log")"; fi
