#!/usr/bin/env bash
# budget: 45 s; checks: 22
# fp8 checkpoints from the command line: inspect shows fp8 tensors, scales
# and halved per-rank bytes; check --quantize fp8 quantises (near, not at,
# the bf16 golden); bad fp8 files fail with a clear error and a non-zero
# exit on every rank (and again under the sanitizers).
source "$TPGEN_ROOT/tests/lib.sh"
F=$TPGEN_GOLDEN/flux2-fp8
A=$TPGEN_GOLDEN/flux2-tiny-a
export OMP_NUM_THREADS=1
if ! command -v python3 >/dev/null; then
    fail "fp8: python3 is needed to write the bad fp8 files (scripts/install-deps.sh installs it)"; exit 0
fi

# ---- inspect ----
out=$("$TPGEN" inspect --model "$F/channel" --tp 2 2>&1)
if echo "$out" | grep -qE '^transformer_blocks.0.attn.to_q.weight +colwise +\[128, 128\] +\[64, 128\] F8_E4M3 scale per-channel \[64 local\]$' &&
   echo "$out" | grep -qE '^transformer_blocks.0.attn.to_out.0.weight +rowwise .* F8_E4M3 scale per-tensor$' &&
   echo "$out" | grep -q '^fp8: 30 fp8 weights (30 with scales), 30 scale/hint/marker tensors'; then ok "inspect fp8 channel tp 2"
else fail "inspect fp8 channel tp 2: $(echo "$out" | grep -E 'to_q.weight|^fp8' | head -3)"; fi
# per-rank bytes: each fp8 layer holds 1 byte per element plus its scales,
# computed here from the headers (python) and compared with inspect --json
for tp in 1 2 4; do
    want=$(python3 - "$F/scaled/transformer/diffusion_pytorch_model.safetensors" "$tp" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); tp = int(sys.argv[2])
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
size = {'F8_E4M3': 1, 'F8_E5M2': 1, 'BF16': 2, 'F32': 4, 'U8': 1}
aux = ('.scale_weight', '.weight_scale', '.scale_input', '.input_scale', '.comfy_quant')
tot = 0
for n, v in h.items():
    if n == '__metadata__' or n == 'scaled_fp8' or n.endswith(aux): continue
    el = 1
    for d in v['shape']: el *= d
    sharded = ('transformer_blocks.' in n and '.attn.norm' not in n)
    b = el * size[v['dtype']] // (tp if sharded else 1)
    if v['dtype'].startswith('F8'):
        b += 4   # one per-tensor scale (this variant)
    tot += b
print(tot)
PY
)
    got=$("$TPGEN" inspect --model "$F/scaled" --tp $tp --json | python3 -c "import json,sys; print(json.load(sys.stdin)['ranks'][0]['weight_bytes'])")
    [ -n "$want" ] && [ "$got" = "$want" ] && ok "inspect fp8 bytes tp $tp ($got)" || fail "inspect fp8 bytes tp $tp: got $got, want $want"
done

# FLUX.2-dev shapes, sparse mixed fp8 (block linears F8_E4M3 + per-channel scales): per-rank bytes at tp 2/4/8
# against a count from the header (colwise scales split with their rows, rowwise ones replicated)
"$TPGEN" bench load --make "$TMP/dev" --shape dev --sparse --fp8 >/dev/null 2>&1 || fail "bench load --make --fp8"
for tp in 2 4 8; do
    want=$(python3 - "$TMP/dev/transformer/diffusion_pytorch_model.safetensors" "$tp" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); tp = int(sys.argv[2])
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
size = {'F8_E4M3': 1, 'BF16': 2, 'F32': 4}
rowwise = ('attn.to_out.0.weight', 'attn.to_add_out.weight', 'linear_out.weight')
tot = 0
for n, v in h.items():
    if n == '__metadata__': continue
    el = 1
    for d in v['shape']: el *= d
    if n.endswith('.weight_scale'):
        w = n[:-len('.weight_scale')] + '.weight'
        row = w.endswith(rowwise) or ('single_transformer_blocks' in w and w.endswith('attn.to_out.weight'))
        tot += el * 4 // (1 if row else tp); continue
    sharded = v['dtype'] == 'F8_E4M3'
    tot += el * size[v['dtype']] // (tp if sharded else 1)
print(tot)
PY
)
    got=$("$TPGEN" inspect --model "$TMP/dev" --tp $tp --json | python3 -c "import json,sys; print(json.load(sys.stdin)['ranks'][0]['weight_bytes'])")
    [ -n "$want" ] && [ "$got" = "$want" ] && ok "inspect dev fp8 bytes tp $tp ($got)" || fail "inspect dev fp8 bytes tp $tp: got $got, want $want"
done

# ---- --quantize fp8 ----
for np in 1 2; do
    out=$($MPIRUN -np $np "$TPGEN" check --backend cpu --model "$A/model" --cases "$A/transformer_cases.safetensors" --quantize fp8 --tol 5e-2 2>&1)
    err=$(echo "$out" | sed -n 's/^max_rel_err=\([0-9.e+-]*\) .*PASS$/\1/p')
    # fp8 rounding shows (> 1e-3) but stays near the bf16 weights' golden (< 5e-2)
    if [ -n "$err" ] && python3 -c "import sys; sys.exit(0 if 1e-3 < $err < 5e-2 else 1)"; then ok "check --quantize fp8 tp $np (max_rel_err $err)"
    else fail "check --quantize fp8 tp $np: $(echo "$out" | tail -2 | tr '\n' ' ')"; fi
done
expect_fail "check --quantize int4" "quantize takes fp8" "$TPGEN" check --model "$A/model" --quantize int4

