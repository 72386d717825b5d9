#!/usr/bin/env bash
# budget: 40 s; checks: 11
# The parallel mesh (docs/parallel.md): world = dp x cfg x sp x tp. CFG
# parallelism (--cfg-parallel) must give the serial CFG run's latents and
# pixels byte for byte at the same tp (klein base, with and without a
# reference, bf16 and f32, tp 1 and tp 2; FLUX.3 base with references), the
# PNG records the mesh, comm_bytes_per_step counts the CFG exchange by the
# ring formula, and every refusal is one clear error before loading, on
# every rank, with no output.
. "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
M=$TMP/klein-base
"$TPGEN" make-tiny --out "$M" --seed 1 >/dev/null 2>&1 || fail "mesh: make-tiny"
jq '{_class_name: "Flux2KleinPipeline"}' "$M/model_index.json" >"$TMP/mi.json" && mv "$TMP/mi.json" "$M/model_index.json"
D=$TMP/klein
"$TPGEN" make-tiny --out "$D" --seed 1 >/dev/null 2>&1 || fail "mesh: make-tiny (distilled)"
REF=$TPGEN_ROOT/tests/data/flux3-pipe/ref.png

# the PNG's image data (IDAT) and its parameters text
idat() { python3 -c '
import hashlib, struct, sys
b = open(sys.argv[1], "rb").read(); p = 8; h = hashlib.sha256()
while p < len(b):
    n, = struct.unpack(">I", b[p:p+4]); t = b[p+4:p+8]
    if t == b"IDAT": h.update(b[p+8:p+8+n])
    p += 12 + n
print(h.hexdigest())' "$1"; }
params() { python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(); p = 8
while p < len(b):
    n, = struct.unpack(">I", b[p:p+4]); t = b[p+4:p+8]; d = b[p+8:p+8+n]; p += 12 + n
    if t == b"tEXt" and d.startswith(b"parameters\0"): print(d.split(b"\0", 1)[1].decode("latin-1"))' "$1"; }

# same NAME NPS NPC ARGS...: serial at NPS ranks vs --cfg-parallel at NPC ranks, the same --tp in ARGS
same() {
    local name=$1 nps=$2 npc=$3 out; shift 3
    if ! out=$($MPIRUN -np "$nps" "$TPGEN" "$@" --output "$TMP/$name-s.png" --save-latents "$TMP/$name-s.st" 2>&1); then
        fail "mesh $name: the serial run failed: $(echo "$out" | tail -2 | tr '\n' ' ')"; return
    fi
    if ! out=$($MPIRUN -np "$npc" "$TPGEN" "$@" --cfg-parallel --output "$TMP/$name-c.png" --save-latents "$TMP/$name-c.st" \
               --json-metrics "$TMP/$name-c.json" 2>&1); then
        fail "mesh $name: the --cfg-parallel run failed: $(echo "$out" | tail -2 | tr '\n' ' ')"; return
    fi
    cmp -s "$TMP/$name-s.st" "$TMP/$name-c.st" && [ "$(idat "$TMP/$name-s.png")" = "$(idat "$TMP/$name-c.png")" ] &&
        ok "mesh $name: --cfg-parallel on $npc ranks = serial CFG on $nps, latents and pixels byte for byte" ||
        fail "mesh $name: --cfg-parallel differs from the serial CFG run"
}
K=(--model "$M" --prompt "a fox" --negative-prompt "blurry" --width 48 --height 32 --steps 2 --guidance 3 --backend cpu)
same klein-bf16 1 2 "${K[@]}" --tp 1
same klein-f32-ref 1 2 "${K[@]}" --tp 1 --precision f32 --image "$REF"
same klein-tp2 2 4 "${K[@]}" --tp 2 --precision f32 --image "$REF"
pc=$(params "$TMP/klein-tp2-c.png"); ps=$(params "$TMP/klein-tp2-s.png")
echo "$pc" | grep -q '^mesh: cfg 2 x sp 1 x tp 2$' && ! echo "$ps" | grep -q '^mesh:' && echo "$ps" | grep -q '^tp: 2$' &&
    ok "mesh: the PNG parameters record the mesh (cfg 2 x sp 1 x tp 2), the serial run's none" ||
    fail "mesh: parameters: $(echo "$pc" | tr '\n' '|')"

# FLUX.3 base: precomputed embeddings with negative ones, a reference
F=$TMP/flux3-base
flux3_folder base "$F"
E=$TPGEN_ROOT/tests/data/flux3-pipe/base_ref.safetensors
same flux3-base 1 2 --model "$F" --prompt-embeds "$E" --negative-prompt-embeds "$E" --image "$REF" --steps 2 \
    --precision f32 --backend cpu --tp 1

# the CFG exchange by the ring formula: an all-gather of [v; vn] (2 x N x C f32) over 2 ranks sends N x C x 4
# bytes per rank and step (tp 1: nothing else is sent while denoising)
C=$(jq .in_channels "$M/transformer/config.json")
want=$((48 / 16 * 32 / 16 * C * 4))
got=$(jq -c '.comm_bytes_per_step' "$TMP/klein-bf16-c.json" 2>/dev/null)
[ "$got" = "[$want,$want]" ] && ok "mesh: comm_bytes_per_step of --cfg-parallel at tp 1 = N x C x 4 = $want per rank" ||
    fail "mesh: comm_bytes_per_step $got, the formula gives [$want,$want]"

# refusals: one message, a non-zero exit on every rank, nothing written, before loading
refused() {
    local name=$1 np=$2 pat=$3 out rc; shift 3
    rm -f "$TMP/r.png"
    out=$($MPIRUN -np "$np" "$TPGEN" "$@" --output "$TMP/r.png" 2>&1); rc=$?
    local n
    n=$(echo "$out" | grep -c '^tpgen: error:')
    if [ $rc -ne 0 ] && [ "$n" = 1 ] && echo "$out" | grep -qE -- "$pat" && [ ! -e "$TMP/r.png" ] &&
       ! echo "$out" | grep -q 'load '; then
        ok "mesh refusal: $name"
    else
        fail "mesh refusal $name (rc $rc, $n errors): $(echo "$out" | tail -3 | tr '\n' ' ')"
    fi
}
refused "--cfg-parallel on klein distilled" 2 "cfg-parallel runs the two CFG predictions.*guidance-distilled" \
    --model "$D" --prompt "a fox" --width 32 --height 32 --steps 1 --backend cpu --cfg-parallel
refused "--cfg-parallel on klein base at guidance 1" 2 "at this guidance runs one prediction" \
    "${K[@]}" --guidance 1 --cfg-parallel
refused "--cfg-parallel on 3 ranks" 3 "--cfg-parallel x --sp 1 does not divide the number of MPI ranks \(3\)" \
    "${K[@]}" --cfg-parallel
refused "a mesh that does not divide the world, naming the --tp that fit" 4 "groups of 6 ranks.*--tp 1, 2 fit" "${K[@]}" --cfg-parallel --tp 3
refused "tp x sp not dividing the heads" 3 "tp 3 x sp 1 = 3 does not divide num_attention_heads 4" "${K[@]}" --tp 3
