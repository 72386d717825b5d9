#!/usr/bin/env python3
"""Hostile image files for tests/sh/image_decode.sh (test-only tool, no PIL).

  craft_image.py dht OUT BASE.jpg          a DHT segment declaring 300 codes (more than the 256 a table holds)
  craft_image.py dcsym OUT BASE.jpg        a DC Huffman table whose symbol (200) is past the 16 categories
  craft_image.py badcode OUT BASE.jpg      entropy data of all one bits: a Huffman code past every table
  craft_image.py rescan OUT BASE.jpg N     the last scan of a progressive file repeated N times
  craft_image.py cut OUT IN N              the first N bytes of IN (N < 0: all but the last -N)
  craft_image.py pngbig OUT W H full|tiny|worst
                                           a PNG declaring W x H of black rows: 8-bit RGB, all rows or
                                           only the first 64 (the rest of the stream missing); or the
                                           costliest kind to decode: 16-bit RGBA, Adam7-interlaced (the
                                           whole image buffered), every row Paeth-filtered
  craft_image.py crc OUT IN CHUNK          IN with the CRC of its first CHUNK chunk changed
  craft_image.py flood OUT IN N            IN with N empty segments before its image: APP1 markers for a
                                           JPEG, tEXt chunks (keyword "a") for a PNG
"""
import struct, sys, zlib


def segments(j):
    """(marker, start, end) of each marker segment up to the first SOS header's end, then the rest"""
    out, i = [], 2
    while i < len(j):
        assert j[i] == 0xFF, "not at a marker at %d" % i
        m = j[i + 1]
        n = struct.unpack(">H", j[i + 2:i + 4])[0]
        out.append((m, i, i + 2 + n))
        i += 2 + n
        if m == 0xDA:
            break
    return out, i


def scan_segments(j):
    """every SOS segment with its entropy data: (start, end)"""
    res, i = [], 2
    while i < len(j) - 1:
        if j[i] != 0xFF:
            i += 1
            continue
        m = j[i + 1]
        if m == 0xD9 or m == 0x00 or 0xD0 <= m <= 0xD7 or m == 0xFF:
            i += 1 if m == 0xFF else 2
            continue
        n = struct.unpack(">H", j[i + 2:i + 4])[0]
        if m != 0xDA:
            i += 2 + n
            continue
        k = i + 2 + n   # entropy data up to the next marker that is not a stuffed byte or a restart
        while k < len(j) - 1 and not (j[k] == 0xFF and j[k + 1] not in (0x00,) and not 0xD0 <= j[k + 1] <= 0xD7):
            k += 1
        res.append((i, k))
        i = k
    return res


def chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def main(a):
    cmd = a[0]
    if cmd in ("dht", "dcsym", "badcode", "rescan"):
        j = open(a[2], "rb").read()
        segs, data_at = segments(j)
        sos = segs[-1][1]
        if cmd == "dht":
            counts = [0] * 14 + [255, 45]
            body = bytes([0x00]) + bytes(counts) + bytes(range(256)) + bytes(range(44))   # 300 symbols
            seg = b"\xff\xc4" + struct.pack(">H", 2 + len(body)) + body
            j = j[:sos] + seg + j[sos:]
        elif cmd == "dcsym":
            body = bytes([0x00]) + bytes([0, 1] + [0] * 14) + bytes([200])
            seg = b"\xff\xc4" + struct.pack(">H", 2 + len(body)) + body
            j = j[:sos] + seg + j[sos:]
        elif cmd == "badcode":
            end = j.rfind(b"\xff\xd9")
            n = end - data_at
            j = j[:data_at] + (b"\xff\x00" * (n // 2 + 1))[:n] + j[end:]
        else:
            scans = scan_segments(j)
            s, e = scans[-1]
            j = j[:e] + j[s:e] * int(a[3]) + j[e:]
        open(a[1], "wb").write(j)
    elif cmd == "cut":
        d = open(a[2], "rb").read()
        n = int(a[3])
        open(a[1], "wb").write(d[:n])
    elif cmd == "pngbig":
        w, h, kind = int(a[2]), int(a[3]), a[4]
        z = zlib.compressobj(9)
        if kind == "worst":
            parts = []
            for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
                pw, ph = max(0, (w - x0 + dx - 1) // dx), max(0, (h - y0 + dy - 1) // dy)
                if pw:
                    row = b"\4" + b"\0" * (8 * pw)
                    parts += [z.compress(row) for _ in range(ph)]
            idat = b"".join(parts) + z.flush()
            ihdr = struct.pack(">IIBBBBB", w, h, 16, 6, 0, 0, 1)
        else:
            rows = h if kind == "full" else 64
            row = b"\0" * (1 + 3 * w)
            idat = b"".join(z.compress(row) for _ in range(rows)) + z.flush()
            ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
        data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
        open(a[1], "wb").write(data)
    elif cmd == "crc":
        d = bytearray(open(a[2], "rb").read())
        i, tag = 8, a[3].encode()
        while i + 8 <= len(d):
            n = struct.unpack(">I", d[i:i + 4])[0]
            if d[i + 4:i + 8] == tag:
                d[i + 8 + n] ^= 0x5A
                break
            i += 12 + n
        else:
            sys.exit("no %s chunk" % a[3])
        open(a[1], "wb").write(bytes(d))
    elif cmd == "flood":
        d, n = open(a[2], "rb").read(), int(a[3])
        if d[:2] == b"\xff\xd8":
            d = d[:2] + b"\xff\xe1\x00\x02" * n + d[2:]
        else:
            d = d[:33] + chunk(b"tEXt", b"a\0") * n + d[33:]   # after IHDR
        open(a[1], "wb").write(d)
    else:
        sys.exit("unknown command " + cmd)


main(sys.argv[1:])
