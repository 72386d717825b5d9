# `tpgen serve` against hostile clients (issue 21): what tests/sh/serve_hostile.sh (release build),
# serve_hostile_asan.sh (ASan + UBSan build) and serve_soak.sh (the leak soak) share, so that the three
# run side by side. Sourced after tests/lib.sh.
M=$TMP/tiny
$TPGEN make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "make-tiny"
CLIENT=$TPGEN_ROOT/tests/serve_client.py
PY=/usr/bin/python3

. "$TPGEN_ROOT/tests/lib_serve.sh"   # start_server, wait_exit, stop_server
# keep a failing server's log where it can be read after the run (TMP goes)
keep_log() { mkdir -p "$TPGEN_ROOT/build/serve_hostile" && cp "$1" "$TPGEN_ROOT/build/serve_hostile/" && echo "(log kept: build/serve_hostile/$(basename "$1"))"; }
health() { curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health"; }

# the ~100-byte request that crashed every server of issue 21, with or without a key
crash_request() {   # NAME
    local st
    st=$(printf -- '--B0123\r\nContent-Type: text/plain\r\n\r\nnoname\r\n--B0123--\r\n' |
        curl -s -m 10 -o "$TMP/crash.json" -w '%{http_code}' -H 'Content-Type: multipart/form-data; boundary=B0123' \
            -H "Authorization: Bearer ${KEY:-none}" --data-binary @- "http://127.0.0.1:$PORT/v1/images/edits")
    if [ "$st" = 400 ] && grep -q "no name" "$TMP/crash.json" && [ "$(health)" = 200 ]; then
        ok "$1: a multipart part without Content-Disposition is a 400, the server lives on"
    else fail "$1: the nameless part: status $st: $(head -c 200 "$TMP/crash.json"), /health $(health)"; fi
}

echo "s3cret-token" >"$TMP/key"; chmod 600 "$TMP/key"

# hostile_build release|asan: every hostile-client case on that build (tp 2; tp 2 x dp 2)
hostile_build() {
    local build=$1 bin=$TPGEN rc
    if [ $build = asan ]; then
        bin=$TPGEN_ROOT/build-asan/tpgen
        [ -x "$bin" ] || { fail "asan: build-asan/tpgen not found (make asan)"; return; }
        export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1   # ASAN_OPTIONS and LSAN_OPTIONS (leaks on) come from tests/run.sh
    fi
    if start_server "$TMP/h-$build.log" "$bin"; then
        crash_request "$build, no key"
        stop_server; rc=$?
        ! grep -qE "AddressSanitizer|runtime error" "$TMP/h-$build.log" && [ $rc -eq 0 ] &&
            ok "$build, no key: clean exit, no sanitizer report" ||
            fail "$build, no key: rc $rc: $(grep -E -A3 'AddressSanitizer|runtime error' "$TMP/h-$build.log" | head -5)"
    else fail "$build: not ready: $(tail -3 "$TMP/h-$build.log")"; fi
    if start_server "$TMP/k-$build.log" "$bin" --api-key-file "$TMP/key"; then
        KEY=s3cret-token crash_request "$build, with a key"
        # 8 unauthenticated 45 MB uploads grew rank 0 by 450 MB in issue 21
        "$PY" "$CLIENT" preauth "$PORT" "$R0" 8 45 | sed "s/^\(ok\|FAIL\) - /\1 - $build: /"
        [ "$(health)" = 200 ] && ok "$build: /health answers after the uploads" || fail "$build: /health after the uploads"
        stop_server; rc=$?
        ! grep -qE "AddressSanitizer|runtime error" "$TMP/k-$build.log" && [ $rc -eq 0 ] &&
            ok "$build, with a key: clean exit, no sanitizer report" ||
            fail "$build, with a key: rc $rc: $(grep -E -A3 'AddressSanitizer|runtime error' "$TMP/k-$build.log" | head -5)"
    else fail "$build --api-key-file: not ready: $(tail -3 "$TMP/k-$build.log")"; fi
    if start_server "$TMP/c-$build.log" "$bin" --max-connections 300 --max-connections-per-ip 0 --header-timeout 3 \
        --keepalive-timeout 2; then
        timeout 60 "$PY" "$CLIENT" conns "$PORT" 250 300 3 2 | sed "s/^\(ok\|FAIL\) - /\1 - $build: /"
        stop_server; rc=$?
        [ $rc -eq 0 ] && ! grep -qE "AddressSanitizer|runtime error" "$TMP/c-$build.log" &&
            ok "$build, connections: clean exit" || fail "$build, connections: rc $rc: $(tail -3 "$TMP/c-$build.log")"
    else fail "$build --max-connections: not ready: $(tail -3 "$TMP/c-$build.log")"; fi
    if start_server "$TMP/p-$build.log" "$bin" --max-connections-per-ip 4; then
        timeout 30 "$PY" "$CLIENT" per-ip "$PORT" 4 | sed "s/^\(ok\|FAIL\) - /\1 - $build: /"
        timeout 200 "$PY" "$CLIENT" abandon "$PORT" | sed "s/^\(ok\|FAIL\) - /\1 - $build: /"
        stop_server; rc=$?
        [ $rc -eq 0 ] && ! grep -qE "AddressSanitizer|runtime error" "$TMP/p-$build.log" &&
            ok "$build, cancelled renders: clean exit" ||
            fail "$build, cancelled renders: rc $rc: $(tail -3 "$TMP/p-$build.log") $(keep_log "$TMP/p-$build.log")"
    else fail "$build --max-connections-per-ip: not ready: $(tail -3 "$TMP/p-$build.log")"; fi
    if start_server "$TMP/d-$build.log" "$bin" --request-timeout 2; then
        timeout 60 "$PY" "$CLIENT" deadline "$PORT" 2 | sed "s/^\(ok\|FAIL\) - /\1 - $build: /"
        stop_server >/dev/null
    else fail "$build --request-timeout: not ready: $(tail -3 "$TMP/d-$build.log")"; fi
    if NP=4 start_server "$TMP/t-$build.log" "$bin" --tp 2; then
        timeout 300 "$PY" "$CLIENT" abandon-dp "$PORT" | sed "s/^\(ok\|FAIL\) - /\1 - $build: /"
        timeout 400 "$PY" "$CLIENT" sigterm "$PORT" "$R0" | sed "s/^\(ok\|FAIL\) - /\1 - $build: /"
        wait_exit 120; rc=$?
        [ $rc -eq 0 ] && grep -q "serve: stopped" "$TMP/t-$build.log" && ! grep -qE "AddressSanitizer|runtime error" "$TMP/t-$build.log" &&
            ok "$build: SIGTERM at dp 2: every rank exits 0" || fail "$build: SIGTERM at dp 2: rc $rc: $(tail -3 "$TMP/t-$build.log")"
    else fail "$build tp 2 x dp 2: not ready: $(tail -3 "$TMP/t-$build.log")"; fi
}

# hostile_soak: 1000 mixed requests (generations, edits, bad requests, clients that hang up, probes);
# world rank 0's resident memory grows by at most 5 MB after the first 100
hostile_soak() {
    REF=$TPGEN_GOLDEN/klein-tiny-edit/refs/r0_64x80.png
    if start_server "$TMP/soak.log" "$TPGEN" --queue 64; then
        $PY "$CLIENT" soak "$PORT" "$R0" "${SOAK_N:-1000}" "$REF"
        stop_server || { fail "soak: the server did not stop cleanly"; keep_log "$TMP/soak.log"; }
    else
        fail "soak: the server did not become ready: $(tail -3 "$TMP/soak.log")"
    fi
}
