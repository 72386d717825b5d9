#!/usr/bin/env bash
# The CUDA backend's one-shot check on a GPU machine (one H100/H200, 15 minutes
# of device time in all, at most 10 a command: the whole check is meant to take
# under 8). Every step prints one row "ok|FAIL|SKIP  TIME  NAME  DETAIL" and its
# full output goes to its own log in the out folder; any FAIL row makes the exit
# status non-zero, and a FAIL row shows the last lines of its log.
#
# Order: the five cheapest checks first, so that a broken machine or bundle costs
# seconds (nvidia-smi; the plugin's ldd; memory and transfers; one NCCL rank; the
# CUDA op tests, one process each, against the CPU backend); if one of those
# fails, the script stops there. Then the golden checks with --backend cuda
# (flux2-tiny-a transformer cases f32/bf16, flux2-gguf Q4_K and mixed, the
# denoising loop, klein-tiny end to end and editing, the vae-tiny decoder);
# tp 2 and tp 4 on one GPU (--comm mpi: ranks share the GPU, device buffers
# staged through the host); production shapes against the CPU backend (the
# klein-4B attention S = 4608, 24 heads x 128 and GEMMs; the VAE attention
# 16384 tokens x 512); last the throughput steps (GEMM and attention next to
# PyTorch matmul/SDPA on the same shapes, one klein-4B-shaped forward).
#
# Debugging aids on for every correctness step: TPGEN_CUDA_SYNC=1 (a sync after
# every kernel launch: a fault names its kernel), TPGEN_CUDA_POISON=1 (pool
# memory filled with NaN when handed out, so uninitialised reads show),
# NCCL_DEBUG=WARN with a single-node NCCL environment. The throughput steps run
# without the first two.
#
# usage
#   scripts/gpu-check.sh --prepare
#       on the build host: builds for sm_90 (out/gpu-build, incremental) with
#       the non-MPI libraries linked statically, strips the binaries, and packs
#       them, the Open MPI runtime and the shared libraries a bare CUDA image
#       lacks into out/gpu-bundle.tar.xz (xz -9e; out/ is git-ignored: carry it).
#       Then prints the tree the device tool sends, the bundle and their sum,
#       and refuses (exit 1, the bundle renamed *.too-big) over the budget.
#   scripts/gpu-check.sh --size [BUNDLE]
#       only the size report (default bundle out/gpu-bundle.tar.xz).
#   scripts/gpu-check.sh [--bundle FILE | --build DIR] [--golden DIR] [--out DIR]
#       the check. --bundle: the binaries of --prepare; --build: those of a
#       build folder (build/ for a dry run here); neither: builds into
#       build-gpu (needs this project's Debian packages there). DIR is the
#       golden folder (default: tests/data/golden unpacked into build/golden).
#
# With the device tool (see docs/cuda.md and the README's GPU section):
#   scripts/gpu-check.sh --prepare
#   run(command="scripts/gpu-check.sh --bundle out/gpu-bundle.tar.xz", carry=["out/gpu-bundle.tar.xz"], timeout_s=600)
#
# Environment: GPU_CHECK_BACKEND=cpu is the dry run: every step that needs a GPU
# is a SKIP row, the golden and multi-rank steps run on the CPU backend, and the
# exit status is 0 when they pass (tests/sh/gpu_check.sh runs it).
# GPU_CHECK_BUDGET_MIB (default 62) is the size budget; BENCH_FORWARD_ARGS is
# passed to `tpgen bench forward` (default: klein-4B widths at 1024x1024,
# 5 + 20 blocks, bf16, random weights); GPU_CHECK_ONLY=REGEX runs only the steps
# whose names match (the rest are not listed); GPU_CHECK_DEADLINE_S (default 540)
# is when the remaining steps become "not run" FAIL rows, so that the summary is
# printed before the device tool's 600 s limit.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

mode=run golden="" bundle="" outdir="" builddir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) mode=prepare ;;
        --size) mode=size; if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then bundle=$2; shift; fi ;;
        --golden) golden=$2; shift ;;
        --bundle) bundle=$2; shift ;;
        --build) builddir=$2; shift ;;
        --out) outdir=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
SM90="-O2 -std=c++17 -I. $(mpicc --showme:compile 2>/dev/null) -Xcompiler -Wall -gencode arch=compute_90,code=sm_90"

