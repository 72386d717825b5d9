#!/usr/bin/env python3
"""An independent numpy port of ggml's imatrix-less K-quant and IQ4 quantisers, and reference GGUFs for
`tpgen quantize --type Q2_K|Q3_K|Q4_K|Q5_K|Q6_K|IQ4_NL|IQ4_XS` (tests/sh/quantize.sh).

    /work/venv-flux3/bin/python tests/tools/kquant_ref.py tests/data/quant

Versions: numpy 2.4.6, gguf-py 0.19.0 (its GGUFWriter, the F32/F16 quantisers and the reference
dequantisers; gguf-py 0.19.0 has no quantiser for any of these seven types), safetensors (venv-flux3).
Written from reading ggml-org/ggml src/ggml-quants.c (commit d99724f2): quantize_row_q2_K_ref,
quantize_row_q3_K_ref, quantize_row_q4_K_ref, quantize_row_q5_K_ref, quantize_row_q6_K_ref, make_qkx2_quants
(use_mad for Q2_K), make_q3_quants (do_rmse), make_qx_quants with rmse_type 1 and no weights, nearest_int,
get_scale_min_k4; for IQ4_NL / IQ4_XS quantize_iq4_nl / quantize_iq4_xs with no imatrix, which is what
ggml_quantize_chunk (llama-quantize) runs: quantize_row_iq4_nl_impl with ntry 7, weights x^2,
best_index_int8 into kvalues_iq4nl (quantize_row_iq4_nl_ref differs: ntry -1, no scale search, and an
all-zero block keeps the previous block's indices). tpgen's C (core/formats/gguf_quantize.c) is a separate
implementation. ggml computes in float, left to right: here every step is a float32 numpy operation in the
same order, vectorised over blocks / sub-blocks (axis 0), the sums accumulated element by element (never
np.sum, which sums pairwise), nearest_int done as ggml does it (x + 1.5 * 2**23 in float32, the low
mantissa bits), f16 by numpy's round-to-nearest-even, best_index_int8 by np.searchsorted.

First checks every type's round trip through gguf-py's dequantiser (roundtrip(): all-zero rows come back
zero, 64 gaussian rows within 35% of RT_GAUSS per row and 5% in the median, the other inputs within 2.5x
it), so a port that is wrong but agrees with the C cannot pass. Then reads input.safetensors (made by
tests/tools/quant_testdata.py; a.weight [16, 256] is the K-quant tensor: 16 super-blocks of varied scale
with zero, constant, tie, tiny, huge, outlier and all-negative sub-blocks; e.weight [4, 8, 64] is IQ4_NL
too; the others stay F32/F16 by the type rules) and writes ref-T.gguf for the seven types with the layout
of quant_testdata.py. Then writes kquant-input.safetensors, one F16 tensor k.weight [16, 512] (seed 8; 32
super-blocks: gaussian rows of scale 2^-12..2^6, cubed gaussian, positive-only, laplace, uniform, sparse
with exact zeros, a row of small integers) and ref-kq-T.gguf, the f16 values widened to f32 (exactly, as
tpgen reads them) and quantised by this port; then hard-input.safetensors, h.weight [16, 256] f32
(hard_input(): all zero, constants, outliers, f16-subnormal scales, values under ggml's 1e-15 zero
threshold, large, negative/positive only, integer and half-integer ties, a different scale per sub-block,
sparse, alternate all-zero sub-blocks, kvalues_iq4nl midpoints under a first IQ4 scale of exactly 1) and
ref-hard-T.gguf.

Also checked once (not part of the suite; ggml's code is not in this repository): ggml-quants.c of
ggml-org/ggml d99724f2 compiled with gcc -O2 -ffp-contract=off gives the same bytes as this port and as
tpgen for all seven types on these three inputs and on 4096 random super-blocks of seven distributions.
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


def qkx2(x, w, nmax, rmin, rdelta, nstep, mad=False):
    """make_qkx2_quants for rows x [m, n] with weights w: (scale [m], -min [m], L [m, n]); the error is
    w * d^2, or w * |d| with mad (use_mad)"""
    def cost(d):
        return np.abs(d) if mad else d * d

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
    best = acc(w * cost(d))
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
        err = acc(w * cost(d))
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


def pack2(L):
    """[nb, 256] levels 0..3 -> [nb, 64]: byte l of quarter-group h holds values 128h + l + 32k at bits 2k"""
    nb = L.shape[0]
    Lr = L.reshape(nb, 2, 4, 32).astype(np.int64)
    q = Lr[:, :, 0] | Lr[:, :, 1] << 2 | Lr[:, :, 2] << 4 | Lr[:, :, 3] << 6
    return q.reshape(nb, 64).astype(np.uint8)


def q2_k(x):
    """quantize_row_q2_K_ref: 16 sub-blocks of 16, make_qkx2_quants(nmax 3, w |x|, rmin -0.5, rdelta 0.1,
    nstep 15, use_mad), 4-bit scales and mins of max / 15"""
    nb = x.shape[0]
    xs = x.reshape(nb * 16, 16)
    sc, mn, L = qkx2(xs, np.abs(xs), 3, -0.5, 0.1, 15, mad=True)
    sc, mn, L = sc.reshape(nb, 16), mn.reshape(nb, 16), L.reshape(nb, 256)
    ms = np.zeros(nb, F)
    mm = np.zeros(nb, F)
    for j in range(16):
        ms = np.where(sc[:, j] > ms, sc[:, j], ms)
        mm = np.where(mn[:, j] > mm, mn[:, j], mm)
    hs, hm = ms > 0, mm > 0
    ls = np.where(hs[:, None], nint((F(15) / np.where(hs, ms, F(1)))[:, None] * sc), 0) & 0xFF
    lm = np.where(hm[:, None], nint((F(15) / np.where(hm, mm, F(1)))[:, None] * mn), 0)
    s = (ls | (lm << 4)) & 0xFF
    hd = np.where(hs, f16(ms / F(15)), np.float16(0))
    hmn = np.where(hm, f16(mm / F(15)), np.float16(0))
    d = hd.astype(F)[:, None] * (s & 15).astype(F)
    dm = hmn.astype(F)[:, None] * (s >> 4).astype(F)
    nz = d != 0
    q = np.clip(nint((x.reshape(nb, 16, 16) + dm[:, :, None]) / np.where(nz, d, F(1))[:, :, None]), 0, 3)
    L = np.where(nz[:, :, None], q, L.reshape(nb, 16, 16)).reshape(nb, 256)
    return np.concatenate([s.astype(np.uint8), pack2(L), hd.view(np.uint8).reshape(nb, 2),
                           hmn.view(np.uint8).reshape(nb, 2)], axis=1)


def q3(x, nmax):
    """make_q3_quants(do_rmse) for rows x [m, n]: (scale [m], L [m, n] in 0..2 nmax - 1, 0 for an all-zero
    row). The level moves are sequential within a row; a pass that changes nothing leaves the state as it
    was, so running all 5 passes equals ggml's early break."""
    m, n = x.shape
    am = np.abs(x).max(axis=1)
    mx = x[np.arange(m), np.argmax(np.abs(x), axis=1)]      # the first of largest magnitude
    zero = am < F(1e-15)
    isc = F(-nmax) / np.where(zero, F(1), mx)
    l = np.clip(nint(isc[:, None] * x), -nmax, nmax - 1)
    w = x * x
    lf = l.astype(F)
    slx = acc(w * x * lf)
    sl2 = acc(w * lf * lf)
    for _ in range(5):
        for i in range(n):
            wi, xi, li = w[:, i], x[:, i], l[:, i].astype(F)
            a = slx - wi * xi * li
            pos = a > 0
            b = sl2 - wi * li * li
            nl = np.clip(nint(xi * b / np.where(pos, a, F(1))), -nmax, nmax - 1)
            nf = nl.astype(F)
            a2 = a + wi * xi * nf
            b2 = b + wi * nf * nf
            take = pos & (nl != l[:, i]) & (b2 > 0) & (a2 * a2 * sl2 > slx * slx * b2)
            l[:, i] = np.where(take, nl, l[:, i])
            slx = np.where(take, a2, slx)
            sl2 = np.where(take, b2, sl2)
    scale = np.where(sl2 > 0, slx / np.where(sl2 > 0, sl2, F(1)), F(0))
    return np.where(zero, F(0), scale), np.where(zero[:, None], 0, l + nmax)


