#!/usr/bin/env bash
# budget: 90 s; checks: 11
# Portable builds: on a CPU without the extensions the build uses (an
# emulated Westmere, no AVX/AVX2/FMA, under qemu-user) tpgen stops with a
# clear error naming them and how to rebuild, not SIGILL; on an emulated
# Haswell it runs. The CUDA build targets SASS for each architecture of
# 80 89 90 100 120 that nvcc knows, plus PTX for the newest. TPGEN_NO_AVX512=1
# switches the AVX512-BF16 kernels off, =2 also the portable GEMM's AVX-512F
# micro-kernel, and the GEMM op tests pass both ways.
. "$TPGEN_ROOT/tests/lib.sh"
if ! command -v qemu-x86_64 >/dev/null; then
    fail "qemu-x86_64 is missing (scripts/install-deps.sh installs qemu-user)"
elif [ "$(uname -m)" != x86_64 ]; then
    fail "this test emulates x86-64 CPUs and runs on x86-64 hosts only"
else
    opt=$(make -s -C "$TPGEN_ROOT" print-opt 2>/dev/null)
    out=$(timeout 120 qemu-x86_64 -cpu Westmere "$TPGEN" --version 2>&1); rc=$?
    out=$(echo "$out" | grep -v '^qemu-x86_64: warning')
    if [ $rc -eq 1 ] && echo "$out" | grep -q 'tpgen: error: this CPU lacks AVX, AVX2, FMA' \
        && echo "$out" | grep -q 'make OPT=' && echo "$out" | grep -qF -- "$opt"; then
        ok "a CPU without AVX2/FMA gets an error naming them and the rebuild (rc 1, no SIGILL)"
    else
        fail "Westmere (rc $rc): $out"
    fi
    out=$(timeout 120 qemu-x86_64 -cpu Haswell "$TPGEN" --version 2>&1 | grep -v '^qemu-x86_64: warning'); rc=$?
    echo "$out" | grep -q '^tpgen [0-9]' && ok "an AVX2 CPU (Haswell) runs it" || fail "Haswell: $out"
fi

out=$(TPGEN_NO_AVX512=1 "$TPGEN" bench gemm --quick --reps 1 --m 8 --threads 1 2>&1)
echo "$out" | grep -q 'AVX512-BF16 kernel: not available' && ok "TPGEN_NO_AVX512=1 switches the AVX512-BF16 kernels off" \
    || fail "TPGEN_NO_AVX512: $(echo "$out" | head -2)"
# the portable GEMM's micro-kernel: AVX-512F when the CPU has it (also with =1), AVX2 with TPGEN_NO_AVX512=2
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then k2=avx2; else k2=scalar; fi
if grep -qw avx512f /proc/cpuinfo; then k1=avx512f; else k1=$k2; fi
for v in 1 2; do
    want=$k1; [ $v = 2 ] && want=$k2
    out=$(TPGEN_NO_AVX512=$v "$TPGEN" bench gemm --quick --reps 1 --m 8 --threads 1 2>&1)
    echo "$out" | grep -q "; portable kernel: $want;" && ok "TPGEN_NO_AVX512=$v: the portable GEMM runs its $want kernel" \
        || fail "TPGEN_NO_AVX512=$v, expected the $want kernel: $(echo "$out" | head -1)"
done
# the GEMM op tests (double references) with the AVX512-BF16 kernels off from the start, as on a CPU without
# them, and (=2) with the portable GEMM's AVX-512F kernel off too, as on an AVX2-only CPU
# gemm_op_tests VAR=VALUE WHAT: the GEMM op tests under that setting pass (at least 5 of them); WHAT names the
# check
gemm_op_tests() {
    local out n
    out=$(env "$1" "$TPGEN_TESTS" ops_gemm 2>&1)
    n=$(echo "$out" | grep -c '^ok - ops_gemm')
    if echo "$out" | grep -q '^# unit np=1: [0-9]* passed, 0 failed' && [ "$n" -ge 5 ]; then
        ok "$2 ($n tests)"
    else
        fail "GEMM op tests with $1: $(echo "$out" | grep -v '^ok' | head -5)"
    fi
}
for v in 1 2; do gemm_op_tests TPGEN_NO_AVX512=$v "GEMM op tests pass with TPGEN_NO_AVX512=$v"; done

# the vdpbf16ps kernels are the default where they outrun f32 FMAs (AMD), not on Intel's cores (half the FMA
# rate: docs/cpu-backend.md); TPGEN_BF16_DOT=1/0 overrides, and the GEMM op tests pass on either default
if grep -qw avx512_bf16 /proc/cpuinfo; then
    vendor=$(sed -n 's/^vendor_id\s*: //p' /proc/cpuinfo | head -1)
    want="not the default"; [ "$vendor" = AuthenticAMD ] && want="the default"
    out=$("$TPGEN" bench gemm --quick --reps 1 --m 8 --threads 1 2>&1 | head -1)
    echo "$out" | grep -q "AVX512-BF16 kernel: yes, $want" && ok "on this $vendor CPU the vdpbf16ps kernels are $want" \
        || fail "$vendor, expected '$want': $out"
    for v in 1 0; do
        want="not the default"; [ $v = 1 ] && want="the default"
        out=$(TPGEN_BF16_DOT=$v "$TPGEN" bench gemm --quick --reps 1 --m 8 --threads 1 2>&1 | head -1)
        echo "$out" | grep -q "AVX512-BF16 kernel: yes, $want" || fail "TPGEN_BF16_DOT=$v: $out"
        gemm_op_tests TPGEN_BF16_DOT=$v "TPGEN_BF16_DOT=$v makes the vdpbf16ps kernels $want; the GEMM op tests pass"
    done
fi

nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [ -n "$nvcc" ]; then
    gen=$(make -s -C "$TPGEN_ROOT" print-cuda-gencode)
    have=$("$nvcc" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_//p')
    want=""
    for a in 80 89 90 100 120; do echo "$have" | grep -qx "$a" && want="$want $a"; done
    good=1
    for a in $want; do echo "$gen" | grep -q "code=sm_$a\b" || good=0; done
    want=${want# }
    newest=${want##* }
    echo "$gen" | grep -q "arch=compute_$newest,code=compute_$newest" || good=0
    [ $good = 1 ] && [ -n "$want" ] && ok "CUDA: SASS for sm_${want// /, sm_} and PTX for compute_$newest" \
        || fail "CUDA gencode '$gen' for nvcc archs: $(echo $have)"
else
    gen=$(make -s -C "$TPGEN_ROOT" print-cuda-gencode)
    [ -z "$gen" ] && ok "no nvcc: no CUDA targets" || fail "no nvcc, yet gencode '$gen'"
fi
