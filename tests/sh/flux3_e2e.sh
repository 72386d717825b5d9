#!/usr/bin/env bash
# budget: 35 s; checks: 10
# tier: quick
# FLUX.3 from a prompt: the golden tiny FLUX.3 transformers (base, flow-map)
# + the golden tiny VAE + make-tiny's Qwen3-VL text encoder (random, as wide
# as joint_attention_dim / 8, the real Qwen3 tokenizer). `generate --prompt`
# must give exactly the latents of `tpgen encode` (golden-checked against
# diffusers' Flux3TextEncoderStep in encode_flux3.sh) followed by
# `generate --prompt-embeds` (golden-checked against the modular pipelines
# in flux3_pipe.sh), at tp 1 and 2: base with CFG (the negative prompt ""
# encoded too) and flow-map; a bad prompt width: a text encoder whose
# 8H is not the transformer's joint dim is refused, naming the file; and
# tpgen serve on both folders answers with generate's PNG byte for byte, and
# its edits (one reference cropped back; two, one 40 px wide) equal generate --image's.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
D=$TPGEN_ROOT/tests/data/flux3-pipe
for k in base flowmap; do
    flux3_folder $k "$TMP/$k"
    out=$(TPGEN_FLUX3_TE_OUT="$TMP/$k" "$TPGEN_TESTS" flux3te_tiny_writer_files 2>&1)
    echo "$out" | grep -q '^ok - ' || fail "flux3 e2e: writing the tiny text encoder into $k: $(echo "$out" | tail -2)"
done
SAME='
import json, struct, sys
def t(path):
    b = open(path, "rb").read(); n, = struct.unpack("<Q", b[:8]); h = json.loads(b[8:8 + n])
    k = [k for k in h if k != "__metadata__"][0]; s, e = h[k]["data_offsets"]
    return h[k]["shape"], b[8 + n + s: 8 + n + e]
(sa, a), (sb, b) = t(sys.argv[1]), t(sys.argv[2])
sys.exit(0 if sa == sb and a == b else "latents differ: %s vs %s" % (sa, sb))
'
P="a lighthouse on a cliff at dusk, waves below"
A=(--steps 2 --width 64 --height 48 --seed 3 --precision f32 --backend cpu)
for np in 1 2; do
    for k in base flowmap; do
        M=$TMP/$k
        neg=()
        if [ $k = base ]; then
            $MPIRUN -np $np "$TPGEN" encode --model "$M" --prompt "" --save-embeds "$TMP/n$k$np.st" --precision f32 \
                >"$TMP/log" 2>&1 || { fail "flux3 e2e $k tp=$np: encode \"\": $(tail -2 "$TMP/log")"; continue; }
            neg=(--negative-prompt-embeds "$TMP/n$k$np.st:prompt_embeds")
        fi
        if ! $MPIRUN -np $np "$TPGEN" generate --model "$M" --prompt "$P" "${A[@]}" --output "$TMP/p$k$np.png" \
            --save-latents "$TMP/p$k$np.st" >"$TMP/log" 2>&1; then
            fail "flux3 e2e $k tp=$np: generate --prompt: $(tail -3 "$TMP/log" | tr '\n' ' ')"; continue
        fi
        if ! $MPIRUN -np $np "$TPGEN" encode --model "$M" --prompt "$P" --save-embeds "$TMP/e$k$np.st" --precision f32 \
            >"$TMP/log" 2>&1 || ! grep -q '\[1, 80, 80\]' "$TMP/log"; then
            fail "flux3 e2e $k tp=$np: encode (window 80 expected): $(tail -2 "$TMP/log" | tr '\n' ' ')"; continue
        fi
        if ! $MPIRUN -np $np "$TPGEN" generate --model "$M" --prompt-embeds "$TMP/e$k$np.st" "${neg[@]}" "${A[@]}" \
            --output "$TMP/q$k$np.png" --save-latents "$TMP/q$k$np.st" >"$TMP/log" 2>&1; then
            fail "flux3 e2e $k tp=$np: generate --prompt-embeds: $(tail -3 "$TMP/log" | tr '\n' ' ')"; continue
        fi
        r=$(python3 -c "$SAME" "$TMP/p$k$np.st" "$TMP/q$k$np.st" 2>&1) &&
            ok "flux3 e2e $k tp=$np: generate --prompt = encode + generate --prompt-embeds, bit for bit" ||
            fail "flux3 e2e $k tp=$np: $r"
    done
