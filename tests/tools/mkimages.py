#!/usr/bin/env python3
"""Reference images and what PIL makes of them (tests/data/image/, read by
tests/test_image_decode.c). Run once with Pillow, in a venv outside the
repository, from the repository root:

    python3 -m venv /work/venv-img && /work/venv-img/bin/pip install pillow
    /work/venv-img/bin/python tests/tools/mkimages.py tests/data/image

For every file NAME it writes NAME.rgb: the bytes of
ImageOps.exif_transpose(Image.open(NAME)).convert("RGB") (diffusers'
load_image), and manifest.json lists NAME, the size PIL gives and PIL's
version. The files: the 8 EXIF orientations (JPEG, little-endian EXIF
written by PIL), big-endian EXIF and LONG-typed tags built here by hand,
XMP-only orientation (JPEG and PNG), a progressive JPEG with orientation,
PNG eXIf and "Raw profile type exif" chunks, greyscale / CMYK / YCCK
(Adobe) JPEGs (YCCK through tests/tools/mkjpeg.c: PIL cannot write it),
and 16-bit, grey+alpha, palette and 1-bit PNGs. Each file is a few
hundred bytes."""
import io, json, os, struct, subprocess, sys, tempfile, zlib
import PIL
from PIL import Image, ImageOps, PngImagePlugin

W, H = 24, 16   # not square, not a multiple of 16: every transpose and the MCU edges show


def pattern(mode="RGB", w=W, h=H):
    im = Image.new("RGB", (w, h))
    px = im.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = (x * 255 // (w - 1), y * 255 // (h - 1), 255 if (x < w // 3 and y < h // 2) else (x * y * 7) % 256)
    return im if mode == "RGB" else im.convert(mode)


def tiff_ifd0(endian, entries):
    """a TIFF stream with IFD0 = entries [(tag, type, count, value bytes)]; values over 4 bytes follow the IFD"""
    e = "<" if endian == "II" else ">"
    head = endian.encode() + struct.pack(e + "HI", 42, 8)
    n = len(entries)
    extra_at = 8 + 2 + 12 * n + 4
    ifd, extra = struct.pack(e + "H", n), b""
    for tag, typ, count, val in entries:
        if len(val) <= 4:
            ifd += struct.pack(e + "HHI", tag, typ, count) + val.ljust(4, b"\0")
        else:
            ifd += struct.pack(e + "HHII", tag, typ, count, extra_at + len(extra))
            extra += val
    return head + ifd + struct.pack(e + "I", 0) + extra


def exif_short(o, endian="II"):
    e = "<" if endian == "II" else ">"
    return b"Exif\0\0" + tiff_ifd0(endian, [(0x010F, 2, 4, b"tpg\0"), (0x0112, 3, 1, struct.pack(e + "H", o))])


def xmp_packet(o, attr=True):
    t = ('tiff:Orientation="%d"' % o) if attr else ("><tiff:Orientation>%d</tiff:Orientation" % o)
    return ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            '<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" %s/></rdf:RDF></x:xmpmeta>' % t).encode()


def jpeg_with_app1(jpeg, payloads):
    """insert APP1 segments right after SOI"""
    segs = b"".join(b"\xff\xe1" + struct.pack(">H", len(p) + 2) + p for p in payloads)
    return jpeg[:2] + segs + jpeg[2:]


def save_jpeg(im, **kw):
    b = io.BytesIO()
    im.save(b, "JPEG", quality=90, **kw)
    return b.getvalue()


def save_png(im, **kw):
    b = io.BytesIO()
    im.save(b, "PNG", **kw)
    return b.getvalue()


def build_mkjpeg(tmp):
    exe = os.path.join(tmp, "mkjpeg")
    subprocess.check_call(["cc", "-O2", "-o", exe, os.path.join(os.path.dirname(__file__), "mkjpeg.c"), "-ljpeg"])
    return exe


