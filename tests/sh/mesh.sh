#!/usr/bin/env bash
# budget: 180 s; checks: 47
# The parallel mesh (docs/parallel.md): world = dp x cfg x sp x tp. CFG
# parallelism (--cfg-parallel) must give the serial CFG run's latents and
# pixels byte for byte at the same tp (klein base, with and without a
# reference, bf16 and f32, tp 1 and tp 2; FLUX.3 base with references);
# Ulysses SP (--sp) the one-rank run's at 2, 3 and 4 ranks (klein, klein
# base with CFG, dev, FLUX.3 base and flow-map; token counts the degree does not divide, a reference, an
# image of one token; KV-cached references with two images at sp 2 and 3, against the plain pipeline, a
# batch of them on dp 2 x sp 2, and their cache's bytes per rank), TP x SP within 1e-5 of tp 1 in f32
# (klein-kv: tp 2 x sp 2 = tp 2 byte for byte); the PNG records
# the mesh, comm_bytes_per_step matches the ring formulas (CFG exchange;
# sp 4 against tp 4, at most 0.6x), the prompts are encoded on different TP
# groups at once (prompts_encoded per rank; a failure there agreed; the
# pixels unchanged), the VAE runs over the whole group where the CPU is
# rows-invariant (decode_bands per rank; the bytes unchanged), and every refusal is one clear error
# before loading, on every rank, with no output. One OpenMP thread per rank
# everywhere: the VAE encoder's f32 result depends on the thread count.
. "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
MPIRUN="$MPIRUN -x OMP_NUM_THREADS"
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
# rel_l2 A B: the relative L2 distance of two --save-latents files' f32 latents
rel_l2() { python3 -c '
import array, math, struct, sys
def lat(f):
    b = open(f, "rb").read(); n, = struct.unpack("<Q", b[:8]); a = array.array("f"); a.frombytes(b[8 + n:]); return a
a, b = lat(sys.argv[1]), lat(sys.argv[2])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
print(math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(x * x for x in a)))' "$1" "$2"; }
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

# Ulysses SP: the one-rank run's latents and pixels at --sp 2 and 4
# sp NAME NP ARGS...: one rank vs --sp NP on NP ranks
sp() {
    local name=$1 np=$2 out; shift 2
    if ! out=$("$TPGEN" "$@" --output "$TMP/$name-1.png" --save-latents "$TMP/$name-1.st" 2>&1); then
        fail "mesh sp $name: the one-rank run failed: $(echo "$out" | tail -2 | tr '\n' ' ')"; return
    fi
    if ! out=$($MPIRUN -np "$np" "$TPGEN" "$@" --sp "$np" --output "$TMP/$name-sp.png" --save-latents "$TMP/$name-sp.st" \
               --json-metrics "$TMP/$name-sp.json" 2>&1); then
        fail "mesh sp $name: the --sp $np run failed: $(echo "$out" | tail -2 | tr '\n' ' ')"; return
    fi
    cmp -s "$TMP/$name-1.st" "$TMP/$name-sp.st" && [ "$(idat "$TMP/$name-1.png")" = "$(idat "$TMP/$name-sp.png")" ] &&
        ok "mesh sp $name: --sp $np = one rank, latents and pixels byte for byte" ||
        fail "mesh sp $name: --sp $np differs from the one-rank run"
}
KD=(--model "$D" --prompt "a fox" --steps 2 --backend cpu)
sp klein-bf16-ref 2 "${KD[@]}" --width 48 --height 32 --image "$REF"        # 6 + 16 reference tokens
sp klein-bf16-uneven 4 "${KD[@]}" --width 48 --height 32                    # 6 image tokens over 4 ranks
sp klein-f32-one-token 4 "${KD[@]}" --width 16 --height 16 --precision f32  # ranks without an image row
sp klein-base-cfg 2 "${K[@]}" --precision f32 --image "$REF"
V=$TMP/dev
"$TPGEN" make-tiny --out "$V" --family dev --seed 2 >/dev/null 2>&1 || fail "mesh: make-tiny dev"
sp dev-f32 4 --model "$V" --prompt "a fox" --steps 2 --backend cpu --width 80 --height 48 --precision f32  # 15 tokens
# FLUX.3: mode blocks attend within a mode, single blocks over text, image and reference tokens
sp flux3-base-bf16 2 --model "$F" --prompt-embeds "$E" --negative-prompt-embeds "$E" --image "$REF" --steps 2 --backend cpu
G=$TMP/flux3-flowmap
flux3_folder flowmap "$G"
sp flux3-flowmap-f32 3 --model "$G" --prompt-embeds "$TPGEN_ROOT/tests/data/flux3-pipe/flowmap_ref.safetensors" \
    --image "$REF" --steps 2 --backend cpu --precision f32
