#!/usr/bin/env python3
"""An independent numpy port of ggml's imatrix-less K-quant reference quantisers, and reference GGUFs
for `tpgen quantize --type Q4_K|Q5_K|Q6_K` (tests/sh/quantize.sh).

    /work/venv-flux3/bin/python tests/tools/kquant_ref.py tests/data/quant

Versions: numpy 2.4.6, gguf-py 0.19.0 (only its GGUFWriter and the F32/F16 quantisers; gguf-py 0.19.0 has
no K-quant quantiser), safetensors (venv-flux3). Written from reading ggml-org/llama.cpp
ggml/src/ggml-quants.c (quantize_row_q4_K_ref, quantize_row_q5_K_ref, quantize_row_q6_K_ref,
make_qkx2_quants, make_qx_quants with rmse_type 1 and no weights, nearest_int, get_scale_min_k4); tpgen's
C (core/formats/gguf_quantize.c) is a separate implementation. ggml computes in float, left to right:
here every step is a float32 numpy operation in the same order, vectorised over sub-blocks (axis 0), the
sums accumulated element by element (never np.sum, which sums pairwise), nearest_int done as ggml does it
(x + 1.5 * 2**23 in float32, the low mantissa bits), f16 by numpy's round-to-nearest-even.

Reads input.safetensors (made by tests/tools/quant_testdata.py; a.weight [16, 256] is the K-quant tensor:
16 super-blocks of varied scale with zero, constant, tie, tiny, huge, outlier and all-negative sub-blocks;
the others stay F32/F16 by the type rules) and writes ref-Q4_K.gguf, ref-Q5_K.gguf, ref-Q6_K.gguf with the
layout of quant_testdata.py. Then writes kquant-input.safetensors, one F16 tensor k.weight [16, 512]
(seed 8; 32 super-blocks: gaussian rows of scale 2^-12..2^6, cubed gaussian, positive-only, laplace,
uniform, sparse with exact zeros, a row of small integers) and ref-kq-T.gguf for T in Q4_K Q5_K Q6_K,
the f16 values widened to f32 (exactly, as tpgen reads them) and quantised by this port.
"""
import os
import sys

import numpy as np

F = np.float32


def nint(v):
    """ggml nearest_int on a float32 array: round to nearest even via the 1.5 * 2^23 trick"""
    t = (np.asarray(v, F) + F(12582912.0)).view(np.int32)
    return (t & 0x007FFFFF) - 0x00400000


def f16(v):
    return np.asarray(v, F).astype(np.float16)


def acc(terms):
    """sequential float32 sum over the last axis: ((t0 + t1) + t2) + ..."""
    s = terms[..., 0].copy()
    for i in range(1, terms.shape[-1]):
        s = s + terms[..., i]
    return s


def qkx2(x, w, nmax, rmin, rdelta, nstep):
    """make_qkx2_quants for rows x [m, n] with weights w: (scale [m], -min [m], L [m, n])"""
    m, n = x.shape
    lo = x[:, 0].copy()
    hi = x[:, 0].copy()
    for i in range(1, n):
        lo = np.where(x[:, i] < lo, x[:, i], lo)
        hi = np.where(x[:, i] > hi, x[:, i], hi)
    sw = acc(w)
    sx = acc(w * x)
    lo = np.where(lo > 0, F(0), lo)
    flat = hi == lo
    rng = np.where(flat, F(1), hi - lo)                      # no division by zero where flat
    isc = F(nmax) / rng
    scale = F(1) / isc
    L = np.clip(nint(isc[:, None] * (x - lo[:, None])), 0, nmax)
    d = scale[:, None] * L.astype(F) + lo[:, None] - x
    best = acc(w * (d * d))
    for s in range(nstep + 1):
        rng = np.where(flat, F(1), hi - lo)
        isc = (F(rmin) + F(rdelta) * F(s) + F(nmax)) / rng
        La = np.clip(nint(isc[:, None] * (x - lo[:, None])), 0, nmax)
        lf = La.astype(F)
        sl = acc(w * lf)
        sl2 = acc(w * lf * lf)
        sxl = acc(w * lf * x)
        D = sw * sl2 - sl * sl
        ok = D > 0
        Ds = np.where(ok, D, F(1))
        ts = (sw * sxl - sx * sl) / Ds
        tm = (sl2 * sx - sl * sxl) / Ds
        pos = tm > 0
        ts = np.where(pos, sxl / np.where(sl2 == 0, F(1), sl2), ts)
        tm = np.where(pos, F(0), tm)
        d = ts[:, None] * lf + tm[:, None] - x
        err = acc(w * (d * d))
        take = ok & (err < best) & ~flat
        L = np.where(take[:, None], La, L)
        best = np.where(take, err, best)
        scale = np.where(take, ts, scale)
        lo = np.where(take, tm, lo)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, F(0), scale)
    return scale, -lo, L


