#!/usr/bin/env bash
# budget: 5 s; checks: 8
# CPU binding under a plain mpirun (Open MPI's default binding, which binds
# each rank to one core when np <= 2): the node's ranks together run
# threads on every CPU this test may use; an explicit --bind-to core is
# kept; OMP_NUM_THREADS sets the count. Reads `tpgen affinity`.
. "$TPGEN_ROOT/tests/lib.sh"
unset OMP_NUM_THREADS   # run.sh sets 1 for the other tests
PLAIN="mpirun --allow-run-as-root --mca btl_vader_single_copy_mechanism none"
mine=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
# expand "0-3,8" into one CPU per line, sorted
expand() { python3 -c 'import sys
s=set()
for p in sys.argv[1].split(","):
    if not p: continue
    a,_,b=p.partition("-"); s.update(range(int(a),int(b or a)+1))
print("\n".join(map(str,sorted(s))))' "$1"; }
field() { echo "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }
ncpu=$(expand "$mine" | wc -l)
[ "$ncpu" -ge 2 ] || fail "this test needs 2 CPUs or more (has $ncpu)"

for np in 1 2; do
    out=$(timeout 60 $PLAIN -np $np "$TPGEN" affinity 2>&1); rc=$?
    lines=$(echo "$out" | grep -c '^rank=')
    if [ $rc -ne 0 ] || [ "$lines" != $np ]; then fail "np $np default binding: rc $rc: $(echo "$out" | tail -3)"; continue; fi
    union=$(for l in $(echo "$out" | grep '^rank=' | sed 's/.* cpus=\([^ ]*\).*/\1/'); do expand "$l"; done | sort -n)
    threads=$(echo "$out" | sed -n 's/.* threads=\([0-9]*\).*/\1/p' | awk '{s+=$1} END {print s}')
    src=$(echo "$out" | sed -n 's/.* source=\([^ ]*\).*/\1/p' | sort -u | tr '\n' ' ')
    if [ "$union" = "$(expand "$mine")" ] && [ "$(echo "$union" | uniq -d)" = "" ] && [ "$threads" = "$ncpu" ]; then
        ok "mpirun -np $np, default binding ($src): the ranks' $threads threads cover CPUs $mine, no CPU twice"
    else
        fail "mpirun -np $np default binding: $(echo "$out" | tr '\n' ';') (want CPUs $mine, $ncpu threads)"
    fi
done

out=$(timeout 60 $PLAIN -np 2 --bind-to core "$TPGEN" affinity 2>&1)
ok2=1
while read -r l; do
    [ "$(field "$l" source)" = ompi-explicit ] && [ "$(field "$l" before)" = "$(field "$l" cpus)" ] \
        && [ "$(field "$l" ncpus)" = 1 ] && [ "$(field "$l" threads)" = 1 ] || ok2=0
done < <(echo "$out" | grep '^rank=')
[ $ok2 = 1 ] && [ "$(echo "$out" | grep -c '^rank=')" = 2 ] && ok "mpirun --bind-to core is kept (one core, one thread per rank)" \
    || fail "--bind-to core: $(echo "$out" | tr '\n' ';')"

out=$(timeout 60 $PLAIN -np 1 --bind-to core "$TPGEN" affinity 2>&1)
l=$(echo "$out" | grep '^rank=0')
[ "$(field "$l" ncpus)" = 1 ] && [ "$(field "$l" source)" = ompi-explicit ] && ok "mpirun -np 1 --bind-to core is kept" \
    || fail "np 1 --bind-to core: $out"

out=$(timeout 60 $PLAIN -np 2 --bind-to none "$TPGEN" affinity 2>&1)
t=$(echo "$out" | sed -n 's/.* threads=\([0-9]*\).*/\1/p' | awk '{s+=$1} END {print s}')
[ "$t" = "$ncpu" ] && echo "$out" | grep -q "cpus=$mine " && ok "--bind-to none: the 2 ranks share the node's CPUs, $t threads in all" \
    || fail "--bind-to none: $(echo "$out" | tr '\n' ';')"

out=$(OMP_NUM_THREADS=3 timeout 60 $PLAIN -np 1 "$TPGEN" affinity 2>&1)
echo "$out" | grep -q "threads=3 (OMP_NUM_THREADS)" && [ "$(field "$(echo "$out" | grep '^rank=0')" ncpus)" = "$ncpu" ] \
    && ok "OMP_NUM_THREADS sets the thread count (the rank still gets its CPUs)" || fail "OMP_NUM_THREADS=3: $out"

# a launcher tpgen does not know, binding narrowly: one warning, the fix named
out=$(PMI_RANK=0 taskset -c "$(expand "$mine" | head -1)" "$TPGEN" affinity 2>&1)
[ "$(echo "$out" | grep -c 'warning: .*cannot tell')" = 1 ] && echo "$out" | grep -q -- '--bind-to none' \
    && echo "$out" | grep -q -- '--map-by ppr:1:node:pe=' && ok "an unknown launcher's narrow binding gets one warning with the fix" \
    || fail "unknown launcher: $out"
out=$(taskset -c "$(expand "$mine" | head -1)" "$TPGEN" affinity 2>&1)
echo "$out" | grep -q warning && fail "taskset without a launcher warned: $out" \
    || { [ "$(field "$(echo "$out" | grep '^rank=0')" ncpus)" = 1 ] && ok "a taskset mask without a launcher is kept, no warning" \
         || fail "taskset: $out"; }