# KV-cached references (Flux2KleinKVPipeline) under SP: the reference K/V kept in the layout after the
# all-to-all (all R reference tokens x heads / sp); two references (r0 64x80: 4 x 5 tokens, r1 100x70 at
# 96x64: 6 x 4, R = 44), token counts the degree does not divide (15 image + 44 over 2; 8 + 44 over 3, on a
# 6-head folder: make-tiny --heads 6)
KV=$TMP/klein-kv
cp -r "$D" "$KV" && jq '{_class_name: "Flux2KleinKVPipeline", is_distilled: true}' "$D/model_index.json" >"$KV/model_index.json"
KV6=$TMP/klein-kv6
"$TPGEN" make-tiny --out "$KV6" --seed 1 --heads 6 >/dev/null 2>&1 || fail "mesh: make-tiny --heads 6"
jq '{_class_name: "Flux2KleinKVPipeline", is_distilled: true}' "$D/model_index.json" >"$KV6/model_index.json"
RG=$TPGEN_GOLDEN/klein-tiny-edit/refs
KVR=(--prompt "a fox" --steps 3 --backend cpu --image "$RG/r0_64x80.png" --image "$RG/r1_100x70.png")
sp klein-kv-bf16 2 --model "$KV" "${KVR[@]}" --width 80 --height 48
sp klein-kv-f32-sp3 3 --model "$KV6" "${KVR[@]}" --width 64 --height 32 --precision f32
# block caching over KV-cached references at --sp 2 (a threshold above this random model's residual diffs, so
# that steps are served from the cache): the same decisions as one rank, latents byte for byte
KC=(--model "$KV" "${KVR[@]}" --width 80 --height 48 --steps 6 --cache fn=1,bn=0,warmup=1,threshold=1.2 --precision f32)
if "$TPGEN" "${KC[@]}" --save-latents "$TMP/kvc-1.st" --json-metrics "$TMP/kvc-1.json" --no-decode >/dev/null 2>&1 &&
   $MPIRUN -np 2 "$TPGEN" "${KC[@]}" --sp 2 --save-latents "$TMP/kvc-2.st" --json-metrics "$TMP/kvc-2.json" --no-decode \
       >/dev/null 2>&1; then
    d1=$(jq -c '.cache_decisions[0] | [.double, .single]' "$TMP/kvc-1.json") d2=$(jq -c '.cache_decisions[0] | [.double, .single]' "$TMP/kvc-2.json")
    [ "$d1" = "$d2" ] && echo "$d1" | grep -q K && cmp -s "$TMP/kvc-1.st" "$TMP/kvc-2.st" &&
        ok "mesh kv: --cache over KV-cached references at --sp 2: decisions $d1 as one rank's, latents byte for byte" ||
        fail "mesh kv: --cache with KV at --sp 2: decisions $d1 vs $d2, or the latents differ"
else fail "mesh kv: --cache with KV: a run failed"; fi
# what each rank holds, in the summary's JSON: K and V of every block, R tokens x D / sp, e bytes
kvb=$(jq -c .kv_cache_bytes "$TMP/klein-kv-bf16-sp.json" 2>/dev/null)
want=$(jq '2 * (.num_layers + .num_single_layers) * 44 * (.num_attention_heads * .attention_head_dim / 2) * 2' \
       "$KV/transformer/config.json")
[ "$kvb" = "[$want,$want]" ] && ok "mesh kv: each SP rank's KV cache = 2 x blocks x 44 tokens x D/2 x 2 bytes = $want" ||
    fail "mesh kv: kv_cache_bytes $kvb, the formula gives [$want,$want]"
