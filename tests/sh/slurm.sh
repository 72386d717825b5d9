#!/usr/bin/env bash
# budget: 35 s; checks: 10
# A real single-node Slurm: munged, slurmctld and slurmd from Debian's
# packages (installed by scripts/install-slurm.sh when missing), with a
# slurm.conf written here for this host (its cores and memory, from
# `slurmd -C`), private ports, state and sockets under $TMP. It submits
# scripts/slurm-batch.sbatch unchanged, with its options on the sbatch
# command line (1 node, 2 tasks, no GPUs, the tiny model, 2 prompts x 2
# seeds), waits for the job (bounded), checks the 4 PNGs, their parameters
# and the metrics JSON, then resubmits with --skip-existing and checks that
# nothing is rendered again. Every daemon started here is stopped by its
# pid on every exit path (the EXIT trap). If Slurm cannot be set up the
# test fails; it never skips.
. "$TPGEN_ROOT/tests/lib.sh"
D=$TMP/slurm
mkdir -p "$D/state" "$D/spool" "$D/munge" "$D/run"
PIDS=()
stop_daemons() {
    local p i
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do   # bounded: 10 s, then SIGKILL
        for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$p" 2>/dev/null
    done
    PIDS=()
}
cleanup() { stop_daemons; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
# pid_of FILE: the pid a daemon wrote, waited for (bounded)
pid_of() {
    local i
    for i in $(seq 1 50); do [ -s "$1" ] && { cat "$1"; return 0; }; sleep 0.2; done
    return 1
}
die() { fail "$1"; for f in slurmctld slurmd munged; do [ -f "$D/$f.log" ] && tail -5 "$D/$f.log"; done; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ]; then
    "$TPGEN_ROOT/scripts/install-slurm.sh" >"$D/install.log" 2>&1 || die "scripts/install-slurm.sh failed: $(tail -3 "$D/install.log")"
fi

# --- munge: a fresh key and a private socket ---
dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
chmod 700 "$D/munge" && chmod 400 "$D/munge/munge.key"
chmod 755 "$D" "$TMP"
munged --force --key-file="$D/munge/munge.key" --socket="$D/run/munge.socket" --pid-file="$D/munged.pid" \
    --log-file="$D/munged.log" --seed-file="$D/munge/seed" >"$D/munged.out" 2>&1 || die "munged did not start: $(cat "$D/munged.out")"
p=$(pid_of "$D/munged.pid") || die "munged wrote no pid file"
PIDS+=("$p")

# --- slurm.conf for this host ---
node=$(slurmd -C | head -1)            # NodeName=host CPUs=... RealMemory=...
host=$(echo "$node" | sed -n 's/^NodeName=\([^ ]*\).*/\1/p')
[ -n "$host" ] || die "slurmd -C gave no node line: $node"
base=$((20000 + ($$ % 2000) * 2))      # private ports (parallel runs of the suite do not collide)
export SLURM_CONF=$D/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=tpgentest
SlurmctldHost=$host
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$D/run/munge.socket
CredType=cred/munge
SlurmUser=$(id -un)
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
$node State=UNKNOWN
PartitionName=tpgen Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
sed -i '/^UpTime=/d' "$SLURM_CONF"
slurmctld -i -f "$SLURM_CONF" >"$D/slurmctld.out" 2>&1 || die "slurmctld did not start: $(cat "$D/slurmctld.out")"
p=$(pid_of "$D/slurmctld.pid") || die "slurmctld wrote no pid file"
PIDS+=("$p")
slurmd -f "$SLURM_CONF" >"$D/slurmd.out" 2>&1 || die "slurmd did not start: $(cat "$D/slurmd.out")"
p=$(pid_of "$D/slurmd.pid") || die "slurmd wrote no pid file"
PIDS+=("$p")
end=$((SECONDS + 30))   # the node comes up idle (bounded: 30 s)
while :; do
    st=$(timeout 5 sinfo -h -n "$host" -o %t 2>/dev/null)
    [ "$st" = idle ] || [ $SECONDS -ge $end ] && break
    sleep 0.5
done
[ "$st" = idle ] && ok "a single-node Slurm runs ($host, $(echo "$node" | grep -o 'CPUs=[0-9]*'))" || die "node $host is '$st', not idle"

# --- the job: the tiny model, 2 prompts x 2 seeds ---
W=$D/work
mkdir -p "$W"
"$TPGEN" make-tiny --out "$W/model" --seed 3 >/dev/null 2>&1 || die "make-tiny failed"
cat >"$W/batch.yaml" <<EOF
prompts:
  - a red fox in the snow
  - a lighthouse at dusk
seeds: [5, 9]
width: 64
height: 48
backend: cpu
output: out/{prompt_index:02}-{seed}.png
EOF
# wait_job ID: until it leaves the queue (bounded: 300 s); prints its state
wait_job() {
    local st end=$((SECONDS + 300))
    while :; do
        st=$(timeout 10 squeue -h -j "$1" -o %T 2>/dev/null)
        [ -z "$st" ] || [ $SECONDS -ge $end ] && break
        sleep 1
    done
    [ -n "$st" ] && { timeout 10 scancel "$1"; echo "TIMEOUT($st)"; return; }
    timeout 10 scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z]*' | cut -d= -f2
}
submit() {   # submit [tpgen flags...]: prints the job id (the script passes its arguments to tpgen)
    (cd "$W" && MODEL="$W/model" SPEC="$W/batch.yaml" TPGEN="$TPGEN" \
        timeout 30 sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=00:10:00 \
        "$TPGEN_ROOT/scripts/slurm-batch.sbatch" "$@")
}
json_field() { sed -n "s/^ *\"$2\": *\([0-9]*\),*$/\1/p" "$1"; }
job=$(submit 2>"$D/sbatch.err") || die "sbatch failed: $(cat "$D/sbatch.err")"
state=$(wait_job "$job")
log=$W/tpgen-$job.log
if [ "$state" = COMPLETED ]; then ok "sbatch scripts/slurm-batch.sbatch (1 node, 2 tasks, srun --mpi=pmix) completed"
else fail "job $job ended $state: $(tail -5 "$log" 2>&1)"; fi
grep -q -- '--mpi=pmix' "$TPGEN_ROOT/scripts/slurm-batch.sbatch" && timeout 10 srun --mpi=list 2>&1 | grep -q pmix \
    && ok "srun --mpi=list offers pmix, so the script took its srun --mpi=pmix branch" || fail "srun --mpi=list has no pmix"
