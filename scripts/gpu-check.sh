#!/usr/bin/env bash
# The CUDA backend's one-shot check on a GPU machine (one H200: under 8 minutes,
# unattended). Builds for sm_90, runs the TEST_GPU op tests (every CUDA op
# against the CPU backend), the golden checks with --backend cuda (flux2-tiny-a
# transformer cases f32 and bf16, the flux2-gguf Q4_K and mixed GGUF
# transformers f32 and bf16, its denoising loop, klein-tiny end to end,
# the vae-tiny decoder), GEMM and attention throughput (with PyTorch on the
# same shapes as a yardstick), one klein-4B-shaped forward, and prints a
# short table last.
# Full logs go to $OUT (the device tool's folder) or ./gpu-out.
#
# usage
#   scripts/gpu-check.sh [--golden DIR] [--bundle FILE] [--out DIR]
#       on the GPU machine. DIR is the golden folder (default: the
#       repository's tests/data/golden, unpacked by tests/unpack-golden.sh
#       into build/golden). Without --bundle it builds there (needs the
#       same Debian packages as the build host); with --bundle it uses the
#       binaries and libraries made by --prepare.
#   scripts/gpu-check.sh --prepare
#       on the build host: builds for sm_90 with the non-MPI libraries linked
#       statically, and packs binaries, the Open MPI runtime, the shared
#       libraries a bare CUDA image lacks into out/gpu-bundle.tar.xz (out/ is
#       git-ignored; carry it). The golden data is not bundled: the device
#       tool sends the working tree, tests/data/golden included.
#
# With the device tool (see docs/cuda.md):
#   scripts/gpu-check.sh --prepare
#   run(command="scripts/gpu-check.sh --bundle out/gpu-bundle.tar.xz", carry=["out/gpu-bundle.tar.xz"], timeout_s=600)
# Environment: BENCH_FORWARD_ARGS is passed to `tpgen bench forward` (default:
# klein-4B at 1024x1024, all 5 + 20 blocks, bf16, random weights);
# GPU_CHECK_BACKEND=cpu runs the golden steps on the CPU backend instead (a
# dry run of this script's golden part without a GPU).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

mode=run golden="" bundle="" outdir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) mode=prepare ;;
        --golden) golden=$2; shift ;;
        --bundle) bundle=$2; shift ;;
        --out) outdir=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
SM90="-O2 -std=c++17 -I. $(mpicc --showme:compile 2>/dev/null) -Xcompiler -Wall -gencode arch=compute_90,code=sm_90"

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
    B=out/gpu-bundle
    rm -rf "$B" && mkdir -p "$B/lib" "$B/usr/bin" "$B/usr/share" "$B/usr/lib/x86_64-linux-gnu"
    # everything but MPI, CUDA and the C/C++ runtimes linked statically
    static="-Wl,-Bstatic -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lgfortran -lquadmath -lyaml -ljansson \
-lpcre2-8 -lutf8proc -lnettle -lpng -ljpeg -lz -Wl,-Bdynamic -lmicrohttpd -lm -fopenmp $(mpicc --showme:link)"   # CUDA: only the plugin links it
    build_into "$B/build" LDLIBS="$static" || { echo "gpu-check --prepare: build failed" >&2; exit 1; }
    find "$B/build" \( -name '*.o' -o -name '*.d' \) -delete
    # shared libraries outside glibc, the C++ runtime and CUDA (MPI and its helpers, libgomp); they need glibc >= 2.36
    ldd "$B/build/tpgen_tests" "$B/build/tpgen" "$B/build/libtpgen-cuda.so" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;  # the machine's own
            libcuda*|libcublas*|libcudart*|libnccl*) ;;  # the machine's CUDA
            *) cp -L "$lib" "$B/lib/" ;;
        esac
    done
    # the Open MPI runtime (plugins, help texts, orted for singleton runs, mpirun), relocated with OPAL_PREFIX
    cp -a /usr/lib/x86_64-linux-gnu/openmpi "$B/usr/lib/x86_64-linux-gnu/"
    rm -rf "$B/usr/lib/x86_64-linux-gnu/openmpi/include"
    cp -a /usr/share/openmpi "$B/usr/share/"
    cp -L /usr/bin/orted "$B/usr/bin/"
    cp -L "$(command -v mpirun)" "$B/usr/bin/mpirun"
    tar -C out -cJf out/gpu-bundle.tar.xz gpu-bundle
    rm -rf "$B"
    echo "gpu-check: wrote out/gpu-bundle.tar.xz ($(du -h out/gpu-bundle.tar.xz | cut -f1)); carry it to the GPU machine"
    exit 0
fi