# inspect's projection per reference token (bf16, --sp 2) x 44 tokens = what the run measured; none without KV
per=$("$TPGEN" inspect --model "$KV" --tp 1 --sp 2 --json 2>/dev/null | jq .kv_cache_bytes_per_reference_token)
none=$("$TPGEN" inspect --model "$D" --tp 1 --sp 2 --json 2>/dev/null | jq .kv_cache_bytes_per_reference_token)
[ -n "$per" ] && [ "$per" != null ] && [ "[$((per * 44)),$((per * 44))]" = "$kvb" ] && [ "$none" = null ] &&
    "$TPGEN" inspect --model "$KV" --tp 1 --sp 2 --summary 2>/dev/null | grep -q "KV-cached references: each rank's cache holds $per bytes per reference token" &&
    ok "mesh kv: inspect --sp 2 projects $per bytes per reference token and rank, x 44 = the run's cache" ||
    fail "mesh kv: inspect projects '$per' per token (plain folder: '$none'), the run held $kvb"
# the negative control: the plain klein pipeline on the same references at --sp 2 gives other latents
if $MPIRUN -np 2 "$TPGEN" --model "$D" "${KVR[@]}" --width 80 --height 48 --sp 2 --no-decode \
       --save-latents "$TMP/nokv-sp.st" >/dev/null 2>&1; then
    rel=$(rel_l2 "$TMP/klein-kv-bf16-sp.st" "$TMP/nokv-sp.st")
    python3 -c "import sys; sys.exit(0 if $rel > 1e-3 else 1)" &&
        ok "mesh kv: the KV run at --sp 2 differs from the plain pipeline's on the same references (rel_l2 $rel)" ||
        fail "mesh kv: the KV run at --sp 2 renders like the plain pipeline (rel_l2 $rel): the KV path is not in use"
else fail "mesh kv: the plain pipeline at --sp 2 failed"; fi
# tp 2 x sp 2 against tp 2 (f32, within 1e-5), the cache split over both
KT=(--model "$KV" "${KVR[@]}" --width 80 --height 48 --precision f32 --no-decode)
if $MPIRUN -np 2 "$TPGEN" "${KT[@]}" --tp 2 --save-latents "$TMP/kv-tp2.st" >/dev/null 2>&1 &&
   out=$($MPIRUN -np 4 "$TPGEN" "${KT[@]}" --tp 2 --sp 2 --save-latents "$TMP/kv-ts.st" --json-metrics "$TMP/kv-ts.json" 2>&1); then
    rel=$(rel_l2 "$TMP/kv-tp2.st" "$TMP/kv-ts.st")
    # the same bytes as bf16 at sp 2: D / 4 x 4 bytes = D / 2 x 2
    # within 1e-5 as TP asks, and in fact byte for byte: SP changes no arithmetic at the same tp
    python3 -c "import sys; sys.exit(0 if $rel <= 1e-5 else 1)" && cmp -s "$TMP/kv-tp2.st" "$TMP/kv-ts.st" &&
        [ "$(jq -c .kv_cache_bytes "$TMP/kv-ts.json")" = "[$want,$want,$want,$want]" ] &&
        echo "$out" | grep -q "KV cache of references per rank: r0 .* (44 tokens)" &&
        ok "mesh kv: tp 2 x sp 2 f32 latents = tp 2's byte for byte (rel_l2 $rel <= 1e-5), each rank's cache 1/4 ($want bytes)" ||
        fail "mesh kv: tp 2 x sp 2: rel_l2 $rel, kv_cache_bytes $(jq -c .kv_cache_bytes "$TMP/kv-ts.json")"
