#!/usr/bin/env python3
"""Copy a safetensors file with its tensor names rewritten (standard library
only), for tests/sh/components.sh: ComfyUI-style single files from the
golden diffusers components.

    python3 tests/tools/st_rename.py IN OUT [--prefix OLD NEW] [--drop NAME]...

--prefix: every name starting with OLD starts with NEW instead (NEW may be
""); --drop: leave NAME out. Data bytes are copied unchanged; the header is
rewritten with offsets packed in name order.
"""
import json, struct, sys


def main():
    a = sys.argv[1:]
    src, dst, rest = a[0], a[1], a[2:]
    old = new = None
    drop = set()
    i = 0
    while i < len(rest):
        if rest[i] == "--prefix":
            old, new = rest[i + 1], rest[i + 2]; i += 3
        elif rest[i] == "--drop":
            drop.add(rest[i + 1]); i += 2
        else:
            sys.exit("st_rename.py: unknown argument %r" % rest[i])
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    meta = hdr.pop("__metadata__", None)
    out, blobs, off = {}, [], 0
    if meta is not None:
        out["__metadata__"] = meta
    items = []
    for k, v in hdr.items():
        if k in drop:
            continue
        nk = new + k[len(old):] if old is not None and k.startswith(old) else k
        items.append((nk, v))
    for nk, v in sorted(items):
        b = data[v["data_offsets"][0]:v["data_offsets"][1]]
        out[nk] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(out, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


if __name__ == "__main__":
    main()
