#!/usr/bin/env bash
# `tpgen bench forward` with bf16 weights against GGUF-quantised block
# linears (--quantize T), each type both on the int8-dot kernel
# (kernels/cpu/cpu_gemm_qdot.c, the default) and on the dequantising packed
# path (TPGEN_QDOT=0), all back to back in one run, ROUNDS times in turn so
# that every variant sees the same machine load. Prints per run the load
# average, s/forward and GEMM GFLOP/s, then per variant the median s/forward
# and its speed against bf16 (bf16 s / variant s, same round, median).
# DEQUANT=0 leaves out the dequantising runs; TOKENS="1024 128" sets the image and text tokens.
# Usage: scripts/bench-quant.sh [ROUNDS] [NP] [types...]   (defaults: 1, 1, Q8_0 Q6_K Q4_K)
# Widths: klein-4B (D 3072, MLP 9216), 1 double + 1 single block, 256 image + 64 text tokens (TOKENS), bf16 activations.
set -uo pipefail
cd "$(dirname "$0")/.."
T=build/tpgen
rounds=${1:-1}; np=${2:-1}; shift 2 2>/dev/null || shift $#
types=("$@"); [ ${#types[@]} -eq 0 ] && types=(Q8_0 Q6_K Q4_K)
# TOKENS="IMAGE TEXT" changes the token counts (default "256 64"; "1024 128" is a 512x512 job's)
read -r itok ttok <<<"${TOKENS:-256 64}"
opts=(--precision bf16 --double 1 --single 1 --image-tokens "$itok" --text-tokens "$ttok" --iters 2)
launch=(); if [ "$np" -gt 1 ]; then launch=(mpirun --oversubscribe --bind-to none -np "$np"); [ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root); fi
# DEQUANT=0: only the int8 route (no TPGEN_QDOT=0 runs)
variants=(bf16); for t in "${types[@]}"; do variants+=("$t"); [ "${DEQUANT:-1}" = 0 ] || variants+=("$t/dequant"); done
declare -A secs
echo "# $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), tp $np, $rounds round(s)"
nv=${#variants[@]}
for r in $(seq 1 "$rounds"); do
    for ((k = 0; k < nv; k++)); do
        v=${variants[$(((k + r - 1) % nv))]}   # each round starts one variant later
        q=(); env=(env)
        case $v in bf16) ;; */dequant) q=(--quantize "${v%/dequant}"); env+=(TPGEN_QDOT=0) ;; *) q=(--quantize "$v") ;; esac
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        out=$("${env[@]}" "${launch[@]}" $T bench forward "${opts[@]}" "${q[@]}" 2>&1)
        s=$(sed -n 's/^bf16.* fused *\([0-9.]*\) s\/forward.*/\1/p' <<<"$out" | head -1)
        gf=$(sed -n 's/^ *gemm: .*(\([0-9.]*\) GFLOP\/s per rank).*/\1/p' <<<"$out" | head -1)
        [ -n "$s" ] || { echo "FAIL - $v: no result"; echo "$out" | tail -5; exit 1; }
        secs[$r,$v]=$s
        printf 'round %d  %-12s load %s  %6.3f s/forward  gemm %6.1f GFLOP/s per rank\n' "$r" "$v" "$load" "$s" "$gf"
    done
done
echo "# variant, median s/forward, speed vs bf16 (median over rounds of bf16 s / variant s)"
for v in "${variants[@]}"; do
    ss=$(for r in $(seq 1 "$rounds"); do echo "${secs[$r,$v]}"; done | sort -g | awk '{a[NR]=$1} END {print NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    rr=$(for r in $(seq 1 "$rounds"); do echo "${secs[$r,bf16]} ${secs[$r,$v]}" | awk '{printf "%.3f\n", $1/$2}'; done | sort -g | awk '{a[NR]=$1} END {print NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    printf '%-12s %6.3f s  %5.2fx\n' "$v" "$ss" "$rr"
done