else fail "mesh kv: tp 2 x sp 2: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi
# a batch of 3 klein-kv jobs on dp 2 x sp 2 (a fresh cache per job): each PNG's pixels = the job alone on one rank
cat >"$TMP/kvbatch.yaml" <<YAML
model: $KV
prompts: [a fox, a red boat, a cat]
seeds: [3]
steps: 2
width: 80
height: 48
backend: cpu
images: [$RG/r0_64x80.png, $RG/r1_100x70.png]
sp: 2
tp: 1
output: $TMP/kvb-{index}.png
YAML
# alone BATCH_PNG ARGS...: 0 when the job ARGS rendered alone on one rank has BATCH_PNG's pixels
alone() {
    local want=$1; shift
    "$TPGEN" "$@" --output "$want.alone.png" >/dev/null 2>&1 && [ "$(idat "$want.alone.png")" = "$(idat "$want")" ]
}
if out=$($MPIRUN -np 4 "$TPGEN" --spec "$TMP/kvbatch.yaml" 2>&1); then
    same=0 i=0
    for pr in "a fox" "a red boat" "a cat"; do
        alone "$TMP/kvb-$i.png" --model "$KV" --prompt "$pr" --seed 3 --steps 2 --width 80 --height 48 --backend cpu \
            --image "$RG/r0_64x80.png" --image "$RG/r1_100x70.png" && same=$((same + 1))
        i=$((i + 1))
    done
    [ $same = 3 ] && ok "mesh kv: a batch of 3 klein-kv jobs on dp 2 x sp 2, each PNG's pixels = the job alone on one rank" ||
        fail "mesh kv: batch on dp 2 x sp 2: $same of 3 equal"
else fail "mesh kv: batch on dp 2 x sp 2: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi

# a batch (2 prompts x 2 seeds) on dp 2 x sp 2: each job's PNG pixels = the job alone on one rank
cat >"$TMP/batch.yaml" <<YAML
model: $D
prompts: [a fox, a red boat]
seeds: [3, 4]
steps: 2
width: 48
height: 32
backend: cpu
sp: 2
tp: 1
output: $TMP/b-{index}.png
YAML
if out=$($MPIRUN -np 4 "$TPGEN" --spec "$TMP/batch.yaml" 2>&1); then
    same=0 i=0
    for pr in "a fox" "a red boat"; do
        for seed in 3 4; do
            alone "$TMP/b-$i.png" --model "$D" --prompt "$pr" --seed $seed --steps 2 --width 48 --height 32 \
                --backend cpu && same=$((same + 1))
            i=$((i + 1))
        done
    done
    [ $same = 4 ] && ok "mesh: a batch of 4 jobs on dp 2 x sp 2, each PNG's pixels = the job alone on one rank" ||
        fail "mesh: batch on dp 2 x sp 2: $same of 4 equal"
else fail "mesh: batch on dp 2 x sp 2: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi

# the whole mesh in one job: cfg 2 x sp 2 = one rank; tp 2 x sp 2 within 1e-5 of tp 1 (f32)
if out=$($MPIRUN -np 4 "$TPGEN" "${K[@]}" --precision f32 --image "$REF" --sp 2 --cfg-parallel --output "$TMP/cs.png" \
           --save-latents "$TMP/cs.st" 2>&1); then
    cmp -s "$TMP/klein-base-cfg-1.st" "$TMP/cs.st" && [ "$(idat "$TMP/klein-base-cfg-1.png")" = "$(idat "$TMP/cs.png")" ] &&
        ok "mesh: --cfg-parallel x --sp 2 on 4 ranks = one rank, byte for byte" || fail "mesh: cfg 2 x sp 2 differs"
    echo "$out" | grep -q "mesh: cfg 2 x sp 2 x tp 1 x dp 1: each rank holds its TP rank's 1/1 of the transformer" &&
        ok "mesh: the summary says what each rank holds" || fail "mesh: summary: $(echo "$out" | grep -m1 mesh)"
else fail "mesh: cfg 2 x sp 2: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi
if out=$($MPIRUN -np 4 "$TPGEN" "${K[@]}" --precision f32 --image "$REF" --sp 2 --tp 2 --no-decode \
           --save-latents "$TMP/ts.st" 2>&1); then
    rel=$(rel_l2 "$TMP/klein-base-cfg-1.st" "$TMP/ts.st")
    python3 -c "import sys; sys.exit(0 if $rel <= 1e-5 else 1)" && ok "mesh: tp 2 x sp 2 f32 latents within 1e-5 of one rank (rel_l2 $rel)" ||
        fail "mesh: tp 2 x sp 2 rel_l2 $rel"
else fail "mesh: tp 2 x sp 2: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi

