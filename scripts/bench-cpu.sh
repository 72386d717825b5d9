#!/usr/bin/env bash
# The CPU benchmarks behind the README's figures, in one run. Prints the
# machine first; writes the whole log to ${OUT:-out}/bench-cpu.log.
#   scripts/bench-cpu.sh [--quick]      (--quick: skip the 7.75 GB load benchmark)
# Needs ~9 GB of free disk in $TMPDIR for the load benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0; [ "${1:-}" = --quick ] && quick=1
out=${OUT:-out}; mkdir -p "$out"; log=$out/bench-cpu.log
T=build/tpgen
MPIRUN=(mpirun --oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
cores=$(nproc)
# bind NP: mpirun that gives each of NP ranks its own cores/NP cores (tpgen
# sizes its threads from them); shared cores when there are fewer cores than ranks
bind() {
    local r=(mpirun); [ "$(id -u)" = 0 ] && r+=(--allow-run-as-root)
    if [ "$cores" -ge "$1" ]; then r+=(--map-by "ppr:$1:node:pe=$((cores / $1))"); else r+=(--oversubscribe --bind-to none); fi
    echo "${r[@]}"
}
{
echo "# tpgen $($T --version) CPU benchmarks, $(date -u +%F)"
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores, $(free -g | awk '/Mem:/{print $2}') GB RAM, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo; echo "## bench gemm ($cores threads, then 1 thread)"
$T bench gemm --threads "$cores"
$T bench gemm --threads 1 --ops --quick
echo; echo "## bench forward: klein-4B widths, 2 double + 2 single blocks, 1024 image + 128 text tokens"
$(bind 1) -np 1 $T bench forward --precision both --iters 2
$(bind 2) -np 2 $T bench forward --precision both --iters 2
echo; echo "## bench encoder: Qwen3-4B shapes, 512 tokens, 4 layers timed, extrapolated to 27"
$(bind 1) -np 1 $T bench encoder --layers 4 --precision bf16
$(bind 2) -np 2 $T bench encoder --layers 4 --precision bf16
echo; echo "## bench vae: FLUX.2 VAE shapes, random weights"
$T bench vae --sizes 512 --precision f32,bf16
echo; echo "## bench tokenizer"
$T bench tokenizer
echo; echo "## bench allreduce (2 ranks)"
OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 $T bench allreduce --max 16M --dtype both
if [ $quick = 0 ]; then
    d=$(mktemp -d "${TMPDIR:-/tmp}/tpgen-load-XXXXXX")
    echo; echo "## bench load: klein-4B-shaped BF16 checkpoint (7.75 GB, random) in $d"
    $T bench load --make "$d" --shape klein-4b >/dev/null
    for np in 1 2 4; do
        for mode in sharded naive; do
            OMP_NUM_THREADS=1 "${MPIRUN[@]}" -np $np $T bench load --model "$d" --mode $mode
        done
    done
    rm -rf "$d"
fi
} 2>&1 | tee "$log"
