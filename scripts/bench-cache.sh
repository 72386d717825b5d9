#!/usr/bin/env bash
# Block caching, measured (docs/cache.md): the same job uncached and with
# each --cache setting, side by side, one after the other.
#
#   scripts/bench-cache.sh MODEL SIZE STEPS [NP] [SPEC...]
#
# MODEL: a pipeline folder with prompt_embeds.safetensors (tpgen make-tiny
# writes one); SIZE in pixels (square); NP ranks (default 1); SPECs default
# to the presets "balanced" and "fast". Prints per run: denoise seconds and
# s/step, the cached block-group steps (double, single), the relative L2
# distance of the final latents from the uncached run's, and the PSNR of the
# PNG against the uncached PNG (scripts/psnr.c). cpu_s is the CPU seconds of
# the whole run, all ranks (load and decode are the same in every run, so on
# a shared machine its differences are the steadier measure of what the cache
# saved than the wall time). Random weights say nothing
# about quality: the published figures for real weights are in docs/cache.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TPGEN=${TPGEN:-$ROOT/build/tpgen}
MODEL=$1 SIZE=$2 STEPS=$3 NP=${4:-1}
shift $(($# < 4 ? $# : 4))
SPECS=("$@")
[ ${#SPECS[@]} -gt 0 ] || SPECS=(balanced fast)
T=$(mktemp -d /tmp/bench-cache-XXXXXX)
trap 'rm -rf "$T"' EXIT
cc -std=c17 -O2 -o "$T/psnr" "$ROOT/scripts/psnr.c" -lpng -lm
MPIRUN=${MPIRUN:-mpirun --oversubscribe --allow-run-as-root --bind-to none}
run() {   # NAME SPEC
    /usr/bin/time -f '%U %S' -o "$T/$1.cpu" $MPIRUN -np "$NP" "$TPGEN" generate --model "$MODEL" --prompt-embeds "$MODEL/prompt_embeds.safetensors" \
        --width "$SIZE" --height "$SIZE" --steps "$STEPS" --seed 1 --cache "$2" --output "$T/$1.png" \
        --save-latents "$T/$1.st" --json-metrics "$T/$1.json" >"$T/$1.log" 2>&1
}
rel_l2() {
    python3 - "$1" "$2" <<'EOF'
import json, struct, sys, math
def lat(p):
    b = open(p, 'rb').read(); n, = struct.unpack('<Q', b[:8]); h = json.loads(b[8:8 + n]); s, e = h['latents']['data_offsets']
    return struct.unpack('<%df' % ((e - s) // 4), b[8 + n + s:8 + n + e])
a, b = lat(sys.argv[1]), lat(sys.argv[2])
print('%.4g' % (math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))) / math.sqrt(sum(y * y for y in b))))
EOF
}
echo "# $(date -u +%FT%TZ) $(uname -n), load $(cut -d' ' -f1-3 /proc/loadavg): $MODEL ${SIZE}x$SIZE, $STEPS steps, np $NP"
printf '%-60s %10s %8s %8s %14s %12s %10s\n' cache denoise_s s/step cpu_s cached_d/s rel_l2 psnr_db
cpu() { awk '{printf "%.1f", $1 + $2}' "$T/$1.cpu"; }
run off off
den() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%.2f %.3f' % (j['seconds']['denoise'], j['seconds_per_step']))" "$1"; }
read -r d s <<< "$(den "$T/off.json")"
printf '%-60s %10s %8s %8s %14s %12s %10s\n' off "$d" "$s" "$(cpu off)" "0/0" 0 inf
for i in "${!SPECS[@]}"; do
    run "c$i" "${SPECS[$i]}"
    read -r d s <<< "$(den "$T/c$i.json")"
    spec=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['cache'])" "$T/c$i.json")
    cached=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['cache_decisions'][0]; print('%d/%d' % (d['double'].count('K'), d['single'].count('K')))" "$T/c$i.json")
    printf '%-60s %10s %8s %8s %14s %12s %10s\n' "${SPECS[$i]} ($spec)" "$d" "$s" "$(cpu "c$i")" "$cached" \
        "$(rel_l2 "$T/c$i.st" "$T/off.st")" "$("$T/psnr" "$T/c$i.png" "$T/off.png" | awk '{print $NF}')"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
