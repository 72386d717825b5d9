#!/usr/bin/env python3
"""Compare the latents a run saved with a stored tensor, bit for bit
(tests/sh/rng.sh; standard library only):

  noise_check.py LATENTS.safetensors REF.safetensors TENSOR

LATENTS: tpgen's --save-latents file, tensor `latents` F32 [1, N, C] (packed
tokens, N = h*w). REF: a tensor [1, C, h, w] in BF16 or F32 (torch's draw, or
a golden set's initial_latents); h and w come from LATENTS' metadata
(height/16, width/16). Prints the number of values that differ and exits 1
when any does."""
import json, struct, sys

def load(path):
    b = open(path, 'rb').read()
    n, = struct.unpack('<Q', b[:8])
    return json.loads(b[8:8 + n]), b[8 + n:]

def values(h, data, name):
    t = h[name]
    s, e = t['data_offsets']
    raw = data[s:e]
    if t['dtype'] == 'F32':
        return t['shape'], list(struct.unpack('<%dI' % (len(raw) // 4), raw))
    if t['dtype'] == 'BF16':   # a bf16 value's f32 bits are its 16 bits followed by 16 zero bits
        return t['shape'], [v << 16 for v in struct.unpack('<%dH' % (len(raw) // 2), raw)]
    sys.exit('%s: dtype %s not handled' % (name, t['dtype']))

def main(lat_path, ref_path, name):
    hl, dl = load(lat_path)
    meta = hl.get('__metadata__', {})
    ls, lv = values(hl, dl, 'latents')
    hr, dr = load(ref_path)
    if name not in hr: sys.exit('%s has no tensor %s' % (ref_path, name))
    rs, rv = values(hr, dr, name)
    H, W = int(meta['height']) // 16, int(meta['width']) // 16
    if len(ls) != 3 or ls[0] != 1 or ls[1] != H * W or rs != [1, ls[2], H, W]:
        sys.exit('shapes differ: latents %s (%dx%d tokens), %s %s' % (ls, H, W, name, rs))
    C = ls[2]
    bad = sum(lv[t * C + c] != rv[c * H * W + t] for c in range(C) for t in range(H * W))
    print('%d of %d values differ' % (bad, len(lv)))
    sys.exit(1 if bad else 0)

main(*sys.argv[1:])
