#!/usr/bin/env bash
# Run each libFuzzer harness for a fixed time: fuzz/run.sh SECONDS NAME...
# (make fuzz calls it). Each starts from its seed corpus fuzz/corpus/NAME
# (copied, so the repository's seeds stay as they are) and runs single-job
# with ASan + UBSan. A crash, leak or sanitizer report fails the run and
# prints the reproducer: its path, its bytes (base64) and the command that
# replays it. Add each crashing input to fuzz/corpus/NAME as a regression seed.
set -u
cd "$(dirname "$0")/.."
secs=$1; shift
out=build-fuzz/run
mkdir -p "$out"
status=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}   # leaks are findings too
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
for name in "$@"; do
    bin=build-fuzz/fuzz_$name
    work=$out/$name
    rm -rf "$work" && mkdir -p "$work/corpus" "$work/crash"
    cp fuzz/corpus/"$name"/* "$work/corpus/" 2>/dev/null
    "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -max_len=65536 \
        -artifact_prefix="$work/crash/" -print_final_stats=1 "$work/corpus" >"$work/log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1)
    if [ $rc -ne 0 ] || ls "$work/crash/"* >/dev/null 2>&1; then
        status=1
        echo "FAIL - fuzz_$name: a finding after ${execs:-?} runs (rc $rc)"
        grep -E 'ERROR|runtime error|SUMMARY|disagree|fast path' "$work/log" | head -5
        for c in "$work/crash/"*; do
            [ -e "$c" ] || continue
            echo "  reproducer: $c ($(stat -c %s "$c") bytes), replay: $bin $c"
            echo "  base64: $(base64 -w0 "$c" | head -c 4000)"
        done
    else
        echo "ok - fuzz_$name: ${secs} s, ${execs:-?} runs ($((${execs:-0} / secs))/s), $cov"
    fi
done
exit $status
