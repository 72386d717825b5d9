#!/usr/bin/env bash
# budget: 15 s; checks: 9
# tpgen encode with a llama.cpp GGUF text encoder (FLUX.2-dev layout: text_encoder/mistral-q8_0.gguf,
# arch llama, permuted Q/K rows, Q8_0; tokenizer/ = the mini Tekken tokenizer), at tp 1, 2 and 4 and in
# bf16, against the transformers reference of tests/data/te-gguf/refs.safetensors (ids exactly, embeds
# by relative L2); bad GGUF folders refused on every rank; generate and serve (prompt cache) through the
# GGUF encoder on a make-tiny --family dev folder.
source "$TPGEN_ROOT/tests/lib.sh"
DATA=$TPGEN_ROOT/tests/data/te-gguf
M=$TMP/dev
mkdir -p "$M/text_encoder" "$M/tokenizer"
ln -s "$DATA/mistral-q8_0.gguf" "$M/text_encoder/mistral-q8_0.gguf"
cp "$TPGEN_ROOT"/tests/data/tekken-mini/hf/tokenizer.json "$TPGEN_ROOT"/tests/data/tekken-mini/hf/tokenizer_config.json "$M/tokenizer/"

# compare FILE TOL: input_ids equal the reference's, every mask entry 1, prompt_embeds within TOL (rel L2)
compare() {
    python3 - "$1" "$DATA/refs.safetensors" "$2" <<'PY'
import json, struct, sys, math
def load(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    def get(name):
        e = h[name]; s, t = e['data_offsets']; raw = b[8 + n + s: 8 + n + t]
        fmt = {'F32': 'f', 'I64': 'q'}[e['dtype']]
        return list(struct.unpack('<%d%s' % (len(raw) // struct.calcsize(fmt), fmt), raw))
    return get
out, ref, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if out('input_ids') != ref('mistral-q8_0.encode.input_ids'): sys.exit('input_ids differ: %s' % out('input_ids'))
if set(out('attention_mask')) != {1}: sys.exit('padding where none was expected')
e, g = out('prompt_embeds'), ref('mistral-q8_0.encode.prompt_embeds')
if len(e) != len(g): sys.exit('sizes %d vs %d' % (len(e), len(g)))
rel = math.sqrt(sum((a - b) ** 2 for a, b in zip(e, g)) / sum(b * b for b in g))
if not rel < tol: sys.exit('prompt_embeds rel L2 %.3g >= %g' % (rel, tol))
print('rel L2 %.3g' % rel)
PY
}

run_case() { # NAME NP PRECISION TOL
    local name=$1 np=$2 prec=$3 tol=$4 out why launcher=
    [ "$np" -gt 1 ] && launcher="$MPIRUN -np $np"
    if out=$($launcher $TPGEN encode --model "$M" --prompt "a red fox" --save-embeds "$TMP/$name.st" \
             --max-sequence-length 32 --precision $prec 2>&1) && why=$(compare "$TMP/$name.st" $tol 2>&1); then
        ok "encode gguf: $name ($why)"
    else fail "encode gguf: $name: $out $why"; fi
}

if ! command -v python3 >/dev/null; then
    fail "encode gguf: python3 is needed to read the reference (scripts/install-deps.sh installs it)"
else
    run_case "tp 1 f32" 1 f32 1e-4
    run_case "tp 2 f32" 2 f32 1e-4
    run_case "tp 4 f32" 4 f32 1e-4
    run_case "tp 2 bf16" 2 bf16 3e-2
fi

# bad folders: no tokenizer, a truncated file, unknown architecture is in the unit tests (every key)
mkdir -p "$TMP/notok/text_encoder" "$TMP/trunc/text_encoder"
ln -s "$DATA/mistral-q8_0.gguf" "$TMP/notok/text_encoder/"
expect_fail "encode gguf: no tokenizer folder" "tokenizer" \
    $MPIRUN -np 2 $TPGEN encode --model "$TMP/notok" --prompt x --save-embeds "$TMP/x.st"
head -c 4000 "$DATA/mistral-q8_0.gguf" > "$TMP/trunc/text_encoder/model.gguf"
cp -r "$M/tokenizer" "$TMP/trunc/"
expect_fail "encode gguf: truncated file named" "trunc/text_encoder/model.gguf" \
    $MPIRUN -np 2 $TPGEN encode --model "$TMP/trunc" --prompt x --save-embeds "$TMP/x.st"
[ -e "$TMP/x.st" ] && fail "encode gguf: a failed run left an output file" || ok "encode gguf: failed runs leave no file"

# --- generate end to end with the GGUF text encoder: a make-tiny --family dev folder (hidden 32,
# vocabulary 1280: the GGUF's widths) whose text_encoder/ is replaced by the GGUF. The prompt
# through the GGUF encoder gives the same latents as the embeddings `tpgen encode` saved above. ---
CMP=$TMP/st_compare
P=$TMP/devp
if ! cc -std=c17 -O2 -o "$CMP" "$TPGEN_ROOT/tests/tools/st_compare.c" -ljansson -lm 2>"$TMP/cc.log"; then
    fail "building tests/tools/st_compare.c: $(tail -3 "$TMP/cc.log")"
elif ! out=$($TPGEN make-tiny --out "$P" --family dev --seed 4 2>&1); then
    fail "make-tiny --family dev: $out"
else
    rm -f "$P"/text_encoder/*
    ln -s "$DATA/mistral-q8_0.gguf" "$P/text_encoder/model.gguf"
    gen() { # NP STEM FLAGS...
        local np=$1 stem=$2; shift 2
        $MPIRUN -np "$np" $TPGEN --model "$P" --seed 5 --width 64 --height 48 --backend cpu --steps 2 --precision f32 \
            --max-sequence-length 32 --no-decode --save-latents "$TMP/$stem.safetensors" "$@" 2>&1
    }
    if o1=$(gen 2 from_prompt --prompt "a red fox") && o2=$(gen 1 from_embeds --prompt-embeds "$TMP/tp 1 f32.st"); then
        c=$("$CMP" "$TMP/from_prompt.safetensors" "$TMP/from_embeds.safetensors" latents 1e-5); rc=$?
        [ $rc -eq 0 ] && ok "generate with the GGUF text encoder (tp 2) = generate from tpgen encode's embeddings ($c)" \
            || fail "generate GGUF text encoder vs saved embeddings: $c"
    else
        fail "generate with the GGUF text encoder: $(echo "$o1 $o2" | tail -4)"
    fi
fi

# --- serve with the GGUF text encoder: the same prompt twice is one encoder run and one cache hit,
# and the two images are the same ---
if [ -d "$P/text_encoder" ] && command -v curl >/dev/null && command -v jq >/dev/null; then
    M=$P
    . "$TPGEN_ROOT/tests/lib_serve.sh"
    if ! start_server "$TMP/srv.log" "$TPGEN" --max-sequence-length 32; then
        fail "serve with the GGUF text encoder: not ready: $(tail -5 "$TMP/srv.log")"
    else
        for k in 1 2; do
            curl -s -X POST "http://127.0.0.1:$PORT/v1/images/generations" -H 'Content-Type: application/json' \
                -d '{"prompt": "a red fox", "size": "64x48", "seed": 5, "steps": 2, "response_format": "b64_json"}' |
                jq -r '.data[0].b64_json' | base64 -d >"$TMP/srv$k.png"
        done
        curl -s "http://127.0.0.1:$PORT/metrics" >"$TMP/srv-metrics.txt"
        hits=$(sed -n 's/^tpgen_prompt_cache_lookups_total{result="hit"} //p' "$TMP/srv-metrics.txt")
        misses=$(sed -n 's/^tpgen_prompt_cache_lookups_total{result="miss"} //p' "$TMP/srv-metrics.txt")
        [ -s "$TMP/srv1.png" ] && cmp -s "$TMP/srv1.png" "$TMP/srv2.png" && [ "$hits" = 1 ] && [ "$misses" = 1 ] &&
            ok "serve with the GGUF text encoder (tp 2): 1 prompt-cache miss, 1 hit, the same PNG twice" ||
            fail "serve with the GGUF text encoder: hits '$hits' misses '$misses', PNGs $(ls -la "$TMP"/srv*.png 2>&1 | tr '\n' ' ')"
        stop_server || fail "serve with the GGUF text encoder: exit status $?"
    fi
fi
