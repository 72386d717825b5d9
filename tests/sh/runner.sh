#!/usr/bin/env bash
# budget: 10 s; checks: 14
# The runner itself (tests/run.sh) on fixtures that misbehave as real tests
# can (tests/runner-fixtures): a crash, a silent non-zero exit, fewer checks
# than declared, an internal error or Open MPI abort line with exit 0, a hang
# past the hard limit, a missing header, and a C test binary whose process dies
# inside one test and exits non-zero at the end. Each must be one FAIL naming
# it, no check may be lost, and the tests after a crash must still run.
. "$TPGEN_ROOT/tests/lib.sh"
F=$TPGEN_ROOT/tests/runner-fixtures
res=$(TPGEN_SH_DIR=$F TPGEN_C_TESTS=unit TPGEN_TESTS=$F/fake_tests TPGEN_HARD_LIMIT=3 \
      TPGEN_GOLDEN=$TMP/none bash "$TPGEN_ROOT/tests/run.sh" -j 4 2>&1); rc=$?
[ $rc -ne 0 ] && ok "runner: a failing suite exits non-zero" || fail "runner: exit status 0 with failures"
last=$(echo "$res" | tail -1)
[ "$last" = "14 passed, 9 failed" ] && ok "runner: the closing line counts every check ($last)" ||
    fail "runner: closing line '$last', expected '14 passed, 9 failed'"
expect_line() { # NAME PATTERN: exactly one line matches
    local k; k=$(echo "$res" | grep -cE -- "$2")
    [ "$k" = 1 ] && ok "runner: $1" || fail "runner: $1: $k lines match '$2'"
}
expect_line "a signal is a FAIL" "^FAIL - $F/crash.sh: died on signal 11"
expect_line "a silent non-zero exit is a FAIL" "^FAIL - $F/silent.sh: exited with status 3"
expect_line "fewer checks than declared is a FAIL" "^FAIL - $F/few.sh: reported 2 checks, fewer than the 5"
expect_line "an internal error with exit 0 is a FAIL" "^FAIL - $F/internal.sh: printed 'tpgen: internal error"
expect_line "Open MPI's 'exited on signal' is a FAIL" "^FAIL - $F/mpisig.sh: printed 'mpirun noticed"
expect_line "a hang is killed and a FAIL" "^FAIL - $F/hang.sh: killed after 3 s"
expect_line "a file without a budget line is a FAIL" "^FAIL - $F/noheader.sh: no '# budget"
expect_line "a C test that kills its process is a FAIL by name" "^FAIL - fake_c: its process ended \(signal 6\)"
expect_line "the C tests after the crash still run" "^ok - fake_d$"
expect_line "a C test process that exits non-zero after its reports is a FAIL" "^FAIL - fake_tests unit np=1: the process exited with status 23"
echo "$res" | grep -qE '^#.*hang.sh   WARNING: over twice its budget' && ok "runner: a job over twice its budget is named in a warning" ||
    fail "runner: no budget warning for hang.sh"

# the sanitized runs' options (tests/run.sh: intercept_tls_get_addr=0) still find a leak in a
# process that starts MPI without mpirun, as a sanitized tpgen run does
cat > "$TMP/leak.c" <<'C'
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
static void *lost;
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    lost = malloc(4242);
    memset(lost, 1, 4242);
    lost = NULL;
    MPI_Finalize();
    return 0;
}
C
if mpicc -g -fsanitize=address -o "$TMP/leak" "$TMP/leak.c" 2>"$TMP/leak.err"; then
    out=$("$TMP/leak" 2>&1); rc=$?
    [ $rc -ne 0 ] && echo "$out" | grep -q 'detected memory leaks' && echo "$out" | grep -q '4242 byte' &&
        ok "runner: LeakSanitizer with the suite's options finds a leak in an MPI singleton" ||
        fail "runner: the leak was not reported (rc $rc): $(echo "$out" | tail -3)"
else
    fail "runner: cannot build the leak probe: $(tail -2 "$TMP/leak.err")"
fi
