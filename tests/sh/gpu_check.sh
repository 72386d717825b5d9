#!/usr/bin/env bash
# budget: 40 s; checks: 7
# scripts/gpu-check.sh without a GPU: the size budget of what the device tool
# sends (tree + bundle), the dry run (GPU_CHECK_BACKEND=cpu: every GPU step a
# SKIP row, the golden and multi-rank steps on the CPU backend, exit 0), and a
# dry run with a golden set missing (a FAIL row naming it, non-zero exit).
# The script must be known to work before a GPU sees it.
source "$TPGEN_ROOT/tests/lib.sh"
GC=$TPGEN_ROOT/scripts/gpu-check.sh
BUILD=$(dirname "$TPGEN")

# ---- the size report: the tree as git sees it, the bundle, the sum against the budget
want=$(cd "$TPGEN_ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
    awk '{ s += $1 } END { printf "%d", s }')
out=$("$GC" --size "$TMP/none.tar.xz" 2>&1); rc=$?
tree=$(echo "$out" | sed -n 's/.*tree .* (\([0-9]*\) bytes.*/\1/p')
if [ "$tree" != "$want" ]; then fail "gpu_check: --size tree bytes '$tree', git ls-files says $want: $out"
elif [ $rc -ne 0 ]; then fail "gpu_check: the tree alone ($want bytes) is over the 62 MiB budget: $out"
else ok "gpu_check: --size reports the tree as the device tool sends it ($want bytes) within 62 MiB"; fi
# a bundle that takes the sum over the budget is refused
head -c $((62 * 1048576 - want + 4096)) /dev/zero > "$TMP/big.tar.xz"
out=$("$GC" --size "$TMP/big.tar.xz" 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q 'sum .* > budget 62 MiB: FAIL'; then ok "gpu_check: --size refuses tree + bundle over 62 MiB"
else fail "gpu_check: tree + bundle over the budget accepted (rc $rc): $out"; fi
out=$(GPU_CHECK_BUDGET_MIB=200 "$GC" --size "$TMP/big.tar.xz" 2>&1) && echo "$out" | grep -q 'sum .* <= budget 200 MiB: ok' &&
    ok "gpu_check: --size accepts a sum within GPU_CHECK_BUDGET_MIB" || fail "gpu_check: budget override: $out"
# the bundle --prepare made, when there is one: it must fit with today's tree
if [ -f "$TPGEN_ROOT/out/gpu-bundle.tar.xz" ]; then
    out=$("$GC" --size 2>&1) && ok "gpu_check: out/gpu-bundle.tar.xz + tree fit ($(echo "$out" | grep -o 'sum [0-9.]* MiB'))" ||
        fail "gpu_check: out/gpu-bundle.tar.xz + tree over the budget: $out"
else
    skip "gpu_check: no out/gpu-bundle.tar.xz to measure with the tree (scripts/gpu-check.sh --prepare makes it; the budget check itself is tested above)"
fi

# ---- the dry run: passes, every GPU step a SKIP row
if [ ! -e "$BUILD/libtpgen-cuda.so" ]; then
    skip "gpu_check: dry run: this build has no CUDA plugin (nvcc missing)"
    exit 0
fi
out=$(GPU_CHECK_BACKEND=cpu OMP_NUM_THREADS=1 timeout 300 "$GC" --build "$BUILD" --golden "$TPGEN_GOLDEN" --out "$TMP/dry" 2>&1); rc=$?
echo "$out" | sed 's/^/# /'
nskip=$(echo "$out" | grep -c '^SKIP .*dry run')
if [ $rc -ne 0 ] || echo "$out" | grep -q '^FAIL'; then fail "gpu_check: dry run failed (rc $rc): $(echo "$out" | grep -A3 '^FAIL' | head -8)"
elif [ "$nskip" -lt 8 ]; then fail "gpu_check: dry run: only $nskip GPU steps were SKIP rows"
elif ! echo "$out" | grep -qE '^ok .*golden transformer cases tp 4 --comm mpi'; then fail "gpu_check: dry run lacks the tp 4 row"
elif ! echo "$out" | grep -qE "^gpu-check: [0-9]+ ok, 0 FAIL, $nskip SKIP"; then fail "gpu_check: dry run: no closing count"
else ok "gpu_check: dry run passes: $(echo "$out" | tail -1 | cut -d';' -f1)"; fi
for f in summary.txt 01-binaries*.log; do
    ls "$TMP/dry"/$f >/dev/null 2>&1 || fail "gpu_check: dry run wrote no $f"
done

# ---- a golden set missing: a FAIL row naming it, non-zero exit
mkdir -p "$TMP/g"
for d in "$TPGEN_GOLDEN"/*; do [ "$(basename "$d")" = vae-tiny ] || ln -s "$d" "$TMP/g/"; done
out=$(GPU_CHECK_BACKEND=cpu GPU_CHECK_ONLY='binaries|VAE decode|cases tp 1 .f32' timeout 120 "$GC" --build "$BUILD" --golden "$TMP/g" \
    --out "$TMP/miss" 2>&1); rc=$?
if [ $rc -eq 0 ]; then fail "gpu_check: a missing golden set exited 0: $out"
elif ! echo "$out" | grep -qE '^FAIL .*golden VAE decode vae-tiny case0 .*golden set missing: .*vae-tiny'; then
    fail "gpu_check: no FAIL row naming the missing set: $out"
elif ! echo "$out" | grep -qE '^ok .*golden transformer cases tp 1 \(f32\)'; then fail "gpu_check: the other steps did not run on: $out"
else ok "gpu_check: a missing golden set gives a FAIL row naming it and exit $rc"; fi

# ---- a failing binary is a FAIL row too (the binaries step), and the script stops
out=$(GPU_CHECK_BACKEND=cpu timeout 60 "$GC" --build "$TMP/nowhere" --out "$TMP/nob" 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -qE '^FAIL .*binaries' && ! echo "$out" | grep -q 'golden transformer' &&
    ok "gpu_check: missing binaries fail the first row and stop" || fail "gpu_check: missing binaries (rc $rc): $out"
