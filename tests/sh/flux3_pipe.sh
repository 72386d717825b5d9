#!/usr/bin/env bash
# budget: 45 s; checks: 26
# `tpgen generate` on FLUX.3 folders (the golden tiny base and flow-map
# transformers + the golden tiny VAE + the modular_model_index.json that
# diffusers 0.42.1 saves) against the real modular pipelines' runs
# (tests/data/flux3-pipe, tests/tools/flux3_pipe_golden.py): base with CFG
# (negative embeddings), flow-map, each with and without a reference, at
# tp 1, 2, 3 (the tiny models have 6 heads), and a 70x56 reference that is
# reflect-padded to its canvas and cropped back: final latents <= 1e-4
# relative, PNG within +-1 of the golden u8. Then the errors: each names
# the file, exits non-zero on every rank.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
D=$TPGEN_ROOT/tests/data/flux3-pipe
for k in base flowmap; do
    flux3_folder $k "$TMP/$k"
done

# compare OURS latents file and PNG with the golden case: rel L2 <= 1e-4, |u8 diff| <= 1
COMPARE='
import json, math, struct, sys, zlib
def st(path, name):
    f = open(path, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
    if name is None: name = [k for k in h if k != "__metadata__"][0]
    t = h[name]; a, b = t["data_offsets"]; f.seek(8 + n + a); d = f.read(b - a)
    fmt = {"F32": "f", "U8": "B"}[t["dtype"]]
    return t["shape"], struct.unpack("<%d%s" % (len(d) // struct.calcsize(fmt), fmt), d)
def png(path):
    b = open(path, "rb").read(); p = 8; idat = b""; w = h = 0
    while p < len(b):
        n, = struct.unpack(">I", b[p:p+4]); tag = b[p+4:p+8]; data = b[p+8:p+8+n]; p += 12 + n
        if tag == b"IHDR": w, h, depth, ctype = struct.unpack(">IIBB", data[:10]); assert depth == 8 and ctype == 2
        if tag == b"IDAT": idat += data
    raw = zlib.decompress(idat); s = w * 3; out = bytearray(); prev = bytearray(s)
    for y in range(h):
        ft = raw[y * (s + 1)]; line = bytearray(raw[y * (s + 1) + 1:(y + 1) * (s + 1)])
        for i in range(s):
            a = line[i - 3] if i >= 3 else 0; c = prev[i - 3] if i >= 3 else 0; up = prev[i]
            if ft == 1: line[i] = (line[i] + a) & 255
            elif ft == 2: line[i] = (line[i] + up) & 255
            elif ft == 3: line[i] = (line[i] + (a + up) // 2) & 255
            elif ft == 4:
                pa, pb, pc = abs(up - c), abs(a - c), abs(a + up - 2 * c)
                pr = a if pa <= pb and pa <= pc else up if pb <= pc else c
                line[i] = (line[i] + pr) & 255
        out += line; prev = line
    return w, h, out
lat, g, img = sys.argv[1], sys.argv[2], sys.argv[3]
_, x = st(lat, None); _, r = st(g, "latents_final")
rel = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, r)) / sum(b * b for b in r))
gs, gu = st(g, "image_u8"); w, h, px = png(img)
ok = len(x) == len(r) and rel <= 1e-4 and [h, w, 3] == gs
mx = max(abs(a - b) for a, b in zip(px, gu)) if ok else -1
print("latents rel %.3g, png %dx%d max |u8 diff| %d" % (rel, w, h, mx)); sys.exit(0 if ok and mx <= 1 else 1)
'
# run_case CASE MODEL NP ARGS...
run_case() {
    local c=$1 m=$2 np=$3; shift 3
    local out rc
    out=$($MPIRUN -np "$np" "$TPGEN" generate --model "$TMP/$m" --prompt-embeds "$D/$c.safetensors" --precision f32 \
          --backend cpu --output "$TMP/$c.$np.png" --save-latents "$TMP/$c.$np.safetensors" "$@" 2>&1); rc=$?
    if [ $rc -ne 0 ]; then fail "flux3 generate $c tp=$np: rc=$rc $(echo "$out" | tail -3 | tr '\n' ' ')"; return; fi
    r=$(python3 -c "$COMPARE" "$TMP/$c.$np.safetensors" "$D/$c.safetensors" "$TMP/$c.$np.png" 2>&1) \
        && ok "flux3 generate $c tp=$np = diffusers' modular pipeline ($r)" || fail "flux3 generate $c tp=$np: $r"
}
NEG=(--negative-prompt-embeds "$D/base_t2i.safetensors")
for np in 1 2 3; do
    run_case base_t2i base $np --seed 42 --steps 3 --width 64 --height 48 "${NEG[@]}"
    run_case base_ref base $np --seed 7 --steps 2 --negative-prompt-embeds "$D/base_ref.safetensors" --image "$D/ref.png"
    run_case flowmap_t2i flowmap $np --seed 123 --steps 3 --width 64 --height 48
    run_case flowmap_ref flowmap $np --seed 5 --steps 2 --image "$D/ref.png"
    # 70x56: reflect-padded to its 80x64 canvas, the PNG cropped back to 70x56
    run_case flowmap_pad flowmap $np --seed 9 --steps 2 --image "$D/ref_pad.png"
done

# a run spec (negative_prompt_embeds:, two seeds) over 2 data-parallel groups: seed 42 is the golden case
cat >"$TMP/spec.yaml" <<YAML
model: $TMP/base
prompt_embeds: $D/base_t2i.safetensors
negative_prompt_embeds: $D/base_t2i.safetensors
seeds: [42, 43]
steps: 3
width: 64
height: 48
precision: f32
backend: cpu
output: $TMP/spec-{seed}.png
save_latents: $TMP/spec-{seed}.safetensors
YAML
out=$($MPIRUN -np 2 "$TPGEN" --tp 1 --spec "$TMP/spec.yaml" 2>&1)
r=$(python3 -c "$COMPARE" "$TMP/spec-42.safetensors" "$D/base_t2i.safetensors" "$TMP/spec-42.png" 2>&1) &&
    [ -f "$TMP/spec-43.png" ] && ok "flux3 run spec, dp 2: the seed-42 job = the golden ($r)" \
    || fail "flux3 run spec: $r $(echo "$out" | tail -2)"

# the PNG parameters and the family in the metrics
out=$("$TPGEN" generate --model "$TMP/base" --prompt-embeds "$D/base_t2i.safetensors" "${NEG[@]}" --seed 42 --steps 1 \
      --width 32 --height 32 --precision f32 --backend cpu --output "$TMP/p.png" --json-metrics "$TMP/p.json" 2>&1)
if grep -qa "negative_prompt_embeds: $D/base_t2i.safetensors:negative_prompt_embeds" "$TMP/p.png" &&
   grep -qa "guidance: 3.5 (CFG)" "$TMP/p.png" && grep -q '"family": "FLUX.3 (base)"' "$TMP/p.json"; then
    ok "flux3 PNG parameters name the negative embeddings and CFG 3.5 (the default)"
else fail "flux3 PNG parameters: $(echo "$out" | tail -2)"; fi
out=$("$TPGEN" generate --model "$TMP/flowmap" --prompt-embeds "$D/flowmap_t2i.safetensors" --width 32 --height 32 \
      --steps 1 --precision f32 --backend cpu --no-decode --save-latents "$TMP/q.safetensors" --json-metrics "$TMP/q.json" 2>&1)
grep -q '"family": "FLUX.3 (flow-map)"' "$TMP/q.json" 2>/dev/null && ok "flux3 flow-map folder runs the flow-map sampler" \
    || fail "flux3 flow-map family: $(echo "$out" | tail -2)"

# --- errors: named, non-zero on every rank ---
A=(--precision f32 --backend cpu --width 32 --height 32 --steps 1 --output "$TMP/e.png")
expect_fail "flux3 base CFG without negative embeddings" 'FLUX.3 base.*--negative-prompt-embeds' \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/base" --prompt-embeds "$D/base_t2i.safetensors" "${A[@]}"
expect_fail "flux3 negative embeddings of another width" 'negative-prompt-embeds.*base_t2i.safetensors:cond0.*32 features.*80' \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/base" --prompt-embeds "$D/base_t2i.safetensors" \
    --negative-prompt-embeds "$D/base_t2i.safetensors:cond0" "${A[@]}"
expect_fail "flux3 --prompt without the text encoder" 'text encoder|--prompt-embeds' \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/flowmap" --prompt "a fox" "${A[@]}"
# a NaN transformer weight (issue 39: the FLUX.3 loop had lost the per-step check of the shared
# sampler and wrote NaN latents): every rank fails at the first step, naming it, and writes nothing
mkdir -p "$TMP/nan/transformer"
ln -s "$TPGEN_GOLDEN/vae-tiny/model/vae" "$TMP/nan/vae"
cp "$TMP/base/modular_model_index.json" "$TMP/nan/"
cp "$TPGEN_GOLDEN/flux3-tiny/base/model/transformer/"* "$TMP/nan/transformer/" && chmod u+w "$TMP/nan/transformer/"*
python3 "$TPGEN_ROOT/tests/tools/craft.py" poke "$TMP/nan/transformer/diffusion_pytorch_model.safetensors" x_embedders.image.weight nan
out=$($MPIRUN -np 2 "$TPGEN" generate --model "$TMP/nan" --prompt-embeds "$D/base_t2i.safetensors" "${NEG[@]}" --steps 2 \
      --width 32 --height 32 --precision f32 --backend cpu --no-decode --save-latents "$TMP/nan.safetensors" 2>&1); rc=$?
if [ $rc -ne 0 ] && [ ! -e "$TMP/nan.safetensors" ] && [ "$(echo "$out" | grep -c 'tpgen: error')" = 1 ] &&
   echo "$out" | grep -q 'denoising step 1 of 2: the latents became NaN at token 0'; then
    ok "flux3 NaN weight: fails at step 1 of 2 on every rank, no latents written"
else fail "flux3 NaN weight: rc $rc, $(ls "$TMP"/nan.safetensors 2>&1): $(echo "$out" | grep -v '^--' | head -3)"; fi
# a joint dim that does not match the embeddings
mkdir -p "$TMP/jd/transformer"
ln -s "$TPGEN_GOLDEN/vae-tiny/model/vae" "$TMP/jd/vae"
ln -s "$TPGEN_GOLDEN/flux3-tiny/base/model/transformer/diffusion_pytorch_model.safetensors" "$TMP/jd/transformer/"
sed 's/"joint_attention_dim": 80/"joint_attention_dim": 96/' "$TPGEN_GOLDEN/flux3-tiny/base/model/transformer/config.json" \
    >"$TMP/jd/transformer/config.json"
expect_fail "flux3 embeddings of another joint dim" "flowmap_t2i.safetensors:prompt_embeds has 80 features.*joint_attention_dim is 96" \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/jd" --prompt-embeds "$D/flowmap_t2i.safetensors" --guidance 1 "${A[@]}"
# a flow_map config over base weights (no target_timestep_embedder)
mkdir -p "$TMP/fm/transformer"
ln -s "$TPGEN_GOLDEN/vae-tiny/model/vae" "$TMP/fm/vae"
ln -s "$TPGEN_GOLDEN/flux3-tiny/base/model/transformer/diffusion_pytorch_model.safetensors" "$TMP/fm/transformer/"
sed 's/"flow_map": false/"flow_map": true/' "$TPGEN_GOLDEN/flux3-tiny/base/model/transformer/config.json" \
    >"$TMP/fm/transformer/config.json"
expect_fail "flux3 flow_map config without the target timestep embedder" 'fm/transformer.*target_timestep_embedder' \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/fm" --prompt-embeds "$D/flowmap_t2i.safetensors" "${A[@]}"
# weights without the reference mode (mode_blocks.image_cond.*, x_embedders.image_cond, its modulations)
mkdir -p "$TMP/nc/transformer"
ln -s "$TPGEN_GOLDEN/vae-tiny/model/vae" "$TMP/nc/vae"
cp "$TPGEN_GOLDEN/flux3-tiny/flowmap/model/transformer/config.json" "$TMP/nc/transformer/"
python3 - "$TPGEN_GOLDEN/flux3-tiny/flowmap/model/transformer/diffusion_pytorch_model.safetensors" \
    "$TMP/nc/transformer/diffusion_pytorch_model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n, = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n]); base = 8 + n
keep = {k: v for k, v in h.items() if k == "__metadata__" or "image_cond" not in k}
out, data, off = {}, b"", 0
for k, v in keep.items():
    if k == "__metadata__": out[k] = v; continue
    a, e = v["data_offsets"]; d = b[base + a:base + e]; out[k] = dict(v, data_offsets=[off, off + len(d)]); data += d; off += len(d)
hj = json.dumps(out).encode(); open(sys.argv[2], "wb").write(struct.pack("<Q", len(hj)) + hj + data)
PY
expect_fail "flux3 weights without the reference mode blocks" 'nc/transformer.*image_cond' \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/nc" --prompt-embeds "$D/flowmap_t2i.safetensors" "${A[@]}"
# a single reference over 4 MP is downscaled as diffusers does: tests/sh/flux3_refs.sh, tests/test_flux3_refs.c
expect_fail "flux3 with a FLUX.2 pipeline class" 'Flux2KleinPipeline.*FLUX.3 transformer' \
    bash -c "mkdir -p '$TMP/k2' && ln -sf '$TMP/base/transformer' '$TMP/k2/transformer' && ln -sf '$TMP/base/vae' '$TMP/k2/vae' &&
             echo '{\"_class_name\": \"Flux2KleinPipeline\"}' > '$TMP/k2/model_index.json' &&
             $MPIRUN -np 2 '$TPGEN' generate --model '$TMP/k2' --prompt-embeds '$D/flowmap_t2i.safetensors' --guidance 1 --precision f32 --backend cpu --width 32 --height 32 --steps 1 --output '$TMP/e.png'"
