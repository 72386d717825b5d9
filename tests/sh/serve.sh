#!/usr/bin/env bash
# budget: 160 s; checks: 87
# `tpgen serve` end to end on a make-tiny model at tp 2: the official
# openai client and curl get PNGs byte-identical to `tpgen generate` (also
# with "rng": "torch1"; "initial_latents" refused); a
# bounded load test from concurrent clients; a full queue answers 429; bad
# requests one by one (also under the sanitizers); edits with reference
# images (multipart, byte-identical to generate --image); API keys; the graceful
# stop (SIGTERM mid-job: the job finishes, the queued one gets 503, exit 0)
# and a killed rank (the server exits non-zero within seconds).
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/tiny
$TPGEN make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "make-tiny"
CLIENT=$TPGEN_ROOT/tests/serve_client.py

# the official client, from PyPI, in a venv kept in build/ (tests/lib.sh)
venv_with serve openai openai

. "$TPGEN_ROOT/tests/lib_serve.sh"   # start_server, wait_exit, stop_server

# the references: generate with the same settings (one run, a PNG per seed)
printf 'prompts: ["a fox"]\nseeds: {from: 100, count: 20}\nwidth: 64\nheight: 64\nsteps: 2\noutput: %s/ref-{seed}.png\n' "$TMP" >"$TMP/ref.yaml"
out=$($MPIRUN -np 2 $TPGEN --model "$M" --spec "$TMP/ref.yaml" 2>&1) || fail "generate the references: $(echo "$out" | tail -3)"
$MPIRUN -np 2 $TPGEN --model "$M" --prompt "a fox" --width 64 --height 64 --seed 7 --steps 2 --output "$TMP/gen7.png" >/dev/null 2>&1 ||
    fail "generate the seed-7 reference"

if ! start_server "$TMP/s1.log" "$TPGEN" --queue 32; then
    fail "serve: did not become ready: $(tail -5 "$TMP/s1.log")"
