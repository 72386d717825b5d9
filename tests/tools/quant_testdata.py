#!/usr/bin/env python3
"""Reference GGUFs for `tpgen quantize` (tests/sh/quantize.sh), made with gguf-py's quantisers.

    /work/venv-flux3/bin/python tests/tools/quant_testdata.py tests/data/quant

Versions: gguf-py 0.19.0, numpy 2.4.6, safetensors 0.x (venv-flux3). Writes:
  input.safetensors   five f32 tensors (seed 23): a.weight [16, 256] (random rows of varied scale, and
                      special blocks: all zero, constant, exact .5 ties for Q8_0 and Q4_0/Q5_0, an f16-
                      subnormal scale, an f16-overflowing scale, single outliers), b.weight [12, 100] (rows
                      not whole 32-blocks: F16), c.bias [512] (1-D: F32), d.weight [8, 128] (1024 values:
                      F32), e.weight [4, 8, 64] (3-D).
  ref-T.gguf          for T in F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1: GGUFWriter(arch "flux"), tensors in
                      name order, each typed by the ComfyUI-GGUF rules (1-D or <= 1024 values F32; rows not
                      whole blocks F16; else T) and quantised by gguf.quants.quantize.
The writer's layout is tpgen's gguf_write layout, so tpgen's output must equal each file byte for byte.
"""
import sys, os
import numpy as np
from safetensors.numpy import save_file
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def inputs():
    rng = np.random.default_rng(23)
    a = (rng.standard_normal((16, 256)) * np.exp(rng.uniform(-6, 3, (16, 1)))).astype(np.float32)
    a[0, 0:32] = 0                                   # d == 0
    a[0, 32:64] = 0.75                               # constant block
    t = np.arange(32, dtype=np.float32) - 15.5       # ties: amax 127 -> d 1 for Q8_0
    a[0, 64:96] = t
    a[0, 64] = 127
    t4 = (np.arange(32, dtype=np.float32) % 16 - 7.5) # Q4_0: max -8 -> d 1, x + 8.5 integral
    t4[0] = -8
    a[0, 96:128] = t4
    a[0, 128:160] = rng.standard_normal(32).astype(np.float32) * 1e-6   # f16-subnormal scale
    a[0, 160:192] = rng.standard_normal(32).astype(np.float32) * 3e7    # scale overflows f16
    a[0, 192:224] = rng.standard_normal(32).astype(np.float32) * 1e-3
    a[0, 200] = 50.0                                  # one outlier
    a[0, 224:256] = -rng.uniform(1, 2, 32).astype(np.float32)           # all negative (Q4_1 min)
    return {
        "a.weight": a,
        "b.weight": rng.standard_normal((12, 100)).astype(np.float32),
        "c.bias": rng.standard_normal(512).astype(np.float32),
        "d.weight": rng.standard_normal((8, 128)).astype(np.float32),
        "e.weight": (rng.standard_normal((4, 8, 64)) * 0.02).astype(np.float32),
    }


def pick(name, x):
    qt = Q[name]
    if x.ndim <= 1 or x.size <= 1024:
        return Q.F32
    bs = gguf.GGML_QUANT_SIZES[qt][0]
    return Q.F16 if x.shape[-1] % bs else qt


def main(out):
    os.makedirs(out, exist_ok=True)
    ts = inputs()
    save_file(ts, os.path.join(out, "input.safetensors"))
    for tn in TYPES:
        path = os.path.join(out, "ref-%s.gguf" % tn)
        w = gguf.GGUFWriter(path, "flux")
        for name in sorted(ts):
            x = ts[name]
            qt = pick(tn, x)
            q = quantize(x, qt)
            if qt in (Q.F32, Q.F16):
                w.add_tensor(name, q)
            else:
                w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant")
