#!/usr/bin/env bash
# The test command: unit tests, MPI tests at several sizes, and the
# command-line tests in tests/sh/*.sh. Every line "ok - ..." counts as a
# pass and every "FAIL - ..." as a failure; "SKIP - ..." is a check this
# machine cannot run, with its reason (a kernel feature it lacks), counted
# apart. The last line is the total.
# Usage: tests/run.sh [FILTER]   (FILTER selects unit/MPI tests and sh files by name)
set -u
cd "$(dirname "$0")/.."
export TPGEN_ROOT=$PWD
export TPGEN=${TPGEN:-$PWD/build/tpgen}
export TPGEN_TESTS=${TPGEN_TESTS:-$PWD/build/tpgen_tests}
# golden data: the repository's own (tests/data/golden), unpacked into build/golden
export TPGEN_GOLDEN=${TPGEN_GOLDEN:-$PWD/build/golden}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# sanitized runs check leaks too; tests/lsan.supp names the only allocations
# allowed to stay (Open MPI's, PMIx's and hwloc's own). Full unwinding: Open
# MPI's plugins have no frame pointers, and a leak's stack must reach the
# Open MPI frame that a suppression names.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:fast_unwind_on_malloc=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
TPGEN_ASAN_TESTS=${TPGEN_ASAN_TESTS:-$PWD/build-asan/tpgen_tests}
export MPIRUN="mpirun --oversubscribe --allow-run-as-root --bind-to none --mca btl_vader_single_copy_mechanism none"
filter=${1:-}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run() { # run a command, echo its output, keep it for counting; then its wall time
    local t0=$SECONDS
    "$@" 2>&1 | tee -a "$log" | grep -E '^(ok|FAIL|SKIP) - |^# ' || true
    echo "# ($((SECONDS - t0)) s)"
}

echo "# golden data"
if [ "$TPGEN_GOLDEN" = "$PWD/build/golden" ]; then
    run tests/unpack-golden.sh "$TPGEN_GOLDEN"
fi
echo "# unit tests"
run "$TPGEN_TESTS" $filter
for np in 1 2 4; do
    echo "# MPI tests, $np ranks"
    run $MPIRUN -np $np "$TPGEN_TESTS" --mpi $filter
done
# the same tests on the ASan + UBSan + LeakSanitizer build: memory errors,
# undefined behaviour and leaks fail them
if [ -x "$TPGEN_ASAN_TESTS" ]; then
    echo "# unit tests, sanitized"
    run "$TPGEN_ASAN_TESTS" $filter
    echo "# MPI tests, 2 ranks, sanitized"
    run $MPIRUN -np 2 "$TPGEN_ASAN_TESTS" --mpi $filter
else
    echo "FAIL - sanitized tests: $TPGEN_ASAN_TESTS is missing (make asan builds it)" | tee -a "$log"
fi
for f in tests/sh/*.sh; do
    [ -e "$f" ] || continue
    case "$f" in *"$filter"*) ;; *) continue ;; esac
    echo "# $f"
    run timeout 900 bash "$f"
done

passed=$(grep -c '^ok - ' "$log")
failed=$(grep -c '^FAIL - ' "$log")
skipped=$(grep -c '^SKIP - ' "$log")
# a test binary or script that died without reporting counts as a failure
if grep -qE 'AddressSanitizer|LeakSanitizer|runtime error:|Segmentation fault|core dumped' "$log"; then
    echo "FAIL - a test process crashed or a sanitizer reported an error (see above)"
    failed=$((failed + 1))
fi
echo "# the suite took $SECONDS s"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