else
    ok "serve: ready on port $PORT (tp 2)"
    h=$(curl -s "http://127.0.0.1:$PORT/health")
    [ "$h" = '{"status":"ready"}' ] && ok "GET /health: ready" || fail "GET /health: $h"
    curl -s "http://127.0.0.1:$PORT/v1/models" | jq -e '.data[0].id == "tiny"' >/dev/null &&
        ok "GET /v1/models lists the model" || fail "GET /v1/models"

    # the official openai client
    out=$("$PY" "$CLIENT" openai "$PORT" "$TMP/oa.png" "a fox" 7 2 64x64 2>&1)
    if cmp -s "$TMP/oa.png" "$TMP/gen7.png"; then ok "openai client: images.generate PNG byte-identical to tpgen generate"
    else fail "openai client: PNG differs from generate's: $(echo "$out" | tail -3)"; fi
    # curl
    curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' \
        -d '{"prompt": "a fox", "size": "64x64", "seed": 7, "steps": 2, "response_format": "b64_json"}' |
        jq -r '.data[0].b64_json' | base64 -d >"$TMP/curl.png"
    cmp -s "$TMP/curl.png" "$TMP/gen7.png" && ok "curl: PNG byte-identical to tpgen generate" ||
        fail "curl: PNG differs from generate's"
    # "rng": "torch1": torch 1.13's draw, byte-identical to generate --rng torch1, recorded in the PNG
    $MPIRUN -np 2 $TPGEN --model "$M" --prompt "a fox" --width 64 --height 64 --seed 7 --steps 2 --rng torch1 \
        --output "$TMP/gen7t1.png" >/dev/null 2>&1 || fail "generate --rng torch1"
    curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' \
        -d '{"prompt": "a fox", "size": "64x64", "seed": 7, "steps": 2, "rng": "torch1"}' |
        jq -r '.data[0].b64_json' | base64 -d >"$TMP/curl-t1.png"
    cmp -s "$TMP/curl-t1.png" "$TMP/gen7t1.png" && grep -aq "rng: torch1" "$TMP/curl-t1.png" &&
        ! cmp -s "$TMP/curl-t1.png" "$TMP/gen7.png" &&
        ok "rng torch1: PNG byte-identical to generate --rng torch1, recorded, and not the default draw's" ||
        fail "rng torch1: the request's PNG differs from generate --rng torch1's (or equals the default's)"
    r=$(curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' \
        -d '{"prompt": "a fox", "initial_latents": "/etc/passwd"}')
    echo "$r" | jq -e '.error.param == "initial_latents"' >/dev/null && echo "$r" | grep -q "never reads a file" &&
        ok "initial_latents from a client: 400, a server never reads a file a client names" ||
        fail "initial_latents from a client: $r"
    # n = 2 gives seeds 100 and 101
    curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' \
        -d '{"prompt": "a fox", "size": "64x64", "seed": 100, "steps": 2, "n": 2}' >"$TMP/n2.json"
    jq -r '.data[1].b64_json' "$TMP/n2.json" | base64 -d >"$TMP/n2b.png"
    [ "$(jq '.data | length' "$TMP/n2.json")" = 2 ] && cmp -s "$TMP/n2b.png" "$TMP/ref-101.png" &&
        ok "n = 2: two images, the second with seed + 1" || fail "n = 2: $(head -c 200 "$TMP/n2.json")"
    # a request without a seed gets one, recorded in the PNG
    curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -d '{"prompt": "a fox", "size": "64x64", "steps": 1}' |
        jq -r '.data[0].b64_json' | base64 -d >"$TMP/noseed.png"
    grep -aq "seed: [0-9]" "$TMP/noseed.png" && ok "no seed: a random one, recorded in the PNG parameters" ||
        fail "no seed: no seed in the PNG parameters"

    # edits: multipart references, byte-identical to generate --image (same file names: the PNG parameters name them)
    cp "$TMP/ref-100.png" "$TMP/fox.png"; cp "$TMP/ref-101.png" "$TMP/cat.png"
    (cd "$TMP" && $MPIRUN -np 2 $TPGEN --model "$M" --prompt "the fox in the snow" --image fox.png --image cat.png \
        --seed 5 --steps 2 --output "$TMP/edit-gen.png" >/dev/null 2>&1) || fail "generate --image (edit reference)"
    out=$("$PY" "$CLIENT" openai-edit "$PORT" "$TMP/edit-oa.png" "the fox in the snow" 5 2 "$TMP/fox.png" "$TMP/cat.png" 2>&1)
    cmp -s "$TMP/edit-oa.png" "$TMP/edit-gen.png" &&
        ok "edits: openai client images.edit with 2 references, byte-identical to generate --image" ||
        fail "edits (openai client): $(echo "$out" | tail -2)"
    curl -s -F prompt="the fox in the snow" -F seed=5 -F steps=2 -F "image[]=@$TMP/fox.png" -F "image[]=@$TMP/cat.png" \
        "http://127.0.0.1:$PORT/v1/images/edits" | jq -r '.data[0].b64_json' | base64 -d >"$TMP/edit-curl.png"
    cmp -s "$TMP/edit-curl.png" "$TMP/edit-gen.png" && ok "edits: curl -F, byte-identical to generate --image" ||
        fail "edits (curl): PNG differs"
    # bad edits
    printf 'not an image' >"$TMP/text.png"
    head -c 300 "$TMP/fox.png" >"$TMP/trunc.png"
    edit_bad() {   # NAME STATUS PATTERN CURL-ARGS...
        local name=$1 want=$2 pat=$3; shift 3
        local st body
        st=$(curl -s -o "$TMP/eb.json" -w '%{http_code}' "$@" "http://127.0.0.1:$PORT/v1/images/edits")
        body=$(cat "$TMP/eb.json")
        if [ "$st" = "$want" ] && echo "$body" | jq -e '.error.message' >/dev/null 2>&1 && echo "$body" | grep -qE -- "$pat" &&
            [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ]; then
            ok "bad edit: $name -> $want"
        else fail "bad edit: $name: status $st: $body"; fi
    }
    edit_bad "no image" 400 "at least one reference image" -F prompt=x
    edit_bad "not an image" 400 "text.png: not a PNG or JPEG" -F prompt=x -F "image=@$TMP/text.png"
    edit_bad "truncated PNG" 400 "trunc.png: cannot decode" -F prompt=x -F "image=@$TMP/trunc.png"
    edit_bad "a mask" 400 "masks are not supported" -F prompt=x -F "image=@$TMP/fox.png" -F "mask=@$TMP/fox.png"
    edit_bad "a JSON body" 400 "multipart/form-data" -H 'Content-Type: application/json' -d '{"prompt": "x"}'
    edit_bad "unknown field" 400 "unknown field 'strength'" -F prompt=x -F strength=0.5 -F "image=@$TMP/fox.png"
    edit_bad "steps not a number" 400 "'steps' must be an integer" -F prompt=x -F steps=two -F "image=@$TMP/fox.png"
    eleven=(); for i in $(seq 1 11); do eleven+=(-F "image[]=@$TMP/fox.png"); done
    edit_bad "11 references" 400 "at most 10" -F prompt=x "${eleven[@]}"
    "$PY" "$CLIENT" load "$PORT" "$TMP" 4 5 100
    "$PY" "$CLIENT" bad "$PORT"
    # the prompt cache: "a fox" was encoded once
    curl -s "http://127.0.0.1:$PORT/metrics" >"$TMP/metrics.txt"
    hits=$(sed -n 's/^tpgen_prompt_cache_lookups_total{result="hit"} //p' "$TMP/metrics.txt")
    okn=$(sed -n 's/^tpgen_images_total //p' "$TMP/metrics.txt")
    [ "${hits:-0}" -ge 20 ] && [ "${okn:-0}" -ge 24 ] && grep -q '^tpgen_resident_bytes{rank="1"} [1-9]' "$TMP/metrics.txt" &&
        ok "GET /metrics: $okn images, $hits prompt-cache hits, resident bytes per rank" ||
        fail "GET /metrics: hits '$hits', images '$okn': $(head -c 300 "$TMP/metrics.txt")"
    stop_server; rc=$?
    [ $rc -eq 0 ] && grep -q "serve: stopped" "$TMP/s1.log" && ok "SIGUSR1 to mpirun: graceful stop, exit 0" ||
        fail "graceful stop via mpirun: rc $rc: $(tail -3 "$TMP/s1.log")"
fi

# dp 2 (4 ranks, tp 2) with the text encoder resident: the TP groups take
# jobs as they come; every answer is still generate's image for its seed
if NP=4 start_server "$TMP/s6.log" "$TPGEN" --tp 2 --keep-text-encoder; then
    "$PY" "$CLIENT" load "$PORT" "$TMP" 3 4 100 | sed 's/^\(ok\|FAIL\) - load:/\1 - tp 2 x dp 2, --keep-text-encoder, load:/'
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -q '^tpgen_resident_bytes{rank="3"} [1-9]' &&
        ok "tp 2 x dp 2: resident bytes reported for all 4 ranks" || fail "tp 2 x dp 2: no resident bytes for rank 3"
    stop_server; rc=$?
    [ $rc -eq 0 ] && ok "tp 2 x dp 2: graceful stop, exit 0" || fail "tp 2 x dp 2: stop rc $rc: $(tail -3 "$TMP/s6.log")"
else fail "serve tp 2 x dp 2: not ready: $(tail -3 "$TMP/s6.log")"; fi

# the text encoder, loaded for one request, also encodes the prompts waiting in the queue
if start_server "$TMP/s8.log" "$TPGEN"; then
    gen=(-X POST "http://127.0.0.1:$PORT/v1/images/generations")
    curl -s -o /dev/null "${gen[@]}" -d '{"prompt": "a slow fox", "size": "512x512", "seed": 1, "steps": 30}' &
    ca=$!
    sleep 1
    curl -s -o "$TMP/pb.json" "${gen[@]}" -d '{"prompt": "prompt b", "size": "64x64", "seed": 3, "steps": 2}' &
    cb=$!
    sleep 0.3
    curl -s -o "$TMP/pc.json" "${gen[@]}" -d '{"prompt": "prompt c", "size": "64x64", "seed": 3, "steps": 2}' &
    cc=$!
    wait $ca $cb $cc
    curl -s "http://127.0.0.1:$PORT/metrics" >"$TMP/m8.txt"
    jq -r '.data[0].b64_json' "$TMP/pc.json" | base64 -d >"$TMP/pc.png"
    $MPIRUN -np 2 $TPGEN --model "$M" --prompt "prompt c" --width 64 --height 64 --seed 3 --steps 2 --output "$TMP/pc-gen.png" >/dev/null 2>&1
    # 1 hit and 2 misses when b arrives after a's prompt was encoded, 2 hits and 1 miss when the machine is
    # so busy that b and c both wait for a's encoding; without the prefetch, 3 misses
    hits=$(sed -n 's/^tpgen_prompt_cache_lookups_total{result="hit"} \([0-9]*\)$/\1/p' "$TMP/m8.txt")
    misses=$(sed -n 's/^tpgen_prompt_cache_lookups_total{result="miss"} \([0-9]*\)$/\1/p' "$TMP/m8.txt")
    [ "${hits:-0}" -ge 1 ] && [ "${misses:-0}" -ge 1 ] && [ $((hits + misses)) -eq 3 ] && cmp -s "$TMP/pc.png" "$TMP/pc-gen.png" &&
        ok "a waiting request's prompt is encoded with the one before it ($hits hits, $misses misses of 3), image byte-identical" ||
        fail "prefetch of queued prompts: $(grep prompt_cache_lookups "$TMP/m8.txt" | tr '\n' ' ')"
    stop_server >/dev/null
else fail "serve (prefetch test): not ready: $(tail -3 "$TMP/s8.log")"; fi

# generate's model options are the server's start-up options: --quantize fp8
if start_server "$TMP/s7.log" "$TPGEN" --quantize fp8; then
    $MPIRUN -np 2 $TPGEN --model "$M" --quantize fp8 --prompt "a fox" --width 64 --height 64 --seed 7 --steps 2 \
        --output "$TMP/gen7-fp8.png" >/dev/null 2>&1 || fail "generate --quantize fp8"
    curl -s "http://127.0.0.1:$PORT/v1/images/generations" -d '{"prompt": "a fox", "size": "64x64", "seed": 7, "steps": 2}' |
        jq -r '.data[0].b64_json' | base64 -d >"$TMP/fp8.png"
    cmp -s "$TMP/fp8.png" "$TMP/gen7-fp8.png" && grep -aq "fp8 weights" "$TMP/fp8.png" &&
        ok "serve --quantize fp8: PNG byte-identical to generate --quantize fp8" || fail "serve --quantize fp8: PNG differs"
    stop_server >/dev/null
else fail "serve --quantize fp8: not ready: $(tail -3 "$TMP/s7.log")"; fi

# a full queue: 429
if start_server "$TMP/s2.log" "$TPGEN" --queue 1 --max-upload-mb 0.01; then
    "$PY" "$CLIENT" flood "$PORT" 6
    head -c 20000 /dev/urandom >"$TMP/big.bin"
    st=$(curl -s -o "$TMP/413.json" -w '%{http_code}' -F prompt=x -F "image=@$TMP/big.bin" "http://127.0.0.1:$PORT/v1/images/edits")
    [ "$st" = 413 ] && grep -q "limit" "$TMP/413.json" && ok "edits over --max-upload-mb: 413" || fail "edit upload limit: $st $(cat "$TMP/413.json")"
    stop_server >/dev/null
else fail "serve --queue 1: not ready: $(tail -3 "$TMP/s2.log")"; fi

# an API key
echo "s3cret-token" >"$TMP/key"; chmod 600 "$TMP/key"
if start_server "$TMP/s3.log" "$TPGEN" --api-key-file "$TMP/key"; then
    st=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/v1/images/generations" -d '{"prompt": "a"}')
    st2=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong-token!' "http://127.0.0.1:$PORT/v1/models")
    st3=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")
    [ "$st" = 401 ] && [ "$st2" = 401 ] && [ "$st3" = 200 ] && ok "--api-key-file: 401 without or with a wrong token, /health open" ||
        fail "--api-key-file: $st $st2 $st3"
    out=$("$PY" "$CLIENT" openai "$PORT" "$TMP/key.png" "a fox" 7 2 64x64 s3cret-token 2>&1)
    cmp -s "$TMP/key.png" "$TMP/gen7.png" && ok "--api-key-file: the openai client with the key gets the image" ||
        fail "--api-key-file with the key: $(echo "$out" | tail -2)"
    stop_server >/dev/null
else fail "serve --api-key-file: not ready: $(tail -3 "$TMP/s3.log")"; fi

# SIGTERM mid-job: the running job finishes (200), the queued one gets 503, every rank exits 0
if start_server "$TMP/s4.log" "$TPGEN"; then
    slow='{"prompt": "a slow fox", "size": "512x512", "seed": 1, "steps": 30}'
    curl -s -o "$TMP/j1.json" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/v1/images/generations" -d "$slow" >"$TMP/j1.code" &
    c1=$!
    sleep 1
    curl -s -o "$TMP/j2.json" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/v1/images/generations" -d "$slow" >"$TMP/j2.code" &
    c2=$!
    for _ in $(seq 1 100); do   # the second job waits in the queue
        curl -s "http://127.0.0.1:$PORT/metrics" | grep -q '^tpgen_queue_depth 1' && break
        sleep 0.1
    done
    kill -TERM "$R0"
    wait $c1 $c2
    wait_exit 60; rc=$?
    [ "$(cat "$TMP/j1.code")" = 200 ] && [ "$(cat "$TMP/j2.code")" = 503 ] && [ $rc -eq 0 ] &&
        ok "SIGTERM mid-job: running job answered 200, queued one 503, exit 0 on every rank" ||
        fail "SIGTERM mid-job: job1 $(cat "$TMP/j1.code"), job2 $(cat "$TMP/j2.code"), rc $rc: $(tail -3 "$TMP/s4.log")"
else fail "serve (SIGTERM test): not ready: $(tail -3 "$TMP/s4.log")"; fi

# a rank dies: the server exits non-zero within seconds
if start_server "$TMP/s5.log" "$TPGEN"; then
    r1=$(pgrep -f "tpgen serve --model $M" | grep -v "^$R0\$" | while read -r p; do
        [ "$(cat /proc/$p/comm 2>/dev/null)" = tpgen ] && echo "$p"; done | head -1)
    t0=$(date +%s)
    kill -9 "$r1"
    wait_exit 30; rc=$?
    dt=$(( $(date +%s) - t0 ))
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && ok "a killed rank: the server exits non-zero (rc $rc) after ${dt} s" ||
        fail "a killed rank: rc $rc after ${dt} s"
    pgrep -f "tpgen serve --model $M" >/dev/null && { fail "a killed rank: processes left"; pkill -9 -f "tpgen serve --model $M"; } ||
        ok "a killed rank: no process left"
else fail "serve (killed rank test): not ready: $(tail -3 "$TMP/s5.log")"; fi

# start-up errors: clear, non-zero, no hang
expect_fail "serve: generate's --prompt refused" "is an option of generate" $MPIRUN -np 2 $TPGEN serve --model "$M" --prompt x
expect_fail "serve: --initial-latents refused at start" "--initial-latents is an option of generate" $MPIRUN -np 2 $TPGEN serve --model "$M" --initial-latents /etc/passwd
expect_fail "serve: no --model" "--model DIR is required" $MPIRUN -np 2 $TPGEN serve
expect_fail "serve: bad --listen" "listen|address" $MPIRUN -np 2 $TPGEN serve --model "$M" --listen nowhere:99999
expect_fail "serve: bad --queue" "--queue" $MPIRUN -np 2 $TPGEN serve --model "$M" --queue 0

# the bad requests under the sanitizers
ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1   # ASAN_OPTIONS and LSAN_OPTIONS (leaks on) come from tests/run.sh
    if start_server "$TMP/sa.log" "$ASAN/tpgen"; then
        "$PY" "$CLIENT" bad "$PORT" | sed 's/^\(ok\|FAIL\) - /\1 - asan: /'
        stop_server; rc=$?
        ! grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$TMP/sa.log" && [ $rc -eq 0 ] &&
            ok "asan: bad requests leave no sanitizer report, clean exit" ||
            fail "asan: rc $rc: $(grep -E -A3 'AddressSanitizer|LeakSanitizer|runtime error' "$TMP/sa.log" | head -5)"
    else fail "asan serve: not ready: $(tail -5 "$TMP/sa.log")"; fi
else
    fail "sanitizer runs: build-asan/ not found (make test builds it; or run 'make asan')"
fi