def k_scales(x, nmax, rmin, nstep):
    """the shared part of Q4_K/Q5_K for super-blocks x [nb, 256]: (d f16, dmin f16, scales [nb, 12] u8, L)"""
    nb = x.shape[0]
    xs = x.reshape(nb * 8, 32)
    av = np.sqrt(acc(xs * xs) / F(32))
    w = av[:, None] + np.abs(xs)
    sc, mn, L = qkx2(xs, w, nmax, rmin, F(0.1), nstep)
    sc, mn, L = sc.reshape(nb, 8), mn.reshape(nb, 8), L.reshape(nb, 256)
    ms = np.zeros(nb, F)
    mm = np.zeros(nb, F)
    for j in range(8):                                       # the running max, as ggml takes it
        ms = np.where(sc[:, j] > ms, sc[:, j], ms)
        mm = np.where(mn[:, j] > mm, mn[:, j], mm)
    iS = np.where(ms > 0, F(63) / np.where(ms > 0, ms, F(1)), F(0))
    iM = np.where(mm > 0, F(63) / np.where(mm > 0, mm, F(1)), F(0))
    ls = np.minimum(nint(iS[:, None] * sc) & 0xFF, 63)
    lm = np.minimum(nint(iM[:, None] * mn) & 0xFF, 63)
    s = np.zeros((nb, 12), np.int64)
    s[:, 0:4] = ls[:, 0:4] | (ls[:, 4:8] >> 4) << 6
    s[:, 4:8] = lm[:, 0:4] | (lm[:, 4:8] >> 4) << 6
    s[:, 8:12] = (ls[:, 4:8] & 15) | (lm[:, 4:8] & 15) << 4
    hd, hm = f16(ms / F(63)), f16(mm / F(63))
    d = hd.astype(F)[:, None] * ls.astype(F)                 # [nb, 8]
    dm = hm.astype(F)[:, None] * lm.astype(F)
    nz = d != 0
    dd = np.where(nz, d, F(1))
    q = np.clip(nint((x.reshape(nb, 8, 32) + dm[:, :, None]) / dd[:, :, None]), 0, nmax).reshape(nb, 256)
    L = np.where(np.repeat(nz, 32, axis=1), q, L)
    return hd, hm, s.astype(np.uint8), L


def q4_k(x):
    hd, hm, s, L = k_scales(x, 15, -1.0, 20)
    nb = x.shape[0]
    Lr = L.reshape(nb, 4, 2, 32)
    qs = (Lr[:, :, 0] | Lr[:, :, 1] << 4).reshape(nb, 128).astype(np.uint8)
    return np.concatenate([hd.view(np.uint8).reshape(nb, 2), hm.view(np.uint8).reshape(nb, 2), s, qs], axis=1)


def q5_k(x):
    hd, hm, s, L = k_scales(x, 31, -0.5, 15)
    nb = x.shape[0]
    Lr = L.reshape(nb, 4, 2, 32)
    qh = np.zeros((nb, 32), np.int64)
    for k in range(4):
        qh |= (Lr[:, k, 0] >> 4) << (2 * k)
        qh |= (Lr[:, k, 1] >> 4) << (2 * k + 1)
    qs = ((Lr[:, :, 0] & 15) | (Lr[:, :, 1] & 15) << 4).reshape(nb, 128)
    return np.concatenate([hd.view(np.uint8).reshape(nb, 2), hm.view(np.uint8).reshape(nb, 2), s,
                           qh.astype(np.uint8), qs.astype(np.uint8)], axis=1)


def qx1(x, nmax):
    """make_qx_quants(n, nmax, x, L, rmse_type 1, no weights) for rows x [m, n]: (scale [m], L [m, n] + nmax)"""
    m, n = x.shape
    mx = np.zeros(m, F)
    am = np.zeros(m, F)
    for i in range(n):
        a = np.abs(x[:, i])
        gt = a > am
        am = np.where(gt, a, am)
        mx = np.where(gt, x[:, i], mx)
    zero = am < F(1e-15)
    mxs = np.where(zero, F(1), mx)
    w = x * x

    def levels(isc):
        return np.clip(nint(isc[:, None] * x), -nmax, nmax - 1)

    l = levels(F(-nmax) / mxs)
    L = l + nmax
    lf = l.astype(F)
    slx = acc(w * x * lf)
    sl2 = acc(w * lf * lf)
    scale = np.where(sl2 != 0, slx / np.where(sl2 != 0, sl2, F(1)), F(0))
    best = scale * slx
    for s in range(-9, 10):
        if s == 0:
            continue
        isc = -(F(nmax) + F(0.1) * F(s)) / mxs
        l = levels(isc)
        lf = l.astype(F)
        slx = acc(w * x * lf)
        sl2 = acc(w * lf * lf)
        take = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(take[:, None], l + nmax, L)
        scale = np.where(take, slx / np.where(take, sl2, F(1)), scale)
        best = np.where(take, scale * slx, best)
    L = np.where(zero[:, None], 0, L)
    scale = np.where(zero, F(0), scale)
    return scale, L


