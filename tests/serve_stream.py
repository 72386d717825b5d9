#!/usr/bin/env python3
"""Streamed answers of `tpgen serve` (server-sent events) through the official
openai client, for tests/sh/serve_stream.sh. Prints "ok - NAME" or
"FAIL - NAME: why" lines.

  serve_stream.py generate PORT STEPS OUTDIR [API_KEY]
      streams with 0, 1 and 3 partial images and n = 2: the event types,
      fields and order, partial_image_index, sizes, and each completed image
      byte-identical to the unstreamed answer of the same request; the
      partial PNGs are written to OUTDIR/partial-P-K.png
  serve_stream.py edit PORT STEPS IMAGE
      a streamed edit (image_edit.* events), completed == the unstreamed edit
  serve_stream.py error PORT BAD_IMAGE
      an edit whose reference fails after the stream started: an error event,
      which the client raises as openai.APIError
  serve_stream.py nokey PORT
      a stream without the API key: 401 before any event (AuthenticationError)
  serve_stream.py dp PORT STEPS OUTDIR
      two streams at once on a dp 2 server (one per TP group: the second
      group's events travel to world rank 0 as messages)
  serve_stream.py hangup PORT
      a client that closes the stream after its first partial image: the
      render stops within a few steps, and the server takes the next request
"""
import base64
import json
import struct
import sys
import time
import urllib.request

from openai import OpenAI, APIError


def ok(name):
    print(f"ok - {name}", flush=True)


def fail(name, why):
    print(f"FAIL - {name}: {why}", flush=True)


def client(port, key="unused"):
    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, timeout=300, max_retries=0)