def q3_k(x):
    """quantize_row_q3_K_ref: 16 sub-blocks of 16 by make_q3_quants(nmax 4), 6-bit signed scales of
    -max / 32 (max the scale of largest magnitude), levels -4..3 from the f16 super-scale"""
    nb = x.shape[0]
    sc, L = q3(x.reshape(nb * 16, 16), 4)
    sc, L = sc.reshape(nb, 16), L.reshape(nb, 16, 16)
    ms = np.where(np.abs(sc).max(axis=1) > 0, sc[np.arange(nb), np.argmax(np.abs(sc), axis=1)], F(0))
    has = ms != 0
    isc = F(-32) / np.where(has, ms, F(1))
    q6 = np.where(has[:, None], np.clip(nint(isc[:, None] * sc), -32, 31) + 32, 0)   # stored 6-bit values
    hd = np.where(has, f16(F(1) / isc), np.float16(0))
    lo = q6 & 15
    s = np.zeros((nb, 12), np.int64)
    s[:, 0:8] = lo[:, 0:8] | lo[:, 8:16] << 4
    for g in range(4):                                       # scales 4g..4g+3: bits 2g of bytes 8..11
        s[:, 8:12] |= (q6[:, 4 * g:4 * g + 4] >> 4) << (2 * g)
    v = np.where(has[:, None], q6 - 32, 0)                   # all-zero: no scale bytes set, decoded 0
    d = hd.astype(F)[:, None] * v.astype(F)
    nz = d != 0
    q = np.clip(nint(x.reshape(nb, 16, 16) / np.where(nz, d, F(1))[:, :, None]), -4, 3) + 4
    L = np.where(nz[:, :, None], q, L).reshape(nb, 256)
    hm = np.zeros((nb, 32), np.int64)
    for k in range(8):
        hm |= (L[:, 32 * k:32 * k + 32] >> 2 & 1) << k
    return np.concatenate([hm.astype(np.uint8), pack2(L & 3), s.astype(np.uint8),
                           hd.view(np.uint8).reshape(nb, 2)], axis=1)


KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F)


def iq4_index(v):
    """nearest kvalues_iq4nl index of float32 v, a tie to the upper value (ggml best_index_int8)"""
    hi = np.clip(np.searchsorted(KV, v, side="right"), 1, 15)
    lo = hi - 1
    i = np.where(v - KV[lo] < KV[hi] - v, lo, hi)
    return np.where(v <= KV[0], 0, np.where(v >= KV[15], 15, i))


def iq4_scale(x):
    """the 32-value sub-block scales of quantize_row_iq4_nl_impl (no imatrix, ntry 7) for rows x [m, 32]"""
    m = x.shape[0]
    am = np.abs(x).max(axis=1)
    mx = x[np.arange(m), np.argmax(np.abs(x), axis=1)]
    zero = am < F(1e-15)
    mxs = np.where(zero, F(1), mx)
    w = x * x

    def sums(idv):
        q = KV[iq4_index(idv[:, None] * x)]
        return acc(w * q * x), acc(w * q * q)

    sqx, sq2 = sums(F(1) / (-mxs / KV[0]))
    d = np.where(sq2 > 0, sqx / np.where(sq2 > 0, sq2, F(1)), F(0))
    best = d * sqx
    for t in range(-7, 8):
        sqx, sq2 = sums(F(t - 127) / mxs)
        take = (sq2 > 0) & (sqx * sqx > best * sq2)
        d = np.where(take, sqx / np.where(take, sq2, F(1)), d)
        best = np.where(take, d * sqx, best)
    return np.where(zero, F(0), d)


def iq4_pack(L):
    """[r, 32] indices -> [r, 16]: j low nibble, j + 16 high"""
    return (L[:, :16] | L[:, 16:] << 4).astype(np.uint8)