# the text encoder spread over the job group's TP groups (cfg x sp of them): the k-th prompt to encode on TP group
# k mod G, each rank's count in --json-metrics prompts_encoded; the outputs stayed byte-identical above (klein-bf16
# and klein-tp2 under --cfg-parallel: the prompt on the first half, the negative prompt on the second)
e1=$(jq -c .prompts_encoded "$TMP/klein-bf16-c.json" 2>/dev/null); e2=$(jq -c .prompts_encoded "$TMP/klein-tp2-c.json" 2>/dev/null)
[ "$e1" = "[1,1]" ] && [ "$e2" = "[1,1,1,1]" ] &&
    ok "mesh: --cfg-parallel encodes the prompt on one half and the negative prompt on the other (tp 1 $e1, tp 2 $e2)" ||
    fail "mesh: prompts_encoded under --cfg-parallel: tp 1 $e1, tp 2 $e2 (want [1,1] and [1,1,1,1])"
# a batch of 3 prompts on one group of sp 2: rank 0 encodes prompts 1 and 3, rank 1 prompt 2; every PNG's pixels
# = the same batch on one rank
printf 'a fox\na red boat\na tree at dusk\n' >"$TMP/p3.txt"
P3=(--model "$D" --prompts-file "$TMP/p3.txt" --seed 5 --steps 2 --width 48 --height 32 --backend cpu)
if "$TPGEN" "${P3[@]}" --output "$TMP/p3-1-{index}.png" --json-metrics "$TMP/p3-1.json" >/dev/null 2>&1 &&
   $MPIRUN -np 2 "$TPGEN" "${P3[@]}" --sp 2 --output "$TMP/p3-2-{index}.png" --json-metrics "$TMP/p3-2.json" >/dev/null 2>&1; then
    same=0
    for i in 0 1 2; do [ "$(idat "$TMP/p3-1-$i.png")" = "$(idat "$TMP/p3-2-$i.png")" ] && same=$((same + 1)); done
    e1=$(jq -c .prompts_encoded "$TMP/p3-1.json"); e2=$(jq -c .prompts_encoded "$TMP/p3-2.json")
    [ $same = 3 ] && [ "$e1" = "[3]" ] && [ "$e2" = "[2,1]" ] &&
        ok "mesh: 3 prompts on sp 2 encoded 2 + 1 (one rank: $e1), the 3 PNGs' pixels = one rank's" ||
        fail "mesh: batch encode spread: $same of 3 equal, prompts_encoded $e1 / $e2 (want [3] / [2,1])"
else fail "mesh: the 3-prompt batch failed"; fi
# the second TP group out of memory while it encodes its prompt: agreed over the group, one message, no PNG
rm -f "$TMP"/p3-f-*.png
out=$(TPGEN_FAIL_ALLOC=1:1:encode timeout 120 $MPIRUN -x TPGEN_FAIL_ALLOC -np 2 "$TPGEN" "${P3[@]}" --sp 2 \
      --output "$TMP/p3-f-{index}.png" 2>&1); rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && [ "$(echo "$out" | grep -c '^tpgen: error: rank 1: .*injected by TPGEN_FAIL_ALLOC')" = 1 ] &&
    ! ls "$TMP"/p3-f-*.png >/dev/null 2>&1 &&
    ok "mesh: the second TP group failing on its prompt: agreed, one message naming rank 1, no PNG (rc $rc)" ||
    fail "mesh: encode failure on TP group 1: rc $rc $(echo "$out" | grep error | head -2)"

# the VAE over the whole job group where the CPU is rows-invariant (op_rows_invariant: the band count changes no
# bit), else over the first TP group: decode_bands counts, per world rank, the decodes it took a band of. f32 with
# the Winograd route off (TPGEN_NO_WINOGRAD=1) is rows-invariant on every CPU: the reference encode and the decode
# spread over cfg 2 (x sp 2), the bytes still the serial run's; with Winograd (f32's default) the first TP group
MPIRUN0=$MPIRUN
MPIRUN="$MPIRUN -x TPGEN_NO_WINOGRAD"
export TPGEN_NO_WINOGRAD=1
same klein-f32-exact 1 2 "${K[@]}" --tp 1 --precision f32 --image "$REF"
if out=$($MPIRUN -np 4 "$TPGEN" "${K[@]}" --precision f32 --image "$REF" --sp 2 --cfg-parallel --output "$TMP/xs.png" \
           --save-latents "$TMP/xs.st" --json-metrics "$TMP/xs.json" 2>&1); then
    cmp -s "$TMP/klein-f32-exact-s.st" "$TMP/xs.st" && [ "$(idat "$TMP/klein-f32-exact-s.png")" = "$(idat "$TMP/xs.png")" ] &&
        [ "$(jq -c .decode_bands "$TMP/xs.json")" = "[1,1,1,1]" ] &&
        ok "mesh: f32 without Winograd, cfg 2 x sp 2: the VAE on all 4 ranks (one band each), the one-rank bytes" ||
        fail "mesh: f32 exact VAE on cfg 2 x sp 2: decode_bands $(jq -c .decode_bands "$TMP/xs.json"), or the bytes differ"