# ------------------------------------------------------------------ the size budget
# What the device tool sends: tracked files that exist plus untracked files git
# does not ignore (apparent sizes), and the carried bundle; 64 MiB at most,
# GPU_CHECK_BUDGET_MIB (62) leaves room for what the session adds.
tree_bytes() {
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
        (cd "$ROOT" && xargs -0 -r stat -c %s -- 2>/dev/null) | awk '{ s += $1 } END { printf "%d\n", s }'
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
size_report() { # size_report BUNDLE: prints the three figures; 1 over the budget
    local b=$1 budget=${GPU_CHECK_BUDGET_MIB:-62} t s
    t=$(tree_bytes)
    s=0; [ -f "$b" ] && s=$(stat -c %s "$b")
    local sum=$((t + s)) lim=$((budget * 1048576))
    echo "gpu-check size: tree $(mib "$t") ($t bytes, git ls-files, tracked + untracked not ignored)"
    echo "gpu-check size: bundle $(mib "$s") ($s bytes, $b$([ -f "$b" ] || echo ': missing'))"
    if [ $sum -gt $lim ]; then
        echo "gpu-check size: sum $(mib $sum) > budget $budget MiB: FAIL (the device tool sends 64 MiB at most)"
        return 1
    fi
    echo "gpu-check size: sum $(mib $sum) <= budget $budget MiB: ok ($(mib $((lim - sum))) headroom)"
}
if [ $mode = size ]; then
    size_report "${bundle:-out/gpu-bundle.tar.xz}"
    exit $?
fi

# build the CUDA binaries into $1 with extra make arguments; then the bench tool
build_into() {
    local dir=$1; shift
    make -j"$(nproc)" BUILD="$dir" CUDA=1 NVFLAGS="$SM90" "$@" || return 1
    local cflags libs objs
    cflags=$(make -s --no-print-directory BUILD="$dir" CUDA=1 "$@" --eval 'tpgen-print-%: ; @echo $($*)' tpgen-print-CFLAGS)
    libs=$(make -s --no-print-directory BUILD="$dir" CUDA=1 "$@" --eval 'tpgen-print-%: ; @echo $($*)' tpgen-print-LDLIBS)
    libs="$libs $(make -s --no-print-directory BUILD="$dir" CUDA=1 "$@" --eval 'tpgen-print-%: ; @echo $($*)' tpgen-print-CUDA_LIBS)"
    objs=$(find "$dir" -name '*.o' ! -path "$dir/tests/*" ! -path "$dir/cli/main.o")
    # shellcheck disable=SC2086
    ${CC:-gcc} $cflags -o "$dir/cuda_bench" cli/bench/cuda/cuda_bench.c $objs $libs
}

if [ $mode = prepare ]; then
    BD=out/gpu-build B=out/gpu-bundle
    # everything but MPI, CUDA and the C/C++ runtimes linked statically, libmicrohttpd too: its
    # HTTPS half (GnuTLS, which alone pulls 9 libraries, ~1.9 MB of the bundle) is unreachable,
    # tpgen never asks for TLS, so its GnuTLS symbols are stubs that abort
    # (gnutls_global_init/deinit, called by libmicrohttpd's constructor, succeed)
    mkdir -p "$BD"
    mhd=$(ls /usr/lib/x86_64-linux-gnu/libmicrohttpd.a 2>/dev/null)
    mhd_libs="-Wl,-Bdynamic -lmicrohttpd"
    if [ -n "$mhd" ]; then
        { echo '#include <stdio.h>'; echo '#include <stdlib.h>'
          nm "$mhd" | awk '$1 == "U" && $2 ~ /^gnutls_/ { print $2 }' | sort -u |
              awk '/^gnutls_global_/ { printf "int %s(void) { return 0; }\n", $1; next }   # MHD_init / MHD_fini
                   { printf "void %s(void) { fputs(\"tpgen: %s: no TLS in the GPU bundle\\n\", stderr); abort(); }\n", $1, $1 }'
        } > out/gnutls_stubs.c
        ${CC:-gcc} -O2 -c -o out/gnutls_stubs.o out/gnutls_stubs.c || exit 1
        mhd_libs="-lmicrohttpd $ROOT/out/gnutls_stubs.o"
    fi
    static="-Wl,-Bstatic -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lgfortran -lquadmath -lyaml -ljansson \
-lpcre2-8 -lutf8proc -lnettle -lpng -ljpeg -lz $mhd_libs -Wl,-Bdynamic -lm -fopenmp $(mpicc --showme:link)"   # CUDA: only the plugin links it
    rm -f "$BD/tpgen" "$BD/tpgen_tests" "$BD/cuda_bench" "$BD/libtpgen-cuda.so"   # relinked with these flags every time
    build_into "$BD" LDLIBS="$static" || { echo "gpu-check --prepare: build failed" >&2; exit 1; }
    if ldd "$BD/tpgen" | grep -q libgnutls; then echo "gpu-check --prepare: tpgen still needs GnuTLS" >&2; exit 1; fi
    rm -rf "$B" && mkdir -p "$B/build" "$B/lib" "$B/usr/bin" "$B/usr/share" "$B/usr/lib/x86_64-linux-gnu"
    # stripped: symbols stay in .dynsym (the plugin calls back into the binary, -rdynamic)
    for f in tpgen tpgen_tests cuda_bench; do strip --strip-all -o "$B/build/$f" "$BD/$f" || exit 1; done
    strip --strip-unneeded -o "$B/build/libtpgen-cuda.so" "$BD/libtpgen-cuda.so" || exit 1
    # shared libraries outside glibc, the C++ runtime and CUDA (MPI and its helpers, libgomp); they need glibc >= 2.36
    ldd "$BD/tpgen_tests" "$BD/tpgen" "$BD/libtpgen-cuda.so" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;  # the machine's own
            libcuda*|libcublas*|libcudart*|libnccl*) ;;  # the machine's CUDA
            *) strip --strip-unneeded -o "$B/lib/$(basename "$lib")" "$lib" ;;
        esac
    done
    # the Open MPI runtime (plugins, help texts, orted for singleton runs, mpirun), relocated with OPAL_PREFIX;
    # without the headers, the Fortran/C++/Java bindings and the compiler wrappers' data
    cp -a /usr/lib/x86_64-linux-gnu/openmpi "$B/usr/lib/x86_64-linux-gnu/"
    (cd "$B/usr/lib/x86_64-linux-gnu/openmpi" && rm -rf include lib/*java* lib/*mpifh* lib/*usempi* lib/*mpi_cxx* lib/pkgconfig \
        lib/*.jar lib/*.a lib/*.la)
    cp -a /usr/share/openmpi "$B/usr/share/"
    rm -f "$B"/usr/share/openmpi/*wrapper-data.txt "$B"/usr/share/openmpi/mpif*.txt
    cp -L /usr/bin/orted "$B/usr/bin/"
    cp -L "$(command -v mpirun)" "$B/usr/bin/mpirun"
    rm -f out/gpu-bundle.tar.xz out/gpu-bundle.tar.xz.too-big
    tar -C out -cf - gpu-bundle | xz -9e -T1 > out/gpu-bundle.tar.xz || exit 1
    rm -rf "$B"
    echo "gpu-check: wrote out/gpu-bundle.tar.xz; carry it to the GPU machine"
    if ! size_report out/gpu-bundle.tar.xz; then
        mv out/gpu-bundle.tar.xz out/gpu-bundle.tar.xz.too-big
        echo "gpu-check --prepare: refused: the device tool would not send tree + bundle (out/gpu-bundle.tar.xz.too-big kept for a look)" >&2
        exit 1
    fi
    exit 0
fi

# ------------------------------------------------------------------ on the GPU machine (or the dry run)
OUTDIR=${outdir:-${OUT:-$ROOT/gpu-out}}
mkdir -p "$OUTDIR"
S=$OUTDIR/summary.txt
: >"$S"
BK=${GPU_CHECK_BACKEND:-cuda}
DRY=false; [ "$BK" = cpu ] && DRY=true
NSTEP=0 NFAIL=0 NOK=0 NSKIP=0
T0=$(date +%s.%N)
NOTE=$OUTDIR/.note
note() { printf '%s' "$*" >"$NOTE"; }
now() { date +%s.%N; }
# step NAME FN ARGS...: run FN ARGS (stdout and stderr to the step's log); FN
# returns 0 (ok), 77 (SKIP) or anything else (FAIL) and may leave a one-line
# detail with note. One row per step, with its wall time.
step() {
    local name=$1; shift
    if [ -n "${GPU_CHECK_ONLY:-}" ] && ! echo "$name" | grep -qE -- "$GPU_CHECK_ONLY"; then return 0; fi
    NSTEP=$((NSTEP + 1))
    if [ "$(awk -v a="$T0" -v b="$(now)" 'BEGIN { print (b - a > '"${GPU_CHECK_DEADLINE_S:-540}"') }')" = 1 ]; then
        # the device tool kills a command at 600 s: the rows must be out before
        NFAIL=$((NFAIL + 1))
        printf '%-4s %7s    %-56s %s\n' FAIL - "$name" "not run: past GPU_CHECK_DEADLINE_S (${GPU_CHECK_DEADLINE_S:-540} s)" | tee -a "$S"
        return 0
    fi
    LOG=$OUTDIR/$(printf '%02d' $NSTEP)-$(echo "$name" | tr -c 'A-Za-z0-9.' '-' | tr -s '-' | sed 's/-$//' | cut -c1-48).log
    : >"$NOTE"
    local t r st
    t=$(now)
    "$@" >"$LOG" 2>&1
    r=$?
    case $r in 0) st=ok; NOK=$((NOK + 1)) ;; 77) st=SKIP; NSKIP=$((NSKIP + 1)) ;; *) st=FAIL; NFAIL=$((NFAIL + 1)) ;; esac
    [ $st = FAIL ] && [ ! -s "$NOTE" ] && note "exit $r"
    printf '%-4s %7.1f s  %-56s %s\n' $st "$(awk -v a="$t" -v b="$(now)" 'BEGIN { print b - a }')" "$name" \
        "$(head -c 400 "$NOTE" | tr '\n' ' ')" | tee -a "$S"
    if [ $st = FAIL ]; then
        echo "             log $LOG:" | tee -a "$S"
        grep -v '^$' "$LOG" | tail -6 | cut -c1-240 | sed 's/^/             | /' | tee -a "$S"
    fi
    return 0
}
dry_skip() { note "dry run (GPU_CHECK_BACKEND=cpu): needs a GPU"; return 77; }
finish() {
    local t
    t=$(awk -v a="$T0" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }')
    echo "gpu-check: $NOK ok, $NFAIL FAIL, $NSKIP SKIP in $t s$($DRY && echo ' (dry run: GPU_CHECK_BACKEND=cpu)'); logs in $OUTDIR" | tee -a "$S"
    rm -f "$NOTE"
    [ "$NFAIL" -eq 0 ] && [ "$NOK" -gt 0 ]
    exit $?
}

{
    echo "== environment"; date; uname -a
    nvidia-smi -L || true
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    command -v nvcc && nvcc --version | tail -2
    command -v mpicc mpirun || echo "no system MPI"
} >"$OUTDIR/env.log" 2>&1

# CUDA libraries of the machine: the toolkit's, else the Python wheels' (nvidia-*)
cudalibs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && cudalibs="$cudalibs:$d"; done
wheels=$(python3 -c 'import nvidia, os; print(os.pathsep.join(p for p in __import__("glob").glob(os.path.join(list(nvidia.__path__)[0], "*", "lib"))))' 2>/dev/null || true)
[ -n "$wheels" ] && cudalibs="$cudalibs:$wheels"

# a bare image may lack the xz program (tar -J and tests/unpack-golden.sh need it): Python's lzma stands in
if ! command -v xz >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then
    mkdir -p "$OUTDIR/.bin"
    cat >"$OUTDIR/.bin/xz" <<'PY'
#!/usr/bin/env python3
# xz stand-in for gpu-check (decompression only: xz -d / -dc [FILE]), with Python's lzma
import lzma, shutil, sys
files = [a for a in sys.argv[1:] if not a.startswith("-")]
if not any(a.startswith("-") and "d" in a for a in sys.argv[1:]):
    sys.exit("xz stand-in: only decompression (-d) is supported")
src = open(files[0], "rb") if files else sys.stdin.buffer
with lzma.open(src) as f:
    shutil.copyfileobj(f, sys.stdout.buffer)
PY
    chmod +x "$OUTDIR/.bin/xz"
    export PATH=$OUTDIR/.bin:$PATH
    echo "no xz program: Python's lzma stands in ($OUTDIR/.bin/xz)" >>"$OUTDIR/env.log"
fi

# ---- the binaries
unpack_bundle() {
    rm -rf /tmp/tpgen-bundle && mkdir -p /tmp/tpgen-bundle && tar -C /tmp/tpgen-bundle -xJf "$bundle" || return 1
    note "prebuilt bundle $bundle (sm_90, $(du -h "$bundle" | cut -f1))"
}
build_here() {
    build_into "$BUILD_DIR" || { note "see the log (or use --prepare and --bundle)"; return 1; }
    note "sm_90, $(grep -c 'warning' "$LOG") warnings"
}
use_build() {
    for f in tpgen tpgen_tests; do [ -x "$BUILD_DIR/$f" ] || { note "$BUILD_DIR/$f is missing"; return 1; }; done
    note "binaries of $BUILD_DIR"
}
if [ -n "$bundle" ]; then
    step "binaries: unpack the bundle" unpack_bundle
    BB=/tmp/tpgen-bundle/gpu-bundle
    BUILD_DIR=$BB/build
    export OPAL_PREFIX=$BB/usr PATH=$BB/usr/bin:$PATH
    export LD_LIBRARY_PATH=$BB/lib:$BB/usr/lib/x86_64-linux-gnu/openmpi/lib${cudalibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OMPI_MCA_mca_base_component_show_load_errors=0
elif [ -n "$builddir" ]; then
    BUILD_DIR=$(cd "$builddir" && pwd)
    export LD_LIBRARY_PATH=${cudalibs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    step "binaries: $builddir" use_build
else
    BUILD_DIR=$ROOT/build-gpu
    export LD_LIBRARY_PATH=${cudalibs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    step "binaries: build for sm_90" build_here
fi
[ $NFAIL -eq 0 ] || finish
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# debugging aids (docs/cuda.md): fault names its kernel, reused pool memory is NaN, NCCL warnings, one node
export TPGEN_CUDA_SYNC=1 TPGEN_CUDA_POISON=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN} NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
TPGEN=$BUILD_DIR/tpgen
TESTS=$BUILD_DIR/tpgen_tests
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

# ---- the five cheapest checks: a failure here stops the script
s_smi() {
    $DRY && { dry_skip; return; }
    nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || return 1
    CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    note "$CARD"
}
s_ldd() {
    local f=$BUILD_DIR/libtpgen-cuda.so
    [ -e "$f" ] || { note "$f is missing"; return 1; }
    ldd "$f" "$TPGEN" "$TESTS" || return 1
    local miss
    miss=$(ldd "$f" "$TPGEN" "$TESTS" | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
    [ -z "$miss" ] || { note "not found: $miss"; return 1; }
    note "every library found ($(ldd "$f" | grep -oE 'lib(cudart|cublas|cublasLt|nccl)\.so[.0-9]*' | sort -u | tr '\n' ' '))"
}
gpu_test() { # gpu_test NAME: one TEST_GPU test in its own process (a fault poisons the CUDA context)
    $DRY && { dry_skip; return; }
    timeout 180 "$TESTS" --gpu "$1"
    local r=$?
    grep -qE "^ok - $1( |$)" "$LOG" || {
        note "$(grep -E "^FAIL - " "$LOG" | head -1 | cut -c1-300)"
        [ -s "$NOTE" ] || note "the test process died (exit $r): $(grep -v '^$' "$LOG" | tail -1 | cut -c1-200)"
        return 1
    }
    local worst
    worst=$(grep '^# op ' "$LOG" | sed -E 's/.*rel_l2=([^ ]+).*/\1 &/' | sort -g | tail -1 | cut -d' ' -f2- | sed -E 's/^# op +//; s/ +/ /g')
    note "${worst:+largest: $worst}"
    [ $r -eq 0 ]
}
CARD="(no GPU: dry run)"
step "nvidia-smi" s_smi
step "plugin ldd (libtpgen-cuda.so, tpgen, tpgen_tests)" s_ldd
step "GPU memory and transfers" gpu_test gpu_memory_and_transfers
step "one NCCL rank" gpu_test gpu_nccl_single_rank
s_ops() { # the rest of the TEST_GPU tests, each in its own process; the names of the failing ones
    $DRY && { dry_skip; return; }
    local t n=0 bad="" r
    for t in $("$TESTS" --gpu --list); do
        case $t in gpu_memory_and_transfers|gpu_nccl_single_rank) continue ;; esac
        n=$((n + 1))
        echo "== $t"
        timeout 180 "$TESTS" --gpu "$t" >"$W/t.log" 2>&1; r=$?
        cat "$W/t.log"
        grep -qE "^ok - $t( |$)" "$W/t.log" || bad="$bad $t$(grep -qE "^FAIL - $t" "$W/t.log" || echo "(died, exit $r)")"
    done
    [ $n -gt 0 ] || { note "no TEST_GPU tests listed"; return 1; }
    local worst
    worst=$(grep '^# op ' "$LOG" | sed -E 's/.*rel_l2=([^ ]+).*/\1 &/' | sort -g | tail -1 | cut -d' ' -f2- | sed -E 's/^# op +//; s/ +/ /g')
    [ -z "$bad" ] || { note "failing:$bad"; return 1; }
    note "$n tests; largest op error: ${worst:-none}"
}
step "CUDA op tests against the CPU backend" s_ops
[ $NFAIL -eq 0 ] || { echo "gpu-check: a cheap check failed; stopping here" | tee -a "$S"; finish; }

