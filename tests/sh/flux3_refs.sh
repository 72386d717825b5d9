#!/usr/bin/env bash
# budget: 20 s; checks: 8
# FLUX.3 references as diffusers 0.42.1 prepares them (tests/data/flux3-refs,
# tests/tools/flux3_refs_golden.py): `tpgen generate` with a single 4500x40
# reference (over 4096 px wide: LANCZOS-downscaled to 4096x36, reflect-padded
# to 4096x64, the PNG cropped back to 4096x36) on the flow-map model, and with
# two references 40x200 + 70x56 ("crop": each under 1 MP, centre-cropped to
# 16; FLUX.2 would refuse the 40-pixel side) on the base model with CFG, at
# np 1 and 2: final latents <= 1e-4 relative to the modular pipeline's, PNG
# size, and the multi case's PNG within +-1 of its u8. The images are written
# here (tests/tools/flux3_refs_images.py, sha256 against refs.json). The
# pixels of every preprocessing (the 4.3 MP one too) and the reference tokens
# are tests/test_flux3_refs.c. Then: a reference of several with a side
# under 16 px is refused naming it on every rank; FLUX.2 keeps its checks.
source "$TPGEN_ROOT/tests/lib.sh"
export OMP_NUM_THREADS=1
D=$TPGEN_ROOT/tests/data/flux3-refs
for k in base flowmap; do flux3_folder $k "$TMP/$k"; done
python3 "$TPGEN_ROOT/tests/tools/flux3_refs_images.py" "$TMP" long tall small >"$TMP/sha.txt"
python3 - "$D/refs.json" "$TMP/sha.txt" <<'PY' && ok "flux3 refs: the test images are the golden's (sha256)" || fail "flux3 refs: test images differ from the golden's"
import json, sys
g = json.load(open(sys.argv[1]))["images"]
for line in open(sys.argv[2]):
    n, h = line.split(); assert g[n]["sha256"] == h, n
PY

# compare LATENTS and PNG with CASE: latents rel L2 <= 1e-4; PNG shape = refs.json's; image_u8 (if stored) +-1
COMPARE='
import hashlib, json, math, struct, sys, zlib
def st(path, name):
    f = open(path, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
    if name is None: name = [k for k in h if k != "__metadata__"][0]
    if name not in h: return None, None
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
lat, g, img, meta, case = sys.argv[1:6]
c = json.load(open(meta))["cases"][case]
_, x = st(lat, None); _, r = st(g, "latents_final")
rel = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, r)) / sum(b * b for b in r))
w, h, px = png(img)
ok = len(x) == len(r) and rel <= 1e-4 and [h, w, 3] == c["image_shape"]
gs, gu = st(g, "image_u8")
if gu is not None:
    mx = max(abs(a - b) for a, b in zip(px, gu)) if ok else -1; ok = ok and mx <= 1; how = "max |u8 diff| %d" % mx
else:
    how = "u8 " + ("bit-equal" if hashlib.sha256(bytes(px)).hexdigest() == c["image_sha256"] else "not bit-equal (not required)")
print("latents rel %.3g, png %dx%d, %s" % (rel, w, h, how)); sys.exit(0 if ok else 1)
'
# run_case CASE MODEL NP ARGS...
run_case() {
    local c=$1 m=$2 np=$3; shift 3
    local out rc
    out=$($MPIRUN -np "$np" "$TPGEN" generate --model "$TMP/$m" --prompt-embeds "$D/$c.safetensors" --precision f32 \
          --backend cpu --output "$TMP/$c.$np.png" --save-latents "$TMP/$c.$np.safetensors" "$@" 2>&1); rc=$?
    if [ $rc -ne 0 ]; then fail "flux3 refs $c tp=$np: rc=$rc $(echo "$out" | tail -3 | tr '\n' ' ')"; return; fi
    r=$(python3 -c "$COMPARE" "$TMP/$c.$np.safetensors" "$D/$c.safetensors" "$TMP/$c.$np.png" "$D/refs.json" "$c" 2>&1) \
        && ok "flux3 refs $c tp=$np = diffusers' modular pipeline ($r)" || fail "flux3 refs $c tp=$np: $r"
}
for np in 1 2; do
    run_case long flowmap $np --seed 11 --steps 2 --image "$TMP/long.png"
    run_case multi base $np --seed 3 --steps 2 --width 64 --height 48 --negative-prompt-embeds "$D/multi.safetensors" \
        --image "$TMP/tall.png" --image "$TMP/small.png"
done

# one of several references with a side under 16 px: no token; refused before any weight is read
python3 - "$TMP/thin.png" <<'PY'
import struct, sys, zlib
w, h = 15, 300
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
raw = b"".join(b"\0" + bytes((x * 17 + y) & 255 for x in range(w) for _ in range(3)) for y in range(h))
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                              chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
PY
expect_fail "flux3 one of several references under 16 px" 'thin.png is 15x300.*16 pixels' \
    $MPIRUN -np 2 "$TPGEN" generate --model "$TMP/flowmap" --prompt-embeds "$D/long.safetensors" --steps 1 \
    --precision f32 --backend cpu --image "$TMP/small.png" --image "$TMP/thin.png" --output "$TMP/e.png"
# the same file alone is a single reference: padded, no check
out=$("$TPGEN" generate --model "$TMP/flowmap" --prompt-embeds "$D/long.safetensors" --steps 1 --precision f32 \
      --backend cpu --image "$TMP/thin.png" --output "$TMP/thin-out.png" 2>&1) &&
    python3 -c 'import struct,sys; b=open(sys.argv[1],"rb").read(); w,h=struct.unpack(">II",b[16:24]); sys.exit(0 if (w,h)==(15,300) else 1)' \
        "$TMP/thin-out.png" && ok "flux3 a single 15x300 reference: padded (symmetric) to 64x304, the PNG cropped back to 15x300" \
    || fail "flux3 single 15x300 reference: $(echo "$out" | tail -2)"
# FLUX.2 keeps diffusers' FLUX.2 checks (sides >= 64) on the same file
G=$TPGEN_GOLDEN/klein-tiny-edit
expect_fail "FLUX.2 still refuses a 40-pixel side" 'tall.png: 40x200 is too small' \
    "$TPGEN" generate --model "$TPGEN_GOLDEN/klein-tiny/model" --prompt-embeds "$G/edit.safetensors:case0.prompt_embeds" \
    --steps 1 --backend cpu --image "$TMP/tall.png" --output "$TMP/e2.png"