# generate --quantize fp8 (flag and run-spec key) on a make-tiny pipeline at np 2: the same latents either way,
# near but not equal to the unquantised run, and the PNG says so
if "$TPGEN" make-tiny --out "$TMP/tiny" --seed 3 >/dev/null 2>&1; then
    g=(--model "$TMP/tiny" --width 64 --height 48 --steps 2 --seed 5 --backend cpu)
    if [ -d "$TMP/tiny/text_encoder" ]; then g+=(--prompt "a small test"); else g+=(--prompt-embeds "$TMP/tiny/prompt_embeds.safetensors"); fi
    printf 'quantize: fp8\n' > "$TMP/q.yaml"
    $MPIRUN -np 2 "$TPGEN" generate "${g[@]}" --save-latents "$TMP/plain.st" --no-decode >/dev/null 2>&1 &&
    $MPIRUN -np 2 "$TPGEN" generate "${g[@]}" --quantize fp8 --save-latents "$TMP/q1.st" --output "$TMP/q1.png" >/dev/null 2>&1 &&
    $MPIRUN -np 2 "$TPGEN" generate "${g[@]}" --spec "$TMP/q.yaml" --save-latents "$TMP/q2.st" --no-decode >/dev/null 2>&1
    rc=$?
    rel=$(python3 - "$TMP/plain.st" "$TMP/q1.st" <<'PY'
import json, math, struct, sys
def lat(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); t = h['latents']
    o0, o1 = t['data_offsets']; d = b[8 + n + o0:8 + n + o1]
    return struct.unpack('<%df' % (len(d) // 4), d)
a, q = lat(sys.argv[1]), lat(sys.argv[2])
print(math.sqrt(sum((x - y) ** 2 for x, y in zip(a, q)) / sum(x * x for x in a)))
PY
)
    if [ $rc -eq 0 ] && cmp -s "$TMP/q1.st" "$TMP/q2.st" && python3 -c "import sys; sys.exit(0 if 1e-5 < $rel < 0.2 else 1)"; then
        ok "generate --quantize fp8 (flag = spec key; latents $rel from the bf16 run)"
    else fail "generate --quantize fp8: rc $rc, rel ${rel:-?}, flag/spec equal: $(cmp -s "$TMP/q1.st" "$TMP/q2.st" && echo yes || echo no)"; fi
    if [ -d "$TMP/tiny/vae" ]; then
        grep -aq "fp8 weights (--quantize)" "$TMP/q1.png" && ok "PNG parameters name --quantize fp8" || fail "PNG parameters lack --quantize"
    fi
else
    fail "make-tiny for the --quantize test"
fi

# ---- bad fp8 files, from the golden scaled variant ----
B=$TMP/bad
mutate() {   # mutate NAME KIND: a copy of the scaled variant with one defect
    mkdir -p "$B/$1/transformer"
    cp "$F/scaled/transformer/config.json" "$B/$1/transformer/"
    python3 - "$F/scaled/transformer/diffusion_pytorch_model.safetensors" "$B/$1/transformer/diffusion_pytorch_model.safetensors" "$2" <<'PY'
import json, struct, sys
src, dst, kind = sys.argv[1:4]
raw = open(src, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = bytearray(raw[8 + n:])
s = 'transformer_blocks.0.attn.to_k.scale_weight'
if kind == 'noscale':
    del h[s]                                     # the hints still list the layer as scaled fp8
elif kind == 'nanscale':
    b = h[s]['data_offsets'][0]; data[b:b + 4] = struct.pack('<f', float('nan'))
elif kind == 'shape':
    h[s]['shape'] = [1, 1, 1]                    # 4 bytes still, but no known layout
elif kind == 'truncate':
    pass
hb = json.dumps(h).encode()
out = struct.pack('<Q', len(hb)) + hb + bytes(data)
if kind == 'truncate': out = out[:-1000]        # the last tensors run past the end
open(dst, 'wb').write(out)
PY
}
for k in noscale nanscale shape truncate; do mutate $k $k; done
bad_cases() {   # bad_cases BIN PREFIX
    local bin=$1 p=$2
    expect_fail "${p}fp8_bad_missing_scale" "rank [01]: .*fp8 weight 'transformer_blocks.0.attn.to_k.weight' has no scale" \
        $MPIRUN -np 2 "$bin" check --backend cpu --model "$B/noscale"
    expect_fail "${p}fp8_bad_nan_scale" "rank [01]: .*scale tensor 'transformer_blocks.0.attn.to_k.scale_weight' has a non-finite value" \
        $MPIRUN -np 2 "$bin" check --backend cpu --model "$B/nanscale"
    expect_fail "${p}fp8_bad_scale_shape" "rank [01]: .*'transformer_blocks.0.attn.to_k.scale_weight' has shape \[1, 1, 1\], an unknown layout" \
        $MPIRUN -np 2 "$bin" check --backend cpu --model "$B/shape"
    expect_fail "${p}fp8_bad_truncated" "rank [01]: .*(past the end|beyond|shorter|outside)" \
        $MPIRUN -np 2 "$bin" check --backend cpu --model "$B/truncate"
    expect_fail "${p}fp8_bad_inspect" "non-finite" "$bin" inspect --model "$B/nanscale"
}
bad_cases "$TPGEN" ""
ASAN=$TPGEN_ROOT/build-asan
if [ -x "$ASAN/tpgen" ]; then
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1   # ASAN_OPTIONS and LSAN_OPTIONS (leaks on) come from tests/run.sh
    bad_cases "$ASAN/tpgen" "asan_"
else
    fail "fp8 sanitizer runs: build-asan/ not found (make asan)"
fi