def main(out):
    os.makedirs(out, exist_ok=True)
    files = {}
    base = pattern()
    for o in range(1, 9):
        ex = Image.Exif()
        ex[0x0112] = o
        files["orient%d.jpg" % o] = save_jpeg(base, exif=ex.tobytes())
    plain = save_jpeg(base)
    files["orient6_mm.jpg"] = jpeg_with_app1(plain, [exif_short(6, "MM")])
    # a LONG-typed tag (PIL reads the integer), and a value split over two Exif segments (PIL concatenates them)
    files["orient8_long.jpg"] = jpeg_with_app1(plain, [b"Exif\0\0" + tiff_ifd0("MM", [(0x0112, 4, 1, struct.pack(">I", 8))])])
    whole = exif_short(3)
    files["orient3_split.jpg"] = jpeg_with_app1(plain, [whole[:14], b"Exif\0\0" + whole[14:]])
    # XMP only (attribute form), and EXIF orientation 1 beside an XMP 6: the EXIF tag wins
    files["orient5_xmp.jpg"] = jpeg_with_app1(plain, [b"http://ns.adobe.com/xap/1.0/\0" + xmp_packet(5)])
    files["orient1_exif_over_xmp.jpg"] = jpeg_with_app1(plain, [exif_short(1), b"http://ns.adobe.com/xap/1.0/\0" + xmp_packet(6)])
    ex = Image.Exif()
    ex[0x0112] = 7
    files["orient7_progressive.jpg"] = save_jpeg(base, exif=ex.tobytes(), progressive=True)
    files["grey.jpg"] = save_jpeg(pattern("L"))
    files["cmyk.jpg"] = save_jpeg(pattern("CMYK"))
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_mkjpeg(tmp)
        p = os.path.join(tmp, "ycck.jpg")
        subprocess.check_call([exe, "ycck", p, str(W), str(H)])
        files["ycck.jpg"] = open(p, "rb").read()
        p = os.path.join(tmp, "bands.jpg")
        subprocess.check_call([exe, "bands", p, str(W), str(H), "29"])   # 88 scans: under the limit of 100
        files["bands88.jpg"] = open(p, "rb").read()
    # PNG: eXIf (PIL's own writer), "Raw profile type exif" (zTXt, as ImageMagick writes it), XMP in iTXt
    ex = Image.Exif()
    ex[0x0112] = 6
    files["orient6_exif.png"] = save_png(base, exif=ex.tobytes())
    info = PngImagePlugin.PngInfo()
    raw = exif_short(8)[6:]
    info.add_text("Raw profile type exif", "\nexif\n%8d\n%s\n" % (len(raw), raw.hex()), zip=True)
    files["orient8_raw.png"] = save_png(base, pnginfo=info)
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp_packet(2, attr=False).decode())
    files["orient2_xmp.png"] = save_png(base, pnginfo=info)
    # the PNG kinds PIL converts: 16-bit RGB and grey (I;16, clipped), grey+alpha, palette with alpha, 1-bit
    im16 = Image.new("I;16", (W, H))
    im16.putdata([(x * 2731 + y * 977) % 65536 for y in range(H) for x in range(W)])
    files["grey16.png"] = save_png(im16)
    files["greya.png"] = save_png(pattern("LA"))
    files["palette.png"] = save_png(base.convert("P", palette=Image.Palette.ADAPTIVE, colors=37), transparency=3)
    files["bw1.png"] = save_png(pattern("1"))
    files["interlaced.png"] = interlace_png(base)
    manifest = {"pillow": PIL.__version__, "files": []}
    for name, data in sorted(files.items()):
        open(os.path.join(out, name), "wb").write(data)
        im = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
        open(os.path.join(out, name + ".rgb"), "wb").write(im.tobytes())
        manifest["files"].append({"file": name, "width": im.size[0], "height": im.size[1]})
    manifest["files"].append(rgb16_png(out))
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"), indent=1)


def chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def interlace_png(im):
    """an Adam7 PNG (PIL writes none): the seven passes of the RGB image, filter 0"""
    w, h = im.size
    px = im.load()
    raw = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
        xs = range(x0, w, dx)
        if not len(xs):
            continue
        for y in range(y0, h, dy):
            raw += b"\0" + b"".join(bytes(px[x, y]) for x in xs)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def rgb16_png(out):
    """16-bit RGB with alpha (PIL: RGBA, high bytes), written by hand"""
    raw = b""
    for y in range(H):
        raw += b"\0" + b"".join(struct.pack(">HHHH", x * 2800, y * 4000 + 77, (x * y * 600) % 65536, 1000 * x) for x in range(W))
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 16, 6, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    open(os.path.join(out, "rgba16.png"), "wb").write(data)
    im = Image.open(io.BytesIO(data)).convert("RGB")
    open(os.path.join(out, "rgba16.png.rgb"), "wb").write(im.tobytes())
    return {"file": "rgba16.png", "width": im.size[0], "height": im.size[1]}


main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/image")
