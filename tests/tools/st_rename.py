#!/usr/bin/env python3
"""Copy a safetensors file with its tensor names rewritten (standard library
only), for tests/sh/components.sh: ComfyUI-style single files from the
golden diffusers components.

    python3 tests/tools/st_rename.py IN OUT [--prefix OLD NEW] [--drop NAME]... [--add FILE PFX]...
                                     [--meta-layer-prefix PFX]

--prefix: every name starting with OLD starts with NEW instead (either may be
""); --drop: leave NAME out; --add: also every tensor of FILE, its name behind
PFX (a whole ComfyUI checkpoint: the VAE as first_stage_model.*);
--meta-layer-prefix: the layer names of the __metadata__ _quantization_metadata
(fp8 hints) behind PFX too. Data bytes
are copied unchanged; the header is rewritten with offsets packed in name
order.
"""
import json, struct, sys


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()


def main():
    a = sys.argv[1:]
    src, dst, rest = a[0], a[1], a[2:]
    old = new = None
    drop = set()
    adds = []
    meta_pfx = None
    i = 0
    while i < len(rest):
        if rest[i] == "--prefix":
            old, new = rest[i + 1], rest[i + 2]; i += 3
        elif rest[i] == "--drop":
            drop.add(rest[i + 1]); i += 2
        elif rest[i] == "--add":
            adds.append((rest[i + 1], rest[i + 2])); i += 3
        elif rest[i] == "--meta-layer-prefix":
            meta_pfx = rest[i + 1]; i += 2
        else:
            sys.exit("st_rename.py: unknown argument %r" % rest[i])
    hdr, data = read(src)
    meta = hdr.pop("__metadata__", None)
    out, blobs, off = {}, [], 0
    if meta is not None:
        if meta_pfx is not None and "_quantization_metadata" in meta:
            q = json.loads(meta["_quantization_metadata"])
            q["layers"] = {meta_pfx + k: v for k, v in q["layers"].items()}
            meta["_quantization_metadata"] = json.dumps(q)
        out["__metadata__"] = meta
    items = []
    for k, v in hdr.items():
        if k in drop:
            continue
        nk = new + k[len(old):] if old is not None and k.startswith(old) else k
        items.append((nk, v, data))
    for path, pfx in adds:
        h2, d2 = read(path)
        h2.pop("__metadata__", None)
        items += [(pfx + k, v, d2) for k, v in h2.items()]
    for nk, v, d in sorted(items, key=lambda it: it[0]):
        b = d[v["data_offsets"][0]:v["data_offsets"][1]]
        out[nk] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


if __name__ == "__main__":
    main()
