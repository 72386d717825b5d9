# Helpers for the command-line tests (sourced by tests/sh/*.sh).
# ok NAME / fail NAME WHY / skip NAME WHY print the lines tests/run.sh counts.
ok() { echo "ok - $*"; }
fail() { echo "FAIL - $*"; }
# a check this machine cannot run (a kernel feature it lacks), with the reason:
# counted apart from passes and failures in the closing line
skip() { echo "SKIP - $*"; }
# lsan_run NAME CMD...: run CMD, its output in $out and its status in $rc. When
# LeakSanitizer's own tracer fails to stop the threads ("has encountered a fatal
# error": no finding about tpgen, a leak is reported as a leak), run it again, at
# most twice, the last time with LeakSanitizer's verbose log; if it fails every
# time, that log's lines are shown, so that the cause can be read in CI's output
lsan_run() {
    local name=$1 try; shift
    out=$("$@" 2>&1); rc=$?
    for try in 2 3; do
        echo "$out" | grep -q 'LeakSanitizer has encountered a fatal error' || return 0
        echo "# $name: LeakSanitizer's tracer failed (try $((try - 1))); run again"
        sleep 1
        if [ $try = 3 ]; then
            out=$(LSAN_OPTIONS="${LSAN_OPTIONS:-}:verbosity=1:log_threads=1" "$@" 2>&1); rc=$?
        else
            out=$("$@" 2>&1); rc=$?
        fi
    done
    if echo "$out" | grep -q 'LeakSanitizer has encountered a fatal error'; then
        echo "$out" | grep -vE '^(tpgen: |HINT: )' | grep -iE 'tracer|thread|attach|suspend|waitpid|errno|proc' | tail -12 | sed 's/^/# lsan: /'
    fi
    return 0
}
# expect_fail NAME PATTERN CMD...: CMD must exit non-zero, not crash, and
# print PATTERN (grep -E) on stderr/stdout.
expect_fail() {
    local name=$1 pat=$2; shift 2
    local out rc
    lsan_run "$name" "$@"
    if [ $rc -eq 0 ]; then fail "$name: exited 0"; return; fi
    if [ $rc -ge 128 ] || echo "$out" | grep -qE 'Segmentation|core dumped|AddressSanitizer|LeakSanitizer|runtime error'; then
        fail "$name: crashed (rc $rc): $(echo "$out" | tail -3)"; return
    fi
    if echo "$out" | grep -qE -- "$pat"; then ok "$name"; else fail "$name: message did not match '$pat': $(echo "$out" | tail -3)"; fi
}
TMP=$(mktemp -d /tmp/tpgen-sh-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# flux3_folder KIND DIR: a FLUX.3 pipeline folder (KIND base or flowmap): the golden
# tiny transformer, the golden tiny VAE and the modular_model_index.json that
# diffusers 0.42.1 saves (tests/data/flux3-pipe)
flux3_folder() {
    mkdir -p "$2"
    ln -s "$TPGEN_GOLDEN/flux3-tiny/$1/model/transformer" "$2/transformer"
    ln -s "$TPGEN_GOLDEN/vae-tiny/model/vae" "$2/vae"
    cp "$TPGEN_ROOT/tests/data/flux3-pipe/${1}_modular_model_index.json" "$2/modular_model_index.json"
}

# venv_with NAME MODULE PACKAGE: a Python venv kept in build/venv-NAME with
# PACKAGE from PyPI (test-only tools: the openai client, selenium), made once
# and under a lock, since test files that share it run side by side; sets PY.
venv_with() {
    local venv=$TPGEN_ROOT/build/venv-$1
    mkdir -p "$TPGEN_ROOT/build"
    (
        flock 9
        if ! "$venv/bin/python" -c "import $2" 2>/dev/null; then
            rm -rf "$venv"
            /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install -q "$3" >"$TMP/pip-$1.log" 2>&1
        fi
    ) 9>"$TPGEN_ROOT/build/venv-$1.lock" || fail "installing $3 into $venv: $(tail -3 "$TMP/pip-$1.log" 2>/dev/null)"
    PY=$venv/bin/python
}
