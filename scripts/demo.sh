#!/usr/bin/env bash
# The first thing to run: installs the build dependencies (Debian/Ubuntu),
# builds tpgen, writes a tiny random FLUX.2-klein pipeline into ./demo and
# renders it on two CPU ranks with tensor parallelism (tp 2).
#
# The tiny model has random weights, so the "image" is structured noise: the
# point is the whole path (sharded load, TP denoising, VAE, PNG) in seconds,
# without downloading 10-60 GB of weights. For a real model see README.md.
#
#   scripts/demo.sh            (SKIP_DEPS=1 to skip the apt-get step)
set -euo pipefail
cd "$(dirname "$0")/.."

have_deps() {
    command -v mpicc >/dev/null && command -v mpirun >/dev/null &&
        for h in yaml.h jansson.h pcre2.h utf8proc.h zlib.h png.h jpeglib.h stb/stb_image_write.h; do
            [ -e "/usr/include/$h" ] || return 1
        done
}
if [ "${SKIP_DEPS:-0}" != 1 ] && ! have_deps; then
    echo "== installing build dependencies (apt-get)"
    scripts/install-deps.sh
fi

echo "== building"
make -j"$(nproc)" >/dev/null

echo "== writing a tiny random pipeline to ./demo"
rm -rf demo
build/tpgen make-tiny --out demo --seed 0

# each rank gets its own half of the cores (tpgen sizes its threads from them)
cores=$(nproc)
if [ "$cores" -ge 2 ]; then MPIRUN=(mpirun -np 2 --map-by "ppr:2:node:pe=$((cores / 2))")
else MPIRUN=(mpirun -np 2 --oversubscribe --bind-to none); fi
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
args=(--model demo --prompt "a lighthouse on a cliff at dusk" --width 256 --height 256 --seed 42 --backend cpu
      --tp 2 --output demo/demo.png --save-latents demo/latents.safetensors --json-metrics demo/metrics.json)

echo "== rendering on 2 CPU ranks: ${MPIRUN[*]} build/tpgen ${args[*]}"
"${MPIRUN[@]}" build/tpgen "${args[@]}"

echo "== done"
echo "   image:   demo/demo.png (its generation parameters are in the PNG's 'parameters' text chunk)"
echo "   latents: demo/latents.safetensors"
echo "   figures: demo/metrics.json"
