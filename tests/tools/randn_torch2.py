#!/usr/bin/env python3
"""torch 2.x's CPU normal draws for tests/test_rng.c and tests/sh/rng.sh
(test-only generator; run it with the torch whose draws are wanted):

  python randn_torch2.py OUT.safetensors

Writes `seedS.SHAPE.bf16` (every seed and shape below) and `seedS.SHAPE.f32`
(the first four seeds): torch.randn(shape,
generator=torch.Generator().manual_seed(S), dtype) on the CPU, and records
torch's version and CPU capability in the metadata. The shapes are the
sampler's classes (under 16 values, exactly 16, a tail after whole blocks of
16, large with and without a tail) and the pipeline noise [1, 32, H/16, W/16]
of six image sizes (in_channels 32 of the tiny test models). Large draws are
kept as digests only: metadata `sha256.seedS.SHAPE.DT` is the sha256 of the
draw's raw little-endian bytes (FLUX.2's real noise [1, 128, 64, 64] of a
1024x1024 image and [1, 128, 96, 80], and a large size with a tail). The repository's
copy (tests/data/golden/randn-torch2.safetensors.xz) was made with torch
2.15.0 from PyPI on an AVX512 CPU; xz -9 compresses it."""
import hashlib
import sys
import torch
from safetensors.torch import save_file

SEEDS = [0, 1, 42, 2**32 + 1, 2**64 - 1, 7]   # 7: a seed of the klein-tiny golden cases
F32_SEEDS = SEEDS[:4]
SHAPES = [(7,), (15,), (16,), (17,), (2, 16, 3), (1, 3, 5, 5), (1, 128, 4, 4), (4097,),
          (1, 32, 1, 1), (1, 32, 2, 3), (1, 32, 4, 4), (1, 32, 4, 6), (1, 32, 6, 4), (1, 32, 8, 8)]

LARGE = [(1, 128, 64, 64), (1, 128, 96, 80), (1, 3, 333, 333)]
LARGE_SEEDS = [0, 42, 2**32 + 1]

def name(seed, shape, dt):
    return f"seed{seed}.{'x'.join(map(str, shape))}.{dt}"

def main(out):
    t = {}
    for s in SEEDS:
        for shape in SHAPES:
            g = torch.Generator().manual_seed(s)
            t[name(s, shape, 'bf16')] = torch.randn(shape, generator=g, dtype=torch.bfloat16)
            if s in F32_SEEDS:
                g = torch.Generator().manual_seed(s)
                t[name(s, shape, 'f32')] = torch.randn(shape, generator=g, dtype=torch.float32)
    meta = {'torch': torch.__version__, 'cpu_capability': torch.backends.cpu.get_cpu_capability(),
            'made_by': 'tests/tools/randn_torch2.py'}
    for s in LARGE_SEEDS:
        for shape in LARGE:
            for dt, tdt, view in (('bf16', torch.bfloat16, torch.int16), ('f32', torch.float32, torch.int32)):
                x = torch.randn(shape, generator=torch.Generator().manual_seed(s), dtype=tdt)
                raw = x.contiguous().view(view).numpy().tobytes()
                meta['sha256.' + name(s, shape, dt)] = hashlib.sha256(raw).hexdigest()
    save_file(t, out, metadata=meta)
    print(f"{out}: {len(t)} tensors, torch {meta['torch']}, {meta['cpu_capability']}")

if __name__ == '__main__':
    main(sys.argv[1])
