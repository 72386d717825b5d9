#!/usr/bin/env bash
# Benchmark of `tpgen serve` against a fresh `tpgen generate` per image, side
# by side in one run (not part of the test suite):
#   - time to the first image after the server is started (launch to PNG)
#   - seconds per request with the weights resident (same prompt, new seeds:
#     prompt-cache hits) against seconds per fresh `mpirun tpgen generate`
#   - the prompt cache: a request with a new prompt (encoder loaded, run,
#     freed) against one with a prompt already seen
#
#   scripts/bench-serve.sh MODEL [NP] [SIZE] [STEPS] [REPEATS]
#   e.g. scripts/bench-serve.sh /tmp/k4 2 128 4 3   (after tpgen make-tiny --out /tmp/k4 --widths klein-4b)
set -euo pipefail
MODEL=${1:?usage: bench-serve.sh MODEL [NP] [SIZE] [STEPS] [REPEATS]}
NP=${2:-2} SIZE=${3:-64} STEPS=${4:-2} R=${5:-3}
TPGEN=${TPGEN:-$(dirname "$0")/../build/tpgen}
MPIRUN=${MPIRUN:-mpirun --oversubscribe --allow-run-as-root}
TMP=$(mktemp -d /tmp/bench-serve-XXXXXX)
SRV=
cleanup() { [ -n "$SRV" ] && kill -USR1 "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
req() {   # PROMPT SEED -> seconds
    local t0 t1
    t0=$(now)
    curl -sf -o "$TMP/r.json" "http://127.0.0.1:$PORT/v1/images/generations" \
        -d "{\"prompt\": \"$1\", \"size\": \"${SIZE}x${SIZE}\", \"seed\": $2, \"steps\": $STEPS}"
    t1=$(now)
    calc "$t1 - $t0"; echo
}
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

echo "bench-serve: $MODEL, np $NP, ${SIZE}x${SIZE}, $STEPS steps, $R repeats; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
t_launch=$(now)
$MPIRUN -np "$NP" "$TPGEN" serve --model "$MODEL" --listen 127.0.0.1:0 >"$TMP/serve.log" 2>&1 &
SRV=$!
for _ in $(seq 1 3000); do grep -q "ready after" "$TMP/serve.log" && break; sleep 0.05; done
PORT=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$TMP/serve.log" | head -1)
t_ready=$(now)
req "a red fox in the snow" 1 >/dev/null
t_first=$(now)
printf "time to ready          %8.3f s\n" "$(calc "$t_ready - $t_launch")"
printf "time to first image    %8.3f s (launch to PNG; the first request encodes its prompt)\n" "$(calc "$t_first - $t_launch")"
hits=$(for i in $(seq 1 "$R"); do req "a red fox in the snow" $((i + 1)); done | median)
miss=$(for i in $(seq 1 "$R"); do req "a new prompt number $i" $((i + 1)); done | median)
kill -USR1 "$SRV"; wait "$SRV" || true; SRV=
fresh=$(for i in $(seq 1 "$R"); do
    t0=$(now)
    $MPIRUN -np "$NP" "$TPGEN" --model "$MODEL" --prompt "a red fox in the snow" --seed $((i + 1)) --steps "$STEPS" \
        --width "$SIZE" --height "$SIZE" --output "$TMP/g$i.png" >/dev/null 2>&1
    t1=$(now); calc "$t1 - $t0"; echo
done | median)
printf "resident, cached prompt %8.3f s per request (median of %d)\n" "$hits" "$R"
printf "resident, new prompt    %8.3f s per request (median of %d)\n" "$miss" "$R"
printf "fresh generate          %8.3f s per image (mpirun + load + encode + render, median of %d)\n" "$fresh" "$R"
printf "ratio resident / fresh  %8.3f\n" "$(calc "$hits / $fresh")"
printf "prompt-cache speed-up   %8.3f (new prompt / cached prompt, whole requests)\n" "$(calc "$miss / $hits")"
