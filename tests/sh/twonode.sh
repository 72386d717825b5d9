#!/usr/bin/env bash
# budget: 130 s; checks: 20
# A two-node Slurm cluster built from Linux namespaces on this one host, and
# tpgen across it. Each node is a network namespace (its own lo and one end
# of a veth pair, 10.77.0.1 and 10.77.0.2) plus a UTS and a private mount
# namespace held by a sleeping process: hostname nodeK, its own /etc/hosts,
# and $D/node bind-mounted to the node's own folder (state, spool, logs,
# munge socket; slurm.conf names $D/node/...). $W is shared like a cluster
# file system, except $W/out, bind-mounted per node too, so that the files a
# node writes land in its own folder: that tells which node wrote what.
# munged (one key) and slurmd run in each node, slurmctld in node1; jobs are
# submitted from node1. It runs:
#   - TP 2 across the nodes (one rank per node): the PNG equals mpirun -np 2;
#   - the mesh: SP 2 across the nodes x TP 2 inside each (2 ranks a node) equals
#     the same mesh on one machine, and SP 2 alone the one-rank PNG;
#   - DP 2 x TP 1 across them: each job rendered once, each by its node;
#   - scripts/slurm-batch.sbatch and scripts/slurm-serve.sbatch unchanged
#     with -N 2 (the request is sent with curl from inside node1's network
#     namespace: the host has no route to the nodes);
#   - kill -9 of node2's only rank under the sbatch script and under a plain
#     srun without -K: both end non-zero within 90 s, no PNG, no temp file;
#   - the same while `tpgen serve` idles (slurm-serve.sbatch, and a plain
#     srun without -K), --watchdog 10: both end non-zero within 40 s (the
#     heartbeat of idle ranks, cli/serve_ranks.h), the port closed;
#   - node2's veth set down mid-run: both ranks end within the watchdog's
#     bound (+ slack); srun, non-zero, once slurmctld declares node2 down;
#   - 5 ms of netem delay on the link: the same PNG, the step-time overhead
#     reported (on a kernel without the netem qdisc the check is reported as
#     skipped, with the reason: it is counted neither as passed nor failed).
# TWONODE_MEASURE=1 adds the figures of docs/cluster.md: step times, the
# all-reduce bandwidth (bench allreduce) across the link and on one machine,
# kill-to-end times per launcher.
# It needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN; without them it fails.
# Every daemon is stopped by its pid file and every process left in the
# nodes by its pid, then the namespaces are deleted, on every exit path.
. "$TPGEN_ROOT/tests/lib.sh"
D=$TMP/cluster W=$TMP/work
ID=$$                                   # unique names per run
NS=("" "tpn1-$ID" "tpn2-$ID") VETH=("" "tpa$ID" "tpb$ID") ADDR=("" 10.77.0.1 10.77.0.2)
HOLD=()
stop_pid() {   # stop_pid PID...: SIGTERM, bounded wait (10 s), SIGKILL
    local p i
    for p in "$@"; do kill "$p" 2>/dev/null; done
    for p in "$@"; do
        for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$p" 2>/dev/null
    done
}
ns_pids() { [ -e "/run/netns/$1" ] && ip netns pids "$1" 2>/dev/null; }
stop_cluster() {
    local k f pids=()
    for k in 2 1; do   # the daemons, by their pid files
        for f in slurmd slurmctld munged; do [ -s "$D/n$k/$f.pid" ] && pids+=("$(cat "$D/n$k/$f.pid")"); done
    done
    [ ${#pids[@]} -gt 0 ] && stop_pid "${pids[@]}"
    rm -f "$D"/n*/*.pid   # a second call (the EXIT trap) must not signal a reused pid
    for k in 1 2; do   # what is left in the nodes (step daemons, ranks), then the holders
        # shellcheck disable=SC2046
        [ -n "${NS[$k]}" ] && stop_pid $(ns_pids "${NS[$k]}" | grep -vx "${HOLD[$k]:-0}")
    done
    [ ${#HOLD[@]} -gt 0 ] && stop_pid "${HOLD[@]}"
    for k in 1 2; do [ -e "/run/netns/${NS[$k]}" ] && ip netns del "${NS[$k]}"; done   # takes the veth with it
    HOLD=()
}
cleanup() { stop_cluster; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
die() {
    fail "twonode: $1"
    for f in "$D"/n*/slurmctld.log "$D"/n*/slurmd.log "$D"/n*/munged.log; do [ -s "$f" ] && { echo "# $f:"; tail -4 "$f"; }; done
    exit 1
}
# on K CMD...: run CMD in node K (its network, UTS and mount namespaces), in $W.
# nsenter, not `ip netns exec`, which remounts /sys and hides the cgroup tree slurmd needs
on() { local k=$1; shift; nsenter -t "${HOLD[$k]}" -n -u -m --wd="$W" "$@"; }
pid_of() { local i; for i in $(seq 1 50); do [ -s "$1" ] && { cat "$1"; return 0; }; sleep 0.2; done; return 1; }

# --- root with CAP_NET_ADMIN and CAP_SYS_ADMIN, or a clear failure ---
[ "$(id -u)" = 0 ] || die "needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to build the nodes from namespaces"
ip netns add "${NS[1]}" 2>"$TMP/ns.err" || die "ip netns add failed (CAP_SYS_ADMIN/CAP_NET_ADMIN missing?): $(cat "$TMP/ns.err")"
ip netns add "${NS[2]}" 2>"$TMP/ns.err" || die "ip netns add failed: $(cat "$TMP/ns.err")"
ip link add "${VETH[1]}" netns "${NS[1]}" type veth peer name "${VETH[2]}" netns "${NS[2]}" 2>"$TMP/ns.err" ||
    die "no veth pair (CAP_NET_ADMIN missing?): $(cat "$TMP/ns.err")"
for k in 1 2; do
    ip -n "${NS[$k]}" addr add "${ADDR[$k]}/24" dev "${VETH[$k]}" && ip -n "${NS[$k]}" link set "${VETH[$k]}" up &&
        ip -n "${NS[$k]}" link set lo up || die "could not set up ${VETH[$k]} in ${NS[$k]}"
done
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ]; then
    "$TPGEN_ROOT/scripts/install-slurm.sh" >"$TMP/install.log" 2>&1 || die "scripts/install-slurm.sh failed: $(tail -3 "$TMP/install.log")"
fi

# --- the nodes: a holder per node owns its UTS and private mount namespace ---
mkdir -p "$D/node" "$D/munge" "$W/out"
chmod 755 "$TMP" "$D" "$W"
for k in 1 2; do
    n=$D/n$k
    mkdir -p "$n/state" "$n/spool" "$n/run" "$n/out" "$n/tmp"
    chmod 755 "$n" "$n/run" && chmod 1777 "$n/tmp"
    printf '127.0.0.1 localhost\n%s node1\n%s node2\n' "${ADDR[1]}" "${ADDR[2]}" >"$n/hosts"
    nsenter --net="/run/netns/${NS[$k]}" unshare --uts --mount --propagation private sh -c "
        hostname node$k && mount --bind '$n/hosts' /etc/hosts && mount --bind '$n' '$D/node' &&
        mount --bind '$n/out' '$W/out' && touch '$n/ready' && exec sleep 100000" >"$TMP/hold$k.log" 2>&1 &
    HOLD[$k]=$!
    for _ in $(seq 1 50); do [ -e "$n/ready" ] && break; kill -0 "${HOLD[$k]}" 2>/dev/null || break; sleep 0.1; done
    [ -e "$n/ready" ] || die "node$k: no private mount/UTS namespace: $(cat "$TMP/hold$k.log")"
done
[ "$(on 2 hostname)" = node2 ] && [ "$(on 2 getent hosts node1 | cut -d' ' -f1)" = "${ADDR[1]}" ] ||
    die "node2 is '$(on 2 hostname)' and finds node1 at '$(on 2 getent hosts node1)'"

# --- munge: one key, a munged and socket per node ---
dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
chmod 700 "$D/munge" && chmod 400 "$D/munge/munge.key"
for k in 1 2; do
    on "$k" munged --force --key-file="$D/munge/munge.key" --socket="$D/node/run/munge.socket" \
        --pid-file="$D/node/munged.pid" --log-file="$D/node/munged.log" --seed-file="$D/node/seed" \
        >"$TMP/munged$k.out" 2>&1 || die "munged on node$k did not start: $(cat "$TMP/munged$k.out")"
    pid_of "$D/n$k/munged.pid" >/dev/null || die "munged on node$k wrote no pid file"
done

# --- slurm.conf: node1 runs slurmctld; NodeAddr is each node's veth address ---
res=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')   # CPUs=... RealMemory=... of this host
base=$((20000 + (ID % 2000) * 2))
export SLURM_CONF=$D/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=tpgen2n
SlurmctldHost=node1(${ADDR[1]})
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$D/node/run/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/node/state
SlurmdSpoolDir=$D/node/spool
TmpFS=$D/node/tmp
SlurmctldPidFile=$D/node/slurmctld.pid
SlurmdPidFile=$D/node/slurmd.pid
SlurmctldLogFile=$D/node/slurmctld.log
SlurmdLogFile=$D/node/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=node1 NodeAddr=${ADDR[1]} $res State=UNKNOWN
NodeName=node2 NodeAddr=${ADDR[2]} $res State=UNKNOWN
PartitionName=tpgen Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF
# TmpFS per node: srun's PMIx plugin makes its per-step folders there, and
# two nodes sharing /tmp collide ("spmix_appdir_...: File exists").
# task/none: both nodes share this host's cores, and task/affinity would bind
# each node's only task to the same core 0
on 1 slurmctld -i -f "$SLURM_CONF" >"$TMP/slurmctld.out" 2>&1 || die "slurmctld did not start: $(cat "$TMP/slurmctld.out")"
pid_of "$D/n1/slurmctld.pid" >/dev/null || die "slurmctld wrote no pid file"
for k in 1 2; do
    on "$k" slurmd -N "node$k" -f "$SLURM_CONF" >"$TMP/slurmd$k.out" 2>&1 || die "slurmd on node$k did not start: $(cat "$TMP/slurmd$k.out")"
    pid_of "$D/n$k/slurmd.pid" >/dev/null || die "slurmd on node$k wrote no pid file"
done
end=$((SECONDS + 40))   # both nodes come up idle (bounded)
while :; do
    st=$(on 1 timeout 5 sinfo -h -o %t -n node1,node2 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$st" = "idle " ] || [ $SECONDS -ge $end ] && break
    sleep 0.5
done
[ "$st" = "idle " ] && ok "twonode: a two-node Slurm from namespaces (node1 ${ADDR[1]}, node2 ${ADDR[2]}, $(echo "$res" | grep -o 'CPUs=[0-9]*') each)" ||
    die "the nodes are '$st', not idle"

# --- helpers for the jobs ---
"$TPGEN" make-tiny --out "$W/model" --seed 3 >/dev/null 2>&1 || die "make-tiny failed"
export OMP_NUM_THREADS=1   # one thread per rank everywhere: the two nodes share this host's cores
SRUN=(srun -N 2 --ntasks-per-node=1 --cpus-per-task=1 --mpi=pmix)
# wait_job ID [S]: until it leaves the queue (bounded, default 300 s); prints its state
wait_job() {
    local st end=$((SECONDS + ${2:-300}))
    while :; do
        st=$(on 1 timeout 10 squeue -h -j "$1" -o %T 2>/dev/null)
        [ -z "$st" ] || [ $SECONDS -ge $end ] && break
        sleep 0.5
    done
    [ -n "$st" ] && { on 1 timeout 10 scancel "$1"; echo "TIMEOUT($st)"; return; }
    on 1 timeout 10 scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2
}
# wait_for PID S: our child PID, at most S seconds; sets rc (124: still running)
wait_for() {
    local i
    rc=124
    for i in $(seq 1 $(($2 * 10))); do
        if ! kill -0 "$1" 2>/dev/null; then wait "$1"; rc=$?; return; fi
        sleep 0.1
    done
}
# rank_on K LOG: the pid of the tpgen rank in node K, once LOG reports step 3 (bounded: 120 s)
rank_on() {
    local i p
    for i in $(seq 1 1200); do grep -q 'step 3/' "$2" 2>/dev/null && break; sleep 0.1; done
    for p in $(ns_pids "${NS[$1]}"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = tpgen ] && echo "$p"; done
}
s_it() { sed -n 's/.*denoise .* steps, \([0-9.]*\) s\/it.*/\1/p' "$1" | tail -1; }
now() { date +%s.%N; }
since() { printf %.1f "$(echo "$(now) - $1" | bc)"; }
left_in() { (cd "$D" && ls -A n1/out n2/out | grep -F "$1" | tr '\n' ' '); }   # files under out/ named *$1* (temporaries: .NAME.tmp-*)

# --- TP 2 across the nodes (one rank per node) against mpirun -np 2 on one machine ---
args=(--model "$W/model" --prompt "a red fox in the snow" --seed 5 --width 128 --height 128 --steps 8 --backend cpu)
$MPIRUN -np 2 "$TPGEN" "${args[@]}" --output "$W/ref.png" >"$W/ref.log" 2>&1 || die "mpirun -np 2 reference failed: $(tail -3 "$W/ref.log")"
on 1 timeout 120 "${SRUN[@]}" --kill-on-bad-exit=1 bash -c 'echo "$SLURM_PROCID $(hostname)" >"out/host-$SLURM_PROCID"; exec "$@"' \
    tpgen "$TPGEN" "${args[@]}" --output out/tp2.png >"$W/tp2.log" 2>&1
rc=$?
[ "$(cat "$D/n1/out/host-0" 2>/dev/null)" = "0 node1" ] && [ "$(cat "$D/n2/out/host-1" 2>/dev/null)" = "1 node2" ] &&
    ok "twonode: srun -N 2 placed rank 0 on node1 and rank 1 on node2" ||
    fail "twonode: rank placement: $(cat "$D"/n*/out/host-* 2>&1 | tr '\n' ' ')"
[ $rc = 0 ] && cmp -s "$D/n1/out/tp2.png" "$W/ref.png" &&
    ok "twonode: TP 2 across the nodes: the PNG equals mpirun -np 2 on one machine byte for byte ($(s_it "$W/tp2.log") s/it against $(s_it "$W/ref.log") s/it)" ||
    fail "twonode: TP 2 across the nodes: rc $rc, $(cmp "$D/n1/out/tp2.png" "$W/ref.png" 2>&1) $(tail -3 "$W/tp2.log")"

# --- the mesh across the nodes: 2 ranks per node, TP 2 inside each node, Ulysses SP 2 across them (world =
# sp x tp, tp innermost: ranks 0-1 on node1 are one TP group, 2-3 on node2 the other): the PNG equals the same
# mesh on one machine, and with --sp 2 alone the one-rank PNG ---
$MPIRUN -np 4 "$TPGEN" "${args[@]}" --sp 2 --tp 2 --output "$W/mesh-ref.png" >"$W/mesh-ref.log" 2>&1 ||
    fail "twonode: mpirun -np 4 --sp 2 --tp 2 reference failed: $(tail -3 "$W/mesh-ref.log")"
on 1 timeout 150 srun -N 2 --ntasks-per-node=2 --cpus-per-task=1 --mpi=pmix --kill-on-bad-exit=1 \
    bash -c 'echo "$SLURM_PROCID $(hostname)" >"out/mesh-host-$SLURM_PROCID"; exec "$@"' \
    tpgen "$TPGEN" "${args[@]}" --sp 2 --tp 2 --output out/mesh.png >"$W/mesh.log" 2>&1
rc=$?
hosts=$(cat "$D/n1/out"/mesh-host-* "$D/n2/out"/mesh-host-* 2>/dev/null | sort | tr '\n' ' ')
[ $rc = 0 ] && [ "$hosts" = "0 node1 1 node1 2 node2 3 node2 " ] && cmp -s "$D/n1/out/mesh.png" "$W/mesh-ref.png" &&
    ok "twonode: sp 2 across the nodes x tp 2 inside each: ranks 0-1 on node1, 2-3 on node2, the PNG equals the same mesh on one machine ($(s_it "$W/mesh.log") s/it against $(s_it "$W/mesh-ref.log") s/it)" ||
    fail "twonode: sp 2 x tp 2 across the nodes: rc $rc, hosts '$hosts', $(cmp "$D/n1/out/mesh.png" "$W/mesh-ref.png" 2>&1) $(tail -3 "$W/mesh.log")"
"$TPGEN" "${args[@]}" --output "$W/one.png" >"$W/one.log" 2>&1 || fail "twonode: the one-rank reference failed"
on 1 timeout 150 srun -N 2 --ntasks-per-node=1 --cpus-per-task=1 --mpi=pmix --kill-on-bad-exit=1 \
    "$TPGEN" "${args[@]}" --sp 2 --output out/sp2.png >"$W/sp2.log" 2>&1
rc=$?
# the pixels (IDAT): the parameters text differs by its "mesh:" line
idat() { python3 -c '
import hashlib, struct, sys
b = open(sys.argv[1], "rb").read(); p = 8; h = hashlib.sha256()
while p < len(b):
    n, = struct.unpack(">I", b[p:p+4])
    if b[p+4:p+8] == b"IDAT": h.update(b[p+8:p+8+n])
    p += 12 + n
print(h.hexdigest())' "$1" 2>/dev/null; }
[ $rc = 0 ] && [ -n "$(idat "$W/one.png")" ] && [ "$(idat "$D/n1/out/sp2.png")" = "$(idat "$W/one.png")" ] &&
    ok "twonode: --sp 2 across the nodes (one rank each): the PNG's pixels equal one rank's byte for byte" ||
    fail "twonode: --sp 2 across the nodes: rc $rc, pixels differ from one rank's; $(tail -3 "$W/sp2.log")"

# --- scripts/slurm-batch.sbatch unchanged, -N 2 x 1 task: DP 2 x TP 1, each job once, by its node ---
cat >"$W/batch.yaml" <<EOF
prompts:
  - a red fox in the snow
  - a lighthouse at dusk
seeds: [5, 9]
width: 64
height: 48
steps: 4
backend: cpu
output: out/dp/{prompt_index:02}-{seed}.png
EOF
sbatch_job() {   # sbatch_job SCRIPT [tpgen flags...] (env: SPEC, TP, ...): prints the job id
    local s=$1; shift
    on 1 env MODEL="$W/model" TPGEN="$TPGEN" timeout 30 sbatch --parsable --nodes=2 --ntasks-per-node=1 \
        --cpus-per-task=1 --gpus-per-node=0 --time=00:10:00 "$TPGEN_ROOT/scripts/$s" "$@"
}
mkdir -p "$D/n1/out/dp" "$D/n2/out/dp"   # each node's out/dp (tpgen does not create folders)
job=$(SPEC="$W/batch.yaml" sbatch_job slurm-batch.sbatch 2>"$TMP/sbatch.err") || die "sbatch failed: $(cat "$TMP/sbatch.err")"
state=$(wait_job "$job" 200)
[ "$state" = COMPLETED ] && ok "twonode: sbatch scripts/slurm-batch.sbatch -N 2 (1 task per node, DP 2 x TP 1) completed" ||
    fail "twonode: batch job $job ended $state: $(tail -5 "$W/tpgen-$job.log" 2>&1)"
# jobs are dealt round-robin to the DP groups: jobs 0 and 2 to node1's, 1 and 3 to node2's
want="n1/out/dp/00-5.png n1/out/dp/01-5.png n2/out/dp/00-9.png n2/out/dp/01-9.png"
got=$(cd "$D" && ls n1/out/dp/*.png n2/out/dp/*.png 2>/dev/null | tr '\n' ' ')
good=0
for f in $want; do
    pi=$(basename "$f" | cut -d- -f1) s=$(basename "$f" .png | cut -d- -f2)
    prompt=$([ "$pi" = 00 ] && echo "a red fox in the snow" || echo "a lighthouse at dusk")
    grep -aq "prompt: $prompt" "$D/$f" 2>/dev/null && grep -aq "seed: $s\$" "$D/$f" && good=$((good + 1))
done
[ "$got" = "$want " ] && [ $good = 4 ] && ok "twonode: DP 2 x TP 1: each of the 4 jobs rendered once, 2 by node1 and 2 by node2, parameters right" ||
    fail "twonode: DP files: want '$want', got '$got' ($good with the right parameters)"
m=$D/n1/out/metrics-$job.json
json_field() { sed -n "s/^ *\"$2\": *\([0-9]*\),*$/\1/p" "$1" 2>/dev/null; }
[ "$(json_field "$m" jobs_rendered 2>/dev/null)" = 4 ] && [ "$(json_field "$m" world_size)" = 2 ] &&
    ok "twonode: metrics JSON (node1): 4 jobs rendered by 2 ranks" || fail "twonode: metrics $m: $(tr -d '\n' <"$m" 2>&1 | head -c 300)"

# --- scripts/slurm-serve.sbatch unchanged, -N 2, TP 2 across the nodes: a request answered ---
echo "twonode-test-key" >"$W/key" && chmod 600 "$W/key"
sjob=$(TP=2 PORT=0 KEY_FILE="$W/key" sbatch_job slurm-serve.sbatch 2>"$TMP/sbatch.err") || die "sbatch slurm-serve failed: $(cat "$TMP/sbatch.err")"
slog=$W/tpgen-serve-$sjob.log
for _ in $(seq 1 600); do grep -q "ready after" "$slog" 2>/dev/null && break; sleep 0.2; done
sport=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$slog" 2>/dev/null | head -1)
if [ -n "$sport" ]; then
    # from inside node1's network namespace: the host has no route to 10.77.0.0/24
    on 1 timeout 60 curl -s -H "Authorization: Bearer twonode-test-key" "http://node1:$sport/v1/images/generations" \
        -d '{"prompt": "a red fox in the snow", "size": "64x48", "seed": 5, "steps": 2}' | jq -r '.data[0].b64_json' |
        base64 -d >"$W/served.png" 2>/dev/null
    grep -aq "prompt: a red fox in the snow" "$W/served.png" && grep -aq "tp: 2" "$W/served.png" &&
        ok "twonode: sbatch scripts/slurm-serve.sbatch -N 2 (TP 2 across the nodes) answers a request (curl in node1's namespace)" ||
        fail "twonode: slurm-serve: no image: $(tail -3 "$slog")"
else
    fail "twonode: slurm-serve: the server did not become ready: $(tail -5 "$slog" 2>&1)"
fi
on 1 timeout 10 scancel --full --signal=USR1 "$sjob"
state=$(wait_job "$sjob" 60)
[ "$state" = COMPLETED ] && grep -q "serve: stopped" "$slog" && ok "twonode: slurm-serve: scancel --full --signal=USR1 stops both nodes' ranks, job COMPLETED" ||
    fail "twonode: slurm-serve job $sjob ended $state: $(tail -3 "$slog" 2>&1)"

# --- 5 ms of netem delay on node2's veth: the same PNG, the step-time overhead ---
if tc -n "${NS[2]}" qdisc add dev "${VETH[2]}" root netem delay 5ms 2>"$TMP/tc.err"; then
    on 1 timeout 300 "${SRUN[@]}" --kill-on-bad-exit=1 "$TPGEN" "${args[@]}" --output out/netem.png >"$W/netem.log" 2>&1
    rc=$?
    tc -n "${NS[2]}" qdisc del dev "${VETH[2]}" root
    [ $rc = 0 ] && cmp -s "$D/n1/out/netem.png" "$W/ref.png" &&
        ok "twonode: 5 ms netem delay: the same PNG; $(s_it "$W/netem.log") s/it against $(s_it "$W/tp2.log") s/it without the delay" ||
        fail "twonode: netem: rc $rc, $(cmp "$D/n1/out/netem.png" "$W/ref.png" 2>&1) $(tail -2 "$W/netem.log")"
elif grep -qiE 'unknown|not supported|no such file' "$TMP/tc.err"; then
    # the kernel was built without the netem qdisc: nothing here can add the delay (counted as skipped, not passed)
    skip "twonode: 5 ms netem delay: this kernel ($(uname -r)) has no netem qdisc (CONFIG_NET_SCH_NETEM): $(head -1 "$TMP/tc.err")"
else
    fail "twonode: netem: tc failed: $(cat "$TMP/tc.err")"
fi

# --- kill -9 of node2's only rank: the job ends non-zero within 90 s, no PNG, no temporary file ---
long=(--model "$W/model" --prompt "a fox" --seed 3 --width 256 --height 256 --steps 2000 --backend cpu --watchdog 10)
cat >"$W/long.yaml" <<EOF
prompts: [a fox]
seeds: [3]
width: 256
height: 256
steps: 2000
backend: cpu
output: out/kill-sb.png
EOF
# under scripts/slurm-batch.sbatch (srun --kill-on-bad-exit=1), TP 2 across the nodes
job=$(SPEC="$W/long.yaml" TP=2 sbatch_job slurm-batch.sbatch --watchdog 10 2>"$TMP/sbatch.err") || die "sbatch failed: $(cat "$TMP/sbatch.err")"
r2=$(rank_on 2 "$W/tpgen-$job.log")
if [ -z "$r2" ]; then fail "twonode: sbatch kill: no rank found in node2 ($(tail -2 "$W/tpgen-$job.log" 2>&1))"; else
    t0=$(now); kill -9 $r2
    state=$(wait_job "$job" 100); took=$(since "$t0")
    [ "$state" != COMPLETED ] && [ "${state#TIMEOUT}" = "$state" ] && [ "$(echo "$took < 90" | bc)" = 1 ] && [ -z "$(left_in kill-sb)" ] &&
        ok "twonode: kill -9 of node2's only rank under slurm-batch.sbatch: job $state ${took} s after the kill, no PNG or temporary file" ||
        fail "twonode: sbatch kill: job $state after $took s, left: '$(left_in kill-sb)' $(tail -2 "$W/tpgen-$job.log")"
fi
# under a plain srun without -K: node1's rank ends the job (its watchdog)
on 1 timeout 200 "${SRUN[@]}" "$TPGEN" "${long[@]}" --output out/kill-srun.png >"$W/kill-srun.log" 2>&1 &
sp=$!
r2=$(rank_on 2 "$W/kill-srun.log")
if [ -z "$r2" ]; then fail "twonode: srun kill: no rank found in node2 ($(tail -2 "$W/kill-srun.log"))"; else
    t0=$(now); kill -9 $r2
    wait_for $sp 100; took=$(since "$t0")
    [ $rc != 0 ] && [ $rc != 124 ] && [ "$(echo "$took < 90" | bc)" = 1 ] && [ -z "$(left_in kill-srun)" ] &&
        ok "twonode: kill -9 of node2's only rank under srun without -K: rc $rc ${took} s after the kill, no PNG or temporary file" ||
        fail "twonode: srun kill: rc $rc after $took s, left: '$(left_in kill-srun)' $(tail -2 "$W/kill-srun.log")"
    # node1's rank either blocks on the dead peer (its watchdog ends it, naming the group) or was writing to it:
    # then Open MPI's TCP send gets EPIPE (tpgen ignores SIGPIPE, so it is not a silent rc 141 death) and
    # reports the lost connection; either way the job ends with a message saying why
    if [ "$rc" = 141 ]; then
        fail "twonode: srun without -K: node1's rank died of SIGPIPE (rc 141, no message) ${took} s after the kill"
    elif grep -q "no progress in job group" "$W/kill-srun.log"; then
        ok "twonode: srun without -K: the watchdog of node1's rank ended it"
    elif grep -qiE "broken pipe|connection reset|unreachable|lost connection|process failure|terminated" "$W/kill-srun.log"; then
        ok "twonode: srun without -K: node1's rank reported the lost peer: $(grep -m1 -iE "broken pipe|connection reset|unreachable|lost connection|process failure|terminated" "$W/kill-srun.log" | cut -c1-160)"
    else
        fail "twonode: srun without -K: no watchdog or lost-peer message (rc $rc): $(tail -3 "$W/kill-srun.log")"
    fi
fi
kill $sp 2>/dev/null

# --- kill -9 of node2's only rank while `tpgen serve` is idle (TP 2 across the nodes, --watchdog 10):
# the heartbeat of idle ranks ends the server within the bound + 30 s, the port closed ---
serve_gone() {   # serve_gone PORT: nothing listens on node1:PORT any more (curl in node1's namespace)
    ! on 1 timeout 10 curl -s -o /dev/null -m 5 "http://node1:$1/health"
}
tpgen_in() { local p; for p in $(ns_pids "${NS[$1]}"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = tpgen ] && echo "$p"; done; }
# under scripts/slurm-serve.sbatch (srun -K)
sjob=$(TP=2 PORT=0 KEY_FILE="$W/key" sbatch_job slurm-serve.sbatch --watchdog 10 2>"$TMP/sbatch.err") || die "sbatch slurm-serve failed: $(cat "$TMP/sbatch.err")"
slog=$W/tpgen-serve-$sjob.log
for _ in $(seq 1 600); do grep -q "ready after" "$slog" 2>/dev/null && break; sleep 0.2; done
sport=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$slog" 2>/dev/null | head -1)
sleep 2
r2=$(tpgen_in 2)
if [ -z "$sport" ] || [ -z "$r2" ]; then
    fail "twonode: serve kill (sbatch): no ready server (port '$sport') or no rank in node2 ('$r2'): $(grep -m3 -E 'error|heartbeat' "$slog" 2>&1) $(tail -3 "$slog" 2>&1)"
else
    t0=$(now); kill -9 $r2
    state=$(wait_job "$sjob" 60); took=$(since "$t0")
    [ "$state" != COMPLETED ] && [ "${state#TIMEOUT}" = "$state" ] && [ "$(echo "$took < 40" | bc)" = 1 ] && serve_gone "$sport" &&
        ok "twonode: kill -9 of node2's only rank while slurm-serve.sbatch idles: job $state ${took} s after the kill, port closed" ||
        fail "twonode: serve kill (sbatch): job $state after $took s: $(grep -m2 error "$slog")"
fi
# under a plain srun without -K: node1's rank 0 notices the silence (the heartbeat) and ends
on 1 timeout 200 "${SRUN[@]}" "$TPGEN" serve --model "$W/model" --tp 2 --listen 0.0.0.0:0 --api-key-file "$W/key" \
    --watchdog 10 >"$W/serve-srun.log" 2>&1 &
sp=$!
for _ in $(seq 1 600); do grep -q "ready after" "$W/serve-srun.log" 2>/dev/null && break; sleep 0.2; done
sport=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$W/serve-srun.log" | head -1)
sleep 2
r2=$(tpgen_in 2)
if [ -z "$sport" ] || [ -z "$r2" ]; then fail "twonode: serve kill (srun): no ready server or no rank in node2 ($(tail -2 "$W/serve-srun.log"))"; else
    t0=$(now); kill -9 $r2
    wait_for $sp 60; took=$(since "$t0")
    [ $rc != 0 ] && [ $rc != 124 ] && [ "$(echo "$took < 40" | bc)" = 1 ] && serve_gone "$sport" &&
        ok "twonode: kill -9 of node2's only rank while a plain srun (no -K) serve idles: rc $rc ${took} s after the kill, port closed" ||
        fail "twonode: serve kill (srun): rc $rc after $took s: $(grep -m2 error "$W/serve-srun.log")"
    grep -q "rank 0: no heartbeat from world rank 1 (node node2)" "$W/serve-srun.log" &&
        ok "twonode: serve under srun without -K: node1's rank 0 named the silent rank and its node" ||
        fail "twonode: serve under srun without -K: no heartbeat message: $(grep -m2 error "$W/serve-srun.log")"
fi
for p in $(tpgen_in 1); do kill -9 "$p"; done   # a server still up after a failed check
kill $sp 2>/dev/null

# --- TWONODE_MEASURE=1: the figures of docs/cluster.md ---
if [ "${TWONODE_MEASURE:-0}" = 1 ]; then
    echo "# measure on $(nproc --all) cores: $(uptime)"
    margs=(--model "$W/model" --prompt "a fox" --seed 3 --width 256 --height 256 --steps 10 --backend cpu)
    for i in 1 2 3; do   # alternated, so that the load of the machine falls on both alike
        $MPIRUN -np 2 "$TPGEN" "${margs[@]}" --output "$W/m1.png" >"$W/m1.log" 2>&1
        on 1 timeout 300 "${SRUN[@]}" "$TPGEN" "${margs[@]}" --output out/m2.png >"$W/m2.log" 2>&1
        echo "# step time TP 2, 256x256: one machine (mpirun) $(s_it "$W/m1.log") s/it, across the nodes (srun) $(s_it "$W/m2.log") s/it"
    done
    echo "# bench allreduce across the nodes (srun -N 2, TCP over the veth pair):"
    on 1 timeout 300 "${SRUN[@]}" "$TPGEN" bench allreduce --max 64M --dtype f32 --iters 20 2>&1 | sed 's/^/#   /'
    echo "# bench allreduce on one machine (mpirun -np 2, shared memory):"
    $MPIRUN -np 2 "$TPGEN" bench allreduce --max 64M --dtype f32 --iters 20 2>&1 | sed 's/^/#   /'
    echo "# bench allreduce on one machine (mpirun -np 2, TCP over loopback):"
    $MPIRUN --mca btl tcp,self --mca btl_tcp_if_include lo -np 2 "$TPGEN" bench allreduce --max 64M --dtype f32 --iters 20 2>&1 | sed 's/^/#   /'
    # kill -9 of rank 1 under mpirun on one machine
    $MPIRUN -np 2 "$TPGEN" "${long[@]}" --output "$W/mkill.png" >"$W/mkill.log" 2>&1 &
    mp=$!
    for _ in $(seq 1 1200); do grep -q 'step 3/' "$W/mkill.log" 2>/dev/null && break; sleep 0.1; done
    for p in $(pgrep -P $mp); do tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && r=$p; done
    t0=$(now); kill -9 $r; wait_for $mp 100
    echo "# kill -9 of rank 1 under mpirun -np 2 (one machine): rc $rc, $(since "$t0") s"
    # and under a plain srun -K across the nodes
    on 1 timeout 200 "${SRUN[@]}" -K "$TPGEN" "${long[@]}" --output out/mkill.png >"$W/mkill2.log" 2>&1 &
    sp=$!; r2=$(rank_on 2 "$W/mkill2.log")
    t0=$(now); kill -9 $r2; wait_for $sp 100
    echo "# kill -9 of node2's rank under srun -K (--kill-on-bad-exit=1) across the nodes: rc $rc, $(since "$t0") s"
fi

# --- node2's veth goes down mid-run: both ranks end non-zero within the watchdog's bound (10 s) + slack ---
# Then srun itself waits for node2's step daemon until slurmctld declares node2
# down (SlurmdTimeout, 30 s here): that part is Slurm's, bounded by 90 s.
on 1 timeout 200 "${SRUN[@]}" --kill-on-bad-exit=1 "$TPGEN" "${long[@]}" --output out/link.png >"$W/link.log" 2>&1 &
sp=$!
r2=$(rank_on 2 "$W/link.log") r1=$(rank_on 1 "$W/link.log")
if [ -z "$r2" ] || [ -z "$r1" ]; then fail "twonode: link down: ranks not found ($(tail -2 "$W/link.log"))"; else
    t0=$(now); ip -n "${NS[2]}" link set "${VETH[2]}" down
    for _ in $(seq 1 600); do kill -0 "$r1" 2>/dev/null || kill -0 "$r2" 2>/dev/null || break; sleep 0.1; done
    ranks=$(since "$t0")
    wait_for $sp 100; took=$(since "$t0")
    [ "$(echo "$ranks < 20" | bc)" = 1 ] && [ "$(grep -c "no progress in job group" "$W/link.log")" -ge 1 ] &&
        ok "twonode: node2's link down mid-run: the watchdog ends both ranks ${ranks} s later (bound 10 s)" ||
        fail "twonode: link down: ranks still running ${ranks} s later: $(grep -m2 error "$W/link.log")"
    [ $rc != 0 ] && [ $rc != 124 ] && [ "$(echo "$took < 90" | bc)" = 1 ] && [ -z "$(left_in link)" ] &&
        ok "twonode: link down: srun ends rc $rc ${took} s after it (when slurmctld declares node2 down), no PNG or temporary file" ||
        fail "twonode: link down: srun rc $rc after $took s, left: '$(left_in link)' $(tail -2 "$W/link.log")"
fi
kill $sp 2>/dev/null

# --- a sanitized tpgen: the ranks' own logs (run.sh sees only this script's output) ---
if ldd "$TPGEN" 2>/dev/null | grep -q libasan; then
    san=$(grep -l -E 'AddressSanitizer|LeakSanitizer|runtime error:' "$W"/*.log 2>/dev/null | tr '\n' ' ')
    [ -z "$san" ] && ok "twonode: no sanitizer report in the ranks' logs" ||
        fail "twonode: sanitizer reports in $san: $(grep -h -m3 -E 'AddressSanitizer|LeakSanitizer|runtime error:' $san)"
fi
# --- everything stopped, the namespaces gone ---
stop_cluster
left=$(pgrep -f "$D/" | wc -l)
[ "$left" = 0 ] && [ ! -e "/run/netns/${NS[1]}" ] && [ ! -e "/run/netns/${NS[2]}" ] &&
    ok "twonode: every daemon and rank stopped, both namespaces deleted" || fail "twonode: $left processes of this cluster still run, or a namespace is left: $(ls /run/netns)"