# ------------------------------------------------------------------ on the GPU machine
OUTDIR=${outdir:-${OUT:-$ROOT/gpu-out}}
mkdir -p "$OUTDIR"
S=$OUTDIR/summary.txt
: >"$S"
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$S" >/dev/null; }
log() { echo "== $*"; }
t0=$(date +%s)

{
    log "environment"; date; uname -a
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

if [ -n "$bundle" ]; then
    log "using bundle $bundle" >>"$OUTDIR/build.log"
    rm -rf /tmp/tpgen-bundle && mkdir -p /tmp/tpgen-bundle && tar -C /tmp/tpgen-bundle -xJf "$bundle" || { row build "FAIL (bundle unpack)"; cat "$S"; exit 1; }
    BB=/tmp/tpgen-bundle/gpu-bundle
    BUILD_DIR=$BB/build
    export OPAL_PREFIX=$BB/usr PATH=$BB/usr/bin:$PATH
    export LD_LIBRARY_PATH=$BB/lib:$BB/usr/lib/x86_64-linux-gnu/openmpi/lib${cudalibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OMPI_MCA_mca_base_component_show_load_errors=0
    row build "prebuilt bundle (sm_90)"
else
    BUILD_DIR=$ROOT/build-gpu
    export LD_LIBRARY_PATH=${cudalibs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    bstart=$(date +%s)
    if build_into "$BUILD_DIR" >"$OUTDIR/build.log" 2>&1; then
        row build "ok, sm_90, $(( $(date +%s) - bstart )) s, $(grep -c 'warning' "$OUTDIR/build.log") warnings"
    else
        row build "FAIL (see build.log; or use --prepare/--bundle)"
        tail -20 "$OUTDIR/build.log"; cat "$S"; exit 1
    fi
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
TPGEN=$BUILD_DIR/tpgen
TESTS=$BUILD_DIR/tpgen_tests
if [ -z "$golden" ]; then
    golden=$ROOT/build/golden
    tests/unpack-golden.sh "$golden" >>"$OUTDIR/env.log" 2>&1 || { row golden "FAIL (tests/unpack-golden.sh, see env.log)"; cat "$S"; exit 1; }
fi
export TPGEN_GOLDEN=$golden
BK=${GPU_CHECK_BACKEND:-cuda}
FWD=${BENCH_FORWARD_ARGS:---backend cuda --precision bf16 --image-tokens 4096 --text-tokens 512 --double 5 --single 20 --iters 3 --warmup 1}

# ---- op tests against the CPU backend
log "TEST_GPU tests (CUDA op tests and other areas' GPU tests)" >"$OUTDIR/tests.log"
# one process per test: a kernel fault poisons the CUDA context, and must not hide the other tests' results
rc=0
for t in $("$TESTS" --gpu --list 2>/dev/null); do
    out=$(timeout 120 "$TESTS" --gpu "$t" 2>&1); r=$?
    echo "$out" >>"$OUTDIR/tests.log"
    if ! echo "$out" | grep -qE "^(ok|FAIL) - $t( |$)"; then
        echo "FAIL - $t: the test process died (exit $r): $(echo "$out" | tail -2 | tr '\n' ' ')" >>"$OUTDIR/tests.log"
    fi
    [ $r -ge 124 ] && rc=$r
done
timeout 60 "$TESTS" cuda_ >>"$OUTDIR/tests.log" 2>&1
pass=$(grep -c '^ok - ' "$OUTDIR/tests.log"); failn=$(grep -c '^FAIL - ' "$OUTDIR/tests.log")
verdict=PASS; { [ "$failn" -gt 0 ] || [ "$pass" -eq 0 ] || [ $rc -ge 124 ]; } && verdict=FAIL
row "GPU tests (tpgen_tests --gpu; cuda_ unit)" "$pass passed, $failn failed$([ $rc -ge 124 ] && echo ", exit $rc") $verdict"
fails=$(grep '^FAIL - ' "$OUTDIR/tests.log" | cut -d' ' -f3 | sort -u | head -8 | tr '\n' ' ')
[ -n "$fails" ] && row "  failing tests" "$fails"
worst=$(grep '^# op ' "$OUTDIR/tests.log" | sed -E 's/.*rel_l2=([^ ]+).*/\1 &/' | sort -g | tail -1 | cut -d' ' -f2-)
[ -n "$worst" ] && row "  largest op rel_l2" "$(echo "$worst" | sed -E 's/^# op +//; s/ +/ /g')"

# ---- golden checks with --backend cuda
G=$golden/flux2-tiny-a
{
    for prec in f32 bf16; do
        log "check $prec"
        timeout 120 "$TPGEN" check --model "$G/model" --cases "$G/transformer_cases.safetensors" --precision $prec --backend $BK
        echo "exit=$?"
    done
} >"$OUTDIR/golden.log" 2>&1
for prec in f32 bf16; do
    line=$(awk -v p="== check $prec" '$0==p{on=1;next} /^== /{on=0} on' "$OUTDIR/golden.log" | grep -E 'max_rel_err|error' | tail -1)
    echo "$line" | grep -qE 'PASS' || line="FAIL: ${line:-no result} (see golden.log)"
    row "golden transformer cases ($prec)" "$line"
done
# GGUF weights kept quantised on the GPU (DT_GGML: tiles decoded to f32/bf16, then cuBLAS): the golden flux2-gguf
# Q4_K and mixed (Q6_K, Q4_K, Q8_0, ...) transformers at tp 1 against diffusers' forward on gguf-py's dequantised
# weights, tolerances of tests/sh/gguf_check.sh (CPU: f32 ~4e-7, bf16 without int8 activations ~5.8e-3)
GG=$golden/flux2-gguf
{
    for v in Q4_K mixed; do
        for prec in f32 bf16; do
            tol=1e-5; [ $prec = bf16 ] && tol=3e-2
            log "gguf check $v $prec"
            timeout 120 "$TPGEN" check --model "$GG/$v" --cases "$GG/transformer_cases.safetensors" \
                --outputs "$GG/gguf_cases.safetensors" --prefix $v --precision $prec --tol $tol --backend $BK
            echo "exit=$?"
        done
    done
} >>"$OUTDIR/golden.log" 2>&1
for v in Q4_K mixed; do
    for prec in f32 bf16; do
        line=$(awk -v p="== gguf check $v $prec" '$0==p{on=1;next} /^== /{on=0} on' "$OUTDIR/golden.log" | grep -E 'max_rel_err|error' | tail -1)
        echo "$line" | grep -qE 'PASS' || line="FAIL: ${line:-no result} (see golden.log)"
        row "golden flux2-gguf $v tp 1 ($prec)" "$line"
    done
done
W=$(mktemp -d)
compare() { # compare FILE's (only) tensor with GOLDEN_FILE's KEY: rel L2 error against TOL (plain python3)
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
    print(f"size mismatch {len(a)} vs {len(b)}"); sys.exit(1)
e = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(y * y for y in b))
print(f"rel_err={e:.3e} tol={tol:g} {'PASS' if e <= tol else 'FAIL'}")
PY
}
# golden_run NAME LATENTS GOLDEN_FILE KEY TOL -- generate args...
golden_run() {
    local name=$1 lat=$2 gold=$3 key=$4 tol=$5; shift 6
    { log "$name"; timeout 180 "$TPGEN" generate "$@" --backend $BK --save-latents "$lat"; echo "exit=$?"; } >>"$OUTDIR/golden.log" 2>&1
    local r="FAIL: no latents (see golden.log)"
    [ -s "$lat" ] && r=$(compare "$lat" "$gold" "$key" "$tol" | tail -1)
    echo "compare $name: $r" >>"$OUTDIR/golden.log"
    row "$name" "$r"
}
for prec in f32 bf16; do
    tol=1e-4; [ $prec = bf16 ] && tol=3e-2
    golden_run "golden denoise flux2-tiny-a ($prec)" "$W/den_$prec.safetensors" "$G/denoise.safetensors" \
        final_packed_latents $tol -- --model "$G/model" --prompt-embeds "$G/denoise.safetensors:prompt_embeds" \
        --seed 1 --steps 4 --guidance 4 --width 96 --height 64 --precision $prec --no-decode
done
K=$golden/klein-tiny
if [ -d "$K/model" ]; then  # end to end: Qwen3 text encoder + transformer on the GPU
    golden_run "golden e2e klein-tiny case0 (f32)" "$W/e2e.safetensors" "$K/e2e.safetensors" case0.final_packed_latents 1e-4 \
        -- --model "$K/model" --prompt "a cat holding a sign that says hello" --seed 42 --steps 4 --width 96 --height 64 \
        --max-sequence-length 32 --precision f32 --no-decode
fi
E=$golden/klein-tiny-edit
if [ -d "$E/refs" ] && [ -d "$K/model" ]; then  # editing: VAE encoder (op_conv2d_down) + reference tokens on the GPU
    golden_run "golden edit klein-tiny-edit case1 (f32)" "$W/edit.safetensors" "$E/edit.safetensors" case1.final_packed_latents 1e-4 \
        -- --model "$K/model" --prompt-embeds "$E/edit.safetensors:case1.prompt_embeds" --seed 0 --steps 4 --width 64 --height 64 \
        --image "$E/refs/r0_64x80.png" --image "$E/refs/r1_100x70.png" --precision f32 --no-decode
fi

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
        if depth != 8 or ctype != 2: raise SystemExit(f"unexpected PNG format depth {depth} colour {ctype}")
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
if len(ref) != len(img): raise SystemExit(f"size mismatch: png {w}x{h}, golden {t['shape']}")
d = [abs(x - y) for x, y in zip(img, ref)]
mx, mean = max(d), sum(d) / len(d)
print(f"max_abs={mx} mean_abs={mean:.4f} (u8 levels) {'PASS' if mx <= 2 and mean <= 0.05 else 'FAIL'}")
PY
}
if [ -d "$V/model" ]; then  # the VAE decoder: conv, GroupNorm, upsample, the 512-wide attention head
    for c in 0 1; do
        hw=$(python3 -c "import json; c=json.load(open('$V/vae_golden.json'))['cases'][$c]['image_hw']; print(c[0], c[1])")
        { log "vae decode case$c ($hw)"; timeout 120 "$TPGEN" decode --model "$V/model" --backend $BK --precision f32 \
            --latents "$V/vae_cases.safetensors:case$c.packed_latents" --height ${hw% *} --width ${hw#* } \
            --output "$W/vae$c.png"; echo "exit=$?"; } >>"$OUTDIR/golden.log" 2>&1
        r="FAIL: no image (see golden.log)"
        [ -s "$W/vae$c.png" ] && r=$(compare_png "$W/vae$c.png" "$V/vae_cases.safetensors" "case$c.image_u8" | tail -1)
        echo "compare vae case$c: $r" >>"$OUTDIR/golden.log"
        row "golden VAE decode vae-tiny case$c (f32)" "$r"
    done
fi

# ---- throughput
{
    log "GEMM"; timeout 120 "$BUILD_DIR/cuda_bench" gemm 4608
    log "attention"; timeout 120 "$BUILD_DIR/cuda_bench" attention 4608
    log "PyTorch reference on the same shapes"
    timeout 120 python3 - <<'PY'
import torch, torch.nn.functional as F
def t(fn, it=10):
    for _ in range(3): fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(it): fn()
    b.record(); torch.cuda.synchronize(); return a.elapsed_time(b) / it
M = 4608
for n, k in [(3072, 3072), (18432, 3072), (3072, 9216), (27648, 3072), (3072, 12288)]:
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16); w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    ms = t(lambda: x @ w.t()); print(f"torch gemm bf16 M={M} N={n} K={k} {ms:.3f} ms {2*M*n*k/ms/1e9:.1f} TFLOP/s")
for h in (24, 48):
    q, k, v = (torch.randn(1, h, M, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ms = t(lambda: F.scaled_dot_product_attention(q, k, v))
    print(f"torch sdpa bf16 S={M} heads={h} {ms:.3f} ms {4*M*M*128*h/ms/1e9:.1f} TFLOP/s")
PY
    log "tpgen bench forward $FWD"
    # shellcheck disable=SC2086
    timeout 300 "$TPGEN" bench forward $FWD
    echo "exit=$?"
} >"$OUTDIR/bench.log" 2>&1
awk '/^bench gemm BF16/{print $4, $5, $6, $10, $(NF-1)}' "$OUTDIR/bench.log" | while read -r m n k tf raw; do
    row "GEMM bf16 $m $n $k" "op_gemm $tf TFLOP/s, bare cuBLAS $raw TFLOP/s"
done
awk '/^bench gemm FP8/{print $4, $5, $6, $7, $11, $(NF-1)}' "$OUTDIR/bench.log" | while read -r m n k sc tf deq; do
    row "GEMM fp8 E4M3 $m $n $k $sc" "op_gemm $tf TFLOP/s (fp8 tensor cores on sm_89+), dequant path $deq TFLOP/s"
done
awk '/^bench attention/{print $4, $5, $7, $(NF-1)}' "$OUTDIR/bench.log" | while read -r s h kind tf; do
    row "attention $s $h ($kind)" "$tf TFLOP/s"
done
awk '/^torch sdpa/{print $4, $5, $(NF-1)}' "$OUTDIR/bench.log" | while read -r s h tf; do row "  PyTorch SDPA $s $h" "$tf TFLOP/s"; done
awk '/^torch gemm/{print $4, $5, $6, $(NF-1)}' "$OUTDIR/bench.log" | while read -r m n k tf; do row "  PyTorch matmul $m $n $k" "$tf TFLOP/s"; done
fw=$(awk '/^== tpgen bench forward/{on=1;next} on' "$OUTDIR/bench.log" | grep -vE '^exit=' | tail -3 | tr '\n' ' ')
row "bench forward (tp 1, args in bench.log)" "${fw:-no output}"
row "wall time" "$(( $(date +%s) - t0 )) s"
rm -rf "$W"

echo
echo "gpu-check summary (logs in $OUTDIR: env, build, tests, golden, bench)"
cat "$S"
! grep -qE 'FAIL' "$S"
