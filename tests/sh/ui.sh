#!/usr/bin/env bash
# budget: 90 s; checks: 21
# The page of `tpgen serve` (GET /, cli/ui/ compiled into the binary) in
# headless Chromium (Debian's chromium + chromium-driver, selenium from PyPI
# in a venv in build/): it renders from the keyboard, shows partial images,
# gets the API's bytes, keeps the session's results, works at a phone's
# width and by keyboard with no console errors; an edit through #images; the
# page under --api-key-file (loads without the key, renders only with it);
# --no-ui; the files' headers. Screenshots: build/ui-page.png, build/ui-page-phone.png.
. "$TPGEN_ROOT/tests/lib.sh"
M=$TMP/tiny
$TPGEN make-tiny --out "$M" --seed 3 >/dev/null 2>&1 || fail "make-tiny"
. "$TPGEN_ROOT/tests/lib_serve.sh"   # start_server, wait_exit, stop_server

# the page's files and headers need no browser
if start_server "$TMP/s0.log" "$TPGEN"; then
    curl -s -D "$TMP/h.txt" -o "$TMP/index.html" "http://127.0.0.1:$PORT/"
    grep -qi '^content-type: text/html' "$TMP/h.txt" && grep -qi "^content-security-policy: default-src 'none'; script-src 'self'" "$TMP/h.txt" &&
        cmp -s "$TMP/index.html" "$TPGEN_ROOT/cli/ui/index.html" &&
        ok "GET /: cli/ui/index.html as compiled in, text/html, a Content-Security-Policy (self only)" ||
        fail "GET /: $(head -5 "$TMP/h.txt")"
    ok_files=1
    for f in app.js style.css; do
        curl -s -o "$TMP/$f" "http://127.0.0.1:$PORT/ui/$f"; cmp -s "$TMP/$f" "$TPGEN_ROOT/cli/ui/$f" || ok_files=0
    done
    [ $ok_files = 1 ] && ok "GET /ui/app.js and /ui/style.css: the files of cli/ui/" || fail "the page's files differ"
    ! grep -qE 'https?://' "$TPGEN_ROOT/cli/ui/index.html" "$TPGEN_ROOT/cli/ui/app.js" "$TPGEN_ROOT/cli/ui/style.css" &&
        ok "the page loads nothing from elsewhere (no URL with a host in its files)" || fail "the page names an outside URL"
    st=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/ui/missing.js")
    [ "$st" = 404 ] && ok "a file the page does not have: 404" || fail "/ui/missing.js: $st"
    stop_server >/dev/null
else fail "serve: not ready: $(tail -3 "$TMP/s0.log")"; fi
if start_server "$TMP/s1.log" "$TPGEN" --no-ui; then
    st=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/")
    [ "$st" = 404 ] && ok "--no-ui: GET / is a 404" || fail "--no-ui: GET / answered $st"
    stop_server >/dev/null
else fail "serve --no-ui: not ready: $(tail -3 "$TMP/s1.log")"; fi

# the browser: Debian's chromium and chromium-driver (scripts/install-deps.sh), selenium from PyPI
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    # one line per browser check, so that the count still adds up
    for c in "page loads" "render, partials, API bytes" "parameters, session list, progress" "keyboard order" \
             "screenshot" "phone width" "console" "edit through #images" "api key: page loads" "api key: refused" \
             "api key: render" "api key: parameters" "api key: keyboard" "api key: screenshot" "api key: phone width" \
             "api key: console"; do
        skip "the page in a browser ($c): /usr/bin/chromium or /usr/bin/chromedriver missing (apt-get install chromium chromium-driver; scripts/install-deps.sh does)"
    done
    exit 0
fi
venv_with ui selenium selenium   # selenium from PyPI, in a venv kept in build/ (tests/lib.sh)
SHOT=$TPGEN_ROOT/build/ui-page.png
if start_server "$TMP/s2.log" "$TPGEN"; then
    "$PY" "$TPGEN_ROOT/tests/ui_page.py" render "$PORT" "$SHOT" 2>&1 | grep -E '^(ok|FAIL) - ' || fail "the browser test gave no result"
    curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" \
        -d '{"prompt": "a fox", "size": "64x64", "seed": 3, "steps": 2}' | jq -r '.data[0].b64_json' | base64 -d >"$TMP/ref.png"
    "$PY" "$TPGEN_ROOT/tests/ui_page.py" edit "$PORT" "$TMP/ref.png" 2>&1 | grep -E '^(ok|FAIL) - ' || fail "the edit test gave no result"
    stop_server >/dev/null
else fail "serve: not ready: $(tail -3 "$TMP/s2.log")"; fi
echo "s3cret-token" >"$TMP/key"; chmod 600 "$TMP/key"
if start_server "$TMP/s3.log" "$TPGEN" --api-key-file "$TMP/key"; then
    "$PY" "$TPGEN_ROOT/tests/ui_page.py" render "$PORT" "$TMP/key-shot.png" s3cret-token 2>&1 | grep -E '^(ok|FAIL) - ' |
        sed 's/^\(ok\|FAIL\) - /\1 - api key: /'
    stop_server >/dev/null
else fail "serve --api-key-file: not ready: $(tail -3 "$TMP/s3.log")"; fi