# ---- golden checks (--backend cuda; the CPU backend in the dry run)
if [ -z "$golden" ]; then
    golden=$ROOT/build/golden
    s_unpack() { tests/unpack-golden.sh "$golden" && note "into $golden"; }
    step "golden data: unpack and check" s_unpack
fi
export TPGEN_GOLDEN=$golden
need() { # need DIR...: the golden sets a step reads
    local d
    for d in "$@"; do [ -e "$d" ] || { note "golden set missing: $d"; return 1; }; done
}
verdict() { # the last PASS/FAIL line of the log as the note; 0 on PASS
    local line
    line=$(grep -E 'max_rel_err|rel_err=|max_abs=|error' "$LOG" | tail -1 | cut -c1-200)
    note "${line:-no result}"
    echo "$line" | grep -q PASS && ! echo "$line" | grep -q FAIL
}
G=$golden/flux2-tiny-a
s_cases() { # s_cases PREC [NP [COMM]]: flux2-tiny-a's transformer cases, NP ranks (tp NP), --comm COMM
    need "$G/model" "$G/transformer_cases.safetensors" || return 1
    local np=${2:-1}
    if [ "$np" -gt 1 ]; then
        timeout 240 $MPIRUN -np "$np" "$TPGEN" check --model "$G/model" --cases "$G/transformer_cases.safetensors" \
            --precision "$1" --backend "$BK" --comm "${3:-auto}"
    else
        timeout 120 "$TPGEN" check --model "$G/model" --cases "$G/transformer_cases.safetensors" --precision "$1" --backend "$BK"
    fi
    local r=$?
    verdict && [ $r -eq 0 ]
}
for prec in f32 bf16; do step "golden transformer cases tp 1 ($prec)" s_cases $prec; done
GG=$golden/flux2-gguf
s_gguf() { # s_gguf VARIANT PREC: GGUF kept quantised on the GPU against diffusers on gguf-py's dequantised weights
    need "$GG/$1" "$GG/transformer_cases.safetensors" "$GG/gguf_cases.safetensors" || return 1
    local tol=1e-5; [ "$2" = bf16 ] && tol=3e-2
    timeout 120 "$TPGEN" check --model "$GG/$1" --cases "$GG/transformer_cases.safetensors" \
        --outputs "$GG/gguf_cases.safetensors" --prefix "$1" --precision "$2" --tol $tol --backend "$BK"
    local r=$?
    verdict && [ $r -eq 0 ]
}
for v in Q4_K mixed; do for prec in f32 bf16; do step "golden flux2-gguf $v tp 1 ($prec)" s_gguf $v $prec; done; done

