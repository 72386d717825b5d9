#!/usr/bin/env python3
"""Copy a GGUF file with its tensor names rewritten (standard library only),
for tests/sh/dm_prefix.sh: stable-diffusion.cpp-style GGUFs from the golden
ComfyUI-layout files.

    python3 tests/tools/gguf_rename.py IN OUT [--prefix OLD NEW] [--drop-key KEY]...

--prefix: every tensor name starting with OLD starts with NEW instead (OLD
may be ""); --drop-key: leave metadata KEY out (sd.cpp writes no
general.architecture). The tensor data section is copied unchanged (tensor
offsets are relative to it); the header is rewritten and padded to the
file's alignment.
"""
import struct, sys

# GGUF value types: fixed sizes (8 string, 9 array)
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def take(self, n):
        s = self.b[self.o:self.o + n]
        if len(s) != n:
            sys.exit("gguf_rename.py: truncated file")
        self.o += n
        return s

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u64())

    def value(self, t):
        """the raw bytes of one value of type t"""
        start = self.o
        if t in FIXED:
            self.take(FIXED[t])
        elif t == 8:
            self.string()
        elif t == 9:
            et, n = self.u32(), self.u64()
            for _ in range(n):
                self.value(et)
        else:
            sys.exit("gguf_rename.py: unknown value type %d" % t)
        return self.b[start:self.o]


def gstr(s):
    return struct.pack("<Q", len(s)) + s


def main():
    a = sys.argv[1:]
    src, dst, rest = a[0], a[1], a[2:]
    old = new = None
    drop = set()
    i = 0
    while i < len(rest):
        if rest[i] == "--prefix":
            old, new = rest[i + 1].encode(), rest[i + 2].encode(); i += 3
        elif rest[i] == "--drop-key":
            drop.add(rest[i + 1].encode()); i += 2
        else:
            sys.exit("gguf_rename.py: unknown argument %r" % rest[i])
    b = open(src, "rb").read()
    r = Reader(b)
    if r.take(4) != b"GGUF":
        sys.exit("gguf_rename.py: %s is not a GGUF file" % src)
    version, n_t, n_kv = r.u32(), r.u64(), r.u64()
    kvs, align = [], 32
    for _ in range(n_kv):
        key = r.string()
        t = r.u32()
        raw = r.value(t)
        if key == b"general.alignment":
            align = struct.unpack("<I", raw)[0] if t == 4 else struct.unpack("<Q", raw)[0]
        if key not in drop:
            kvs.append(gstr(key) + struct.pack("<I", t) + raw)
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.u32()
        rest_info = struct.pack("<I", nd) + r.take(8 * nd) + r.take(4 + 8)   # dims, type, offset
        if old is not None and name.startswith(old):
            name = new + name[len(old):]
        infos.append(gstr(name) + rest_info)
    data = b[(r.o + align - 1) // align * align:]
    head = b"GGUF" + struct.pack("<IQQ", version, n_t, len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % align)
    with open(dst, "wb") as f:
        f.write(head + data)


if __name__ == "__main__":
    main()
