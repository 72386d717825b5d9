#!/usr/bin/env bash
# The test command: unit tests, MPI tests at several sizes, the same on the
# sanitized build, and the command-line tests in tests/sh/*.sh, run as
# independent jobs side by side (-j, default 3) with each job's output kept
# together. Every line "ok - ..." counts as a pass and every "FAIL - ..." as a
# failure; "SKIP - ..." is a check this machine cannot run, with its reason,
# counted apart. The last line is the total.
#
# The runner cannot lose a check (tests/sh/runner.sh tests it on fixtures):
#   - a job that exits non-zero, dies on a signal, runs past its hard time
#     limit or prints a crash, sanitizer or "internal error" line without a
#     FAIL line of its own gets a FAIL line naming it;
#   - a C test binary is run on an explicit list of test names: a test that
#     kills its process is a FAIL, and the tests after it run in a new process;
#     every listed test must report;
#   - every tests/sh file states its time budget and the least number of
#     checks it reports (`# budget: S s; checks: N`): reporting fewer is a FAIL.
# The end lists the ten slowest jobs against their budgets, with a warning
# (never a failure: time on a shared machine is not a test) past twice a budget.
#
# Usage: tests/run.sh [--quick] [-j N] [FILTER]
#   FILTER   only the C tests and tests/sh files whose names contain it
#   --quick  the edit-compile-test tier (make test-quick): unit tests, MPI
#            tests at 2 ranks, and the tests/sh files marked `# tier: quick`
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
# intercept_tls_get_addr=0: with GCC 12's LeakSanitizer on glibc 2.36, a process that starts MPI
# without mpirun (a singleton: every sanitized `tpgen` run outside mpirun) gets a bogus dynamic-TLS
# range from Open MPI's plugins, and the leak check's tracer dies on it every time on some CPUs
# ("Tracer caught signal 11", "DTLS ... at 0x3c09"). Untracked, dynamic TLS is not scanned; tpgen keeps
# no heap pointers there, and leaks are still found (tests/sh/runner.sh checks one is).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:fast_unwind_on_malloc=0:intercept_tls_get_addr=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
TPGEN_ASAN_TESTS=${TPGEN_ASAN_TESTS:-$PWD/build-asan/tpgen_tests}
export MPIRUN="mpirun --oversubscribe --allow-run-as-root --bind-to none --mca btl_vader_single_copy_mechanism none"
# the meta-test (tests/sh/runner.sh) points these at its fixtures
SH_DIR=${TPGEN_SH_DIR:-tests/sh}
C_TESTS=${TPGEN_C_TESTS:-all} # all, unit (only $TPGEN_TESTS's unit tests) or none
HARD_LIMIT=${TPGEN_HARD_LIMIT:-900} # seconds a job may run before it is killed
quick=0 filter="" njobs=${TPGEN_TEST_JOBS:-3}
while [ $# -gt 0 ]; do
    case $1 in
        --quick) quick=1 ;;
        -j) njobs=$2; shift ;;
        -j*) njobs=${1#-j} ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) filter=$1 ;;
    esac
    shift
done
out=$(mktemp -d /tmp/tpgen-run-XXXXXX)
trap 'rm -rf "$out"' EXIT
t_start=$EPOCHREALTIME
CRASH='AddressSanitizer|LeakSanitizer|runtime error:|Segmentation fault|core dumped|tpgen: internal error|exited on signal'

# ---- the job table -------------------------------------------------------
J_NAME=() J_BUDGET=() J_MIN=() J_CMD=()
add_job() { # NAME BUDGET MIN_CHECKS COMMAND... (the command's words kept quoted)
    J_NAME+=("$1"); J_BUDGET+=("$2"); J_MIN+=("$3"); shift 3
    local q; printf -v q '%q ' "$@"; J_CMD+=("$q")
}

# ctest BIN MODE NP NAMES_FILE: run the listed C tests (MODE unit or mpi);
# when the process dies before reporting them all, the first unreported test
# is a FAIL and the rest run in a new process
ctest() {
    local bin=$1 mode=$2 np=$3 list=$4 rc log=$out/ctest.$BASHPID left
    local -a names cmd
    mapfile -t names < "$list"
    while [ ${#names[@]} -gt 0 ]; do
        if [ "$mode" = mpi ]; then cmd=($MPIRUN -np "$np" "$bin" --mpi --exact); else cmd=("$bin" --exact); fi
        timeout -k 10 "$HARD_LIMIT" "${cmd[@]}" "${names[@]}" >"$log" 2>&1; rc=$?
        cat "$log"
        left=()
        local n
        for n in "${names[@]}"; do
            grep -qE "^(ok|FAIL) - $n( |:|\$)" "$log" || left+=("$n")
        done
        if [ ${#left[@]} -eq 0 ]; then
            # every test reported: a failing test makes the status 1; any other
            # status (a leak found at exit, a signal) is a failure of its own
            if [ $rc -ne 0 ] && ! grep -q '^FAIL - ' "$log"; then
                echo "FAIL - $(basename "$bin") $mode np=$np: the process exited with status $rc after reporting every test"
            fi
            return 0
        fi
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            echo "FAIL - ${left[0]}: killed after ${HARD_LIMIT} s (the test hung)"
        else
            local how="status $rc"; [ $rc -gt 128 ] && how="signal $((rc - 128))"
            echo "FAIL - ${left[0]}: its process ended ($how) before reporting it; the tests after it run in a new process $(grep -E "$CRASH" "$log" | head -1 | cut -c1-200)"
        fi
        names=("${left[@]:1}")
    done
}

# add_ctests LABEL BUDGET BIN MODE NP SHARDS: the binary's tests of that mode
# that match FILTER, dealt round-robin into SHARDS jobs
add_ctests() {
    local label=$1 budget=$2 bin=$3 mode=$4 np=$5 shards=$6 k
    local -a names
    if [ ! -x "$bin" ]; then
        echo "FAIL - $label: $bin is missing (make builds it; make asan the sanitized one)" >> "$out/runner.fail"
        return
    fi
    local flag=""; [ "$mode" = mpi ] && flag=--mpi
    mapfile -t names < <("$bin" $flag --list $filter 2>/dev/null)
    [ ${#names[@]} -gt 0 ] || return 0
    [ ${#names[@]} -lt "$shards" ] && shards=${#names[@]}
    for ((k = 0; k < shards; k++)); do
        local f=$out/names.${#J_NAME[@]}
        : > "$f"
        local i
        for ((i = k; i < ${#names[@]}; i += shards)); do echo "${names[$i]}" >> "$f"; done
        local name=$label; [ "$shards" -gt 1 ] && name="$label ($((k + 1))/$shards)"
        add_job "$name" $(( (budget + shards - 1) / shards )) "$(wc -l < "$f")" ctest "$bin" "$mode" "$np" "$f"
    done
}

if [ "$TPGEN_GOLDEN" = "$PWD/build/golden" ] && [ "$C_TESTS" != none ]; then
    echo "# golden data"
    tests/unpack-golden.sh "$TPGEN_GOLDEN" | tee "$out/golden.out"
fi
if [ "$C_TESTS" = unit ]; then
    add_ctests unit 1 "$TPGEN_TESTS" unit 1 1
elif [ "$C_TESTS" = all ]; then
    # budgets: seconds on the reference 2-vCPU machine, alone (docs in README "Testing")
    add_ctests unit 60 "$TPGEN_TESTS" unit 1 $([ $quick = 1 ] && echo 2 || echo 1)
    if [ $quick = 1 ]; then
        add_ctests "mpi np=2" 40 "$TPGEN_TESTS" mpi 2 1
    else
        for np in 1 2 4; do add_ctests "mpi np=$np" $((np == 4 ? 90 : 45)) "$TPGEN_TESTS" mpi $np 1; done
        # the same tests on the ASan + UBSan + LeakSanitizer build: memory
        # errors, undefined behaviour and leaks fail them
        add_ctests "unit asan" 150 "$TPGEN_ASAN_TESTS" unit 1 3
        add_ctests "mpi np=2 asan" 120 "$TPGEN_ASAN_TESTS" mpi 2 2
    fi
fi
for f in "$SH_DIR"/*.sh; do
    [ -e "$f" ] || continue
    case "$f" in *"$filter"*) ;; *) continue ;; esac
    [ $quick = 1 ] && ! grep -q '^# tier: quick' "$f" && continue
    b=$(sed -n 's/^# budget: *\([0-9]*\) s.*/\1/p' "$f" | head -1)
    c=$(sed -n 's/^# budget: *[0-9]* s; checks: *\([0-9]*\).*/\1/p' "$f" | head -1)
    if [ -z "$b" ] || [ -z "$c" ]; then
        echo "FAIL - $f: no '# budget: S s; checks: N' line in its header" >> "$out/runner.fail"
        b=60 c=1
    fi
    add_job "$f" "$b" "$c" timeout -k 10 "$HARD_LIMIT" bash "$f"
done

# ---- running them: longest budget first, at most njobs at once ----------
n=${#J_NAME[@]}
mapfile -t order < <(for ((i = 0; i < n; i++)); do echo "${J_BUDGET[$i]} $i"; done | sort -rn | cut -d' ' -f2)
declare -A running=()
J_T0=() J_SEC=()
next=0 done_n=0
start_job() {
    local i=$1
    J_T0[$i]=$EPOCHREALTIME
    # the inner subshell may die in any way (set -u included): its status is still written
    ( ( eval "${J_CMD[$i]}" ) > "$out/job.$i.out" 2>&1; echo $? > "$out/job.$i.rc.tmp"; mv "$out/job.$i.rc.tmp" "$out/job.$i.rc" ) &
    running[$i]=1
}
finish_job() { # print the job's lines together, with the runner's own verdicts
    local i=$1 name=${J_NAME[$i]} rc f=$out/job.$i.out checks
    rc=$(cat "$out/job.$i.rc")
    J_SEC[$i]=$(echo "$EPOCHREALTIME - ${J_T0[$i]}" | bc)
    unset "running[$i]"
    {
        echo "# $name"
        grep -E '^(ok|FAIL|SKIP) - |^# ' "$f"
        checks=$(grep -cE '^(ok|FAIL|SKIP) - ' "$f")
        local why=""
        if ! grep -q '^FAIL - ' "$f"; then
            if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="killed after ${HARD_LIMIT} s (its hard time limit)"
            elif [ "$rc" -gt 128 ]; then why="died on signal $((rc - 128))"
            elif [ "$rc" -ne 0 ]; then why="exited with status $rc"
            elif grep -vE '^(ok|SKIP) - ' "$f" | grep -qE "$CRASH"; then   # a check's own name may mention them
                why="printed '$(grep -vE '^(ok|SKIP) - ' "$f" | grep -E "$CRASH" | head -1 | cut -c1-160)'"
            fi
        fi
        [ -n "$why" ] && echo "FAIL - $name: $why without a FAIL line (its last lines: $(tail -3 "$f" | tr '\n' ' ' | cut -c1-300))"
        if [ "$checks" -lt "${J_MIN[$i]}" ]; then
            echo "FAIL - $name: reported $checks checks, fewer than the ${J_MIN[$i]} it declares"
        fi
        printf '# (%.0f s)\n' "${J_SEC[$i]}"
    } > "$out/job.$i.report"
    cat "$out/job.$i.report"
}
while [ $done_n -lt "$n" ]; do
    while [ ${#running[@]} -lt "$njobs" ] && [ $next -lt "$n" ]; do
        start_job "${order[$next]}"; next=$((next + 1))
    done
    wait -n 2>/dev/null || true
    finished=0
    for i in "${!running[@]}"; do
        if [ -e "$out/job.$i.rc" ]; then finish_job "$i"; done_n=$((done_n + 1)); finished=1; fi
    done
    [ $finished = 1 ] || sleep 0.2 # woken by something else than a job's end
done

# ---- the total -------------------------------------------------------------
[ -e "$out/runner.fail" ] && cat "$out/runner.fail"
all=$(cat "$out"/job.*.report "$out/golden.out" "$out/runner.fail" 2>/dev/null)
passed=$(grep -c '^ok - ' <<< "$all")
failed=$(grep -c '^FAIL - ' <<< "$all")
skipped=$(grep -c '^SKIP - ' <<< "$all")
total=$(echo "$EPOCHREALTIME - $t_start" | bc)
echo "# the ten slowest jobs (seconds, budget):"
for ((i = 0; i < n; i++)); do echo "${J_SEC[$i]:-0} $i"; done | sort -rn | head -10 | while read -r s i; do
    b=${J_BUDGET[$i]}
    warn=""; [ "$(echo "$s > 2 * $b" | bc)" = 1 ] && warn="   WARNING: over twice its budget"
    printf '#   %6.0f  %4d  %s%s\n' "$s" "$b" "${J_NAME[$i]}" "$warn"
done
printf '# the suite took %.0f s (%d jobs, %d at a time)\n' "$total" "$n" "$njobs"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
