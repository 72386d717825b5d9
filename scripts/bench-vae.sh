#!/usr/bin/env bash
# tpgen's VAE against diffusers' AutoencoderKLFlux2 on torch (CPU), side by side in one run: the same
# FLUX.2 shapes, random weights, the same thread count, decoder and encoder, f32 and bf16, REPEAT runs
# each, medians. The two sides alternate run by run, so that a change of load on a shared machine hits
# both; each run is a fresh process (model construction and torch's import are not timed). Not part of the test suite.
#
#   scripts/bench-vae.sh [SIZE] [REPEAT] [THREADS]      (defaults 512 3 2)
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
for part in decoder encoder; do
    flag=; [ $part = encoder ] && flag=--encoder
    for prec in f32 bf16; do
        ts=() ps=()
        for r in $(seq "$repeat"); do # alternate the two sides run by run
            ts+=("$(build/tpgen bench vae $flag --sizes "$size" --precision $prec --repeat 1 | awk '$1 ~ /^[0-9]+$/ {print $3}')")
            ps+=("$("$py" scripts/bench-vae-torch.py $flag --sizes "$size" --precision $prec --repeat 1 \
                      --threads "$threads" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ {print $3}')")
        done
        t=$(printf '%s\n' "${ts[@]}" | med) p=$(printf '%s\n' "${ps[@]}" | med)
        awk -v part=$part -v prec=$prec -v t="$t" -v p="$p" -v tl="${ts[*]}" -v pl="${ps[*]}" \
            'BEGIN { printf "%-8s %-5s tpgen %7.2f s  torch %7.2f s  ratio %.2f   (tpgen: %s; torch: %s)\n", part, prec, t, p, t / p, tl, pl }'
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