compare() { # compare FILE GOLDEN_FILE KEY TOL: rel L2 of FILE's (only) tensor against GOLDEN_FILE's KEY (plain python3)
    python3 - "$@" <<'PY' 2>&1
import json, math, struct, sys
def load(path, key=None):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        hdr.pop("__metadata__", None)
        name = key or ("latents" if "latents" in hdr else next(iter(hdr)))
        t = hdr[name]
        b, e = t["data_offsets"]
        f.seek(8 + n + b)
        raw = f.read(e - b)
    if t["dtype"] == "F32":
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if t["dtype"] == "BF16":
        return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    raise SystemExit(f"unsupported dtype {t['dtype']} in {path}")
got, gold, key, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
a, b = load(got), load(gold, key)
if len(a) != len(b):
    print(f"size mismatch {len(a)} vs {len(b)} FAIL"); sys.exit(1)
e = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(y * y for y in b))
print(f"rel_err={e:.3e} tol={tol:g} {'PASS' if e <= tol else 'FAIL'}")
PY
}
s_gen() { # s_gen LATENTS GOLDEN_FILE KEY TOL NEED -- generate args...
    local lat=$1 gold=$2 key=$3 tol=$4 dir=$5; shift 6
    need "$dir" "$gold" || return 1
    rm -f "$lat"
    timeout 180 "$TPGEN" generate "$@" --backend "$BK" --save-latents "$lat"
    local r=$?
    [ -s "$lat" ] || { note "no latents (generate exit $r)"; return 1; }
    compare "$lat" "$gold" "$key" "$tol"
    verdict && [ $r -eq 0 ]
}
# the golden sets drew their noise with torch 1.13: every golden run starts from its stored initial_latents
for prec in f32 bf16; do
    tol=1e-4; [ $prec = bf16 ] && tol=3e-2
    step "golden denoise flux2-tiny-a ($prec)" s_gen "$W/den_$prec.safetensors" "$G/denoise.safetensors" final_packed_latents $tol \
        "$G/model" -- --model "$G/model" --prompt-embeds "$G/denoise.safetensors:prompt_embeds" \
        --initial-latents "$G/denoise.safetensors" --steps 4 --guidance 4 --width 96 --height 64 --precision $prec --no-decode