n=0 good=0
for pi in 00 01; do
    for s in 5 9; do
        f=$W/out/$pi-$s.png
        [ -s "$f" ] || continue
        n=$((n + 1))
        prompt=$([ $pi = 00 ] && echo "a red fox in the snow" || echo "a lighthouse at dusk")
        # the parameters chunk (uncompressed text) names the prompt, the seed, the size and tp
        if grep -aq "prompt: $prompt" "$f" && grep -aq "seed: $s\$" "$f" && grep -aq "size: 64x48" "$f" && grep -aq "tp: 2" "$f"; then
            good=$((good + 1))
        fi
    done
done
[ $n = 4 ] && ok "the job wrote the 4 PNGs" || fail "$n of 4 PNGs in $W/out: $(ls "$W/out" 2>&1) $(tail -3 "$log" 2>&1)"
[ $good = 4 ] && ok "each PNG's parameters name its prompt, seed and size" \
    || fail "$good of 4 PNGs with the right parameters: $(grep -a -m4 -E 'prompt:|seed:|size:|tp:' "$W/out/00-5.png" 2>&1)"
m=$W/out/metrics-$job.json
[ "$(json_field "$m" jobs)" = 4 ] && [ "$(json_field "$m" jobs_rendered)" = 4 ] && [ "$(json_field "$m" images)" = 4 ] \
    && [ "$(json_field "$m" world_size)" = 2 ] && ok "metrics JSON: 4 jobs rendered, 4 images, 2 ranks" \
    || fail "metrics $m: $(tr -d '\n' <"$m" 2>&1 | head -c 400)"

# --- resubmitted with --skip-existing: nothing rendered again ---
before=$(stat -c %Y "$W"/out/*.png | sort | tr '\n' ' ')
sleep 1   # a rewritten PNG would get a later mtime
job2=$(submit --skip-existing 2>"$D/sbatch.err") || die "second sbatch failed: $(cat "$D/sbatch.err")"
state=$(wait_job "$job2")
m2=$W/out/metrics-$job2.json
[ "$state" = COMPLETED ] && [ "$(json_field "$m2" jobs_skipped)" = 4 ] && [ "$(json_field "$m2" jobs_rendered)" = 0 ] \
    && [ "$(stat -c %Y "$W"/out/*.png | sort | tr '\n' ' ')" = "$before" ] \
    && ok "resubmitted with --skip-existing: 4 jobs skipped, 0 rendered, PNGs untouched" \
    || fail "skip-existing job $job2 ($state): $(tr -d '\n' <"$m2" 2>&1 | head -c 300) $(tail -3 "$W/tpgen-$job2.log" 2>&1)"
# --- scripts/slurm-serve.sbatch unchanged: a server in a job, a request, scancel --full --signal=USR1 ---
echo "slurm-serve-test-key" >"$W/key" && chmod 600 "$W/key"
sjob=$(cd "$W" && MODEL="$W/model" TPGEN="$TPGEN" KEY_FILE="$W/key" PORT=0 timeout 30 sbatch --parsable --nodes=1 \
    --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=00:10:00 "$TPGEN_ROOT/scripts/slurm-serve.sbatch" \
    2>"$D/sbatch.err") || die "sbatch slurm-serve failed: $(cat "$D/sbatch.err")"
slog=$W/tpgen-serve-$sjob.log
for _ in $(seq 1 600); do grep -q "ready after" "$slog" 2>/dev/null && break; sleep 0.2; done
sport=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$slog" 2>/dev/null | head -1)
if [ -n "$sport" ]; then
    curl -s -H "Authorization: Bearer slurm-serve-test-key" "http://127.0.0.1:$sport/v1/images/generations" \
        -d '{"prompt": "a red fox in the snow", "size": "64x48", "seed": 5, "steps": 2}' | jq -r '.data[0].b64_json' |
        base64 -d >"$W/served.png" 2>/dev/null
    grep -aq "prompt: a red fox in the snow" "$W/served.png" && grep -aq "tp: 2" "$W/served.png" &&
        ok "sbatch scripts/slurm-serve.sbatch: the server answers with the API key (tp 2 over srun)" ||
        fail "slurm-serve: no image: $(tail -3 "$slog")"
else
    fail "slurm-serve: the server did not become ready: $(tail -5 "$slog" 2>&1)"
fi
timeout 10 scancel --full --signal=USR1 "$sjob"
state=$(wait_job "$sjob")
[ "$state" = COMPLETED ] && grep -q "serve: stopped" "$slog" && ok "scancel --full --signal=USR1: graceful stop, job COMPLETED" ||
    fail "slurm-serve job $sjob ended $state: $(tail -3 "$slog" 2>&1)"
stop_daemons
left=$(pgrep -f "$D/" | wc -l)
[ "$left" = 0 ] && ok "every daemon stopped" || fail "$left processes of this Slurm still run"
