#!/usr/bin/env bash
# budget: 160 s; checks: 40
# Streamed answers of `tpgen serve` (server-sent events, docs/serve.md) on a
# make-tiny model at tp 2, through the official openai client: 0, 1 and 3
# partial images and n = 2 (order, indices, sizes, completed image
# byte-identical to the unstreamed answer), a streamed edit, an error after
# the stream started, a client that hangs up mid-stream (its render is
# cancelled), a stream under an API key, two streams at dp 2, the
# Content-Type on the wire, and the same streams under the sanitizers.
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/tiny
$TPGEN make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "make-tiny"
CLIENT=$TPGEN_ROOT/tests/serve_stream.py

# the official client, from PyPI, in a venv kept in build/ (tests/lib.sh)
venv_with serve openai openai

. "$TPGEN_ROOT/tests/lib_serve.sh"   # start_server, wait_exit, stop_server

if start_server "$TMP/s1.log" "$TPGEN"; then
    ok "serve: ready on port $PORT (tp 2)"
    mkdir -p "$TMP/p"
    "$PY" "$CLIENT" generate "$PORT" 4 "$TMP/p" 2>&1 | grep -E '^(ok|FAIL) - ' || fail "stream client: no result"
    # the partials (after steps 1, 2, 3 of 4) are generate --preview-every 1's previews, byte for byte
    mkdir -p "$TMP/c"
    $MPIRUN -np 2 $TPGEN --model "$M" --prompt "a fox" --width 64 --height 64 --seed 7 --steps 4 --preview-every 1 \
        --preview "$TMP/c/{step}.png" --output "$TMP/c/img.png" >/dev/null 2>&1 || fail "generate --preview-every 1"
    cmp -s "$TMP/p/partial-3-0.png" "$TMP/c/1.png" && cmp -s "$TMP/p/partial-3-1.png" "$TMP/c/2.png" &&
        cmp -s "$TMP/p/partial-3-2.png" "$TMP/c/3.png" && ! cmp -s "$TMP/c/2.png" "$TMP/c/3.png" &&
        ok "the 3 partials are byte-identical to generate --preview-every 1's previews after steps 1, 2, 3" ||
        fail "the partials differ from generate's previews"
    # the wire: text/event-stream, event and data lines
    curl -sN -D "$TMP/h.txt" -o "$TMP/sse.txt" "http://127.0.0.1:$PORT/v1/images/generations" \
        -d '{"prompt": "a fox", "size": "64x64", "seed": 7, "steps": 4, "stream": true, "partial_images": 1}'
    grep -qi '^content-type: text/event-stream' "$TMP/h.txt" && [ "$(grep -c '^event: ' "$TMP/sse.txt")" = 2 ] &&
        [ "$(grep -c '^data: {' "$TMP/sse.txt")" = 2 ] && ok "curl: text/event-stream, 2 events of event + data lines" ||
        fail "curl stream: $(head -c 300 "$TMP/h.txt")"
    # an edit: the reference is one of the PNGs above
    "$PY" "$CLIENT" edit "$PORT" 4 "$TMP/p/partial-3-2.png" 2>&1 | grep -E '^(ok|FAIL) - ' || fail "stream edit: no result"
    head -c 300 "$TMP/p/partial-3-2.png" >"$TMP/truncated.png"
    "$PY" "$CLIENT" error "$PORT" "$TMP/truncated.png" 2>&1 | grep -E '^(ok|FAIL) - ' || fail "stream error: no result"
    "$PY" "$CLIENT" hangup "$PORT" 2>&1 | grep -E '^(ok|FAIL) - ' || fail "stream hangup: no result"
    grep -q "cancelled at step [0-9]* of 200 (client gone)" "$TMP/s1.log" && ok "the hang-up is logged as a cancel" ||
        fail "no cancel in the log"
    stop_server; rc=$?
    [ $rc = 0 ] && ok "serve: clean exit after the streams" || fail "serve exit $rc: $(tail -3 "$TMP/s1.log")"
else fail "serve: did not become ready: $(tail -5 "$TMP/s1.log")"; fi

# under an API key: the stream needs it like any other request
echo "s3cret-token" >"$TMP/key"; chmod 600 "$TMP/key"
if start_server "$TMP/s2.log" "$TPGEN" --api-key-file "$TMP/key"; then
    "$PY" "$CLIENT" generate "$PORT" 2 "$TMP/p" s3cret-token 2>&1 | grep -E '^(ok|FAIL) - ' | sed 's/^\(ok\|FAIL\) - /\1 - api key: /'
    "$PY" "$CLIENT" nokey "$PORT" 2>&1 | grep -E '^(ok|FAIL) - ' || fail "stream without the key: no result"
    stop_server >/dev/null
else fail "serve --api-key-file: not ready: $(tail -3 "$TMP/s2.log")"; fi

# dp 2: two streams at once, one per TP group
if NP=4 start_server "$TMP/s3.log" "$TPGEN" --tp 2; then
    "$PY" "$CLIENT" dp "$PORT" 4 "$TMP/p" 2>&1 | grep -E '^(ok|FAIL) - ' | sed 's/^\(ok\|FAIL\) - /\1 - dp 2: /'
    stop_server; rc=$?
    [ $rc = 0 ] && ok "dp 2: clean exit" || fail "dp 2 exit $rc"
else fail "serve dp 2: not ready: $(tail -3 "$TMP/s3.log")"; fi

# a mesh: sp 2 (the job group's first rank alone sends the partials; the other SP position holds no image)
if NP=2 start_server "$TMP/s5.log" "$TPGEN" --sp 2; then
    "$PY" "$CLIENT" generate "$PORT" 2 "$TMP/p" 2>&1 | grep -E '^(ok|FAIL) - ' | sed 's/^\(ok\|FAIL\) - /\1 - sp 2: /'
    stop_server; rc=$?
    [ $rc = 0 ] && ok "sp 2: clean exit" || fail "sp 2 exit $rc"
else fail "serve --sp 2: not ready: $(tail -3 "$TMP/s5.log")"; fi

# the same streams under the sanitizers (leaks on: ASAN_OPTIONS/LSAN_OPTIONS from tests/run.sh)
ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    if start_server "$TMP/sa.log" "$ASAN/tpgen"; then
        "$PY" "$CLIENT" generate "$PORT" 4 "$TMP/p" 2>&1 | grep -E '^(ok|FAIL) - ' | sed 's/^\(ok\|FAIL\) - /\1 - asan: /'
        "$PY" "$CLIENT" hangup "$PORT" 2>&1 | grep -E '^(ok|FAIL) - ' | sed 's/^\(ok\|FAIL\) - /\1 - asan: /'
        "$PY" "$CLIENT" error "$PORT" "$TMP/truncated.png" 2>&1 | grep -E '^(ok|FAIL) - ' | sed 's/^\(ok\|FAIL\) - /\1 - asan: /'
        stop_server; rc=$?
        ! grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$TMP/sa.log" && [ $rc -eq 0 ] &&
            ok "asan: streams leave no sanitizer report, clean exit" ||
            fail "asan: rc $rc: $(grep -E -A3 'AddressSanitizer|LeakSanitizer|runtime error' "$TMP/sa.log" | head -5)"
    else fail "asan serve: not ready: $(tail -5 "$TMP/sa.log")"; fi
else
    fail "sanitizer runs: build-asan/ not found (make test builds it; or run 'make asan')"
fi
