#!/usr/bin/env python3
"""Test images for tests/sh/edit.sh, written without PIL (zlib + struct).

  mkpng.py OUT.png W H KIND [SEED]     write a PNG
  mkpng.py --expect W H KIND [SEED]    print the RGB bytes PIL's convert("RGB")
                                       gives for that PNG, as hex

KIND: rgb8 (over 1 Mpx: rows are windows of one pseudo-random sequence), rgba8, grey8, greya8, palette8 (with a tRNS alpha), rgb16, grey16,
greya16; huge (a valid IHDR claiming W x H, no pixel data). The expected RGB
follows PIL's rules, written out here independently of tpgen: grey is
replicated, alpha dropped, palettes looked up, 16-bit RGB/LA samples reduced
to the high byte, 16-bit greyscale (PIL mode "I") clipped to 255."""
import struct, sys, zlib


def chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def samples(w, h, seed):
    # a deterministic pattern with every byte value present and 16-bit values above 255
    s = seed * 2654435761 & 0xFFFFFFFF
    out = []
    for y in range(h):
        row = []
        for x in range(w):
            s = (s * 1103515245 + 12345) & 0x7FFFFFFF
            row.append(((x * 7 + y * 13) * 257 + (s >> 8)) & 0xFFFF)
        out.append(row)
    return out


def build_large_rgb8(w, h, seed):
    """rgb8 over 1 Mpx (the size and memory tests): row y is a window, 3y bytes in, of one pseudo-random
    sequence, fast in plain Python (the per-pixel loop below takes half a minute at 12 Mpx)"""
    seq = bytes(v & 255 for v in samples(3 * (w + h), 1, seed)[0])
    raw = b"".join(b"\0" + seq[3 * y:3 * y + 3 * w] for y in range(h))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    return png, b"".join(seq[3 * y:3 * y + 3 * w] for y in range(h))


def build(w, h, kind, seed):
    if kind == "rgb8" and w * h > 1 << 20:
        return build_large_rgb8(w, h, seed)
    v = samples(w, h, seed)
    ctype, depth, plte, trns = {"rgb8": (2, 8), "rgba8": (6, 8), "grey8": (0, 8), "greya8": (4, 8),
                                "palette8": (3, 8), "rgb16": (2, 16), "grey16": (0, 16),
                                "greya16": (4, 16)}[kind] + (None, None)
    nch = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    pal = [((i * 37) & 255, (i * 91 + 11) & 255, (255 - i) & 255) for i in range(256)]
    raw, rgb = bytearray(), bytearray()
    for y in range(h):
        raw.append(0)
        for x in range(w):
            b = v[y][x]
            chans = [(b + 4099 * c) & 0xFFFF for c in range(nch)]
            if depth == 8:
                chans = [c & 255 for c in chans]
                raw.extend(chans)
            else:
                for c in chans:
                    raw.extend(struct.pack(">H", c))
            if ctype == 3:
                rgb.extend(pal[chans[0]])
            elif ctype in (0, 4):
                g = chans[0]
                if depth == 16:
                    g = min(g, 255) if ctype == 0 else g >> 8
                rgb.extend((g, g, g))
            else:
                rgb.extend([(c >> 8) if depth == 16 else c for c in chans[:3]])
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
    if ctype == 3:
        png += chunk(b"PLTE", bytes(c for p in pal for c in p)) + chunk(b"tRNS", bytes(range(256)))
    png += chunk(b"IDAT", zlib.compress(bytes(raw), 6)) + chunk(b"IEND", b"")
    return png, bytes(rgb)


def main():
    a = sys.argv[1:]
    if a[0] == "--expect":
        w, h, kind = int(a[1]), int(a[2]), a[3]
        print(build(w, h, kind, int(a[4]) if len(a) > 4 else 1)[1].hex())
        return
    out, w, h, kind = a[0], int(a[1]), int(a[2]), a[3]
    if kind == "huge":
        data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")
    else:
        data = build(w, h, kind, int(a[4]) if len(a) > 4 else 1)[0]
    open(out, "wb").write(data)


main()
