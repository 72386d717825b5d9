#!/usr/bin/env bash
# budget: 20 s; checks: 4
# The AMX GEMM route (kernels/cpu/cpu_gemm_amx.c): on by default on a CPU
# whose /proc/cpuinfo lists amx_bf16 and amx_tile, off with TPGEN_NO_AMX=1 or
# TPGEN_NO_AVX512=1; with it off the GEMM op tests (double references) and
# the fp8 GEMM tests pass on the previous routes (AVX512-BF16 kernel,
# portable path), as on a CPU without AMX.
. "$TPGEN_ROOT/tests/lib.sh"
if grep -qw amx_bf16 /proc/cpuinfo && grep -qw amx_tile /proc/cpuinfo && grep -qw avx512_bf16 /proc/cpuinfo; then
    want=yes
else
    want=no
fi
out=$("$TPGEN" bench gemm --quick --reps 1 --m 8 --threads 1 2>&1)
echo "$out" | grep -q "; AMX: $want\$" && ok "bench gemm reports AMX: $want, as /proc/cpuinfo says" \
    || fail "AMX detection (expected $want): $(echo "$out" | head -1)"
for var in TPGEN_NO_AMX TPGEN_NO_AVX512; do
    out=$(env $var=1 "$TPGEN" bench gemm --quick --reps 1 --m 8 --threads 1 2>&1)
    echo "$out" | grep -q '; AMX: no$' && ok "$var=1 switches AMX off" || fail "$var=1: $(echo "$out" | head -1)"
done
out=$(TPGEN_NO_AMX=1 "$TPGEN_TESTS" ops_gemm 2>&1; TPGEN_NO_AMX=1 "$TPGEN_TESTS" fp8_cpu_gemm 2>&1)
n=$(echo "$out" | grep -c '^ok - \(ops_gemm\|fp8_cpu_gemm\)')
if ! echo "$out" | grep -q '^# unit np=1: [0-9]* passed, [1-9]' && [ "$n" -ge 6 ] \
    && echo "$out" | grep -q '^# ops_gemm_amx: AMX is off'; then
    ok "GEMM op tests and fp8 GEMM tests pass with TPGEN_NO_AMX=1 ($n tests)"
else
    fail "GEMM tests with TPGEN_NO_AMX=1: $(echo "$out" | grep -v '^ok' | head -5)"
fi
