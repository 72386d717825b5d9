"""The synthetic reference images of tests/data/flux3-refs (python3 stdlib only: the tests write them at run time
instead of storing them; tests/tools/flux3_refs_golden.py writes the same bytes for diffusers).

    python3 tests/tools/flux3_refs_images.py OUTDIR [NAME ...]

writes OUTDIR/NAME.png for each NAME of IMAGES (all by default) and prints their sha256 (the golden's
refs.json keeps them, so a test knows it has the images the golden was made from). Each image is an integer
formula of (x, y, channel): 8-bit RGB, no floating point, the same bytes on every machine. The same formula is
in tests/test_flux3_refs.c (flux3_refs_pattern), which checks the sha256 of its own bytes against refs.json.
"""
import hashlib
import os
import struct
import sys
import zlib

# name: (width, height); big is over 4 MP (area path, with the 0.995 back-off), long has a side over 4096
# (max-side path), tall and small are the two references of a multi-reference ("crop") case
IMAGES = {"big": (2100, 2050), "long": (4500, 40), "tall": (40, 200), "small": (70, 56)}


def pattern(x, y, c):
    """8-bit sample: 48-pixel blocks of hashed colours plus a gentle ramp (smooth inside a block, edges between)"""
    b = ((x // 48) * 73856093 ^ (y // 48) * 19349663 ^ (c + 1) * 83492791) & 0xFFFFFFFF
    return (b % 160 + (x * 3 + y * 2 + c * 5) % 64 + 16) & 255


def rgb_bytes(w, h):
    rows = []
    for y in range(h):
        rows.append(bytes(pattern(x, y, c) for x in range(w) for c in range(3)))
    return rows


def png_bytes(w, h, rows):
    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def write(outdir, name):
    w, h = IMAGES[name]
    rows = rgb_bytes(w, h)
    path = os.path.join(outdir, name + ".png")
    with open(path, "wb") as f:
        f.write(png_bytes(w, h, rows))
    return path, hashlib.sha256(b"".join(rows)).hexdigest()


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name in sys.argv[2:] or list(IMAGES):
        path, digest = write(out, name)
        print(name, digest)