done
K=$golden/klein-tiny
# end to end: Qwen3 text encoder + transformer
step "golden e2e klein-tiny case0 (f32)" s_gen "$W/e2e.safetensors" "$K/e2e.safetensors" case0.final_packed_latents 1e-4 \
    "$K/model" -- --model "$K/model" --prompt "a cat holding a sign that says hello" --initial-latents "$K/e2e.safetensors:case0.initial_latents" --steps 4 --width 96 --height 64 \
    --max-sequence-length 32 --precision f32 --no-decode
E=$golden/klein-tiny-edit
# editing: VAE encoder (op_conv2d_down) + reference tokens
step "golden edit klein-tiny-edit case1 (f32)" s_gen "$W/edit.safetensors" "$E/edit.safetensors" case1.final_packed_latents 1e-4 \
    "$E/refs" -- --model "$K/model" --prompt-embeds "$E/edit.safetensors:case1.prompt_embeds" --initial-latents "$E/edit.safetensors:case1.initial_latents" --steps 4 --width 64 --height 64 \
    --image "$E/refs/r0_64x80.png" --image "$E/refs/r1_100x70.png" --precision f32 --no-decode

V=$golden/vae-tiny
compare_png() { # PNG (8-bit RGB, as tpgen writes) against GOLDEN_FILE's KEY [H,W,3] u8: max and mean |diff| (plain python3)
    python3 - "$@" <<'PY' 2>&1
import json, struct, sys, zlib
png, gold, key = sys.argv[1], sys.argv[2], sys.argv[3]
data = open(png, "rb").read()
pos, idat, w, h = 8, b"", 0, 0
while pos < len(data):
    n, typ = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if typ == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        if depth != 8 or ctype != 2: raise SystemExit(f"unexpected PNG format depth {depth} colour {ctype} FAIL")
    elif typ == b"IDAT": idat += body
    pos += 12 + n
raw, stride, prev, img = zlib.decompress(idat), w * 3, bytearray(w * 3), bytearray()
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - 3] if i >= 3 else 0
        b, c = prev[i], prev[i - 3] if i >= 3 else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    img += line
    prev = line