else fail "mesh: f32 exact VAE on cfg 2 x sp 2: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi
unset TPGEN_NO_WINOGRAD
MPIRUN=$MPIRUN0
b1=$(jq -c .decode_bands "$TMP/klein-f32-exact-c.json" 2>/dev/null); b2=$(jq -c .decode_bands "$TMP/klein-f32-ref-c.json" 2>/dev/null)
[ "$b1" = "[1,1]" ] && [ "$b2" = "[1,0]" ] &&
    ok "mesh: decode_bands: f32 without Winograd on both CFG halves $b1, with Winograd on the first TP group only $b2" ||
    fail "mesh: decode_bands $b1 (want [1,1]) and $b2 (want [1,0])"
# bf16 takes the AMX or vdpbf16ps convolutions where the CPU has them (rows-invariant), else Winograd
b3=$(jq -c .decode_bands "$TMP/klein-bf16-c.json" 2>/dev/null)
if grep -qw amx_bf16 /proc/cpuinfo; then
    [ "$b3" = "[1,1]" ] && ok "mesh: bf16 on this AMX CPU: the VAE on both CFG halves ($b3), the serial bytes (above)" ||
        fail "mesh: bf16 decode_bands $b3 on an AMX CPU (want [1,1])"
else skip "mesh: bf16 VAE spread: this CPU has no AMX-BF16 (decode_bands $b3)"; fi