def iq4_nl(x):
    """quantize_iq4_nl without an imatrix: d = the sub-block scale as f16, the indices for the f32 d"""
    xb = x.reshape(-1, 32)
    d = iq4_scale(xb)
    idv = np.where(d != 0, F(1) / np.where(d != 0, d, F(1)), F(0))
    L = iq4_index(idv[:, None] * xb)
    return np.concatenate([f16(d).view(np.uint8).reshape(-1, 2), iq4_pack(L)], axis=1).reshape(x.shape[0], -1)


def iq4_xs(x):
    """quantize_iq4_xs without an imatrix: 8 sub-block scales as 6-bit multiples (+32) of d = -max / 32,
    the indices for the f32 d * l"""
    nb = x.shape[0]
    xb = x.reshape(nb, 8, 32)
    sc = iq4_scale(xb.reshape(nb * 8, 32)).reshape(nb, 8)
    ms = np.where(np.abs(sc).max(axis=1) > 0, sc[np.arange(nb), np.argmax(np.abs(sc), axis=1)], F(0))
    d = -ms / F(32)
    idv = np.where(d != 0, F(1) / np.where(d != 0, d, F(1)), F(0))
    l = np.clip(nint(idv[:, None] * sc), -32, 31)
    dl = d[:, None] * l.astype(F)
    idl = np.where(dl != 0, F(1) / np.where(dl != 0, dl, F(1)), F(0))
    L = iq4_index(idl[:, :, None] * xb)
    u = l + 32
    sh = np.zeros(nb, np.int64)
    for b in range(8):
        sh |= (u[:, b] >> 4) << (2 * b)
    sl = (u[:, 0::2] & 15) | (u[:, 1::2] & 15) << 4
    return np.concatenate([f16(d).view(np.uint8).reshape(nb, 2), sh.astype("<u2").view(np.uint8).reshape(nb, 2),
                           sl.astype(np.uint8), iq4_pack(L.reshape(nb * 8, 32)).reshape(nb, 128)], axis=1)


QUANT = {"Q2_K": (q2_k, 84, 256), "Q3_K": (q3_k, 110, 256), "Q4_K": (q4_k, 144, 256), "Q5_K": (q5_k, 176, 256),
         "Q6_K": (q6_k, 210, 256), "IQ4_NL": (iq4_nl, 18, 32), "IQ4_XS": (iq4_xs, 136, 256)}