with open(gold, "rb") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]
    t = json.loads(fh.read(n))[key]
    fh.seek(8 + n + t["data_offsets"][0]); ref = fh.read(t["data_offsets"][1] - t["data_offsets"][0])
if len(ref) != len(img): raise SystemExit(f"size mismatch: png {w}x{h}, golden {t['shape']} FAIL")
d = [abs(x - y) for x, y in zip(img, ref)]
mx, mean = max(d), sum(d) / len(d)
print(f"max_abs={mx} mean_abs={mean:.4f} (u8 levels) {'PASS' if mx <= 2 and mean <= 0.05 else 'FAIL'}")
PY
}
s_vae() { # s_vae CASE [NP]: the VAE decoder (conv, GroupNorm, upsample, the 512-wide attention head)
    need "$V/model" "$V/vae_golden.json" "$V/vae_cases.safetensors" || return 1
    local c=$1 np=${2:-1} hw r
    hw=$(python3 -c "import json; c=json.load(open('$V/vae_golden.json'))['cases'][$c]['image_hw']; print(c[0], c[1])") || return 1
    rm -f "$W/vae$c.png"
    local cmd=("$TPGEN" decode --model "$V/model" --backend "$BK" --precision f32
        --latents "$V/vae_cases.safetensors:case$c.packed_latents" --height "${hw% *}" --width "${hw#* }" --output "$W/vae$c.png")
    if [ "$np" -gt 1 ]; then timeout 180 $MPIRUN -np "$np" "${cmd[@]}"
    else timeout 120 "${cmd[@]}"; fi
    r=$?
    [ -s "$W/vae$c.png" ] || { note "no image (decode exit $r)"; return 1; }
    compare_png "$W/vae$c.png" "$V/vae_cases.safetensors" "case$c.image_u8"
    verdict && [ $r -eq 0 ]
}
for c in 0 1; do step "golden VAE decode vae-tiny case$c (f32)" s_vae $c; done

