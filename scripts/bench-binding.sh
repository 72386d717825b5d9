#!/usr/bin/env bash
# `tpgen bench forward` under a plain `mpirun -np 1` (Open MPI's default
# binding, which tpgen widens to the rank's share of the node) against the
# same command without mpirun, alternated in one run (A B A B) so that both
# see the same machine load. Prints each run's seconds per forward and the
# ratio of the medians (mpirun / plain); it should be <= 1.10.
# Usage: scripts/bench-binding.sh [ROUNDS] [bench forward options...]
set -euo pipefail
cd "$(dirname "$0")/.."
T=build/tpgen
rounds=${1:-2}; shift || true
unset OMP_NUM_THREADS
run() { "$@" $T bench forward --precision bf16 "${opts[@]}" 2>&1 | sed -n "s/^bf16 .* \([0-9.]*\) s\/forward.*/\1/p" | head -1; }
opts=("$@")
a=() b=()
for i in $(seq 1 "$rounds"); do
    x=$(run mpirun --allow-run-as-root -np 1); a+=("$x")
    y=$(run env); b+=("$y")
    echo "round $i: mpirun -np 1: $x s/forward, plain: $y s/forward"
done
med() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ma=$(med "${a[@]}") mb=$(med "${b[@]}")
echo "median: mpirun -np 1 $ma s, plain $mb s, ratio $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.3f", a/b}')"
