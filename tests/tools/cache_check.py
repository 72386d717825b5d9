#!/usr/bin/env python3
"""Compare a tpgen run with block caching against cache-dit's golden data
(tests/sh/cache.sh; standard library only):

  cache_check.py GOLDEN_DIR CONFIG METRICS.json LATENTS.safetensors [TOL [DIFF_TOL]]

GOLDEN_DIR: the flux2-cache set (manifest.json, golden.safetensors).
METRICS: tpgen's --json-metrics (cache_decisions[0]: the decision strings
and residual diffs per group and branch; absent for a run without --cache,
which must then match a configuration that never caches). LATENTS: the
--save-latents file with --save-step-latents (tensors `latents`,
`step_latents`).

Checks: the decision strings exactly; every residual diff within DIFF_TOL
(default 5e-5) relative, null exactly where the golden has NaN; the latents
after every step and the final latents within TOL (default 1e-5) of the
golden ones (max |a - b| over max |b|). The diff is the mean change of a
residual that moves by 1-3 % between steps, so the forward's own f32
rounding (~3e-7 of the latents) reaches it amplified ~30x: 1e-5 is met on
the CFG flow, up to 3.1e-5 is measured on the dev flow. Prints one summary line; exits 1 on a
mismatch, naming the first one."""
import json, math, struct, sys


def load_st(path):
    b = open(path, 'rb').read()
    n, = struct.unpack('<Q', b[:8])
    return json.loads(b[8:8 + n]), b[8 + n:]


def tensor(st, name):
    h, data = st
    t = h[name]
    s, e = t['data_offsets']
    fmt = {'F32': 'f', 'F64': 'd', 'I32': 'i'}[t['dtype']]
    size = struct.calcsize(fmt)
    return t['shape'], struct.unpack('<%d%s' % ((e - s) // size, fmt), data[s:e])


def rel_max(a, b):
    den = max(abs(x) for x in b) or 1.0
    return max(abs(x - y) for x, y in zip(a, b)) / den


def main(gdir, cfg, metrics, latents, tol=1e-5, diff_tol=5e-5):
    man = json.load(open(gdir + '/manifest.json'))
    conf = next((c for c in man['configs'] if c['name'] == cfg), None)
    if conf is None:
        sys.exit('%s: no configuration %s' % (gdir, cfg))
    m = json.load(open(metrics))
    jobs = m.get('cache_decisions')
    names = {'double/cond': 'double', 'single/cond': 'single', 'double/uncond': 'double_uncond',
             'single/uncond': 'single_uncond'}
    worst_diff = 0.0
    for key, want in conf['decisions'].items():
        got = jobs[0][names[key]] if jobs else 'C' * len(want)   # no --cache: every step computed
        if got != want:
            sys.exit('%s %s: decisions %s, cache-dit %s' % (cfg, key, got, want))
        gd = jobs[0]['residual_diffs'][names[key]] if jobs else [None] * len(want)
        for i, (a, b) in enumerate(zip(gd, conf['residual_diffs'][key])):
            if (a is None) != (b is None):
                sys.exit('%s %s step %d: residual diff %s, cache-dit %s' % (cfg, key, i, a, b))
            if a is not None:
                r = abs(a - b) / abs(b) if b else abs(a)
                worst_diff = max(worst_diff, r)
                if r > diff_tol:
                    sys.exit('%s %s step %d: residual diff %.9g, cache-dit %.9g (relative %.2g > %g)' %
                             (cfg, key, i, a, b, r, diff_tol))
    g = load_st(gdir + '/golden.safetensors')
    t = load_st(latents)
    gshape, gsteps = tensor(g, cfg + '.step_latents')
    tshape, tsteps = tensor(t, 'step_latents')
    n = len(gsteps) // gshape[0]
    if len(tsteps) != len(gsteps):
        sys.exit('%s: step_latents has %d values, cache-dit %d' % (cfg, len(tsteps), len(gsteps)))
    worst_step = 0.0
    for s in range(gshape[0]):
        r = rel_max(tsteps[s * n:(s + 1) * n], gsteps[s * n:(s + 1) * n])
        worst_step = max(worst_step, r)
        if r > tol:
            sys.exit('%s: the latents after step %d differ by %.2g (relative to their max) > %g' % (cfg, s + 1, r, tol))
    _, gf = tensor(g, cfg + '.final_latents')
    _, tf = tensor(t, 'latents')
    rf = rel_max(tf, gf)
    if rf > tol:
        sys.exit('%s: the final latents differ by %.2g > %g' % (cfg, rf, tol))
    print('decisions equal, residual diffs within %.2g, step latents within %.2g, final within %.2g' %
          (worst_diff, worst_step, rf))


if __name__ == '__main__':
    main(*sys.argv[1:5], *[float(x) for x in sys.argv[5:7]])
