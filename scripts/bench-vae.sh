#!/usr/bin/env bash
# tpgen's VAE against diffusers' AutoencoderKLFlux2 on torch (CPU), side by side in one run: the same
# FLUX.2 shapes, random weights, the same thread count, decoder and encoder, f32 and bf16, REPEAT runs
# each, medians of the wall time and of the CPU seconds (all threads; less disturbed by other jobs). The two sides alternate run by run, so that a change of load on a shared machine hits
# both; each run is a fresh process (model construction and torch's import are not timed; torch gets
# one untimed warm-up run first, as oneDNN builds its kernels on the first call; tpgen gets none). Not part of the test suite.
#
#   scripts/bench-vae.sh [SIZE] [REPEAT] [THREADS]      (defaults 512 3 2; PARTS="decoder encoder", PRECS="f32 bf16")
#
# Needs build/tpgen and a venv with torch + diffusers (see scripts/bench-vae-torch.py for the setup);
# TORCH_PY overrides the venv's python (default /work/venv-torch/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-512} repeat=${2:-3} threads=${3:-2}
py=${TORCH_PY:-/work/venv-torch/bin/python}
export OMP_NUM_THREADS=$threads
[ -x build/tpgen ] || { echo "bench-vae.sh: build/tpgen is missing (run make)" >&2; exit 1; }
"$py" -c "import torch, diffusers" 2>/dev/null || { echo "bench-vae.sh: $py has no torch/diffusers" >&2; exit 1; }
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc --all) CPUs," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg), $threads threads, size $size, $repeat repeats"
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for part in ${PARTS:-decoder encoder}; do
    flag=; [ $part = encoder ] && flag=--encoder
    for prec in ${PRECS:-f32 bf16}; do
        ts=() ps=() tc=() pc=()
        for r in $(seq "$repeat"); do # alternate the two sides run by run
            read -r a b < <(build/tpgen bench vae $flag --sizes "$size" --precision $prec --repeat 1 |
                            awk '$1 ~ /^[0-9]+$/ {print $3, $9}')
            ts+=("$a") tc+=("$b")
            read -r a b < <("$py" scripts/bench-vae-torch.py $flag --sizes "$size" --precision $prec --repeat 1 \
                                --threads "$threads" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ {print $3, $5}')
            ps+=("$a") pc+=("$b")
        done
        t=$(printf '%s\n' "${ts[@]}" | med) p=$(printf '%s\n' "${ps[@]}" | med)
        T=$(printf '%s\n' "${tc[@]}" | med) P=$(printf '%s\n' "${pc[@]}" | med)
        awk -v part=$part -v prec=$prec -v t="$t" -v p="$p" -v T="$T" -v P="$P" -v tl="${ts[*]}" -v pl="${ps[*]}" \
            'BEGIN { printf "%-8s %-5s wall: tpgen %6.2f s torch %6.2f s ratio %.2f | CPU: tpgen %6.2f s torch %6.2f s ratio %.2f   (wall tpgen: %s; torch: %s)\n",
                     part, prec, t, p, t / p, T, P, T / P, tl, pl }'
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
