#!/usr/bin/env bash
# budget: 5 s; checks: 7
# --backend cuda on a machine without a usable GPU (CI, this build host): every
# rank must fail with a clear message, printed once, and a non-zero exit. In a
# build without CUDA the message must say so instead. On a machine with a GPU
# the same commands must get past backend selection (no "no usable GPU").
source "$TPGEN_ROOT/tests/lib.sh"

# the CUDA backend is a plugin beside the binary (kernels/cuda_plugin.c)
has_cuda_build() { [ -e "$(dirname "$TPGEN")/libtpgen-cuda.so" ]; }
gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

if has_cuda_build; then want='no usable GPU is visible'; else want='built without the CUDA backend'; fi

# per_rank NAME CMD...: run CMD on 2 ranks; every rank must exit non-zero and
# the error must appear exactly once, matching $want
per_rank() {
    local name=$1; shift
    local out
    out=$($MPIRUN -np 2 bash -c '"$@"; echo "rank-exit ${OMPI_COMM_WORLD_RANK:-0} $?"' _ "$@" 2>&1)
    if echo "$out" | grep -qE 'Segmentation|core dumped|AddressSanitizer|LeakSanitizer|runtime error'; then
        fail "$name: crashed: $(echo "$out" | tail -3)"; return
    fi
    local zero nerr
    zero=$(echo "$out" | grep -cE '^rank-exit [0-9]+ 0$')
    nerr=$(echo "$out" | grep -c 'tpgen: error:.*'"$want")
    if [ "$(echo "$out" | grep -c '^rank-exit ')" -ne 2 ]; then fail "$name: not every rank finished: $(echo "$out" | tail -3)"
    elif [ "$zero" -ne 0 ]; then fail "$name: a rank exited 0: $(echo "$out" | tail -3)"
    elif [ "$nerr" -ne 1 ]; then fail "$name: expected the message '$want' once, got $nerr: $(echo "$out" | tail -4)"
    else ok "$name"; fi
}

model=$TPGEN_GOLDEN/flux2-tiny-a/model
if gpu_visible && has_cuda_build; then
    # a GPU is here: selection must succeed (the real checks are in scripts/gpu-check.sh)
    out=$("$TPGEN" check --model "$model" --backend cuda 2>&1)
    if echo "$out" | grep -q 'no usable GPU'; then fail "cuda: GPU visible but --backend cuda refused"; else ok "cuda: --backend cuda selected on a GPU machine"; fi
else
    per_rank "cuda: check --backend cuda fails cleanly on every rank" "$TPGEN" check --model "$model" --backend cuda
    per_rank "cuda: generate --backend cuda fails cleanly on every rank" "$TPGEN" --model "$TPGEN_GOLDEN/klein-tiny/model" \
        --prompt "a cat" --backend cuda --output "$TMP/x.png"
    [ ! -e "$TMP/x.png" ] && ok "cuda: a failed generate leaves no output" || fail "cuda: a failed generate left an image behind"
    per_rank "cuda: encode --backend cuda fails cleanly on every rank" "$TPGEN" encode --model "$TPGEN_GOLDEN/klein-tiny/model" \
        --prompt "a cat" --backend cuda --save-embeds "$TMP/e.safetensors"
    [ ! -e "$TMP/e.safetensors" ] && ok "cuda: a failed encode leaves no output" || fail "cuda: a failed encode left a file behind"
    per_rank "cuda: decode --backend cuda fails cleanly on every rank" "$TPGEN" decode --model "$TPGEN_GOLDEN/vae-tiny/model" \
        --latents "$TPGEN_GOLDEN/vae-tiny/vae_cases.safetensors:case0.packed_latents" --height 48 --width 80 \
        --backend cuda --output "$TMP/d.png"
    [ ! -e "$TMP/d.png" ] && ok "cuda: a failed decode leaves no output" || fail "cuda: a failed decode left an image behind"
fi