# ---- more ranks than GPUs, for correctness: tp 2 and tp 4 on one GPU, the MPI communicator through the host
s_share() { # two ranks on one GPU: NCCL refuses them by the GPU's UUID on both (no hang); TPGEN_COMM=mpi sums through the host
    $DRY && { dry_skip; return; }
    timeout 120 $MPIRUN -np 2 "$TESTS" --gpu gpu_ranks_sharing_a_gpu
    local r=$?
    grep -qE '^ok - gpu_ranks_sharing_a_gpu' "$LOG" || { note "$(grep -E '^FAIL - ' "$LOG" | head -1 | cut -c1-300)"; return 1; }
    note "NCCL refused by UUID, staged MPI all-reduce ok"
    [ $r -eq 0 ]
}
step "2 ranks on one GPU: NCCL refused, --comm mpi staged" s_share
for np in 2 4; do
    step "golden transformer cases tp $np --comm mpi (bf16)" s_cases bf16 $np mpi
done
# the band-parallel VAE decode stages its halos and GroupNorm sums through the host: 2 ranks may share the GPU
step "golden VAE decode vae-tiny case1 tp 2 on one GPU (f32)" s_vae 1 2

# ---- the parallel mesh (docs/parallel.md): Ulysses SP and CFG parallelism against one rank, byte for byte,
# two ranks sharing the GPU (--comm mpi); then, on a machine with 4 GPUs, the speed question at FLUX.2-dev widths
s_mesh_exact() { # s_mesh_exact: make-tiny klein (--sp 2) and klein base (--cfg-parallel) against one rank
    local m=$W/mesh-tiny r=0 bad=""
    rm -rf "$m"
    "$TPGEN" make-tiny --out "$m" --seed 1 >/dev/null || { note "make-tiny failed"; return 1; }
    local args=(--model "$m" --prompt "a fox" --width 48 --height 32 --steps 2 --backend "$BK" --precision bf16 --no-decode)
    timeout 120 "$TPGEN" generate "${args[@]}" --save-latents "$W/mesh1.st" || r=1
    TPGEN_COMM=mpi timeout 120 $MPIRUN -np 2 "$TPGEN" generate "${args[@]}" --sp 2 --save-latents "$W/mesh2.st" || r=1
    cmp -s "$W/mesh1.st" "$W/mesh2.st" || bad="$bad sp2"
    # one image token over 2 ranks: rank 1 holds no image row (zero-row tensors and kernels on the GPU)
    timeout 120 "$TPGEN" generate "${args[@]}" --width 16 --height 16 --save-latents "$W/mesh5.st" || r=1
    TPGEN_COMM=mpi timeout 120 $MPIRUN -np 2 "$TPGEN" generate "${args[@]}" --width 16 --height 16 --sp 2 \
        --save-latents "$W/mesh6.st" || r=1
    cmp -s "$W/mesh5.st" "$W/mesh6.st" || bad="$bad sp2-one-token"
    python3 -c 'import json,sys; p=sys.argv[1]; j=json.load(open(p)); j["is_distilled"]=False; json.dump(j, open(p,"w"))' \
        "$m/model_index.json" || r=1
    timeout 120 "$TPGEN" generate "${args[@]}" --guidance 3 --save-latents "$W/mesh3.st" || r=1
    TPGEN_COMM=mpi timeout 120 $MPIRUN -np 2 "$TPGEN" generate "${args[@]}" --guidance 3 --cfg-parallel \
        --save-latents "$W/mesh4.st" || r=1
    cmp -s "$W/mesh3.st" "$W/mesh4.st" || bad="$bad cfg-parallel"
    if [ -n "$bad" ]; then note "differs from one rank:$bad (a GPU kernel whose rows depend on how many come together?)"; return 1; fi
    note "--sp 2 (also a one-token image) and --cfg-parallel = one rank, byte for byte (bf16)"
    [ $r -eq 0 ]
}
step "mesh on one GPU: --sp 2, --cfg-parallel = one rank (--comm mpi)" s_mesh_exact
s_mesh_speed() { # tp 4 vs sp 4 vs tp 2 x sp 2, one FLUX.2-dev-wide forward (2 + 2 blocks), 4096 + 512 tokens, bf16
    $DRY && { dry_skip; return; }
    local n
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    [ "$n" -ge 4 ] || { note "needs 4 GPUs, this machine has $n: docs/parallel.md's table stays a projection"; return 77; }
    local sp line out=""
    for sp in 1 4 2; do
        line=$(TPGEN_CUDA_SYNC=0 TPGEN_CUDA_POISON=0 timeout 150 $MPIRUN -np 4 "$TPGEN" bench forward --backend cuda \
            --widths dev --precision bf16 --image-tokens 4096 --text-tokens 512 --double 2 --single 2 --iters 3 --warmup 1 \
            --sp $sp | grep -E '^bf16 .* fused ' | head -1) || return 1
        echo "$line"
        out="$out sp$sp: $(echo "$line" | grep -oE '[0-9.]+ s/forward') $(echo "$line" | grep -oE 'sent [0-9.]+ MB/rank');"
    done
    note "$CARD:$out"
}
step "mesh speed: tp 4 vs sp 4 vs tp 2 x sp 2 (FLUX.2-dev widths)" s_mesh_speed

