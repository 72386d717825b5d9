#!/usr/bin/env python3
"""Time to the first partial image and the cost of streaming, against a running
`tpgen serve` (docs/serve.md, "Measurements"), with the official openai client
(build/venv-serve/bin/python, as tests/sh/serve.sh installs it):

  scripts/bench-stream.py PORT [SIZE] [STEPS] [REPEATS] [API_KEY]

For each repeat, in turn: an unstreamed request, a stream with 0 partial
images and one with 3 (same prompt, seed and size; the prompt is cached
after a first warm-up request, so the encoder is not timed). Prints the
median of each: total seconds, and for the 3-partial stream the seconds to
its first partial image and between its events."""
import statistics
import sys
import time

from openai import OpenAI


def main(port, size="512x512", steps="4", repeats="3", key="unused"):
    c = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, timeout=3600, max_retries=0)
    kw = dict(model=c.models.list().data[0].id, prompt="a red fox in the snow", size=size)
    extra = {"seed": 7, "steps": int(steps)}
    c.images.generate(**kw, extra_body=extra)   # warm-up: the prompt into the cache
    runs = {"unstreamed": [], "stream 0 partials": [], "stream 3 partials": []}
    first, gaps = [], []
    for _ in range(int(repeats)):
        t0 = time.monotonic()
        c.images.generate(**kw, extra_body=extra)
        runs["unstreamed"].append(time.monotonic() - t0)
        t0 = time.monotonic()
        list(c.images.generate(**kw, stream=True, partial_images=0, extra_body=extra))
        runs["stream 0 partials"].append(time.monotonic() - t0)
        t0 = time.monotonic()
        times = []
        for e in c.images.generate(**kw, stream=True, partial_images=3, extra_body=extra):
            times.append((e.type, time.monotonic() - t0))
        runs["stream 3 partials"].append(times[-1][1])
        first.append(times[0][1])
        gaps.append([round(b[1] - a[1], 2) for a, b in zip(times, times[1:])])
    for k, v in runs.items():
        print(f"{k:20s} median {statistics.median(v):8.2f} s   runs {[round(x, 2) for x in v]}")
    print(f"first partial        median {statistics.median(first):8.2f} s   runs {[round(x, 2) for x in first]}")
    print(f"between events (3 partials): {gaps}")
    base = statistics.median(runs["stream 0 partials"])
    print(f"overhead of 3 partials: {statistics.median(runs['stream 3 partials']) - base:+.2f} s "
          f"({(statistics.median(runs['stream 3 partials']) / base - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main(*sys.argv[1:])
