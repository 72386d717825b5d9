#!/usr/bin/env bash
# budget: 15 s; checks: 8
# tpgen encode on FLUX.3's Qwen3-VL text encoder (tests/data/flux3-te, made by
# tests/tools/flux3_te_golden.py from diffusers' Flux3TextEncoderStep): the
# window (prompt length rounded up to 80, capped at --max-sequence-length),
# exact ids and mask, prompt_embeds [1, L, 128] within 1e-4 at tp 1 and 2.
source "$TPGEN_ROOT/tests/lib.sh"
G=$TMP/flux3-te
mkdir -p "$G"
xz -dc "$TPGEN_ROOT/tests/data/flux3-te/flux3-te.tar.xz" | tar -xf - -C "$G" &&
    cp "$TPGEN_ROOT"/tests/data/qwen3-tokenizer/tokenizer*.json "$G/model/tokenizer/" ||
    { fail "encode flux3: cannot unpack tests/data/flux3-te"; exit 0; }

# compare FILE CASE TOL
compare() {
    python3 - "$1" "$G/cases.safetensors" "$2" "$3" <<'PY'
import json, struct, sys, math
def load(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    def get(name):
        e = h[name]; s, t = e['data_offsets']; raw = b[8 + n + s: 8 + n + t]
        fmt = {'F32': 'f', 'I64': 'q'}[e['dtype']]
        return list(struct.unpack('<%d%s' % (len(raw) // struct.calcsize(fmt), fmt), raw)), e['shape']
    return get, h.get('__metadata__', {})
(out, meta), (ref, _) = load(sys.argv[1]), load(sys.argv[2])
case, tol = sys.argv[3], float(sys.argv[4])
if meta.get('text_encoder') != 'qwen3vl': sys.exit('metadata text_encoder %r' % meta.get('text_encoder'))
ids, _ = out('input_ids'); gids, _ = ref('case%s.input_ids' % case)
if ids != gids: sys.exit('input_ids differ (%d vs %d tokens): %s vs %s' % (len(ids), len(gids), ids[:16], gids[:16]))
mask, _ = out('attention_mask'); gmask, _ = ref('case%s.attention_mask' % case)
if mask != gmask: sys.exit('attention_mask differs')
e, shape = out('prompt_embeds'); g, gshape = ref('case%s.prompt_embeds' % case)
if shape != gshape: sys.exit('shape %s vs %s' % (shape, gshape))
rel = math.sqrt(sum((a - b) ** 2 for a, b in zip(e, g)) / sum(b * b for b in g))
if not rel < tol: sys.exit('prompt_embeds rel L2 %.3g >= %g' % (rel, tol))
PY
}
field() { python3 -c "import json; print(json.load(open('$G/cases.json'))['cases'][$1]['$2'])"; }

if ! command -v python3 >/dev/null; then
    fail "encode flux3: python3 is needed to read the golden files"
    exit 0
fi
for c in 0 1 2 3 4; do
    p=$(field $c prompt); cap=$(field $c max_sequence_length); L=$(field $c window)
    flag=""; [ "$cap" != 8192 ] && flag="--max-sequence-length $cap"
    if out=$($TPGEN encode --model "$G/model" --prompt "$p" --save-embeds "$TMP/e$c.st" $flag --precision f32 2>&1) &&
        why=$(compare "$TMP/e$c.st" $c 1e-4 2>&1) && echo "$out" | grep -q "\[1, $L, 128\]"; then
        ok "encode flux3 case $c tp 1 f32 (window $L)"
    else fail "encode flux3 case $c tp 1: $out $why"; fi
done
p=$(field 2 prompt)
if out=$($MPIRUN -np 2 $TPGEN encode --model "$G/model" --prompt "$p" --save-embeds "$TMP/tp2.st" --precision f32 2>&1) &&
    why=$(compare "$TMP/tp2.st" 2 1e-4 2>&1); then
    ok "encode flux3 tp 2 f32"
else fail "encode flux3 tp 2: $out $why"; fi
if out=$($TPGEN encode --model "$G/model" --prompt "$p" --save-embeds "$TMP/bf16.st" 2>&1) &&
    why=$(compare "$TMP/bf16.st" 2 3e-2 2>&1); then
    ok "encode flux3 bf16 within 3e-2"
else fail "encode flux3 bf16: $out $why"; fi
# inspect shows the Qwen3-VL plan (vision tower unsharded, never loaded)
if out=$($TPGEN inspect --model "$G/model" --component text_encoder --tp 2 2>&1) && echo "$out" | grep -q "q_proj"; then
    ok "inspect flux3 text encoder plan tp 2"
else fail "inspect flux3 text encoder: $out"; fi