def q6_k(x):
    nb = x.shape[0]
    sc, L = qx1(x.reshape(nb * 16, 16), 32)
    sc, L = sc.reshape(nb, 16), L.reshape(nb, 256)
    ms = np.zeros(nb, F)
    mas = np.zeros(nb, F)
    for b in range(16):
        a = np.abs(sc[:, b])
        gt = a > mas
        mas = np.where(gt, a, mas)
        ms = np.where(gt, sc[:, b], ms)
    zero = mas < F(1e-15)
    isc = F(-128) / np.where(zero, F(1), ms)
    hd = f16(F(1) / isc)
    s8 = np.minimum(127, nint(isc[:, None] * sc)).astype(np.int8)
    d = hd.astype(F)[:, None] * s8.astype(F)
    nz = d != 0
    dd = np.where(nz, d, F(1))
    q = (np.clip(nint(x.reshape(nb, 16, 16) / dd[:, :, None]), -32, 31) + 32).reshape(nb, 256)
    L = np.where(np.repeat(nz, 16, axis=1), q, L)
    Lr = L.reshape(nb, 2, 4, 32)                              # [half, quarter, l]
    ql = np.concatenate([Lr[:, :, 0] & 15 | (Lr[:, :, 2] & 15) << 4,
                         Lr[:, :, 1] & 15 | (Lr[:, :, 3] & 15) << 4], axis=2).reshape(nb, 128)
    qh = (Lr[:, :, 0] >> 4 | (Lr[:, :, 1] >> 4) << 2 | (Lr[:, :, 2] >> 4) << 4 | (Lr[:, :, 3] >> 4) << 6)
    out = np.concatenate([ql.astype(np.uint8), qh.reshape(nb, 64).astype(np.uint8), s8.view(np.uint8),
                          hd.view(np.uint8).reshape(nb, 2)], axis=1)
    out[zero] = 0
    return out


QUANT = {"Q4_K": (q4_k, 144), "Q5_K": (q5_k, 176), "Q6_K": (q6_k, 210)}


def quantize_k(x, tn):
    """x [..., ne0] float32 with ne0 % 256 == 0 -> uint8 [..., ne0 / 256 * bytes]"""
    fn, nbytes = QUANT[tn]
    blocks = np.ascontiguousarray(x, F).reshape(-1, 256)
    return fn(blocks).reshape(*x.shape[:-1], x.shape[-1] // 256 * nbytes)


def main(out):
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize
    from safetensors.numpy import load_file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from quant_testdata import pick
    ts = load_file(os.path.join(out, "input.safetensors"))
    np.seterr(all="ignore")    # a.weight has a block whose scale overflows f16 (inf, as in ggml)
    for tn in QUANT:
        path = os.path.join(out, "ref-%s.gguf" % tn)
        w = gguf.GGUFWriter(path, "flux")
        for name in sorted(ts):
            x = ts[name]
            qt = pick(tn, x)
            if qt in (Q.F32, Q.F16):
                w.add_tensor(name, quantize(x, qt))
            else:
                q = quantize_k(x, tn)
                w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def kq_input():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((16, 512)) * np.exp2(rng.uniform(-12, 6, (16, 1)))
    x[1::8] = rng.standard_normal((2, 512)) ** 3
    x[2::8] = np.abs(x[2::8])
    x[3::8] = rng.laplace(size=(2, 512)) * 0.05
    x[4::8] = rng.uniform(-1, 3, (2, 512))
    x[5::8] *= rng.uniform(size=(2, 512)) < 0.2
    x[6] = rng.integers(-8, 8, 512)
    return x.astype(np.float16)


def main_kq(out):
    import gguf
    from gguf import GGMLQuantizationType as Q
    from safetensors.numpy import save_file
    x = kq_input()
    save_file({"k.weight": x}, os.path.join(out, "kquant-input.safetensors"))
    for tn in QUANT:
        w = gguf.GGUFWriter(os.path.join(out, "ref-kq-%s.gguf" % tn), "flux")
        q = quantize_k(x.astype(F), tn)
        w.add_tensor("k.weight", q, raw_shape=q.shape, raw_dtype=Q[tn])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant")
    main_kq(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant")
