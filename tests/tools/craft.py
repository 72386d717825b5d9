#!/usr/bin/env python3
"""Crafted hostile files for tests/sh/hostile.sh (test-only tool).

  craft.py poke FILE TENSOR VALUE [all]   write VALUE (nan, inf) into element 0 (or every element) of a tensor
  craft.py st FILE NAME:DTYPE:D0,D1,...   a safetensors file of zero-filled tensors (empty shape list: a scalar)
  craft.py latents FILE N C H W VALUE     packed latents [1, N, C] (f32, all VALUE) with height/width metadata
  craft.py zeros SRC DST                  DST: SRC's tensors (names, dtypes, shapes) with every byte zero
  craft.py bytevocab                      print a vocabulary of the 256 byte tokens (id = byte value)
  craft.py header FILE N                  a header of N tiny entries (8 data bytes each)
"""
import json, struct, sys

def read_header(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        return n, json.loads(f.read(n))

def write_st(path, entries, meta=None):
    h, off, blobs = {}, 0, []
    if meta: h['__metadata__'] = meta
    for name, dt, shape, data in entries:
        h[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(data)]}
        off += len(data); blobs.append(data)
    s = json.dumps(h, separators=(',', ':')).encode()
    s += b' ' * (-len(s) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(s)) + s + b''.join(blobs))

SIZE = {'F32': 4, 'BF16': 2, 'F16': 2}

def main(a):
    if a[0] == 'poke':
        path, name, val = a[1], a[2], float(a[3])
        n, h = read_header(path)
        t = h[name]
        b, e = t['data_offsets']
        raw = {'F32': struct.pack('<f', val), 'BF16': struct.pack('<f', val)[2:], 'F16': struct.pack('<e', val)}[t['dtype']]
        count = (e - b) // len(raw) if len(a) > 4 and a[4] == 'all' else 1
        with open(path, 'r+b') as f:
            f.seek(8 + n + b)
            f.write(raw * count)
    elif a[0] == 'st':
        ents = []
        for spec in a[2:]:
            name, dt, dims = spec.split(':')
            shape = [int(x) for x in dims.split(',')] if dims else []
            numel = 1
            for d in shape: numel *= d
            ents.append((name, dt, shape, b'\0' * (numel * SIZE[dt])))
        write_st(a[1], ents)
    elif a[0] == 'latents':
        path, N, C, H, W, val = a[1], int(a[2]), int(a[3]), a[4], a[5], float(a[6])
        write_st(path, [('latents', 'F32', [1, N, C], struct.pack('<f', val) * (N * C))], {'height': H, 'width': W})
    elif a[0] == 'zeros':
        n, h = read_header(a[1])
        meta = h.pop('__metadata__', None)
        ents = [(k, v['dtype'], v['shape'], b'\0' * (v['data_offsets'][1] - v['data_offsets'][0])) for k, v in h.items()]
        write_st(a[2], ents, meta)
    elif a[0] == 'header':
        path, n = a[1], int(a[2])
        with open(path, 'wb') as f:
            body = ','.join('"t%d":{"dtype":"U8","shape":[8],"data_offsets":[%d,%d]}' % (i, 8 * i, 8 * i + 8) for i in range(n))
            s = ('{' + body + '}').encode()
            f.write(struct.pack('<Q', len(s)) + s + b'\0' * (8 * n))
    elif a[0] == 'bytevocab':   # the 256 byte-level tokens (GPT-2 alphabet), id = byte value
        cps, n = [], 0
        for b in range(256):
            if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF: cps.append(b)
            else: cps.append(0x100 + n); n += 1
        print(json.dumps({chr(cp): b for b, cp in enumerate(cps)}))
    else:
        sys.exit('unknown command ' + a[0])

main(sys.argv[1:])