def png_size(b):
    if b[:8] != b"\x89PNG\r\n\x1a\n" or b[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", b[16:24])


def expected_partials(steps, partials):
    """The steps after which a partial comes (docs/serve.md): floor(k*steps/(P+1)), k = 1..P, within 1..steps-1."""
    return sorted({k * steps // (partials + 1) for k in range(1, partials + 1)} & set(range(1, steps)))


def check_events(name, events, prefix, n, steps, partials, want_pngs, size, outdir=None):
    """n images one after the other: each its partials (index from 0), then its completed event."""
    want_p = len(expected_partials(steps, partials))
    kinds = [e.type for e in events]
    want_kinds = ([f"{prefix}.partial_image"] * want_p + [f"{prefix}.completed"]) * n
    if kinds != want_kinds:
        return fail(name, f"events {kinds}, expected {want_kinds}")
    bad = []
    k = 0
    for i, e in enumerate(events):
        png = base64.b64decode(e.b64_json)
        wh = png_size(png)
        if e.size != size or wh != tuple(int(x) for x in size.split("x")) or e.output_format != "png":
            bad.append(f"event {i}: size {e.size}, PNG {wh}, format {e.output_format}")
        if e.type.endswith("partial_image"):
            if e.partial_image_index != i % (want_p + 1):
                bad.append(f"event {i}: partial_image_index {e.partial_image_index}")
            if outdir:
                with open(f"{outdir}/partial-{partials}-{e.partial_image_index}.png", "wb") as f:
                    f.write(png)
        else:
            if png != want_pngs[k]:
                bad.append(f"completed image {k} differs from the unstreamed one")
            if e.usage.total_tokens != 0:
                bad.append("usage")
            k += 1
    if bad:
        return fail(name, "; ".join(bad[:4]))
    ok(f"{name}: {len(events)} events ({want_p} partials per image), indices, sizes, completed == unstreamed")


def cmd_generate(port, steps, outdir, key="unused"):
    steps = int(steps)
    c = client(port, key)
    args = dict(model="tiny", prompt="a fox", size="64x64", response_format="b64_json")
    ref = c.images.generate(n=2, **args, extra_body={"seed": 7, "steps": steps})
    pngs = [base64.b64decode(d.b64_json) for d in ref.data]
    for p in (0, 1, 3):
        t0 = time.monotonic()
        events = list(c.images.generate(n=1, stream=True, partial_images=p, **args,
                                        extra_body={"seed": 7, "steps": steps}))
        check_events(f"stream, partial_images {p} ({time.monotonic() - t0:.2f} s)", events, "image_generation", 1,
                     steps, p, pngs[:1], "64x64", outdir)
    events = list(c.images.generate(n=2, stream=True, partial_images=2, **args,
                                    extra_body={"seed": 7, "steps": steps}))
    check_events("stream, n = 2, partial_images 2: image 0's events, then image 1's (seed + 1)", events,
                 "image_generation", 2, steps, 2, pngs, "64x64")


def cmd_edit(port, steps, image):
    c = client(port)
    kw = dict(model="tiny", prompt="the fox", response_format="b64_json",
              extra_body={"seed": 5, "steps": int(steps)})
    ref = c.images.edit(image=open(image, "rb"), **kw)
    png = base64.b64decode(ref.data[0].b64_json)
    wh = png_size(png)
    events = list(c.images.edit(image=open(image, "rb"), stream=True, partial_images=3, **kw))
    check_events("streamed edit (multipart stream=true, partial_images=3)", events, "image_edit", 1, int(steps), 3,
                 [png], f"{wh[0]}x{wh[1]}")


def cmd_error(port, bad_image):
    c = client(port)
    seen = []
    try:
        for e in c.images.edit(image=open(bad_image, "rb"), prompt="x", stream=True, partial_images=1,
                               extra_body={"steps": 2}):
            seen.append(e.type)
        fail("an error after the stream started", f"no exception; events {seen}")
    except APIError as e:
        body = e.body if isinstance(e.body, dict) else {}
        if "image" in str(e) and body.get("param") == "image" and not seen:
            ok(f"an error after the stream started: an error event, raised by the client ({str(e)[:70]}...)")
        else:
            fail("an error after the stream started", f"{e!r} body {body} events {seen}")


def cmd_nokey(port):
    from openai import AuthenticationError
    try:
        list(client(port, "wrong-key").images.generate(model="tiny", prompt="a", size="64x64", stream=True,
                                                       partial_images=1, extra_body={"steps": 2}))
        fail("a stream with a wrong API key", "events came")
    except AuthenticationError as e:
        ok(f"a stream with a wrong API key: 401 before any event ({e.status_code})")


def cmd_dp(port, steps, outdir):
    import threading
    ts = [threading.Thread(target=cmd_generate, args=(port, steps, outdir)) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def cmd_hangup(port):
    c = client(port)
    m0 = metrics(port)
    c0, s0 = m0["tpgen_jobs_cancelled_total"], m0["tpgen_step_seconds_count"]
    ab0 = m0['tpgen_requests_total{outcome="abandoned"}']
    stream = c.images.generate(model="tiny", prompt="a fox", size="64x64", stream=True, partial_images=3,
                               extra_body={"seed": 9, "steps": 200})
    first = next(iter(stream))   # after step 50
    stream.close()
    t0 = time.monotonic()
    m = metrics(port)
    while time.monotonic() - t0 < 60 and (m["tpgen_jobs_cancelled_total"] < c0 + 1 or
                                           m['tpgen_requests_total{outcome="abandoned"}'] < ab0 + 1):
        time.sleep(0.05)
        m = metrics(port)
    steps = m["tpgen_step_seconds_count"] - s0
    if first.type == "image_generation.partial_image" and m["tpgen_jobs_cancelled_total"] == c0 + 1 and \
            steps < 100 and m['tpgen_requests_total{outcome="abandoned"}'] == ab0 + 1:
        ok(f"a client that hangs up mid-stream: its render cancelled {time.monotonic() - t0:.2f} s later, "
           f"after {steps:.0f} of 200 steps (the first partial comes after step 50), counted abandoned")
    else:
        fail("a client that hangs up mid-stream cancels its render",
             f"first {first.type}, cancelled {m['tpgen_jobs_cancelled_total'] - c0}, steps {steps}")
    r = c.images.generate(model="tiny", prompt="a fox", size="64x64", response_format="b64_json",
                          extra_body={"seed": 1, "steps": 2})
    if png_size(base64.b64decode(r.data[0].b64_json)) == (64, 64):
        ok("after the hang-up the next request is answered")
    else:
        fail("the next request after a hang-up", "no 64x64 PNG")


if __name__ == "__main__":
    cmds = {"generate": cmd_generate, "edit": cmd_edit, "error": cmd_error, "hangup": cmd_hangup, "nokey": cmd_nokey,
            "dp": cmd_dp}
    cmds[sys.argv[1]](*sys.argv[2:])