done
# the encoder's width must be the transformer's joint dim / 8
mkdir -p "$TMP/wide/transformer"
ln -s "$TPGEN_GOLDEN/vae-tiny/model/vae" "$TMP/wide/vae"
cp "$D/flowmap_modular_model_index.json" "$TMP/wide/modular_model_index.json"
ln -s "$TPGEN_GOLDEN/flux3-tiny/flowmap/model/transformer/diffusion_pytorch_model.safetensors" "$TMP/wide/transformer/"
sed 's/"joint_attention_dim": 80/"joint_attention_dim": 160/' \
    "$TPGEN_GOLDEN/flux3-tiny/flowmap/model/transformer/config.json" >"$TMP/wide/transformer/config.json"
TPGEN_FLUX3_TE_OUT="$TMP/wide" "$TPGEN_TESTS" flux3te_tiny_writer_files >/dev/null 2>&1
cp "$TPGEN_GOLDEN/flux3-tiny/flowmap/model/transformer/config.json" "$TMP/wide/transformer/config.json"
expect_fail "flux3 e2e: a text encoder of another width is refused, naming the file" "wide.*(joint_attention_dim|80)" \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/wide" --prompt "$P" "${A[@]}" --output "$TMP/w.png"
[ ! -e "$TMP/w.png" ] && ok "flux3 e2e: no PNG after the refusal" || fail "flux3 e2e: a PNG was written after the refusal"
# serve: an OpenAI-style request on a FLUX.3 folder gives generate's PNG byte for byte
source "$TPGEN_ROOT/tests/lib_serve.sh"
for k in flowmap base; do
    M=$TMP/$k
    if ! start_server "$TMP/srv$k.log" "$TPGEN" --precision f32 --backend cpu; then
        fail "flux3 serve $k: no server: $(tail -3 "$TMP/srv$k.log" | tr '\n' ' ')"; kill -9 $SRV 2>/dev/null; continue
    fi
    curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' \
        -d "{\"prompt\": \"$P\", \"size\": \"64x48\", \"seed\": 3, \"steps\": 2, \"response_format\": \"b64_json\"}" |
        jq -r '.data[0].b64_json' | base64 -d >"$TMP/s$k.png" 2>/dev/null
    stop_server
    cmp -s "$TMP/s$k.png" "$TMP/p${k}2.png" && ok "flux3 serve $k (tp 2): the PNG of generate --prompt, byte for byte" ||
        fail "flux3 serve $k: PNG differs from generate's ($(tail -2 "$TMP/srv$k.log" | tr '\n' ' '))"
done
# serve edits on FLUX.3: FLUX.3's reference preparation, as generate --image: one 70x56 reference
# (canvas 80x64, the PNG cropped back to 70x56) on flow-map, and 40x200 + 70x56 on base (FLUX.2's
# checks would refuse the 40-pixel side) -- each byte-identical to generate --image with the same names
python3 "$TPGEN_ROOT/tests/tools/flux3_refs_images.py" "$TMP" small tall >/dev/null
ed() { # MODEL OUT IMAGES...: generate --image in $TMP (the PNG parameters name the files as given)
    local m=$1 o=$2; shift 2
    local im=(); for f in "$@"; do im+=(--image "$f"); done
    (cd "$TMP" && $MPIRUN -np 2 "$TPGEN" generate --model "$m" --prompt "$P" --seed 4 --steps 2 --precision f32 --backend cpu \
        "${im[@]}" --output "$o" >"$TMP/edgen.log" 2>&1)
}
for k in flowmap base; do
    M=$TMP/$k
    refs=(small.png); [ $k = base ] && refs=(tall.png small.png)
    ed "$M" "$TMP/eg$k.png" "${refs[@]}" || { fail "flux3 serve edit $k: generate --image: $(tail -2 "$TMP/edgen.log")"; continue; }
    if ! start_server "$TMP/sre$k.log" "$TPGEN" --precision f32 --backend cpu; then
        fail "flux3 serve edit $k: no server: $(tail -3 "$TMP/sre$k.log" | tr '\n' ' ')"; kill -9 $SRV 2>/dev/null; continue
    fi
    form=(); for f in "${refs[@]}"; do form+=(-F "image[]=@$TMP/$f"); done
    curl -s -F prompt="$P" -F seed=4 -F steps=2 "${form[@]}" "http://127.0.0.1:$PORT/v1/images/edits" |
        tee "$TMP/es$k.json" | jq -r ".data[0].b64_json" | base64 -d >"$TMP/es$k.png" 2>/dev/null
    stop_server
    size=$(python3 -c "import struct,sys; b=open(sys.argv[1],'rb').read(24); print('%dx%d' % struct.unpack('>II', b[16:24]))" "$TMP/es$k.png" 2>/dev/null)
    cmp -s "$TMP/es$k.png" "$TMP/eg$k.png" &&
        ok "flux3 serve edit $k (tp 2, ${refs[*]}): the PNG of generate --image byte for byte ($size)" ||
        fail "flux3 serve edit $k: PNG ($size) differs from generate's: $(head -c 300 "$TMP/es$k.json")"
done