# ---- production shapes against the CPU backend (bf16 tolerance)
s_shapes() { # the dry run: a CPU backend stands in for the GPU, tokens / 8 (VAE / 16): the tool's own check
    local fake=""
    if $DRY; then
        [ -x "$BUILD_DIR/cuda_bench" ] || { note "dry run: no cuda_bench in $BUILD_DIR (--bundle has one)"; return 77; }
        fake=cpu
    fi
    [ -x "$BUILD_DIR/cuda_bench" ] || { note "$BUILD_DIR/cuda_bench is missing"; return 1; }
    CUDA_BENCH_BACKEND=$fake timeout 300 "$BUILD_DIR/cuda_bench" verify "$@"
    local r=$?
    note "$($DRY && echo 'CPU stand-in, shapes / 8-16: ')$(grep -E '^verify' "$LOG" | awk '{ print $2, $3, $NF }' | tr '\n' ' ')"
    [ $r -eq 0 ] && ! grep -q '^verify.*FAIL' "$LOG" && grep -q '^verify' "$LOG"
}
step "klein-4B widths vs CPU (1+1 blocks, attention, GEMMs)" s_shapes block
step "VAE attention vs CPU (16384 tokens x 512)" s_shapes vae

# ---- throughput (no per-launch sync, no poisoning)
s_bench() {
    $DRY && { dry_skip; return; }
    TPGEN_CUDA_SYNC=0 TPGEN_CUDA_POISON=0 timeout 150 "$BUILD_DIR/cuda_bench" "$@" || return 1
    grep -q '^bench ' "$LOG" || { note "no bench lines"; return 1; }
    note "$CARD"
}
s_torch() {
    $DRY && { dry_skip; return; }
    python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null || { note "no PyTorch with CUDA on this machine"; return 77; }
    timeout 150 python3 - <<'PY' || return 1
import torch, torch.nn.functional as F
def t(fn, it=10):
    for _ in range(3): fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(it): fn()
    b.record(); torch.cuda.synchronize(); return a.elapsed_time(b) / it
print("card", torch.cuda.get_device_name(0), "torch", torch.__version__)
M = 4608
for n, k in [(3072, 3072), (18432, 3072), (3072, 9216), (27648, 3072), (3072, 12288)]:
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16); w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    ms = t(lambda: x @ w.t()); print(f"torch gemm bf16 M={M} N={n} K={k} {ms:.3f} ms {2*M*n*k/ms/1e9:.1f} TFLOP/s")
for s, h, d in [(M, 24, 128), (M, 48, 128), (16384, 1, 512)]:
    q, k, v = (torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ms = t(lambda: F.scaled_dot_product_attention(q, k, v))
    print(f"torch sdpa bf16 S={s} heads={h} hd={d} {ms:.3f} ms {4*s*s*d*h/ms/1e9:.1f} TFLOP/s")
PY
    note "$CARD"
}
FWD=${BENCH_FORWARD_ARGS:---backend cuda --precision bf16 --image-tokens 4096 --text-tokens 512 --double 5 --single 20 --iters 3 --warmup 1}
s_forward() {
    $DRY && { dry_skip; return; }
    # shellcheck disable=SC2086
    TPGEN_CUDA_SYNC=0 TPGEN_CUDA_POISON=0 timeout 200 "$TPGEN" bench forward $FWD || return 1
    note "$CARD: $(grep -v '^$' "$LOG" | tail -1 | cut -c1-200)"
}
step "bench GEMM (op_gemm, bare cuBLAS, fp8)" s_bench gemm 4608
step "bench attention (S 4608, 24 and 48 heads x 128)" s_bench attention 4608
step "PyTorch matmul and SDPA on the same shapes" s_torch
step "bench forward klein-4B widths tp 1" s_forward

# the throughput table: every figure with the card that gave it
for f in "$OUTDIR"/*bench-GEMM*.log "$OUTDIR"/*bench-attention*.log "$OUTDIR"/*PyTorch*.log; do
    [ -e "$f" ] || continue
    grep -E '^(bench|torch) ' "$f" | sed "s|^|     [$CARD] |" | tee -a "$S"
done
finish
