#!/usr/bin/env bash
# budget: 20 s; checks: 16
# tpgen encode: prompt -> prompt_embeds file, checked against diffusers'
# klein-tiny golden (ids exactly, embeds by relative L2), at tp 1, tp 2 and
# with two data-parallel groups; bad inputs give clear errors on every rank.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TPGEN_GOLDEN/klein-tiny
MODEL=$G/model

# compare FILE CASE TOL: saved input_ids must equal the golden ids, prompt_embeds within TOL (rel L2)
compare() {
    python3 - "$1" "$G/e2e.safetensors" "$2" "$3" <<'PY'
import json, struct, sys, math
def load(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    def get(name):
        e = h[name]; s, t = e['data_offsets']; raw = b[8 + n + s: 8 + n + t]
        fmt = {'F32': 'f', 'I64': 'q'}[e['dtype']]
        return list(struct.unpack('<%d%s' % (len(raw) // struct.calcsize(fmt), fmt), raw)), e['shape']
    return get
out, ref, case, tol = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3], float(sys.argv[4])
ids, _ = out('input_ids'); gids, _ = ref('case%s.input_ids' % case)
if ids != gids: sys.exit('input_ids differ: %s vs %s' % (ids[:24], gids[:24]))
mask, _ = out('attention_mask'); gmask, _ = ref('case%s.attention_mask' % case)
if mask != gmask: sys.exit('attention_mask differs')
e, shape = out('prompt_embeds'); g, gshape = ref('case%s.prompt_embeds' % case)
if shape != gshape: sys.exit('shape %s vs %s' % (shape, gshape))
num = sum((a - b) ** 2 for a, b in zip(e, g)); den = sum(b * b for b in g)
rel = math.sqrt(num / den)
if not rel < tol: sys.exit('prompt_embeds rel L2 %.3g >= %g' % (rel, tol))
PY
}

prompt_of() { python3 -c "import json,sys; print(json.load(open('$G/e2e.json'))['cases'][$1]['prompt'])"; }

if ! command -v python3 >/dev/null; then
    fail "encode: python3 is needed to read the golden files (scripts/install-deps.sh installs it)"
else
    for c in 0 1 2; do
        p=$(prompt_of $c)
        if out=$($TPGEN encode --model "$MODEL" --prompt "$p" --save-embeds "$TMP/e$c.st" \
                 --max-sequence-length 32 --precision f32 2>&1) && why=$(compare "$TMP/e$c.st" $c 1e-4 2>&1); then
            ok "encode klein-tiny case $c tp 1 f32"
        else fail "encode klein-tiny case $c tp 1 f32: $out $why"; fi
    done
    p=$(prompt_of 1)
    if out=$($MPIRUN -np 2 $TPGEN encode --model "$MODEL" --prompt "$p" --save-embeds "$TMP/tp2.st" \
             --max-sequence-length 32 --precision f32 2>&1) && why=$(compare "$TMP/tp2.st" 1 1e-4 2>&1); then
        ok "encode klein-tiny tp 2 f32"
    else fail "encode klein-tiny tp 2: $out $why"; fi
    if out=$($MPIRUN -np 2 $TPGEN encode --tp 1 --model "$MODEL" --prompt "$p" --save-embeds "$TMP/dp2.st" \
             --max-sequence-length 32 --precision f32 2>&1) && why=$(compare "$TMP/dp2.st" 1 1e-4 2>&1); then
        ok "encode klein-tiny dp 2 x tp 1"
    else fail "encode klein-tiny dp 2: $out $why"; fi
    # bf16 weights: the spec's expected agreement is ~3e-2
    if out=$($TPGEN encode --model "$MODEL" --prompt "$p" --save-embeds "$TMP/bf16.st" \
             --max-sequence-length 32 --precision bf16 2>&1) && why=$(compare "$TMP/bf16.st" 1 3e-2 2>&1); then
        ok "encode klein-tiny bf16 within 3e-2"
    else fail "encode klein-tiny bf16: $out $why"; fi
fi

# bad inputs
mkdir -p "$TMP/no_te" "$TMP/t5/text_encoder"
echo '{"_class_name": "Flux2KleinPipeline"}' > "$TMP/no_te/model_index.json"
echo '{"model_type": "t5", "d_model": 64}' > "$TMP/t5/text_encoder/config.json"
expect_fail "encode: folder without text_encoder" "no text_encoder/ folder" \
    $MPIRUN -np 2 $TPGEN encode --model "$TMP/no_te" --prompt x --save-embeds "$TMP/x.st"
expect_fail "encode: unknown text encoder type" "model_type \"t5\" is not supported" \
    $MPIRUN -np 2 $TPGEN encode --model "$TMP/t5" --prompt x --save-embeds "$TMP/x.st"
expect_fail "encode: missing --prompt" "--prompt TEXT is required" $TPGEN encode --model "$MODEL" --save-embeds "$TMP/x.st"
expect_fail "encode: bad precision" "bf16 or f32" $TPGEN encode --model "$MODEL" --prompt x --save-embeds "$TMP/x.st" --precision fp8
expect_fail "encode: tp not dividing the ranks" "does not divide" \
    $MPIRUN -np 2 $TPGEN encode --tp 3 --model "$MODEL" --prompt x --save-embeds "$TMP/x.st"
expect_fail "encode: output folder missing" "$TMP/nodir" \
    $TPGEN encode --model "$MODEL" --prompt x --save-embeds "$TMP/nodir/x.st" --max-sequence-length 8
[ -e "$TMP/x.st" ] && fail "encode: a failed run left an output file" || ok "encode: failed runs leave no file"

# inspect knows the text-encoder plans: Mistral (legacy prefix) at tp 2 shards K/V and the vocabulary;
# Qwen3 with 2 KV heads at tp 4 replicates K/V (the documented rule); tp 3 is refused with the reason
if command -v python3 >/dev/null; then
    style_of() { # JSON FILE, tensor name -> style
        python3 -c "import json,sys; t={x['name']: x['style'] for x in json.load(open('$1'))['tensors']}; print(t.get('$2'))"
    }
    $TPGEN inspect --model $TPGEN_GOLDEN/mistral-tiny/model --component text_encoder --tp 2 --json > "$TMP/i1.json" 2>&1
    s1=$(style_of "$TMP/i1.json" language_model.model.layers.3.self_attn.k_proj.weight)
    s2=$(style_of "$TMP/i1.json" language_model.model.embed_tokens.weight)
    s3=$(style_of "$TMP/i1.json" language_model.model.layers.3.mlp.down_proj.weight)
    [ "$s1 $s2 $s3" = "colwise colwise rowwise" ] && ok "inspect: mistral text-encoder plan at tp 2" \
        || fail "inspect: mistral plan at tp 2: k_proj=$s1 embed=$s2 down=$s3"
    $TPGEN inspect --model $TPGEN_GOLDEN/klein-tiny/model --component text_encoder --tp 4 --json > "$TMP/i2.json" 2>&1
    s1=$(style_of "$TMP/i2.json" model.layers.0.self_attn.k_proj.weight)
    s2=$(style_of "$TMP/i2.json" model.layers.0.self_attn.q_proj.weight)
    [ "$s1 $s2" = "replicated colwise" ] && ok "inspect: qwen3 K/V replicated when tp exceeds the KV heads" \
        || fail "inspect: qwen3 at tp 4: k_proj=$s1 q_proj=$s2"
fi
expect_fail "inspect: text encoder at tp 3" "does not divide num_attention_heads" \
    $TPGEN inspect --model $TPGEN_GOLDEN/klein-tiny/model --component text_encoder --tp 3