def quantize_k(x, tn):
    """x [..., ne0] float32 with ne0 a multiple of the block -> uint8 [..., ne0 / block * bytes]"""
    fn, nbytes, bs = QUANT[tn]
    blocks = np.ascontiguousarray(x, F).reshape(-1, bs)
    return fn(blocks).reshape(*x.shape[:-1], x.shape[-1] // bs * nbytes)


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


def hard_input():
    """16 super-blocks (f32, seed 9), one hard case each"""
    rng = np.random.default_rng(9)
    g = rng.standard_normal((14, 256))
    x = np.zeros((16, 256))
    x[1] = 0.75                                          # constant
    x[2] = -3.0                                          # negative constant
    x[3] = g[3] * 1e-3
    x[3, 5] = 50.0                                       # one outlier
    x[3, 200] = -20.0
    x[4] = g[4] * 1e-6                                   # f16-subnormal super-scales
    x[5] = g[5] * 1e-16                                  # below ggml's 1e-15 all-zero threshold
    x[5, 128:] = g[5, 128:]                              # ... in half the sub-blocks only
    x[6] = g[6] * 1e4                                    # large, f16 scales still finite
    x[7] = -rng.uniform(1, 2, 256)                       # negative only
    x[8] = rng.uniform(1, 2, 256)                        # positive only
    x[9] = np.arange(256) % 16 - 8                       # integer levels: ties
    x[10] = (np.arange(256) % 8 - 3.5) * 0.25            # exact halves
    x[11] = g[11] * np.exp2(np.repeat(np.arange(16) - 8, 16))   # every sub-block a different scale
    x[12] = g[12] * (rng.uniform(size=256) < 0.05)       # sparse, mostly exact zeros
    x[13] = g[13] * np.repeat(np.arange(16) % 2, 16)     # every other 16-sub-block all zero
    mids = (KV[1:] + KV[:-1]) / 2                        # IQ4 ties: kvalues_iq4nl midpoints with the
    x[14:] = rng.choice(np.concatenate([mids, KV, KV]), (2, 256))     # first trial scale exactly 1
    x[14, ::32] = 127
    x[15, ::32] = -127
    return x.astype(F)


# the relative RMS error ||dequant - x|| / ||x|| of one super-block row of gaussian values, per type
# (measured on 64 rows of seed 1, numpy 2.4.6: the median of each), and the bound checked per row
RT_GAUSS = {"Q2_K": 0.295, "Q3_K": 0.149, "Q4_K": 0.071, "Q5_K": 0.036, "Q6_K": 0.0176, "IQ4_NL": 0.076,
            "IQ4_XS": 0.076}


def roundtrip(tn, x, q, gauss=False):
    """dequantise q with gguf-py's reference dequantiser and check the error: rows all zero come back
    zero; gaussian rows within 35% of RT_GAUSS (their median within 5%); others within 2.5x it where the f16 super-block scales
    are normal numbers (max |x| in [1e-2, 6e4]: below, Q3_K's d = max scale / 32 underflows f16 and the
    row is legitimately zero; above, scales overflow to inf). Returns the per-row relative RMS errors."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    d = dequantize(q, Q[tn]).reshape(x.shape).astype(np.float64)
    nx = np.sqrt((x * x).sum(1))
    e = np.sqrt(((np.nan_to_num(d) - x) ** 2).sum(1)) / np.where(nx > 0, nx, 1)
    zero = nx == 0
    assert (d[zero] == 0).all(), "%s: an all-zero row does not come back zero" % tn
    amax = np.abs(x).max(1)
    fin = np.isfinite(d).all(1) & (amax >= 1e-2) & (amax <= 6e4)
    ok = np.abs(e - RT_GAUSS[tn]) <= 0.35 * RT_GAUSS[tn] if gauss else e <= 2.5 * RT_GAUSS[tn]
    assert not gauss or abs(np.median(e) - RT_GAUSS[tn]) <= 0.05 * RT_GAUSS[tn], "%s: median %g" % (tn, np.median(e))
    bad = ~zero & fin & ~ok
    assert not bad.any(), "%s: round-trip error %s in rows %s" % (tn, e[bad], np.nonzero(bad)[0])
    return np.where(fin, e, np.nan)


def main_hard(out):
    """hard-input.safetensors (h.weight [16, 256] f32, hard_input()) and ref-hard-T.gguf for every T"""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from safetensors.numpy import save_file
    x = hard_input()
    save_file({"h.weight": x}, os.path.join(out, "hard-input.safetensors"))
    for tn in QUANT:
        w = gguf.GGUFWriter(os.path.join(out, "ref-hard-%s.gguf" % tn), "flux")
        q = quantize_k(x, tn)
        w.add_tensor("h.weight", q, raw_shape=q.shape, raw_dtype=Q[tn])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def check_roundtrips():
    """every type on 64 gaussian rows (seed 1), kq_input() and hard_input(), dequantised by gguf-py"""
    g = np.random.default_rng(1).standard_normal((64, 256)).astype(F)
    for tn in QUANT:
        eg = roundtrip(tn, g, quantize_k(g, tn), gauss=True)
        xk = kq_input().astype(F)
        ek = roundtrip(tn, xk, quantize_k(xk, tn))
        xh = hard_input()
        eh = roundtrip(tn, xh, quantize_k(xh, tn))
        print("%-6s round trip (rel RMS): gaussian median %.4f max %.4f; kq max %.4f; hard max %.4f" %
              (tn, np.median(eg), eg.max(), np.nanmax(ek), np.nanmax(eh)))


if __name__ == "__main__":
    np.seterr(all="ignore")
    check_roundtrips()
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant")
    main_kq(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant")
    main_hard(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant")