# bytes sent per step, sp 4 against tp 4 at equal tokens (klein distilled, bf16): the ring formulas written
# out from the transformer config: TP all-reduces [S, D] twice per double block and once per single block;
# SP sends q|k|v (3 x pad x D) and o back (pad x D) per block around attention, pad = the largest slice
# (ceil(L/4) + ceil(N/4) rows), then gathers the output rows (4 x ceil(N/4) x C)
Z=(--model "$D" --prompt "a fox" --width 48 --height 32 --steps 2 --backend cpu --no-decode --save-latents "$TMP/z.st")
if $MPIRUN -np 4 "$TPGEN" "${Z[@]}" --sp 4 --json-metrics "$TMP/sp4.json" >/dev/null 2>&1 &&
   $MPIRUN -np 4 "$TPGEN" "${Z[@]}" --tp 4 --json-metrics "$TMP/tp4.json" >/dev/null 2>&1; then
    res=$(python3 -c '
import json, math, sys
c = json.load(open(sys.argv[1])); p, L, N, e = 4, 512, 6, 2
D, C, nd, ns = c["num_attention_heads"] * c["attention_head_dim"], c["in_channels"], c["num_layers"], c["num_single_layers"]
tp = (2 * nd + ns) * 2 * (L + N) * D * e * (p - 1) / p
pad = math.ceil(L / p) + math.ceil(N / p)
sp = (nd + ns) * (p * pad * 3 * (D // p) * e + p * pad * (D // p) * e) * (p - 1) / p + p * math.ceil(N / p) * C * e * (p - 1) / p
m_sp, m_tp = json.load(open(sys.argv[2]))["comm_bytes_per_step"], json.load(open(sys.argv[3]))["comm_bytes_per_step"]
ok = all(abs(x - sp) < 1 for x in m_sp) and all(abs(x - tp) < 1 for x in m_tp) and max(m_sp) <= 0.6 * min(m_tp)
print("%s sp4 %s (formula %d) tp4 %s (formula %d) ratio %.3f" % ("ok" if ok else "bad", m_sp, sp, m_tp, tp, sp / tp))' \
        "$D/transformer/config.json" "$TMP/sp4.json" "$TMP/tp4.json")
    [ "${res%% *}" = ok ] && ok "mesh: comm_bytes_per_step = the ring formulas, --sp 4 sends at most 0.6x --tp 4 (${res#ok })" ||
        fail "mesh: comm bytes: $res"
else fail "mesh: the sp 4 / tp 4 metrics runs failed"; fi

# serve: each dp group a mesh (4 ranks: dp 2 x sp 2, klein base with CFG): two requests at once, each PNG's pixels
# the one-rank generate's
. "$TPGEN_ROOT/tests/lib_serve.sh"
M0=$M
if NP=4 start_server "$TMP/serve.log" "$TPGEN" --sp 2 --tp 1 --guidance 3 --negative-prompt blurry --backend cpu; then
    pids=""
    for seed in 7 8; do
        curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' \
            -d "{\"prompt\": \"a fox\", \"size\": \"48x32\", \"seed\": $seed, \"steps\": 2}" |
            jq -r '.data[0].b64_json' | base64 -d >"$TMP/serve-$seed.png" &
        pids="$pids $!"
    done
    wait $pids
    same=0
    for seed in 7 8; do
        "$TPGEN" "${K[@]}" --seed $seed --output "$TMP/gen-$seed.png" >/dev/null 2>&1 &&
            [ "$(idat "$TMP/serve-$seed.png" 2>/dev/null)" = "$(idat "$TMP/gen-$seed.png")" ] && same=$((same + 1))
    done
    grep -q "cfg 1 x sp 2 x tp 1 x dp 2" "$TMP/serve.log" && [ $same = 2 ] &&
        ok "mesh: serve on dp 2 x sp 2: two requests, each PNG's pixels = one-rank generate's" ||
        fail "mesh: serve dp 2 x sp 2: $same of 2 equal; $(grep -m1 'listening' "$TMP/serve.log")"
    stop_server >/dev/null
else
    fail "mesh: serve --sp 2 did not start: $(tail -3 "$TMP/serve.log")"
fi
# serve with KV-cached references at --sp 2: an edit with the two references, the pixels of the one-rank run above
M=$KV
if NP=2 start_server "$TMP/serve-kv.log" "$TPGEN" --sp 2 --backend cpu; then
    curl -s -F prompt="a fox" -F seed=0 -F steps=3 -F size=80x48 -F "image[]=@$RG/r0_64x80.png" \
        -F "image[]=@$RG/r1_100x70.png" "http://127.0.0.1:$PORT/v1/images/edits" |
        jq -r '.data[0].b64_json' | base64 -d >"$TMP/serve-kv.png" 2>/dev/null
    [ -s "$TMP/serve-kv.png" ] && [ "$(idat "$TMP/serve-kv.png")" = "$(idat "$TMP/klein-kv-bf16-1.png")" ] &&
        ok "mesh: serve --sp 2 on a KV-cached-reference model: an edit with two references = the one-rank pixels" ||
        fail "mesh: serve kv --sp 2: the edit's pixels differ from the one-rank run's ($(grep -m1 error "$TMP/serve-kv.log"))"
    stop_server >/dev/null
else
    fail "mesh: serve --sp 2 on the KV folder did not start: $(tail -3 "$TMP/serve-kv.log")"
fi
M=$M0

# one SP rank out of memory (TPGEN_FAIL_ALLOC=RANK:N:PHASE): in the prepare step the failure is agreed over the
# whole job group (every rank fails, the message once, no PNG); in the middle of the loop, where its peers wait
# in an all-to-all, the job ends at once naming the rank (no hang). Allocation 1 is the prepare step's first
# (the activations); allocation 28 falls in the loop (the output rows' gather; the counts follow the code)
rm -f "$TMP/oom.png"
out=$(TPGEN_FAIL_ALLOC=1:1:denoise timeout 120 $MPIRUN -x TPGEN_FAIL_ALLOC -np 2 "$TPGEN" "${KD[@]}" --width 48 --height 32 \
      --sp 2 --output "$TMP/oom.png" 2>&1); rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && [ "$(echo "$out" | grep -c '^tpgen: error: rank 1: .*injected by TPGEN_FAIL_ALLOC')" = 1 ] &&
    [ ! -e "$TMP/oom.png" ] && ok "mesh: an SP rank out of memory in the prepare step: agreed over the group, one message, no PNG" ||
    fail "mesh: prepare OOM at sp 2: rc $rc $(echo "$out" | grep error | head -2)"
out=$(TPGEN_FAIL_ALLOC=1:28:denoise timeout 120 $MPIRUN -x TPGEN_FAIL_ALLOC -np 2 "$TPGEN" "${KD[@]}" --width 48 --height 32 \
      --sp 2 --output "$TMP/oom.png" 2>&1); rc=$?
[ $rc != 0 ] && [ $rc != 124 ] && echo "$out" | grep -q 'rank 1: .* in the middle of the denoise phase' && [ ! -e "$TMP/oom.png" ] &&
    ok "mesh: an SP rank out of memory mid-loop: the job ends at once naming the rank (rc $rc), no PNG" ||
    fail "mesh: mid-loop OOM at sp 2: rc $rc $(echo "$out" | grep error | head -2)"

# inspect: what each rank of a mesh holds (text and JSON)
out=$("$TPGEN" inspect --model "$D" --tp 2 --sp 2 --cfg-parallel --summary 2>&1)
js=$("$TPGEN" inspect --model "$D" --tp 2 --sp 2 --cfg-parallel --json 2>/dev/null | jq -c '[.group_ranks, .sp, .cfg_parallel, (.ranks | length)]')
echo "$out" | grep -q "a job group of 8 ranks; group rank g holds the row of TP rank g % 2 above, each shard on 4 ranks" &&
    [ "$js" = "[8,2,true,2]" ] && ok "mesh: inspect --sp 2 --cfg-parallel --tp 2 says what each rank holds (text, JSON)" ||
    fail "mesh: inspect: $js $(echo "$out" | tail -2)"

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
refused "sp x tp not dividing the heads, naming the --sp that work" 4 "tp 1 x sp 4 = 4 does not divide num_attention_heads.*--sp 1, 2, 3, 6 would work" \
    --model "$F" --prompt-embeds "$E" --negative-prompt-embeds "$E" --steps 1 --backend cpu --sp 4 --tp 1

# the sanitized build (ASan + UBSan + LeakSanitizer; ASAN_OPTIONS and LSAN_OPTIONS come from tests/run.sh): the
# whole mesh with a reference (all-gather, all-to-all, the CFG exchange, every buffer freed), and a refusal
ASAN=$TPGEN_ROOT/build-asan/tpgen
if [ -x "$ASAN" ]; then
    lsan_run "asan mesh" $MPIRUN -np 4 "$ASAN" "${K[@]}" --precision f32 --image "$REF" --sp 2 --cfg-parallel \
        --output "$TMP/asan.png"
    [ $rc = 0 ] && ! echo "$out" | grep -qE 'Sanitizer|runtime error' &&
        [ "$(idat "$TMP/asan.png")" = "$(idat "$TMP/klein-base-cfg-1.png")" ] &&
        ok "mesh: asan: --cfg-parallel x --sp 2 with a reference, clean, the one-rank pixels" ||
        fail "mesh: asan mesh: rc $rc $(echo "$out" | grep -E 'Sanitizer|runtime error|error' | head -3)"
    # (f32: the sanitized build's bf16 kernels are not the optimised build's)
    lsan_run "asan kv" $MPIRUN -np 2 "$ASAN" --model "$KV6" "${KVR[@]}" --width 64 --height 32 --precision f32 \
        --sp 2 --output "$TMP/asan-kv.png"
    [ $rc = 0 ] && ! echo "$out" | grep -qE 'Sanitizer|runtime error' &&
        [ "$(idat "$TMP/asan-kv.png")" = "$(idat "$TMP/klein-kv-f32-sp3-1.png")" ] &&
        ok "mesh: asan: KV-cached references at --sp 2 (f32, two references), clean, the one-rank pixels" ||
        fail "mesh: asan kv: rc $rc $(echo "$out" | grep -E 'Sanitizer|runtime error|error' | head -3)"
    expect_fail "mesh: asan: a mesh that does not divide the world" "groups of 6 ranks" \
        $MPIRUN -np 4 "$ASAN" "${K[@]}" --cfg-parallel --tp 3 --output "$TMP/asan-r.png"
else
    fail "mesh: no sanitized build at $ASAN (make asan)"
fi
